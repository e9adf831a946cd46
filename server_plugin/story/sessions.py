"""Sessions (rule SW2): numbered stretches of a chat, each summarised in full and in one paragraph.

A session is open from its first message until `POST …/sessions/end`, or until a message arrives
more than `session_gap_hours` after the one before it (that message opens the next session). An
ended session gets a session_summary job: a full summary, a one-paragraph short one, quotes, and
what it proposes for the campaign notes (SW3). Other modules add their own session-end work
(character memories, scene summaries, sheet drafts…) by connecting to `hooks.session_ended`:
fn(svc, conn, chat_id, n) runs inside the transaction that ends the session and returns how many
jobs it queued.

`story_summary_parts` is what the context assembler shows as the Story Summary: the latest full
session summary, the short ones of the sessions before it, then the summary tiers (RV3).

Owns: sessions.
"""

from __future__ import annotations

from dataclasses import asdict
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Sequence

from ..clock import parse_iso
from ..core.quotes import Quote, dropped_report
from ..errors import NotFound
from ..hooks import Hooks
from ..jobs import batch, queue
from ..jobs.queue import JobKinds
from ..jobs.tasks.summaries import NoteInput, SummaryInput, session_summary
from ..retrieval import docs
from ..services import Services
from ..store.db import Connection, dumps, loads
from . import chats, messages, notes, summaries

if TYPE_CHECKING:
    from ..jobs.tasks.base import Prompt
    from ..jobs.tasks.summaries import SessionSummary

KIND = "session_summary"


# --- rows ------------------------------------------------------------------------------------
def _full(row: Any) -> str | None:
    if row["full"] is None:
        return None
    return summaries.render(row["full"], loads(row["quotes"]) or [])


def to_dict(row: Any, message_count: int, full: bool = False) -> dict[str, Any]:
    out = {
        "n": row["n"], "state": row["state"], "started_at": row["started_at"],
        "ended_at": row["ended_at"], "end_reason": row["end_reason"], "short": row["short"],
        "message_count": message_count, "stale": bool(row["stale"]),
    }
    if full:
        out["full"] = _full(row)
        out["quotes"] = loads(row["quotes"]) or []
    return out


def list_sessions(svc: Services, chat_id: str) -> list[dict[str, Any]]:
    """Every session of a chat with its short summary (SW2)."""
    chats.get(svc, chat_id)
    with svc.db.read() as conn:
        counts = messages.count_by_session(conn, chat_id)
        rows = conn.execute("SELECT * FROM sessions WHERE chat_id=? ORDER BY n", (chat_id,)).fetchall()
        return [to_dict(r, counts.get(r["n"], 0)) for r in rows]


def get(svc: Services, chat_id: str, n: int) -> dict[str, Any]:
    """One session with its full summary (SW2: the model may ask for any session)."""
    chats.get(svc, chat_id)
    with svc.db.read() as conn:
        row = conn.execute("SELECT * FROM sessions WHERE chat_id=? AND n=?", (chat_id, n)).fetchone()
        if row is None:
            raise NotFound("session_not_found", f"Chat {chat_id!r} has no session {n}.")
        return to_dict(row, messages.count_by_session(conn, chat_id).get(n, 0), full=True)


def _open(conn: Connection, chat_id: str) -> Any:
    return conn.execute("SELECT * FROM sessions WHERE chat_id=? AND state='open'", (chat_id,)).fetchone()


def open_n(conn: Connection, chat_id: str) -> int | None:
    """The number of the chat's open session, or None."""
    row = _open(conn, chat_id)
    return None if row is None else int(row["n"])


# --- opening and ending ----------------------------------------------------------------------
def place(svc: Services, conn: Connection, chat_id: str, inserted: Sequence[Any]) -> list[int]:
    """Put new messages in the open session, ending it first when one came after a gap.

    Returns the numbers of the sessions ended (their jobs are already queued)."""
    gap = timedelta(hours=svc.settings.session_gap_hours)
    current = _open(conn, chat_id)
    last_at = current["last_at"] if current else None
    n = current["n"] if current else None
    ended = []
    for row in inserted:
        sent = row["sent_at"]
        if n is not None and last_at is not None and parse_iso(sent) - parse_iso(last_at) > gap:
            conn.execute("UPDATE sessions SET last_at=? WHERE chat_id=? AND n=?", (last_at, chat_id, n))
            _end(svc, conn, chat_id, n, "gap", last_at)
            ended.append(n)
            n = None
        if n is None:
            n = _start(svc, conn, chat_id, sent)
            last_at = sent
        messages.set_session(conn, row, n)
        last_at = max(last_at or sent, sent)
    if n is not None:
        conn.execute("UPDATE sessions SET last_at=?, updated_at=? WHERE chat_id=? AND n=?",
                     (last_at, svc.clock.iso(), chat_id, n))
    return ended


def _start(svc: Services, conn: Connection, chat_id: str, started_at: str) -> int:
    n = conn.execute("SELECT coalesce(max(n), 0) + 1 FROM sessions WHERE chat_id=?", (chat_id,)).fetchone()[0]
    conn.execute("INSERT INTO sessions(chat_id, n, state, started_at, last_at, updated_at)"
                 " VALUES (?,?,'open',?,?,?)", (chat_id, n, started_at, started_at, svc.clock.iso()))
    return n


def _end(svc: Services, conn: Connection, chat_id: str, n: int, reason: str, ended_at: str) -> int:
    """Close a session and queue its summary and every registered session-end job."""
    conn.execute("UPDATE sessions SET state='ended', ended_at=?, end_reason=?, updated_at=?"
                 " WHERE chat_id=? AND n=?", (ended_at, reason, svc.clock.iso(), chat_id, n))
    if batch.in_parts(svc):
        return _end_in_parts(svc, conn, chat_id, n)
    queue.enqueue(svc, KIND, chat_id=chat_id, ref=str(n), target={"n": n})
    return 1 + svc.hooks.session_ended.count(svc, conn, chat_id, n)


def _end_in_parts(svc: Services, conn: Connection, chat_id: str, n: int) -> int:
    """MJ1: the session's messages are due; its summary and the other model tasks come with the
    part its end falls in (`_queue_part`); local session-end work is queued now. A session whose
    last message a part already read is summarised from those parts' summaries."""
    queued = svc.hooks.session_ended.count(svc, conn, chat_id, n)
    rows = messages.ordered(conn, chat_id, "session_n=?", [n])
    if rows and rows[-1]["summary_id"] is not None:
        queue.enqueue(svc, KIND, chat_id=chat_id, ref=str(n), target={"n": n, "message_ids": []})
        queued += 1
    return queued + svc.hooks.messages_due.count(svc, conn, chat_id, None)


def _queue_part(svc: Services, conn: Connection, chat_id: str, turn_id: str | None,
                message_ids: list[str]) -> int:
    """A part is read (MJ1): the summary of each ended session whose last message is in it reads
    the part (its own messages marked) and the summaries of its earlier parts."""
    shown = set(message_ids)
    queued = 0
    for n in sorted({r["session_n"] for r in messages.by_ids(conn, chat_id, message_ids)
                     if r["session_n"] is not None}):
        row = conn.execute("SELECT state FROM sessions WHERE chat_id=? AND n=?", (chat_id, n)).fetchone()
        last = messages.ordered(conn, chat_id, "session_n=?", [n])[-1]
        if row is not None and row["state"] != "open" and last["id"] in shown:
            queue.enqueue(svc, KIND, chat_id=chat_id, turn_id=turn_id, ref=str(n),
                          target={"n": n, "message_ids": list(message_ids)})
            queued += 1
    return queued


def end(svc: Services, chat_id: str) -> dict[str, Any] | None:
    """`POST …/sessions/end`: close the open session now; None when no session is open."""
    chats.get(svc, chat_id)
    with svc.db.write() as conn:
        current = _open(conn, chat_id)
        if current is None:
            return None
        _end(svc, conn, chat_id, current["n"], "call", svc.clock.iso())
        row = conn.execute("SELECT * FROM sessions WHERE chat_id=? AND n=?", (chat_id, current["n"])).fetchone()
        return to_dict(row, messages.count_by_session(conn, chat_id).get(current["n"], 0))


def resummarize(svc: Services, chat_id: str, n: int) -> dict[str, Any]:
    """Queue an ended session's summary again (after edits made it stale)."""
    current = get(svc, chat_id, n)
    if current["state"] == "open":
        return {"n": n, "jobs_enqueued": 0}
    job_id = queue.enqueue(svc, KIND, chat_id=chat_id, ref=str(n), target={"n": n})
    return {"n": n, "jobs_enqueued": 1, "job_id": job_id}


def mark_stale(conn: Connection, chat_id: str, rows: Sequence[Any]) -> None:
    """Messages of summarised sessions were edited or deleted: those summaries are stale."""
    numbers = sorted({r["session_n"] for r in rows if r["session_n"] is not None})
    conn.executemany("UPDATE sessions SET stale=1 WHERE chat_id=? AND n=? AND state='summarized'",
                     [(chat_id, n) for n in numbers])


# --- the session-summary job -----------------------------------------------------------------
def _build(svc: Services, job: queue.Job) -> Prompt | None:
    conn = svc.db.reader()
    n = int(job.target["n"])
    rows = messages.ordered(conn, job.chat_id, "session_n=?", [n])
    if not rows:
        return None
    only = None
    if "message_ids" in job.target:  # read with a part (MJ1): the part, and its earlier parts' summaries
        tail = messages.by_ids(conn, job.chat_id, job.target["message_ids"])
        shown = {r["id"] for r in tail}
        earlier = _summaries_of(conn, [r for r in rows if r["id"] not in shown])
        only = [r["id"] for r in tail if r["session_n"] == n]
        if not only and not earlier:
            return None
    else:
        earlier, tail = _fit(svc, conn, rows)
    open_notes = [NoteInput(x["id"], x["text"], x["priority"])
                  for x in notes.open_rows(conn, job.chat_id, svc.settings.notes_in_prompt)]
    s = svc.settings
    return session_summary(
        [messages.chat_message(svc, r) for r in tail], earlier=earlier, open_notes=open_notes,
        session=n, full_tokens=s.session_full_tokens, short_tokens=s.session_short_tokens,
        max_quotes=s.summary_max_quotes, max_threads=s.session_max_threads,
        thread_max_chars=s.memory_max_chars, only=only)


def _summaries_of(conn: Connection, rows: Sequence[Any]) -> list[SummaryInput]:
    """The written summaries covering these messages, in order, as a prompt's inputs."""
    found = summaries.written(conn, sorted({r["summary_id"] for r in rows if r["summary_id"]}))
    return [SummaryInput(s["id"], s["text"], tuple(Quote(**q) for q in loads(s["quotes"]) or []))
            for s in found]


def _fit(svc: Services, conn: Connection, rows: Sequence[Any]) -> tuple[list[SummaryInput], list[Any]]:
    """A session too long for one prompt goes in as its chunk summaries plus the messages they do
    not cover (the newest that fit the budget)."""
    budget = svc.settings.session_prompt_max_tokens
    limit = svc.settings.prompt_message_max_tokens
    if sum(min(r["tokens"], limit) for r in rows) <= budget:
        return [], list(rows)
    earlier = _summaries_of(conn, rows)
    covered = {s.id for s in earlier}
    rest = [r for r in rows if r["summary_id"] not in covered]
    return earlier, messages.newest_within(rest, budget, limit)


def _apply(svc: Services, conn: Connection, job: queue.Job, result: SessionSummary,
           prepared: Any) -> dict[str, Any]:
    n = int(job.target["n"])
    row = conn.execute("SELECT * FROM sessions WHERE chat_id=? AND n=?", (job.chat_id, n)).fetchone()
    if row is None:
        return {"skipped": "the session is gone"}
    quotes = [asdict(q) for q in result.quotes]
    conn.execute("UPDATE sessions SET state='summarized', full=?, short=?, quotes=?, stale=0,"
                 " updated_at=? WHERE chat_id=? AND n=?",
                 (result.full, result.short, dumps(quotes), svc.clock.iso(), job.chat_id, n))
    written = notes.apply_session(svc, conn, job.chat_id, result.notes, result.resolved_note_ids,
                                  session_n=n, turn_id=job.turn_id, job_id=job.id)
    if prepared is not None:
        _index(conn, job.chat_id, n, row, prepared, result)
    return {"session": n, **written, **dropped_report(result.dropped_quotes)}


def _prepare(svc: Services, job: queue.Job, result: SessionSummary) -> Any:
    # The full summary as a search item (SW6): embedded before the job's write transaction.
    return docs.prepare(svc, [result.render()], svc.embed_wait())[0]


def search_ref(chat_id: str, n: int) -> str:
    """The search index id of a session's summary ("<chat>#<n>", like its messages' session key)."""
    return messages.session_key(chat_id, n)


def _index(conn: Connection, chat_id: str, n: int, row: Any, prepared: docs.Prepared,
           result: SessionSummary) -> None:
    """Known by the session's witnesses — the chat's members and whoever spoke in it (SW9b);
    it cites the messages it quotes (the whole session is GET …/sessions/{n})."""
    speakers = messages.session_speakers(conn, chat_id, n)
    docs.put(conn, KIND, search_ref(chat_id, n), prepared, created_at=row["last_at"], chat_id=chat_id,
              known_by=[*chats.members(conn, chat_id), *speakers],
              source_message_ids=[q.message_id for q in result.quotes])




# --- for the context assembler ---------------------------------------------------------------
def story_summary_parts(svc: Services, chat_id: str, viewer_id: str | None = None) -> list[dict[str, Any]]:
    """The Story Summary's parts, in this order (SW2, RV3, CP1): the latest full session summary,
    the short summaries of the `session_shorts_in_context` (5) sessions before it (oldest first),
    then the long-term, consolidated and recent summaries (each oldest first) of the campaign's
    earlier chats in time order, then the chat's own. Sessions are picked across those chats by
    time. An earlier chat counts only when the viewer (None: a person) was one of its members: a
    character knows the story it witnessed (SW9b). Each part: `{id, kind, text, session?}`, kind
    one of session_full, session_short, long_term, consolidated, recent; a session of another
    chat is named `session:<chat>#<n>:…`."""
    shorts = svc.settings.session_shorts_in_context
    with svc.db.read() as conn:
        story = story_chats(conn, chat_id, viewer_id)
        marks = ",".join("?" * len(story))
        done = conn.execute(f"SELECT * FROM sessions WHERE chat_id IN ({marks}) AND full IS NOT NULL"
                            " ORDER BY last_at DESC, n DESC LIMIT ?",
                            (*story, shorts + 1)).fetchall()
        tiers = [summaries.shown(svc, conn, c) for c in story]
    parts: list[dict[str, Any]] = []

    def name(row: Any) -> str:
        return str(row["n"]) if row["chat_id"] == chat_id else search_ref(row["chat_id"], row["n"])
    if done:
        latest = done[0]
        parts.append({"id": f"session:{name(latest)}:full", "kind": "session_full",
                      "session": latest["n"], "text": _full(latest)})
        parts += [{"id": f"session:{name(r)}:short", "kind": "session_short", "session": r["n"],
                   "text": r["short"]} for r in reversed(done[1:])]
    for of_chat in tiers:
        for tier in ("long_term", "consolidated", "recent"):
            parts += [{"id": summary_id, "kind": tier, "text": text} for summary_id, text in of_chat[tier]]
    return parts


def story_chats(conn: Connection, chat_id: str, viewer_id: str | None) -> list[str]:
    """The chats whose story a chat's Story Summary tells (CP1): its campaign's chats up to and
    including it, oldest first, the earlier ones only where the viewer was a member and not those
    a branch of the campaign copied whole (CP2c)."""
    ordered = chats.same_campaign(conn, chat_id)
    earlier = ordered[:ordered.index(chat_id)] if chat_id in ordered else []
    told = chats.superseded(conn, ordered)  # CP2c: a chat copied whole is told by its branch
    return [c for c in earlier if c not in told and (viewer_id is None or viewer_id in chats.members(conn, c))] + [chat_id]


def campaign_sessions(svc: Services, campaign_id: str) -> list[dict[str, Any]]:
    """Every session of a campaign's chats with its short summary, in time order (CP1, SW2);
    each keeps its chat's number and names its chat."""
    chat_ids = [c["id"] for c in chats.campaign(svc, campaign_id)["chats"]]
    out = []
    with svc.db.read() as conn:
        for chat_id in chat_ids:
            counts = messages.count_by_session(conn, chat_id)
            for r in conn.execute("SELECT * FROM sessions WHERE chat_id=?", (chat_id,)):
                out.append({**to_dict(r, counts.get(r["n"], 0)), "chat_id": chat_id})
    return sorted(out, key=lambda s: (s["started_at"], s["chat_id"], s["n"]))


RECAP_OPENING = "Previously: "


def campaign_recap(svc: Services, campaign_id: str) -> dict[str, Any]:
    """CP1f: the short "previously" recap a new chat of the campaign opens with — the short
    summaries of its latest `recap_sessions` summarised sessions across its chats, oldest first
    (else its latest chat's newest rolling summary), cut at `recap_tokens`. For the person
    starting the chat: nothing is hidden from them. `text` is empty for a campaign with no
    summary yet; `parts` names what it was made of."""
    chats.campaign(svc, campaign_id)  # NotFound for an unknown campaign
    with svc.db.read() as conn:
        chat_ids = chats.campaign_story_ids(conn, campaign_id)
        marks = ",".join("?" * len(chat_ids))
        done = conn.execute(f"SELECT chat_id, n, short FROM sessions WHERE chat_id IN ({marks}) AND short"
                            " IS NOT NULL AND short != '' ORDER BY last_at DESC, n DESC LIMIT ?",
                            (*chat_ids, svc.settings.recap_sessions)).fetchall()
        parts = [(search_ref(r["chat_id"], r["n"]), r["short"]) for r in reversed(done)]
        if not parts:
            recent = summaries.visible(conn, chat_ids[-1])["recent"]
            parts = [(r["id"], summaries.render(r["text"], [])) for r in recent[-1:]]
    said = " ".join(text.strip() for _, text in parts if text and text.strip())
    text = svc.tokens.truncate(RECAP_OPENING + said, svc.settings.recap_tokens) if said else ""
    return {"campaign_id": campaign_id, "text": text, "parts": [ref for ref, _ in parts]}


def copy_for_branch(conn: Connection, parent_id: str, branch_id: str, upto: Any) -> int:
    """CP2: copy the parent's sessions up to the branch point `upto` (the last copied message's
    row) into the branch, with their summaries and search entries, no job queued. The session
    the branch point falls in is copied open and unsummarised unless the branch point is its
    last message and it had ended: the branch goes on with it. Returns how many were copied."""
    n_at = upto["session_n"]
    if n_at is None:
        return 0
    last = messages.ordered(conn, parent_id, "session_n=?", [n_at])[-1]["position"]
    rows = conn.execute("SELECT * FROM sessions WHERE chat_id=? AND n<=?", (parent_id, n_at)).fetchall()
    indexed = []
    for r in rows:
        whole = r["n"] < n_at or (r["state"] != "open" and last == upto["position"])
        values = dict(r)
        if not whole:
            values.update(state="open", ended_at=None, end_reason=None, full=None, short=None,
                          quotes="[]", stale=0, last_at=upto["sent_at"])
        values["chat_id"] = branch_id
        conn.execute(f"INSERT INTO sessions({', '.join(values)}) VALUES ({','.join('?' * len(values))})",
                     tuple(values.values()))
        if whole:
            indexed.append((search_ref(parent_id, r["n"]), search_ref(branch_id, r["n"])))
    docs.copy_many(conn, KIND, indexed, chat_id=branch_id)  # one pass over the index, not one per session
    return len(rows)


def delete_for_chat(conn: Connection, chat_id: str) -> int:
    numbers = [r[0] for r in conn.execute("SELECT n FROM sessions WHERE chat_id=?", (chat_id,))]
    docs.remove(conn, KIND, [search_ref(chat_id, n) for n in numbers])
    return conn.execute("DELETE FROM sessions WHERE chat_id=?", (chat_id,)).rowcount


def register(jobs: JobKinds, hooks: Hooks) -> None:
    """The session summary job (SW2)."""
    jobs.register(KIND, _apply, build=_build, prepare=_prepare)
    hooks.part_closed.connect(_queue_part)
