"""Every vector of a sqlite-vec table read at once, from the chunks it keeps them in.

A restart reads every stored vector into the in-memory index (live_index.build). Through the
vec0 virtual table (`SELECT rowid, embedding FROM docs_vec`) sqlite-vec copies them out one row at
a time: about 1 s per 10,000 vectors on these cores, most of a campaign's start-up. vec0 keeps
them as blobs of 1,024 vectors (`<table>_vector_chunks00`) with each rowid's chunk and offset in
`<table>_rowids`; reading those is ten times faster. That layout is sqlite-vec's own (0.1.x), so
it is used only when the table says it was made by 0.1.x and a sample of vectors read both ways
agrees; otherwise (None) the caller reads through vec0.
"""

from __future__ import annotations

import logging
from typing import Any, Sequence

import numpy as np

log = logging.getLogger(__name__)

SAMPLE = 16  # vectors compared with vec0's own answer before the chunks are trusted


def _made_by_known_version(conn: Any, table: str) -> bool:
    try:
        info = dict(conn.execute(f'SELECT key, value FROM "{table}_info"').fetchall())
    except Exception:  # no such table: another layout
        return False
    return info.get("CREATE_VERSION_MAJOR") == 0 and info.get("CREATE_VERSION_MINOR") == 1


def read_all(conn: Any, table: str, dim: int) -> dict[int, np.ndarray] | None:
    """rowid -> float32 vector of every row of vec0 `table`, or None where the chunks cannot be
    trusted (the caller then reads through vec0)."""
    if not _made_by_known_version(conn, table):
        return None
    try:
        chunks = {int(cid): np.frombuffer(blob, dtype=np.float32).reshape(-1, dim)
                  for cid, blob in conn.execute(f'SELECT rowid, vectors FROM "{table}_vector_chunks00"')}
        out = {int(rowid): chunks[int(cid)][int(offset)]
               for rowid, cid, offset in conn.execute(f'SELECT rowid, chunk_id, chunk_offset FROM "{table}_rowids"')}
    except Exception:  # a layout this code does not know (a vector of another size, a missing chunk)
        log.warning("search: %s's chunks could not be read; reading through sqlite-vec", table, exc_info=True)
        return None
    return out if _agrees(conn, table, out) else None


def _agrees(conn: Any, table: str, out: dict[int, np.ndarray]) -> bool:
    """Whether vec0 gives the same rows and, for a sample of them, the same vectors."""
    if conn.execute(f'SELECT count(*) FROM "{table}"').fetchone()[0] != len(out):
        return False
    ids = sorted(out)
    sample = sorted(set(ids[:SAMPLE // 2] + ids[-SAMPLE // 2:] + ids[:: max(1, len(ids) // SAMPLE)]))
    for start in range(0, len(sample), 500):
        chunk = sample[start:start + 500]
        rows = conn.execute(f'SELECT rowid, embedding FROM "{table}" WHERE rowid IN ({",".join("?" * len(chunk))})',
                            chunk).fetchall()
        if len(rows) != len(chunk) or any(
                not np.array_equal(np.frombuffer(r[1], dtype=np.float32), out[int(r[0])]) for r in rows):
            log.warning("search: %s's chunks disagree with sqlite-vec; reading through it", table)
            return False
    return True


def read(conn: Any, table: str, rowids: Sequence[int] | None, dim: int) -> dict[int, np.ndarray]:
    """rowid -> float32 vector of these rows of vec0 `table` (None: of every row, from its chunks
    where they can be trusted: read-only views)."""
    if rowids is None:
        every = read_all(conn, table, dim)
        if every is not None:
            return every
        rows = conn.execute(f'SELECT rowid, embedding FROM "{table}"').fetchall()
    else:
        rows = []
        for start in range(0, len(rowids), 500):
            chunk = list(rowids[start:start + 500])
            rows += conn.execute(f'SELECT rowid, embedding FROM "{table}" WHERE rowid IN'
                                 f' ({",".join("?" * len(chunk))})', chunk).fetchall()
    return {int(r[0]): np.frombuffer(r[1], dtype=np.float32) for r in rows}


def row_ids(conn: Any, table: str) -> set[int]:
    """The rowids vec0 `table` holds a vector for."""
    return {int(r[0]) for r in conn.execute(f'SELECT rowid FROM "{table}"')}
