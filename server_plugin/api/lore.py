"""Lore entries and story cards (SW7): create, list, get, edit, delete, and World Info import."""

from __future__ import annotations

from flask import Blueprint

from ..sillytavern import cards
from ..story import lore
from .common import body, path_id, query, svc

bp = Blueprint("lore", __name__)


@bp.post("/lore")
def create_lore() -> tuple[dict, int]:
    return {"entry": lore.create(svc(), body("lore_create.request"))}, 201


@bp.get("/lore")
def list_lore() -> dict:
    return {"lore": lore.list_lore(svc(), **query("lore_list.query"))}


@bp.post("/lore/import")
def import_lore() -> tuple[dict, int]:
    data = body("lore_import.request")
    result = cards.import_world_info(svc(), data)
    return result, 200 if data.get("dry_run") else 201


@bp.get("/lore/stats")
def lore_stats() -> dict:
    args = query("lore_stats.query")
    return {"stats": lore.stats_list(svc(), args["chat_id"])}


@bp.get("/lore/<lore_id>")
def get_lore(lore_id: str) -> dict:
    return {"entry": lore.get(svc(), path_id(lore_id, "lore id"))}


@bp.patch("/lore/<lore_id>")
def update_lore(lore_id: str) -> dict:
    return {"entry": lore.update(svc(), path_id(lore_id, "lore id"), body("lore_patch.request"))}


@bp.delete("/lore/<lore_id>")
def delete_lore(lore_id: str) -> dict:
    return lore.delete(svc(), path_id(lore_id, "lore id"))
