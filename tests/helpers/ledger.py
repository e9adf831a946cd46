"""What the store must hold, built only from acknowledged writes; and the checks of a store.

A `Ledger` belongs to one worker, which owns a disjoint part of the store (ids and texts start with
its name), so several workers can write at once and each ledger stays exact. A worker has at most
one request in flight; when the sidecar dies during it, that write is `pending`: the store may hold
its effects or not, but all of them or none (one transaction). After a restart `reconcile()` accepts
exactly those two states and reports anything else: an acknowledged write missing or changed, a
half-applied write, an item nobody wrote.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

Key = tuple[str, str]           # (kind, id): ("character", "w1-c3.png"), ("memory", "m_…")
State = dict[str, Any]


@dataclass
class Pending:
    """One write whose answer never came: its effects on known items, and items it would create."""

    op: str
    effects: dict[Key, State | None]
    creates: list[tuple[str, State]] = field(default_factory=list)  # (kind, state), server-chosen ids


def _canon(state: State) -> str:
    return json.dumps(state, sort_keys=True, ensure_ascii=False)


def apply(confirmed: dict[Key, State], effects: dict[Key, State | None]) -> dict[Key, State]:
    """The store after a write: None deletes an item, a state sets it."""
    out = dict(confirmed)
    for key, state in effects.items():
        if state is None:
            out.pop(key, None)
        else:
            out[key] = state
    return out


class Ledger:
    """The acknowledged state of one owner's items, and at most one write in flight."""

    def __init__(self, owner: str) -> None:
        self.owner = owner
        self.confirmed: dict[Key, State] = {}
        self.pending: Pending | None = None
        self.acked: Counter[str] = Counter()      # acknowledged writes by operation
        self.refused: Counter[str] = Counter()    # definite 4xx answers by error code
        self.in_flight_applied = 0                # pending writes found applied after a crash
        self.in_flight_lost = 0                   # pending writes found not applied

    # --- recording --------------------------------------------------------------------------
    def begin(self, op: str, effects: dict[Key, State | None],
              creates: Iterable[tuple[str, State]] = ()) -> None:
        assert self.pending is None, "one write in flight per worker"
        self.pending = Pending(op, dict(effects), list(creates))

    def ack(self, effects: dict[Key, State | None]) -> None:
        """The write was acknowledged: these are now facts the store must keep."""
        assert self.pending is not None
        self.acked[self.pending.op] += 1
        self.confirmed = apply(self.confirmed, effects)
        self.pending = None

    def refuse(self, code: str) -> None:
        """A definite error answer: the write changed nothing."""
        self.refused[code] += 1
        self.pending = None

    def items(self, kind: str) -> dict[str, State]:
        return {k[1]: v for k, v in self.confirmed.items() if k[0] == kind}

    # --- checking ---------------------------------------------------------------------------
    def reconcile(self, actual: dict[Key, State]) -> list[str]:
        """Compare the store's items of this owner with the ledger; adopt them when they fit.

        Fits: exactly the confirmed state, or the confirmed state with the pending write applied
        whole. Returns the problems (empty when it fits).
        """
        if actual == self.confirmed:
            if self.pending is not None:
                self.in_flight_lost += 1
            self.pending = None
            return []
        if self.pending is not None and self._matches_applied(actual):
            self.in_flight_applied += 1
            self.confirmed = dict(actual)
            self.pending = None
            return []
        return self._describe(actual)

    def _matches_applied(self, actual: dict[Key, State]) -> bool:
        assert self.pending is not None
        expected = apply(self.confirmed, self.pending.effects)
        extra = {k: v for k, v in actual.items() if k not in expected}
        if any(actual.get(k) != v for k, v in expected.items()):
            return False
        made = sorted(_canon({"kind": k[0], **v}) for k, v in extra.items())
        wanted = sorted(_canon({"kind": kind, **state}) for kind, state in self.pending.creates)
        return made == wanted

    def _describe(self, actual: dict[Key, State]) -> list[str]:
        problems = []
        for key, state in self.confirmed.items():
            if key not in actual:
                problems.append(f"{self.owner}: acknowledged {key} is missing (had {state})")
            elif actual[key] != state:
                problems.append(f"{self.owner}: {key} is {actual[key]}, acknowledged {state}")
        for key, state in actual.items():
            if key not in self.confirmed:
                problems.append(f"{self.owner}: {key} = {state} was never acknowledged")
        pending = self.pending
        if pending is not None:
            problems.append(f"{self.owner}: (the write in flight was {pending.op}: "
                            f"{pending.effects} creating {pending.creates})")
        return problems


# --- checks of a database file ----------------------------------------------------------------
def open_db(path: Path) -> Any:
    """A connection with sqlite-vec loaded (the module the server uses), without the server's pragmas."""
    import sqlite_vec

    from server_plugin.store.db import sqlite3

    conn = sqlite3.connect(str(path), isolation_level=None)
    conn.enable_load_extension(True)
    sqlite_vec.load(conn)
    conn.enable_load_extension(False)
    return conn


# Each query counts broken things; every count must be zero. Memories and their index entry
# (docs row, its full-text entry and vector) are written in one transaction (index.py).
CONSISTENCY = {
    "memory_without_doc": "SELECT count(*) FROM memories m WHERE NOT EXISTS"
                          " (SELECT 1 FROM docs d WHERE d.kind='memory' AND d.ref_id=m.id)",
    "memory_doc_without_memory": "SELECT count(*) FROM docs d WHERE d.kind='memory' AND NOT EXISTS"
                                 " (SELECT 1 FROM memories m WHERE m.id=d.ref_id)",
    "memory_doc_text_differs": "SELECT count(*) FROM docs d JOIN memories m ON d.kind='memory'"
                               " AND m.id=d.ref_id WHERE d.text != m.text",
    "memory_doc_character_differs": "SELECT count(*) FROM docs d JOIN memories m ON d.kind='memory'"
                                    " AND m.id=d.ref_id WHERE d.character_id IS NOT m.character_id",
    "fts_text_differs": "SELECT count(*) FROM docs d JOIN docs_fts f ON f.rowid=d.id WHERE f.text != d.text",
    "message_without_doc": "SELECT count(*) FROM messages m WHERE NOT EXISTS (SELECT 1 FROM docs d"
                           " WHERE d.kind='message' AND d.ref_id=CAST(m.seq AS TEXT))",
    "message_doc_without_message": "SELECT count(*) FROM docs d WHERE d.kind='message' AND NOT EXISTS"
                                   " (SELECT 1 FROM messages m WHERE CAST(m.seq AS TEXT)=d.ref_id)",
    "message_doc_text_differs": "SELECT count(*) FROM docs d JOIN messages m ON d.kind='message'"
                                " AND CAST(m.seq AS TEXT)=d.ref_id WHERE d.text != m.text",
    "message_doc_chat_differs": "SELECT count(*) FROM docs d JOIN messages m ON d.kind='message'"
                                " AND CAST(m.seq AS TEXT)=d.ref_id WHERE d.chat_id IS NOT m.chat_id",
    "member_of_missing_chat": "SELECT count(*) FROM chat_members cm WHERE NOT EXISTS"
                              " (SELECT 1 FROM chats c WHERE c.id=cm.chat_id)",
}


def store_problems(path: Path) -> list[str]:
    """Everything wrong with a database file: integrity, orphaned index rows, half-written items.

    Opens the file as it is (a crashed store is recovered from its WAL by this open, as the
    server's own open would). Run it on a copy to leave the original untouched.
    """
    from server_plugin.retrieval import docs as index

    conn = open_db(path)
    try:
        problems = []
        integrity = [r[0] for r in conn.execute("PRAGMA integrity_check")]
        if integrity != ["ok"]:
            problems.append(f"integrity_check: {integrity[:5]}")
        for name, count in index.orphans(conn).items():
            if count:
                problems.append(f"{name}: {count}")
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        for name, sql in CONSISTENCY.items():
            if name.split("_", 1)[0] + "s" not in tables and name.startswith("message"):
                continue  # a store from before the transcript (migration m002)
            count = conn.execute(sql).fetchone()[0]
            if count:
                problems.append(f"{name}: {count}")
        try:
            conn.execute("INSERT INTO docs_fts(docs_fts) VALUES ('integrity-check')")
        except Exception as exc:  # FTS5 reports a damaged index as an error
            problems.append(f"fts integrity-check: {exc}")
        return problems
    finally:
        conn.close()


def copy_store(db_path: Path, into: Path) -> Path:
    """Copy a (possibly crashed) database and its -wal file, byte for byte.

    The -shm file (the WAL index) is left out: the copy's first open rebuilds it from the WAL,
    which is the recovery a restart after a crash performs.
    """
    import shutil

    into.mkdir(parents=True, exist_ok=True)
    for suffix in ("", "-wal"):
        source = Path(str(db_path) + suffix)
        if source.exists():
            shutil.copyfile(source, into / (db_path.name + suffix))
    return into / db_path.name
