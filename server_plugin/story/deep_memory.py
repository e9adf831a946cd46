"""Deep memory (rule RV13): right after a compaction, re-read what left the live window and file
its durable facts (RV18: names, birthdays, allergies, promises — not moods or plot) as memories.

Bounded: only once `deep_memory_min_new_messages` summarised messages have not been read yet; one
run reads at most `deep_memory_max_messages` of them and files at most `deep_memory_max_items`.
By default a run waits for as many messages as a chunk holds, so in play (a turn compacts one
chunk) it reads exactly what that chunk's summary reads, in the same model call (MJ1).
It only ever creates unpinned memories (actor `background`), never touches pinned ones (RV11),
skips facts already saved (same words), respects learn-from-chat (RV14) and memory switched off
(RV16), and works without tool support (RV15: it is our job, not the model's reply). Each memory
carries the chat, the turn that triggered the compaction (so rolling that turn back removes it,
RV10), the messages it came from, and their witnesses (SW9b).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

from ..core.text import fold
from ..errors import ChroniclerError
from ..hooks import Hooks
from ..jobs import queue
from ..jobs.queue import JobKinds
from ..jobs.tasks.base import CharacterRef
from ..jobs.tasks.memories import durable_memories
from ..retrieval import docs
from ..services import Services
from ..store.db import Connection
from . import characters, chats, memories, messages

if TYPE_CHECKING:
    from ..jobs.tasks.base import Extraction, Prompt
    from ..jobs.tasks.memories import MemoryDraft

KIND = "durable_memories"


def after_compaction(svc: Services, conn: Connection, chat_id: str, turn_id: str | None) -> int:
    """Queue a deep-memory run if enough summarised messages wait to be read (and the work
    connected to `hooks.deep_memory_ran` for the same chunk, such as character memories:
    fn(svc, conn, chat_id, turn_id, message_ids) -> jobs queued, inside the compacting
    transaction); returns how many jobs were queued."""
    if not chats.memory_enabled(conn, chat_id):
        return 0
    waiting = messages.ordered(conn, chat_id, "summary_id IS NOT NULL AND deep_job IS NULL")
    if len(waiting) < svc.settings.deep_memory_min_new_messages:
        return 0
    batch = waiting[:svc.settings.deep_memory_max_messages]
    job_id = queue.enqueue(svc, KIND, chat_id=chat_id, turn_id=turn_id, dedupe=False,
                          target={"message_ids": [r["id"] for r in batch]})
    messages.mark_deep_read(conn, batch, job_id)
    ids = [r["id"] for r in batch]
    return 1 + svc.hooks.deep_memory_ran.count(svc, conn, chat_id, turn_id, ids)


def queue_part(svc: Services, conn: Connection, chat_id: str, turn_id: str | None,
               rows: Sequence[Any]) -> int:
    """MJ1: a deep-memory run over exactly a part's messages (its other tasks are queued by
    `hooks.part_closed`, so `deep_memory_ran` is not sent); returns the jobs queued."""
    if not chats.memory_enabled(conn, chat_id):
        return 0
    job_id = queue.enqueue(svc, KIND, chat_id=chat_id, turn_id=turn_id, dedupe=False,
                          target={"message_ids": [r["id"] for r in rows]})
    messages.mark_deep_read(conn, rows, job_id)
    return 1


def most_items(svc: Services, read: int) -> int:
    """Memories one run may file: `deep_memory_max_items` per `deep_memory_max_messages` it reads
    (a part holds more than one run's worth), at most `llm_answer_max_items` when that is set."""
    s = svc.settings
    runs = max(1, -(-read // s.deep_memory_max_messages))
    most = s.deep_memory_max_items * runs
    return min(most, max(s.deep_memory_max_items, s.llm_answer_max_items)) if s.llm_answer_max_items else most


def release(conn: Connection, job_ids: Sequence[str]) -> None:
    """Messages read by rolled-back runs may be read again."""
    messages.release_deep_read(conn, job_ids)


def _cast(conn: Connection, chat_id: str, rows: Sequence[Any]) -> list[CharacterRef]:
    """The chat's members and the speakers of the messages, minus those not learning (RV14)."""
    ids = list(dict.fromkeys([*chats.members(conn, chat_id), *(r["speaker_id"] for r in rows if r["speaker_id"])]))
    cast = []
    for character_id in ids:
        found = characters.fetch(conn, character_id)
        if found is None or not found["learn_from_chat"]:
            continue  # an unregistered id cannot hold memories; learning off stops saving (RV14)
        cast.append(CharacterRef(found["id"], found["name"], found["is_player"],
                                 tuple(found["aliases"])))
    return cast


def _existing(svc: Services, conn: Connection, cast: Sequence[CharacterRef]) -> list[str]:
    return memories.newest_texts(conn, [c.id for c in cast], svc.settings.deep_memory_existing_max)


def _build(svc: Services, job: queue.Job) -> Prompt | None:
    conn = svc.db.reader()
    if not chats.memory_enabled(conn, job.chat_id):
        return None
    rows = messages.by_ids(conn, job.chat_id, job.target["message_ids"])
    cast = _cast(conn, job.chat_id, rows)
    if not rows or all(c.is_player for c in cast):
        return None  # nobody left who may learn from this chat (RV14): filing facts as global
        # memories instead would slip past the switch
    return durable_memories([messages.chat_message(svc, r) for r in rows], cast,
                            existing=_existing(svc, conn, cast),
                            max_items=most_items(svc, len(rows)),
                            max_chars=svc.settings.memory_max_chars)


def _prepare(svc: Services, job: queue.Job, result: Extraction) -> None:
    # Embed outside the write transaction; memories.create then finds the vectors in the cache.
    texts = [d.text for d in result.items]
    if texts:
        docs.prepare(svc, texts, svc.embed_wait())


def _saved(conn: Connection, draft: MemoryDraft) -> bool:
    folded = fold(draft.text)
    return any(fold(t) == folded
               for t in memories.scope_texts(conn, draft.scope, draft.character_id))


def _apply(svc: Services, conn: Connection, job: queue.Job, result: Extraction,
           prepared: Any) -> dict[str, Any]:
    if not chats.memory_enabled(conn, job.chat_id):
        return {"skipped": "memory is switched off for this chat (RV16)"}
    members = chats.members(conn, job.chat_id)
    speakers = {r["id"]: r["speaker_id"] for r in messages.by_ids(conn, job.chat_id, job.target["message_ids"])}
    created, skipped = [], list(result.dropped_items)
    for draft in result.items[:most_items(svc, len(speakers))]:
        if _saved(conn, draft):
            skipped.append(f"already saved: {draft.text[:80]}")
            continue
        witnesses = set(members) | {speakers[m] for m in draft.source_message_ids if speakers.get(m)}
        try:
            memory = memories.create(svc, {
                "text": draft.text, "scope": draft.scope, "character_id": draft.character_id,
                "actor": "background", "chat_id": job.chat_id, "turn_id": job.turn_id,
                "known_by": sorted(witnesses), "source_message_ids": list(draft.source_message_ids)})
        except ChroniclerError as exc:  # learning off, unknown character, quota…: skip this one
            skipped.append(f"{exc.code}: {draft.text[:80]}")
            continue
        created.append(memory["id"])
    return {"memories": created, "skipped": skipped}


def register(jobs: JobKinds, hooks: Hooks) -> None:
    """The deep-memory job (RV13)."""
    jobs.register(KIND, _apply, build=_build, prepare=_prepare)
