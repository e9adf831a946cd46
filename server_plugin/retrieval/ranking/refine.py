"""The exact second pass of a two-pass dense scan (SW6): the best rows of a first pass over the
index's int8 copy, rescored from the float vectors.

At campaign size the dense scan is most of a search (bench/README.md, `scan_cost.py`): every
item's and every passage's cosine with the query. The int8 copy (vectors.Int8Rows) computes them
at about a third of the cost, each off by up to ~3e-3. `rank` fuses those approximate channels as
usual, then `rescored` takes its `refine_rows` best rows and scores them again from exact
cosines: the item's own, its ±1 / ±2 neighbours' (its windows) and its passages'. The channels'
means and spreads over all candidates stay the first pass's: rounding errors of ±3e-3 that are
as often up as down move a mean over thousands of rows by about 1e-5 and a spread by less.

The session prior adds the z-score of the best fused score of a row's session. The first
pass's best row of any session with a row among the rescored ones is rescored too (it scores at
least as high, and the session term is the same for both); another row of the session that the
exact scores put first may not be, so it counts with its first-pass score.

What this changes is measured against float32 beside the float16 index's own rounding:
`python bench/scan_cost.py --quality` (LoCoMo) and `--store … --quality` (a campaign).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Mapping

import numpy as np

from .vectors import dot, k_best
from .windows import group_best, group_max, window_sums

if TYPE_CHECKING:  # pragma: no cover
    from .score import Corpus, RankingParams

@dataclass(frozen=True)
class Pass:
    """What the first pass computed that the second reuses: every channel over every row, the
    (mean, spread) fusion took of each channel it summed, the priors, the fused scores before
    the session prior, and that prior's (mean, spread) (None: no session prior)."""

    channels: Mapping[str, np.ndarray]
    stats: Mapping[str, tuple[float, float]]
    priors: np.ndarray | None
    fused: np.ndarray  # channels and priors, before the session prior
    session: tuple[float, float] | None


def rescored(corpus: "Corpus", vector: np.ndarray, params: "RankingParams", score: np.ndarray,
             first: Pass) -> np.ndarray:
    """`score` (the first pass's fused scores, -inf outside the candidates) with its
    `params.refine_rows` best rows scored again from exact cosines."""
    rows = _best(score, params.refine_rows)
    if not len(rows):
        return score
    exact = _exact_channels(corpus, vector, params, first.channels, rows)
    fused = np.zeros(len(rows), dtype=np.float64)
    offset = 0.0
    weights = params.channel_weights()
    for name, (mean, sd) in first.stats.items():
        values = exact[name] if name in exact else first.channels[name][rows]
        fused += values * (weights[name] / sd)
        offset -= weights[name] * mean / sd
    fused += offset
    if first.priors is not None:
        fused += first.priors[rows]
    if first.session is not None:
        mean, sd = first.session
        gids = corpus.gids[rows]
        # A session's best row not rescored (rare: its first-pass score was below the rescored
        # rows', its exact one is not) still counts, with its first-pass score.
        outside = np.isfinite(score)
        outside[rows] = False
        best = np.maximum(group_max(fused, gids), group_best(first.fused, corpus.gids, outside)[gids])
        fused += params.w_session * ((best - mean) / sd)
    out = score.copy()
    out[rows] = fused
    return out


def _best(score: np.ndarray, k: int) -> np.ndarray:
    """The rows of the `k` best finite scores, in no order."""
    rows = k_best(score, k) if len(score) > k else np.arange(len(score))
    return rows[np.isfinite(score[rows])]


def _exact_channels(corpus: "Corpus", vector: np.ndarray, params: "RankingParams",
                    channels: Mapping[str, np.ndarray], rows: np.ndarray) -> dict[str, np.ndarray]:
    """The dense channels at `rows`, from exact cosines of the rows and of their neighbours."""
    nbr = corpus.neighbours
    needed = np.zeros(len(corpus) + 1, dtype=bool)  # the last: "no neighbour" (-1)
    needed[rows] = True
    if nbr is not None:
        needed[nbr[rows].ravel()] = True
    needed = np.flatnonzero(needed[:-1])
    base = channels["dense"].copy()  # the neighbours of a row outside `needed` are never read
    base[needed] = dot(corpus.vectors[needed], vector)
    out = {"dense": base[rows]}
    if nbr is not None and ("dense_win1" in channels or "dense_win2" in channels):
        one, two = window_sums(base, nbr, params.window_weights, rows)
        if "dense_win1" in channels:
            out["dense_win1"] = one / corpus.win1_norm[rows]  # type: ignore[index]
        if "dense_win2" in channels:
            out["dense_win2"] = two / corpus.win2_norm[rows]  # type: ignore[index]
    if "dense_sent" in channels:
        out["dense_sent"] = np.maximum(out["dense"], _best_passages(corpus, vector, rows))
    return out


def _best_passages(corpus: "Corpus", vector: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Each row's best passage cosine (exact), -inf for a row without passages."""
    best = np.full(len(rows), -np.inf)
    owner = corpus.sent_owner
    if owner is None or corpus.sent_vectors is None or not len(owner):
        return best
    if len(owner) > 1 and np.all(owner[1:] >= owner[:-1]):
        # The store appends an item's passages together: each row's are one range.
        lo, hi = np.searchsorted(owner, rows, "left"), np.searchsorted(owner, rows, "right")
        counts = hi - lo
        mine = np.repeat(lo - np.cumsum(counts) + counts, counts) + np.arange(counts.sum())
        at = np.repeat(np.arange(len(rows)), counts)
    else:
        order = np.argsort(rows)
        mine = np.flatnonzero(np.isin(owner, rows))
        at = order[np.searchsorted(rows[order], owner[mine])]
    if len(mine):
        np.maximum.at(best, at, dot(corpus.sent_vectors[mine], vector))
    return best
