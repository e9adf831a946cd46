"""Campaign notes (SW3): per-chat open threads with a priority, written by a person or a job."""

from __future__ import annotations

from flask import Blueprint

from ..story import notes
from .common import body, path_id, query, svc

bp = Blueprint("notes", __name__)


@bp.post("/chats/<chat_id>/notes")
def create_note(chat_id: str) -> tuple[dict, int]:
    return {"note": notes.create(svc(), path_id(chat_id, "chat id"), body("note_create.request"))}, 201


@bp.get("/chats/<chat_id>/notes")
def list_notes(chat_id: str) -> dict:
    args = query("notes_list.query")
    return {"notes": notes.list_notes(svc(), path_id(chat_id, "chat id"), args.get("status"))}


@bp.get("/notes/<note_id>")
def get_note(note_id: str) -> dict:
    return {"note": notes.get(svc(), path_id(note_id, "note id"))}


@bp.patch("/notes/<note_id>")
def update_note(note_id: str) -> dict:
    return {"note": notes.update(svc(), path_id(note_id, "note id"), body("note_patch.request"))}


@bp.delete("/notes/<note_id>")
def delete_note(note_id: str) -> dict:
    return notes.delete(svc(), path_id(note_id, "note id"))
