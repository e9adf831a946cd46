"""Characters: PUT (create or replace), GET (list, one), DELETE (memories become global, RV6)."""

from __future__ import annotations

from flask import Blueprint

from ..sillytavern import cards
from ..story import characters
from .common import body, path_id, svc

bp = Blueprint("characters", __name__)


@bp.put("/characters/<character_id>")
def put_character(character_id: str) -> tuple[dict, int]:
    character, created = characters.put(svc(), path_id(character_id, "character id"),
                                        body("character_put.request"))
    return {"character": character}, 201 if created else 200


@bp.post("/characters/import")
def import_character() -> tuple[dict, int]:
    result, created = cards.import_card(svc(), body("character_import.request"))
    return result, 201 if created else 200


@bp.get("/characters")
def list_characters() -> dict:
    return {"characters": characters.list_all(svc())}


@bp.get("/characters/<character_id>")
def get_character(character_id: str) -> dict:
    return {"character": characters.get(svc(), path_id(character_id, "character id"))}


@bp.delete("/characters/<character_id>")
def delete_character(character_id: str) -> dict:
    return characters.delete(svc(), path_id(character_id, "character id"))
