"""The transcript: a chat's messages, stored, ordered, indexed for search (RV1, SW9a/SW9b).

Messages are keyed by (chat_id, id): SillyTavern branches copy message ids into the new chat, so
an id is unique only within its chat. Each row also has an integer `seq` (insertion order) and a
`position` (the message's index in the SillyTavern chat, or "after the last" when not given);
the transcript's order is (position, seq).

Every message is a search document (kind "message", ref_id = str(seq)) written in the same
transaction as its row, known by the chat's members at the time it was said plus its speaker:
its witnesses (SW9b). This module stores rows; `conversation.py` decides what follows from a write
(sessions, compaction, stale summaries).

Owns: messages.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

from ..clock import parse_iso, to_iso
from ..errors import NotFound, Unprocessable
from ..jobs.tasks.base import ChatMessage
from ..retrieval import docs as index
from ..services import Services
from ..store.db import Connection

KIND = "message"
ORDER = "position, seq"  # the transcript's order, everywhere


def to_dict(row: Any) -> dict[str, Any]:
    """A message as the API shows it."""
    return {
        "id": row["id"], "seq": row["seq"], "role": row["role"], "name": row["name"],
        "text": row["text"], "sent_at": row["sent_at"], "turn_id": row["turn_id"],
        "speaker_id": row["speaker_id"], "index": row["position"], "tokens": row["tokens"],
        "session_n": row["session_n"], "summary_id": row["summary_id"],
        "created_at": row["created_at"], "updated_at": row["updated_at"], "version": row["version"],
    }


def chat_message(svc: Services, row: Any) -> ChatMessage:
    """A message as a job's prompt sees it; a very long one is cut (its start kept)."""
    limit = svc.settings.prompt_message_max_tokens
    text = row["text"] if row["tokens"] <= limit else svc.tokens.truncate(row["text"], limit)
    return ChatMessage(id=row["id"], speaker=row["name"] or row["role"], text=text,
                       role=row["role"], character_id=row["speaker_id"], sent_at=row["sent_at"])


# --- reading ---------------------------------------------------------------------------------
def fetch(conn: Connection, chat_id: str, message_id: str) -> Any:
    return conn.execute("SELECT * FROM messages WHERE chat_id=? AND id=?",
                        (chat_id, message_id)).fetchone()


def get_row(conn: Connection, chat_id: str, message_id: str) -> Any:
    row = fetch(conn, chat_id, message_id)
    if row is None:
        raise NotFound("message_not_found", f"No message {message_id!r} in chat {chat_id!r}.")
    return row


def newest(conn: Connection, chat_id: str, limit: int) -> list[Any]:
    """The newest `limit` messages, newest first."""
    return conn.execute("SELECT * FROM messages WHERE chat_id=? ORDER BY position DESC, seq DESC"
                        " LIMIT ?", (chat_id, limit)).fetchall()


def last_id(conn: Connection, chat_id: str) -> str | None:
    """The id of a chat's last message in transcript order (None for an empty chat)."""
    row = conn.execute("SELECT id FROM messages WHERE chat_id=? ORDER BY position DESC, seq DESC LIMIT 1",
                       (chat_id,)).fetchone()
    return None if row is None else row[0]


def ordered(conn: Connection, chat_id: str, where: str = "1", args: Sequence[Any] = ()) -> list[Any]:
    """Messages of a chat matching an extra SQL condition, in transcript order."""
    return conn.execute(f"SELECT * FROM messages WHERE chat_id=? AND ({where}) ORDER BY {ORDER}",
                        (chat_id, *args)).fetchall()


def newest_within(rows: Sequence[Any], budget: int, limit: int) -> list[Any]:
    """The newest of `rows` whose tokens (each counted at most `limit`) fit in `budget`, oldest
    first; always at least the newest one (a prompt reads the latest message whatever its size)."""
    kept: list[Any] = []
    used = 0
    for row in reversed(rows):
        cost = min(row["tokens"], limit)
        if kept and used + cost > budget:
            break
        kept.append(row)
        used += cost
    return kept[::-1]


def by_ids(conn: Connection, chat_id: str, ids: Iterable[str]) -> list[Any]:
    """The messages with these ids (those that exist), in transcript order."""
    wanted = list(dict.fromkeys(ids))
    if not wanted:
        return []
    marks = ",".join("?" * len(wanted))
    return ordered(conn, chat_id, f"id IN ({marks})", wanted)


def speaker_names(conn: Connection, chat_id: str, message_ids: Sequence[str]) -> dict[str, str]:
    """The speaker's name (or role) of some messages of a chat, by message id."""
    if not message_ids:
        return {}
    marks = ",".join("?" * len(message_ids))
    return {r[0]: r[1] or r[2] for r in conn.execute(
        f"SELECT id, name, role FROM messages WHERE chat_id=? AND id IN ({marks})", [chat_id, *message_ids])}


def ids(conn: Connection, chat_id: str) -> list[str]:
    """The ids of a chat's messages (in no particular order)."""
    return [r[0] for r in conn.execute("SELECT id FROM messages WHERE chat_id=?", (chat_id,))]


def ids_of_turn(conn: Connection, chat_id: str, turn_id: str) -> list[str]:
    """The ids of the messages one turn wrote."""
    return [r[0] for r in conn.execute("SELECT id FROM messages WHERE chat_id=? AND turn_id=?",
                                       (chat_id, turn_id))]


def in_order(conn: Connection, chat_id: str, message_ids: Iterable[str]) -> list[str]:
    """These ids in transcript order; ids of no stored message first, as given."""
    wanted = list(dict.fromkeys(message_ids))
    if not wanted:
        return []
    marks = ",".join("?" * len(wanted))
    found = [r[0] for r in conn.execute(f"SELECT id FROM messages WHERE chat_id=? AND id IN ({marks})"
                                        f" ORDER BY {ORDER}", (chat_id, *wanted))]
    stored = set(found)
    return [m for m in wanted if m not in stored] + found


def count_by_session(conn: Connection, chat_id: str) -> dict[int, int]:
    """How many messages each session of a chat holds."""
    return dict(conn.execute("SELECT session_n, count(*) FROM messages WHERE chat_id=? AND"
                             " session_n IS NOT NULL GROUP BY session_n", (chat_id,)).fetchall())


def count_by_summary(conn: Connection, chat_id: str) -> dict[str | None, int]:
    """How many messages of a chat each recent summary covers (None: no summary yet)."""
    return dict(conn.execute("SELECT summary_id, count(*) FROM messages WHERE chat_id=?"
                             " GROUP BY summary_id", (chat_id,)).fetchall())


def reply_speakers(conn: Connection, chat_id: str) -> Iterable[Any]:
    """(name, speaker_id, session_n) of every reply of a chat, in transcript order (read lazily:
    a long chat has many)."""
    return conn.execute("SELECT name, speaker_id, session_n FROM messages WHERE chat_id=? AND"
                        f" role='assistant' ORDER BY {ORDER}", (chat_id,))


def session_speakers(conn: Connection, chat_id: str, n: int) -> list[str]:
    """The registered speakers of one session of a chat."""
    return [r[0] for r in conn.execute("SELECT DISTINCT speaker_id FROM messages WHERE chat_id=?"
                                       " AND session_n=? AND speaker_id IS NOT NULL", (chat_id, n))]


def list_page(svc: Services, chat_id: str, *, offset: int = 0, limit: int | None = None,
              ids_only: bool = False) -> dict[str, Any]:
    """One page of the transcript in order (or just the ids, for the extension's reconciliation)."""
    cap = svc.settings.messages_page_max * (10 if ids_only else 1)
    limit = min(cap, limit or cap)
    with svc.db.read() as conn:
        total = count(conn, chat_id)
        if ids_only:
            ids = [r[0] for r in conn.execute(
                f"SELECT id FROM messages WHERE chat_id=? ORDER BY {ORDER} LIMIT ? OFFSET ?",
                (chat_id, limit, offset))]
            return {"ids": ids, "total": total, "offset": offset, "limit": limit}
        rows = conn.execute(f"SELECT * FROM messages WHERE chat_id=? ORDER BY {ORDER} LIMIT ? OFFSET ?",
                            (chat_id, limit, offset)).fetchall()
    return {"messages": [to_dict(r) for r in rows], "total": total, "offset": offset, "limit": limit}


# --- writing ---------------------------------------------------------------------------------
@dataclass
class Incoming:
    """A message as a client sent it, normalised: text cut to the limit, time in our ISO form."""

    id: str
    role: str
    name: str
    text: str
    sent_at: str | None  # None: when it arrived (a new message) or as stored (a re-sent one)
    turn_id: str | None
    speaker_id: str | None
    position: int | None
    tokens: int
    truncated: bool


@dataclass
class Changes:
    """What one upsert did, by message: the rows written, in the order they were given."""

    inserted: list[Any] = field(default_factory=list)
    edited: list[Any] = field(default_factory=list)  # text changed: derived summaries go stale
    updated: list[Any] = field(default_factory=list)  # only metadata changed (turn, name, index…)
    unchanged: list[str] = field(default_factory=list)
    truncated: list[str] = field(default_factory=list)

    @property
    def written(self) -> list[Any]:
        return self.inserted + self.edited + self.updated


def normalise(svc: Services, raw: Sequence[dict[str, Any]]) -> list[Incoming]:
    """Cut long texts (never refuse them), parse times, count tokens; later repeats of an id win."""
    limit = svc.settings.message_max_chars
    last: dict[str, dict[str, Any]] = {}
    for message in raw:
        last.pop(message["id"], None)
        last[message["id"]] = message
    out = []
    for message in last.values():
        text = message["text"]
        out.append(Incoming(
            id=message["id"], role=message["role"], name=message.get("name") or "",
            text=text[:limit], sent_at=_when(svc, message.get("sent_at")),
            turn_id=message.get("turn_id"), speaker_id=message.get("speaker_id"),
            position=message.get("index"), tokens=svc.tokens.count(text[:limit]),
            truncated=len(text) > limit))
    return out


def _when(svc: Services, sent_at: str | None) -> str | None:
    if sent_at is None:
        return None
    try:
        return to_iso(parse_iso(sent_at))
    except ValueError:
        raise Unprocessable("invalid_timestamp", f"sent_at {sent_at[:60]!r} is not an ISO 8601 time "
                            "(e.g. 2026-03-01T12:00:00Z).") from None


def texts_to_embed(conn: Connection, chat_id: str, batch: Sequence[Incoming]) -> list[str]:
    """Texts of the batch that are new or changed (the ones needing a vector)."""
    out = []
    for message in batch:
        row = fetch(conn, chat_id, message.id)
        if row is None or row["text"] != message.text:
            out.append(message.text)
    return list(dict.fromkeys(out))


def upsert(svc: Services, conn: Connection, chat_id: str, members: Sequence[str],
           batch: Sequence[Incoming], vectors: dict[str, index.Prepared]) -> Changes:
    """Insert or update a batch inside a write transaction; index what is new or edited."""
    changes = Changes(truncated=[m.id for m in batch if m.truncated])
    now = svc.clock.iso()
    next_position = _next_position(conn, chat_id)
    for message in batch:
        row = fetch(conn, chat_id, message.id)
        if row is None:
            position = message.position if message.position is not None else next_position
            next_position = max(next_position, position + 1)
            changes.inserted.append(_insert(svc, conn, chat_id, members, message, position, now, vectors))
            continue
        outcome = _update(svc, conn, row, message, now, vectors)
        if outcome == "unchanged":
            changes.unchanged.append(message.id)
        else:
            getattr(changes, outcome).append(fetch(conn, chat_id, message.id))
            if message.position is not None:
                next_position = max(next_position, message.position + 1)
    return changes


def _next_position(conn: Connection, chat_id: str) -> int:
    value = conn.execute("SELECT max(position) FROM messages WHERE chat_id=?", (chat_id,)).fetchone()[0]
    return 0 if value is None else value + 1


def _vector(svc: Services, vectors: dict[str, index.Prepared], text: str) -> index.Prepared:
    # Normally prepared before the transaction; a concurrent edit may bring a text we did not see.
    if text not in vectors:
        vectors[text] = index.prepare(svc, [text], svc.embed_wait())[0]
    return vectors[text]


def session_key(chat_id: str, session_n: int | None) -> str:
    """A message's neighbour group for search: its chat's session ("<chat>#<n>"; "<chat>#" before
    one). The chat is everything before the last "#", so two chats never share a key."""
    return f"{chat_id}#{'' if session_n is None else session_n}"


def _index(conn: Connection, row: Any, prepared: index.Prepared, known_by: Iterable[str]) -> None:
    """The message's search entry, from its stored row (SW6): speaker, place, date, itself as source."""
    index.put(conn, KIND, str(row["seq"]), prepared, created_at=row["sent_at"], chat_id=row["chat_id"],
              character_id=row["speaker_id"], known_by=known_by,
              session_key=session_key(row["chat_id"], row["session_n"]), position=row["position"],
              speaker_name=row["name"] or row["role"], source_message_ids=[row["id"]])


def _insert(svc: Services, conn: Connection, chat_id: str, members: Sequence[str], m: Incoming,
            position: int, now: str, vectors: dict[str, index.Prepared]) -> Any:
    sent_at = m.sent_at or now
    conn.execute(
        "INSERT INTO messages(chat_id, id, role, name, text, sent_at, turn_id, speaker_id, position,"
        " tokens, created_at, updated_at) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
        (chat_id, m.id, m.role, m.name, m.text, sent_at, m.turn_id, m.speaker_id, position,
         m.tokens, now, now))
    witnesses = [*members, m.speaker_id] if m.speaker_id else list(members)
    row = fetch(conn, chat_id, m.id)
    _index(conn, row, _vector(svc, vectors, m.text), witnesses)
    return row


def _update(svc: Services, conn: Connection, row: Any, m: Incoming, now: str,
            vectors: dict[str, index.Prepared]) -> str:
    """'edited', 'updated' or 'unchanged'. Re-sending the same message changes nothing."""
    position = row["position"] if m.position is None else m.position
    turn_id = m.turn_id if m.turn_id is not None else row["turn_id"]
    speaker_id = m.speaker_id if m.speaker_id is not None else row["speaker_id"]
    sent_at = m.sent_at or row["sent_at"]
    new = (m.role, m.name, m.text, sent_at, turn_id, speaker_id, position)
    old = tuple(row[k] for k in ("role", "name", "text", "sent_at", "turn_id", "speaker_id", "position"))
    if new == old:
        return "unchanged"
    edited = m.text != row["text"]
    conn.execute(
        "UPDATE messages SET role=?, name=?, text=?, sent_at=?, turn_id=?, speaker_id=?, position=?,"
        " tokens=?, updated_at=?, version=version+1 WHERE seq=?",
        (*new, m.tokens if edited else row["tokens"], now, row["seq"]))
    # The witnesses stay those of when it was said (plus a newly named speaker).
    known = set(_known_by(conn, row["seq"]) or [])
    if speaker_id:
        known.add(speaker_id)
    if edited:
        _index(conn, fetch(conn, row["chat_id"], row["id"]), _vector(svc, vectors, m.text), known)
    else:
        index.update_meta(conn, KIND, str(row["seq"]), character_id=speaker_id, known_by=known,
                          position=position, speaker_name=m.name or m.role, created_at=sent_at)
    return "edited" if edited else "updated"


def _known_by(conn: Connection, seq: int) -> list[str] | None:
    return index.entry_known_by(conn, KIND, str(seq))[1]


def delete_rows(conn: Connection, rows: Sequence[Any]) -> int:
    """Delete messages and their index entries (inside a write)."""
    index.remove(conn, KIND, [str(r["seq"]) for r in rows])
    conn.executemany("DELETE FROM messages WHERE seq=?", [(r["seq"],) for r in rows])
    return len(rows)


def delete_chat(conn: Connection, chat_id: str) -> int:
    """Delete every message of a chat and their index entries (inside a write)."""
    return delete_rows(conn, conn.execute("SELECT seq FROM messages WHERE chat_id=?", (chat_id,)).fetchall())


# --- what other concepts mark on a message (inside their writes) ------------------------------
def set_session(conn: Connection, row: Any, n: int) -> None:
    """The message belongs to session n of its chat (sessions.py, SW2); its search entry's
    neighbour group follows."""
    conn.execute("UPDATE messages SET session_n=? WHERE seq=?", (n, row["seq"]))
    index.update_meta(conn, KIND, str(row["seq"]), session_key=session_key(row["chat_id"], n))


def copy_prefix(conn: Connection, parent_id: str, branch_id: str, upto: Any) -> tuple[dict[int, int], set[str]]:
    """CP2: copy the parent's messages up to and including `upto` (a row) into an empty branch,
    with their search entries and vectors (never embedded again), their sessions and their
    deep-memory marks (what was read is not read again); their summaries are summaries' to map.
    Returns ({parent seq: branch seq}, the copied messages' ids)."""
    upto_args = (upto["position"], upto["position"], upto["seq"])
    before = "(position < ? OR (position = ? AND seq <= ?))"
    columns = ", ".join(c[1] for c in conn.execute("PRAGMA table_info(messages)")
                        if c[1] not in ("seq", "chat_id", "summary_id"))
    # Set-based: a branch of thousands of messages is copied in a few statements.
    conn.execute(f"INSERT INTO messages(chat_id, {columns}) SELECT ?, {columns} FROM messages"
                 f" WHERE chat_id=? AND {before} ORDER BY {ORDER}", (branch_id, parent_id, *upto_args))
    rows = conn.execute("SELECT p.seq, b.seq, p.id FROM messages p JOIN messages b ON b.chat_id=?"
                        " AND b.id = p.id WHERE p.chat_id=? AND (p.position < ? OR (p.position = ?"
                        " AND p.seq <= ?))", (branch_id, parent_id, *upto_args)).fetchall()
    seqs = {int(r[0]): int(r[1]) for r in rows}
    index.copy_many(conn, KIND, [(str(a), str(b)) for a, b in seqs.items()], chat_id=branch_id,
                    from_chat=parent_id)
    return seqs, {r[2] for r in rows}


def common_prefix(conn: Connection, parent_id: str, batch: Sequence[Incoming]) -> list[str]:
    """CP2b: the ids of a branch's first upload that repeat its parent's opening messages (the same
    id and text, in transcript order, from the first message on), in order; the last is the branch
    point. A message whose text differs (a branch made from a swipe) ends it."""
    given = list(batch)
    if all(m.position is not None for m in given):
        given.sort(key=lambda m: m.position)  # type: ignore[arg-type, return-value]
    parent = conn.execute(f"SELECT id, text FROM messages WHERE chat_id=? ORDER BY {ORDER} LIMIT ?",
                          (parent_id, len(given))).fetchall()
    out = []
    for row, message in zip(parent, given):
        if row["id"] != message.id or row["text"] != message.text:
            break
        out.append(message.id)
    return out


def copied_summaries(conn: Connection, parent_id: str, branch_id: str, mapping: dict[str, str]) -> None:
    """The branch's copied messages are covered by the copies of their parent's summaries."""
    rows = conn.execute("SELECT id, summary_id FROM messages WHERE chat_id=? AND summary_id IS NOT NULL",
                        (parent_id,)).fetchall()
    conn.executemany("UPDATE messages SET summary_id=? WHERE chat_id=? AND id=?",
                     [(mapping[r["summary_id"]], branch_id, r["id"]) for r in rows if r["summary_id"] in mapping])


def count(conn: Connection, chat_id: str) -> int:
    """How many messages a chat holds."""
    return int(conn.execute("SELECT count(*) FROM messages WHERE chat_id=?", (chat_id,)).fetchone()[0])


def set_summary(conn: Connection, rows: Sequence[Any], summary_id: str) -> None:
    """These messages are covered by a recent summary (summaries.py, RV3)."""
    conn.executemany("UPDATE messages SET summary_id=? WHERE seq=?", [(summary_id, r["seq"]) for r in rows])


def unsummarize(conn: Connection, summary_id: str) -> None:
    """The messages a deleted summary covered are covered by none."""
    conn.execute("UPDATE messages SET summary_id=NULL WHERE summary_id=?", (summary_id,))


def clear_summaries(conn: Connection, chat_id: str) -> None:
    """No message of the chat is covered by a summary (before a rebuild)."""
    conn.execute("UPDATE messages SET summary_id=NULL WHERE chat_id=?", (chat_id,))


def mark_deep_read(conn: Connection, rows: Sequence[Any], job_id: str) -> None:
    """A deep-memory run reads these messages (deep_memory.py, RV13)."""
    conn.executemany("UPDATE messages SET deep_job=? WHERE seq=?", [(job_id, r["seq"]) for r in rows])


def release_deep_read(conn: Connection, job_ids: Sequence[str]) -> None:
    """Messages read by these (rolled-back) deep-memory runs may be read again."""
    conn.executemany("UPDATE messages SET deep_job=NULL WHERE deep_job=?", [(j,) for j in job_ids])


def mark_memories_read(conn: Connection, rows: Sequence[Any], reader: str) -> None:
    """A character-memory run (a job id, or episodes.SESSION_READ) reads these messages (SW4)."""
    conn.executemany("UPDATE messages SET memories_job=? WHERE seq=?", [(reader, r["seq"]) for r in rows])


def release_memories_read(conn: Connection, chat_id: str, job_ids: Sequence[str]) -> None:
    """Messages read by these (rolled-back) character-memory runs may be read again."""
    conn.executemany("UPDATE messages SET memories_job=NULL WHERE chat_id=? AND memories_job=?",
                     [(chat_id, j) for j in job_ids])
