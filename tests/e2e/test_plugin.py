"""The SillyTavern server plugin for real: `install-extension --sillytavern` into a SillyTavern server
folder of its own, SillyTavern started, the plugin starting the sidecar; the page reaches memory
through SillyTavern's own origin only, with no sidecar URL or token in it; a write without
SillyTavern's CSRF token is refused; with the sidecar killed generation goes on (fails open, one
toast) and memory is back within 15 s of a kill; a SIGKILLed SillyTavern leaves no sidecar behind."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.fakellm import FakeLLM
from tests.helpers.plugin_st import PINNED, PluginST, alive, keep, open_page, through_plugin
from tests.helpers.sillytavern import STPage, configure_chronicler, wait_until


def test_the_plugin_path_end_to_end(plugin_st: PluginST, browser: Any, fake: FakeLLM,
                                    request: pytest.FixtureRequest) -> None:
    st = plugin_st
    assert "enableServerPlugins: false -> true" in st.install.stdout and "restart SillyTavern" in st.install.stdout
    status = st.running()
    assert status["plugin_version"] == status["sidecar_version"]
    assert "per_user_stores" in st.direct("GET", "/v1/health")["capabilities"]  # this checkout's sidecar
    st.direct("POST", "/v1/memories", {"text": PINNED, "scope": "global", "pinned": True, "actor": "user"})
    context, page, seen = open_page(browser, st, request.node.name)
    try:
        fake.reset()
        page.open()
        # A shared 2-core machine: the first query embedding may take longer than the default 1.5 s.
        configure_chronicler(page, contextTimeoutMs=20000)
        page.select_character("Seraphina")
        page.send("Where is my ship?")
        prompt = json.dumps(fake.completions()[-1]["messages"])
        assert PINNED in prompt, "the pinned memory did not reach the model through the plugin"
        token = st.connection()["token"]
        sidecar_port = str(st.connection()["port"])
        foreign = [u for u in seen if not u.startswith(st.url + "/") and not u.startswith("data:")]
        assert not foreign, f"the page called another origin: {foreign[:5]}"
        assert any("/api/plugins/chronicler/v1/context" in u for u in seen)
        assert not [u for u in seen if f":{sidecar_port}" in u]
        html = page.evaluate("() => document.documentElement.outerHTML + JSON.stringify(localStorage)"
                             " + JSON.stringify(SillyTavern.getContext().extensionSettings)")
        assert token not in html, "the sidecar's token is in the page"
        page.open_chronicler_settings()
        assert "through SillyTavern's Chronicler plugin" in page.page.locator("#chronicler_path").inner_text()
        errors = [line for line in page.console if line.startswith("error") and "chronicler" in line.lower()]
        assert not errors, errors
        # A write without SillyTavern's CSRF token is refused, and nothing is stored.
        refused = page.evaluate("""async () => {
            const r = await fetch('/api/plugins/chronicler/v1/memories', {method: 'POST',
                headers: {'Content-Type': 'application/json'}, credentials: 'same-origin',
                body: JSON.stringify({text: 'forged', scope: 'global', pinned: true, actor: 'user'})});
            return r.status; }""")
        assert refused == 403
        texts = [m["text"] for m in st.direct("GET", "/v1/memories")["memories"]]
        assert "forged" not in texts and PINNED in texts
    finally:
        keep(page, seen)
        context.close()


class Reaper:
    """Kills every sidecar SillyTavern starts, the moment it appears, until stopped: the sidecar
    stays down for as long as a test needs, whatever the plugin's restart backoff."""

    def __init__(self, st_pid: int) -> None:
        self.st_pid = st_pid
        self.killed: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _children(self) -> list[int]:
        pids: list[int] = []
        for task in Path(f"/proc/{self.st_pid}/task").glob("*"):
            with contextlib.suppress(OSError):
                pids += [int(p) for p in (task / "children").read_text().split()]
        return pids

    def _run(self) -> None:
        while not self._stop.is_set():
            for pid in self._children():
                with contextlib.suppress(OSError):
                    if b"serve" in Path(f"/proc/{pid}/cmdline").read_bytes():
                        os.kill(pid, signal.SIGKILL)
                        self.killed.append(pid)
            time.sleep(0.01)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(2)


def test_a_killed_sidecar_fails_open_is_back_within_15_s_and_sigkill_of_sillytavern_leaves_none(
        plugin_st: PluginST, browser: Any, fake: FakeLLM, request: pytest.FixtureRequest) -> None:
    st = plugin_st
    st.running()
    st.direct("POST", "/v1/memories", {"text": PINNED, "scope": "global", "pinned": True, "actor": "user"})
    context, page, _ = open_page(browser, st, request.node.name)
    try:
        page.open()
        page.select_character("Seraphina")  # a first sync that succeeds: the outage below is a new one
        page.record_toasts()
        # Generation goes on while the sidecar is dead: every restart is killed until the reply is in.
        reaper = Reaper(st.server.proc.pid)
        try:
            os.kill(st.connection()["pid"], signal.SIGKILL)
            fake.reset()
            reply = page.send("Are you still there?")
        finally:
            reaper.stop()
        assert reply.startswith("Fake reply"), reply
        assert len(fake.completions()) == 1 and PINNED not in json.dumps(fake.completions()[0]["messages"])
        toasts = [t for t in page.recorded_toasts() if "Chronicler" in t]
        assert len(toasts) == 1, toasts
        wait_until(lambda: (s := st.status()) and s["state"] == "running" and s["pid"] not in reaper.killed,
                   60.0, "the sidecar restarted after the outage", 0.2)
        st.running()
        first = st.connection()["pid"]
        os.kill(first, signal.SIGKILL)
        killed = time.monotonic()

        def memory_back() -> bool:
            texts = page.evaluate("""async () => {
                const r = await fetch('/api/plugins/chronicler/v1/memories', {credentials: 'same-origin'});
                return r.ok ? (await r.json()).memories.map(m => m.text) : []; }""")
            return PINNED in texts

        wait_until(memory_back, 30.0, "memory back", 0.25)
        back = time.monotonic() - killed
        assert back <= 15.0, f"memory came back after {back:.1f} s"
        status = st.status()
        assert status["restarts"] >= 1 and status["pid"] != first
    finally:
        context.close()
    child = st.connection()["pid"]
    assert alive(child)
    os.kill(st.server.proc.pid, signal.SIGKILL)  # no exit(): SillyTavern just dies
    st.server.proc.wait(10)
    wait_until(lambda: not alive(child), 30.0, "no sidecar left", 0.2)


# --- user accounts: one store per SillyTavern user -------------------------------------------
def _login(browser: Any, st: PluginST, handle: str, request: pytest.FixtureRequest) -> tuple[Any, STPage, list[str]]:
    """A browser context logged in to SillyTavern as `handle` (no password), on the app's page."""
    context, page, seen = open_page(browser, st, request.node.name)
    page.page.goto(st.url + "/login", wait_until="domcontentloaded")
    status = page.evaluate("""async handle => {
        const { token } = await (await fetch('/csrf-token')).json();
        const r = await fetch('/api/users/login', {method: 'POST', credentials: 'same-origin',
            headers: {'Content-Type': 'application/json', 'X-CSRF-Token': token},
            body: JSON.stringify({handle, password: ''})});
        return r.status; }""", handle)
    assert status == 200, f"login as {handle}: {status}"
    page.open()
    configure_chronicler(page, contextTimeoutMs=20000)
    return context, page, seen


def test_user_accounts_two_users_each_with_their_own_store(st_package: Path, fake: FakeLLM, tmp_path: Path,
                                                            browser: Any, request: pytest.FixtureRequest) -> None:
    from tests.helpers.sillytavern import st_settings

    st = PluginST(st_package, fake, tmp_path, accounts=True)
    contexts = []
    try:
        assert (st.folder / "public" / "scripts" / "extensions" / "third-party" / "Chronicler").is_dir()
        st.running()
        admin, admin_page, _ = _login(browser, st, "default-user", request)
        contexts.append(admin)
        made = admin_page.evaluate("""async () => {
            const r = await fetch('/api/users/create', {method: 'POST', credentials: 'same-origin',
                headers: SillyTavern.getContext().getRequestHeaders(),
                body: JSON.stringify({handle: 'bob', name: 'Bob', password: ''})});
            return r.status; }""")
        assert made == 200, made
        (st.root / "bob" / "settings.json").write_text(json.dumps(st_settings(st.folder, fake.url)))
        bob, bob_page, _ = _login(browser, st, "bob", request)
        contexts.append(bob)
        alice_page = admin_page  # the default user
        mine = through_plugin(alice_page, "POST", "/v1/memories", {"text": PINNED, "scope": "global", "pinned": True,
                                                            "actor": "user"})
        assert mine["status"] == 201, mine
        theirs = through_plugin(bob_page, "POST", "/v1/memories", {"text": "Bob's horse is named Thistle.",
                                                            "scope": "global", "pinned": True, "actor": "user"})
        assert theirs["status"] == 201, theirs
        # Each prompt holds only its user's memory.
        for page, own, other in ((alice_page, PINNED, "Thistle"), (bob_page, "Thistle", PINNED)):
            fake.reset()
            page.select_character("Seraphina")
            page.send("What do you remember?")
            prompt = json.dumps(fake.completions()[-1]["messages"])
            assert own in prompt and other not in prompt
        # Bob cannot read or change Alice's memory by its id, nor her settings.
        alice_id = mine["body"]["memory"]["id"]
        assert through_plugin(bob_page, "GET", f"/v1/memories/{alice_id}")["status"] == 404
        gone = through_plugin(bob_page, "DELETE", f"/v1/memories/{alice_id}?actor=user")
        assert gone["status"] == 404 and gone["body"]["error"]["code"] == "memory_not_found", gone
        assert through_plugin(alice_page, "PATCH", "/v1/settings", {"llm_mode": "client"})["status"] == 200
        assert through_plugin(bob_page, "GET", "/v1/settings")["body"]["settings"]["llm_mode"] == "extractive"
        assert through_plugin(alice_page, "GET", f"/v1/memories/{alice_id}")["status"] == 200
        # Without a session SillyTavern refuses before the plugin.
        stranger, stranger_page, _ = open_page(browser, st, request.node.name)
        contexts.append(stranger)
        stranger_page.page.goto(st.url + "/login", wait_until="domcontentloaded")
        status = stranger_page.evaluate("async () => (await fetch('/api/plugins/chronicler/v1/memories')).status")
        assert status in (401, 403), status
    finally:
        for context in contexts:
            context.close()
        st.close()
