"""The memory bank's candidates (QS8): one query vector per turn, search's results for the last
action, and the per-turn saved memories ranked against the same vector and fused with them.

The context call (story/context) asks this module and hands the result to the assembler, which
decides what fits. Who may know what is decided by visibility, inside `search.search`.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from ..core.assemble import Item
from ..errors import ServiceUnavailable
from ..services import Services
from . import docs, live_index, search

RRF_K = 60  # the usual reciprocal-rank constant: ranks far down either list add little
KINDS = ("memory", "character_memory", "scene_summary", "session_summary", "message")
QUERY_MAX_CHARS = 1000  # MiniLM reads ~256 word pieces; the end of a long action is its point
VECTOR_CACHE_SIZE = 20000  # 30 MB of 384-float vectors at most


def query_text(text: str) -> str:
    """The memory bank's query text: a long action's end, from a whole word."""
    text = text.strip()
    if len(text) > QUERY_MAX_CHARS:
        cut = text[-QUERY_MAX_CHARS:]
        text = cut.split(None, 1)[-1] if " " in cut else cut
    return text


def query_vector_soon(svc: Services, text: str, chat_id: str) -> search.Vector | None:
    """The memory bank's one query embedding, search's own (names read with the chat's cast), so
    the per-turn memories and search rank against the same vector; started on another thread
    while the context call reads the rest of the turn (search.query_vector_soon), and waited for
    where it is used (`search.vector_of`). None: nothing to rank by, or the model is still
    loading — then the bank keeps newest first and searches nothing rather than hold up the turn."""
    text = query_text(text)
    if not text or not svc.embedder.ready:
        return None
    return search.query_vector_soon(svc, text, chat_id)


def memory_bank(svc: Services, query: search.Vector | None,
                unpinned: Sequence[dict[str, Any]], found: Sequence[Item] = ()) -> list[Item]:
    """QS8: the per-turn unpinned memories ranked by cosine similarity to the last action (ties
    and a missing query keep newest first), fused with search's results (`found`, best first) by
    reciprocal rank: an item both lists rank high comes first, and either list alone still counts."""
    items = [Item(m["id"], m["text"]) for m in unpinned]
    if query is not None and items:
        query = search.vector_of(query)
        vectors = memory_vectors(svc, unpinned)
        scores = {m["id"]: float(np.dot(vectors[(m["id"], m["version"])], query))
                  for m in unpinned if (m["id"], m["version"]) in vectors}
        order = {item.id: n for n, item in enumerate(items)}
        items = sorted(items, key=lambda i: (-scores.get(i.id, -1.0), order[i.id]))
    if not found:
        return items
    fused: dict[str, float] = {}
    texts: dict[str, str] = {}
    for ranked in (items, found):
        for rank, item in enumerate(ranked):
            fused[item.id] = fused.get(item.id, 0.0) + 1.0 / (RRF_K + rank)
            texts.setdefault(item.id, item.text)
    first = {item_id: n for n, item_id in enumerate(texts)}
    return [Item(i, texts[i]) for i in sorted(texts, key=lambda i: (-fused[i], first[i]))]


def bank_search(svc: Services, *, speaker_id: str, chat_id: str, member_ids: Sequence[str],
                text: str, vector: search.Vector, live_ids: set[str], held_ids: set[str],
                speaker_names: Callable[[str, list[str]], dict[str, str]],
                chat_ids: Sequence[str] | None = None) -> list[Item]:
    """Search's candidates for the memory bank (QS8, SW6): the `memory_bank_search_results` best
    items for the last action that the speaker knows (SW9b) in the chats of this chat's campaign
    (`chat_ids`, CP1; default this chat alone) or in none, minus what
    the context already holds (`held_ids`: pinned memories and the story summary's sessions;
    `live_ids`: the live window's messages). Saved memories come from the scopes of this chat
    (RV5) as in the per-turn set. A message is shown with its speaker's name
    (`speaker_names(chat_id, message_ids)`); one of another chat is named `message:<chat>:<id>`
    (message ids are unique only within a chat). Empty while the index is still being built in the
    background: a turn does not wait for it."""
    k = svc.settings.memory_bank_search_results
    state = live_index.state_of(svc)
    if k <= 0 or not text.strip() or (state.thread is not None and not state.ready.is_set()):
        return []
    try:
        results = search.search(svc, query_text(text), viewer_id=speaker_id,
                                chat_ids=chat_ids or [chat_id], kinds=KINDS, k=k, vector=vector)
    except ServiceUnavailable:
        return []
    scopes = {speaker_id, *member_ids}
    names: dict[tuple[str, str], str] = {}
    for of_chat in {r["chat_id"] for r in results if r["kind"] == "message"}:
        ids = [r["id"] for r in results if r["kind"] == "message" and r["chat_id"] == of_chat]
        names.update({(of_chat, i): n for i, n in speaker_names(of_chat, ids).items()})
    found = []
    for r in results:
        if r["kind"] == "memory":
            if r["id"] not in held_ids and (r["character_id"] is None or r["character_id"] in scopes):
                found.append(Item(r["id"], r["text"]))
        elif r["kind"] == "message":
            own = r["chat_id"] == chat_id
            if not (own and r["id"] in live_ids):
                name = names.get((r["chat_id"], r["id"]), "Someone")
                item_id = f"message:{r['id']}" if own else f"message:{r['chat_id']}:{r['id']}"
                found.append(Item(item_id, f"{name}: {r['text']}"))
        elif r["kind"] == "session_summary":
            n = r["id"].rpartition("#")[2] if r["chat_id"] == chat_id else r["id"]
            if f"session:{n}:full" not in held_ids and f"session:{n}:short" not in held_ids:
                found.append(Item(f"session_summary:{r['id']}", r["text"]))
        else:
            found.append(Item(f"{r['kind']}:{r['id']}", r["text"]))
    return found


def memory_vectors(svc: Services, chosen: Sequence[dict[str, Any]]) -> dict[tuple[str, int], np.ndarray]:
    """The stored unit vectors of memories, by (id, version): read from the index once per
    version and kept (the per-turn set changes little from turn to turn)."""
    cache = svc.cached("context_vectors", "memory", dict, size=1)
    wanted = [(m["id"], m["version"]) for m in chosen]
    found = {key: cache.get(key) for key in wanted}
    missing = [key for key, vector in found.items() if vector is None]
    if missing:
        if len(cache) + len(missing) > VECTOR_CACHE_SIZE:
            cache.clear()  # old versions and forgotten memories: start over
        versions = dict(missing)
        for ref_id, vector in docs.vectors_of(svc.db.reader(), "memory", list(versions)).items():
            cache[(ref_id, versions[ref_id])] = found[(ref_id, versions[ref_id])] = vector
    return {key: vector for key, vector in found.items() if vector is not None}
