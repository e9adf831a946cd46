"""Chats: members and the memory switch (RV16); rollback of one generation (RV10)."""

from __future__ import annotations

from flask import Blueprint

from ..story import chats, sessions, turns
from .common import body, path_id, svc

bp = Blueprint("chats", __name__)


@bp.put("/chats/<chat_id>")
def put_chat(chat_id: str) -> tuple[dict, int]:
    chat, created = chats.put(svc(), path_id(chat_id, "chat id"), body("chat_put.request"))
    return {"chat": chat}, 201 if created else 200


@bp.get("/chats")
def list_chats() -> dict:
    return {"chats": chats.list_all(svc())}


@bp.get("/chats/<chat_id>")
def get_chat(chat_id: str) -> dict:
    return {"chat": chats.get(svc(), path_id(chat_id, "chat id"))}


@bp.post("/chats/<chat_id>/turns/<turn_id>/rollback")
def rollback_turn(chat_id: str, turn_id: str) -> dict:
    body("empty.request")
    return turns.rollback(svc(), path_id(chat_id, "chat id"), path_id(turn_id, "turn id"))


@bp.get("/campaigns")
def list_campaigns() -> dict:
    return {"campaigns": chats.campaigns(svc())}


@bp.get("/campaigns/<campaign_id>/sessions")
def campaign_sessions(campaign_id: str) -> dict:
    return {"sessions": sessions.campaign_sessions(svc(), path_id(campaign_id, "campaign id"))}


@bp.get("/campaigns/<campaign_id>/recap")
def campaign_recap(campaign_id: str) -> dict:
    return sessions.campaign_recap(svc(), path_id(campaign_id, "campaign id"))
