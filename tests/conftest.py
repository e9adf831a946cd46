"""Fixtures: a fresh data dir per test, the real model loaded once per session, an authed client."""

from __future__ import annotations

import os

# Before numpy/torch load: one BLAS thread; never reach for the network.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ["HF_HUB_OFFLINE"] = "1"

from datetime import datetime, timezone  # noqa: E402
from typing import Any, Iterator  # noqa: E402

import pytest  # noqa: E402

from server_plugin.api.schemas import default_schemas  # noqa: E402
from server_plugin.app import build_services, create_app  # noqa: E402
from server_plugin.clock import FakeClock  # noqa: E402
from server_plugin.retrieval.embeddings import Embedder, from_settings  # noqa: E402
from server_plugin.settings import defaults, load_settings  # noqa: E402

TOKEN = "test-token-0123456789"
ST_ORIGIN = "http://127.0.0.1:8000"
T0 = datetime(2026, 3, 1, 12, 0, tzinfo=timezone.utc)


@pytest.fixture(scope="session")
def embedder() -> Embedder:
    """The real packaged MiniLM, loaded once for the whole run."""
    model = from_settings(defaults()).start_loading()
    model.wait(120)
    return model


@pytest.fixture
def overrides() -> dict[str, Any]:
    """Per-test setting overrides; a test may add to it before asking for `app`."""
    return {}


@pytest.fixture
def settings(tmp_path, overrides):
    # NORMAL: same semantics as FULL, without an fsync per commit (the suite writes thousands).
    # No background worker: tests run jobs deterministically (jobs.run_pending); one test starts it.
    values = {"data_dir": str(tmp_path / "data"), "token": TOKEN, "sqlite_synchronous": "NORMAL",
              "worker_enabled": False, **overrides}
    return load_settings(values, environ={})


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(T0)


@pytest.fixture
def services(settings, embedder, clock):
    svc = build_services(settings, embedder=embedder, clock=clock)
    yield svc
    svc.db.close()


@pytest.fixture
def app(settings, services):
    return create_app(settings, services=services)


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


@pytest.fixture
def api(app) -> Iterator[Api]:
    yield Api(app.test_client())
