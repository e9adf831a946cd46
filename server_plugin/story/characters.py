"""The cast: characters with their sheets (secrets included), aliases and the learn-from-chat switch.

Sheets grow with play (SW1), and who wrote each field is kept: `field_sources` maps a field to
"user" (a person), "import" (a card a person wrote), "model" or "background". Fields a person
wrote or imported, and fields a person locked (`locked_fields`), are never overwritten by a model
or a background job: a PUT by such an actor that would change one is refused (403), and
`update_sheet` (the jobs' way in) applies the other fields and reports the refused ones.

Owns: characters.
"""

from __future__ import annotations

from typing import Any

from ..errors import Forbidden, NotFound
from ..services import Services
from ..store.db import Connection, dumps, loads
from . import chats

PERSON = "user"
PERSON_SOURCES = ("user", "import")  # what a person wrote, by hand or in a card


def to_dict(row: Any) -> dict[str, Any]:
    """A character as the API shows it (a person sees everything, secrets included)."""
    meta = loads(row["sheet_meta"])
    return {
        "id": row["id"],
        "name": row["name"],
        "aliases": loads(row["aliases"]),
        "sheet": loads(row["sheet"]),
        "locked_fields": meta.get("locked", []),
        "field_sources": meta.get("sources", {}),
        "is_player": bool(row["is_player"]),
        "learn_from_chat": bool(row["learn_from_chat"]),
        "metadata": loads(row["metadata"]),
        "created_at": row["created_at"],
        "updated_at": row["updated_at"],
    }


def protected_fields(character: dict[str, Any]) -> set[str]:
    """Fields a model or a job may not change (SW1): locked, or written by a person."""
    sources = character.get("field_sources", {})
    return set(character.get("locked_fields", [])) | {
        f for f, s in sources.items() if s in PERSON_SOURCES}


def _changed(old: dict[str, Any], new: dict[str, Any]) -> set[str]:
    """Fields added, removed or given another value."""
    return {f for f in set(old) | set(new) if old.get(f) != new.get(f)}


def _sources(old_sheet: dict[str, Any], new_sheet: dict[str, Any], sources: dict[str, str],
             actor: str) -> dict[str, str]:
    """Provenance after a write: changed fields are the actor's, the others keep theirs."""
    changed = _changed(old_sheet, new_sheet)
    return {f: (actor if f in changed else sources.get(f, actor)) for f in new_sheet}


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


def every(conn: Connection) -> list[dict[str, Any]]:
    """Every character, by id (the context's cast)."""
    return [to_dict(r) for r in conn.execute("SELECT * FROM characters ORDER BY id")]


def names(conn: Connection) -> list[tuple[str, str, list[str]]]:
    """(id, name, aliases) of every character, oldest first (who is who by name)."""
    rows = conn.execute("SELECT id, name, aliases FROM characters ORDER BY created_at, id")
    return [(r["id"], r["name"], loads(r["aliases"])) for r in rows]


NEW_CHARACTER = {"aliases": [], "sheet": {}, "locked_fields": [], "field_sources": {},
                 "is_player": False, "learn_from_chat": True, "metadata": {}}


def put(svc: Services, character_id: str, data: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    """Create or replace a character; returns it and whether it was created.

    A field left out keeps its stored value (or the default for a new character), so a client
    re-registering a card never flips a switch a person set in the panel. `actor` (default a
    person) is recorded per changed sheet field; a model or job may not change a protected
    field nor the locks (SW1: 403 `field_protected`).
    """
    with svc.db.write() as conn:
        return write(svc, conn, character_id, data)


def write(svc: Services, conn: Connection, character_id: str, data: dict[str, Any]
          ) -> tuple[dict[str, Any], bool]:
    """`put` inside the caller's write transaction (imports write a character and its lore at once)."""
    data = dict(data)
    actor = data.pop("actor", PERSON)
    existing = fetch(conn, character_id)
    base = existing or NEW_CHARACTER
    merged = {**base, **data}
    if actor not in PERSON_SOURCES:
        touched = _changed(base["sheet"], merged["sheet"]) & protected_fields(base)
        if touched:
            raise Forbidden("field_protected", f"Sheet fields written or locked by a person cannot be "
                            f"changed by a {actor} (rule SW1): {', '.join(sorted(touched))}.",
                            [{"fields": sorted(touched)}])
        if sorted(merged["locked_fields"]) != sorted(base["locked_fields"]):
            raise Forbidden("field_protected", "Only a person may lock or unlock sheet fields (rule SW1).")
    merged["field_sources"] = _sources(base["sheet"], merged["sheet"], base["field_sources"], actor)
    meta = {"locked": sorted(set(merged["locked_fields"])), "sources": merged["field_sources"]}
    now = svc.clock.iso()
    values = (merged["name"], dumps(merged["aliases"]), dumps(merged["sheet"]), dumps(meta),
              int(merged["is_player"]), int(merged["learn_from_chat"]), dumps(merged["metadata"]), now)
    if existing is None:
        conn.execute(
            "INSERT INTO characters(name, aliases, sheet, sheet_meta, is_player, learn_from_chat,"
            " metadata, updated_at, id, created_at) VALUES (?,?,?,?,?,?,?,?,?,?)",
            (*values, character_id, now))
    else:
        conn.execute(
            "UPDATE characters SET name=?, aliases=?, sheet=?, sheet_meta=?, is_player=?,"
            " learn_from_chat=?, metadata=?, updated_at=? WHERE id=?", (*values, character_id))
    return fetch(conn, character_id), existing is None  # type: ignore[return-value]


def update_sheet(svc: Services, character_id: str, fields: dict[str, Any], actor: str,
                 name: str | None = None) -> dict[str, Any]:
    """A model's or a job's proposal for a sheet (SW1): set the given fields, except those a
    person wrote or locked, which are reported as refused. Creates the character (with `name`)
    when it does not exist yet (a recurring new character's drafted sheet).

    Returns {"character", "applied": [...], "refused": [...]}.
    """
    with svc.db.write() as conn:
        existing = fetch(conn, character_id)
        if existing is None and not name:
            raise NotFound("character_not_found", f"No character with id {character_id!r}.")
        base = existing or {**NEW_CHARACTER, "name": name}
        blocked = protected_fields(base) if actor not in PERSON_SOURCES else set()
        applied = [f for f in fields if f not in blocked and base["sheet"].get(f) != fields[f]]
        refused = [f for f in fields if f in blocked and base["sheet"].get(f) != fields[f]]
        sheet = {**base["sheet"], **{f: fields[f] for f in applied}}
        data = {"name": base["name"], "sheet": sheet, "actor": actor}
        character, _ = write(svc, conn, character_id, data)
    return {"character": character, "applied": applied, "refused": refused}


def delete(svc: Services, character_id: str) -> dict[str, Any]:
    """Delete a character; its memories become global instead of disappearing (rule RV6).

    The memories are memories' to move (`hooks.character_deleted`, in this transaction): they
    check characters, so characters does not import them."""
    with svc.db.write() as conn:
        if fetch(conn, character_id) is None:
            raise NotFound("character_not_found", f"No character with id {character_id!r}.")
        released = svc.hooks.character_deleted.tally(svc, conn, character_id)
        chats.forget_character(conn, character_id)
        conn.execute("DELETE FROM characters WHERE id=?", (character_id,))
    return {"deleted": character_id, "memories_made_global": released.get("memories_made_global", 0)}


def learning_enabled(conn: Connection, character_id: str | None) -> bool:
    """Rule RV14: False when the character exists and has learn_from_chat switched off."""
    if character_id is None:
        return True
    row = conn.execute("SELECT learn_from_chat FROM characters WHERE id=?", (character_id,)).fetchone()
    return row is None or bool(row[0])
