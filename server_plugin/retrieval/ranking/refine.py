"""The exact second pass of a two-pass dense scan (SW6): the best rows of a first pass over the
index's int4 (or int8) copy, rescored from the float vectors.

At campaign size the dense scan is most of a search (bench/README.md, `scan_cost.py`): every
item's and every passage's cosine with the query. The int4 copy (vectors.Int4Rows,
`search_first_pass`) computes them at under 30 % of the float16 scan's cost after an idle
pause, each off by about 5e-3; the int8 copy (vectors.Int8Rows) at about 40 %, off by about
5e-4. `rank` fuses those approximate channels as usual, then `rescored` takes its `refine_rows`
best rows and scores them again from exact cosines: the item's own, its ±1 / ±2 neighbours' (its
windows) and its passages'. The channels' means over all candidates stay the first pass's:
rounding errors as often up as down move a mean over thousands of rows by about 1e-5. So do
their spreads over the int8 copy; over the int4 copy each spread is first rid of the variance
the rounding added (`first_pass_noise`, from the copy's scales and the query).

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

from . import bfloat16 as bf16, kernels
from .fusion import weighted_sum
from .lexical import remembered
from .vectors import INT4_GROUP, Int4View, dot, k_best
from .windows import group_best, group_max, window_sums

if TYPE_CHECKING:  # pragma: no cover
    from .score import Corpus, RankingParams

@dataclass(frozen=True)
class Pass:
    """What the first pass computed that the second reuses: every channel over every row, the
    (mean, spread) fusion took of each channel it summed, the priors, the fused scores before
    the session prior, that prior's (mean, spread) (None: no session prior) and the candidates
    (None: every row)."""

    channels: Mapping[str, np.ndarray]
    stats: Mapping[str, tuple[float, float]]
    priors: np.ndarray | None
    fused: np.ndarray  # channels and priors, before the session prior
    session: tuple[float, float] | None
    mask: np.ndarray | None


def rescored(corpus: "Corpus", vector: np.ndarray, params: "RankingParams", score: np.ndarray,
             first: Pass) -> np.ndarray:
    """`score` (the first pass's fused scores, -inf outside the candidates) with its
    `params.refine_rows` best rows scored again from exact cosines. Their channels are exact;
    their spreads are made so too (over an int4 copy: `first_pass_noise`)."""
    rows = _best(score, params.refine_rows, params.compiled)
    if not len(rows):
        return score
    exact = _exact_channels(corpus, vector, params, first.channels, rows)
    noise = first_pass_noise(corpus, vector, params, first.mask)
    stats = corrected(first.stats, noise) if noise else first.stats
    values = {name: exact[name] if name in exact else first.channels[name][rows] for name in stats}
    fused = weighted_sum(values, stats, params.channel_weights(), len(rows))
    if first.priors is not None:
        fused += first.priors[rows]
    if first.session is not None:
        mean, sd = first.session
        gids = corpus.gids[rows]
        # A session's best row not rescored (rare: its first-pass score was below the rescored
        # rows', its exact one is not) still counts, with its first-pass score.
        runs = corpus.runs("gids")
        others = (kernels.best_outside(first.fused, corpus.gids, first.mask, rows, runs.top)
                  if params.compiled else None)
        if others is None:
            outside = np.ones(len(score), dtype=bool) if first.mask is None else first.mask.copy()
            outside[rows] = False
            others = group_best(first.fused, corpus.gids, outside, runs)
        best = np.maximum(group_max(fused, gids), others[gids])
        fused += params.w_session * ((best - mean) / sd)
    out = score.copy()
    out[rows] = fused
    return out


def corrected(stats: Mapping[str, tuple[float, float]],
              noise: Mapping[str, float]) -> dict[str, tuple[float, float]]:
    """`stats` with each channel's spread rid of the variance `noise` says the first pass's
    rounding added (never below half the spread measured)."""
    return {name: (mean, float(np.sqrt(max(sd * sd - noise.get(name, 0.0), 0.25 * sd * sd))))
            for name, (mean, sd) in stats.items()}


NOISE_SAMPLE = 1024  # rows whose scales estimate the candidates' mean (within ~3 % of a 0.1 % correction)


def first_pass_noise(corpus: "Corpus", vector: np.ndarray, params: "RankingParams",
                     mask: np.ndarray | None) -> dict[str, float]:
    """The variance the int4 copy's rounding adds to each dense channel over the candidates.

    A component is rounded to a step of its group's scale s, an error spread evenly over ±s/2
    (variance s²/12) and independent of the cosine: a row's score is off by Σ_g |q_g|² s_g²/12
    in variance (q_g: the query's components in group g), a window's by its rows' sum at their
    weights squared over its norm squared. The spread the first pass measures is the exact one
    widened by that: at a campaign's 100,000 messages by 0.1-0.2 % — which, kept, moved every
    rescored row by as much and changed the order of 11 of 200 top-10 lists (3 with it). The
    int8 copy's error is ten times smaller: nothing is corrected there (empty).

    The candidates' mean is taken over NOISE_SAMPLE of them, evenly spaced (each turn adds rows:
    over every row it cost ~2 ms a turn at 10,000 messages), and kept while the rows stay."""
    view = corpus.coarse
    if not isinstance(view, Int4View):
        return {}
    terms = remembered(corpus.memo, ("int4 noise", view.n, params.window_weights), mask,
                       lambda: _noise_terms(corpus, view, params, mask))
    per_group = (np.asarray(vector, dtype=np.float64).reshape(-1, INT4_GROUP) ** 2).sum(axis=1) / 12
    return {name: float(per_group @ t) for name, t in terms.items()}


def _noise_terms(corpus: "Corpus", view: Int4View, params: "RankingParams",
                 mask: np.ndarray | None) -> dict[str, np.ndarray]:
    """Per group, the candidates' mean of what multiplies |q_g|²/12 in each channel's variance
    (over NOISE_SAMPLE of them; empty without candidates)."""
    n = view.n
    rows = np.arange(n) if n <= NOISE_SAMPLE else np.linspace(0, n - 1, NOISE_SAMPLE).astype(np.int64)
    if mask is not None:
        rows = rows[mask[rows]]
    if not len(rows):
        return {}
    bits = view.scale_zero[:, :, 0]  # (groups, rows)

    def squares(at: np.ndarray) -> np.ndarray:  # (len(at), groups); 0 where at is -1 (no row)
        scale = bf16.value(bits[:, at].T)
        return np.where(at[:, None] >= 0, scale * scale, np.float32(0)).astype(np.float64)

    own = squares(rows)
    mean = own.mean(axis=0)
    out = {"dense": mean, "dense_sent": mean}  # the best passage: as one row
    nbr = corpus.neighbours
    if nbr is not None and corpus.win1_norm is not None and corpus.win2_norm is not None:
        w1, w2 = (list(params.window_weights) + [0.0, 0.0])[:2]
        links = nbr[rows]
        one = own + w1 * w1 * (squares(links[:, 0]) + squares(links[:, 1]))
        two = one + w2 * w2 * (squares(links[:, 2]) + squares(links[:, 3]))
        out["dense_win1"] = (one / corpus.win1_norm[rows, None] ** 2).mean(axis=0)
        out["dense_win2"] = (two / corpus.win2_norm[rows, None] ** 2).mean(axis=0)
    return out


def _best(score: np.ndarray, k: int, compiled: bool) -> np.ndarray:
    """The rows of the `k` best finite scores, in no order (`compiled`: see `k_best`)."""
    rows = k_best(score, k, compiled) if len(score) > k else np.arange(len(score))
    return rows[np.isfinite(score[rows])]


def _exact_channels(corpus: "Corpus", vector: np.ndarray, params: "RankingParams",
                    channels: Mapping[str, np.ndarray], rows: np.ndarray) -> dict[str, np.ndarray]:
    """The dense channels at `rows`, from exact cosines of the rows and of their neighbours."""
    nbr = corpus.neighbours
    table = None if nbr is None else nbr[rows]
    # The rows and their neighbours, in row order (as the first version's mask over every row
    # gave them: the same products to the bit), and only they: no pass over every row.
    needed = np.unique(rows if table is None else np.concatenate([rows, table[table >= 0]]))
    exact = dot(corpus.vectors[needed], vector)
    local = np.searchsorted(needed, rows)
    out = {"dense": exact[local]}
    if table is not None and ("dense_win1" in channels or "dense_win2" in channels):
        links = np.full((len(needed), table.shape[1]), -1, dtype=np.int64)
        links[local] = np.where(table >= 0, np.searchsorted(needed, table), -1)
        one, two = window_sums(exact, links, params.window_weights, local)
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
    if len(owner) > 1 and corpus.runs("sent_owner").ordered:
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
