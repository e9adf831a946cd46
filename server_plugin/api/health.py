"""GET /v1/health: answers at once, before the embedding model is ready, and without a token."""

from __future__ import annotations

from flask import Blueprint

from .. import __version__
from ..retrieval import live_index
from .common import svc

bp = Blueprint("health", __name__)


@bp.get("/health")
def health() -> dict:
    s = svc()
    return {
        "ok": True,
        "version": __version__,
        "embedder": {"model": s.embedder.model_name, "dim": s.embedder.dim, "ready": s.embedder.ready,
                     "error": s.embedder.error, "load_seconds": s.embedder.load_seconds},
        "tokenizer": s.tokens.name,
        "llm": {"mode": s.settings.llm_mode},
        "search": live_index.status(s),
    }
