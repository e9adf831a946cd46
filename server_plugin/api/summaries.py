"""Rolling summaries (RV3) and sessions (SW2): read, edit, rebuild, end, fetch one in full."""

from __future__ import annotations

from flask import Blueprint

from ..errors import BadRequest
from ..story import sessions, summaries
from .common import body, path_id, svc

bp = Blueprint("summaries", __name__)


@bp.get("/chats/<chat_id>/summaries")
def list_summaries(chat_id: str) -> dict:
    return summaries.listing(svc(), path_id(chat_id, "chat id"))


@bp.get("/summaries/<summary_id>")
def get_summary(summary_id: str) -> dict:
    return {"summary": summaries.get(svc(), path_id(summary_id, "summary id"))}


@bp.patch("/summaries/<summary_id>")
def edit_summary(summary_id: str) -> dict:
    data = body("summary_patch.request")
    return {"summary": summaries.edit(svc(), path_id(summary_id, "summary id"), data["text"],
                                      data.get("version"))}


@bp.post("/chats/<chat_id>/summaries/rebuild")
def rebuild_summaries(chat_id: str) -> dict:
    body("empty.request")
    return summaries.rebuild(svc(), path_id(chat_id, "chat id"))


@bp.post("/chats/<chat_id>/sessions/end")
def end_session(chat_id: str) -> dict:
    body("empty.request")
    return {"session": sessions.end(svc(), path_id(chat_id, "chat id"))}


@bp.get("/chats/<chat_id>/sessions")
def list_sessions(chat_id: str) -> dict:
    return {"sessions": sessions.list_sessions(svc(), path_id(chat_id, "chat id"))}


def _number(n: str) -> int:
    if not n.isdigit() or not 0 < int(n) < 10**9:
        raise BadRequest("invalid_id", "A session number is a positive integer (1, 2, …).")
    return int(n)


@bp.get("/chats/<chat_id>/sessions/<n>")
def get_session(chat_id: str, n: str) -> dict:
    return {"session": sessions.get(svc(), path_id(chat_id, "chat id"), _number(n))}


@bp.post("/chats/<chat_id>/sessions/<n>/rebuild")
def rebuild_session(chat_id: str, n: str) -> dict:
    body("empty.request")
    return sessions.resummarize(svc(), path_id(chat_id, "chat id"), _number(n))
