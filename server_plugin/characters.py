"""The cast: characters with their sheets (secrets included), aliases and the learn-from-chat switch."""

from __future__ import annotations

from typing import Any

from .db import Connection, dumps, loads
from .errors import NotFound
from .services import Services


def to_dict(row: Any) -> dict[str, Any]:
    """A character as the API shows it (a person sees everything, secrets included)."""
    return {
        "id": row["id"],
        "name": row["name"],
        "aliases": loads(row["aliases"]),
        "sheet": loads(row["sheet"]),
        "is_player": bool(row["is_player"]),
        "learn_from_chat": bool(row["learn_from_chat"]),
        "created_at": row["created_at"],
        "updated_at": row["updated_at"],
    }


def fetch(conn: Connection, character_id: str) -> dict[str, Any] | None:
    row = conn.execute("SELECT * FROM characters WHERE id=?", (character_id,)).fetchone()
    return None if row is None else to_dict(row)


def get(svc: Services, character_id: str) -> dict[str, Any]:
    """One character, or NotFound."""
    found = fetch(svc.db.reader(), character_id)
    if found is None:
        raise NotFound("character_not_found", f"No character with id {character_id!r}.")
    return found


def list_all(svc: Services) -> list[dict[str, Any]]:
    rows = svc.db.reader().execute("SELECT * FROM characters ORDER BY name COLLATE NOCASE, id")
    return [to_dict(r) for r in rows]


def put(svc: Services, character_id: str, data: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    """Create or replace a character; returns it and whether it was created.

    A field left out keeps its stored value (or the default for a new character), so a client
    re-registering a card never flips a switch a person set in the panel.
    """
    now = svc.clock.iso()
    with svc.db.write() as conn:
        existing = fetch(conn, character_id)
        base = existing or {"aliases": [], "sheet": {}, "is_player": False, "learn_from_chat": True}
        merged = {**base, **data}
        values = (merged["name"], dumps(merged["aliases"]), dumps(merged["sheet"]),
                  int(merged["is_player"]), int(merged["learn_from_chat"]), now)
        if existing is None:
            conn.execute(
                "INSERT INTO characters(name, aliases, sheet, is_player, learn_from_chat, updated_at,"
                " id, created_at) VALUES (?,?,?,?,?,?,?,?)", (*values, character_id, now))
        else:
            conn.execute(
                "UPDATE characters SET name=?, aliases=?, sheet=?, is_player=?, learn_from_chat=?,"
                " updated_at=? WHERE id=?", (*values, character_id))
        return fetch(conn, character_id), existing is None  # type: ignore[return-value]


def delete(svc: Services, character_id: str) -> dict[str, Any]:
    """Delete a character; its memories become global instead of disappearing (rule RV6)."""
    from . import memories  # memories depends on characters for checks; import here, not at top

    with svc.db.write() as conn:
        if fetch(conn, character_id) is None:
            raise NotFound("character_not_found", f"No character with id {character_id!r}.")
        moved = memories.make_global(svc, conn, character_id)
        conn.execute("DELETE FROM chat_members WHERE character_id=?", (character_id,))
        conn.execute("DELETE FROM characters WHERE id=?", (character_id,))
    return {"deleted": character_id, "memories_made_global": moved}


def learning_enabled(conn: Connection, character_id: str | None) -> bool:
    """Rule RV14: False when the character exists and has learn_from_chat switched off."""
    if character_id is None:
        return True
    row = conn.execute("SELECT learn_from_chat FROM characters WHERE id=?", (character_id,)).fetchone()
    return row is None or bool(row[0])
