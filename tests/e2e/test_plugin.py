"""The SillyTavern server plugin for real: `install-extension --sillytavern` into a SillyTavern server
folder of its own, SillyTavern started, the plugin starting the sidecar; the page reaches memory
through SillyTavern's own origin only, with no sidecar URL or token in it; a write without
SillyTavern's CSRF token is refused; a killed sidecar is back within 15 s; a SIGKILLed SillyTavern
leaves no sidecar behind."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Iterator

import pytest

from tests.helpers.fakellm import FakeLLM
from tests.helpers.sillytavern import (
    REPO_ROOT,
    SillyTavernServer,
    STPage,
    configure_chronicler,
    free_port,
    prepare_data_root,
    wait_until,
)

PINNED = "The captain's ship is called the Silver Gull."


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is dead for our purpose
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def _json(url: str) -> Any:
    try:
        with urllib.request.urlopen(url, timeout=5) as answer:
            return json.loads(answer.read())
    except (urllib.error.URLError, ValueError, OSError):
        return None


class PluginST:
    """SillyTavern with the Chronicler plugin, in a server folder of its own (the plugin lives in
    `<server folder>/plugins/`, so the shared package must not be touched)."""

    def __init__(self, st_package: Path, fake: FakeLLM, tmp_path: Path, accounts: bool = False) -> None:
        # Beside the shared package, so its dependencies (../) resolve; removed afterwards.
        self.accounts = accounts
        self.folder = st_package.parent / f"sillytavern-plugin-{os.getpid()}-{tmp_path.name}"
        shutil.copytree(st_package, self.folder, symlinks=True)
        self.root = tmp_path / "st-data"
        prepare_data_root(self.root, self.folder, fake.url, extension_src=None)
        self.port = free_port()
        (self.root / "config.yaml").write_text(f"port: {self.port}\nlisten: false\nenableServerPlugins: false\n"
                                               "enableServerPluginsAutoUpdate: false\n"
                                               f"enableUserAccounts: {str(accounts).lower()}\n")
        self.side_dir = tmp_path / "sidecar"
        env = {k: v for k, v in os.environ.items() if not k.startswith("CHRONICLER_")}
        self.install = subprocess.run(
            [sys.executable, "-m", "server_plugin.cli", "install-extension", "--sillytavern", str(self.folder),
             "--st-config", str(self.root / "config.yaml"), "--data-root", str(self.root),
             "--data-dir", str(self.side_dir), "--allow-node-modules"],
            cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=120)
        assert self.install.returncode == 0, self.install.stderr
        # The sidecar the plugin starts runs this checkout's code (PYTHONPATH goes down to it).
        os.environ.setdefault("PYTHONPATH", str(REPO_ROOT))
        self.server = SillyTavernServer(self.folder, self.root, port=self.port)
        if accounts:  # "/" and "/login" redirect to each other before a session: wait for a static file
            self.server.start(ready=f"{self.server.url}/favicon.ico")
        else:
            self.server.start()

    @property
    def url(self) -> str:
        return self.server.url

    def status(self) -> Any:
        return _json(f"{self.url}/api/plugins/chronicler/status")

    def connection(self) -> dict[str, Any]:
        return json.loads((self.side_dir / "sidecar.json").read_text())

    def running(self, limit: float = 120.0) -> dict[str, Any]:
        """The plugin's status once its sidecar runs with the model loaded and the index built."""
        if self.accounts:  # the status route needs a session then: the connection file says it runs
            status = wait_until(lambda: (self.side_dir / "sidecar.json").is_file() and {"state": "running"}, limit,
                                "the connection file", 0.2)
        else:
            status = wait_until(lambda: (s := self.status()) and s["state"] == "running" and s.get("sidecar_version")
                                and s, limit, "the sidecar running", 0.2)
        wait_until(lambda: (h := self.direct("GET", "/v1/health")) and h["embedder"]["ready"] and h["search"]["ready"],
                   limit, "the model and the index ready", 0.2)
        return status

    def direct(self, method: str, path: str, body: Any = None) -> Any:
        """The sidecar itself, as the CLI reaches it (the connection file): for setting up only."""
        where = self.connection()
        request = urllib.request.Request(f"{where['url']}{path}", method=method,
                                         data=None if body is None else json.dumps(body).encode(),
                                         headers={"Authorization": f"Bearer {where['token']}",
                                                  "Content-Type": "application/json",
                                                  "X-Chronicler-User": "default-user"})
        with urllib.request.urlopen(request, timeout=120) as answer:
            return json.loads(answer.read())

    def close(self) -> None:
        self.server.stop()
        shutil.rmtree(self.folder, ignore_errors=True)


@pytest.fixture
def plugin_st(st_package: Path, fake: FakeLLM, tmp_path: Path) -> Iterator[PluginST]:
    st = PluginST(st_package, fake, tmp_path)
    try:
        yield st
    finally:
        st.close()


def _page(browser: Any, st: PluginST, request: pytest.FixtureRequest) -> tuple[Any, STPage, list[str]]:
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    seen: list[str] = []
    page.on("request", lambda r: seen.append(r.url))
    return context, STPage(page, st.url, REPO_ROOT / "test-artifacts" / "e2e" / request.node.name), seen


def test_the_plugin_path_end_to_end(plugin_st: PluginST, browser: Any, fake: FakeLLM,
                                    request: pytest.FixtureRequest) -> None:
    st = plugin_st
    assert "enableServerPlugins: false -> true" in st.install.stdout and "restart SillyTavern" in st.install.stdout
    status = st.running()
    assert status["plugin_version"] == status["sidecar_version"]
    assert "per_user_stores" in st.direct("GET", "/v1/health")["capabilities"]  # this checkout's sidecar
    st.direct("POST", "/v1/memories", {"text": PINNED, "scope": "global", "pinned": True, "actor": "user"})
    context, page, seen = _page(browser, st, request)
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
        _keep(page, seen)
        context.close()


def _keep(page: STPage, seen: list[str]) -> None:
    """The page's console and requests, beside its screenshots (for a failure's post-mortem)."""
    page.artifacts.mkdir(parents=True, exist_ok=True)
    (page.artifacts / "console.log").write_text("\n".join(page.console))
    (page.artifacts / "requests.log").write_text("\n".join(seen))


def test_a_killed_sidecar_is_back_within_15_s_and_sigkill_of_sillytavern_leaves_none(
        plugin_st: PluginST, browser: Any, request: pytest.FixtureRequest) -> None:
    st = plugin_st
    st.running()
    st.direct("POST", "/v1/memories", {"text": PINNED, "scope": "global", "pinned": True, "actor": "user"})
    context, page, _ = _page(browser, st, request)
    try:
        page.open()
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
    assert _alive(child)
    os.kill(st.server.proc.pid, signal.SIGKILL)  # no exit(): SillyTavern just dies
    st.server.proc.wait(10)
    wait_until(lambda: not _alive(child), 30.0, "no sidecar left", 0.2)


# --- user accounts: one store per SillyTavern user -------------------------------------------
def _login(browser: Any, st: PluginST, handle: str, request: pytest.FixtureRequest) -> tuple[Any, STPage, list[str]]:
    """A browser context logged in to SillyTavern as `handle` (no password), on the app's page."""
    context, page, seen = _page(browser, st, request)
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


def _plugin(page: STPage, method: str, path: str, body: Any = None) -> dict[str, Any]:
    """A call through the plugin route from the page, as the extension makes it (session + CSRF)."""
    return page.evaluate("""async ([method, path, body]) => {
        const headers = SillyTavern.getContext().getRequestHeaders();
        const r = await fetch('/api/plugins/chronicler' + path, {method, headers, credentials: 'same-origin',
            body: body === null ? undefined : JSON.stringify(body)});
        return {status: r.status, body: await r.json()}; }""", [method, path, body])


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
        mine = _plugin(alice_page, "POST", "/v1/memories", {"text": PINNED, "scope": "global", "pinned": True,
                                                            "actor": "user"})
        assert mine["status"] == 201, mine
        theirs = _plugin(bob_page, "POST", "/v1/memories", {"text": "Bob's horse is named Thistle.",
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
        assert _plugin(bob_page, "GET", f"/v1/memories/{alice_id}")["status"] == 404
        gone = _plugin(bob_page, "DELETE", f"/v1/memories/{alice_id}?actor=user")
        assert gone["status"] == 404 and gone["body"]["error"]["code"] == "memory_not_found", gone
        assert _plugin(alice_page, "PATCH", "/v1/settings", {"llm_mode": "client"})["status"] == 200
        assert _plugin(bob_page, "GET", "/v1/settings")["body"]["settings"]["llm_mode"] == "extractive"
        assert _plugin(alice_page, "GET", f"/v1/memories/{alice_id}")["status"] == 200
        # Without a session SillyTavern refuses before the plugin.
        stranger, stranger_page, _ = _page(browser, st, request)
        contexts.append(stranger)
        stranger_page.page.goto(st.url + "/login", wait_until="domcontentloaded")
        status = stranger_page.evaluate("async () => (await fetch('/api/plugins/chronicler/v1/memories')).status")
        assert status in (401, 403), status
    finally:
        for context in contexts:
            context.close()
        st.close()
