"""Search (SW6, SW9b): hybrid retrieval over everything the store indexes, for a person or as one
character knows it.

`search(svc, query, viewer_id=…, chat_id=…, kinds=…, k=…)` ranks the store's index rows (messages,
memories, summaries, lore, character memories, scenes — whatever docs.put wrote) with
`ranking.rank`: BM25 with neighbour context, MiniLM cosine of the item, its session windows and
its passages, fused as weighted z-scores, plus speaker, session, temporal, date and length priors;
every weight is a `search_*` setting. Candidates are the rows the viewer may know (visibility.py
decides), of the kinds asked for, in the chat asked for (items that belong to no chat stay in).
The rows are ranked in memory: live_index.py keeps them current.
"""

from __future__ import annotations

import logging
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Sequence, Union

import numpy as np

from .. import placement
from ..core.text import share_without_spaces
from ..services import Services
from ..settings import Settings
from ..store.db import loads
from . import docs as index
from . import live_index, visibility
from . import ranking as R

log = logging.getLogger(__name__)

KINDS = ("message", "memory", "character_memory", "scene_summary", "session_summary", "lore")


def params_of(settings: Settings) -> R.RankingParams:
    """The ranking weights from the `search_*` settings (the only place they are kept)."""
    s = settings
    return R.RankingParams(
        k1=s.search_k1, b=s.search_b, neighbour_weights=(s.search_neighbour_w1, s.search_neighbour_w2),
        window_weights=(s.search_window_w1, s.search_window_w2),
        passage_min_words=s.search_passage_min_words, w_bm25=s.search_w_bm25, w_dense=s.search_w_dense,
        w_dense_win1=s.search_w_dense_win1, w_dense_win2=s.search_w_dense_win2,
        w_dense_sent=s.search_w_dense_sent, w_speaker=s.search_w_speaker, w_session=s.search_w_session,
        w_temporal=s.search_w_temporal, w_length=s.search_w_length, w_date=s.search_w_date,
        date_after_days=s.search_date_after_days, date_tau_days=s.search_date_tau_days,
        query_person=s.search_query_person, refine_rows=s.search_refine_rows,
        compiled=s.search_compiled_first_pass, placed=s.cpu_placement)


def reading_params(svc: Services, query: str) -> R.RankingParams:
    """The ranking weights for `query`: an embedder that reads only scripts with spaces (the
    packaged MiniLM) has its dense channels weighted by the share of the query it can read."""
    params = params_of(svc.settings)
    if getattr(svc.embedder, "reads_every_script", False):
        return params
    return R.dense_trusted(params, 1.0 - share_without_spaces(query))


# --- the query -----------------------------------------------------------------------------------
def query_cast(svc: Services, chat_id: str | None) -> R.Cast:
    """The names a query is read with: every character's, but where two share a name ("John" in
    two campaigns), the one who is a member of `chat_id` is the one meant."""
    version, names = index.store_names(svc.db)
    if chat_id is None:
        return index.store_cast(svc.db)[1]
    members = tuple(visibility.chat_members(svc.db.reader(), chat_id))

    def build() -> R.Cast:
        first = [n for n in names if n[0] in members]
        return R.Cast.build(first + [n for n in names if n[0] not in members])

    return svc.cached("search_cast", (version, chat_id, members), build, size=64)


class QueryVector(np.ndarray):
    """A query's vector that knows the model that made it (`model_key`)."""

    model_key = ""


def query_vector(svc: Services, query: str, chat_id: str | None = None) -> np.ndarray:
    """The dense side of a query (SW6): the text as `dense_query_text` reads it with the chat's
    cast (stored vectors are embedded without character names), embedded as a query by the
    store's model. The context call computes it once and ranks its per-turn memories with it too."""
    return _embedded(svc, _dense_text(svc, query, query_cast(svc, chat_id)))


# The query embeddings started ahead (`query_vector_soon`): one small pool per process, as the
# model is one per process; its threads only embed (no store access: a reader is per thread).
_EMBEDDING = ThreadPoolExecutor(max_workers=4, thread_name_prefix="chronicler-query")

Vector = Union[np.ndarray, "Future[np.ndarray]"]


def query_vector_soon(svc: Services, query: str, chat_id: str | None = None) -> Vector:
    """`query_vector`, embedded on another thread: the caller goes on with what needs no vector
    (the context's other parts, BM25 and the priors of `search`) and `vector_of` waits for it.
    The embedding (10-20 ms a query) and that work overlap on the second core where they leave
    the interpreter (numpy's and SQLite's work; the model's own Python takes turns with it). A query prefetched already
    (prefetch.py) is taken from the embedder's cache here: no thread to hand over to."""
    return _soon(svc, _dense_text(svc, query, query_cast(svc, chat_id)))


def vector_of(vector: Vector) -> np.ndarray:
    """The query's vector, waiting for it when it is still being embedded (its error, if any)."""
    if not isinstance(vector, Future):
        return vector
    try:
        return vector.result()
    finally:
        placement.rejoin()  # the embedding is done: this thread may use every CPU again


def _soon(svc: Services, text: str) -> Vector:
    if svc.embedder.has(text, "query"):
        return _embedded(svc, text)
    # Off the pool's CPUs first, so that its thread wakes on an idle one (placement.py).
    placement.leave(svc.settings.cpu_placement)
    return _EMBEDDING.submit(_embedded_apart, svc, text)


def _embedded_apart(svc: Services, text: str) -> np.ndarray:
    placement.embedding(svc.settings.cpu_placement)
    return _embedded(svc, text)


def _dense_text(svc: Services, query: str, cast: R.Cast) -> str:
    return R.dense_query_text(query, cast, params_of(svc.settings))


def _embedded(svc: Services, text: str) -> np.ndarray:
    embedder = svc.embedder
    vector = embedder.embed_one(text, svc.embed_wait(), kind="query").view(QueryVector)
    vector.model_key = embedder.key
    return vector


def search(svc: Services, query: str, *, viewer_id: str | None = None, chat_id: str | None = None,
           kinds: Sequence[str] | None = None, k: int = 10,
           vector: Vector | None = None,
           chat_ids: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """The `k` best items for `query` that the viewer may know (SW6, SW9b), best first.

    `viewer_id` None is a person (sees everything); `chat_id` keeps that chat's items plus those
    of no chat (lore, memories saved outside a chat); `kinds` None means every kind. Each result:
    `{id, kind, text, score, source_message_ids, chat_id, character_id, created_at}` — `id` is the
    message id for a message (which cites itself), the item's id otherwise. `vector`: the query's
    `query_vector` (or `query_vector_soon`), when the caller has it already; otherwise it is
    embedded while BM25 and the priors are computed. `chat_ids`: the chats whose items are kept
    (a campaign's, CP1), instead of `chat_id` alone; `chat_id` still names whose cast reads the query.
    """
    state = live_index.state_of(svc)
    state.ensure_loaded(svc.embed_wait())
    params = reading_params(svc, query)
    if chat_id is None and chat_ids:
        chat_id = chat_ids[0]
    cast = query_cast(svc, chat_id)
    if vector is None:
        vector = _soon(svc, _dense_text(svc, query, cast))
    if not (svc.embedder.ready and svc.embedder.in_process):
        # A model still loading or behind the network may take seconds: never under the lock,
        # which every other search and the index's upkeep need.
        vector = vector_of(vector)
    prepared = R.prepare_query(query, cast, None, params)
    k = max(0, min(int(k), svc.settings.search_max_k))
    scopes = visibility.readable_scopes(svc.db.reader(), viewer_id) if viewer_id is not None else ()
    with state.lock:
        live = state.current()
        mask = live.candidates(viewer_id, scopes, chat_ids or ([chat_id] if chat_id else None), kinds)
        live.settle_first_pass()
        corpus = live.corpus()
        text = R.text_side(corpus, prepared, params, mask)  # while the vector is being embedded
        ready = vector_of(vector)
        if getattr(ready, "model_key", "") not in ("", svc.embedder.key):
            # the store moved to another model since (reembed.switch, under this lock): embed again
            ready = query_vector(svc, query, chat_id)
        scores = R.rank(corpus, R.with_vector(prepared, ready), params, mask, text)
        # Twice k: a branch's copies (CP2c) are collapsed into one result below.
        top = R.top_k(scores, 2 * k, params.compiled)
        picked = [(int(live.a["doc_id"][i]), float(scores[i])) for i in top]
    return one_of_each_copy(_results(svc, picked), chat_id)[:k]


def one_of_each_copy(results: list[dict[str, Any]], chat_id: str | None) -> list[dict[str, Any]]:
    """CP2c: a branch's copy of its parent's item (the same kind, text and source messages, in
    another chat of the campaign) is one result, the asking chat's where it has one, in the
    place of the better-ranked of the two."""
    out: list[dict[str, Any]] = []
    seen: dict[tuple[Any, ...], int] = {}
    for result in results:
        key = (result["kind"], result["text"], tuple(result["source_message_ids"]))
        if key not in seen:
            seen[key] = len(out)
            out.append(result)
        elif result["chat_id"] == chat_id and out[seen[key]]["chat_id"] != chat_id:
            out[seen[key]] = {**result, "score": out[seen[key]]["score"]}
    return out


def _results(svc: Services, picked: Sequence[tuple[int, float]]) -> list[dict[str, Any]]:
    if not picked:
        return []
    ids = [d for d, _ in picked]
    rows = index.results(svc.db.reader(), ids)
    out = []
    for doc_id, score in picked:
        r = rows.get(doc_id)
        if r is None:  # deleted since it was ranked
            continue
        sources = loads(r["sources"]) or []
        item_id = sources[0] if r["kind"] == "message" and sources else r["ref_id"]
        out.append({"id": item_id, "kind": r["kind"], "text": r["text"], "score": round(score, 4),
                    "source_message_ids": sources, "chat_id": r["chat_id"],
                    "character_id": r["character_id"], "created_at": r["created_at"]})
    return out
