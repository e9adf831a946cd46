"""POST /v1/memories/drafts: memory drafts for the panel's review dialog (RV9c, RV9d)."""

from __future__ import annotations

from flask import Blueprint

from ..story import memory_drafts as drafts
from .common import body, svc

bp = Blueprint("drafts", __name__)


@bp.post("/memories/drafts")
def memory_drafts() -> dict:
    return drafts.make_drafts(svc(), body("memory_drafts.request"))
