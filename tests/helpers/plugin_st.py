"""SillyTavern with the Chronicler server plugin for end-to-end tests (tests/e2e/test_plugin*.py).

`PluginST` copies the cached sillytavern package into a server folder of its own (the plugin lives in
`<server folder>/plugins/`, so the shared package is never touched), runs `chronicler install-extension`
into it, and starts SillyTavern, whose plugin starts this checkout's sidecar. With a `Lan`
(tests/helpers/netns.py) SillyTavern runs inside the LAN's server namespace, listening on its LAN
address with a whitelist for the LAN's subnet; the test process reaches it (and the sidecar on
that namespace's loopback) only through `Lan.call`.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Callable, TypeVar

from tests.helpers.fakellm import FakeLLM
from tests.helpers.netns import SUBNET, ST_ADDR, Lan
from tests.helpers.sillytavern import (
    REPO_ROOT,
    SillyTavernServer,
    STPage,
    free_port,
    prepare_data_root,
    wait_http,
    wait_until,
)

T = TypeVar("T")
PINNED = "The captain's ship is called the Silver Gull."


def alive(pid: int) -> bool:
    """Whether process `pid` runs (a zombie counts as dead)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def get_json(url: str) -> Any:
    """GET `url` as JSON; None when it does not answer JSON."""
    try:
        with urllib.request.urlopen(url, timeout=5) as answer:
            return json.loads(answer.read())
    except (urllib.error.URLError, ValueError, OSError):
        return None


class LanServer(SillyTavernServer):
    """SillyTavern started inside the LAN's server namespace, listening on the LAN (its config says so)."""

    def __init__(self, package: Path, data_root: Path, port: int, lan: Lan) -> None:
        super().__init__(package, data_root, port=port)
        self.lan = lan

    @property
    def url(self) -> str:
        return f"http://{ST_ADDR}:{self.port}"

    def start(self, timeout: float = 180.0, ready: str | None = None) -> "LanServer":
        root = str(self.data_root.resolve())
        cmd = [*self.lan.prefix(self.lan.st), "node", "server.js", "--port", str(self.port), "--listen", "true",
               "--browserLaunchEnabled", "false", "--dataRoot", root, "--configPath", str(Path(root) / "config.yaml")]
        self.log_path = self.log_path or (self.data_root / "sillytavern.log")
        with open(self.log_path, "w") as log:
            # `ip netns exec` execs node: this pid is SillyTavern's own.
            self.proc = subprocess.Popen(cmd, cwd=self.package, stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True)
        self.lan.call(self.lan.st, wait_http, ready or self.url + "/", timeout, self.proc, self.log_path)
        return self


class PluginST:
    """SillyTavern with the Chronicler plugin, installed by `chronicler install-extension`."""

    def __init__(self, st_package: Path, fake: FakeLLM, tmp_path: Path, accounts: bool = False,
                 lan: Lan | None = None) -> None:
        # Beside the shared package, so its dependencies (../) resolve; removed afterwards.
        self.accounts = accounts
        self.lan = lan
        self.folder = st_package.parent / f"sillytavern-plugin-{os.getpid()}-{tmp_path.name}"
        shutil.copytree(st_package, self.folder, symlinks=True)
        self.root = tmp_path / "st-data"
        prepare_data_root(self.root, self.folder, fake.url, extension_src=None)
        self.port = free_port()
        (self.root / "config.yaml").write_text(self._config())
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
        if lan is not None:
            self.server: SillyTavernServer = LanServer(self.folder, self.root, self.port, lan)
        else:
            self.server = SillyTavernServer(self.folder, self.root, port=self.port)
        if accounts:  # "/" and "/login" redirect to each other before a session: wait for a static file
            self.server.start(ready=f"{self.server.url}/favicon.ico")
        else:
            self.server.start()

    def _config(self) -> str:
        lines = [f"port: {self.port}", "enableServerPlugins: false", "enableServerPluginsAutoUpdate: false",
                 f"enableUserAccounts: {str(self.accounts).lower()}"]
        if self.lan is None:
            lines.append("listen: false")
        else:  # the LAN setup of a phone user: listen, and let only the LAN's subnet in
            lines += ["listen: true", "whitelistMode: true", "enableForwardedWhitelist: false",
                      "whitelistDockerHosts: false",  # it would resolve host.docker.internal: a DNS query
                      "whitelist:", "  - 127.0.0.1", f"  - {SUBNET}"]
        return "\n".join(lines) + "\n"

    def here(self, fn: Callable[..., T], *args: Any) -> T:
        """Run `fn` where SillyTavern's network is (its namespace on a LAN, else this one)."""
        return self.lan.call(self.lan.st, fn, *args) if self.lan else fn(*args)

    @property
    def url(self) -> str:
        return self.server.url

    def status(self) -> Any:
        return self.here(get_json, f"{self.url}/api/plugins/chronicler/status")

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
        """The sidecar itself, as the CLI reaches it (the connection file): for setting up and checking."""
        where = self.connection()
        request = urllib.request.Request(f"{where['url']}{path}", method=method,
                                         data=None if body is None else json.dumps(body).encode(),
                                         headers={"Authorization": f"Bearer {where['token']}",
                                                  "Content-Type": "application/json",
                                                  "X-Chronicler-User": "default-user"})

        def call() -> Any:
            with urllib.request.urlopen(request, timeout=120) as answer:
                return json.loads(answer.read())

        return self.here(call)

    def close(self) -> None:
        self.server.stop()
        shutil.rmtree(self.folder, ignore_errors=True)


def open_page(browser: Any, st: PluginST, artifacts: str) -> tuple[Any, STPage, list[str]]:
    """A new browser context and page on `st`, recording the URL of every request the page makes."""
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    seen: list[str] = []
    page.on("request", lambda r: seen.append(r.url))
    return context, STPage(page, st.url, REPO_ROOT / "test-artifacts" / "e2e" / artifacts), seen


def keep(page: STPage, seen: list[str]) -> None:
    """The page's console and requests, beside its screenshots (for a failure's post-mortem)."""
    page.artifacts.mkdir(parents=True, exist_ok=True)
    (page.artifacts / "console.log").write_text("\n".join(page.console))
    (page.artifacts / "requests.log").write_text("\n".join(seen))


def through_plugin(page: STPage, method: str, path: str, body: Any = None) -> dict[str, Any]:
    """A call through the plugin route from the page, as the extension makes it (session + CSRF)."""
    return page.evaluate("""async ([method, path, body]) => {
        const headers = SillyTavern.getContext().getRequestHeaders();
        const r = await fetch('/api/plugins/chronicler' + path, {method, headers, credentials: 'same-origin',
            body: body === null ? undefined : JSON.stringify(body)});
        return {status: r.status, body: await r.json()}; }""", [method, path, body])
