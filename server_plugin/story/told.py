"""Told events (SW9b): where a character passes on, in a scene, something only some of those
present knew, the listeners come to know it too.

A `told_events` job is queued for each part of an ended session with at least two characters
present (episodes.queue_session). It is shown the secrets related to the part (some of the cast
know them, some not) and proposes who told what to whom, citing the message as evidence. An event
is recorded only when its evidence is verbatim in that message (SW8), its teller knows the item,
and a listener present did not know it yet; the listeners are then added to the item's known_by
and its source messages' (`visibility.tell`). Editing or deleting the evidence message, rolling
back its turn, or deleting its chat undoes the event (`visibility.untell`).

Owns: told_events.
"""

from __future__ import annotations

import uuid
from collections import Counter
from dataclasses import asdict
from typing import TYPE_CHECKING, Any, Sequence

from ..core.quotes import Quote, verify_quotes
from ..core.text import RELATED_STOP_WORDS, content_words
from ..hooks import Hooks
from ..jobs import queue
from ..jobs.queue import JobKinds
from ..jobs.tasks.told import SecretInput, told_events
from ..retrieval import visibility
from ..retrieval.visibility import ItemRef
from ..services import Services
from ..store.db import Connection, dumps, loads
from . import characters, chats, extraction, messages

if TYPE_CHECKING:
    from ..jobs.tasks.base import CharacterRef, Extraction, Prompt

JOB = "told_events"


# --- rows ------------------------------------------------------------------------------------
def told_to_dict(row: Any) -> dict[str, Any]:
    return {"id": row["id"], "chat_id": row["chat_id"], "session": row["session_n"],
            "teller_id": row["teller_id"], "listener_ids": loads(row["listener_ids"]),
            "item": {"kind": row["item_kind"], "ref": row["item_ref"]},
            "message_id": row["message_id"], "evidence": loads(row["evidence"]),
            "job_id": row["job_id"], "turn_id": row["turn_id"], "created_at": row["created_at"]}


def list_told(svc: Services, *, chat_id: str | None = None, character_id: str | None = None,
              limit: int | None = None) -> list[dict[str, Any]]:
    """Told events (SW9b), oldest first; `character_id`: those it told or was told."""
    where, args = ["1"], []
    if chat_id is not None:
        where.append("chat_id=?")
        args.append(chat_id)
    if character_id is not None:
        where.append("(teller_id=? OR EXISTS (SELECT 1 FROM json_each(listener_ids) WHERE value=?))")
        args += [character_id, character_id]
    cap = svc.settings.episodes_list_max
    rows = svc.db.reader().execute(f"SELECT * FROM told_events WHERE {' AND '.join(where)}"
                                   " ORDER BY created_at, id LIMIT ?", (*args, min(cap, limit or cap)))
    return [told_to_dict(r) for r in rows]


# --- the job ---------------------------------------------------------------------------------
def related_secrets(svc: Services, conn: Connection, cast: Sequence[CharacterRef],
                    rows: Sequence[Any]) -> list[visibility.Secret]:
    """The secrets (some of the cast know them, some not) sharing the most words with the
    messages, at most `told_secrets_max`, newest first among equals. Names do not count."""
    names = [n for c in cast for n in (c.name, *c.aliases)]
    said = content_words(" ".join(r["text"] for r in rows), RELATED_STOP_WORDS, names)
    scored = []
    for secret in visibility.secrets_among(conn, [c.id for c in cast]):
        overlap = len(content_words(secret.text, RELATED_STOP_WORDS, names) & said)
        if overlap:
            scored.append((overlap, secret.updated_at, secret))
    scored.sort(key=lambda x: (x[0], x[1]), reverse=True)
    return [s for _, _, s in scored[:svc.settings.told_secrets_max]]


def _build_told(svc: Services, job: queue.Job) -> Prompt | None:
    found = extraction.job_inputs(svc, job)
    if found is None:
        return None
    conn, rows, cast = found
    if len(cast) < 2:
        return None
    secrets = related_secrets(svc, conn, cast, rows)
    if not secrets:
        return None  # nothing anyone here could pass on
    limit = svc.settings.told_secret_tokens
    inputs = [SecretInput(s.item.key(), svc.tokens.truncate(s.text, limit), s.knowers)
              for s in secrets]
    return told_events(extraction.chat_messages(svc, rows), cast, inputs,
                       max_events=svc.settings.told_events_max)


def _apply_told(svc: Services, conn: Connection, job: queue.Job, result: Extraction,
                prepared: Any) -> dict[str, Any]:
    """Record each told event whose evidence is verbatim in its message (SW8) and whose teller
    knows the item; the listeners (present at that message, learning, not knowing it yet) are
    added to the item's known_by and its source messages' (SW9b)."""
    if not chats.memory_enabled(conn, job.chat_id):
        return {"skipped": "memory is switched off for this chat (RV16)"}
    out = extraction.Checked(dropped_quotes=list(result.dropped_quotes), dropped=list(result.dropped_items))
    told, granted = [], Counter()
    for event in result.items:
        item = ItemRef.parse(event.secret_id)
        message = messages.fetch(conn, job.chat_id, event.evidence.message_id)
        check = verify_quotes([event.evidence], {message["id"]: message["text"]} if message else {})
        if not check.kept:
            out.dropped_quotes += check.dropped
            out.dropped.append(f"evidence not found in the message: {event.evidence.text[:80]}")
            continue
        if not visibility.knows(conn, event.teller_id, item):
            out.dropped.append(f"{event.teller_id} does not know {item.key()}")
            continue
        present = set(visibility.witnesses(conn, job.chat_id, [message["id"]]))
        listeners = [c for c in event.listener_ids
                     if c in present and c != event.teller_id and characters.learning_enabled(conn, c)
                     and not visibility.knows(conn, c, item)]
        if not listeners:
            out.dropped.append(f"no listener present who did not know {item.key()} already")
            continue
        told_id = "k_" + uuid.uuid4().hex
        conn.execute(
            "INSERT INTO told_events(id, chat_id, session_n, teller_id, listener_ids, item_kind,"
            " item_ref, message_id, evidence, job_id, turn_id, created_at) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
            (told_id, job.chat_id, message["session_n"], event.teller_id, dumps(listeners), item.kind,
             item.ref, message["id"], dumps(asdict(check.kept[0])), job.id, job.turn_id, svc.clock.iso()))
        granted.update(visibility.tell(svc, conn, [item, *visibility.sources_of(conn, item)],
                                       listeners, told_id))
        told.append(told_id)
    return {"told": told, "granted": dict(granted), **out.report()}


# --- branches (CP2) ---------------------------------------------------------------------------
def copy_for_branch(conn: Connection, parent_id: str, branch_id: str, copied: set[str],
                    refs: dict[tuple[str, str], str]) -> int:
    """CP2: the parent's told events whose evidence message was copied (`copied`: their ids) are
    the branch's too, each with its grants under the copy's id, so that undoing the parent's
    (deleting the parent, a rollback there) leaves what the branch's listeners know. `refs` maps
    (item kind, parent ref) to the branch copy's ref; an item not copied keeps its ref (it lives
    outside the parent chat, and the branch's telling grants it as the parent's did). Returns
    how many events were copied."""
    events = [r for r in conn.execute("SELECT * FROM told_events WHERE chat_id=?", (parent_id,)).fetchall()
              if r["message_id"] in copied]
    for r in events:
        new_id = chats.branch_ref(branch_id, r["id"])
        values = {**dict(r), "id": new_id, "chat_id": branch_id,
                  "item_ref": refs.get((r["item_kind"], r["item_ref"]), r["item_ref"])}
        conn.execute(f"INSERT INTO told_events({', '.join(values)}) VALUES ({','.join('?' * len(values))})",
                     tuple(values.values()))
        visibility.copy_grants(conn, r["id"], new_id, refs)
    return len(events)


# --- undoing (SW9b, RV10) ----------------------------------------------------------------------
def _undo(svc: Services, conn: Connection, told_ids: Sequence[str]) -> None:
    """Take back what these events granted (visibility.untell), then delete them."""
    visibility.untell(svc, conn, told_ids)
    ids = list(dict.fromkeys(told_ids))
    if ids:
        conn.execute(f"DELETE FROM told_events WHERE id IN ({','.join('?' * len(ids))})", ids)


def _untell(svc: Services, conn: Connection, where: str, args: Sequence[Any]) -> int:
    told = [r[0] for r in conn.execute(f"SELECT id FROM told_events WHERE {where}", args)]
    _undo(svc, conn, told)
    return len(told)


def untell_messages(svc: Services, conn: Connection, chat_id: str, gone: set[str]) -> int:
    """The told events whose evidence message is gone are undone; returns how many."""
    marks = ",".join("?" * len(gone))
    return _untell(svc, conn, f"chat_id=? AND message_id IN ({marks})", (chat_id, *gone))


def untell_chat(svc: Services, conn: Connection, chat_id: str) -> int:
    """A deleted chat's scenes never happened: its told events are undone."""
    return _untell(svc, conn, "chat_id=?", (chat_id,))


def untell_turn(svc: Services, conn: Connection, chat_id: str, turn_id: str) -> int:
    """A rolled-back turn's jobs' told events are undone (RV10)."""
    return _untell(svc, conn, "chat_id=? AND turn_id=?", (chat_id, turn_id))


def recheck_evidence(svc: Services, conn: Connection, chat_id: str, texts: dict[str, str]) -> None:
    """Edited messages: a told event whose evidence is no longer in its message is undone."""
    marks = ",".join("?" * len(texts))
    told = conn.execute(f"SELECT id, evidence FROM told_events WHERE chat_id=? AND message_id IN ({marks})",
                        (chat_id, *texts)).fetchall()
    _undo(svc, conn, [t["id"] for t in told
                      if not verify_quotes([Quote(**loads(t["evidence"]))], texts).kept])


def register(jobs: JobKinds, hooks: Hooks) -> None:
    """The told-events job (queued with the session's other extraction jobs by episodes)."""
    jobs.register(JOB, _apply_told, build=_build_told)
