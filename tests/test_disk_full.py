"""Disk full at the process level (rule OP5): the sidecar's data dir on a small tmpfs that fills up.

Writes answer 507 `storage_full` (or 503 `storage_unavailable` for an I/O error) in the envelope,
reads keep working, writing works again once space is freed, and after a restart every acknowledged
write is there and the store passes every check. Needs `mount -t tmpfs` (root, as CI runs here);
skipped with the reason where mounting is not allowed. (tests/test_db.py covers the same in-process
with SQLite's max_page_count.)
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Iterator

import pytest

from tests.helpers.client import Client
from tests.helpers.ledger import copy_store, store_problems
from tests.helpers.process import SidecarProcess

SIZE = "6m"   # the first memory allocates sqlite-vec's first vector chunk (1024 x 384 floats, 1.5 MB)


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    mount_point = tmp_path / "disk"
    mount_point.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a size-limited tmpfs needs root")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={SIZE},mode=0700", "tmpfs", str(mount_point)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield mount_point
    finally:
        if subprocess.run(["umount", str(mount_point)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(mount_point)], capture_output=True)


def _fill(path: Path, leave: int) -> Path:
    """A ballast file taking all free space but `leave` bytes."""
    stats = os.statvfs(path)
    free = stats.f_bavail * stats.f_frsize
    ballast = path / "ballast"
    with open(ballast, "wb") as fh:
        fh.write(b"\0" * max(0, free - leave))
    return ballast


def _all(client: Client) -> list[dict]:
    """Every memory, archived ones too (past 100 in a scope the oldest are archived, RV8)."""
    out = []
    for archived in ("false", "true"):
        status, body = client.call("GET", "/v1/memories", params={"archived": archived})
        assert status == 200, body
        out += body["memories"]
    return out


def test_disk_full_writes_507_reads_work_nothing_lost_after_freeing_space(small_disk: Path, tmp_path: Path) -> None:
    """Rule OP5, a full disk: a real process on a full file system."""
    side = SidecarProcess.create(small_disk / "data")
    side.start()
    side.wait_ready()
    client = Client(side.url, side.token)
    acked: dict[str, str] = {}
    try:
        def create(text: str) -> tuple[int, dict]:
            status, body = client.call("POST", "/v1/memories", {"text": text, "scope": "global", "actor": "user"})
            if status == 201:
                acked[body["memory"]["id"]] = text
            return status, body

        assert create("The first memory (allocates the vector chunk).")[0] == 201
        ballast = _fill(small_disk, leave=1024 * 1024)
        refusals = []
        for i in range(400):
            status, body = create(f"Fact {i}: " + "the archive of the northern keep holds many scrolls. " * 8)
            if status != 201:
                refusals.append((status, body))
                if len(refusals) >= 3:
                    break
        assert refusals, "the disk never filled"
        for status, body in refusals:
            assert (status, body["error"]["code"]) in {(507, "storage_full"), (503, "storage_unavailable")}, body
            assert body["ok"] is False and body["error"]["message"]
        # Other writes fail cleanly too, reads go on.
        status, body = client.call("PUT", "/v1/characters/mira.png", {"name": "Mira", "sheet": {"backstory": "x" * 5000}})
        assert status in (200, 201, 507, 503), body
        assert {m["id"] for m in _all(client)} == set(acked)
        assert side.alive()
        # Free the space: writing works again.
        ballast.unlink()
        assert create("Written after space came back.")[0] == 201
        side.kill()
        assert store_problems(copy_store(side.db_path, tmp_path / "copy")) == []
        side.start()
        assert {m["id"]: m["text"] for m in _all(client)} == acked
        print(f"disk full: {len(acked)} memories acknowledged, refusals {[s for s, _ in refusals]}")
    finally:
        client.close()
        side.kill()
