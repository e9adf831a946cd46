"""The sidecar as a real process (as a user starts it), killable with SIGKILL and restartable.

Builds on tests/helpers/sidecar.py's `Sidecar` (same command line, environment and port handling) and
adds what the fault tests need: SIGKILL, waiting for the embedding model, and the database path.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

import requests

from server_plugin.settings import TABLE
from tests.helpers.sidecar import Sidecar
from tests.helpers.sillytavern import free_port

DB_FILE = TABLE["db_file"].default  # the sidecar runs with no db_file of its own

# A small live window, so background summary jobs (extractive mode: no model) run while the
# clients write; deep memory stays off (its memories belong to no worker's ledger).
BUSY_JOBS = {"CHRONICLER_LIVE_WINDOW_MAX_MESSAGES": "6", "CHRONICLER_SUMMARY_CHUNK_MESSAGES": "2",
             "CHRONICLER_DEEP_MEMORY_MIN_NEW_MESSAGES": "1000000"}


@dataclass
class SidecarProcess(Sidecar):
    """A sidecar whose process can be killed hard and started again on the same port and data."""

    @classmethod
    def create(cls, data_dir: Path, origins: list[str] | None = None,
               token: str = "fault-token-0123456789", env: dict[str, str] | None = None) -> "SidecarProcess":
        return cls(data_dir=Path(data_dir), origins=origins or ["http://127.0.0.1:8000"],
                   port=free_port(), token=token, env=dict(env or {}))

    def jobs(self) -> list[dict]:
        status, body = self.request("GET", "/v1/jobs")
        assert status == 200, body
        return body["jobs"]

    def wait_jobs_settled(self, timeout: float = 120.0) -> list[dict]:
        """Until no job is pending or running; returns the jobs (raises after `timeout`)."""
        deadline = time.monotonic() + timeout
        while True:
            jobs = self.jobs()
            if all(j["state"] in ("done", "failed") for j in jobs):
                return jobs
            if time.monotonic() > deadline:
                raise TimeoutError(f"jobs still live after {timeout}s: "
                                   f"{[(j['kind'], j['state']) for j in jobs if j['state'] not in ('done', 'failed')]}")
            time.sleep(0.2)

    @property
    def db_path(self) -> Path:
        return self.data_dir / DB_FILE

    @property
    def pid(self) -> int | None:
        return None if self.proc is None else self.proc.pid

    def health(self, timeout: float = 2.0) -> dict:
        return requests.get(self.url + "/v1/health", timeout=timeout).json()

    def wait_ready(self, timeout: float = 120.0) -> float:
        """Block until the embedding model is loaded; returns the seconds waited."""
        started = time.monotonic()
        while time.monotonic() - started < timeout:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"sidecar exited with {self.proc.returncode}; log: {self.log_path}")
            try:
                embedder = self.health()["embedder"]
                if embedder["ready"]:
                    return time.monotonic() - started
                if embedder.get("error"):
                    raise RuntimeError(f"the embedder failed to load: {embedder['error']}")
            except requests.RequestException:
                pass
            time.sleep(0.05)
        raise TimeoutError(f"the embedding model was not ready within {timeout}s")

    def kill(self) -> None:
        """SIGKILL: no handler runs, no connection is closed, nothing is flushed by the process."""
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None
