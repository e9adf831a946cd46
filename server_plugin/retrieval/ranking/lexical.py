"""BM25 (SW6) over an in-memory term index, with neighbour context: a row's counts and length
are its own plus its session neighbours', added at query time. And `remembered`, what ranking
keeps between queries over the same rows and candidates. Pure numpy."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from . import kernels
from .windows import columns, neighbour_sum


@dataclass
class TermIndex:
    """Postings of the items' own term counts: term -> (row indices, term frequencies).

    Only each item's own counts are stored; `bm25` adds the neighbours' counts at query time
    through the neighbour table, so that a new message changes no earlier row. Document
    frequencies come from the own counts (context does not dilute a term's rarity).
    """

    postings: dict[str, tuple[np.ndarray, np.ndarray]]
    doc_len: np.ndarray
    n_docs: int
    # term -> (neighbour columns, rows, counts with the neighbours' added): filled by `bm25`;
    # its owner drops a term when a row holding it gets new neighbours (search.LiveIndex).
    spread_cache: dict[str, tuple[Any, np.ndarray, np.ndarray]] | None = None

    @classmethod
    def build(cls, counts: Sequence[Mapping[str, float]]) -> "TermIndex":
        """Index `counts`, one mapping of term -> count per row."""
        lists: dict[str, tuple[list[int], list[float]]] = {}
        for i, c in enumerate(counts):
            for term, tf in c.items():
                ix, tfs = lists.setdefault(term, ([], []))
                ix.append(i)
                tfs.append(float(tf))
        postings = {
            t: (np.asarray(ix, dtype=np.int64), np.asarray(tf, dtype=np.float64))
            for t, (ix, tf) in lists.items()
        }
        doc_len = np.array([float(sum(c.values())) for c in counts], dtype=np.float64)
        return cls(postings, doc_len, len(counts))


def idf(doc_freq: float, n_docs: float) -> float:
    """Okapi BM25 idf with the +1 that keeps it positive (Lucene's form)."""
    return float(np.log(1.0 + (n_docs - doc_freq + 0.5) / (doc_freq + 0.5)))


def bm25(
    index: TermIndex,
    query: Mapping[str, float],
    *,
    k1: float = 1.2,
    b: float = 0.75,
    bigram_weight: float = 1.0,
    mask: np.ndarray | None = None,
    neighbours: np.ndarray | None = None,
    neighbour_weights: Sequence[float] = (),
    memo: dict[Any, Any] | None = None,
    compiled: bool = False,
) -> np.ndarray:
    """Okapi BM25 score of every row for the query term counts `query`.

    With `neighbours` (see `neighbour_index`), a row's term frequencies and length are its own
    plus its session neighbours' at `neighbour_weights` ("neighbour context"). With `mask`, the
    collection statistics (row count, mean length, document frequencies) are those of the
    candidates alone: a row the viewer may not see changes no score. `memo`: see `remembered`.
    `compiled`: the neighbour context summed by numba's loop (kernels.bm25) where numba is there,
    not spread with numpy per term (the same scores within rounding); either way each term's
    spread is kept in the index's spread cache, and a term found there is scored from it.
    """
    n = index.n_docs
    scores = np.zeros(n, dtype=np.float64)
    if n == 0:
        return scores
    cols = []
    if neighbours is not None and neighbour_weights:
        cols = columns(min(len(neighbour_weights), neighbours.shape[1] // 2), neighbour_weights)

    def collection() -> tuple[float, np.ndarray]:
        dl = index.doc_len if not cols else neighbour_sum(index.doc_len, neighbours, neighbour_weights)
        if mask is None:
            n_docs, avgdl = float(n), float(dl.mean())
        else:
            n_docs = float(mask.sum())
            avgdl = float(dl[mask].mean()) if n_docs else 1.0
        return n_docs, k1 * (1.0 - b + b * dl / (avgdl or 1.0))

    # The same for every query over these rows and candidates: kept in `memo` (see Corpus.memo).
    n_docs, norm = remembered(memo, ("bm25", k1, b, tuple(w for _, w in cols), n), mask, collection)
    held = []
    for term, qtf in query.items():
        post = index.postings.get(term)
        if post is None:
            continue
        ix, tf = post
        df = len(ix) if mask is None else int(mask[ix].sum())
        held.append((term, ix, tf, qtf * idf(df, n_docs) * (bigram_weight if "_" in term else 1.0)))
    if compiled and cols:
        found = _compiled(index, held, neighbours, cols, norm, k1)  # type: ignore[arg-type]
        if found is not None:
            return found
    for term, ix, tf, weight in held:
        if cols:
            ix, tf = _spread_cached(index, term, ix, tf, neighbours, cols)  # type: ignore[arg-type]
        scores[ix] += weight * tf * (k1 + 1.0) / (tf + norm[ix])
    return scores


def spread(ix: np.ndarray, tf: np.ndarray, neighbours: np.ndarray,
           cols: Sequence[tuple[int, float]], n: int) -> tuple[np.ndarray, np.ndarray]:
    """A term's rows and counts with each holder's count added to its neighbours at their weight."""
    # Scatter each holder's count to the rows that have it as a neighbour: the row whose
    # previous-d is j is j's next-d (column c ^ 1), so each column is a plain gather.
    parts, counts = [ix], [tf]
    for col, w in cols:
        recv = neighbours[ix, col ^ 1]
        ok = recv >= 0
        parts.append(recv[ok])
        counts.append(w * tf[ok])
    every = np.concatenate(parts)
    if len(every) * SPARSE_SPREAD < n:
        # A rare term: sum its few rows by sorting them, not in an array of every row (whose
        # zeroing and scan cost ~0.3 ms at 100,000 messages whatever the term). bincount adds
        # in the order given, as the loop below does: the same sums.
        rows, at = np.unique(every, return_inverse=True)
        return rows, np.bincount(at, weights=np.concatenate(counts), minlength=len(rows))
    acc = np.zeros(n, dtype=np.float64)
    acc[ix] = tf
    for part, count in zip(parts[1:], counts[1:]):
        acc[part] += count
    rows = np.flatnonzero(acc)
    return rows, acc[rows]


SPARSE_SPREAD = 16  # a term whose spread rows are under 1/16 of all rows is summed sparsely


def _compiled(index: TermIndex, held: list[tuple[str, np.ndarray, np.ndarray, float]],
              neighbours: np.ndarray, cols: list[tuple[int, float]], norm: np.ndarray,
              k1: float) -> np.ndarray | None:
    """BM25 by numba's loops (kernels.spreads, kernels.bm25): each term scored from its spread,
    the spread cache's where it has one, else summed by the loop and then kept. None without
    the compiled loops."""
    near = np.zeros(neighbours.shape[1])
    for col, w in cols:
        near[col ^ 1] = w  # the row whose neighbour col is j receives j's count at w (see spread)
    found = [_cached_spread(index, term, cols) for term, *_ in held]
    missing = [i for i, f in enumerate(found) if f is None]
    made = kernels.spreads([held[i][1:3] for i in missing], neighbours, near, index.n_docs)
    if made is None:
        return None
    for i, (rows, counts) in zip(missing, made):
        found[i] = (rows, counts)
        _keep_spread(index, held[i][0], cols, rows, counts)
    terms = [(*f, h[3]) for f, h in zip(found, held)]  # type: ignore[misc]
    return kernels.bm25(terms, norm, k1, index.n_docs)


def _cached_spread(index: TermIndex, term: str,
                   cols: list[tuple[int, float]]) -> tuple[np.ndarray, np.ndarray] | None:
    """The term's spread as the index's cache keeps it for these neighbour columns, or None."""
    found = None if index.spread_cache is None else index.spread_cache.get(term)
    return (found[1], found[2]) if found is not None and found[0] == tuple(cols) else None


def _keep_spread(index: TermIndex, term: str, cols: list[tuple[int, float]], rows: np.ndarray,
                 counts: np.ndarray) -> None:
    """Keep a term's spread in the index's cache (none: nothing kept), within its bounds."""
    cache = index.spread_cache
    if cache is None:
        return
    if len(cache) >= SPREAD_CACHE_TERMS or getattr(cache, "nbytes", 0) > SPREAD_CACHE_BYTES:
        cache.clear()  # a bound, not an LRU: refilling costs one query's worth of spreading
    cache[term] = (tuple(cols), rows, counts)
    if isinstance(cache, SpreadCache):
        cache.nbytes += rows.nbytes + counts.nbytes


def _spread_cached(index: TermIndex, term: str, ix: np.ndarray, tf: np.ndarray,
                   neighbours: np.ndarray, cols: list[tuple[int, float]]) -> tuple[np.ndarray, np.ndarray]:
    """`spread`, kept per term in the index's cache: common words of a long action have
    thousands of rows, and spreading them is most of a query's BM25 time."""
    found = _cached_spread(index, term, cols)
    if found is None:
        found = spread(ix, tf, neighbours, cols, index.n_docs)
        _keep_spread(index, term, cols, *found)
    return found


SPREAD_CACHE_TERMS = 20_000
# A common word of a campaign of 100,000 messages is spread to tens of thousands of rows (about
# 1 MB); a bound by terms alone let a day of queries hold hundreds of MB.
SPREAD_CACHE_BYTES = 64 * 2 ** 20


class SpreadCache(dict):
    """`TermIndex.spread_cache` that knows how many bytes it holds (added since it was last
    cleared: a term dropped meanwhile still counts, so it is cleared a little early)."""

    nbytes = 0

    def clear(self) -> None:
        super().clear()
        self.nbytes = 0


MEMO_ENTRIES = 16  # per index: about 1 MB each at 100,000 messages, one or two per viewer's mask


def remembered(memo: dict[Any, Any] | None, key: tuple[Any, ...], mask: np.ndarray | None,
               make: Callable[[], Any]) -> Any:
    """`make()`, kept in `memo` under `key` and the candidates `mask`: for what depends on the
    rows and the candidates but not on the query (BM25's length normalisation, the length
    prior). The memo's owner empties it whenever a row changes (live_index.LiveIndex); None
    keeps nothing. The mask is part of the key by value (its bits: 14 KB at 108,000 rows)."""
    if memo is None:
        return make()
    full = key + (None if mask is None else np.packbits(mask).tobytes(),)
    found = memo.get(full)
    if found is None:
        if len(memo) >= MEMO_ENTRIES:
            memo.clear()  # a bound, not an LRU: refilling costs one query's worth
        found = memo[full] = make()
    return found
