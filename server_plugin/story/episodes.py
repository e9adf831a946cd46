"""Character memories (SW4), scene summaries (SW5) and their verified quotes (SW8).

When a session ends (`hooks.session_ended`), its transcript is read in parts of at most
`episodes_prompt_max_tokens` and three kinds of job are queued per part:
- `character_memories`, one per character present who may learn (RV14; players are not
  extracted): that character's own memories of the scene — summary from its point of view,
  feeling, verbatim quotes, participants, importance 1–5, source messages;
- `scene_summaries`: the scenes in detail, with quotes;
- `told_events` (told.py): where a character passes on something only some of those present knew.
A deep-memory run (`hooks.deep_memory_ran`, RV13) also queues one `character_memories` job for its
chunk (at most `episodes_deep_per_character` per character). A message read by either is marked
(`messages.memories_job`), so the other does not file the same moments again.

What a job stores is checked again inside the transaction that stores it: every quote must occur
verbatim in the current text of the message it cites (SW8, `quotes.verify_quotes`); one that does
not is dropped and counted (`dropped_quotes` in the job's result). Every item is known by the
witnesses of its source messages (`visibility.witnesses`); a told event adds its listeners to
what they were told (`visibility.tell`). Items are written with their index entries (kinds
`character_memory`, `scene_summary`) in one transaction.

Provenance: each item records its source messages (`episode_sources`), the job and the turn that
wrote it. Rolling back a turn removes what its jobs wrote and what was derived only from that
turn's messages; deleting a message removes the items derived only from it, and items citing
other messages too lose that id and the quotes from it (their text is re-indexed); a told event
whose evidence message goes is undone.

Owns: episodes, episode_sources.
"""

from __future__ import annotations

import uuid
from dataclasses import asdict
from typing import TYPE_CHECKING, Any, Iterable, Sequence

from ..core.quotes import Quote, verify_quotes
from ..errors import NotFound
from ..hooks import Hooks
from ..jobs import batch, queue
from ..jobs.queue import JobKinds
from ..jobs.tasks.episodes import character_memories, scene_summaries
from ..retrieval import docs, visibility
from ..retrieval.visibility import ItemRef
from ..services import Services
from ..store.db import Connection, dumps, loads
from . import characters, chats, extraction, messages, told

if TYPE_CHECKING:
    from ..jobs.tasks.base import Extraction, Prompt

MEMORY, SCENE = "character_memory", "scene_summary"  # item (and index) kinds
MEMORIES_JOB, SCENES_JOB = "character_memories", "scene_summaries"
JOB_KINDS = (MEMORIES_JOB, SCENES_JOB, told.JOB)
SESSION_READ = "session"  # messages.memories_job of messages a session-end run has read


# --- rows ------------------------------------------------------------------------------------
def render(row: Any) -> str:
    """An item as text (what is indexed and shown): title, summary, feeling, then its lines verbatim."""
    lines = [f"{row['title']}: {row['summary']}" if row["title"] else row["summary"]]
    if row["feeling"]:
        lines.append(f"Feeling: {row['feeling']}")
    lines += [f"{q['speaker']}: \u201c{q['text']}\u201d" for q in loads(row["quotes"])]
    return "\n".join(lines)


def _sources(conn: Connection, episode_id: str) -> list[str]:
    """An item's source message ids, in transcript order (ids of deleted messages first)."""
    rows = conn.execute("SELECT chat_id, message_id FROM episode_sources WHERE episode_id=?",
                        (episode_id,)).fetchall()
    return messages.in_order(conn, rows[0]["chat_id"], [r["message_id"] for r in rows]) if rows else []


def to_dict(conn: Connection, row: Any) -> dict[str, Any]:
    """An item as the API shows it."""
    return {
        "id": row["id"], "kind": row["kind"], "chat_id": row["chat_id"], "session": row["session_n"],
        "character_id": row["character_id"], "title": row["title"], "summary": row["summary"],
        "feeling": row["feeling"], "quotes": loads(row["quotes"]),
        "participants": loads(row["participants"]), "witnesses": loads(row["witnesses"]),
        "known_by": loads(row["known_by"]), "importance": row["importance"],
        "source_message_ids": _sources(conn, row["id"]), "origin": row["origin"],
        "job_id": row["job_id"], "turn_id": row["turn_id"], "text": render(row),
        "created_at": row["created_at"], "updated_at": row["updated_at"], "version": row["version"],
    }


def _row(conn: Connection, episode_id: str) -> Any:
    row = conn.execute("SELECT * FROM episodes WHERE id=?", (episode_id,)).fetchone()
    if row is None:
        raise NotFound("episode_not_found", f"No character memory or scene summary with id {episode_id!r}.")
    return row


def get(svc: Services, episode_id: str) -> dict[str, Any]:
    with svc.db.read() as conn:
        return to_dict(conn, _row(conn, episode_id))


def list_episodes(svc: Services, *, kind: str | None = None, character_id: str | None = None,
                  chat_id: str | None = None, session: int | None = None,
                  viewer_id: str | None = None, limit: int | None = None,
                  offset: int = 0) -> list[dict[str, Any]]:
    """Items matching every filter, in story order (chat, session, first source message).

    `viewer_id`: only what that character knows (SW9b); without it, everything (a person)."""
    where, args = ["1"], []
    for column, value in (("kind", kind), ("character_id", character_id), ("chat_id", chat_id),
                          ("session_n", session)):
        if value is not None:
            where.append(f"{column}=?")
            args.append(value)
    knows, knows_args = visibility.known_by_sql(viewer_id, "known_by")
    cap = svc.settings.episodes_list_max
    with svc.db.read() as conn:
        rows = conn.execute(f"SELECT * FROM episodes WHERE {' AND '.join(where)} AND {knows}"
                            " ORDER BY chat_id, session_n, pos, created_at, id LIMIT ? OFFSET ?",
                            (*args, *knows_args, min(cap, limit or cap), offset)).fetchall()
        return [to_dict(conn, r) for r in rows]


def delete(svc: Services, episode_id: str) -> dict[str, Any]:
    """A person deletes one item with its index entry (and the knowledge granted on it)."""
    with svc.db.write() as conn:
        _delete_rows(conn, [_row(conn, episode_id)])
    return {"deleted": episode_id}


def _delete_rows(conn: Connection, rows: Sequence[Any]) -> int:
    for kind in (MEMORY, SCENE):
        docs.remove(conn, kind, [r["id"] for r in rows if r["kind"] == kind])
    visibility.forget(conn, [ItemRef(r["kind"], r["id"]) for r in rows])
    conn.executemany("DELETE FROM episodes WHERE id=?", [(r["id"],) for r in rows])
    return len(rows)


# --- queueing --------------------------------------------------------------------------------
def queue_session(svc: Services, conn: Connection, chat_id: str, n: int) -> int:
    """At session end: character memories (messages no deep-memory run has read), scene
    summaries and told events, per part of the session. Returns the jobs queued."""
    if not chats.memory_enabled(conn, chat_id) or batch.in_parts(svc):
        return 0  # RV16; with parts (MJ1) they come with each part (queue_part)
    rows = messages.ordered(conn, chat_id, "session_n=?", [n])
    if not rows:
        return 0
    the_cast = extraction.cast(conn, chat_id, rows)
    learners = extraction.learners(conn, the_cast)
    unread = [r for r in rows if r["memories_job"] is None]
    queued = 0
    for i, part in enumerate(extraction.parts(svc, unread) if learners else []):
        ids = [r["id"] for r in part]
        for character_id in learners:
            queue.enqueue(svc, MEMORIES_JOB, chat_id=chat_id, ref=f"{n}:{i}:{character_id}",
                         target={"n": n, "message_ids": ids, "character_ids": [character_id],
                                 "per_character": svc.settings.character_memories_per_character,
                                 "origin": "session"})
            queued += 1
        messages.mark_memories_read(conn, part, SESSION_READ)
    for i, part in enumerate(extraction.parts(svc, rows)):
        target = {"n": n, "message_ids": [r["id"] for r in part]}
        queue.enqueue(svc, SCENES_JOB, chat_id=chat_id, ref=f"{n}:{i}", target=target)
        queued += 1
        if len(the_cast) >= 2:  # someone to tell and someone to listen
            queue.enqueue(svc, told.JOB, chat_id=chat_id, ref=f"{n}:{i}", target=target)
            queued += 1
    return queued


def queue_part(svc: Services, conn: Connection, chat_id: str, turn_id: str | None,
               message_ids: list[str]) -> int:
    """MJ1: a part of the transcript is read: character memories (one job per character who
    learns), its scenes and told events, each over exactly the part's messages (so they share
    its call). Returns the jobs queued."""
    if not chats.memory_enabled(conn, chat_id):
        return 0  # RV16
    rows = messages.by_ids(conn, chat_id, message_ids)
    the_cast = extraction.cast(conn, chat_id, rows)
    learners = extraction.learners(conn, the_cast)
    target = {"n": rows[-1]["session_n"], "message_ids": list(message_ids)}
    for character_id in learners:
        queue.enqueue(svc, MEMORIES_JOB, chat_id=chat_id, turn_id=turn_id, dedupe=False, target={
            **target, "character_ids": [character_id], "origin": "session",
            "per_character": svc.settings.character_memories_per_character})
    if learners:
        messages.mark_memories_read(conn, rows, SESSION_READ)
    queue.enqueue(svc, SCENES_JOB, chat_id=chat_id, turn_id=turn_id, dedupe=False, target=target)
    if len(the_cast) >= 2:  # someone to tell and someone to listen
        queue.enqueue(svc, told.JOB, chat_id=chat_id, turn_id=turn_id, dedupe=False, target=target)
    return len(learners) + 1 + (len(the_cast) >= 2)


def queue_deep_run(svc: Services, conn: Connection, chat_id: str, turn_id: str | None,
                   message_ids: list[str]) -> int:
    """With a deep-memory run (RV13): one character-memories job for the chunk's unread
    messages, bounded to `episodes_deep_per_character` memories per character."""
    per = svc.settings.episodes_deep_per_character
    rows = [r for r in messages.by_ids(conn, chat_id, message_ids) if r["memories_job"] is None]
    learners = extraction.learners(conn, extraction.cast(conn, chat_id, rows)) if rows and per > 0 else []
    if not learners:
        return 0
    job_id = queue.enqueue(svc, MEMORIES_JOB, chat_id=chat_id, turn_id=turn_id, dedupe=False, target={
        "n": rows[0]["session_n"], "message_ids": [r["id"] for r in rows], "character_ids": learners,
        "per_character": per, "origin": "deep_memory"})
    messages.mark_memories_read(conn, rows, job_id)
    return 1


# --- building prompts ------------------------------------------------------------------------
def _build_memories(svc: Services, job: queue.Job) -> Prompt | None:
    found = extraction.job_inputs(svc, job)
    if found is None:
        return None
    conn, rows, cast = found
    wanted = [c for c in extraction.learners(conn, cast) if c in job.target["character_ids"]]
    if not wanted:
        return None
    return character_memories(
        extraction.chat_messages(svc, rows), cast, for_ids=wanted, session=job.target.get("n"),
        per_character=int(job.target["per_character"]),
        max_quotes=svc.settings.character_memory_max_quotes,
        memory_tokens=svc.settings.character_memory_tokens)


def _build_scenes(svc: Services, job: queue.Job) -> Prompt | None:
    found = extraction.job_inputs(svc, job)
    if found is None:
        return None
    _, rows, cast = found
    if not cast:
        return None
    return scene_summaries(extraction.chat_messages(svc, rows), cast, session=job.target.get("n"),
                           max_scenes=svc.settings.scenes_max,
                           max_quotes=svc.settings.scene_max_quotes,
                           scene_tokens=svc.settings.scene_summary_tokens,
                           gap_minutes=svc.settings.scene_gap_minutes,
                           max_messages=svc.settings.scene_max_messages)


# --- checking a result against the store (SW8, SW9b) ------------------------------------------
def _check_item(svc: Services, conn: Connection, job: queue.Job, item: Any, owner: str | None,
                out: extraction.Checked) -> dict[str, Any] | None:
    """One extracted item as a row, with its quotes verified against the messages as they are now
    (SW8) and its witnesses (SW9b); None when none of its source messages is left."""
    cited = [*item.source_message_ids, *(q.message_id for q in item.quotes)]
    found = extraction.texts(conn, job.chat_id, cited)
    check = verify_quotes(item.quotes, {i: r["text"] for i, r in found.items()})
    out.dropped_quotes += check.dropped
    sources = [m for m in dict.fromkeys([*item.source_message_ids, *(q.message_id for q in check.kept)])
               if m in found]
    if not sources:
        out.dropped.append(f"its messages are gone: {item.summary[:80]}")
        return None
    known = set(visibility.witnesses(conn, job.chat_id, sources)) | ({owner} if owner else set())
    summary = svc.tokens.truncate(item.summary, svc.settings.episode_max_tokens)
    # A part (MJ1) may hold the end of one session and the start of the next: the item belongs
    # to the session of its first source message.
    first = min(sources, key=lambda m: found[m]["position"])
    session = found[first]["session_n"] if found[first]["session_n"] is not None else item.session
    return {"chat_id": job.chat_id, "session_n": session, "summary": summary,
            "quotes": [asdict(q) for q in check.kept], "participants": list(item.participants),
            "witnesses": sorted(known), "known_by": sorted(known), "sources": sources,
            "pos": min(found[m]["position"] for m in sources), "title": None, "feeling": None,
            "importance": None, "character_id": owner}


def check_memories(svc: Services, conn: Connection, job: queue.Job,
                   result: Extraction) -> extraction.Checked:
    out = extraction.Checked(dropped_quotes=list(result.dropped_quotes), dropped=list(result.dropped_items))
    for item in result.items:
        if item.character_id not in job.target["character_ids"] or \
                not characters.learning_enabled(conn, item.character_id) or \
                characters.fetch(conn, item.character_id) is None:
            out.dropped.append(f"not asked for or not learning (RV14): {item.character_id}")
            continue
        row = _check_item(svc, conn, job, item, item.character_id, out)
        if row is not None:
            out.rows.append({**row, "kind": MEMORY, "feeling": item.feeling,
                             "importance": item.importance})
    return out


def check_scenes(svc: Services, conn: Connection, job: queue.Job, result: Extraction) -> extraction.Checked:
    out = extraction.Checked(dropped_quotes=list(result.dropped_quotes), dropped=list(result.dropped_items))
    for item in result.items:
        row = _check_item(svc, conn, job, item, None, out)
        if row is not None:
            out.rows.append({**row, "kind": SCENE, "title": item.title})
    return out


def _render_row(row: dict[str, Any]) -> str:
    return render({**row, "quotes": dumps(row["quotes"])})


def _check(svc: Services, conn: Connection, job: queue.Job, result: Any) -> extraction.Checked:
    return (check_memories if job.kind == MEMORIES_JOB else check_scenes)(svc, conn, job, result)


def _prepare(svc: Services, job: queue.Job, result: Any) -> dict[str, docs.Prepared]:
    """Embed the items' texts before the write transaction (the check is repeated inside it)."""
    texts = [_render_row(r) for r in _check(svc, svc.db.reader(), job, result).rows]
    return {p.text: p for p in docs.prepare(svc, texts, keep_names=True)} if texts else {}


def _vector(svc: Services, prepared: dict[str, docs.Prepared], text: str) -> docs.Prepared:
    # A message edited between prepare and apply changes a text: embed it now (rare).
    if text not in prepared:
        prepared[text] = docs.prepare(svc, [text], keep_names=True)[0]
    return prepared[text]


def _insert(svc: Services, conn: Connection, job: queue.Job, row: dict[str, Any],
            prepared: dict[str, docs.Prepared]) -> str:
    episode_id = "e_" + uuid.uuid4().hex
    now = svc.clock.iso()
    conn.execute(
        "INSERT INTO episodes(id, kind, chat_id, session_n, character_id, title, summary, feeling,"
        " quotes, participants, witnesses, known_by, importance, origin, pos, job_id, turn_id,"
        " created_at, updated_at) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
        (episode_id, row["kind"], row["chat_id"], row["session_n"], row["character_id"], row["title"],
         row["summary"], row["feeling"], dumps(row["quotes"]), dumps(row["participants"]),
         dumps(row["witnesses"]), dumps(row["known_by"]), row["importance"],
         job.target.get("origin", "session"), row["pos"], job.id, job.turn_id, now, now))
    conn.executemany("INSERT OR IGNORE INTO episode_sources(episode_id, chat_id, message_id) VALUES (?,?,?)",
                     [(episode_id, row["chat_id"], m) for m in row["sources"]])
    docs.put(conn, row["kind"], episode_id, _vector(svc, prepared, _render_row(row)), created_at=now,
              chat_id=row["chat_id"], character_id=row["character_id"], known_by=row["known_by"])
    return episode_id


def _apply_items(svc: Services, conn: Connection, job: queue.Job, result: Any,
                 prepared: dict[str, docs.Prepared] | None) -> dict[str, Any]:
    if not chats.memory_enabled(conn, job.chat_id):
        return {"skipped": "memory is switched off for this chat (RV16)"}
    checked = _check(svc, conn, job, result)
    ids = [_insert(svc, conn, job, row, prepared or {}) for row in checked.rows]
    return {"episodes": ids, **checked.report()}


# --- provenance: rollback, deleted messages, deleted chats (RV10) ------------------------------
def _set_quotes(svc: Services, conn: Connection, row: Any, quotes: list[dict[str, Any]]) -> None:
    """Store an item's remaining quotes and index its new text (embedded inside the transaction:
    deletes and edits of quoted messages are rare and small)."""
    conn.execute("UPDATE episodes SET quotes=?, updated_at=?, version=version+1 WHERE id=?",
                 (dumps(quotes), svc.clock.iso(), row["id"]))
    new = conn.execute("SELECT * FROM episodes WHERE id=?", (row["id"],)).fetchone()
    text = render(new)
    if text != render(row):
        docs.put(conn, new["kind"], new["id"], docs.prepare(svc, [text], keep_names=True)[0],
                  created_at=new["created_at"], chat_id=new["chat_id"],
                  character_id=new["character_id"], known_by=loads(new["known_by"]))


def _strip(svc: Services, conn: Connection, row: Any, gone: set[str]) -> None:
    """An item citing other messages too loses the gone ones and the quotes from them."""
    conn.executemany("DELETE FROM episode_sources WHERE episode_id=? AND message_id=?",
                     [(row["id"], m) for m in gone])
    _set_quotes(svc, conn, row, [q for q in loads(row["quotes"]) if q["message_id"] not in gone])


def recheck_quotes(svc: Services, conn: Connection, chat_id: str, rows: list[Any]) -> None:
    """Edited messages (SW8): a stored quote that is no longer verbatim in its message is dropped;
    a told event whose evidence is no longer in its message is undone. (What the item says is
    not re-derived: like a summary, it describes the scene as it was read.)"""
    texts = {r["id"]: r["text"] for r in rows}
    marks = ",".join("?" * len(texts))
    hit = conn.execute(f"SELECT DISTINCT e.* FROM episodes e JOIN episode_sources s ON s.episode_id = e.id"
                       f" WHERE s.chat_id=? AND s.message_id IN ({marks})", (chat_id, *texts)).fetchall()
    for row in hit:
        quotes = loads(row["quotes"])
        kept = [q for q in quotes if q["message_id"] not in texts or verify_quotes(
            [Quote(q["speaker"], q["text"], q["message_id"])], texts).kept]
        if len(kept) != len(quotes):
            _set_quotes(svc, conn, row, kept)
    told.recheck_evidence(svc, conn, chat_id, texts)


def forget_messages(svc: Services, conn: Connection, chat_id: str, message_ids: Iterable[str]) -> dict[str, int]:
    """Messages are gone (or being regenerated): items derived only from them go, others lose
    them; told events they were the evidence of are undone. Inside a write."""
    gone = set(message_ids)
    if not gone:
        return {}
    marks = ",".join("?" * len(gone))
    hit = conn.execute(f"SELECT DISTINCT e.* FROM episodes e JOIN episode_sources s ON s.episode_id = e.id"
                       f" WHERE s.chat_id=? AND s.message_id IN ({marks})", (chat_id, *gone)).fetchall()
    doomed, stripped = [], 0
    for row in hit:
        cited = {r[0] for r in conn.execute("SELECT message_id FROM episode_sources WHERE episode_id=?",
                                            (row["id"],))}
        if cited <= gone:
            doomed.append(row)
        else:
            _strip(svc, conn, row, gone & cited)
            stripped += 1
    untold = told.untell_messages(svc, conn, chat_id, gone)
    visibility.forget_deleted_messages(conn)
    return {"episodes": _delete_rows(conn, doomed), "episodes_trimmed": stripped, "told_events": untold}


def copy_for_branch(conn: Connection, parent_id: str, branch_id: str, copied: set[str]) -> dict[str, str]:
    """CP2: copy the parent's character memories and scene summaries derived only from copied
    messages (`copied`: their ids) into the branch, with their sources and search entries
    (vectors copied), no job queued. Returns {parent item id: copy's id}."""
    sources: dict[str, set[str]] = {}
    for r in conn.execute("SELECT episode_id, message_id FROM episode_sources WHERE chat_id=?", (parent_id,)):
        sources.setdefault(r["episode_id"], set()).add(r["message_id"])
    mapping: dict[str, str] = {}
    kinds: dict[str, list[tuple[str, str]]] = {}
    for row in conn.execute("SELECT * FROM episodes WHERE chat_id=?", (parent_id,)).fetchall():
        cited = sources.get(row["id"])
        if not cited or not cited <= copied:
            continue
        new_id = mapping[row["id"]] = chats.branch_ref(branch_id, row["id"])
        values = {**dict(row), "id": new_id, "chat_id": branch_id}
        conn.execute(f"INSERT INTO episodes({', '.join(values)}) VALUES ({','.join('?' * len(values))})",
                     tuple(values.values()))
        conn.executemany("INSERT INTO episode_sources(episode_id, chat_id, message_id) VALUES (?,?,?)",
                         [(new_id, branch_id, m) for m in sorted(cited)])
        kinds.setdefault(row["kind"], []).append((row["id"], new_id))
    for kind, pairs in kinds.items():
        docs.copy_many(conn, kind, pairs, chat_id=branch_id)
    return mapping


def _messages_deleted(svc: Services, conn: Connection, chat_id: str, message_ids: list[str]) -> dict[str, int]:
    return forget_messages(svc, conn, chat_id, message_ids)


def _chat_deleted(svc: Services, conn: Connection, chat_id: str) -> dict[str, int]:
    """A deleted chat's scenes never happened: its told events are undone, its items go."""
    untold = told.untell_chat(svc, conn, chat_id)
    rows = conn.execute("SELECT * FROM episodes WHERE chat_id=?", (chat_id,)).fetchall()
    visibility.forget_deleted_messages(conn)
    return {"episodes": _delete_rows(conn, rows), "told_events": untold}


def rollback_turn(svc: Services, conn: Connection, chat_id: str, turn_id: str) -> dict[str, int]:
    """RV10, called before the turn's jobs are deleted: what this module's jobs of the turn
    wrote goes (items, told events), the messages they read may be read again, and what was
    derived only from the turn's own messages goes too."""
    job_ids = queue.ids_of_turn(conn, chat_id, turn_id, JOB_KINDS)
    messages.release_memories_read(conn, chat_id, job_ids)
    untold = told.untell_turn(svc, conn, chat_id, turn_id)
    rows = conn.execute("SELECT * FROM episodes WHERE chat_id=? AND turn_id=?", (chat_id, turn_id)).fetchall()
    removed = {"episodes": _delete_rows(conn, rows), "told_events": untold}
    own = messages.ids_of_turn(conn, chat_id, turn_id)
    for key, value in forget_messages(svc, conn, chat_id, own).items():
        removed[key] = removed.get(key, 0) + value
    return removed


def register(jobs: JobKinds, hooks: Hooks) -> None:
    """Character memories, scene summaries and told events (SW4, SW5, SW9b): their jobs, queued
    at a session's end and with each deep-memory run; what edits, deletes and rollbacks undo."""
    jobs.register(MEMORIES_JOB, _apply_items, build=_build_memories, prepare=_prepare)
    jobs.register(SCENES_JOB, _apply_items, build=_build_scenes, prepare=_prepare)
    hooks.session_ended.connect(queue_session)
    hooks.deep_memory_ran.connect(queue_deep_run)
    hooks.part_closed.connect(queue_part)
    hooks.messages_edited.connect(recheck_quotes)
    hooks.messages_deleted.connect(_messages_deleted)
    hooks.chat_deleted.connect(_chat_deleted)
    hooks.turn_rolled_back.connect(rollback_turn)
