"""A fresh in-memory index filled in bulk (live_index.build, at start-up and on a rebuild).

`LiveIndex.append` adds one row at a time, which is what a write needs; a restart of a campaign of
100,000 messages reads about 115,000 rows, and row by row that took tens of seconds (codes,
postings, vectors and session lists, each in Python per row). `load` makes the same state column
by column: the same arrays, postings, session lists and row numbers as `append(..., link=False)`
for each row in order (tests/test_search.py checks that they are equal).
"""

from __future__ import annotations

import json
import logging
import sys
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from ..store.db import loads
from . import docs as index

if TYPE_CHECKING:
    from .live_index import LiveIndex

log = logging.getLogger(__name__)


def _kept(rows: Sequence[Any], vecs: dict[int, np.ndarray]) -> list[Any]:
    """The rows that have a vector (a row without one cannot happen: same transaction; it is never ranked)."""
    kept = []
    for r in rows:
        if int(r["id"]) in vecs:
            kept.append(r)
        else:
            log.error("search: doc %s has no vector; skipped", r["id"])
    return kept


def _passages(rows: list[Any], pvecs: dict[int, np.ndarray]) -> tuple[list[np.ndarray], list[int]]:
    """Each row's passage vectors in order, and the row each belongs to."""
    vectors, owners = [], []
    for i, r in enumerate(rows):
        base = int(r["id"]) * index.MAX_PASSAGES
        for j in range(r["passages"]):
            found = pvecs.get(base + j)
            if found is not None:
                vectors.append(found)
                owners.append(i)
    return vectors, owners


def load(live: LiveIndex, rows: Sequence[Any], vecs: dict[int, np.ndarray], pvecs: dict[int, np.ndarray],
         day: Any) -> None:
    """Fill an empty `live` with `rows` (by id, as docs.all_rows gives them) and their vectors;
    `day` reads a row's created_at as live_index does. Links are made after (`link_all`)."""
    if live.n:
        raise ValueError("load fills an empty index")
    kept = _kept(rows, vecs)
    n = len(kept)
    passages, owners = _passages(kept, pvecs)
    live._reserve(n, len(passages))
    a = live.a
    ids = [int(r["id"]) for r in kept]
    a["doc_id"][:n] = ids
    a["alive"][:n] = True
    a["kind"][:n] = [live.kinds(r["kind"]) for r in kept]
    a["chat"][:n] = [live.chats(r["chat_id"]) for r in kept]
    a["owner"][:n] = [live.owners(r["character_id"]) for r in kept]
    a["known"][:n] = [live.known_sets(None if (k := loads(r["known_by"])) is None else frozenset(k)) for r in kept]
    a["gid"][:n] = [live.sessions(r["session_key"]) for r in kept]
    a["pos"][:n] = [np.nan if r["position"] is None else float(r["position"]) for r in kept]
    a["day"][:n] = [day(r["created_at"]) for r in kept]
    a["content_len"][:n] = [float(r["content_len"]) for r in kept]
    a["cues"][:n] = [float(r["cues"]) for r in kept]
    counts = [json.loads(r["terms"]) for r in kept]
    a["doc_len"][:n] = [float(sum(c.values())) for c in counts]
    live.postings.load(counts)
    live.row_terms.extend(tuple(map(sys.intern, c)) for c in counts)  # one copy of each word
    if n:
        live.vectors[:n] = np.stack([vecs[d] for d in ids])
    if passages:
        live.pvec[:len(passages)] = np.stack(passages)
        live.powner[:len(passages)] = owners
    live.pn = len(passages)
    live.row_of.update(zip(ids, range(n)))
    live.stale_cast = live.stale_cast or any(r["cast_version"] != live.cast_version for r in kept)
    live.n = n
    _groups(live, np.asarray(ids, dtype=np.int64))


def _groups(live: LiveIndex, ids: np.ndarray) -> None:
    """Each session's members sorted by (position, doc id), as `append` keeps them."""
    n = live.n
    gid, pos = live.a["gid"][:n], live.a["pos"][:n]
    key = np.where(np.isfinite(pos), pos, np.inf)
    for i in np.lexsort((ids, key, gid)).tolist():
        g = int(gid[i])
        if g >= 0:
            live.groups.setdefault(g, []).append((float(key[i]), int(ids[i]), i))
