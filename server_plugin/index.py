"""The search index: every searchable item as a `docs` row, its full-text entry and its vector.

Domain modules call `prepare()` before opening a write transaction (embedding takes milliseconds
and must not hold the writer lock), then `put()` / `remove()` inside it, so the item, its text
entry and its vector are committed together or not at all.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Sequence

import numpy as np

from .db import Connection, dumps
from .embeddings import Embedder


@dataclass(frozen=True)
class Prepared:
    """A text and its vector, computed outside the write transaction."""

    text: str
    vector: np.ndarray


def prepare(embedder: Embedder, texts: Sequence[str], timeout: float = 60.0) -> list[Prepared]:
    """Embed texts (in one batch) for later `put()` calls."""
    vectors = embedder.embed(list(texts), timeout=timeout)
    return [Prepared(t, v) for t, v in zip(texts, vectors)]


def put(conn: Connection, kind: str, ref_id: str, prepared: Prepared, *, created_at: str,
        chat_id: str | None = None, character_id: str | None = None,
        known_by: Iterable[str] | None = None) -> int:
    """Insert or replace the index entry of one item; returns its doc id."""
    known = None if known_by is None else sorted(set(known_by))
    row = conn.execute("SELECT id FROM docs WHERE kind=? AND ref_id=?", (kind, ref_id)).fetchone()
    if row is None:
        doc_id = conn.execute(
            "INSERT INTO docs(kind, ref_id, chat_id, character_id, known_by, text, created_at)"
            " VALUES (?,?,?,?,?,?,?)",
            (kind, ref_id, chat_id, character_id, dumps(known), prepared.text, created_at)).lastrowid
    else:
        doc_id = row[0]
        conn.execute("UPDATE docs SET chat_id=?, character_id=?, known_by=?, text=? WHERE id=?",
                     (chat_id, character_id, dumps(known), prepared.text, doc_id))
        conn.execute("DELETE FROM docs_fts WHERE rowid=?", (doc_id,))
        conn.execute("DELETE FROM docs_vec WHERE rowid=?", (doc_id,))
    conn.execute("INSERT INTO docs_fts(rowid, text) VALUES (?,?)", (doc_id, prepared.text))
    conn.execute("INSERT INTO docs_vec(rowid, embedding) VALUES (?,?)",
                 (doc_id, np.asarray(prepared.vector, dtype=np.float32).tobytes()))
    return doc_id


def update_meta(conn: Connection, kind: str, ref_id: str, **fields: Any) -> None:
    """Change who/where an item belongs to (character, chat, known_by) without re-embedding."""
    allowed = {"chat_id", "character_id", "known_by"}
    if not fields or set(fields) - allowed:
        raise ValueError(f"update_meta takes {sorted(allowed)}")
    if "known_by" in fields and fields["known_by"] is not None:
        fields["known_by"] = sorted(set(fields["known_by"]))
    values = [dumps(v) if k == "known_by" else v for k, v in fields.items()]
    assignments = ", ".join(f"{k}=?" for k in fields)
    conn.execute(f"UPDATE docs SET {assignments} WHERE kind=? AND ref_id=?", (*values, kind, ref_id))


def remove(conn: Connection, kind: str, ref_ids: Iterable[str]) -> int:
    """Delete the index entries of items; returns how many existed."""
    removed = 0
    for ref_id in ref_ids:
        row = conn.execute("SELECT id FROM docs WHERE kind=? AND ref_id=?", (kind, ref_id)).fetchone()
        if row is None:
            continue
        conn.execute("DELETE FROM docs_fts WHERE rowid=?", (row[0],))
        conn.execute("DELETE FROM docs_vec WHERE rowid=?", (row[0],))
        conn.execute("DELETE FROM docs WHERE id=?", (row[0],))
        removed += 1
    return removed


def orphans(conn: Connection) -> dict[str, int]:
    """Counts of broken index entries (docs without text entry or vector, and the reverse).

    Used by integrity checks and the crash tests: every count must be zero.
    """
    return {
        "docs_without_fts": conn.execute(
            "SELECT count(*) FROM docs WHERE id NOT IN (SELECT rowid FROM docs_fts)").fetchone()[0],
        "docs_without_vec": conn.execute(
            "SELECT count(*) FROM docs WHERE id NOT IN (SELECT rowid FROM docs_vec)").fetchone()[0],
        "fts_without_doc": conn.execute(
            "SELECT count(*) FROM docs_fts WHERE rowid NOT IN (SELECT id FROM docs)").fetchone()[0],
        "vec_without_doc": conn.execute(
            "SELECT count(*) FROM docs_vec WHERE rowid NOT IN (SELECT id FROM docs)").fetchone()[0],
    }
