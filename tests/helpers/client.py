"""An HTTP client for the harnesses: JSON in, (status, body) out; only a dead connection raises."""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import quote

import requests


class Dead(Exception):
    """No answer: the connection was refused, reset or timed out (the request may have applied)."""


def q(value: str) -> str:
    """An id percent-encoded for a path segment (SillyTavern chat ids have spaces and '@')."""
    return quote(value, safe="")


class Client:
    """One caller (a tab, the panel, a job worker): its own connection pool and token."""

    def __init__(self, base_url: str, token: str | None, timeout: float = 60.0,
                 headers: dict[str, str] | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self.session = requests.Session()
        if token is not None:
            self.session.headers["Authorization"] = f"Bearer {token}"
        self.session.headers.update(headers or {})

    def call(self, method: str, path: str, body: Any = None, params: dict | None = None,
             raw: bytes | None = None, headers: dict | None = None) -> tuple[int, Any]:
        """Send one request; returns (status, parsed JSON or the text when it is not JSON)."""
        sent = dict(headers or {})
        data = raw
        if body is not None:
            data = json.dumps(body).encode()
        if data is not None:
            sent.setdefault("Content-Type", "application/json")
        try:
            response = self.session.request(method, self.base_url + path, data=data, params=params,
                                            headers=sent, timeout=self.timeout)
        except requests.RequestException as exc:  # refused, reset, timed out, cut mid-answer
            raise Dead(f"{method} {path}: {type(exc).__name__}") from exc
        try:
            return response.status_code, response.json()
        except ValueError:
            return response.status_code, response.text

    def close(self) -> None:
        self.session.close()
