"""Lore that grows with play (rule SW7): at each session end a `lore_growth` job reads the part
(its newest messages within `episodes_prompt_max_tokens`) with the entries it touches (those its
words trigger, then the closest by search, at most `lore_growth_entries_shown`; never all cards)
and proposes new entries and updates (jobs/tasks/lore: nothing invented, every proposal cites its
source messages). Each proposal is kept as a row with its sources, and then:

- against an entry a person wrote or edited, imported or locked (`lore.protected`): it waits for
  the person (state pending, reason "protected"); a model never overwrites such an entry;
- with `lore_growth_review = review`: it waits (reason "review") and stays out of the context
  until a person accepts it (edited or not) or rejects it;
- otherwise it is written at once as a job's entry, in the job's transaction.

A proposal repeating an entry's title or a trigger becomes an update of it (the parser checks the
entries it was shown, the apply step every entry of the chat). A grown entry belongs to the chat
it grew in (`lore.chat_id`) and is known by the witnesses of its source messages (`known_by`,
SW9b): a character who did not see them is not told by the context. Entries rest on their
sources: editing or deleting one marks the entry for review (`lore.review`); rolling back a turn
removes the proposals resting on its messages (and the entries they wrote, or puts an updated
entry back as it was) when nobody changed them since (RV10). Deleting a chat takes its proposals,
sources and grown entries along.

Owns: lore_proposals, lore_sources.
"""

from __future__ import annotations

import uuid
from typing import Any, Sequence

from ..core.triggers import ScanWindow
from ..errors import Conflict, NotFound
from ..hooks import Hooks
from ..jobs import batch, queue
from ..jobs.queue import JobKinds
from ..jobs.tasks.base import Prompt
from ..jobs.tasks.lore import LoreInput, LoreProposal, LoreProposals, lore_growth, repeated
from ..retrieval import search, visibility
from ..services import Services
from ..store.db import Connection, dumps, loads
from . import chats, lore, messages, parts

KIND = "lore_growth"
SEARCH_QUERY_CHARS = 2000  # the part's newest text a search for touched entries reads


# --- shapes ----------------------------------------------------------------------------------
def _sources(conn: Connection, owner: str, ids: Sequence[str]) -> dict[str, list[str]]:
    if not ids:
        return {}
    rows = conn.execute(f"SELECT owner_id, message_id FROM lore_sources WHERE owner=? AND owner_id IN"
                        f" ({','.join('?' * len(ids))}) ORDER BY rowid", (owner, *ids))
    out: dict[str, list[str]] = {}
    for owner_id, message_id in rows:
        out.setdefault(owner_id, []).append(message_id)
    return out


def sources_of(svc: Services, lore_ids: Sequence[str]) -> dict[str, list[str]]:
    """The messages each grown entry rests on (entries with none are left out)."""
    return _sources(svc.db.reader(), "lore", list(lore_ids))


def _to_dict(row: Any, sources: list[str]) -> dict[str, Any]:
    return {"id": row["id"], "chat_id": row["chat_id"], "lore_id": row["lore_id"], "kind": row["kind"],
            "title": row["title"], "text": row["text"], "triggers": loads(row["triggers"]),
            "known_by": loads(row["known_by"]), "state": row["state"], "reason": row["reason"],
            "sources": sources, "job_id": row["job_id"], "created_at": row["created_at"],
            "updated_at": row["updated_at"]}


def _fetch(conn: Connection, proposal_id: str) -> Any:
    row = conn.execute("SELECT * FROM lore_proposals WHERE id=?", (proposal_id,)).fetchone()
    if row is None:
        raise NotFound("proposal_not_found", f"No lore proposal with id {proposal_id!r}.")
    return row


def get(svc: Services, proposal_id: str) -> dict[str, Any]:
    conn = svc.db.reader()
    row = _fetch(conn, proposal_id)
    return _to_dict(row, _sources(conn, "proposal", [proposal_id]).get(proposal_id, []))


def list_proposals(svc: Services, *, chat_id: str | None = None, state: str | None = "pending") -> list[dict[str, Any]]:
    """Proposals, oldest first (by default the pending ones of every chat)."""
    where, args = ["1"], []
    if chat_id is not None:
        where.append("chat_id=?")
        args.append(chat_id)
    if state is not None:
        where.append("state=?")
        args.append(state)
    conn = svc.db.reader()
    rows = conn.execute(f"SELECT * FROM lore_proposals WHERE {' AND '.join(where)}"
                        " ORDER BY created_at, rowid", args).fetchall()
    found = _sources(conn, "proposal", [r["id"] for r in rows])
    return [_to_dict(r, found.get(r["id"], [])) for r in rows]


# --- the prompt --------------------------------------------------------------------------------
def touched(svc: Services, conn: Connection, chat_id: str, rows: Sequence[Any]) -> list[LoreInput]:
    """The entries of the chat the part touches, that every witness of it may know: those whose
    triggers occur in it, then the closest by search; at most `lore_growth_entries_shown`."""
    limit = svc.settings.lore_growth_entries_shown
    if not limit:
        return []
    witnesses = visibility.witnesses(conn, chat_id, [r["id"] for r in rows])
    entries = {e["id"]: e for e in lore.in_chat(conn, chat_id)
               if e["enabled"] and all(visibility.can_see(w, e["known_by"]) for w in witnesses)}
    window = ScanWindow([r["text"] for r in rows])
    picked = [i for i, e in entries.items() if window.hits(e["triggers"])][:limit]
    if len(picked) < limit and len(entries) > len(picked):
        query = " ".join(r["text"] for r in rows)[-SEARCH_QUERY_CHARS:]
        for hit in search.search(svc, query, chat_id=chat_id, kinds=[lore.KIND], k=limit * 2):
            if hit["id"] in entries and hit["id"] not in picked and len(picked) < limit:
                picked.append(hit["id"])
    return [LoreInput(i, entries[i]["title"], entries[i]["text"], tuple(entries[i]["triggers"]),
                      lore.protected(entries[i])) for i in picked]


def _queue(svc: Services, conn: Connection, chat_id: str, n: int) -> int:
    """Queue the session's lore growth (every mode: without a model the fallback proposes only
    from clear patterns), not with memory off (RV16)."""
    if not chats.memory_enabled(conn, chat_id) or batch.in_parts(svc):
        return 0  # with parts (MJ1) it comes with each part (parts.reader in register)
    queue.enqueue(svc, KIND, chat_id=chat_id, ref=str(n), target={"n": n})
    return 1


def _build(svc: Services, job: queue.Job) -> Prompt | None:
    conn = svc.db.reader()
    if not chats.memory_enabled(conn, job.chat_id):
        return None
    if "message_ids" in job.target:  # a part (MJ1)
        rows = messages.by_ids(conn, job.chat_id, job.target["message_ids"])
    else:
        rows = messages.newest_within(messages.ordered(conn, job.chat_id, "session_n=?", [int(job.target["n"])]),
                                      svc.settings.episodes_prompt_max_tokens,
                                      svc.settings.prompt_message_max_tokens)
    if not rows:
        return None
    s = svc.settings
    return lore_growth([messages.chat_message(svc, r) for r in rows], touched(svc, conn, job.chat_id, rows),
                       max_entries=s.lore_growth_max_entries, text_max_chars=s.lore_growth_text_max_chars,
                       max_triggers=s.lore_growth_max_triggers)


def _prepare(svc: Services, job: queue.Job, result: LoreProposals) -> list[Any]:
    """The search vectors of the proposals' texts, embedded before the job's write."""
    return [lore.prepare_text(svc, p.title, p.text) for p in result.proposals]


# --- writing -----------------------------------------------------------------------------------
def _add_sources(conn: Connection, owner: str, owner_id: str, chat_id: str, ids: Sequence[str]) -> None:
    conn.executemany("INSERT OR IGNORE INTO lore_sources(owner, owner_id, chat_id, message_id)"
                     " VALUES (?,?,?,?)", [(owner, owner_id, chat_id, m) for m in ids])


def _target(conn: Connection, chat_id: str, p: LoreProposal) -> dict[str, Any] | None:
    """The entry a proposal updates: the one it names, else one whose title or trigger it repeats."""
    if p.lore_id:
        found = lore.fetch(conn, p.lore_id)
        if found is not None:
            return found
    entries = {e["id"]: e for e in lore.in_chat(conn, chat_id)}
    same = repeated(p.title, p.triggers, [LoreInput(e["id"], e["title"], e["text"], tuple(e["triggers"]))
                                          for e in entries.values()])
    return entries.get(same) if same else None


def _known_by(target: dict[str, Any] | None, witnesses: list[str]) -> list[str] | None:
    """Who knows a grown entry (SW9b): its sources' witnesses; an update adds them to those who
    knew the entry (a public entry stays public)."""
    if target is None:
        return witnesses
    if target["known_by"] is None:
        return None
    return sorted(set(target["known_by"]) | set(witnesses))


def _write(svc: Services, conn: Connection, row: Any, sources: list[str], prepared: Any,
           source: str = "job") -> dict[str, Any]:
    """Write a proposal's entry (new, or over its target) and mark the proposal applied."""
    target = lore.fetch(conn, row["lore_id"]) if row["lore_id"] else None
    entry = lore.grown_entry(row["title"], row["text"], loads(row["triggers"]), loads(row["known_by"]))
    before = None if target is None else {k: target[k] for k in ("title", "text", "triggers", "known_by")}
    written = lore.write_grown(svc, conn, target["id"] if target else None, entry, row["chat_id"],
                               prepared, source)
    _add_sources(conn, "lore", written["id"], row["chat_id"], sources)
    conn.execute("UPDATE lore_proposals SET state='applied', lore_id=?, before=?, written_version=?,"
                 " updated_at=? WHERE id=?", (written["id"], dumps(before), written["version"],
                                              svc.clock.iso(), row["id"]))
    return written


def _apply(svc: Services, conn: Connection, job: queue.Job, result: LoreProposals, prepared: Any) -> dict[str, Any]:
    """Keep every proposal with its sources; write those that need no person (module docstring).
    Returns {applied: [entry ids], pending: [proposal ids], skipped: [why]}."""
    if not chats.memory_enabled(conn, job.chat_id):
        return {"skipped": "memory is switched off for this chat (RV16)"}
    out: dict[str, Any] = {"applied": [], "pending": [], "skipped": list(result.dropped)}
    review = svc.settings.lore_growth_review == "review"
    for p, vector in zip(result.proposals, prepared or [None] * len(result.proposals)):
        sources = [s for s in p.sources if messages.fetch(conn, job.chat_id, s) is not None]
        if not sources:
            out["skipped"].append(f"{p.title}: its source messages are gone")
            continue
        target = _target(conn, job.chat_id, p)
        reason = "protected" if target and lore.protected(target) else "review" if review else ""
        known = _known_by(target, visibility.witnesses(conn, job.chat_id, sources))
        proposal_id, now = "lp_" + uuid.uuid4().hex, svc.clock.iso()
        conn.execute(
            "INSERT INTO lore_proposals(id, chat_id, lore_id, kind, title, text, triggers, known_by,"
            " state, reason, job_id, turn_id, created_at, updated_at) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
            (proposal_id, job.chat_id, target["id"] if target else None, p.kind, p.title, p.text,
             dumps(list(p.triggers)), dumps(known), "pending", reason, job.id, job.turn_id, now, now))
        _add_sources(conn, "proposal", proposal_id, job.chat_id, sources)
        if reason:
            out["pending"].append(proposal_id)
        else:
            out["applied"].append(_write(svc, conn, _fetch(conn, proposal_id), sources, vector)["id"])
    return out


# --- a person's review -------------------------------------------------------------------------
def _pending(conn: Connection, proposal_id: str) -> Any:
    row = _fetch(conn, proposal_id)
    if row["state"] != "pending":
        raise Conflict("proposal_not_pending", f"Lore proposal {proposal_id!r} is {row['state']}, "
                       "not pending.", [{"state": row["state"]}])
    return row


def edit(svc: Services, proposal_id: str, data: dict[str, Any]) -> dict[str, Any]:
    """A person changes a pending proposal's title, text or triggers (a person's words: not
    checked against the sources)."""
    with svc.db.write() as conn:
        row = _pending(conn, proposal_id)
        title = " ".join(str(data.get("title", row["title"])).split())
        triggers = lore.normalize_triggers(data.get("triggers", loads(row["triggers"])))
        conn.execute("UPDATE lore_proposals SET title=?, text=?, triggers=?, updated_at=? WHERE id=?",
                     (title, data.get("text", row["text"]), dumps(triggers), svc.clock.iso(), proposal_id))
    return get(svc, proposal_id)


def accept(svc: Services, proposal_id: str, data: dict[str, Any] | None = None) -> dict[str, Any]:
    """A person accepts a pending proposal (with their edits): its entry is written, over a
    protected entry too (the person decided); a new entry whose title or a trigger an entry of the
    chat now has (an earlier proposal accepted meanwhile) updates that entry. Returns {proposal, entry}."""
    if data:
        edit(svc, proposal_id, data)
    row = _pending(svc.db.reader(), proposal_id)
    vector = lore.prepare_text(svc, row["title"], row["text"])
    with svc.db.write() as conn:
        row = _pending(conn, proposal_id)
        if row["lore_id"] is None:  # an entry of that title or trigger written since: update it
            target = _target(conn, row["chat_id"], LoreProposal(None, row["kind"], row["title"], row["text"],
                                                                tuple(loads(row["triggers"])), ()))
            if target is not None:
                conn.execute("UPDATE lore_proposals SET lore_id=? WHERE id=?", (target["id"], proposal_id))
                row = _fetch(conn, proposal_id)
        sources = _sources(conn, "proposal", [proposal_id]).get(proposal_id, [])
        entry = _write(svc, conn, row, sources, vector, "user" if data else "job")
    return {"proposal": get(svc, proposal_id), "entry": entry}


def reject(svc: Services, proposal_id: str) -> dict[str, Any]:
    """A person rejects a pending proposal: kept as rejected, nothing written."""
    with svc.db.write() as conn:
        _pending(conn, proposal_id)
        conn.execute("UPDATE lore_proposals SET state='rejected', updated_at=? WHERE id=?",
                     (svc.clock.iso(), proposal_id))
    return get(svc, proposal_id)


# --- the sources change ------------------------------------------------------------------------
def _resting_on(conn: Connection, owner: str, chat_id: str, message_ids: Sequence[str]) -> list[str]:
    if not message_ids:
        return []
    return [r[0] for r in conn.execute(
        f"SELECT DISTINCT owner_id FROM lore_sources WHERE owner=? AND chat_id=? AND message_id IN"
        f" ({','.join('?' * len(message_ids))})", (owner, chat_id, *message_ids))]


def _edited(svc: Services, conn: Connection, chat_id: str, rows: list[Any]) -> None:
    """Edited source messages mark the entries resting on them for review."""
    lore.mark_review(conn, _resting_on(conn, "lore", chat_id, [r["id"] for r in rows]), "source_edited")


def _deleted(svc: Services, conn: Connection, chat_id: str, message_ids: list[str]) -> dict[str, int]:
    """Deleted source messages mark their entries for review; a pending proposal none of whose
    sources is left goes."""
    marked = lore.mark_review(conn, _resting_on(conn, "lore", chat_id, message_ids), "source_deleted")
    gone = 0
    for proposal_id in _resting_on(conn, "proposal", chat_id, message_ids):
        left = [m for m in _sources(conn, "proposal", [proposal_id]).get(proposal_id, [])
                if messages.fetch(conn, chat_id, m) is not None and m not in message_ids]
        if not left:
            gone += _forget(conn, [proposal_id], state="pending")
    return {"lore_marked": marked, "lore_proposals": gone}


def _forget(conn: Connection, proposal_ids: Sequence[str], state: str | None = None) -> int:
    n = 0
    for proposal_id in proposal_ids:
        sql = "DELETE FROM lore_proposals WHERE id=?" + (" AND state=?" if state else "")
        removed = conn.execute(sql, (proposal_id, state) if state else (proposal_id,)).rowcount
        if removed:
            conn.execute("DELETE FROM lore_sources WHERE owner='proposal' AND owner_id=?", (proposal_id,))
        n += removed
    return n


def _undo(svc: Services, conn: Connection, row: Any) -> None:
    """Take back what an applied proposal wrote, unless the entry changed since (then mark it)."""
    entry = lore.fetch(conn, row["lore_id"]) if row["lore_id"] else None
    if entry is None:
        return
    if entry["version"] != row["written_version"]:
        lore.mark_review(conn, [entry["id"]], "source_rolled_back")
        return
    before = loads(row["before"])
    if before is None:
        lore.remove_in(conn, [entry["id"]])
        conn.execute("DELETE FROM lore_sources WHERE owner='lore' AND owner_id=?", (entry["id"],))
        return
    restored = lore.grown_entry(before["title"], before["text"], before["triggers"], before["known_by"])
    back = lore.write_grown(svc, conn, entry["id"], restored, entry["chat_id"],
                            lore.prepare_text(svc, before["title"], before["text"]))
    # The entry is again what the proposal before this one wrote: that one may be taken back too.
    conn.execute("UPDATE lore_proposals SET written_version=? WHERE lore_id=? AND written_version=?",
                 (back["version"], entry["id"], row["written_version"] - 1))


def _rolled_back(svc: Services, conn: Connection, chat_id: str, turn_id: str) -> dict[str, int]:
    """A rolled-back turn removes the proposals resting on its messages or written by its jobs,
    and takes back the entries they wrote (RV10)."""
    own = messages.ids_of_turn(conn, chat_id, turn_id)
    ids = set(_resting_on(conn, "proposal", chat_id, own)) | {r[0] for r in conn.execute(
        "SELECT id FROM lore_proposals WHERE chat_id=? AND turn_id=?", (chat_id, turn_id))}
    for proposal_id in sorted(ids):
        row = _fetch(conn, proposal_id)
        if row["state"] == "applied":
            _undo(svc, conn, row)
    return {"lore_proposals": _forget(conn, sorted(ids))} if ids else {}


def delete_entry(svc: Services, lore_id: str) -> dict[str, Any]:
    """A person deletes an entry: with the sources it rested on; proposals for it stay (accepted
    later, one writes a new entry)."""
    with svc.db.write() as conn:
        out = lore.delete(svc, lore_id)  # joins this write (404 when there is no such entry)
        conn.execute("DELETE FROM lore_sources WHERE owner='lore' AND owner_id=?", (lore_id,))
        conn.execute("UPDATE lore_proposals SET lore_id=NULL WHERE lore_id=? AND state='pending'", (lore_id,))
    return out


def _chat_deleted(svc: Services, conn: Connection, chat_id: str) -> dict[str, int]:
    """A deleted chat takes its proposals, their sources and the entries grown in it along."""
    n = conn.execute("DELETE FROM lore_proposals WHERE chat_id=?", (chat_id,)).rowcount
    conn.execute("DELETE FROM lore_sources WHERE chat_id=?", (chat_id,))
    return {"lore_proposals": n, "lore": lore.remove_in(conn, lore.chat_entries(conn, chat_id))}


def register(jobs: JobKinds, hooks: Hooks) -> None:
    """The session-end lore-growth job and the listeners that keep grown lore on its sources."""
    jobs.register(KIND, _apply, build=_build, prepare=_prepare)
    hooks.session_ended.connect(_queue)
    hooks.part_closed.connect(parts.reader(KIND))
    hooks.messages_edited.connect(_edited)
    hooks.messages_deleted.connect(_deleted)
    hooks.turn_rolled_back.connect(_rolled_back)
    hooks.chat_deleted.connect(_chat_deleted)
