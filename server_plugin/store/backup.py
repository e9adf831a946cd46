"""`chronicler backup`: a consistent copy of the store, safe while the sidecar is serving.

SQLite's online backup API copies every page inside one read transaction: the copy is the store at
one instant, and in WAL mode the sidecar keeps writing meanwhile (a reader never blocks the writer).
The copy is written beside its target, checked with `PRAGMA integrity_check`, flushed to disk and
only then renamed into place, so a failed or interrupted backup never leaves a half file under the
name a person will restore from. It holds private memories: mode 0600.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import sqlite_vec

from .db import sqlite3

COUNTED = ("characters", "chats", "memories")


class BackupError(Exception):
    """The backup could not be made (no store, unreadable, or the copy failed its check)."""


@dataclass(frozen=True)
class BackupResult:
    path: Path
    bytes: int
    counts: dict[str, int]


def default_backup_path(data_dir: Path, now: datetime | None = None) -> Path:
    """DATA_DIR/backups/chronicler-YYYYMMDDTHHMMSSZ.sqlite3"""
    stamp = (now or datetime.now(timezone.utc)).strftime("%Y%m%dT%H%M%SZ")
    return data_dir / "backups" / f"chronicler-{stamp}.sqlite3"


def _open(path: Path, read_only: bool, busy_timeout_ms: int) -> "sqlite3.Connection":
    uri = f"file:{path}?mode=ro" if read_only else f"file:{path}"
    conn = sqlite3.connect(uri, uri=True, isolation_level=None, timeout=busy_timeout_ms / 1000)
    conn.execute(f"PRAGMA busy_timeout={int(busy_timeout_ms)}")
    conn.enable_load_extension(True)
    sqlite_vec.load(conn)  # the vector tables are virtual: checking them needs their module
    conn.enable_load_extension(False)
    return conn


def _binary() -> int:
    r"""O_BINARY where it exists (Windows: without it a descriptor turns "\n" into "\r\n"); else 0."""
    return getattr(os, "O_BINARY", 0)


def _fsync_file(path: Path) -> None:
    """Flush a file to disk through a read-write descriptor (Windows refuses fsync on a read-only one)."""
    fd = os.open(path, os.O_RDWR | _binary())
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_folder(path: Path) -> None:
    """Flush a folder's entries (the rename) to disk; Windows cannot open a folder as a file (skipped)."""
    if os.name == "nt":
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def backup_database(db_path: Path, out: Path, *, busy_timeout_ms: int) -> BackupResult:
    """Copy the database at `db_path` to `out` (replacing it), checked and flushed; see module doc."""
    if not db_path.is_file():
        raise BackupError(f"There is no Chronicler database at {db_path}.")
    out.parent.mkdir(parents=True, exist_ok=True)
    part = out.with_name(out.name + ".part")
    part.unlink(missing_ok=True)
    fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _binary(), 0o600)  # private from its first byte
    os.close(fd)
    try:
        source = _open(db_path, read_only=True, busy_timeout_ms=busy_timeout_ms)
        target = _open(part, read_only=False, busy_timeout_ms=busy_timeout_ms)
        try:
            source.backup(target)  # all pages in one step: one consistent snapshot
            target.execute("PRAGMA journal_mode=DELETE")  # one self-contained file, no -wal beside it
            problems = [r[0] for r in target.execute("PRAGMA integrity_check")]
            if problems != ["ok"]:
                raise BackupError(f"The copy failed its integrity check: {problems[:3]}")
            counts = {t: target.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in COUNTED}
        finally:
            target.close()
            source.close()
        _fsync_file(part)
        os.replace(part, out)
        _fsync_folder(out.parent)
    except sqlite3.Error as exc:
        part.unlink(missing_ok=True)
        raise BackupError(f"The backup failed: {exc}") from exc
    except BaseException:
        part.unlink(missing_ok=True)
        raise
    return BackupResult(out, out.stat().st_size, counts)
