"""Scoring (SW6): the channels (BM25 from lexical.py, the dense ones), their z-score fusion
(fusion.py), the priors, and `rank` / `top_k`. Pure numpy, with torch's kernels where they are
faster (the float16 products in vectors.py, the selection of the best k)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Mapping, Sequence

import numpy as np

from .dates import coded_date_prior, date_prior, query_dates
from .lexical import TermIndex, bm25, remembered
from .text import Cast, analyze, is_temporal_query, rewrite_query
from . import kernels, refine
from .fusion import fuse, mean_sd, zscore
from .vectors import Int4View, coarse_dot, coarse_dots, coarse_ready, dot, k_best
from .windows import Runs, group_max, runs_of, window_pair, window_scores

def segment_max(values: np.ndarray, owners: np.ndarray, n_items: int, fill: np.ndarray,
                runs: Runs | None = None) -> np.ndarray:
    """Max of `values` per owning item (best passage per item); `fill` where an item has none.
    `runs`: `runs_of(owners)`, when the caller keeps it."""
    runs = runs_of(owners) if runs is None else runs
    if len(owners) > 1 and runs.ordered:
        # The store appends an item's passages together: one max per run (ufunc.at is ~10x
        # slower), written over a copy of `fill`.
        out = np.asarray(fill, dtype=np.float64).copy()
        out[owners[runs.starts]] = np.maximum.reduceat(values, runs.starts)
        return out
    out = np.full(n_items, -np.inf)
    if len(values):
        np.maximum.at(out, owners, values)
    return np.where(np.isfinite(out), out, fill)


# ---------------------------------------------------------------------------------------------
# The ranker


@dataclass(frozen=True)
class RankingParams:
    """Every weight of the ranker. Each but the bigram options is the setting `search_<name>`
    (the pairs: search_neighbour_w1/w2, search_window_w1/w2), and search.params_of builds them
    from there: this class holds no second copy of the tuned values (docs/search.md).

    Weights of channels are in z units; priors add to the fused z-score.
    """

    k1: float  # BM25 term saturation
    b: float  # BM25 length normalisation
    neighbour_weights: tuple[float, ...]  # BM25 counts of ±1, ±2 session neighbours
    passage_min_words: int  # write time: passages (best-passage vectors) of at least this
    window_weights: tuple[float, ...]  # vectors of ±1, ±2 neighbours in windows
    w_bm25: float
    w_dense: float  # the item's own vector
    w_dense_win1: float  # ±1 window vector
    w_dense_win2: float  # ±2 window vector
    w_dense_sent: float  # best passage of multi-passage items (see `chunks`)
    w_speaker: float  # messages by a character the query names
    w_session: float  # best fused score in the item's session
    w_temporal: float  # time expressions, for "when" questions
    w_length: float  # log content length (substantive messages over "ok!")
    w_date: float  # item dated in/just after a date the query names
    date_after_days: float
    date_tau_days: float
    query_person: str  # dense query: "first_person" or "strip"
    refine_rows: int  # rescored exactly after a first pass over an int4 / int8 copy (refine.py); 0: none
    compiled: bool  # that first pass as numba's loops (kernels.py) where numba is there
    placed: str  # cpu_placement: where that pass's second thread runs (vectors.coarse_dots)
    # Not settings: the stored counts hold single stems only (bigrams were flat on LoCoMo and
    # double the postings); the benchmarks measure them.
    bigrams: bool = False  # adjacent-stem bigrams in BM25 terms
    bigram_weight: float = 1.0

    def channel_weights(self) -> dict[str, float]:
        return {
            "bm25": self.w_bm25,
            "dense": self.w_dense,
            "dense_win1": self.w_dense_win1,
            "dense_win2": self.w_dense_win2,
            "dense_sent": self.w_dense_sent,
        }


@dataclass
class Corpus:
    """What search keeps in memory for one store: per-item arrays, aligned by row.

    `gids` holds each message's session group (see `group_ids`; -1 for memories, lore,
    summaries) and `neighbours` its session neighbours (`neighbour_index`); rows may come in any
    order. `vectors` are L2-normalised rows of `dense_text`;
    `win1_norm`/`win2_norm` come from `window_norms` (None skips the channel), or `win_vectors`
    holds embedded window texts (the costlier variant, kept for measurement); `sent_vectors` and
    `sent_owner` hold the passage vectors of multi-passage items (`chunks`) and their rows.
    """

    ids: list[str]
    terms: TermIndex
    vectors: np.ndarray
    gids: np.ndarray
    speakers: Sequence[str | None]
    neighbours: np.ndarray | None = None  # neighbour_index(gids, positions)
    win1_norm: np.ndarray | None = None  # window_norms(vectors, neighbours, 1, window_weights)
    win2_norm: np.ndarray | None = None  # window_norms(vectors, neighbours, 2, window_weights)
    win_vectors: tuple[np.ndarray, np.ndarray] | None = None  # embedded ±1/±2 window texts instead
    sent_vectors: np.ndarray | None = None
    sent_owner: np.ndarray | None = None
    temporal: np.ndarray | None = None  # temporal_cues per item
    content_len: np.ndarray | None = None  # content words of the item's own text
    days: np.ndarray | None = None  # date ordinal per item (NaN when undated)
    # Or the days as codes (-1: undated) into a table of the distinct days, as a store keeps them
    # (the date prior is then computed once a day, `coded_date_prior`; `days` may be None).
    day_codes: np.ndarray | None = None
    day_table: np.ndarray | None = None
    # Speakers as integer codes (-1: none) and the code of each speaker id. A store that keeps
    # them up to date passes them in; otherwise they are built from `speakers` on first use.
    speaker_codes: np.ndarray | None = None
    speaker_table: Mapping[str, int] | None = None
    # What ranking keeps between queries over these very rows (`remembered`); its owner empties
    # it when a row changes. None: nothing kept (a corpus built for one use).
    memo: dict[Any, Any] | None = None
    # int4 or int8 copies of `vectors` and `sent_vectors` (vectors.Int4Rows, or Int8Rows: rows,
    # scale bits) for the first pass of the dense scan (`refine`); None: no first pass.
    coarse: tuple[np.ndarray, np.ndarray] | Int4View | None = None
    coarse_sent: tuple[np.ndarray, np.ndarray] | Int4View | None = None

    def __len__(self) -> int:
        return len(self.ids)

    def speaker_mask(self, named: Sequence[str]) -> np.ndarray:
        """Rows spoken by any of `named` (speaker codes are built once, then reused)."""
        if self.speaker_codes is None or self.speaker_table is None:
            table: dict[str, int] = {}
            self.speaker_codes = np.array(
                [-1 if s is None else table.setdefault(s, len(table)) for s in self.speakers],
                dtype=np.int64)
            self.speaker_table = table
        codes, table = self.speaker_codes, self.speaker_table
        wanted = [table[n] for n in named if n in table]
        if not wanted:
            return np.zeros(len(codes), dtype=bool)
        # A query names one or two characters: a comparison each (np.isin sorts: ~8x slower).
        found = codes == wanted[0]
        for code in wanted[1:]:
            found |= codes == code
        return found

    def runs(self, column: str) -> Runs:
        """`runs_of` the sessions' ids ("gids") or the passages' owners ("sent_owner"), kept in
        `memo` while the rows stay as they are."""
        ids = getattr(self, column)
        return remembered(self.memo, ("runs", column, len(ids)), None, lambda: runs_of(ids))


@dataclass(frozen=True)
class Query:
    """A query prepared once: BM25 terms, the dense vector, what it names."""

    text: str
    terms: Mapping[str, float]
    vector: np.ndarray
    named: tuple[str, ...] = ()  # character ids the query names
    temporal: bool = False  # asks "when"
    dates: tuple[tuple[int, int], ...] = ()  # calendar spans it names


def dense_query_text(text: str, cast: Cast, params: RankingParams) -> str:
    """The text to embed for the dense side of `text` (names handled per `query_person`)."""
    return rewrite_query(text, cast, params.query_person)


def dense_trusted(params: RankingParams, share: float) -> RankingParams:
    """`params` with the dense channels' weights scaled by `share` (0..1): the part of a query the
    embedder can read. The packaged MiniLM is English; its cosine on a Chinese or Korean query is
    noise that outweighs BM25 in a small chat, so such a query ranks by BM25 (on the row's own
    words) and the priors."""
    if share >= 1.0:
        return params
    share = max(0.0, share)
    # BM25's neighbour context was tuned beside the dense channels, which tell a message from its
    # neighbours (a neighbour's words count 0.9 of its own); without them it would blur the two.
    return replace(params, neighbour_weights=tuple(w * share for w in params.neighbour_weights),
                   w_dense=params.w_dense * share, w_dense_win1=params.w_dense_win1 * share,
                   w_dense_win2=params.w_dense_win2 * share, w_dense_sent=params.w_dense_sent * share)


def prepare_query(
    text: str, cast: Cast, vector: np.ndarray | None, params: RankingParams
) -> Query:
    """Everything `rank` needs from a query, given the embedding of `dense_query_text(text)`
    (None while it is still being embedded: `text_side` needs none; `with_vector` adds it)."""
    return Query(
        text=text,
        terms=analyze(text, bigrams=params.bigrams),
        vector=np.zeros(0, dtype=np.float32) if vector is None else np.asarray(vector, dtype=np.float32),
        named=tuple(cast.mentioned(text)),
        temporal=is_temporal_query(text),
        dates=tuple(query_dates(text)),
    )


def text_channels(
    corpus: Corpus, query: Query, params: RankingParams, mask: np.ndarray | None = None
) -> dict[str, np.ndarray]:
    """The channels computed from the query's words alone (BM25; weight 0 skips it)."""
    if not params.w_bm25:
        return {}
    return {"bm25": bm25(
        corpus.terms, query.terms, k1=params.k1, b=params.b,
        bigram_weight=params.bigram_weight, mask=mask,
        neighbours=corpus.neighbours, neighbour_weights=params.neighbour_weights, memo=corpus.memo,
        compiled=params.compiled,
    )}


def dense_channels(corpus: Corpus, vector: np.ndarray, params: RankingParams,
                   coarse: bool = False) -> dict[str, np.ndarray]:
    """The channels computed from the query's vector: the item's own cosine, its windows' and
    its best passage's (weight-0 windows and passages skipped). `coarse`: from the corpus's
    int4 or int8 copies (approximate, see `refine`)."""
    out: dict[str, np.ndarray] = {}
    base = (coarse_dot(corpus.coarse, vector, params.compiled, params.placed)
            if coarse and corpus.coarse is not None
            else dot(corpus.vectors, vector, params.placed))
    out["dense"] = base
    if corpus.win_vectors is not None:
        if params.w_dense_win1:
            out["dense_win1"] = corpus.win_vectors[0] @ vector
        if params.w_dense_win2:
            out["dense_win2"] = corpus.win_vectors[1] @ vector
    else:
        nbr = corpus.neighbours
        one = bool(params.w_dense_win1 and corpus.win1_norm is not None and nbr is not None)
        two = bool(params.w_dense_win2 and corpus.win2_norm is not None and nbr is not None)
        if one and two:
            out["dense_win1"], out["dense_win2"] = window_pair(
                base, nbr, corpus.win1_norm, corpus.win2_norm, params.window_weights)  # type: ignore[arg-type]
        elif one:
            out["dense_win1"] = window_scores(base, nbr, 1, corpus.win1_norm, params.window_weights)
        elif two:
            out["dense_win2"] = window_scores(base, nbr, 2, corpus.win2_norm, params.window_weights)
    if params.w_dense_sent and corpus.sent_vectors is not None and len(corpus.sent_vectors):
        sims = (coarse_dot(corpus.coarse_sent, vector, params.compiled, params.placed)
                if coarse and corpus.coarse_sent is not None
                else dot(corpus.sent_vectors, vector, params.placed))
        out["dense_sent"] = np.maximum(base, segment_max(sims, corpus.sent_owner, len(corpus), base,
                                                         corpus.runs("sent_owner")))
    return out


def with_vector(query: Query, vector: np.ndarray) -> Query:
    """`query` with its embedding (prepared before the embedding was ready)."""
    return replace(query, vector=np.asarray(vector, dtype=np.float32))


def channel_scores(
    corpus: Corpus, query: Query, params: RankingParams, mask: np.ndarray | None = None
) -> dict[str, np.ndarray]:
    """Raw scores of every item per channel (channels with weight 0 are not computed)."""
    return {**text_channels(corpus, query, params, mask), **dense_channels(corpus, query.vector, params)}


@dataclass(frozen=True)
class TextSide:
    """What `rank` needs that the query's vector does not change: its word channels and the sum
    of its priors (speaker, temporal, date, length). Computed while the vector is still being
    embedded (search.search), then finished by `rank`."""

    channels: Mapping[str, np.ndarray]
    priors: np.ndarray | None
    # The word channels' weighted z-scores summed with their offset and the priors, and their
    # (mean, spread): what the compiled first pass adds the dense channels to (kernels.py). Made
    # here, while the vector is being embedded, where a corpus has the copies that pass reads.
    words: tuple[np.ndarray, Mapping[str, tuple[float, float]]] | None = None


def text_side(
    corpus: Corpus, query: Query, params: RankingParams, mask: np.ndarray | None = None
) -> TextSide:
    """The part of `rank` that needs no vector (see TextSide)."""
    priors: np.ndarray | None = None

    def add(values: np.ndarray) -> None:
        nonlocal priors
        priors = values if priors is None else priors + values

    if params.w_speaker and query.named:
        add(params.w_speaker * corpus.speaker_mask(query.named) / len(query.named))
    if params.w_temporal and query.temporal and corpus.temporal is not None:
        add(params.w_temporal * np.minimum(corpus.temporal, 2) / 2)
    if params.w_date and query.dates and (corpus.days is not None or corpus.day_codes is not None):
        spans, after, tau = query.dates, params.date_after_days, params.date_tau_days
        add(params.w_date * (date_prior(corpus.days, spans, after, tau) if corpus.day_codes is None
                             else coded_date_prior(corpus.day_codes, corpus.day_table, spans, after, tau)))
    if params.w_length and corpus.content_len is not None:
        lengths = corpus.content_len
        add(params.w_length * remembered(corpus.memo, ("length", len(lengths)), mask,
                                         lambda: zscore(np.log1p(lengths), mask)))
    channels = text_channels(corpus, query, params, mask)
    words = _fused_words(corpus, channels, priors, params, mask) if kernels.fits(corpus, params) else None
    return TextSide(channels, priors, words)


def _fused_words(corpus: Corpus, channels: Mapping[str, np.ndarray], priors: np.ndarray | None,
                 params: RankingParams, mask: np.ndarray | None
                 ) -> tuple[np.ndarray, dict[str, tuple[float, float]]]:
    """The word channels fused as `fuse` does, plus the priors (see TextSide.words)."""
    stats: dict[str, tuple[float, float]] = {}
    words = fuse(channels, params.channel_weights(), mask, stats) if channels else np.zeros(len(corpus))
    return (words if priors is None else words + priors), stats


def rank(
    corpus: Corpus,
    query: Query,
    params: RankingParams,
    mask: np.ndarray | None = None,
    text: TextSide | None = None,
) -> np.ndarray:
    """Fused score of every item (higher is better); items outside `mask` get -inf.

    `mask` is the candidate set (visibility and kinds, decided by the caller). Statistics —
    BM25's collection statistics, z-scores, session maxima — are taken over candidates only, so
    an item the viewer may not see neither appears nor moves another item's score. `text`: this
    query's `text_side` over the same corpus and mask, when the caller has it already.
    """
    if len(corpus) == 0:
        return np.zeros(0, dtype=np.float64)
    if text is None:
        text = text_side(corpus, query, params, mask)
    # A first pass over the int4 (or int8) copy, then the best rows rescored exactly (refine.py): a
    # campaign's dense scan at a fraction of the cost, the same answers in its top rows.
    count = len(corpus) if mask is None else int(np.count_nonzero(mask))
    coarse = bool(params.refine_rows and corpus.coarse is not None and corpus.win_vectors is None
                  and count > params.refine_rows and coarse_ready(corpus.coarse, corpus.vectors.shape[1]))
    if coarse and kernels.fits(corpus, params):
        compiled = _compiled_first_pass(corpus, query.vector, params, mask, count, text)
        if compiled is not None:
            return refine.rescored(corpus, query.vector, params, *compiled)
    channels = {**text.channels, **dense_channels(corpus, query.vector, params, coarse)}
    stats: dict[str, tuple[float, float]] = {}
    score = fuse(channels, params.channel_weights(), mask, stats)
    if text.priors is not None:
        score += text.priors
    fused, session = score, None
    if params.w_session:
        best = group_max(score, corpus.gids, mask, corpus.runs("gids"))
        mean, sd, count = mean_sd(best, mask)
        if count and sd >= 1e-12:  # else zscore's zeros: no session prior at all
            session = (mean, sd)
            score = score + params.w_session * ((best - mean) / sd)
    if mask is not None:
        score = np.where(mask, score, -np.inf)
    if coarse:
        score = refine.rescored(corpus, query.vector, params, score,
                                refine.Pass(channels, stats, text.priors, fused, session, mask))
    return score


def _compiled_first_pass(corpus: Corpus, vector: np.ndarray, params: RankingParams,
                         mask: np.ndarray | None, count: int,
                         text: TextSide) -> tuple[np.ndarray, refine.Pass] | None:
    """`rank`'s first pass with numba's loops (kernels.py): the dense channels and the session
    prior added there to the words' channels fused as `fuse` does (`TextSide.words`, made while
    the vector was embedded). None where the loops are unavailable."""
    words, word_stats = text.words or _fused_words(corpus, text.channels, text.priors, params, mask)
    n = len(corpus)
    candidates = (remembered(corpus.memo, ("every row", n), None, lambda: np.ones(n, dtype=bool))
                  if mask is None else mask)
    copies = [corpus.coarse, corpus.coarse_sent]
    base, sims = coarse_dots(copies, vector, True, params.placed)  # type: ignore[arg-type]
    done = kernels.first_pass(corpus, base, sims, params, candidates, count, words, word_stats)
    if done is None:
        return None
    score, channels, stats, fused, session = done
    return score, refine.Pass({**text.channels, **channels}, stats, text.priors, fused, session, mask)


def top_k(scores: np.ndarray, k: int, compiled: bool = False) -> np.ndarray:
    """Indices of the `k` best finite scores, best first (ties keep item order). `compiled`:
    see vectors.k_best."""
    if k <= 0 or len(scores) == 0:
        return np.zeros(0, dtype=np.int64)
    # The k best first, then the non-finite among them dropped (-inf sorts last): one pass over
    # the scores instead of first copying out every finite one.
    best = k_best(scores, k, compiled) if len(scores) > k else np.arange(len(scores))
    best = best[np.isfinite(scores[best])]
    return best[np.lexsort((best, -scores[best]))]
