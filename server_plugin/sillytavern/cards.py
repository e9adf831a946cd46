"""Imports from SillyTavern, each in one transaction: a character card (V1/V2/V3 JSON, or a PNG
carrying it) as a character with a sheet (SW1) and its embedded `character_book` as lore entries
(SW7); a World Info file as lore entries."""

from __future__ import annotations

from typing import Any

from ..errors import Conflict, Unprocessable
from ..services import Services
from ..story import characters, lore
from .formats import (
    IMPORT_NOTES,
    FormatError,
    decode_png_base64,
    parse_character_card,
    parse_world_info,
    read_png_card,
)

SHEET_FIELD_MAX_CHARS = 20000  # shared_schema/character.json: a sheet field's bound


def card_from_request(data: dict[str, Any]) -> dict[str, Any]:
    """The card JSON of a request: given as `card`, or read from the PNG in `png_base64`."""
    if "card" in data:
        return data["card"]
    return read_png_card(decode_png_base64(data["png_base64"]))


def default_id(name: str) -> str:
    """SillyTavern names a card's avatar file after the character: '<name>.png'."""
    return name.replace("/", "_") + ".png"


def import_card(svc: Services, data: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    """Create (or, with `replace`, replace) a character from a card; returns (result, created).

    The sheet's fields are marked as imported (a person wrote them: no model may overwrite them,
    SW1). On replace, the lore a previous import of this card created and nobody edited since
    is removed, so a re-import does not double every entry.
    """
    try:
        draft = parse_character_card(card_from_request(data))
    except FormatError as exc:
        raise Unprocessable("invalid_card", str(exc)) from None
    long = [f for f, v in draft.sheet.items() if len(v) > SHEET_FIELD_MAX_CHARS]
    if long:
        raise Unprocessable("field_too_long", f"The card's {long[0]} has more than "
                            f"{SHEET_FIELD_MAX_CHARS} characters.", [{"field": long[0]}])
    character_id = data.get("id") or default_id(draft.name)
    for entry in draft.lore:
        entry.metadata["import"]["character_id"] = character_id
    prepared = lore.prepare_drafts(svc, draft.lore)
    with svc.db.write() as conn:
        existing = characters.fetch(conn, character_id)
        if existing is not None and not data.get("replace"):
            raise Conflict("character_exists", f"A character with id {character_id!r} exists; send "
                           "'replace': true to replace it with this card.", [{"id": character_id}])
        removed = lore.remove_card_book(conn, character_id) if existing else []
        character, created = characters.write(svc, conn, character_id, {
            "name": draft.name, "aliases": draft.aliases, "sheet": draft.sheet,
            "metadata": draft.metadata, "actor": "import"})
        entries, report = lore.write_drafts(svc, conn, prepared)
    result = {"character": character, "lore": entries,
              "report": {"spec": draft.spec, "replaced": not created, "not_mapped": draft.not_mapped,
                         "lore": report, "removed_lore_ids": removed}}
    return result, created


def import_world_info(svc: Services, data: dict[str, Any]) -> dict[str, Any]:
    """Import a SillyTavern World Info file in one transaction (all entries or none).

    `data`: {world_info: <the file>, name?, known_by?, dry_run?}. The answer lists the entries
    created and, per entry of the file, its status and what was not mapped.
    """
    try:
        drafts, top = parse_world_info(data["world_info"], data.get("name"))
    except FormatError as exc:
        raise Unprocessable("invalid_world_info", str(exc)) from None
    prepared = lore.prepare_drafts(svc, drafts, data.get("known_by"))
    summary = {"format": "sillytavern_world_info", "notes": IMPORT_NOTES, "not_mapped": top}
    if data.get("dry_run"):
        return {"lore": [], "report": {**summary, "dry_run": True, "entries": lore.dry_report(prepared)}}
    with svc.db.write() as conn:
        entries, report = lore.write_drafts(svc, conn, prepared)
    return {"lore": entries, "report": {**summary, "dry_run": False, "entries": report}}
