"""POST /v1/context: the per-turn assembly the extension asks for before every generation."""

from __future__ import annotations

from flask import Blueprint

from ..story import context
from .common import body, svc

bp = Blueprint("context", __name__)


@bp.post("/context")
def build_context() -> dict:
    return context.build(svc(), body("context.request"))
