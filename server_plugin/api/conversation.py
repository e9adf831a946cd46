"""The transcript: upsert, list and delete messages; delete and rename a chat (RV1, RV16, SW9a)."""

from __future__ import annotations

from flask import Blueprint

from ..story import chats, conversation, messages
from .common import body, path_id, query, svc

bp = Blueprint("conversation", __name__)


@bp.post("/chats/<chat_id>/messages")
def upsert_messages(chat_id: str) -> dict:
    data = body("messages_upsert.request")
    return conversation.ingest(svc(), path_id(chat_id, "chat id"), data["messages"])


@bp.get("/chats/<chat_id>/messages")
def list_messages(chat_id: str) -> dict:
    args = query("messages_list.query")
    chat = chats.get(svc(), path_id(chat_id, "chat id"))
    return messages.list_page(svc(), chat["id"], **args)


@bp.delete("/chats/<chat_id>/messages/<message_id>")
def delete_message(chat_id: str, message_id: str) -> dict:
    return conversation.delete_message(svc(), path_id(chat_id, "chat id"),
                                       path_id(message_id, "message id"))


@bp.delete("/chats/<chat_id>")
def delete_chat(chat_id: str) -> dict:
    return conversation.delete_chat(svc(), path_id(chat_id, "chat id"))


@bp.post("/chats/<chat_id>/rename")
def rename_chat(chat_id: str) -> dict:
    new_id = body("chat_rename.request")["new_id"]
    return {"chat": conversation.rename_chat(svc(), path_id(chat_id, "chat id"), path_id(new_id, "new id"))}
