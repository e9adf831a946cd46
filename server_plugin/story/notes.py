"""Campaign notes (rule SW3): the game master's open narrative threads, per chat, with a priority.

A note is written by a person (`source` user) or proposed by the session-end job (`source` job),
which may also mark open notes resolved. Priority runs 1–5, 5 the most pressing; the context
assembler reads the open ones, most pressing first (`open_notes`).

Owns: notes.
"""

from __future__ import annotations

import uuid
from typing import Any, Sequence

from ..core.text import fold
from ..errors import Conflict, NotFound, Unprocessable
from ..services import Services
from ..store.db import Connection
from . import chats

DEFAULT_PRIORITY = 3
ORDER = "priority DESC, updated_at DESC, id"


def to_dict(row: Any) -> dict[str, Any]:
    return {
        "id": row["id"], "chat_id": row["chat_id"], "text": row["text"], "status": row["status"],
        "priority": row["priority"], "source": row["source"], "session_n": row["session_n"],
        "created_at": row["created_at"], "updated_at": row["updated_at"],
        "resolved_at": row["resolved_at"], "version": row["version"],
    }


def _fetch(conn: Connection, note_id: str) -> Any:
    row = conn.execute("SELECT * FROM notes WHERE id=?", (note_id,)).fetchone()
    if row is None:
        raise NotFound("note_not_found", f"No note with id {note_id!r}.")
    return row


def get(svc: Services, note_id: str) -> dict[str, Any]:
    return to_dict(_fetch(svc.db.reader(), note_id))


def list_notes(svc: Services, chat_id: str, status: str | None = None) -> list[dict[str, Any]]:
    """A chat's notes, open before resolved, most pressing first."""
    chats.get(svc, chat_id)
    where, args = ("AND status=?", [status]) if status else ("", [])
    rows = svc.db.reader().execute(f"SELECT * FROM notes WHERE chat_id=? {where}"
                                   f" ORDER BY status='resolved', {ORDER}", (chat_id, *args))
    return [to_dict(r) for r in rows]


def open_notes(svc: Services, chat_id: str, limit: int | None = None) -> list[dict[str, Any]]:
    """The chat's open notes, most pressing first (for the context assembler, SW3)."""
    return open_rows(svc.db.reader(), chat_id, limit)


def open_rows(conn: Connection, chat_id: str, limit: int | None = None) -> list[dict[str, Any]]:
    rows = conn.execute(f"SELECT * FROM notes WHERE chat_id=? AND status='open' ORDER BY {ORDER}"
                        " LIMIT ?", (chat_id, -1 if limit is None else limit))
    return [to_dict(r) for r in rows]


def _check_text(svc: Services, text: str) -> str:
    limit = svc.settings.note_max_chars
    if not text.strip():
        raise Unprocessable("text_empty", "A note needs some text.")
    if len(text) > limit:
        raise Unprocessable("text_too_long", f"A note holds at most {limit} characters; this one has "
                            f"{len(text)}.", [{"max": limit, "length": len(text)}])
    return text.strip()


def create(svc: Services, chat_id: str, data: dict[str, Any]) -> dict[str, Any]:
    """A person's note."""
    text = _check_text(svc, data["text"])
    chats.get(svc, chat_id)
    with svc.db.write() as conn:
        note_id = _insert(svc, conn, chat_id, text, int(data.get("priority", DEFAULT_PRIORITY)),
                          "user", status=data.get("status", "open"))
        return to_dict(_fetch(conn, note_id))


def _insert(svc: Services, conn: Connection, chat_id: str, text: str, priority: int, source: str, *,
            status: str = "open", session_n: int | None = None, turn_id: str | None = None,
            job_id: str | None = None) -> str:
    note_id = "n_" + uuid.uuid4().hex
    now = svc.clock.iso()
    conn.execute("INSERT INTO notes(id, chat_id, text, status, priority, source, session_n, turn_id,"
                 " job_id, created_at, updated_at, resolved_at) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
                 (note_id, chat_id, text, status, priority, source, session_n, turn_id, job_id, now, now,
                  now if status == "resolved" else None))
    return note_id


def update(svc: Services, note_id: str, data: dict[str, Any]) -> dict[str, Any]:
    """Edit text, priority or status (optimistic `version`)."""
    text = _check_text(svc, data["text"]) if "text" in data else None
    with svc.db.write() as conn:
        row = _fetch(conn, note_id)
        if "version" in data and data["version"] != row["version"]:
            raise Conflict("version_conflict", f"Note {note_id} was changed meanwhile (version "
                           f"{row['version']}, you sent {data['version']}); reload and retry.",
                           [{"current_version": row["version"]}])
        status = data.get("status", row["status"])
        now = svc.clock.iso()
        resolved_at = row["resolved_at"] if status == row["status"] else (now if status == "resolved" else None)
        conn.execute("UPDATE notes SET text=?, priority=?, status=?, resolved_at=?, updated_at=?,"
                     " version=version+1 WHERE id=?",
                     (text or row["text"], data.get("priority", row["priority"]), status, resolved_at,
                      now, note_id))
        return to_dict(_fetch(conn, note_id))


def delete(svc: Services, note_id: str) -> dict[str, Any]:
    with svc.db.write() as conn:
        _fetch(conn, note_id)
        conn.execute("DELETE FROM notes WHERE id=?", (note_id,))
    return {"deleted": note_id}


def apply_session(svc: Services, conn: Connection, chat_id: str, proposals: Sequence[Any],
                  resolved_ids: Sequence[str], *, session_n: int, turn_id: str | None,
                  job_id: str) -> dict[str, list[str]]:
    """What a session-end job says about the notes: new open threads (a thread already noted, by
    the same words, is not added twice) and open notes now resolved. Inside a write."""
    known = {fold(r[0]) for r in conn.execute("SELECT text FROM notes WHERE chat_id=?", (chat_id,))}
    added = []
    for proposal in proposals:
        if fold(proposal.text) in known:
            continue
        known.add(fold(proposal.text))
        text = proposal.text[:svc.settings.note_max_chars]
        added.append(_insert(svc, conn, chat_id, text, int(proposal.priority), "job",
                             session_n=session_n, turn_id=turn_id, job_id=job_id))
    now = svc.clock.iso()
    resolved = []
    for note_id in resolved_ids:
        changed = conn.execute("UPDATE notes SET status='resolved', resolved_at=?, updated_at=?,"
                               " version=version+1 WHERE id=? AND chat_id=? AND status='open'",
                               (now, now, note_id, chat_id)).rowcount
        if changed:
            resolved.append(note_id)
    return {"notes_added": added, "notes_resolved": resolved}


def rollback_turn(conn: Connection, chat_id: str, turn_id: str) -> dict[str, int]:
    """RV10: notes a regenerated turn's jobs proposed go (a person's notes never do)."""
    return {"notes": conn.execute("DELETE FROM notes WHERE chat_id=? AND turn_id=? AND source='job'",
                                  (chat_id, turn_id)).rowcount}


def delete_for_chat(conn: Connection, chat_id: str) -> int:
    return conn.execute("DELETE FROM notes WHERE chat_id=?", (chat_id,)).rowcount
