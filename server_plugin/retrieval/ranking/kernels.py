"""The first pass of the two-pass dense scan (SW6, refine.py) as compiled loops over the rows,
with numba (setting `search_compiled_first_pass`), and two more loops a campaign's search reads
every row for: BM25's neighbour context (`bm25`) and the pick of the best rows (`k_best`).

At campaign size, once the int4 scan is done, what a search spent was numpy's passes over every
row: the windows (four gathers), the best passage, each channel's mean and spread, the weighted
sum, the sessions' maxima and their spread, the mask. Some thirty passes over 100,000-row arrays,
each a trip to memory after an idle pause: about 7 ms of a search at 100,000 messages, 2 here
(`bench/README.md`, `scan_cost.py --first-pass`). Three loops:

1. `_channels`: each row's ±1 / ±2 window sums over its neighbours' first-pass cosines, divided
   by the window norms; its best passage (or its own cosine); the sums and sums of squares of the
   four channels over the candidates (in float64, as `fusion.mean_sd`).
2. `_fused`: the weighted z-scores summed with what `rank` computed from the words (BM25 and the
   priors), and each session's best fused score among its candidates.
3. `_with_session`: the session prior's mean and spread over the candidates, the prior added,
   -inf outside the candidates.

BM25's neighbour context is two loops: `_spreads` sums each term's counts over its holders and
their neighbours (what lexical's spread cache keeps), `_bm25_spread` scores a term from its
spread, kept or just made.

Where the first pass reads an int8 copy (a CPU without AVX-512), its scan is a loop too
(`int8_rows`, over a range of rows, so that vectors.coarse_dots can give half to a second thread):
about half the time of torch's int8 kernel over the same rows there.

The arithmetic is that of `score.dense_channels`, `fusion.fuse` and `rank`'s session prior (the
channels kept in float32, the sums in float64; numpy weighs a window's neighbours in float32):
tests/test_kernels.py holds the two to every score within 1e-6 and the same top 20. Without
numba (or where a loop cannot be compiled, or with the setting off) ranking takes numpy's passes:
the same answers, slower.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Callable, Mapping

import numpy as np

from ... import priority
from . import bfloat16 as bf16

if TYPE_CHECKING:  # pragma: no cover
    from .score import Corpus, RankingParams

log = logging.getLogger(__name__)

DENSE = ("dense", "dense_win1", "dense_win2", "dense_sent")  # the rows of `_channels`' output


def _channels(base: np.ndarray, nbr: np.ndarray, norm1: np.ndarray, norm2: np.ndarray,
              w1: float, w2: float, sims: np.ndarray, owner: np.ndarray, mask: np.ndarray,
              out: np.ndarray, sums: np.ndarray, squares: np.ndarray) -> None:  # pragma: no cover
    """`out` (4, n): each row's own cosine, ±1 and ±2 window cosines and best passage (or own)
    cosine; `sums` / `squares` of each over the rows in `mask`. (Compiled: no coverage.)"""
    n = base.shape[0]
    for i in range(n):
        out[3, i] = base[i]
    for j in range(sims.shape[0]):  # the passages: each item's best, never below its own
        if sims[j] > out[3, owner[j]]:
            out[3, owner[j]] = sims[j]
    for c in range(4):
        sums[c] = 0.0
        squares[c] = 0.0
    for i in range(n):
        own = np.float64(base[i])
        near = 0.0
        for c in range(2):
            at = nbr[i, c]
            if at >= 0:
                near += base[at]
        one = own + w1 * near
        far = 0.0
        for c in range(2, 4):
            at = nbr[i, c]
            if at >= 0:
                far += base[at]
        two = one + w2 * far
        one /= norm1[i]
        two /= norm2[i]
        out[0, i] = own
        out[1, i] = one
        out[2, i] = two
        if mask[i]:
            sums[0] += own
            squares[0] += own * own
            sums[1] += one
            squares[1] += one * one
            sums[2] += two
            squares[2] += two * two
            sent = np.float64(out[3, i])
            sums[3] += sent
            squares[3] += sent * sent


def _fused(channels: np.ndarray, coef: np.ndarray, words: np.ndarray, offset: float,
           gids: np.ndarray, mask: np.ndarray, fused: np.ndarray,
           best: np.ndarray) -> None:  # pragma: no cover
    """`fused`: Σ coef·channel + `words` + `offset` per row; `best`: each session's best fused
    score among the candidates (-inf for a session with none; one slot more, for gid -1)."""
    for g in range(best.shape[0]):
        best[g] = -np.inf
    for i in range(fused.shape[0]):
        f = words[i] + offset
        for c in range(channels.shape[0]):
            f += coef[c] * channels[c, i]
        fused[i] = f
        g = gids[i]
        if g >= 0 and mask[i] and f > best[g]:
            best[g] = f


def _with_session(fused: np.ndarray, gids: np.ndarray, best: np.ndarray, mask: np.ndarray,
                  weight: float, out: np.ndarray) -> tuple[float, float]:  # pragma: no cover
    """`out`: `fused` plus `weight` times the z-score of the row's session's best (its own score
    where it has no session), -inf outside `mask`. Returns the (mean, spread) of the sessions'
    best over the candidates; a spread under 1e-12 adds no prior (as `rank`)."""
    total, squares, count = 0.0, 0.0, 0
    for i in range(fused.shape[0]):
        if mask[i]:
            g = gids[i]
            b = best[g] if g >= 0 else fused[i]
            total += b
            squares += b * b
            count += 1
    mean = total / max(count, 1)
    sd = np.sqrt(max(squares / max(count, 1) - mean * mean, 0.0))
    for i in range(fused.shape[0]):
        if not mask[i]:
            out[i] = -np.inf
        elif sd < 1e-12:
            out[i] = fused[i]
        else:
            g = gids[i]
            b = best[g] if g >= 0 else fused[i]
            out[i] = fused[i] + weight * ((b - mean) / sd)
    return mean, sd


def _best_outside(fused: np.ndarray, gids: np.ndarray, mask: np.ndarray, taken: np.ndarray,
                  best: np.ndarray) -> None:  # pragma: no cover
    """`best`: each session's best `fused` among the candidates in `mask` and not `taken`
    (refine.rescored's rows), -inf for none."""
    for g in range(best.shape[0]):
        best[g] = -np.inf
    for i in range(fused.shape[0]):
        g = gids[i]
        if g >= 0 and mask[i] and not taken[i] and fused[i] > best[g]:
            best[g] = fused[i]


def _spreads(rows: np.ndarray, counts: np.ndarray, starts: np.ndarray, nbr: np.ndarray,
             near: np.ndarray, acc: np.ndarray, touched: np.ndarray, out_rows: np.ndarray,
             out_tf: np.ndarray, out_starts: np.ndarray) -> None:  # pragma: no cover
    """Each term's spread (lexical.spread): the rows that hold it or neighbour a holder, each
    with its own count plus its neighbours' at `near` (the weight of each neighbour column).
    Term t's holders are rows[starts[t]:starts[t + 1]]; its spread is left in
    out_rows / out_tf[out_starts[t]:out_starts[t + 1]]. `acc` (zeros, left zeros) and `touched`
    (room for five rows a holder) are scratch: no array of every row per term."""
    at = 0
    for t in range(starts.shape[0] - 1):
        seen = 0
        for p in range(starts[t], starts[t + 1]):
            j = rows[p]
            if acc[j] == 0.0:
                touched[seen] = j
                seen += 1
            acc[j] += counts[p]
            for c in range(nbr.shape[1]):
                r = nbr[j, c]
                if r >= 0 and near[c] != 0.0:
                    if acc[r] == 0.0:
                        touched[seen] = r
                        seen += 1
                    acc[r] += near[c] * counts[p]
        out_starts[t] = at
        for q in range(seen):
            r = touched[q]
            out_rows[at] = r
            out_tf[at] = acc[r]
            at += 1
            acc[r] = 0.0
    out_starts[starts.shape[0] - 1] = at


def _bm25_spread(rows: np.ndarray, counts: np.ndarray, weight: float, norm: np.ndarray, k1: float,
                 scores: np.ndarray) -> None:  # pragma: no cover
    """`scores` += one term's BM25 from its spread: rows[i] holds or neighbours it with count
    counts[i]; `weight` is the term's query count times idf, `norm` k1·(1 - b + b·length / mean
    length) per row."""
    for i in range(rows.shape[0]):
        r = rows[i]
        tf = counts[i]
        scores[r] += weight * tf * (k1 + 1.0) / (tf + norm[r])


def _int8_rows(rows: np.ndarray, bits: np.ndarray, table: np.ndarray, vector: np.ndarray, lo: int,
               hi: int, out: np.ndarray) -> None:  # pragma: no cover
    """out[lo:hi]: rows lo..hi of an int8 copy times the float32 `vector`, each times its row's
    scale (`bits`: its bfloat16 bits as uint16; `table`: the float32 value of each of them)."""
    for i in range(lo, hi):
        acc = np.float32(0.0)
        for k in range(rows.shape[1]):
            acc += np.float32(rows[i, k]) * vector[k]
        out[i] = acc * table[bits[i]]


def _at_least(scores: np.ndarray, threshold: float, out: np.ndarray) -> int:  # pragma: no cover
    """The rows whose score is at least `threshold`, into `out` while it has room; how many."""
    found = 0
    for i in range(scores.shape[0]):
        if scores[i] >= threshold:
            if found < out.shape[0]:
                out[found] = i
            found += 1
    return found


_COMPILED: dict[str, Callable[..., Any]] | None = None
_LOCK = priority.Lock()  # one compilation, whichever search or warm-up comes first
_FAILED = False


def compiled() -> dict[str, Callable[..., Any]] | None:
    """The loops compiled by numba (cached on disk: a later start loads them in a fraction of a
    second), or None where numba is missing or cannot compile them (numpy's passes instead)."""
    global _COMPILED, _FAILED
    if _COMPILED is not None or _FAILED:
        return _COMPILED
    with _LOCK:
        if _COMPILED is None and not _FAILED:
            try:
                import numba

                jit = numba.njit(cache=True, nogil=True)
                made = {f.__name__: jit(f) for f in (_channels, _fused, _with_session, _best_outside,
                                                     _spreads, _bm25_spread, _at_least)}
                # Reassociated: the sum of a row's products in vector lanes (a first pass's
                # scores; the order of the additions moves them by ~1e-7, the copy by ~1e-3).
                made["_int8_rows"] = numba.njit(cache=True, nogil=True, fastmath=True)(_int8_rows)
                _warm(made)
                _COMPILED = made
            except Exception:  # no numba, no cache directory, an unsupported platform
                log.warning("search: the first pass's compiled loops are unavailable; numpy's passes instead",
                            exc_info=True)
                _FAILED = True
    return _COMPILED


def _warm(made: Mapping[str, Callable[..., Any]]) -> None:
    """Compile (or load) each loop for the types a search passes it, on a few rows."""
    n, f32, f64, i64 = 3, np.float32, np.float64, np.int64
    mask = np.ones(n, dtype=bool)
    nbr = np.full((n + 1, 4), -1, dtype=i64, order="F")[:n]  # the index's: rows of a larger table
    gids = np.zeros(n, dtype=i64)
    out, sums, squares = np.zeros((4, n), f32), np.zeros(4, f64), np.zeros(4, f64)
    made["_channels"](np.ones(n, f32), nbr, np.ones(n, f64), np.ones(n, f64), 1.0, 0.5,
                      np.ones(1, f32), np.zeros(1, i64), mask, out, sums, squares)
    fused, best = np.zeros(n, f64), np.zeros(2, f64)
    made["_fused"](out, np.ones(4, f64), np.zeros(n, f64), 0.0, gids, mask, fused, best)
    made["_with_session"](fused, gids, best, mask, 0.1, np.zeros(n, f64))
    made["_best_outside"](fused, gids, mask, mask, best)
    made["_at_least"](fused, 0.0, np.zeros(n, i64))
    made["_int8_rows"](np.ones((n, 16), np.int8), np.zeros(n, np.uint16), bf16.table(), np.ones(16, f32),
                       0, n, np.zeros(n, f32))
    made["_spreads"](np.zeros(1, i64), np.ones(1, f64), np.array([0, 1]), nbr, np.ones(4, f64),
                     np.zeros(n, f64), np.zeros(5, i64), np.zeros(5, i64), np.zeros(5, f64), np.zeros(2, i64))
    made["_bm25_spread"](np.zeros(1, i64), np.ones(1, f64), 1.0, np.ones(n, f64), 1.2, np.zeros(n, f64))


def fits(corpus: "Corpus", params: "RankingParams") -> bool:
    """Whether the loops compute this corpus's first pass: the int4 / int8 copies of items and
    passages, the neighbour table and window norms (no embedded window texts)."""
    return bool(params.compiled and corpus.coarse is not None and corpus.coarse_sent is not None
                and corpus.neighbours is not None and corpus.win1_norm is not None
                and corpus.win2_norm is not None and corpus.win_vectors is None
                and corpus.sent_owner is not None and len(params.window_weights) >= 2)


def first_pass(corpus: "Corpus", base: np.ndarray, sims: np.ndarray, params: "RankingParams",
               candidates: np.ndarray, count: int, words: np.ndarray,
               word_stats: Mapping[str, tuple[float, float]]
               ) -> tuple[np.ndarray, dict[str, np.ndarray], dict[str, tuple[float, float]], np.ndarray,
                          tuple[float, float] | None] | None:
    """`rank`'s first pass from the first-pass cosines of the items (`base`) and passages
    (`sims`) and what `rank` fused of the words (`words`: their weighted z-scores with their
    offset, plus the priors; `word_stats`: their (mean, spread)), over the `count` (at least one)
    rows in `candidates`. Returns the scores (-inf outside the candidates), the dense channels as
    `dense_channels` names them, every channel's (mean, spread), the fused scores before the
    session prior and that prior's (mean, spread) (None: none): what refine.Pass holds. None
    where the loops are unavailable (`compiled`)."""
    loops = compiled()
    if loops is None:
        return None
    n = len(corpus)
    channels = np.empty((4, n), dtype=np.float32)
    sums, squares = np.zeros(4), np.zeros(4)
    w1, w2 = params.window_weights[0], params.window_weights[1]
    loops["_channels"](base, corpus.neighbours, corpus.win1_norm, corpus.win2_norm, float(w1),
                       float(w2), sims, corpus.sent_owner, candidates, channels, sums, squares)
    weights = params.channel_weights()
    means = sums / count
    spreads = np.sqrt(np.maximum(squares / count - means * means, 0.0))
    stats = dict(word_stats)
    coef = np.zeros(4)
    offset = 0.0
    for c, name in enumerate(DENSE):
        w = weights[name]
        if w and spreads[c] >= 1e-12:  # as `fuse`: weight-0 and flat channels are left out
            coef[c] = w / spreads[c]
            offset -= w * means[c] / spreads[c]
            stats[name] = (float(means[c]), float(spreads[c]))
    fused = np.empty(n)
    best = np.empty(corpus.runs("gids").top + 2)
    loops["_fused"](channels, coef, words, offset, corpus.gids, candidates, fused, best)
    session = None
    if params.w_session:
        score = np.empty(n)
        mean, sd = loops["_with_session"](fused, corpus.gids, best, candidates, float(params.w_session),
                                          score)
        session = (mean, sd) if sd >= 1e-12 else None
    else:
        score = np.where(candidates, fused, -np.inf)
    kept = {name: channels[c] for c, name in enumerate(DENSE) if c == 0 or weights[name]}
    return score, kept, stats, fused, session


def best_outside(fused: np.ndarray, gids: np.ndarray, mask: np.ndarray | None, rows: np.ndarray,
                 groups: int) -> np.ndarray | None:
    """Each session's best `fused` score among the candidates outside `rows`, indexed by group
    id (one slot more, last, -inf: what gid -1 reads); None without the compiled loops."""
    loops = compiled()
    if loops is None:
        return None
    pool = np.ones(len(fused), dtype=bool) if mask is None else mask
    taken = np.zeros(len(fused), dtype=bool)
    taken[rows] = True
    best = np.empty(groups + 2)
    loops["_best_outside"](fused, gids, pool, taken, best)
    return best


def spreads(postings: list[tuple[np.ndarray, np.ndarray]], nbr: np.ndarray, near: np.ndarray,
            n: int) -> list[tuple[np.ndarray, np.ndarray]] | None:
    """Each term's spread (rows, counts: lexical.spread's, the rows in another order) from its
    holders and their counts; None without the compiled loops."""
    loops = compiled()
    if loops is None:
        return None
    if not postings:
        return []
    sizes = [len(rows) for rows, _ in postings]
    starts = np.concatenate(([0], np.cumsum(sizes))).astype(np.int64)
    rows = np.concatenate([r for r, _ in postings]).astype(np.int64, copy=False)
    counts = np.concatenate([c for _, c in postings]).astype(np.float64, copy=False)
    room = (1 + nbr.shape[1]) * len(rows)  # a holder reaches itself and its neighbours at most
    touched = np.empty((1 + nbr.shape[1]) * max(sizes), dtype=np.int64)
    out_rows, out_tf = np.empty(room, np.int64), np.empty(room)
    out_starts = np.empty(len(postings) + 1, np.int64)
    loops["_spreads"](rows, counts, starts, nbr, near, np.zeros(n), touched, out_rows, out_tf, out_starts)
    ends = zip(out_starts[:-1], out_starts[1:])
    return [(out_rows[a:b].copy(), out_tf[a:b].copy()) for a, b in ends]


def bm25(terms: list[tuple[np.ndarray, np.ndarray, float]], norm: np.ndarray, k1: float,
         n: int) -> np.ndarray | None:
    """BM25 of every row from each term's spread (rows, counts) and weight, in their order; None
    without the compiled loops."""
    loops = compiled()
    if loops is None:
        return None
    scores = np.zeros(n)
    for rows, counts, weight in terms:
        loops["_bm25_spread"](rows, counts, float(weight), norm, float(k1), scores)
    return scores


def int8_rows(rows: np.ndarray, bits: np.ndarray, vector: np.ndarray, lo: int, hi: int,
              out: np.ndarray) -> bool:
    """out[lo:hi] = rows lo..hi of an int8 copy (`vectors.Int8Rows`: int8 rows, bfloat16 scale
    bits) times the float32 `vector`, each times its row's scale: `vectors.int8_dot`'s scores,
    from the query as it is rather than as two bfloat16 rows. False (nothing written) without
    the compiled loops."""
    loops = compiled()
    if loops is None:
        return False
    loops["_int8_rows"](rows, bits.view(np.uint16), bf16.table(), vector, lo, hi, out)
    return True


SAMPLE = 2048  # scores whose order sets `k_best`'s threshold


def k_best(scores: np.ndarray, k: int) -> np.ndarray | None:
    """Indices of the `k` best scores in no order, as vectors.k_best gives them, from one pass
    over the scores instead of a selection: a threshold that about 2k of them pass (from SAMPLE
    evenly spaced ones, with room to spare), those rows, the best k of them. None (vectors.k_best
    then) without the loops, for fewer than 8·SAMPLE scores, or where fewer than k pass (a
    sample that misled: never for a sample of this size in practice) or too many do (ties)."""
    n = len(scores)
    loops = compiled()
    if loops is None or k < 1 or n < 8 * SAMPLE or scores.dtype != np.float64:
        return None
    sample = scores[:: n // SAMPLE]
    # About k·len/n of the sample score above the k-th best row: the threshold is the sample's
    # score at twice that place, and 8 more; about that share of every row passes it.
    place = int(np.ceil(2 * k * len(sample) / n)) + 8
    if place >= len(sample):
        return None
    threshold = float(np.partition(sample, len(sample) - 1 - place)[len(sample) - 1 - place])
    if not np.isfinite(threshold):
        return None
    rows = np.empty(4 * (place + 1) * (n // len(sample) + 1), dtype=np.int64)  # four times that
    found = loops["_at_least"](scores, threshold, rows)
    if found < k or found > len(rows):
        return None
    rows = rows[:found]
    return rows[np.argpartition(-scores[rows], k - 1)[:k]]
