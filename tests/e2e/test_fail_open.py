"""The extension fails open when the sidecar hangs or answers errors (rules OP9, DC2).

Real SillyTavern + Chromium + the extension. The extension's sidecar URL points at:
- a "sidecar" that accepts TCP connections and never answers a byte (a hung process: the
  connection is open, so only the extension's own timeout can end the wait);
- a sidecar that answers every request with 500 in the error envelope (CORS preflights pass, as
  the real one lets SillyTavern's origin through).
Either way every generation completes with the model's reply, each context call ends within the
extension's context timeout (1.5 s by default), and exactly one Chronicler toast appears for the
whole outage. (tests/e2e/test_smoke.py covers a sidecar that is not there at all.)
"""

from __future__ import annotations

import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Iterator

import pytest

from tests.helpers.fakellm import FakeLLM
from tests.helpers.sillytavern import STPage, configure_chronicler

TURNS = 3
SLACK_MS = 750  # timer and event-loop scheduling on a busy 2-core machine


class HangingServer:
    """Accepts connections on loopback and never reads or answers; holds them until closed."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.accepted: list[socket.socket] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        self.sock.settimeout(0.2)
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            self.accepted.append(conn)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2)
        for conn in self.accepted:
            conn.close()
        self.sock.close()


class _Failing(BaseHTTPRequestHandler):
    """500 in the error envelope for every request; preflights pass for the page's origin."""

    calls: list[str] = []

    def _cors(self) -> None:
        self.send_header("Access-Control-Allow-Origin", self.headers.get("Origin") or "*")
        self.send_header("Access-Control-Allow-Headers", "Authorization, Content-Type")
        self.send_header("Access-Control-Allow-Methods", "GET, POST, PUT, PATCH, DELETE, OPTIONS")

    def do_OPTIONS(self) -> None:  # noqa: N802 (http.server's naming)
        self.send_response(204)
        self._cors()
        self.send_header("Content-Length", "0")
        self.end_headers()

    def _fail(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        self.calls.append(f"{self.command} {self.path}")
        body = json.dumps({"ok": False, "error": {"code": "internal_error", "message": "Something "
                           "went wrong inside the sidecar; its log has the details.", "details": []}}).encode()
        self.send_response(500)
        self._cors()
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _fail

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def hanging() -> Iterator[HangingServer]:
    server = HangingServer()
    yield server
    server.close()


@pytest.fixture
def failing() -> Iterator[ThreadingHTTPServer]:
    _Failing.calls = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Failing)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()
    server.server_close()


def _turns_fail_open(st: STPage, fake: FakeLLM, url: str, label: str) -> dict[str, Any]:
    """Point the extension at `url`, play TURNS turns; every reply arrives; return what the page saw."""
    configure_chronicler(st, sidecarUrl=url, token="any-token")
    st.record_toasts()
    st.select_character("Seraphina")
    before = len(fake.completions())
    for n in range(TURNS):
        reply = st.send(f"Turn {n} while the sidecar {label}")
        assert reply.startswith("Fake reply"), reply
    assert len(fake.completions()) - before == TURNS
    st.shot(f"after-turns-{label.replace(' ', '-')}")
    return st.evaluate("""() => ({
        timings: window.chronicler.stats.timings.items.slice(),
        code: window.chronicler.stats.lastError?.code ?? null,
        status: window.chronicler.stats.lastError?.status ?? null,
        timeout: SillyTavern.getContext().extensionSettings.chronicler.contextTimeoutMs ?? 1500,
        toasts: (window.__toastLog ?? []).filter(t => t.includes('Chronicler')),
    })""")


def test_dc2_a_hanging_sidecar_costs_at_most_the_context_timeout(st: STPage, fake: FakeLLM,
                                                                  hanging: HangingServer) -> None:
    """rule DC2 (fail open): a sidecar that accepts and never answers: every generation completes,
    each context wait ends at the extension's timeout, one toast for the outage."""
    seen = _turns_fail_open(st, fake, f"http://127.0.0.1:{hanging.port}", "hangs")
    assert hanging.accepted, "the extension did reach the hanging server"
    assert seen["code"] == "timeout" and seen["status"] == 0
    assert len(seen["timings"]) == TURNS
    assert all(t <= seen["timeout"] + SLACK_MS for t in seen["timings"]), seen["timings"]
    assert len(seen["toasts"]) == 1, seen["toasts"]
    assert "not reachable" in seen["toasts"][0]


def test_dc2_a_sidecar_answering_500_fails_open_with_one_toast(st: STPage, fake: FakeLLM,
                                                                failing: ThreadingHTTPServer) -> None:
    """rule DC2 (fail open): a sidecar answering 500 to everything: every generation completes
    unchanged, one toast for the outage (not one per turn or per failed sync)."""
    port = failing.server_address[1]
    seen = _turns_fail_open(st, fake, f"http://127.0.0.1:{port}", "answers 500")
    assert any(c.startswith("POST /v1/context") for c in _Failing.calls), _Failing.calls
    assert seen["status"] == 500 and seen["code"] == "internal_error"
    assert len(seen["timings"]) == TURNS
    assert all(t <= seen["timeout"] + SLACK_MS for t in seen["timings"]), seen["timings"]
    assert len(seen["toasts"]) == 1, seen["toasts"]
    assert "not reachable" in seen["toasts"][0]
