"""The Chronicler sidecar as a real process for end-to-end tests.

It is started exactly as a user starts it (`python -m server_plugin.cli serve`), on a free loopback
port with a temporary data dir, a known token, and SillyTavern's origin in the allowlist.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.helpers.sillytavern import REPO_ROOT, free_port, terminate, wait_http

CLI = REPO_ROOT / "server_plugin" / "cli.py"
TOKEN = "e2e-token-0123456789abcdef"


def sidecar_available() -> bool:
    """The sidecar can be started once the foundation's CLI exists."""
    return CLI.exists()


@dataclass
class Sidecar:
    """One sidecar process; stop() and start() again keep its port, data dir and token."""

    data_dir: Path
    origins: list[str]
    port: int = field(default_factory=free_port)
    token: str = TOKEN
    proc: subprocess.Popen | None = None
    log_path: Path | None = None
    # False: start it as a user would after `chronicler install-extension` — no token or origins in
    # the environment, so it reads both from its data dir (token file, config.toml).
    configure_by_env: bool = True
    # More environment, e.g. {"CHRONICLER_LLM_MODE": "client"}.
    env: dict[str, str] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 120.0) -> "Sidecar":
        env = dict(os.environ)  # CHRONICLER_* set by a test (monkeypatch.setenv) reach the process
        env.update({"HF_HUB_OFFLINE": "1", "OPENBLAS_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"})
        if self.configure_by_env:
            env.update({"CHRONICLER_TOKEN": self.token, "CHRONICLER_ORIGINS": ",".join(self.origins)})
        else:
            env = {k: v for k, v in env.items() if not k.startswith("CHRONICLER_")}
        env.update(self.env)
        cmd = [sys.executable, "-m", "server_plugin.cli", "serve", "--port", str(self.port),
               "--data-dir", str(self.data_dir)]
        self.log_path = self.log_path or (self.data_dir.parent / f"{self.data_dir.name}.log")
        log = open(self.log_path, "a")
        self.proc = subprocess.Popen(cmd, cwd=REPO_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True)
        log.close()
        wait_http(self.url + "/v1/health", timeout, self.proc, self.log_path)
        return self

    def stop(self) -> None:
        terminate(self.proc)

    def request(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        """Call the sidecar's API with the token, as a test would from outside the browser."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method, headers={
            "Authorization": f"Bearer {self.token}",
            "Content-Type": "application/json",
        })
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                raw = resp.read()
                return resp.status, json.loads(raw) if raw else None
        except urllib.error.HTTPError as err:
            raw = err.read()
            return err.code, json.loads(raw) if raw else None
