"""A chat's conversation as a whole: what a message write, a delete, a rename or a rollback sets off.

`ingest` is the one entry point for new and edited messages: it stores the batch and its search
entries (messages.py), opens and closes sessions (sessions.py, SW2), marks summaries of edited
messages stale and compacts what left the live window (summaries.py, RV2/RV3), all in one write
transaction; the jobs it enqueues run later (a reply never waits for a job).

Other concepts that derive things from messages connect to the hooks it sends (hooks.py), so a
delete removes what was derived only from the deleted messages and a chat delete removes the
chat's derived rows: `messages_deleted` and `chat_deleted` inside the deleting transaction,
`messages_edited` (the edited rows, new text) inside the ingesting one.
"""

from __future__ import annotations

from typing import Any

from ..errors import Conflict, NotFound, PayloadTooLarge
from ..hooks import Hooks
from ..jobs import queue
from ..jobs.queue import JobKinds
from ..retrieval import docs
from ..services import Services
from ..store.db import Connection, rekey
from . import chats, deep_memory, memories, messages, notes, sessions, summaries


def _merge_counts(total: dict[str, int], part: dict[str, int] | None) -> None:
    for key, value in (part or {}).items():
        total[key] = total.get(key, 0) + value


# --- writing messages ------------------------------------------------------------------------
def ingest(svc: Services, chat_id: str, raw: list[dict[str, Any]]) -> dict[str, Any]:
    """Upsert a batch of messages (idempotent by id) and everything that follows from it."""
    limit = svc.settings.messages_per_batch
    if len(raw) > limit:
        raise PayloadTooLarge("too_many_messages", f"A batch holds at most {limit} messages; this one "
                              f"has {len(raw)}. Send them in several batches.", [{"max": limit}])
    chat = chats.get(svc, chat_id)
    if not chat["memory_enabled"]:  # RV16: a chat with memory off keeps nothing
        return {**_outcome(chat_id, None), "memory_enabled": False, "stored": False}
    batch = messages.normalise(svc, raw)
    copied = _branch_prefix(svc.db.reader(), chat, batch)
    from_parent = set(copied)  # the parent's copies bring their vectors
    todo = [m for m in batch if m.id not in from_parent]
    vectors = {p.text: p for p in docs.prepare(
        svc, messages.texts_to_embed(svc.db.reader(), chat_id, todo), svc.embed_wait())}
    with svc.db.write() as conn:
        chat = chats.fetch(conn, chat_id)
        if chat is None:
            raise NotFound("chat_not_found", f"No chat with id {chat_id!r}; register it first.")
        if copied and _branch_prefix(conn, chat, batch) == copied:  # still empty, still unplaced
            chats.set_branch_point(conn, chat_id, copied[-1])
            svc.hooks.chat_branched.tally(svc, conn, chat_id, chat["branch_of"]["chat_id"], copied[-1])
        changes = messages.upsert(svc, conn, chat_id, chat["member_ids"], batch, vectors)
        ended = sessions.place(svc, conn, chat_id, changes.inserted)
        sessions.mark_stale(conn, chat_id, changes.edited)
        if changes.edited:
            svc.hooks.messages_edited.send(svc, conn, chat_id, changes.edited)
        enqueued = summaries.after_write(svc, conn, chat_id, changes)
    return {**_outcome(chat_id, changes), "memory_enabled": True, "stored": True,
            "sessions_ended": ended, "jobs_enqueued": enqueued}


def _branch_prefix(conn: Connection, chat: dict[str, Any], batch: list[messages.Incoming]) -> list[str]:
    """CP2b: for a branch registered without its branch point and holding no messages yet, the
    ids of this upload that repeat the parent's opening messages (the last is the branch point)."""
    link = chat["branch_of"]
    if link is None or link["message_id"] is not None or messages.count(conn, chat["id"]):
        return []
    return messages.common_prefix(conn, link["chat_id"], batch)


def _outcome(chat_id: str, changes: messages.Changes | None) -> dict[str, Any]:
    c = changes or messages.Changes()
    return {"chat_id": chat_id, "inserted": len(c.inserted), "edited": len(c.edited),
            "updated": len(c.updated), "unchanged": len(c.unchanged), "truncated_ids": c.truncated,
            "sessions_ended": [], "jobs_enqueued": 0}


# --- deleting --------------------------------------------------------------------------------
def delete_message(svc: Services, chat_id: str, message_id: str) -> dict[str, Any]:
    """Delete one message and what was derived only from it (summaries, memories, …)."""
    chats.get(svc, chat_id)
    with svc.db.write() as conn:
        row = messages.get_row(conn, chat_id, message_id)
        removed = {"messages": messages.delete_rows(conn, [row])}
        removed["summaries"] = summaries.forget_messages(svc, conn, chat_id, [row])
        sessions.mark_stale(conn, chat_id, [row])
        removed["memories"] = memories.forget_messages(svc, conn, chat_id, {message_id})
        _merge_counts(removed, svc.hooks.messages_deleted.tally(svc, conn, chat_id, [message_id]))
    return {"deleted": message_id, "chat_id": chat_id, "removed": removed}


def delete_chat(svc: Services, chat_id: str) -> dict[str, Any]:
    """Delete a chat with its messages and what was derived from them; saved memories stay
    (they belong to characters, RV4)."""
    with svc.db.write() as conn:
        if chats.fetch(conn, chat_id) is None:
            raise NotFound("chat_not_found", f"No chat with id {chat_id!r}.")
        removed = {"messages": messages.delete_chat(conn, chat_id),
                   "summaries": summaries.delete_for_chat(conn, chat_id),
                   "sessions": sessions.delete_for_chat(conn, chat_id),
                   "notes": notes.delete_for_chat(conn, chat_id),
                   "jobs": queue.delete_for_chat(conn, chat_id)}
        _merge_counts(removed, svc.hooks.chat_deleted.tally(svc, conn, chat_id))
        chats.delete(conn, chat_id)
    return {"deleted": chat_id, "removed": removed}


def rename_chat(svc: Services, chat_id: str, new_id: str) -> dict[str, Any]:
    """SillyTavern renamed a chat file: move everything keyed by the old chat id to the new one.

    Every table with a `chat_id` column follows (those of other modules too, and memories'
    provenance, so a later rollback still finds them). On purpose this asks no owner: the store
    rewrites the column wherever the schema has it (`db.rekey`), so a table added later moves
    too; only the search index, whose keys embed the chat id, is told (`docs.moved_chat`).
    """
    with svc.db.write() as conn:
        if chats.fetch(conn, chat_id) is None:
            raise NotFound("chat_not_found", f"No chat with id {chat_id!r}.")
        if new_id == chat_id:
            return chats.fetch(conn, chat_id)  # type: ignore[return-value]
        if chats.fetch(conn, new_id) is not None:
            raise Conflict("chat_exists", f"A chat with id {new_id!r} already exists.")
        chats.rename(conn, chat_id, new_id, svc.clock.iso())
        rekey(conn, "chat_id", chat_id, new_id)
        # CP1, CP2: a campaign named after the chat, and branches of it, follow the new name.
        rekey(conn, "campaign_id", chat_id, new_id)
        rekey(conn, "branch_of_chat", chat_id, new_id)
        docs.moved_chat(conn, chat_id, new_id)
        return chats.fetch(conn, new_id)  # type: ignore[return-value]


# --- rollback (RV10) -------------------------------------------------------------------------
def rollback_turn(svc: Services, conn: Connection, chat_id: str, turn_id: str) -> dict[str, int]:
    """What a regenerated turn's jobs wrote, and its jobs: summaries, notes, queued work."""
    gone = queue.rollback_turn(conn, chat_id, turn_id)  # first: a late result is then discarded
    deep_memory.release(conn, gone)
    removed: dict[str, int] = {"jobs": len(gone)}
    _merge_counts(removed, summaries.rollback_turn(svc, conn, chat_id, turn_id))
    _merge_counts(removed, notes.rollback_turn(conn, chat_id, turn_id))
    return removed


def register(jobs: JobKinds, hooks: Hooks) -> None:
    """A rolled-back turn's jobs go, with the summaries and notes they wrote (RV10)."""
    hooks.turn_rolled_back.connect(rollback_turn)
