"""Chats: their members, the memory switch (RV16), the context size they were last built for,
and the campaign they belong to, with the chat and message a branch was made from (CP1, CP2).

A campaign is a label chats share: a lone chat's campaign is its own id. Moving a chat to another
campaign sends `hooks.chat_moved` in the same write, so what was derived from its play moves too.

Owns: chats, chat_members.
"""

from __future__ import annotations

import hashlib
from typing import Any

from ..errors import BadRequest, NotFound
from ..services import Services
from ..store.db import Connection
from . import messages


def fetch(conn: Connection, chat_id: str) -> dict[str, Any] | None:
    row = conn.execute("SELECT * FROM chats WHERE id=?", (chat_id,)).fetchone()
    if row is None:
        return None
    members = [r[0] for r in conn.execute(
        "SELECT character_id FROM chat_members WHERE chat_id=? ORDER BY position", (chat_id,))]
    return {
        "id": row["id"],
        "title": row["title"],
        "member_ids": members,
        "memory_enabled": bool(row["memory_enabled"]),
        "context_tokens": row["context_tokens"],
        "campaign_id": row["campaign_id"] or row["id"],
        "branch_of": (None if row["branch_of_chat"] is None else
                      {"chat_id": row["branch_of_chat"], "message_id": row["branch_of_message"]}),
        "created_at": row["created_at"],
        "updated_at": row["updated_at"],
    }


def get(svc: Services, chat_id: str) -> dict[str, Any]:
    """One chat with its members, or NotFound."""
    found = fetch(svc.db.reader(), chat_id)
    if found is None:
        raise NotFound("chat_not_found", f"No chat with id {chat_id!r}.")
    return found


def list_all(svc: Services) -> list[dict[str, Any]]:
    conn = svc.db.reader()
    ids = [r[0] for r in conn.execute("SELECT id FROM chats ORDER BY updated_at DESC, id")]
    return [fetch(conn, i) for i in ids]  # type: ignore[misc]


def put(svc: Services, chat_id: str, data: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    """Create or replace a chat's members, title and memory switch; returns it and 'created'.

    A field left out keeps its stored value (as for characters): the panel can flip the memory
    switch without resending the members, and the extension can resend members without the switch.
    """
    now = svc.clock.iso()
    with svc.db.write() as conn:
        existing = fetch(conn, chat_id)
        members = list(dict.fromkeys(  # keep order, drop repeats
            data.get("member_ids", existing["member_ids"] if existing else [])))
        title = data.get("title", existing["title"] if existing else None)
        enabled = int(data.get("memory_enabled", existing["memory_enabled"] if existing else True))
        context_tokens = data.get("context_tokens", existing["context_tokens"] if existing else None)
        campaign = data.get("campaign_id") or (existing["campaign_id"] if existing else chat_id)
        branch = _branch_of(chat_id, data, existing)
        if existing is None:
            conn.execute("INSERT INTO chats(id, title, memory_enabled, context_tokens, campaign_id,"
                         " branch_of_chat, branch_of_message, created_at, updated_at)"
                         " VALUES (?,?,?,?,?,?,?,?,?)",
                         (chat_id, title, enabled, context_tokens, campaign, *branch, now, now))
        else:
            conn.execute("UPDATE chats SET title=?, memory_enabled=?, context_tokens=?, campaign_id=?,"
                         " branch_of_chat=?, branch_of_message=?, updated_at=? WHERE id=?",
                         (title, enabled, context_tokens, campaign, *branch, now, chat_id))
        if branch[0] is not None and (existing is None or existing["branch_of"] is None):
            svc.hooks.chat_branched.tally(svc, conn, chat_id, branch[0], branch[1])
        if existing is not None:
            if campaign != existing["campaign_id"]:
                left = campaign_chat_ids(conn, existing["campaign_id"])
                svc.hooks.chat_moved.tally(svc, conn, chat_id, existing["campaign_id"], campaign, left)
        conn.execute("DELETE FROM chat_members WHERE chat_id=?", (chat_id,))
        conn.executemany("INSERT INTO chat_members(chat_id, character_id, position) VALUES (?,?,?)",
                         [(chat_id, m, i) for i, m in enumerate(members)])
        return fetch(conn, chat_id), existing is None  # type: ignore[return-value]


def set_branch_point(conn: Connection, chat_id: str, message_id: str) -> None:
    """Record the message a branch was made from, found from its first upload (CP2b)."""
    conn.execute("UPDATE chats SET branch_of_message=? WHERE id=?", (message_id, chat_id))


def _branch_of(chat_id: str, data: dict[str, Any], existing: dict[str, Any] | None
               ) -> tuple[str | None, str | None]:
    """(parent chat, branch message) to store: the given `branch_of` (null: not a branch), or
    the stored one. A chat is no branch of itself."""
    if "branch_of" not in data:
        link = existing["branch_of"] if existing else None
    else:
        link = data["branch_of"]
    if link is None:
        return None, None
    if link["chat_id"] == chat_id:
        raise BadRequest("invalid_branch", "A chat cannot be a branch of itself.")
    return link["chat_id"], link.get("message_id")


def branch_ref(branch_id: str, parent_ref: str) -> str:
    """The id of a branch's copy of a parent's item (CP2): the same for the same pair, and
    never an id the parent uses."""
    return "b_" + hashlib.sha1(f"{branch_id}\x00{parent_ref}".encode()).hexdigest()[:24]


# --- campaigns (CP1) -----------------------------------------------------------------------------
def campaign_of(conn: Connection, chat_id: str | None) -> str | None:
    """The campaign a chat belongs to (its own id for a lone chat or an unknown one)."""
    if chat_id is None:
        return None
    row = conn.execute("SELECT campaign_id FROM chats WHERE id=?", (chat_id,)).fetchone()
    return chat_id if row is None or row[0] is None else row[0]


def campaign_chat_ids(conn: Connection, campaign_id: str) -> list[str]:
    """The chats of a campaign, oldest first (the campaign's time order)."""
    return [r[0] for r in conn.execute(
        "SELECT id FROM chats WHERE coalesce(campaign_id, id)=? ORDER BY created_at, id", (campaign_id,))]


def same_campaign(conn: Connection, chat_id: str) -> list[str]:
    """Every chat of this chat's campaign, oldest first (the chat itself when it is unknown)."""
    return campaign_chat_ids(conn, campaign_of(conn, chat_id) or chat_id) or [chat_id]


def campaign_story_ids(conn: Connection, campaign_id: str) -> list[str]:
    """The chats that tell a campaign's story, oldest first: its chats but those a branch of the
    same campaign copied whole (CP2c)."""
    ids = campaign_chat_ids(conn, campaign_id)
    hidden = superseded(conn, ids)
    return [c for c in ids if c not in hidden] or ids


def superseded(conn: Connection, chat_ids: list[str]) -> set[str]:
    """CP2c: the chats among these that another of them branched from at their last message (as
    "Convert to group" does): that branch holds copies of all their play, so a read across the
    chats would meet every item twice."""
    if len(chat_ids) < 2:
        return set()
    marks = ",".join("?" * len(chat_ids))
    links = conn.execute(f"SELECT DISTINCT branch_of_chat, branch_of_message FROM chats WHERE id IN ({marks})"
                         f" AND branch_of_chat IN ({marks}) AND branch_of_message IS NOT NULL",
                         (*chat_ids, *chat_ids)).fetchall()
    return {r[0] for r in links if messages.last_id(conn, r[0]) == r[1]}


def campaigns(svc: Services) -> list[dict[str, Any]]:
    """Every campaign with its chats (oldest first), newest activity first."""
    conn = svc.db.reader()
    found: dict[str, list[dict[str, Any]]] = {}
    for r in conn.execute("SELECT id FROM chats ORDER BY created_at, id"):
        chat = fetch(conn, r[0])
        found.setdefault(chat["campaign_id"], []).append(chat)  # type: ignore[index]
    out = [{"id": k, "chats": v, "updated_at": max(c["updated_at"] for c in v)} for k, v in found.items()]
    return sorted(out, key=lambda c: (c["updated_at"], c["id"]), reverse=True)


def campaign(svc: Services, campaign_id: str) -> dict[str, Any]:
    """One campaign with its chats, or NotFound."""
    for found in campaigns(svc):
        if found["id"] == campaign_id:
            return found
    raise NotFound("campaign_not_found", f"No campaign with id {campaign_id!r}.")


def memory_enabled(conn: Connection, chat_id: str | None) -> bool:
    """Rule RV16: False only for a known chat whose memory is switched off."""
    if chat_id is None:
        return True
    row = conn.execute("SELECT memory_enabled FROM chats WHERE id=?", (chat_id,)).fetchone()
    return row is None or bool(row[0])


def members(conn: Connection, chat_id: str) -> list[str]:
    return [r[0] for r in conn.execute(
        "SELECT character_id FROM chat_members WHERE chat_id=? ORDER BY position", (chat_id,))]


def title(conn: Connection, chat_id: str) -> str | None:
    """A chat's title (None when it has none, or there is no such chat)."""
    row = conn.execute("SELECT title FROM chats WHERE id=?", (chat_id,)).fetchone()
    return None if row is None else row["title"]


def forget_character(conn: Connection, character_id: str) -> None:
    """A deleted character is no member of any chat (inside the deleting write)."""
    conn.execute("DELETE FROM chat_members WHERE character_id=?", (character_id,))


def delete(conn: Connection, chat_id: str) -> None:
    """Delete the chat row (inside a write); its members go by ON DELETE CASCADE."""
    conn.execute("DELETE FROM chats WHERE id=?", (chat_id,))


def rename(conn: Connection, chat_id: str, new_id: str, now: str) -> None:
    """Give the chat row a new id (inside a write; the caller moves what points at it)."""
    conn.execute("PRAGMA defer_foreign_keys=ON")  # chat_members points at chats(id)
    conn.execute("UPDATE chats SET id=?, updated_at=? WHERE id=?", (new_id, now, chat_id))


# --- the context size it was last assembled for (RV2) ------------------------------------------
def context_tokens(conn: Connection, chat_id: str) -> int | None:
    """The context size the chat was last assembled for (None: never, or no such chat)."""
    row = conn.execute("SELECT context_tokens FROM chats WHERE id=?", (chat_id,)).fetchone()
    return row[0] if row is not None else None


def remember_context_tokens(svc: Services, chat_id: str, context_tokens: int) -> bool:
    """Record the context size a chat was just assembled for (RV2: the compaction after the turn
    then uses the same window the prompt did). Writes only when it changed; True if it did."""
    row = svc.db.reader().execute("SELECT context_tokens FROM chats WHERE id=?", (chat_id,)).fetchone()
    if row is None or row[0] == context_tokens:
        return False
    with svc.db.write() as conn:
        return conn.execute("UPDATE chats SET context_tokens=? WHERE id=?",
                            (int(context_tokens), chat_id)).rowcount > 0
