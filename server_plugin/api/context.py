"""POST /v1/context: the per-turn assembly the extension asks for before every generation;
POST /v1/context/prefetch: its query vector embedded ahead (retrieval/prefetch.py), and the turn
it most likely starts assembled ahead (story/ahead.py)."""

from __future__ import annotations

from flask import Blueprint, g

from ..story import context
from .common import body, svc

bp = Blueprint("context", __name__)


@bp.post("/context")
def build_context() -> dict:
    result, made_ahead = context.answer(svc(), body("context.request"))
    if made_ahead:  # said in Server-Timing (app.py): the page's measurements count them
        g.chronicler_timing_marks = ("ahead",)
    return result


@bp.post("/context/prefetch")
def prefetch_query() -> tuple[dict, int]:
    data = body("context_prefetch.request")
    return {"started": context.prefetch(svc(), data["chat_id"], data["text"])}, 202
