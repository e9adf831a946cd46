"""Conversation structure for ranking (SW6): session groups, neighbour tables, and the ±1 / ±2
window sums and vectors computed from them. Pure numpy."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Hashable, Mapping, Sequence

import numpy as np


def group_ids(groups: Sequence[Hashable | None]) -> np.ndarray:
    """Dense integer ids for groups (-1 for None), for vectorised session terms."""
    table: dict[Hashable, int] = {}
    return np.array(
        [-1 if g is None else table.setdefault(g, len(table)) for g in groups], dtype=np.int64
    )


def neighbour_index(gids: np.ndarray, positions: np.ndarray | None = None, radius: int = 2) -> np.ndarray:
    """Row indices of each row's session neighbours: shape (n, 2*radius), -1 where there is none.

    Columns go previous-1, next-1, previous-2, next-2, …; column c and c ^ 1 are opposite
    directions. Rows of a group are ordered by `positions` (default: row order), so rows of many
    chats may interleave in the table (the store appends messages as they arrive). Rows with
    gid -1 (memories, lore, summaries) have no neighbours.
    """
    n = len(gids)
    nbr = np.full((n, 2 * radius), -1, dtype=np.int64)
    if n == 0:
        return nbr
    pos = np.arange(n) if positions is None else np.asarray(positions)
    order = np.lexsort((pos, gids))
    for d in range(1, radius + 1):
        if d >= n:
            break
        a, b = order[:-d], order[d:]
        same = (gids[a] == gids[b]) & (gids[a] >= 0)
        nbr[b[same], 2 * (d - 1)] = a[same]
        nbr[a[same], 2 * (d - 1) + 1] = b[same]
    return nbr


def columns(radius: int, weights: Sequence[float]) -> list[tuple[int, float]]:
    """(column of the neighbour table, weight) for distances 1..radius."""
    cols = []
    for d in range(1, radius + 1):
        w = weights[min(d, len(weights)) - 1] if weights else 0.0
        if w:
            cols += [(2 * (d - 1), w), (2 * (d - 1) + 1, w)]
    return cols


def neighbour_sum(
    values: np.ndarray, nbr: np.ndarray, weights: Sequence[float], radius: int | None = None
) -> np.ndarray:
    """values[i] + Σ_d weights[d-1] · (values[prev_d(i)] + values[next_d(i)]), rows or scalars."""
    return _neighbour_sums(values, nbr, weights, [len(weights) if radius is None else radius])[0]


def _neighbour_sums(values: np.ndarray, nbr: np.ndarray, weights: Sequence[float],
                    radii: Sequence[int], rows: np.ndarray | None = None) -> list[np.ndarray]:
    """`neighbour_sum` for each of the increasing `radii`, in one pass: the sum to radius 2 is
    the sum to radius 1 plus the ±2 neighbours (the same additions in the same order).
    `rows`: the sums of those rows only (in that order)."""
    own = values if rows is None else values[rows]
    table = nbr if rows is None else nbr[rows]
    out = own.astype(np.float32 if values.ndim > 1 else np.float64, copy=True)
    # A zero row after the last: "no neighbour" (-1) indexes it, so each column is one plain
    # gather and add (selecting the rows that have a neighbour first took 3x as long).
    padded = np.concatenate([values, np.zeros((1,) + values.shape[1:], dtype=values.dtype)])
    sums, done = [], 0
    for radius in radii:
        for col, w in columns(min(radius, table.shape[1] // 2), weights):
            if col >= 2 * done:  # distances up to `done` are in `out` already
                term = padded[table[:, col]]
                out += term if w == 1.0 else w * term
        done = max(done, min(radius, table.shape[1] // 2))
        sums.append(out.copy() if radius != radii[-1] else out)
    return sums


def expand_neighbours(
    counts: Sequence[Mapping[str, float]], nbr: np.ndarray, weights: Sequence[float] = (0.9, 0.5)
) -> list[Counter]:
    """Each item's term counts plus its neighbours' at `weights` by distance (the reference for
    what `bm25(..., neighbours=...)` computes at query time without storing it)."""
    out: list[Counter] = []
    cols = columns(min(len(weights), nbr.shape[1] // 2), weights)
    for i, own in enumerate(counts):
        merged: Counter = Counter(own)
        for col, w in cols:
            j = nbr[i, col]
            if j >= 0:
                for term, c in counts[j].items():
                    merged[term] += w * c
        out.append(merged)
    return out


def window_texts(texts: Sequence[str], nbr: np.ndarray, radius: int) -> list[str]:
    """For each item, its text joined with up to `radius` session neighbours on each side."""
    out = []
    for i, text in enumerate(texts):
        before, after = [], []
        for d in range(1, radius + 1):
            p, n = nbr[i, 2 * (d - 1)], nbr[i, 2 * (d - 1) + 1]
            if p >= 0:
                before.insert(0, texts[p])
            if n >= 0:
                after.append(texts[n])
        out.append(" ".join(before + [text] + after))
    return out


def window_vectors(
    vectors: np.ndarray, nbr: np.ndarray, radius: int, weights: Sequence[float] = (1.0, 0.6)
) -> np.ndarray:
    """Each row plus its session neighbours up to `radius` away (weighted), re-normalised.

    A message's "window": its vector mixed with its neighbours'. The weighted mean of stored
    vectors measured as well as embedding the joined window text on LoCoMo, and costs no
    embedding at write time and no re-embedding of earlier messages when a new one arrives.
    """
    out = neighbour_sum(vectors, nbr, weights, radius)
    norms = np.linalg.norm(out, axis=1, keepdims=True)
    return out / np.where(norms > 0, norms, 1.0)


def window_norms(
    vectors: np.ndarray, nbr: np.ndarray, radius: int, weights: Sequence[float] = (1.0, 0.6)
) -> np.ndarray:
    """Norm of each row's un-normalised window (what `window_scores` divides by)."""
    norms = np.linalg.norm(neighbour_sum(vectors, nbr, weights, radius), axis=1)
    return np.where(norms > 0, norms, 1.0)


def window_scores(
    item_scores: np.ndarray,
    nbr: np.ndarray,
    radius: int,
    norms: np.ndarray,
    weights: Sequence[float] = (1.0, 0.6),
) -> np.ndarray:
    """Cosine of the query with each window vector, from the items' own cosines.

    Because q·(Σ w v) = Σ w (q·v), the window channel needs no window matrix: the items' scores,
    summed over neighbours and divided by the precomputed window norm, equal
    `window_vectors(...) @ q` exactly, in O(n) instead of a second n×384 product.
    """
    return neighbour_sum(item_scores, nbr, weights, radius) / norms


def window_pair(item_scores: np.ndarray, nbr: np.ndarray, norms1: np.ndarray, norms2: np.ndarray,
                weights: Sequence[float] = (1.0, 0.6)) -> tuple[np.ndarray, np.ndarray]:
    """`window_scores` of radius 1 and of radius 2, equal to the two calls; the ±1 neighbours'
    scores are gathered once."""
    one, two = _neighbour_sums(item_scores, nbr, weights, [1, 2])
    return one / norms1, two / norms2


@dataclass(frozen=True)
class Runs:
    """What the group and segment maxima read of an id column that no query changes (sessions'
    ids by row, passages' owners): where each run of equal ids starts in row order, the largest
    id (-1: none) and whether the ids never decrease. Made once per state of the rows
    (`Corpus.runs`): at 100,000 messages the passes it saves took ~2 ms measured alone after an
    idle pause, a few tenths of a millisecond inside a search."""

    starts: np.ndarray
    top: int
    ordered: bool


def runs_of(ids: np.ndarray) -> Runs:
    """The `Runs` of an id column."""
    if not len(ids):
        return Runs(np.zeros(0, dtype=np.int64), -1, True)
    return Runs(np.concatenate(([0], np.flatnonzero(ids[1:] != ids[:-1]) + 1)), int(ids.max()),
                bool(np.all(ids[1:] >= ids[:-1])))


def group_max(scores: np.ndarray, gids: np.ndarray, mask: np.ndarray | None = None,
              runs: Runs | None = None) -> np.ndarray:
    """For each item, the best candidate score of its group (its own score if ungrouped).
    `runs`: `runs_of(gids)`, when the caller keeps it."""
    runs = runs_of(gids) if runs is None else runs
    if not len(gids) or runs.top < 0:
        return scores.astype(np.float64, copy=True)
    found = group_best(scores, gids, mask, runs)[gids]
    return np.where(np.isfinite(found), found, scores).astype(np.float64, copy=False)


def group_best(scores: np.ndarray, gids: np.ndarray, pool: np.ndarray | None,
               runs: Runs | None = None) -> np.ndarray:
    """The best score of each group among the rows in `pool` (None: every row), indexed by group
    id, -inf for a group with none there; one slot more, last, that stays -inf (what gid -1 reads)."""
    # One max per run of equal group ids in row order (the store appends a session's messages
    # one after another, so a session is one or a few runs), then the runs' maxima per group:
    # no copy of the candidates, and ufunc.at only over the runs (over every row it is several
    # times slower). A row outside `pool` or of no group counts as -inf.
    runs = runs_of(gids) if runs is None else runs
    best = np.full(max(runs.top, -1) + 2, -np.inf)
    if not len(gids):
        return best
    values = np.where(gids >= 0 if pool is None else pool & (gids >= 0), scores, -np.inf)
    run_best = np.maximum.reduceat(values, runs.starts)
    np.maximum.at(best, gids[runs.starts], run_best)
    return best


def window_sums(item_scores: np.ndarray, nbr: np.ndarray, weights: Sequence[float],
                rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The ±1 and ±2 window sums of `rows` only (what `window_pair` divides by the norms), the
    same additions in the same order: the rescoring of a few rows (refine.py)."""
    one, two = _neighbour_sums(item_scores, nbr, weights, [1, 2], rows)
    return one, two
