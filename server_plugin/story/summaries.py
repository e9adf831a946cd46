"""The live window and the three tiers of rolling summaries (rules RV2, RV3), all scoped to one chat.

After a turn, the messages that left the live window and are not yet summarised are grouped into
chunks of `summary_chunk_messages`; each chunk becomes a `recent` summary through a chunk_summary
job. `summary_merge_count` (4) recent summaries merge into one `consolidated`, 4 consolidated into
one `long_term` (merge jobs). A summary row exists from the moment its job is queued (text NULL
until the job has run), records what it covers (message ids, or child summary ids) and its
`parent_id` once merged; merged children are no longer listed in their tier once the parent has
its text.

A person may edit a summary (`edited`): the edit is never overwritten by a job, and a merge reads
the texts as they are when it runs, so an edit is carried into the tiers above. An edited or
deleted message marks the summary covering it `stale` and queues it again; a changed text makes
the summary above it stale and queues that merge again.

Owns: summaries.
"""

from __future__ import annotations

import uuid
from collections import OrderedDict
from dataclasses import asdict
from typing import TYPE_CHECKING, Any, Iterable, Sequence

from ..core import window
from ..core.quotes import Quote, dropped_report
from ..errors import Conflict, NotFound
from .. import priority
from ..hooks import Hooks
from ..jobs import batch, queue
from ..jobs.queue import JobKinds
from ..jobs.tasks.summaries import SummaryInput, chunk_summary, merge_summaries
from ..services import Services
from ..store.db import Connection, dumps, loads
from . import chats, deep_memory, messages

if TYPE_CHECKING:
    from ..jobs.tasks.base import Prompt
    from ..jobs.tasks.summaries import Summary

TIERS = ("recent", "consolidated", "long_term")
NEXT_TIER = {"recent": "consolidated", "consolidated": "long_term"}
CHUNK, MERGE = "chunk_summary", "merge_summaries"
ORDER = "pos_position, pos_seq, created_at"


# --- the live window (RV2) -------------------------------------------------------------------
def context_tokens_of(svc: Services, conn: Connection, chat_id: str) -> int:
    """The context size the chat was last assembled for, or the configured default."""
    value = chats.context_tokens(conn, chat_id)
    return int(value) if value else svc.settings.default_context_tokens


def window_rows(svc: Services, conn: Connection, chat_id: str,
                context_tokens: int | None = None) -> list[Any]:
    """The live messages as rows, newest first."""
    s = svc.settings
    ctx = context_tokens or context_tokens_of(svc, conn, chat_id)
    rows = messages.newest(conn, chat_id, s.live_window_max_messages)
    n = window.size([r["tokens"] for r in rows], ctx, max_tokens=s.live_window_max_tokens,
                    percent=s.live_window_percent, max_messages=s.live_window_max_messages)
    return rows[:n]


def live_window(svc: Services, chat_id: str, context_tokens: int | None = None) -> list[dict[str, Any]]:
    """The live messages of a chat, oldest first (RV2), for `context_tokens` or the chat's
    remembered size (`chats.context_tokens`, else the setting `default_context_tokens`)."""
    with svc.db.read() as conn:
        return [messages.to_dict(r) for r in reversed(window_rows(svc, conn, chat_id, context_tokens))]


# --- rows ------------------------------------------------------------------------------------
def _quotes(row: Any) -> list[dict[str, str]]:
    return loads(row["quotes"]) or []


def render(text: str, quotes: Sequence[dict[str, str]]) -> str:
    """A summary as a context shows it: its text, then its memorable lines verbatim (SW8)."""
    return "\n".join([text] + [f"{q['speaker']}: \u201c{q['text']}\u201d" for q in quotes])


def to_dict(row: Any) -> dict[str, Any]:
    return {
        "id": row["id"], "chat_id": row["chat_id"], "tier": row["tier"], "text": row["text"],
        "quotes": _quotes(row), "covers": loads(row["covers"]), "parent_id": row["parent_id"],
        "edited": bool(row["edited"]), "stale": bool(row["stale"]), "turn_id": row["turn_id"],
        "created_at": row["created_at"], "updated_at": row["updated_at"], "version": row["version"],
    }


def _fetch(conn: Connection, summary_id: str) -> Any:
    return conn.execute("SELECT * FROM summaries WHERE id=?", (summary_id,)).fetchone()


def get(svc: Services, summary_id: str) -> dict[str, Any]:
    row = _fetch(svc.db.reader(), summary_id)
    if row is None:
        raise NotFound("summary_not_found", f"No summary with id {summary_id!r}.")
    return to_dict(row)


def _insert(svc: Services, conn: Connection, chat_id: str, tier: str, covers: list[str],
            pos: tuple[int, int], turn_id: str | None) -> str:
    summary_id = "s_" + uuid.uuid4().hex
    now = svc.clock.iso()
    conn.execute("INSERT INTO summaries(id, chat_id, tier, covers, pos_position, pos_seq, turn_id,"
                 " created_at, updated_at) VALUES (?,?,?,?,?,?,?,?,?)",
                 (summary_id, chat_id, tier, dumps(covers), pos[0], pos[1], turn_id, now, now))
    return summary_id


def copy_for_branch(conn: Connection, parent_id: str, branch_id: str, copied: set[str],
                    seqs: dict[int, int]) -> dict[str, str]:
    """CP2: copy the parent's written summaries that cover only copied messages (`copied`: their
    ids), tier by tier (a merged summary when all its children were copied), into the branch, no
    job queued; a summary straddling the branch point is not copied (the branch derives its own).
    Returns {parent summary id: copy's id}."""
    rows = conn.execute(f"SELECT * FROM summaries WHERE chat_id=? AND text IS NOT NULL ORDER BY {ORDER}",
                        (parent_id,)).fetchall()
    mapping: dict[str, str] = {}
    for tier in TIERS:
        for r in (r for r in rows if r["tier"] == tier):
            covers = loads(r["covers"]) or []
            inside = copied if tier == "recent" else mapping
            if covers and all(c in inside for c in covers) and r["pos_seq"] in seqs:
                mapping[r["id"]] = chats.branch_ref(branch_id, r["id"])
    columns = [c for c in rows[0].keys() if c not in ("id", "chat_id", "covers", "parent_id", "pos_seq")] if rows else []
    for r in rows:
        if r["id"] not in mapping:
            continue
        covers = loads(r["covers"]) if r["tier"] == "recent" else [mapping[c] for c in loads(r["covers"])]
        conn.execute(f"INSERT INTO summaries(id, chat_id, covers, parent_id, pos_seq, {', '.join(columns)})"
                     f" VALUES (?,?,?,?,?,{','.join('?' * len(columns))})",
                     (mapping[r["id"]], branch_id, dumps(covers), mapping.get(r["parent_id"]),
                      seqs[r["pos_seq"]], *(r[c] for c in columns)))
    messages.copied_summaries(conn, parent_id, branch_id, mapping)
    return mapping


def _visible_rows(conn: Connection, chat_id: str, columns: str = "*") -> list[Any]:
    """Summaries with a text, in order; children of a finished merge are left out. Read through
    two indexes (m012): the summaries merged into none, and the children of a merge still being
    written; never the merged ones, most of a long chat's. A child's parent always exists
    (deleting a summary frees its children, _delete)."""
    of_child = ", ".join(f"s.{c.strip()}" for c in columns.split(","))
    return conn.execute(
        f"SELECT {columns} FROM summaries WHERE chat_id=?1 AND parent_id IS NULL AND text IS NOT NULL"
        f" UNION ALL SELECT {of_child} FROM summaries p JOIN summaries s ON s.parent_id = p.id"
        f" WHERE p.chat_id=?1 AND p.text IS NULL AND s.text IS NOT NULL"
        f" ORDER BY {ORDER}", (chat_id,)).fetchall()


def visible(conn: Connection, chat_id: str) -> dict[str, list[Any]]:
    """Summaries with a text, by tier, in order; children of a finished merge are left out."""
    rows = _visible_rows(conn, chat_id)
    return {tier: [r for r in rows if r["tier"] == tier] for tier in TIERS}


SHOWN_KEPT = 8192  # rendered summaries kept (a few MB): every one a context shows, of every chat


def shown(svc: Services, conn: Connection, chat_id: str) -> dict[str, list[tuple[str, str]]]:
    """`visible`'s summaries as a context shows them (`render`): `(id, text)` by tier, in order.
    A summary's rendering is kept by its version: a context call during a backlog of summary
    jobs (each changes the Story Summary) reads the texts of the new ones only."""
    rows = _visible_rows(conn, chat_id, f"id, tier, version, updated_at, {ORDER}")
    kept: OrderedDict[tuple, str] = svc.cached("summaries_shown", "kept", OrderedDict, size=1)
    keys = {r["id"]: (r["id"], r["version"], r["updated_at"]) for r in rows}
    with _SHOWN_LOCK:  # request threads share `kept`; what this call found there is its own
        texts = {k: kept[k] for k in keys.values() if k in kept}
    missing = [k[0] for k in keys.values() if k not in texts]
    fresh = {(r["id"], r["version"], r["updated_at"]): render(r["text"] or "", loads(r["quotes"]) or [])
             for r in (conn.execute("SELECT id, version, updated_at, text, quotes FROM summaries WHERE id IN"
                                    " (SELECT value FROM json_each(?))", (dumps(missing),)) if missing else ())}
    texts.update(fresh)
    with _SHOWN_LOCK:
        kept.update(fresh)
        for key in texts:
            kept.move_to_end(key)
        while len(kept) > SHOWN_KEPT:
            kept.popitem(last=False)
    out: dict[str, list[tuple[str, str]]] = {tier: [] for tier in TIERS}
    for r in rows:  # (one snapshot, db.read(): a summary cannot change between the two reads)
        out[r["tier"]].append((r["id"], texts[keys[r["id"]]]))
    return out


_SHOWN_LOCK = priority.Lock()


def unsummarized_count(conn: Connection, chat_id: str) -> int:
    """Messages not yet covered by a finished recent summary (the panel shows it, RV3): those
    with no summary, or whose summary has no text yet (or is gone)."""
    by_summary = messages.count_by_summary(conn, chat_id)
    done = {r[0] for r in conn.execute(
        "SELECT id FROM summaries WHERE text IS NOT NULL AND id IN (SELECT value FROM json_each(?))",
        (dumps([s for s in by_summary if s is not None]),))}
    return sum(n for summary_id, n in by_summary.items() if summary_id not in done)


def written(conn: Connection, summary_ids: Sequence[str]) -> list[Any]:
    """The summaries among these that have a text, in order."""
    if not summary_ids:
        return []
    marks = ",".join("?" * len(summary_ids))
    return conn.execute(f"SELECT * FROM summaries WHERE id IN ({marks}) AND text IS NOT NULL"
                        f" ORDER BY {ORDER}", list(summary_ids)).fetchall()


def listing(svc: Services, chat_id: str) -> dict[str, Any]:
    """`{recent[], consolidated[], long_term[], unsummarized_count}` (RV3)."""
    chats.get(svc, chat_id)
    with svc.db.read() as conn:
        tiers = visible(conn, chat_id)
        out: dict[str, Any] = {tier: [to_dict(r) for r in rows] for tier, rows in tiers.items()}
        out["unsummarized_count"] = unsummarized_count(conn, chat_id)
        out["pending_count"] = conn.execute(
            "SELECT count(*) FROM summaries WHERE chat_id=? AND text IS NULL", (chat_id,)).fetchone()[0]
    return out


# --- compaction (RV3) ------------------------------------------------------------------------
def after_write(svc: Services, conn: Connection, chat_id: str, changes: messages.Changes) -> int:
    """What a message write sets off: stale summaries for edits, compaction after a turn.
    Returns how many jobs were queued."""
    queued = mark_stale(svc, conn, chat_id, [r["id"] for r in changes.edited])
    turns = [r for r in changes.written if r["role"] == "assistant"]
    if turns:  # an assistant message written (new, swiped, or re-sent for a new turn) ends a turn
        queued += compact(svc, conn, chat_id, turns[-1]["turn_id"])
    return queued


def compact(svc: Services, conn: Connection, chat_id: str, turn_id: str | None) -> int:
    """Chunk the messages that left the live window and are not summarised; queue their queue.

    Only whole chunks are made: a remainder waits for the next turn. Returns the jobs queued.
    """
    if batch.in_parts(svc):  # MJ1: with a model they wait to be read in a part (story/parts.py)
        return svc.hooks.messages_due.count(svc, conn, chat_id, turn_id)
    live = {r["seq"] for r in window_rows(svc, conn, chat_id)}
    waiting = [r for r in messages.ordered(conn, chat_id, "summary_id IS NULL") if r["seq"] not in live]
    size = svc.settings.summary_chunk_messages
    queued = 0
    for start in range(0, len(waiting) - len(waiting) % size, size):
        queued += open_part(svc, conn, chat_id, waiting[start:start + size], turn_id)
    if queued:
        queued += deep_memory.after_compaction(svc, conn, chat_id, turn_id)
    return queued


def open_part(svc: Services, conn: Connection, chat_id: str, rows: Sequence[Any], turn_id: str | None) -> int:
    """One recent summary covering these messages (a chunk, or a part of the transcript: MJ1),
    and its job. Returns the jobs queued (1)."""
    summary_id = _insert(svc, conn, chat_id, "recent", [r["id"] for r in rows],
                         (rows[0]["position"], rows[0]["seq"]), turn_id)
    messages.set_summary(conn, rows, summary_id)
    queue.enqueue(svc, CHUNK, chat_id=chat_id, turn_id=turn_id, ref=summary_id,
                 target={"summary_id": summary_id})
    return 1


def recent_budget(svc: Services, covered: int) -> int:
    """The size of a recent summary of `covered` messages: `summary_recent_tokens` per chunk's
    worth of them (a part read in one call holds many), at most `summary_long_term_tokens`."""
    s = svc.settings
    chunks = max(1, -(-covered // s.summary_chunk_messages))
    return max(s.summary_recent_tokens, min(s.summary_recent_tokens * chunks, s.summary_long_term_tokens))


def _maybe_merge(svc: Services, conn: Connection, chat_id: str, tier: str, turn_id: str | None) -> int:
    """While the oldest `summary_merge_count` unmerged summaries of a tier are all written, queue
    their merge into the next tier (in order: a pending one holds the later ones back).
    Returns the jobs queued."""
    if tier not in NEXT_TIER:
        return 0
    count = svc.settings.summary_merge_count
    queued = 0
    while True:
        rows = conn.execute(f"SELECT * FROM summaries WHERE chat_id=? AND tier=? AND parent_id IS NULL"
                            f" ORDER BY {ORDER} LIMIT ?", (chat_id, tier, count)).fetchall()
        if len(rows) < count or any(r["text"] is None for r in rows):
            return queued
        parent = _insert(svc, conn, chat_id, NEXT_TIER[tier], [r["id"] for r in rows],
                         (rows[0]["pos_position"], rows[0]["pos_seq"]), turn_id)
        conn.executemany("UPDATE summaries SET parent_id=? WHERE id=?", [(parent, r["id"]) for r in rows])
        queue.enqueue(svc, MERGE, chat_id=chat_id, turn_id=turn_id, ref=parent,
                     target={"summary_id": parent})
        queued += 1


def _requeue(svc: Services, conn: Connection, row: Any, turn_id: str | None = None) -> int:
    """Queue a summary's job again (its inputs changed), unless a person's edit stands."""
    if row["edited"]:
        return 0
    kind = CHUNK if row["tier"] == "recent" else MERGE
    queue.enqueue(svc, kind, chat_id=row["chat_id"], turn_id=turn_id, ref=row["id"],
                 target={"summary_id": row["id"]})
    return 1


def _parent_changed(svc: Services, conn: Connection, row: Any) -> int:
    """A summary's text changed: the finished summary above it is stale and merges again."""
    if row["parent_id"] is None:
        return 0
    parent = _fetch(conn, row["parent_id"])
    if parent is None or parent["text"] is None:
        return 0  # not merged yet: its job reads the current texts when it runs
    conn.execute("UPDATE summaries SET stale=1 WHERE id=?", (parent["id"],))
    return _requeue(svc, conn, parent)


def mark_stale(svc: Services, conn: Connection, chat_id: str, message_ids: Iterable[str]) -> int:
    """Edited messages: the recent summaries covering them are stale and summarised again."""
    ids = list(message_ids)
    if not ids:
        return 0
    summary_ids = {r["summary_id"] for r in messages.by_ids(conn, chat_id, ids) if r["summary_id"]}
    queued = 0
    for summary_id in sorted(summary_ids):
        row = _fetch(conn, summary_id)
        if row is None or row["text"] is None:
            continue  # still pending: its job reads the current messages
        conn.execute("UPDATE summaries SET stale=1 WHERE id=?", (summary_id,))
        queued += _requeue(svc, conn, row)
    return queued


# --- the jobs --------------------------------------------------------------------------------
def _live_target(svc: Services, job: queue.Job) -> Any:
    return _fetch(svc.db.reader(), job.target["summary_id"])


def _build_chunk(svc: Services, job: queue.Job) -> Prompt | None:
    row = _live_target(svc, job)
    if row is None:
        return None
    conn = svc.db.reader()
    rows = messages.by_ids(conn, row["chat_id"], loads(row["covers"]))
    if not rows:
        return None
    before = conn.execute(
        f"SELECT text FROM summaries WHERE chat_id=? AND tier='recent' AND text IS NOT NULL AND"
        f" (pos_position, pos_seq) < (?, ?) ORDER BY {ORDER.replace(', ', ' DESC, ')} DESC LIMIT 1",
        (row["chat_id"], row["pos_position"], row["pos_seq"])).fetchone()
    return chunk_summary([messages.chat_message(svc, r) for r in rows],
                         previous=before[0] if before else "",
                         budget_tokens=recent_budget(svc, len(rows)),
                         max_quotes=svc.settings.summary_max_quotes)


def _build_merge(svc: Services, job: queue.Job) -> Prompt | None:
    row = _live_target(svc, job)
    if row is None:
        return None
    children = svc.db.reader().execute(
        f"SELECT * FROM summaries WHERE parent_id=? AND text IS NOT NULL ORDER BY {ORDER}",
        (row["id"],)).fetchall()
    if not children:
        return None
    budget = svc.settings.summary_consolidated_tokens if row["tier"] == "consolidated" \
        else svc.settings.summary_long_term_tokens
    inputs = [SummaryInput(c["id"], c["text"], tuple(Quote(**q) for q in _quotes(c)))
              for c in children]
    return merge_summaries(inputs, tier=row["tier"], budget_tokens=int(budget),
                           max_quotes=svc.settings.summary_max_quotes)


def _apply(svc: Services, conn: Connection, job: queue.Job, result: Summary,
           prepared: Any) -> dict[str, Any]:
    """Store a chunk or merge result; then the tier above is merged or refreshed."""
    row = _fetch(conn, job.target["summary_id"])
    if row is None:
        return {"skipped": "the summary was deleted meanwhile"}
    out: dict[str, Any] = {"summary_id": row["id"], "tier": row["tier"]}
    if row["edited"]:
        conn.execute("UPDATE summaries SET stale=0 WHERE id=?", (row["id"],))
        return {**out, "kept": "a person's edit"}
    quotes = [asdict(q) for q in result.quotes]
    conn.execute("UPDATE summaries SET text=?, quotes=?, stale=0, updated_at=?, version=version+1"
                 " WHERE id=?", (result.text, dumps(quotes), svc.clock.iso(), row["id"]))
    was_new = row["text"] is None
    queued = _maybe_merge(svc, conn, row["chat_id"], row["tier"], job.turn_id) if was_new \
        else _parent_changed(svc, conn, row)
    return {**out, **dropped_report(result.dropped_quotes), "jobs_queued": queued}




# --- a person's edits, rebuild ---------------------------------------------------------------
def edit(svc: Services, summary_id: str, text: str, version: int | None = None) -> dict[str, Any]:
    """A person's correction: kept through later merges (they read it), never overwritten by a job."""
    with svc.db.write() as conn:
        row = _fetch(conn, summary_id)
        if row is None:
            raise NotFound("summary_not_found", f"No summary with id {summary_id!r}.")
        if version is not None and version != row["version"]:
            raise Conflict("version_conflict", f"Summary {summary_id} was changed meanwhile (version "
                           f"{row['version']}, you sent {version}); reload and retry.",
                           [{"current_version": row["version"]}])
        conn.execute("UPDATE summaries SET text=?, edited=1, stale=0, updated_at=?, version=version+1"
                     " WHERE id=?", (text, svc.clock.iso(), summary_id))
        if row["text"] is None:
            _maybe_merge(svc, conn, row["chat_id"], row["tier"], row["turn_id"])
        else:
            _parent_changed(svc, conn, row)
        return to_dict(_fetch(conn, summary_id))


def rebuild(svc: Services, chat_id: str) -> dict[str, Any]:
    """Drop every summary of the chat (edits too) and derive them again from the transcript."""
    chats.get(svc, chat_id)
    with svc.db.write() as conn:
        queue.cancel(conn, chat_id, [CHUNK, MERGE])
        dropped = conn.execute("DELETE FROM summaries WHERE chat_id=?", (chat_id,)).rowcount
        messages.clear_summaries(conn, chat_id)
        queued = compact(svc, conn, chat_id, None)
    return {"chat_id": chat_id, "dropped": dropped, "jobs_enqueued": queued}


# --- deletes and rollback --------------------------------------------------------------------
def _delete(svc: Services, conn: Connection, row: Any) -> int:
    """Delete one summary: its messages become unsummarised, its children unmerged, and the
    summary above it loses it (and goes too if it covered nothing else). Returns rows deleted."""
    conn.execute("DELETE FROM summaries WHERE id=?", (row["id"],))
    queue.cancel(conn, row["chat_id"], [CHUNK, MERGE], row["id"])
    messages.unsummarize(conn, row["id"])
    conn.execute("UPDATE summaries SET parent_id=NULL WHERE parent_id=?", (row["id"],))
    deleted = 1
    parent = _fetch(conn, row["parent_id"]) if row["parent_id"] else None
    if parent is not None:
        deleted += _uncover(svc, conn, parent, [row["id"]])
    return deleted


def _uncover(svc: Services, conn: Connection, row: Any, gone: Sequence[str]) -> int:
    """Some of what a summary covers is gone: delete it if nothing is left, else refresh it."""
    covers = [c for c in loads(row["covers"]) if c not in gone]
    if not covers:
        return _delete(svc, conn, row)
    conn.execute("UPDATE summaries SET covers=?, stale=CASE WHEN text IS NULL THEN 0 ELSE 1 END"
                 " WHERE id=?", (dumps(covers), row["id"]))
    if row["text"] is not None:
        _requeue(svc, conn, row)
    return 0


def forget_messages(svc: Services, conn: Connection, chat_id: str, rows: Sequence[Any]) -> int:
    """Deleted messages (rows read before the delete): the summaries covering them lose them."""
    gone = [r["id"] for r in rows]
    deleted = 0
    for summary_id in sorted({r["summary_id"] for r in rows if r["summary_id"]}):
        row = _fetch(conn, summary_id)
        if row is not None:
            deleted += _uncover(svc, conn, row, gone)
    return deleted


def rollback_turn(svc: Services, conn: Connection, chat_id: str, turn_id: str) -> dict[str, int]:
    """RV10: the summaries a regenerated turn's compaction created (and merges it set off) go;
    their messages are summarised again after a later turn."""
    rows = conn.execute("SELECT id FROM summaries WHERE chat_id=? AND turn_id=? ORDER BY"
                        " CASE tier WHEN 'long_term' THEN 0 WHEN 'consolidated' THEN 1 ELSE 2 END",
                        (chat_id, turn_id)).fetchall()
    deleted = 0
    for (summary_id,) in rows:
        row = _fetch(conn, summary_id)  # an earlier delete may have taken it already
        if row is not None:
            deleted += _delete(svc, conn, row)
    return {"summaries": deleted}


def delete_for_chat(conn: Connection, chat_id: str) -> int:
    return conn.execute("DELETE FROM summaries WHERE chat_id=?", (chat_id,)).rowcount


def register(jobs: JobKinds, hooks: Hooks) -> None:
    """The chunk summary and tier merge jobs (RV3)."""
    jobs.register(CHUNK, _apply, build=_build_chunk)
    jobs.register(MERGE, _apply, build=_build_merge)
