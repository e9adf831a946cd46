"""POST /v1/context: the per-turn assembly the extension asks for before every generation;
POST /v1/context/prefetch: its query vector embedded ahead (retrieval/prefetch.py)."""

from __future__ import annotations

from flask import Blueprint

from ..retrieval import prefetch
from ..story import context
from .common import body, svc

bp = Blueprint("context", __name__)


@bp.post("/context")
def build_context() -> dict:
    return context.build(svc(), body("context.request"))


@bp.post("/context/prefetch")
def prefetch_query() -> tuple[dict, int]:
    data = body("context_prefetch.request")
    return {"started": prefetch.prefetch(svc(), data["chat_id"], data["text"])}, 202
