"""Every vector of a sqlite-vec table read at once, from the chunks it keeps them in.

A restart reads every stored vector into the in-memory index (live_index.build). Through the
vec0 virtual table (`SELECT rowid, embedding FROM docs_vec`) sqlite-vec copies them out one row at
a time: about 1 s per 10,000 vectors on these cores, most of a campaign's start-up. vec0 keeps
them as blobs of 1,024 vectors (`<table>_vector_chunks00`) with each rowid's chunk and offset in
`<table>_rowids`; reading those is ten times faster, and straight into the index's matrix one
chunk at a time (`copy_into`), no copy of them all is held. That layout is sqlite-vec's own
(0.1.x), so it is used only when the table says it was made by 0.1.x and a sample of vectors read
both ways agrees; otherwise (None) the caller reads through vec0.
"""

from __future__ import annotations

import logging
from typing import Any, Iterator, Mapping, Sequence

import numpy as np

log = logging.getLogger(__name__)

SAMPLE = 16  # vectors compared with vec0's own answer before the chunks are trusted


def _made_by_known_version(conn: Any, table: str) -> bool:
    try:
        info = dict(conn.execute(f'SELECT key, value FROM "{table}_info"').fetchall())
    except Exception:  # no such table: another layout
        return False
    return info.get("CREATE_VERSION_MAJOR") == 0 and info.get("CREATE_VERSION_MINOR") == 1


class ChunkVectors(Mapping[int, np.ndarray]):
    """rowid -> vector of every row of a vec0 table, read from its chunks when asked. `copy_into`
    reads each chunk once and keeps one in memory at a time: holding every chunk and a dict of one
    entry per row raised the peak memory of a 100,000-message campaign's start-up by ~80 MB. Reads
    through `conn`: use it inside the read transaction that made it."""

    def __init__(self, conn: Any, table: str, dim: int, where: np.ndarray) -> None:
        order = np.argsort(where[:, 0], kind="stable")
        self._conn, self._table, self._dim = conn, table, dim
        self._ids, self._chunk, self._offset = where[order, 0], where[order, 1], where[order, 2]

    def positions(self, rowids: Sequence[int] | np.ndarray) -> np.ndarray:
        """Where each of `rowids` is held (-1: not held)."""
        wanted = np.asarray(rowids, dtype=np.int64)
        if not len(self._ids):
            return np.full(len(wanted), -1, dtype=np.int64)
        at = np.minimum(np.searchsorted(self._ids, wanted), len(self._ids) - 1)
        return np.where(self._ids[at] == wanted, at, -1)

    def copy_into(self, rowids: Sequence[int] | np.ndarray, dest: np.ndarray) -> None:
        """dest[k] = the vector of rowids[k], for every k (KeyError when one is not held); read
        through vec0 instead when the chunks turn out to be unreadable."""
        at = self._held(rowids)
        try:
            self._stream(at, dest)
        except (LookupError, ValueError):  # a layout this code does not know after all
            log.warning("search: %s's chunks could not be read; reading through sqlite-vec", self._table,
                        exc_info=True)
            wanted = np.asarray(rowids).tolist()
            copy_into(read(self._conn, self._table, wanted, self._dim), wanted, dest)

    def strictly(self, rowids: Sequence[int]) -> np.ndarray:
        """The vectors of `rowids` from the chunks alone (never through vec0: the trust check)."""
        dest = np.zeros((len(rowids), self._dim), dtype=np.float32)
        self._stream(self._held(rowids), dest)
        return dest

    def _held(self, rowids: Sequence[int] | np.ndarray) -> np.ndarray:
        at = self.positions(rowids)
        if len(at) and at.min() < 0:
            raise KeyError(int(np.asarray(rowids)[int(np.argmin(at))]))
        return at

    def _stream(self, at: np.ndarray, dest: np.ndarray) -> None:
        """dest[k] = the vector held at position at[k]: each chunk read once, one at a time."""
        chunk = self._chunk[at]
        order = np.argsort(chunk, kind="stable")
        needed, starts = np.unique(chunk[order], return_index=True)
        bounds = dict(zip(needed.tolist(), zip(starts.tolist(), [*starts[1:].tolist(), len(order)])))
        sql, args = f'SELECT rowid, vectors FROM "{self._table}_vector_chunks00"', []
        if len(bounds) <= 500:  # a sample, one row: only their chunks; else every chunk in turn
            sql, args = sql + f' WHERE rowid IN ({",".join("?" * len(bounds))})', list(bounds)
        for cid, blob in self._conn.execute(sql, args):
            span = bounds.pop(int(cid), None)
            if span is not None:
                rows = order[span[0]:span[1]]
                block = np.frombuffer(blob, dtype=np.float32).reshape(-1, self._dim)
                dest[rows] = block[self._offset[at[rows]]]
        if bounds:
            raise LookupError(f"{self._table}: chunks {sorted(bounds)[:5]} are missing")

    def __getitem__(self, rowid: int) -> np.ndarray:
        out = np.zeros((1, self._dim), dtype=np.float32)
        self.copy_into([rowid], out)  # KeyError when not held
        return out[0]

    def __contains__(self, rowid: object) -> bool:
        return isinstance(rowid, (int, np.integer)) and int(self.positions([int(rowid)])[0]) >= 0

    def __iter__(self) -> Iterator[int]:
        return iter(self._ids.tolist())

    def __len__(self) -> int:
        return len(self._ids)


def read_all(conn: Any, table: str, dim: int) -> ChunkVectors | None:
    """rowid -> float32 vector of every row of vec0 `table`, read from its chunks when asked, or
    None where the chunks cannot be trusted (the caller then reads through vec0)."""
    if not _made_by_known_version(conn, table):
        return None
    try:
        rows = conn.execute(f'SELECT rowid, chunk_id, chunk_offset FROM "{table}_rowids"').fetchall()
        where = np.array(rows, dtype=np.int64).reshape(-1, 3)
        out = ChunkVectors(conn, table, dim, where)
        agrees = _agrees(conn, table, out)
    except Exception:  # a layout this code does not know (a vector of another size, a missing chunk)
        log.warning("search: %s's chunks could not be read; reading through sqlite-vec", table, exc_info=True)
        return None
    return out if agrees else None


def copy_into(vectors: Mapping[int, np.ndarray], rowids: Sequence[int], dest: np.ndarray) -> None:
    """dest[k] = vectors[rowids[k]] for every k (chunk by chunk when read from the chunks)."""
    if isinstance(vectors, ChunkVectors):
        vectors.copy_into(rowids, dest)
        return
    for k, rowid in enumerate(rowids):
        dest[k] = vectors[rowid]


def held(vectors: Mapping[int, np.ndarray], rowids: Sequence[int]) -> np.ndarray:
    """Which of `rowids` have a vector in `vectors`."""
    if isinstance(vectors, ChunkVectors):
        return vectors.positions(rowids) >= 0
    return np.array([r in vectors for r in rowids], dtype=bool)


def _agrees(conn: Any, table: str, out: ChunkVectors) -> bool:
    """Whether vec0 gives the same rows and, for a sample of them, the same vectors."""
    if conn.execute(f'SELECT count(*) FROM "{table}"').fetchone()[0] != len(out):
        return False
    ids = list(out)  # in rowid order
    sample = sorted(set(ids[:SAMPLE // 2] + ids[-SAMPLE // 2:] + ids[:: max(1, len(ids) // SAMPLE)]))
    mine = dict(zip(sample, out.strictly(sample)))
    for start in range(0, len(sample), 500):
        chunk = sample[start:start + 500]
        rows = conn.execute(f'SELECT rowid, embedding FROM "{table}" WHERE rowid IN ({",".join("?" * len(chunk))})',
                            chunk).fetchall()
        if len(rows) != len(chunk) or any(
                not np.array_equal(np.frombuffer(r[1], dtype=np.float32), mine[int(r[0])]) for r in rows):
            log.warning("search: %s's chunks disagree with sqlite-vec; reading through it", table)
            return False
    return True


def read(conn: Any, table: str, rowids: Sequence[int] | None, dim: int) -> Mapping[int, np.ndarray]:
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
