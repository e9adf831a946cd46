"""Saved memories: scopes, pins, quotas, actors, archive, per-turn selection and rollback.

Rules: RV4 (scope: one character or global), RV5 (a group reads every member's scope plus global),
RV6 (a deleted character's memories become global), RV7 (per-turn selection), RV8 (quotas; overflow
archives, never deletes), RV10–RV12 (who may change what; rollback by turn), RV14 (learn from chat),
RV16 (memory switched off for a chat), RV19 (delete all in two steps), SW9b (known_by), CP1 (a
memory a model or a job filed in a chat belongs to that chat's campaign and is read only there,
until a person moves it: a person's PATCH with a `scope` releases it to that scope everywhere).

Owns: memories.
"""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any, Iterable

from ..clock import to_iso
from ..errors import Conflict, Forbidden, NotFound, Unprocessable
from ..hooks import Hooks
from ..jobs.queue import JobKinds
from ..retrieval import docs
from ..retrieval.visibility import known_by_sql
from ..services import Services
from ..store import changes
from ..store.db import Connection, dumps, loads
from . import characters, chats

KIND = "memory"
PERSON = "user"  # the only actor allowed to touch pinned items (RV11)


# --- reading ---------------------------------------------------------------------------------
def recent_threshold(svc: Services) -> str:
    """Updated at or after this ISO time means `recent` (RV7); ISO strings of ours sort as times."""
    return to_iso(svc.clock.now() - timedelta(days=svc.settings.recent_days))


def to_dict(row: Any, svc: Services, threshold: str | None = None) -> dict[str, Any]:
    """A memory as the API shows it, with `recent` computed against the clock (RV7)."""
    threshold = threshold or recent_threshold(svc)
    return {
        "id": row["id"], "text": row["text"], "scope": row["scope"],
        "character_id": row["character_id"], "pinned": bool(row["pinned"]),
        "archived": bool(row["archived"]), "actor": row["actor"], "chat_id": row["chat_id"],
        "campaign_id": row["campaign_id"], "turn_id": row["turn_id"], "known_by": loads(row["known_by"]),
        "source_message_ids": _ids(row["source_message_ids"]),
        "created_at": row["created_at"], "updated_at": row["updated_at"],
        "recent": row["updated_at"] >= threshold,
        "version": row["version"],
    }


def _ids(text: str) -> list[str]:
    return [] if text == "[]" else loads(text)


def _fetch_row(conn: Connection, memory_id: str) -> Any:
    row = conn.execute("SELECT * FROM memories WHERE id=?", (memory_id,)).fetchone()
    if row is None:
        raise NotFound("memory_not_found", f"No memory with id {memory_id!r}.")
    return row


def get(svc: Services, memory_id: str) -> dict[str, Any]:
    return to_dict(_fetch_row(svc.db.reader(), memory_id), svc)


def list_memories(svc: Services, *, scope: str | None = None, character_id: str | None = None,
                  pinned: bool | None = None, archived: bool = False, chat_id: str | None = None,
                  q: str | None = None) -> list[dict[str, Any]]:
    """Memories matching every given filter; pinned first, then newest first."""
    where, args = ["archived=?"], [int(archived)]
    for column, value in (("scope", scope), ("character_id", character_id), ("chat_id", chat_id)):
        if value is not None:
            where.append(f"{column}=?")
            args.append(value)
    if pinned is not None:
        where.append("pinned=?")
        args.append(int(pinned))
    if q:
        where.append("instr(lower(text), lower(?)) > 0")
        args.append(q)
    rows = svc.db.reader().execute(
        f"SELECT * FROM memories WHERE {' AND '.join(where)}"
        " ORDER BY pinned DESC, updated_at DESC, id", args)
    threshold = recent_threshold(svc)
    return [to_dict(r, svc, threshold) for r in rows]


def newest_texts(conn: Connection, character_ids: list[str], limit: int) -> list[str]:
    """The texts of the newest `limit` memories that are global or of these characters."""
    marks = ",".join("?" * len(character_ids))
    rows = conn.execute(f"SELECT text FROM memories WHERE scope='global' OR character_id IN ({marks})"
                        " ORDER BY updated_at DESC LIMIT ?", (*character_ids, limit))
    return [r[0] for r in rows]


def scope_texts(conn: Connection, scope: str, character_id: str | None) -> list[str]:
    """The texts of every memory of one scope (archived ones too)."""
    rows = conn.execute("SELECT text FROM memories WHERE scope=? AND character_id IS ?",
                        (scope, character_id))
    return [r[0] for r in rows]


# --- checks ----------------------------------------------------------------------------------
def _check_text(svc: Services, text: str) -> None:
    limit = svc.settings.memory_max_chars
    if len(text) > limit:
        raise Unprocessable("text_too_long", f"A memory holds at most {limit} characters; "
                            f"this one has {len(text)}.", [{"max": limit, "length": len(text)}])
    if not text.strip():
        raise Unprocessable("text_empty", "A memory needs some text.")


def _scope_key(data: dict[str, Any]) -> tuple[str, str | None]:
    scope = data["scope"]
    character_id = data.get("character_id")
    if scope == "global" and character_id is not None:
        raise Unprocessable("scope_mismatch", "A global memory has no character_id.")
    if scope == "character" and not character_id:
        raise Unprocessable("scope_mismatch", "A character memory needs a character_id.")
    return scope, character_id


def _check_writer(conn: Connection, actor: str, character_id: str | None, chat_id: str | None,
                  pinned: bool, creating: bool = True) -> None:
    """Who may write where: RV11 (pins are the person's), RV14, RV16.

    A person editing an existing item from the panel is not "saving for a chat", so RV16 applies
    to that only when creating.
    """
    if actor != PERSON and pinned:
        raise Forbidden("pinned_protected", "Only a person may pin a memory (rule RV11).")
    if (creating or actor != PERSON) and not chats.memory_enabled(conn, chat_id):
        raise Forbidden("memory_disabled", f"Memory is switched off for chat {chat_id!r} (rule RV16).")
    if actor != PERSON and not characters.learning_enabled(conn, character_id):
        raise Forbidden("learning_disabled",
                        f"Learn from chat is off for character {character_id!r} (rule RV14).")


def _check_character(conn: Connection, character_id: str | None) -> None:
    if character_id is not None and characters.fetch(conn, character_id) is None:
        raise Unprocessable("unknown_character", f"No character with id {character_id!r}; "
                            "register it with PUT /v1/characters/{id} first.")


def _check_pin_quota(svc: Services, conn: Connection, scope: str, character_id: str | None,
                     exclude_id: str | None = None) -> None:
    limit = svc.settings.pinned_per_scope
    count = conn.execute(
        "SELECT count(*) FROM memories WHERE scope=? AND character_id IS ? AND pinned=1 AND id IS NOT ?",
        (scope, character_id, exclude_id)).fetchone()[0]
    if count >= limit:
        raise Conflict("quota_exceeded", f"This scope already has {count} pinned memories; the limit "
                       f"is {limit} (rule RV8). Unpin or delete one first.",
                       [{"scope": scope, "character_id": character_id, "pinned": count, "limit": limit}])


def _archive_overflow(svc: Services, conn: Connection, scope: str, character_id: str | None) -> list[str]:
    """RV8: beyond the unpinned quota, archive the least recently updated items (never delete)."""
    limit = svc.settings.unpinned_per_scope
    rows = conn.execute(
        "SELECT id FROM memories WHERE scope=? AND character_id IS ? AND pinned=0 AND archived=0"
        " ORDER BY updated_at DESC, id DESC", (scope, character_id)).fetchall()
    overflow = [r[0] for r in rows[limit:]]
    conn.executemany("UPDATE memories SET archived=1 WHERE id=?", [(i,) for i in overflow])
    return overflow


# --- writing ---------------------------------------------------------------------------------
def create(svc: Services, data: dict[str, Any]) -> dict[str, Any]:
    """Save one memory (RV4, RV8, RV11, RV14, RV16); returns it with `archived_ids` of any overflow."""
    text = data["text"]
    _check_text(svc, text)
    scope, character_id = _scope_key(data)
    pinned = bool(data.get("pinned", False))
    prepared = docs.prepare(svc, [text], svc.embed_wait())[0]
    memory_id = "m_" + uuid.uuid4().hex
    now = svc.clock.iso()
    with svc.db.write() as conn:
        _check_character(conn, character_id)
        _check_writer(conn, data["actor"], character_id, data.get("chat_id"), pinned)
        if pinned:
            _check_pin_quota(svc, conn, scope, character_id)
        # CP1: derived from play (a model's or a job's), it stays in the chat's campaign.
        campaign = None if data["actor"] == PERSON else chats.campaign_of(conn, data.get("chat_id"))
        conn.execute(
            "INSERT INTO memories(id, text, scope, character_id, pinned, actor, chat_id, campaign_id,"
            " turn_id, known_by, source_message_ids, created_at, updated_at)"
            " VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)",
            (memory_id, text, scope, character_id, int(pinned), data["actor"], data.get("chat_id"),
             campaign, data.get("turn_id"), dumps(_known(data.get("known_by"))),
             dumps(list(data.get("source_message_ids", []))), now, now))
        _index(conn, memory_id, prepared, now, data.get("chat_id"), character_id, data.get("known_by"),
               data.get("source_message_ids", []))
        archived = [] if pinned else _archive_overflow(svc, conn, scope, character_id)
        result = to_dict(_fetch_row(conn, memory_id), svc)
    result["archived_ids"] = archived
    return result


def _known(known_by: Iterable[str] | None) -> list[str] | None:
    return None if known_by is None else sorted(set(known_by))


def _index(conn: Connection, memory_id: str, prepared: docs.Prepared | None, created_at: str,
           chat_id: str | None, character_id: str | None, known_by: Iterable[str] | None,
           sources: Iterable[str]) -> None:
    if prepared is None:
        docs.update_meta(conn, KIND, memory_id, chat_id=chat_id, character_id=character_id,
                          known_by=_known(known_by))
    else:
        docs.put(conn, KIND, memory_id, prepared, created_at=created_at, chat_id=chat_id,
                  character_id=character_id, known_by=known_by, source_message_ids=sources)


def update(svc: Services, memory_id: str, data: dict[str, Any]) -> dict[str, Any]:
    """Edit text, pin, archive state, scope or known_by (RV8, RV11, RV12; optimistic `version`)."""
    actor = data["actor"]
    if "text" in data:
        _check_text(svc, data["text"])
    prepared = docs.prepare(svc, [data["text"]], svc.embed_wait())[0] if "text" in data else None
    with svc.db.write() as conn:
        row = _fetch_row(conn, memory_id)
        if "version" in data and data["version"] != row["version"]:
            raise Conflict("version_conflict", f"Memory {memory_id!r} was changed by someone else "
                           f"(version {row['version']}, you sent {data['version']}); reload and retry.",
                           [{"current_version": row["version"]}])
        if actor != PERSON and row["pinned"]:
            raise Forbidden("pinned_protected", "A pinned memory can only be changed by a person (rule RV11).")
        new = _merged(row, data)
        _check_writer(conn, actor, new["character_id"], row["chat_id"],
                      new["pinned"] and not row["pinned"], creating=False)
        _check_character(conn, new["character_id"])
        moved = (new["scope"], new["character_id"]) != (row["scope"], row["character_id"])
        if new["pinned"] and (not row["pinned"] or moved):
            _check_pin_quota(svc, conn, new["scope"], new["character_id"], exclude_id=memory_id)
        now = svc.clock.iso()
        # CP1: a person placing a campaign's memory in a scope moves it out of the campaign.
        released = actor == PERSON and "scope" in data and row["campaign_id"] is not None
        campaign = None if released else row["campaign_id"]
        conn.execute(
            "UPDATE memories SET text=?, scope=?, character_id=?, pinned=?, archived=?, known_by=?,"
            " campaign_id=?, updated_at=?, version=version+1 WHERE id=?",
            (new["text"], new["scope"], new["character_id"], int(new["pinned"]), int(new["archived"]),
             dumps(_known(new["known_by"])), campaign, now, memory_id))
        _index(conn, memory_id, prepared, row["created_at"], None if released else row["chat_id"],
               new["character_id"], new["known_by"], _ids(row["source_message_ids"]))
        archived = [] if new["pinned"] else _archive_overflow(svc, conn, new["scope"], new["character_id"])
        result = to_dict(_fetch_row(conn, memory_id), svc)
    result["archived_ids"] = [a for a in archived if a != memory_id]
    return result


def _merged(row: Any, data: dict[str, Any]) -> dict[str, Any]:
    """The memory after applying a patch; pinning restores an archived item (pins never archive)."""
    new = {"text": row["text"], "scope": row["scope"], "character_id": row["character_id"],
           "pinned": bool(row["pinned"]), "archived": bool(row["archived"]),
           "known_by": loads(row["known_by"])}
    for key in ("text", "pinned", "archived", "known_by"):
        if key in data:
            new[key] = data[key]
    if "scope" in data:
        new["scope"], new["character_id"] = _scope_key(data)
    if new["pinned"]:
        new["archived"] = False
    return new


def delete(svc: Services, memory_id: str, actor: str) -> dict[str, Any]:
    """Delete one memory and its index entry (RV11: a pinned one only by a person)."""
    with svc.db.write() as conn:
        row = _fetch_row(conn, memory_id)
        if actor != PERSON and row["pinned"]:
            raise Forbidden("pinned_protected", "A pinned memory can only be deleted by a person (rule RV11).")
        _delete_ids(conn, [memory_id])
    return {"deleted": memory_id}


def _delete_ids(conn: Connection, ids: list[str]) -> None:
    docs.remove(conn, KIND, ids)
    conn.executemany("DELETE FROM memories WHERE id=?", [(i,) for i in ids])


def delete_all(svc: Services, data: dict[str, Any]) -> dict[str, Any]:
    """RV19: remove every unpinned item of a scope (archived too); pinned only with include_pinned."""
    if data.get("actor", PERSON) != PERSON:
        raise Forbidden("person_only", "Only a person may delete all memories of a scope (rule RV19).")
    scope, character_id = _scope_key(data)
    include_pinned = bool(data.get("include_pinned", False))
    with svc.db.write() as conn:
        pinned_clause = "" if include_pinned else " AND pinned=0"
        ids = [r[0] for r in conn.execute(
            f"SELECT id FROM memories WHERE scope=? AND character_id IS ?{pinned_clause}",
            (scope, character_id))]
        _delete_ids(conn, ids)
        remaining = conn.execute("SELECT count(*) FROM memories WHERE scope=? AND character_id IS ?"
                                 " AND pinned=1", (scope, character_id)).fetchone()[0]
    return {"deleted": len(ids), "pinned_remaining": remaining, "include_pinned": include_pinned}


def rollback_turn(svc: Services, conn: Connection, chat_id: str, turn_id: str) -> list[str]:
    """RV10: remove what one generation wrote, except items now pinned (RV11). Inside a write."""
    ids = [r[0] for r in conn.execute(
        "SELECT id FROM memories WHERE chat_id=? AND turn_id=? AND pinned=0", (chat_id, turn_id))]
    _delete_ids(conn, ids)
    return ids


def forget_messages(svc: Services, conn: Connection, chat_id: str, gone: set[str]) -> int:
    """Unpinned memories this chat derived only from deleted messages go with them (never pinned
    ones, RV11, and never a person's)."""
    rows = conn.execute("SELECT id, source_message_ids FROM memories WHERE chat_id=? AND pinned=0 AND"
                        " actor != 'user' AND source_message_ids != '[]'", (chat_id,)).fetchall()
    doomed = [r["id"] for r in rows if set(loads(r["source_message_ids"])) <= gone]
    for memory_id in doomed:
        delete(svc, memory_id, "background")
    return len(doomed)


def make_global(svc: Services, conn: Connection, character_id: str) -> int:
    """RV6: move a character's memories to the global scope (inside the deleting transaction).

    Pinned items keep their pin even past the global pin quota (a quota refuses new pins, it never
    drops one); unpinned overflow is archived as usual (RV8).
    """
    ids = [r[0] for r in conn.execute(
        "SELECT id FROM memories WHERE scope='character' AND character_id=?", (character_id,))]
    conn.execute("UPDATE memories SET scope='global', character_id=NULL, version=version+1"
                 " WHERE scope='character' AND character_id=?", (character_id,))
    for memory_id in ids:
        docs.update_meta(conn, KIND, memory_id, character_id=None)
    _archive_overflow(svc, conn, "global", None)
    return len(ids)


# --- per-turn selection (RV5, RV7, RV14, RV16, SW9b) ----------------------------------------
def spread_evenly(available: list[int], total: int) -> list[int]:
    """Split `total` slots over lists of the given sizes as evenly as their sizes allow.

    Round-robin one slot at a time: with three full scopes and 100 slots, 34/33/33; a scope with
    fewer items than its share passes the rest to the others.
    """
    taken = [0] * len(available)
    remaining = total
    while remaining > 0:
        progressed = False
        for i, size in enumerate(available):
            if remaining and taken[i] < size:
                taken[i] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            break
    return taken


def for_turn(svc: Services, chat_id: str, speaker_id: str) -> dict[str, Any]:
    """What a character gets this turn: all pinned + up to N unpinned, newest first, spread over scopes.

    Asked before every generation and usually unchanged since the last one: the selection is cached
    until the memories, chats or characters change; only `recent` (which moves with the clock) is
    recomputed.
    """
    # Keyed by the tables the selection reads (changes.py), not by every write: messages and
    # statistics are written every turn, the memories seldom.
    key = (chat_id, speaker_id, changes.counters(svc, "memories", "chats", "characters"))
    chosen = svc.cached("for_turn", key,
                        lambda: _select_for_turn(svc, chat_id, speaker_id))
    threshold = recent_threshold(svc)
    return {**chosen, "memories": [{**m, "recent": m["updated_at"] >= threshold}
                                   for m in chosen["memories"]]}


def _select_for_turn(svc: Services, chat_id: str, speaker_id: str) -> dict[str, Any]:
    conn = svc.db.reader()
    chat = chats.fetch(conn, chat_id)
    if chat is None:
        raise NotFound("chat_not_found", f"No chat with id {chat_id!r}; register it with PUT /v1/chats/{{id}}.")
    empty = {"memories": [], "pinned_count": 0, "unpinned_count": 0, "scopes": []}
    if not chat["memory_enabled"]:
        return {**empty, "reason": "memory_disabled"}
    if not characters.learning_enabled(conn, speaker_id):
        return {**empty, "reason": "learning_disabled"}
    members = list(dict.fromkeys([speaker_id, *chat["member_ids"]]))
    scopes: list[tuple[str, str | None]] = [("global", None)] + [("character", c) for c in members]
    # The scopes involved (RV5), what the speaker may know (SW9b) and the chat's campaign (CP1),
    # as one SQL condition.
    knows, knows_args = known_by_sql(speaker_id, "memories.known_by")
    where = (f"archived=0 AND (scope='global' OR (scope='character' AND character_id IN"
             f" ({','.join('?' * len(members))}))) AND {knows}"
             " AND (campaign_id IS NULL OR campaign_id=?)")
    args = [*members, *knows_args, chat["campaign_id"]]
    pinned = conn.execute(f"SELECT * FROM memories WHERE pinned=1 AND {where}"
                          " ORDER BY updated_at DESC, id DESC", args).fetchall()
    counts = {(r[0], r[1]): r[2] for r in conn.execute(
        f"SELECT scope, character_id, count(*) FROM memories WHERE pinned=0 AND {where}"
        " GROUP BY scope, character_id", args)}
    available = [counts.get(key, 0) for key in scopes]
    shares = spread_evenly(available, svc.settings.per_turn_unpinned)
    share_of = dict(zip(scopes, shares))
    # Fetch only the newest `share` rows of each scope, not the whole store.
    ranked = conn.execute(
        f"SELECT * FROM (SELECT *, ROW_NUMBER() OVER (PARTITION BY scope, character_id"
        f" ORDER BY updated_at DESC, id DESC) AS rn FROM memories WHERE pinned=0 AND {where})"
        " WHERE rn <= ? ORDER BY updated_at DESC, id DESC", [*args, max(shares, default=0)])
    unpinned = [r for r in ranked if r["rn"] <= share_of[(r["scope"], r["character_id"])]]
    threshold = recent_threshold(svc)
    return {
        "memories": [to_dict(r, svc, threshold) for r in pinned + unpinned],
        "pinned_count": len(pinned),
        "unpinned_count": len(unpinned),
        "scopes": [{"scope": s, "character_id": c, "unpinned_available": a, "unpinned_taken": n}
                   for (s, c), a, n in zip(scopes, available, shares)],
    }


def _rollback(svc: Services, conn: Connection, chat_id: str, turn_id: str) -> dict[str, int]:
    return {"memories": len(rollback_turn(svc, conn, chat_id, turn_id))}


def _character_deleted(svc: Services, conn: Connection, character_id: str) -> dict[str, int]:
    return {"memories_made_global": make_global(svc, conn, character_id)}


def copy_for_branch(svc: Services, conn: Connection, parent_id: str, branch_id: str, campaign_id: str,
                    copied: set[str]) -> dict[str, str]:
    """CP2, CP1a: the memories a model or a job filed from the parent's messages before the
    branch point (`copied`: their ids) are copied into the branch's campaign, vectors copied.
    A person's memories are read everywhere already and are not copied. Returns {parent
    memory id: copy's id}."""
    rows = conn.execute("SELECT * FROM memories WHERE chat_id=? AND campaign_id IS NOT NULL AND"
                        " source_message_ids != '[]'", (parent_id,)).fetchall()
    mapping: dict[str, str] = {}
    for r in rows:
        if not set(loads(r["source_message_ids"])) <= copied:
            continue
        new_id = mapping[r["id"]] = chats.branch_ref(branch_id, r["id"])
        values = {**dict(r), "id": new_id, "chat_id": branch_id, "campaign_id": campaign_id}
        conn.execute(f"INSERT INTO memories({', '.join(values)}) VALUES ({','.join('?' * len(values))})",
                     tuple(values.values()))
    docs.copy_many(conn, KIND, list(mapping.items()), chat_id=branch_id)
    return mapping


def _chat_moved(svc: Services, conn: Connection, chat_id: str, old: str, new: str,
                left: list[str]) -> dict[str, int]:
    """CP1: the memories filed from a chat's play follow it to its new campaign."""
    n = conn.execute("UPDATE memories SET campaign_id=? WHERE chat_id=? AND campaign_id IS NOT NULL",
                     (new, chat_id)).rowcount
    return {"memories": n}


def register(jobs: JobKinds, hooks: Hooks) -> None:
    """A rolled-back turn takes back the memories it saved (RV10; never pinned ones, RV11); a
    deleted character's memories become global (RV6); a chat's memories follow it to another
    campaign (CP1)."""
    hooks.turn_rolled_back.connect(_rollback)
    hooks.character_deleted.connect(_character_deleted)
    hooks.chat_moved.connect(_chat_moved)
