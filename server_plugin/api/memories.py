"""Saved memories: create, list, get, edit, delete, delete-all (RV19) and the per-turn set (RV7)."""

from __future__ import annotations

from flask import Blueprint

from ..story import memories
from .common import body, path_id, query, svc

bp = Blueprint("memories", __name__)


def _with_archived(memory: dict) -> dict:
    archived = memory.pop("archived_ids", [])
    return {"memory": memory, "archived_ids": archived}


@bp.post("/memories")
def create_memory() -> tuple[dict, int]:
    return _with_archived(memories.create(svc(), body("memory_create.request"))), 201


@bp.get("/memories")
def list_memories() -> dict:
    return {"memories": memories.list_memories(svc(), **query("memories_list.query"))}


@bp.get("/memories/for-turn")
def memories_for_turn() -> dict:
    args = query("memories_for_turn.query")
    return memories.for_turn(svc(), args["chat_id"], args["speaker_id"])


@bp.post("/memories/delete-all")
def delete_all_memories() -> dict:
    return memories.delete_all(svc(), body("memories_delete_all.request"))


@bp.get("/memories/<memory_id>")
def get_memory(memory_id: str) -> dict:
    return {"memory": memories.get(svc(), path_id(memory_id, "memory id"))}


@bp.patch("/memories/<memory_id>")
def update_memory(memory_id: str) -> dict:
    return _with_archived(memories.update(svc(), path_id(memory_id, "memory id"),
                                          body("memory_patch.request")))


@bp.delete("/memories/<memory_id>")
def delete_memory(memory_id: str) -> dict:
    args = query("memory_delete.query")
    return memories.delete(svc(), path_id(memory_id, "memory id"), args["actor"])
