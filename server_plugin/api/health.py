"""GET /v1/health: answers at once, before the embedding model is ready, and without a token."""

from __future__ import annotations

from flask import Blueprint

from .. import __version__
from ..retrieval import embedders, live_index, reembed
from .common import store_handle, stores, svc

bp = Blueprint("health", __name__)

LIMITS = ("max_body_bytes", "max_import_bytes", "max_store_import_bytes", "max_messages_body_bytes",
          "max_json_depth")

# What this sidecar can do, so a client detects features from here and never by trying a route
# that may answer 400 or 404 (a red line in the browser's console).
CAPABILITIES = ("settings", "search", "sessions", "context", "message_ids", "lore", "episodes", "drafts",
                "client_jobs", "export", "import", "rollback", "notes", "summaries",
                "context_prefetch", "export_without_vectors", "context_dry_run")


@bp.get("/health")
def health() -> dict:
    s = svc()
    return {
        "ok": True,
        "version": __version__,
        # The model of the store's vectors (queries and writes use it), and a move to another.
        "embedder": {**s.embedder.status(), "wanted": embedders.key_of(s.settings),
                     "unavailable": embedders.unavailable(s.settings)},
        "reembed": reembed.status(s),
        "tokenizer": s.tokens.name,
        "llm": {"mode": s.settings.llm_mode},
        "search": live_index.status(s),
        "capabilities": list(CAPABILITIES) + (["per_user_stores"] if stores().per_user else []),
        "store": {"user": store_handle(), "per_user": stores().per_user},
        # For a proxy in front of us (the SillyTavern server plugin): it refuses what we would.
        "limits": {name: getattr(s.settings, name) for name in LIMITS},
    }
