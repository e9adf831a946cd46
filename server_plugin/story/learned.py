"""Sheet fields learned from play, per campaign (rules SW1, CP1).

A session-end job that writes a sheet field (a model's update, a minimal draft) writes it as
today into the character's sheet (the newest value, what the panel shows) and records it here
under the campaign of the chat it learned it in. The sheet a chat's context shows is the
campaign's view: a field a person wrote or imported shows as written everywhere; a field learned
from play shows only in a campaign that learned it, with that campaign's value. A learned field
with no record here (written before campaigns existed, or by a model outside any chat) shows as
stored, as it did before.

Owns: sheet_learned.
"""

from __future__ import annotations

from typing import Any, Iterable

from ..services import Services
from ..store.db import Connection
from . import characters, chats


def record(svc: Services, conn: Connection, character_id: str, chat_id: str | None,
           fields: dict[str, Any], kept: Iterable[str] = ()) -> int:
    """Record fields a job learned from a chat's play under its campaign (inside a write);
    `kept` (fields a person protects) are not learned. Returns how many were recorded."""
    campaign = chats.campaign_of(conn, chat_id)
    if campaign is None:
        return 0
    blocked = set(kept)
    rows = [(character_id, campaign, f, str(v), svc.clock.iso())
            for f, v in fields.items() if f not in blocked and isinstance(v, str)]
    conn.executemany("INSERT INTO sheet_learned(character_id, campaign_id, field, value, updated_at)"
                     " VALUES (?,?,?,?,?) ON CONFLICT(character_id, campaign_id, field) DO UPDATE SET"
                     " value=excluded.value, updated_at=excluded.updated_at", rows)
    return len(rows)


def _learned(conn: Connection, character_id: str) -> dict[str, dict[str, str]]:
    """{field: {campaign: value}} of one character."""
    out: dict[str, dict[str, str]] = {}
    for r in conn.execute("SELECT campaign_id, field, value FROM sheet_learned WHERE character_id=?",
                          (character_id,)):
        out.setdefault(r["field"], {})[r["campaign_id"]] = r["value"]
    return out


def view(conn: Connection, character: dict[str, Any], campaign_id: str | None) -> dict[str, Any]:
    """The character as a chat of this campaign reads it (None: a person, the stored sheet)."""
    if campaign_id is None:
        return character
    learned = _learned(conn, character["id"])
    if not learned:
        return character
    protected = characters.protected_fields(character)
    sheet: dict[str, Any] = {}
    for field, value in character["sheet"].items():
        by_campaign = learned.get(field)
        if field in protected or by_campaign is None:
            sheet[field] = value
        elif campaign_id in by_campaign:
            sheet[field] = by_campaign[campaign_id]
    return {**character, "sheet": sheet}


def chat_moved(svc: Services, conn: Connection, chat_id: str, old: str, new: str,
               left: list[str]) -> dict[str, int]:
    """CP1: what a chat's play taught goes with it to its new campaign. Learned fields are kept
    per campaign, not per chat: the new campaign gains the old one's fields it lacks, and the old
    campaign keeps them while other chats remain in it (their play may have taught them too)."""
    n = conn.execute("INSERT OR IGNORE INTO sheet_learned(character_id, campaign_id, field, value,"
                     " updated_at) SELECT character_id, ?, field, value, updated_at FROM sheet_learned"
                     " WHERE campaign_id=?", (new, old)).rowcount
    if not left:
        conn.execute("DELETE FROM sheet_learned WHERE campaign_id=?", (old,))
    return {"sheet_fields": n}


def forget_character(conn: Connection, character_id: str) -> None:
    """A deleted character's learned fields go with it (inside the deleting write)."""
    conn.execute("DELETE FROM sheet_learned WHERE character_id=?", (character_id,))
