"""The ranking core of search (rule SW6): pure functions over texts, term counts and vectors.

Nothing here touches the database, the clock or the embedding model. The store computes what
it keeps per item at write time with these functions (`analyze`, `dense_text`, `temporal_cues`),
keeps an in-memory `Corpus` per store, and asks `rank` for scores; `live_index` and `search` own
the caching and the visibility mask, this package owns the arithmetic, split by what it ranks
on: `text` (terms, names, cues, passages), `dates`, `windows` (conversation structure),
`lexical` (BM25, and what is kept between queries), `fusion` (the channels' z-score sum),
`score` (the channels, priors, `rank`), `refine` (the exact second pass of a campaign's dense
scan) and `kernels` (its first pass and BM25's neighbour context as loops compiled by numba).
This module gathers their public names, so callers read `ranking.rank`, `ranking.analyze`, …
whatever submodule holds them.

How a query is scored (each part measured on LoCoMo with bench/locomo_proto.py; the storage
design and the measurements at campaign scale are in docs/search.md):
- BM25 over Snowball-stemmed terms of "<date> <speaker>: <text>"; a message's term counts are its
  own plus its session neighbours' at decaying weights ("neighbour context"), added at query time
  through a neighbour table so that no stored row changes when a new message arrives.
- MiniLM cosine with the item's vector, with its ±1 / ±2 session windows (weighted means of the
  neighbours' vectors, scored from the items' cosines) and with its best passage. Everything is
  embedded with character names removed: MiniLM ranks by the names it sees, so a query naming
  Ayla would otherwise pull every message that says "Ayla". The query names its first character
  in the first person instead ("When did I go…"), as stored messages speak.
- Weighted z-score fusion of those channels over the viewer's candidates (it beat reciprocal rank
  fusion), plus additive priors in z units: speaker (the characters the query names), session
  (the best score of the item's session), temporal cues for "when" questions, dates the query
  names and content length.
"""

from __future__ import annotations

from .dates import coded_date_prior, date_prior, query_dates
from .fusion import fuse, zscore
from .lexical import SPREAD_CACHE_TERMS, SpreadCache, TermIndex, bm25, idf, remembered, spread
from .score import (
    Corpus,
    Query,
    RankingParams,
    TextSide,
    channel_scores,
    dense_query_text,
    dense_trusted,
    prepare_query,
    rank,
    segment_max,
    text_side,
    top_k,
    with_vector,
)
from ...core.text import stem  # the analyzer's stemmer, for callers that stem query words
from .text import (
    Cast,
    analyze,
    chunks,
    dense_text,
    is_temporal_query,
    rewrite_query,
    sentences,
    temporal_cues,
    tokenize,
)
from .windows import (
    columns,
    expand_neighbours,
    group_best,
    group_ids,
    group_max,
    neighbour_index,
    neighbour_sum,
    window_norms,
    window_pair,
    window_scores,
    window_texts,
    window_vectors,
)

__all__ = [
    "Cast",
    "Corpus",
    "Query",
    "RankingParams",
    "SPREAD_CACHE_TERMS",
    "SpreadCache",
    "TermIndex",
    "TextSide",
    "analyze",
    "bm25",
    "channel_scores",
    "chunks",
    "coded_date_prior",
    "columns",
    "date_prior",
    "dense_query_text",
    "dense_text",
    "dense_trusted",
    "expand_neighbours",
    "fuse",
    "group_best",
    "group_ids",
    "group_max",
    "idf",
    "is_temporal_query",
    "neighbour_index",
    "neighbour_sum",
    "prepare_query",
    "query_dates",
    "rank",
    "remembered",
    "rewrite_query",
    "segment_max",
    "sentences",
    "spread",
    "stem",
    "temporal_cues",
    "text_side",
    "tokenize",
    "top_k",
    "window_norms",
    "window_pair",
    "window_scores",
    "window_texts",
    "window_vectors",
    "with_vector",
    "zscore",
]
