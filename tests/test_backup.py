"""`chronicler backup` (rule OP8): a consistent, checked, private copy, safe while the sidecar serves."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from server_plugin.cli import main
from server_plugin.settings import defaults
from server_plugin.store.backup import BackupError, backup_database, default_backup_path
from tests.helpers.client import Client
from tests.helpers.ledger import open_db, store_problems
from tests.helpers.process import SidecarProcess
from tests.helpers.workload import Worker, snapshot


def _memory(api, text: str) -> str:
    response = api.post("/v1/memories", json={"text": text, "scope": "global", "actor": "user"})
    assert response.status_code == 201
    return response.get_json()["memory"]["id"]


def test_backup_copies_every_row_checked_and_private(api, services, tmp_path):
    """The copy opens on its own, passes integrity_check, has the same rows, and is mode 0600."""
    ids = [_memory(api, f"Fact {i}: the tower has {i} bells.") for i in range(5)]
    out = tmp_path / "copies" / "campaign.sqlite3"
    result = backup_database(Path(services.db.path), out, busy_timeout_ms=services.settings.busy_timeout_ms)
    assert result.path == out and result.counts["memories"] == 5
    assert stat.S_IMODE(os.stat(out).st_mode) == 0o600
    assert not out.with_name(out.name + ".part").exists() and not Path(str(out) + "-wal").exists()
    assert store_problems(out) == []
    conn = open_db(out)
    assert sorted(r[0] for r in conn.execute("SELECT id FROM memories")) == sorted(ids)
    assert conn.execute("SELECT count(*) FROM docs_vec").fetchone()[0] == 5
    conn.close()


def test_backup_of_a_missing_store_says_so_and_writes_nothing(tmp_path):
    with pytest.raises(BackupError, match="no Chronicler database"):
        backup_database(tmp_path / "nothing.sqlite3", tmp_path / "out.sqlite3",
                        busy_timeout_ms=defaults().busy_timeout_ms)
    assert list(tmp_path.iterdir()) == []


def test_cli_backup_default_path_and_exit_codes(api, services, settings, capsys):
    _memory(api, "Remember the lighthouse.")
    assert main(["backup", "--data-dir", str(settings.data_path)]) == 0
    printed = capsys.readouterr().out
    copies = list((settings.data_path / "backups").glob("chronicler-*.sqlite3"))
    assert len(copies) == 1 and str(copies[0]) in printed and "1 memories" in printed
    assert default_backup_path(settings.data_path).parent == copies[0].parent
    assert main(["backup", "--data-dir", str(settings.data_path / "elsewhere")]) == 1
    assert "no Chronicler database" in capsys.readouterr().err


def test_backup_while_serving_under_concurrent_writes_has_every_write_acknowledged_before_it(tmp_path):
    """Rule OP8: `chronicler backup` as a process while a real sidecar takes writes from three
    clients: the copy passes every check and holds every memory acknowledged before it started."""
    side = SidecarProcess.create(tmp_path / "data")
    side.start()
    side.wait_ready()
    stop = threading.Event()
    acked: list[tuple[float, str, str]] = []   # (monotonic time of the answer, id, text)
    refused: list[str] = []

    def creator() -> None:
        c = Client(side.url, side.token)
        n = 0
        while not stop.is_set():
            n += 1
            text = f"[creator] fact {n}"
            status, body = c.call("POST", "/v1/memories", {"text": text, "scope": "global", "actor": "user"})
            if status != 201:
                refused.append(f"{status} {body}")
                return
            acked.append((time.monotonic(), body["memory"]["id"], text))
        c.close()

    mixers = [Worker(f"w{i}", Client(side.url, side.token), seed=i) for i in range(2)]
    threads = [threading.Thread(target=creator)] + [threading.Thread(target=w.run, args=(stop,)) for w in mixers]
    try:
        for t in threads:
            t.start()
        deadline = time.monotonic() + 60
        while len(acked) < 20 and not refused and time.monotonic() < deadline:
            time.sleep(0.05)
        out = tmp_path / "backup.sqlite3"
        started = time.monotonic()
        done = subprocess.run([sys.executable, "-m", "server_plugin.cli", "backup", "--data-dir",
                               str(side.data_dir), "--out", str(out)], capture_output=True, text=True,
                              timeout=120, env={**os.environ, "CHRONICLER_TOKEN": side.token})
        time.sleep(0.5)  # writes go on after the backup too
        stop.set()
        for t in threads:
            t.join(60)
        assert done.returncode == 0, done.stderr
        assert refused == []
        assert [f for w in mixers for f in w.failures] == []
        before = {mid: text for when, mid, text in acked if when < started}
        assert len(before) >= 5 and len(acked) > len(before)
        assert store_problems(out) == []
        conn = open_db(out)
        copied = dict(conn.execute("SELECT id, text FROM memories WHERE text LIKE '[creator]%'").fetchall())
        conn.close()
        assert {mid: copied.get(mid) for mid in before} == before
        client = Client(side.url, side.token)
        store = snapshot(client)   # the live store lost nothing meanwhile either
        assert [p for w in mixers for p in w.ledger.reconcile(store.get(w.owner, {}))] == []
        client.close()
    finally:
        stop.set()
        side.stop()


def test_backup_on_windows_flushes_through_a_read_write_binary_descriptor_and_no_folder(
        api, services, tmp_path, monkeypatch):
    """Windows refuses fsync through a read-only descriptor and cannot open a folder; and a descriptor
    opened without O_BINARY there turns "\\n" into "\\r\\n". Faked here: os.name "nt" and an O_BINARY
    flag (0x8000, its Windows value, harmless on Linux)."""
    from server_plugin.store import backup

    _memory(api, "The well is dry since the frost.")
    db_path, out = Path(services.db.path), tmp_path / "copy.sqlite3"
    opened: dict[int, tuple[str, int]] = {}
    synced: list[tuple[str, int]] = []
    real_open, real_fsync = os.open, os.fsync

    def fake_open(path, flags, *rest):
        fd = real_open(path, flags, *rest)
        opened[fd] = (str(path), flags)
        return fd

    def fake_fsync(fd):
        synced.append(opened[fd])
        return real_fsync(fd)

    monkeypatch.setattr(os, "O_BINARY", 0x8000, raising=False)
    monkeypatch.setattr(os, "open", fake_open)
    monkeypatch.setattr(os, "fsync", fake_fsync)
    monkeypatch.setattr(os, "name", "nt")
    result = backup.backup_database(db_path, out, busy_timeout_ms=services.settings.busy_timeout_ms)
    monkeypatch.undo()
    assert result.counts["memories"] == 1 and store_problems(out) == []
    assert [path for path, _ in synced] == [str(out) + ".part"], synced  # the file; no folder on Windows
    assert all(flags & os.O_ACCMODE == os.O_RDWR and flags & 0x8000 for _, flags in synced), synced
    created = [flags for path, flags in opened.values() if path.endswith(".part") and flags & os.O_CREAT]
    assert created and all(flags & 0x8000 for flags in created)


def test_backup_on_posix_still_flushes_the_folder(api, services, tmp_path, monkeypatch):
    """Off Windows the rename is made durable: the folder is flushed after the file."""
    from server_plugin.store import backup

    synced: list[int] = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(os.fstat(fd).st_mode), real_fsync(fd))[1])
    backup.backup_database(Path(services.db.path), tmp_path / "copy.sqlite3",
                           busy_timeout_ms=services.settings.busy_timeout_ms)
    monkeypatch.undo()
    assert [stat.S_ISDIR(mode) for mode in synced] == [False, True]
