"""Attacks from a browser (rules OP6, RV17): a hostile page in Debian's Chromium against a running sidecar.

The sidecar allows exactly one origin, `http://127.0.0.1:<A>` (standing in for SillyTavern). Pages are
served by a small HTTP server on loopback: the allowed origin itself (for the positive control), the
same port reached as `localhost` (a different origin, to show the allowlist is exact), and a hostile
origin on a second port. The hostile page tries simple requests (text/plain fetch, `no-cors` fetch, a
real <form> submit), preflighted requests (JSON + the right token), `Origin: null` (sandboxed iframe,
data: URL page), no token and a wrong token; a second browser whose resolver maps `rebind.test` to
127.0.0.1 plays DNS rebinding. Every attempt is refused by the sidecar (its answers are seen on the
network through Playwright) and nothing is stored (checked through the API afterwards). Only the
control request from the allowed origin with the right token stores one memory.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Iterator

import pytest
import requests

from tests.helpers.process import SidecarProcess
from tests.helpers.sillytavern import CHROMIUM, CHROMIUM_ARGS, free_port

MEMORY = {"text": "Planted by an attacker.", "scope": "global", "actor": "user"}
FORM_PAGE = """<!doctype html><title>win a prize</title>
<form id="f" method="POST" action="{sidecar}/v1/memories" enctype="text/plain" target="sink">
<input type="hidden" name='{{"text":"Planted by a form.","scope":"global","actor":"user","pad":"' value='"}}'>
</form><iframe name="sink"></iframe>"""


class _Pages(BaseHTTPRequestHandler):
    """Serves a blank page at / and the auto-building form at /form, for any Host."""

    sidecar_url = ""

    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        body = FORM_PAGE.format(sidecar=self.sidecar_url) if self.path == "/form" else "<!doctype html><title>page</title>"
        data = body.encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


def _serve(port: int) -> ThreadingHTTPServer:
    server = ThreadingHTTPServer(("127.0.0.1", port), _Pages)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.fixture(scope="module")
def setup(e2e_tools: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    allowed_port, hostile_port = free_port(), free_port()
    allowed = f"http://127.0.0.1:{allowed_port}"
    side = SidecarProcess.create(tmp_path_factory.mktemp("attacks") / "data", origins=[allowed])
    _Pages.sidecar_url = side.url
    servers = [_serve(allowed_port), _serve(hostile_port)]
    side.start()
    side.wait_ready()
    yield {"sidecar": side, "allowed": allowed, "localhost": f"http://localhost:{allowed_port}",
           "hostile": f"http://127.0.0.1:{hostile_port}"}
    for server in servers:
        server.shutdown()
    side.stop()


def _stored(side: SidecarProcess) -> list[str]:
    status, body = side.request("GET", "/v1/memories?scope=global")
    assert status == 200
    return [m["text"] for m in body["memories"]]


class Watch:
    """A page plus every answer the sidecar gave it (status by method), seen on the network."""

    def __init__(self, browser: Any, side: SidecarProcess) -> None:
        self.context = browser.new_context()
        self.page = self.context.new_page()
        self.answers: list[tuple[str, int, str]] = []
        self.page.on("response", lambda r: self._record(r, side))

    def _record(self, response: Any, side: SidecarProcess) -> None:
        if response.url.startswith(side.url) or ":%d/" % side.port in response.url:
            try:
                text = response.text()
            except Exception:  # a preflight or opaque answer may have no readable body
                text = ""
            self.answers.append((response.request.method, response.status, text))

    def fetch(self, url: str, init: dict) -> str:
        """Run fetch() in the page; returns 'status N' or the error the page saw."""
        return self.page.evaluate("""async ([url, init]) => {
            try { const r = await fetch(url, init); return 'status ' + r.status + ' ' + r.type; }
            catch (e) { return 'error ' + e.name; } }""", [url, init])

    def close(self) -> None:
        self.context.close()


def _codes(answers: list[tuple[str, int, str]]) -> list[str]:
    out = []
    for _, _, text in answers:
        try:
            out.append(json.loads(text)["error"]["code"])
        except (ValueError, KeyError, TypeError):
            out.append("")
    return out


def test_rv17_hostile_origin_simple_requests_are_refused(browser: Any, setup: dict) -> None:
    """rule RV17: text/plain fetch, no-cors fetch and a real <form> POST from a foreign origin
    reach the sidecar (no preflight) and are refused 403 origin_not_allowed; nothing is stored."""
    side: SidecarProcess = setup["sidecar"]
    watch = Watch(browser, side)
    try:
        watch.page.goto(setup["hostile"] + "/")
        url = side.url + "/v1/memories"
        plain = watch.fetch(url, {"method": "POST", "headers": {"Content-Type": "text/plain"},
                                  "body": json.dumps(MEMORY)})
        opaque = watch.fetch(url, {"method": "POST", "mode": "no-cors", "headers": {"Content-Type": "text/plain"},
                                   "body": json.dumps(MEMORY)})
        assert plain == "error TypeError"            # CORS hides the answer from the page
        assert opaque == "status 0 opaque"           # no-cors: sent, answer unreadable
        watch.page.goto(setup["hostile"] + "/form")
        with watch.page.expect_response(lambda r: r.url == url):
            watch.page.evaluate("document.getElementById('f').submit()")
        # Chromium reports the answers it received (an opaque one may go unreported; a CORS-blocked
        # one without its body): every one is a 403, the form's readable one says why.
        posts = [(s, c) for (m, s, _), c in zip(watch.answers, _codes(watch.answers)) if m == "POST"]
        assert len(posts) >= 2 and all(s == 403 for s, _ in posts), watch.answers
        assert posts[-1] == (403, "origin_not_allowed"), watch.answers
    finally:
        watch.close()
    assert _stored(side) == []


def test_rv17_preflighted_requests_from_foreign_origins_are_refused(browser: Any, setup: dict) -> None:
    """rule RV17: JSON with the RIGHT token from a foreign origin (another port, and the allowed
    port reached as localhost: the allowlist is exact) fails its preflight; the POST is never sent."""
    side: SidecarProcess = setup["sidecar"]
    init = {"method": "POST", "headers": {"Content-Type": "application/json",
                                          "Authorization": f"Bearer {side.token}"}, "body": json.dumps(MEMORY)}
    for origin in (setup["hostile"], setup["localhost"]):
        watch = Watch(browser, side)
        try:
            watch.page.goto(origin + "/")
            assert watch.fetch(side.url + "/v1/memories", init) == "error TypeError", origin
            assert all(m != "POST" for m, _, _ in watch.answers), watch.answers
            assert all(s == 403 for _, s, _ in watch.answers), watch.answers
        finally:
            watch.close()
        preflight = requests.options(side.url + "/v1/memories", timeout=10, headers={
            "Origin": origin, "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization,content-type"})
        assert preflight.status_code == 403 and "Access-Control-Allow-Origin" not in preflight.headers
    assert _stored(side) == []


def test_rv17_origin_null_from_a_sandboxed_iframe_and_a_data_url_is_refused(browser: Any, setup: dict) -> None:
    """rule RV17: pages with an opaque origin send `Origin: null`, which is never allowed."""
    side: SidecarProcess = setup["sidecar"]
    script = ("fetch(%r, {method: 'POST', headers: {'Content-Type': 'text/plain'}, body: %r})"
              ".then(r => 'status ' + r.status, e => 'error ' + e.name)"
              ".then(v => parent.postMessage(v, '*'))" % (side.url + "/v1/memories", json.dumps(MEMORY)))
    watch = Watch(browser, side)
    try:
        watch.page.goto(setup["hostile"] + "/")
        watch.page.evaluate("""(code) => { window.addEventListener('message', e => { window.sandboxed = e.data; });
            const f = document.createElement('iframe'); f.setAttribute('sandbox', 'allow-scripts');
            f.srcdoc = '<script>' + code + '<\\/script>'; document.body.appendChild(f); }""", script)
        watch.page.wait_for_function("() => window.sandboxed !== undefined")
        assert watch.page.evaluate("window.sandboxed") == "error TypeError"
        watch.page.goto("data:text/html,<title>data</title>")
        assert watch.page.evaluate("origin") == "null"
        assert watch.fetch(side.url + "/v1/memories", {"method": "POST", "headers": {"Content-Type": "text/plain"},
                                                       "body": json.dumps(MEMORY)}) == "error TypeError"
        assert all(s == 403 for _, s, _ in watch.answers), watch.answers
    finally:
        watch.close()
    # The same request with the token, as those pages send it (Origin: null), replayed from Python.
    replay = requests.post(side.url + "/v1/memories", json=MEMORY, timeout=10, headers={
        "Origin": "null", "Authorization": f"Bearer {side.token}"})
    assert replay.status_code == 403 and replay.json()["error"]["code"] == "origin_not_allowed"
    assert _stored(side) == []


def test_rv17_allowed_origin_without_or_with_a_wrong_token_is_refused_and_with_it_stores(
        browser: Any, setup: dict) -> None:
    """rule RV17: from the allowed origin, no token and a wrong token get 401 (readable: CORS
    allows the origin); the right token stores the memory (the control that shows the harness can
    tell refusal from success)."""
    side: SidecarProcess = setup["sidecar"]
    url = side.url + "/v1/memories"
    watch = Watch(browser, side)
    try:
        watch.page.goto(setup["allowed"] + "/")
        base = {"method": "POST", "body": json.dumps(MEMORY)}
        no_token = watch.fetch(url, {**base, "headers": {"Content-Type": "application/json"}})
        wrong = watch.fetch(url, {**base, "headers": {"Content-Type": "application/json",
                                                      "Authorization": "Bearer " + "x" * len(side.token)}})
        assert (no_token, wrong) == ("status 401 cors", "status 401 cors")
        assert _stored(side) == []
        control = {**MEMORY, "text": "Stored by the allowed origin with the token."}
        right = watch.fetch(url, {"method": "POST", "body": json.dumps(control), "headers": {
            "Content-Type": "application/json", "Authorization": f"Bearer {side.token}"}})
        assert right == "status 201 cors"
    finally:
        watch.close()
    assert _stored(side) == [control["text"]]
    status, _ = side.request("DELETE", "/v1/memories/" + _ids(side)[0] + "?actor=user")
    assert status == 200


def _ids(side: SidecarProcess) -> list[str]:
    return [m["id"] for m in side.request("GET", "/v1/memories?scope=global")[1]["memories"]]


def test_rv17_dns_rebinding_is_refused_by_the_host_check(browser: Any, setup: dict) -> None:
    """rule RV17 against DNS rebinding: a browser resolving rebind.test to 127.0.0.1 loads a page
    from the sidecar's own port and posts same-origin with the token; from Python, requests whose
    Host is not ours. The Host check refuses all (403 host_not_allowed), health included."""
    side: SidecarProcess = setup["sidecar"]
    rebinder = browser.browser_type.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS + [
        "--host-resolver-rules=MAP rebind.test 127.0.0.1"])
    try:
        page = rebinder.new_page()
        first = page.goto(f"http://rebind.test:{side.port}/v1/health")
        assert first.status == 403 and "host_not_allowed" in first.text()
        result = page.evaluate("""async (token) => {
            const r = await fetch('/v1/memories', {method: 'POST', headers: {'Content-Type': 'application/json',
                'Authorization': 'Bearer ' + token}, body: JSON.stringify({text: 'rebound', scope: 'global', actor: 'user'})});
            return [r.status, (await r.json()).error.code]; }""", side.token)
        assert result == [403, "host_not_allowed"]
    finally:
        rebinder.close()
    headers = {"Authorization": f"Bearer {side.token}", "Content-Type": "application/json"}
    for host in ("evil.example", f"evil.example:{side.port}", f"127.0.0.1:{side.port + 1}",
                 f"127.0.0.1.nip.io:{side.port}", f"localhost.evil:{side.port}", ""):
        answer = requests.post(side.url + "/v1/memories", json=MEMORY, timeout=10, headers={**headers, "Host": host})
        assert answer.status_code in (400, 403), (host, answer.status_code, answer.text[:200])
        assert answer.json()["ok"] is False, host
    assert _stored(side) == []
