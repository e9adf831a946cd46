"""POST /v1/search: hybrid search over the store, for a person or as one character knows it (SW6, SW9b)."""

from __future__ import annotations

from flask import Blueprint

from ..retrieval import search
from ..story import chats
from .common import body, svc

bp = Blueprint("search", __name__)


@bp.post("/search")
def search_route() -> dict:
    data = body("search.request")
    chat_id = data.get("chat_id")
    # CP1: a chat's search covers every chat of its campaign (witness rules still apply).
    chat_ids = chats.same_campaign(svc().db.reader(), chat_id) if chat_id else None
    return {"results": search.search(svc(), data["query"], viewer_id=data.get("viewer_id"),
                                     chat_id=chat_id, chat_ids=chat_ids, kinds=data.get("kinds"),
                                     k=data.get("k", 10))}
