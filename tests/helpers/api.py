"""The test client and the checks every sidecar test uses: the token, the schema check of every
answer, and `expect_ok` / `expect_error` for one answer's status, envelope and schema."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from server_plugin.api.schemas import default_schemas

TOKEN = "test-token-0123456789"
ST_ORIGIN = "http://127.0.0.1:8000"
T0 = datetime(2026, 3, 1, 12, 0, tzinfo=timezone.utc)


class Api:
    """A test client that sends the token and JSON, and checks every answer against its schema."""

    def __init__(self, flask_client: Any) -> None:
        self.raw = flask_client

    def request(self, method: str, path: str, json: Any = None, headers: dict | None = None,
                token: str | None = TOKEN, **kw: Any) -> Any:
        sent = dict(headers or {})
        if token is not None:
            sent.setdefault("Authorization", f"Bearer {token}")
        response = self.raw.open(path, method=method, json=json, headers=sent, **kw)
        if response.status_code >= 400 and response.is_json:
            assert_schema("error.response", response.get_json())
        return response

    def get(self, path: str, **kw: Any) -> Any:
        return self.request("GET", path, **kw)

    def post(self, path: str, json: Any = None, **kw: Any) -> Any:
        return self.request("POST", path, json=json, **kw)

    def put(self, path: str, json: Any = None, **kw: Any) -> Any:
        return self.request("PUT", path, json=json, **kw)

    def patch(self, path: str, json: Any = None, **kw: Any) -> Any:
        return self.request("PATCH", path, json=json, **kw)

    def delete(self, path: str, **kw: Any) -> Any:
        return self.request("DELETE", path, **kw)


def assert_schema(name: str, payload: Any) -> None:
    problems = default_schemas().errors(name, payload)
    assert not problems, f"{name}: {problems}"


def expect_error(response: Any, status: int, code: str) -> dict:
    """Assert a non-2xx answer in the one envelope, with this status and code."""
    assert response.status_code == status, (response.status_code, response.get_data(as_text=True)[:500])
    body = response.get_json()
    assert body["ok"] is False and body["error"]["code"] == code, body
    assert body["error"]["message"]
    return body


def expect_ok(response: Any, status: int = 200, schema: str | None = None) -> Any:
    assert response.status_code == status, (response.status_code, response.get_data(as_text=True)[:500])
    body = response.get_json()
    if schema:
        assert_schema(schema, body)
    return body
