"""A fresh in-memory index filled in bulk (live_index.build, at start-up and on a rebuild).

`LiveIndex.append` adds one row at a time, which is what a write needs; a restart of a campaign of
100,000 messages reads about 110,000 rows, and row by row that took tens of seconds (codes,
postings, vectors and session lists, each in Python per row). `load` makes the same state column
by column: the same arrays, postings, session lists and row numbers as `append(..., link=False)`
for each row in order (tests/test_search.py checks that they are equal).

It reads the rows a batch at a time, so that the Python objects of one batch (rows, their term
counts) are all that is alive at once: read whole, a campaign's peaked near 1 GB, and the
process kept that memory after the build.
"""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping, Sequence

import numpy as np

from ..store.db import loads
from . import docs as index
from . import vec_chunks
from .columns import PostingsLoader

if TYPE_CHECKING:
    from .live_index import LiveIndex

log = logging.getLogger(__name__)

BATCH = 8192  # rows read and turned into columns at a time


def load(live: LiveIndex, batches: Iterable[Sequence[Any]], has_vector: set[int] | None,
         vectors: Callable[[], Mapping[int, np.ndarray]], passages: Callable[[], Mapping[int, np.ndarray]],
         day: Callable[[str | None], float]) -> None:
    """Fill an empty `live` with the rows of `batches` (sqlite3.Row, by id, as docs.all_rows gives
    them) that have a vector (`has_vector`; None: all), then their vectors and passage vectors
    (read by the two callables once the rows are in); `day` reads created_at as live_index does.
    Links are made after (`link_all`)."""
    if live.n:
        raise ValueError("load fills an empty index")
    terms = PostingsLoader()
    ids: list[np.ndarray] = []
    pairs: list[np.ndarray] = []  # (passage rowid, row) in the order append would keep them
    for batch in batches:
        cols = _columns(batch, has_vector)
        if cols is None:
            continue
        lo = live.n
        _fields(live, cols, day, terms)
        ids.append(np.asarray(cols["id"], dtype=np.int64))
        pairs.append(_passage_pairs(ids[-1], np.asarray(cols["passages"], dtype=np.int64), lo))
    every = np.concatenate(ids) if ids else np.zeros(0, dtype=np.int64)
    listed = every.tolist()
    live.row_terms = terms.into(live.postings)
    live.row_of.update(zip(listed, range(len(listed))))
    _vectors(live, listed, vectors())
    wanted = np.concatenate(pairs) if pairs else np.zeros((0, 2), dtype=np.int64)
    _passages(live, wanted, passages() if len(wanted) else {})
    _groups(live, every)


def _columns(batch: Sequence[Any], has_vector: set[int] | None) -> dict[str, Sequence[Any]] | None:
    """A batch's rows as columns by name, transposed in C (each row's fields read by name were
    ~1 s of a campaign's build), without the rows that have no vector (None: no row left)."""
    if not batch:
        return None
    cols: dict[str, Sequence[Any]] = dict(zip(batch[0].keys(), zip(*batch)))
    if has_vector is not None and (missing := set(cols["id"]) - has_vector):
        for doc_id in sorted(missing):  # cannot happen (same transaction); never rank a row without one
            log.error("search: doc %s has no vector; skipped", doc_id)
        keep = [i for i, doc_id in enumerate(cols["id"]) if doc_id not in missing]
        cols = {name: [column[i] for i in keep] for name, column in cols.items()}
    return cols if cols["id"] else None


def _coded(code: Callable[[Any], int], values: Sequence[Any]) -> list[int]:
    """`code` of each value, called once per distinct value in the order they first come: the
    codes appending row by row gives, without a Python call per row."""
    once = {value: code(value) for value in dict.fromkeys(values)}
    return list(map(once.__getitem__, values))


def _fields(live: LiveIndex, cols: Mapping[str, Sequence[Any]], day: Callable[[str | None], float],
            terms: PostingsLoader) -> None:
    """One batch's per-row columns and term counts."""
    lo, n = live.n, len(cols["id"])
    live._reserve(n, 0)
    a, at = live.a, slice(lo, lo + n)
    a["doc_id"][at] = cols["id"]
    a["alive"][at] = True
    a["kind"][at] = _coded(live.kinds, cols["kind"])
    a["chat"][at] = _coded(live.chats, cols["chat_id"])
    a["owner"][at] = _coded(live.owners, cols["character_id"])
    a["known"][at] = _coded(lambda raw: live.known_sets(known_set(raw)), cols["known_by"])
    a["gid"][at] = _coded(live.sessions, cols["session_key"])
    a["pos"][at] = np.array(cols["position"], dtype=np.float64)  # None: NaN
    a["day"][at] = _coded(live.days, [day(t) for t in cols["created_at"]])
    a["content_len"][at] = np.array(cols["content_len"], dtype=np.float64)
    a["cues"][at] = np.array(cols["cues"], dtype=np.float64)
    # The batch's term counts decoded in one call (each row's is a JSON object).
    a["doc_len"][at] = terms.add(lo, json.loads("[" + ",".join(cols["terms"]) + "]"))
    live.stale_cast = live.stale_cast or bool(set(cols["cast_version"]) - {live.cast_version})
    live.n = lo + n


def known_set(raw: str | None) -> frozenset[str] | None:
    """Who may know a row, from its stored known_by (None: anyone): the key of its code."""
    known = loads(raw)
    return None if known is None else frozenset(known)


def _passage_pairs(doc_ids: np.ndarray, counts: np.ndarray, lo: int) -> np.ndarray:
    """(passage rowid, row) of each passage of rows lo, lo + 1, … (of docs `doc_ids`, with
    `counts` passages each), in order."""
    rows = np.repeat(np.arange(lo, lo + len(doc_ids), dtype=np.int64), counts)
    nth = np.arange(len(rows), dtype=np.int64) - np.repeat(np.cumsum(counts) - counts, counts)
    return np.stack([np.repeat(doc_ids * index.MAX_PASSAGES, counts) + nth, rows], axis=1)


def _vectors(live: LiveIndex, ids: list[int], vecs: Mapping[int, np.ndarray]) -> None:
    """Each row's vector, written straight into the index's matrix (no float32 copy of them all)."""
    vec_chunks.copy_into(vecs, ids, live.vectors)


def _passages(live: LiveIndex, wanted: np.ndarray, pvecs: Mapping[int, np.ndarray]) -> None:
    """The passage vectors each row has, in order, and the row each belongs to."""
    pair = np.asarray(wanted, dtype=np.int64).reshape(-1, 2)
    found = pair[vec_chunks.held(pvecs, pair[:, 0].tolist())]
    live._reserve(0, len(found))
    vec_chunks.copy_into(pvecs, found[:, 0].tolist(), live.pvec)
    live.powner[:len(found)] = found[:, 1]
    live.pn = len(found)


def _groups(live: LiveIndex, ids: np.ndarray) -> None:
    """Each session's members sorted by (position, doc id), as `append` keeps them."""
    n = live.n
    gid, pos = live.a["gid"][:n], live.a["pos"][:n]
    key = np.where(np.isfinite(pos), pos, np.inf)
    for i in np.lexsort((ids, key, gid)).tolist():
        g = int(gid[i])
        if g >= 0:
            live.groups.setdefault(g, []).append((float(key[i]), int(ids[i]), i))
