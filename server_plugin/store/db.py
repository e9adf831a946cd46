"""The database: connections with sqlite-vec loaded, pragmas, one writer, transactions.

One writer connection, used under a lock with `BEGIN IMMEDIATE`, so a logical write (a row, its
vector and its full-text entry) is one transaction and writers never meet "database is locked"
inside the process. Readers get one connection per thread; WAL lets them read while the writer
writes. Every connection is in autocommit mode (`isolation_level=None`): transactions are opened
explicitly, never implicitly by the driver.
"""

from __future__ import annotations

import json
import sqlite3 as _stdlib_sqlite3
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

import sqlite_vec

from .. import priority


def _pick_sqlite_module() -> Any:
    """The stdlib sqlite3 where it can load extensions, else pysqlite3 (same DB-API)."""
    if hasattr(_stdlib_sqlite3.Connection, "enable_load_extension"):
        return _stdlib_sqlite3
    import pysqlite3.dbapi2 as pysqlite3  # type: ignore[import-not-found]

    return pysqlite3


sqlite3 = _pick_sqlite_module()
Connection = Any  # sqlite3.Connection of whichever module was picked


class StorageFull(Exception):
    """The disk (or the configured page cap) is full: writes fail, reads go on."""


class StorageUnavailable(Exception):
    """The database could not be written for an I/O reason."""


FULL_MESSAGES = ("database or disk is full", "SQLITE_FULL",
                 # sqlite-vec's wording when it cannot allocate the next chunk of vectors
                 "Could not insert a new vector chunk")


def _is_full(exc: Exception) -> bool:
    return any(message in str(exc) for message in FULL_MESSAGES)


class Database:
    """Owns the writer connection (behind a lock) and per-thread reader connections."""

    def __init__(self, path: Path | str, *, busy_timeout_ms: int, synchronous: str,
                 max_page_count: int) -> None:
        self.path = str(path)
        self.busy_timeout_ms = busy_timeout_ms
        self.synchronous = synchronous.upper()
        self.max_page_count = max_page_count
        self._write_lock = threading.RLock()
        self._local = threading.local()
        self._all_readers: list[Connection] = []
        self._readers_lock = priority.Lock()
        self._writer = self._connect()
        self._writer.execute("PRAGMA journal_mode=WAL")
        # Bumped after every committed write: a cache keyed by it is never stale (one process
        # owns the store, see cli.lock_data_dir).
        self.generation = 0
        self._commit_listeners: list[Callable[[], None]] = []
        self._close_listeners: list[Callable[[], None]] = []

    def _connect(self) -> Connection:
        conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False,
                               timeout=self.busy_timeout_ms / 1000)
        conn.row_factory = sqlite3.Row
        conn.enable_load_extension(True)
        sqlite_vec.load(conn)
        conn.enable_load_extension(False)
        conn.execute(f"PRAGMA busy_timeout={int(self.busy_timeout_ms)}")
        conn.execute(f"PRAGMA synchronous={self.synchronous}")
        conn.execute("PRAGMA foreign_keys=ON")
        if self.max_page_count:
            conn.execute(f"PRAGMA max_page_count={int(self.max_page_count)}")
        return conn

    def reader(self) -> Connection:
        """This thread's read connection (created on first use)."""
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._connect()
            conn.execute("PRAGMA query_only=ON")
            self._local.conn = conn
            with self._readers_lock:
                self._all_readers.append(conn)
        return conn

    @contextmanager
    def read(self) -> Iterator[Connection]:
        """A consistent snapshot for several SELECTs (a deferred read transaction)."""
        conn = self.reader()
        conn.execute("BEGIN")
        try:
            yield conn
        finally:
            conn.execute("COMMIT")

    @contextmanager
    def write(self, durable: bool = True) -> Iterator[Connection]:
        """The one writer, in a `BEGIN IMMEDIATE` transaction: commit on success, else roll back.

        Re-entrant: a write() inside a write() on the same thread joins the outer transaction.
        `durable=False` commits without waiting for the disk (synchronous=NORMAL for this one
        transaction): for soft state such as usage statistics, which a power cut may lose but
        never corrupt (WAL keeps it consistent); the next durable commit syncs it too.
        """
        with self._write_lock, priority.writing():  # background work does not step aside holding it
            depth = getattr(self._local, "write_depth", 0)
            if depth:
                self._local.write_depth = depth + 1
                try:
                    yield self._writer
                finally:
                    self._local.write_depth = depth
                return
            self._local.write_depth = 1
            self._local.after_commit = []
            relaxed = not durable and self.synchronous in ("FULL", "EXTRA")
            try:
                if relaxed:
                    self._writer.execute("PRAGMA synchronous=NORMAL")
                self._begin()
                try:
                    yield self._writer
                except BaseException:
                    if self._writer.in_transaction:  # SQLite may already have rolled back
                        self._writer.execute("ROLLBACK")
                    raise
                self._commit()
            except sqlite3.OperationalError as exc:
                raise self._translate(exc) from exc
            finally:
                self._local.write_depth = 0
                if relaxed:
                    self._writer.execute(f"PRAGMA synchronous={self.synchronous}")
                callbacks, self._local.after_commit = self._local.after_commit, []
        for callback in callbacks:  # committed (an error would have left above): outside the lock
            callback()
        for listener in list(self._commit_listeners):
            listener()

    def on_commit(self, listener: Callable[[], None]) -> None:
        """Call `listener` after every committed write transaction from now on (outside the lock,
        in the committing thread): e.g. wake a thread that keeps an in-memory copy current. It
        must be quick and must not raise."""
        self._commit_listeners.append(listener)

    def on_close(self, listener: Callable[[], None]) -> None:
        """Call `listener` at the start of `close()`, before any connection closes: e.g. stop a
        thread that reads the store (closing a connection another thread is using can crash)."""
        self._close_listeners.append(listener)

    def after_commit(self, callback: Callable[[], None]) -> None:
        """Call `callback` once the current write transaction has committed (at once outside one;
        never if it rolls back): e.g. wake a thread that will read what was just written."""
        if getattr(self._local, "write_depth", 0):
            self._local.after_commit.append(callback)
        else:
            callback()

    def _begin(self) -> None:
        self._writer.execute("BEGIN IMMEDIATE")

    def _commit(self) -> None:
        try:
            self._writer.execute("COMMIT")
        except Exception:
            if self._writer.in_transaction:
                self._writer.execute("ROLLBACK")
            raise
        self.generation += 1

    @staticmethod
    def _translate(exc: Exception) -> Exception:
        if _is_full(exc):
            return StorageFull(str(exc))
        if "disk I/O error" in str(exc) or "readonly" in str(exc):
            return StorageUnavailable(str(exc))
        return exc

    def close(self) -> None:
        """Close every connection (readers of all threads, then the writer)."""
        for listener in list(self._close_listeners):
            listener()
        with self._readers_lock:
            for conn in self._all_readers:
                try:
                    conn.close()
                except Exception:  # a reader of a dead thread may already be gone
                    pass
            self._all_readers.clear()
        self._local = threading.local()
        with self._write_lock:
            self._writer.close()


def dumps(value: Any) -> str | None:
    """JSON for a TEXT column (None stays NULL)."""
    return None if value is None else json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def rekey(conn: Connection, column: str, old: Any, new: Any) -> list[str]:
    """Set `column` from `old` to `new` in every table of the schema that has that column
    (inside a write); returns those tables. Like an export, this reads the schema, not a concept:
    a chat rename moves every row keyed by the chat, whichever module owns it."""
    tables = [r[0] for r in conn.execute(
        "SELECT name FROM sqlite_master WHERE type='table' AND sql NOT LIKE 'CREATE VIRTUAL%'")]
    keyed = [t for t in tables if any(col[1] == column for col in conn.execute(f'PRAGMA table_info("{t}")'))]
    for table in keyed:
        conn.execute(f'UPDATE "{table}" SET "{column}"=? WHERE "{column}"=?', (new, old))
    return keyed


def loads(text: str | None) -> Any:
    return None if text is None else json.loads(text)
