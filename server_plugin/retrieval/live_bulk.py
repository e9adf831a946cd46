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
    """Fill an empty `live` with the rows of `batches` (by id, as docs.all_rows gives them) that
    have a vector (`has_vector`; None: all), then their vectors and passage vectors (read by the
    two callables once the rows are in); `day` reads created_at as live_index does. Links are
    made after (`link_all`)."""
    if live.n:
        raise ValueError("load fills an empty index")
    terms, known = PostingsLoader(), _known_codes(live)
    wanted: list[tuple[int, int]] = []  # (passage rowid, row) in the order append would keep them
    ids: list[int] = []
    for batch in batches:
        kept = []
        for r in batch:
            if has_vector is None or int(r["id"]) in has_vector:
                kept.append(r)
            else:  # cannot happen (same transaction); never rank a row without one
                log.error("search: doc %s has no vector; skipped", r["id"])
        _fields(live, kept, day, terms, known)
        for i, r in zip(range(live.n - len(kept), live.n), kept):
            base = int(r["id"]) * index.MAX_PASSAGES
            wanted += [(base + j, i) for j in range(r["passages"])]
        ids += [int(r["id"]) for r in kept]
    live.row_terms = terms.into(live.postings)
    live.row_of.update(zip(ids, range(len(ids))))
    _vectors(live, ids, vectors())
    _passages(live, wanted, passages() if wanted else {})
    _groups(live, np.asarray(ids, dtype=np.int64))


def _known_codes(live: LiveIndex) -> Callable[[str | None], int]:
    """A row's known_by (as stored) -> its code among the index's sets: most rows of a campaign
    share a few, so each distinct text is decoded once."""
    seen: dict[str | None, int] = {}

    def code(raw: str | None) -> int:
        found = seen.get(raw)
        if found is None:
            known = loads(raw)
            found = seen[raw] = live.known_sets(None if known is None else frozenset(known))
        return found
    return code


def _fields(live: LiveIndex, kept: list[Any], day: Callable[[str | None], float], terms: PostingsLoader,
            known: Callable[[str | None], int]) -> None:
    """One batch's per-row columns and term counts."""
    lo, n = live.n, len(kept)
    live._reserve(n, 0)
    a, at = live.a, slice(lo, lo + n)
    a["doc_id"][at] = [int(r["id"]) for r in kept]
    a["alive"][at] = True
    a["kind"][at] = [live.kinds(r["kind"]) for r in kept]
    a["chat"][at] = [live.chats(r["chat_id"]) for r in kept]
    a["owner"][at] = [live.owners(r["character_id"]) for r in kept]
    a["known"][at] = [known(r["known_by"]) for r in kept]
    a["gid"][at] = [live.sessions(r["session_key"]) for r in kept]
    a["pos"][at] = [np.nan if r["position"] is None else float(r["position"]) for r in kept]
    a["day"][at] = [live.days(day(r["created_at"])) for r in kept]
    a["content_len"][at] = [float(r["content_len"]) for r in kept]
    a["cues"][at] = [float(r["cues"]) for r in kept]
    # The batch's term counts decoded in one call (each row's is a JSON object).
    a["doc_len"][at] = terms.add(lo, json.loads("[" + ",".join([r["terms"] for r in kept]) + "]"))
    live.stale_cast = live.stale_cast or any(r["cast_version"] != live.cast_version for r in kept)
    live.n = lo + n


def _vectors(live: LiveIndex, ids: list[int], vecs: Mapping[int, np.ndarray]) -> None:
    """Each row's vector, written straight into the index's matrix (no float32 copy of them all)."""
    vec_chunks.copy_into(vecs, ids, live.vectors)


def _passages(live: LiveIndex, wanted: list[tuple[int, int]], pvecs: Mapping[int, np.ndarray]) -> None:
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
