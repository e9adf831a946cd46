"""The app factory: wires settings, database, embedder, token counter, security and the routes."""

from __future__ import annotations

import logging
import re
from typing import Any, Callable

from flask import Flask
from flask_cors import CORS
from werkzeug.exceptions import HTTPException

from . import api, priority
from .story import (conversation, episodes, sheet_updates)
from .jobs import queue
from .store import migrations
from .retrieval import search  # noqa: F401  (they register the job kinds)
from .api.common import EXTENSION_KEY
from .clock import Clock
from .store.db import Database, StorageFull, StorageUnavailable
from .retrieval.embeddings import Embedder, EmbedderNotReady
from .errors import ChroniclerError
from .api.security import Guard, ensure_token, install
from .services import Services
from .settings import Settings
from .core.tokens import get_counter

log = logging.getLogger("chronicler")


def error_body(code: str, message: str, details: list[Any] | None = None) -> dict[str, Any]:
    """The one error envelope (API.md "Transport")."""
    return {"ok": False, "error": {"code": code, "message": message, "details": details or []}}


def _snake(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_") or "error"


def _install_error_envelope(app: Flask) -> None:
    @app.errorhandler(ChroniclerError)
    def _ours(exc: ChroniclerError) -> tuple[dict, int]:
        return error_body(exc.code, exc.message, exc.details), exc.status

    @app.errorhandler(HTTPException)
    def _werkzeug(exc: HTTPException) -> Any:
        response = exc.get_response()
        response.data = app.json.dumps(error_body(_snake(exc.name), exc.description or exc.name))
        response.content_type = "application/json"
        return response

    @app.errorhandler(EmbedderNotReady)
    def _not_ready(exc: EmbedderNotReady) -> tuple[dict, int]:
        return error_body("embedder_not_ready", str(exc)), 503

    @app.errorhandler(StorageFull)
    def _full(exc: StorageFull) -> tuple[dict, int]:
        return error_body("storage_full", "The disk or the database size cap is full; nothing was "
                          "written. Free space (or raise max_page_count) and retry."), 507

    @app.errorhandler(StorageUnavailable)
    def _io(exc: StorageUnavailable) -> tuple[dict, int]:
        return error_body("storage_unavailable", f"The database could not be written: {exc}"), 503

    @app.errorhandler(Exception)
    def _unexpected(exc: Exception) -> tuple[dict, int]:
        log.exception("unexpected error")
        return error_body("internal_error", "Something went wrong inside the sidecar; its log has "
                          "the details."), 500


def build_services(settings: Settings, embedder: Embedder | None = None,
                   clock: Clock | None = None) -> Services:
    """Open (and migrate) the database and start loading the model in the background."""
    settings.data_path.mkdir(parents=True, exist_ok=True)
    db = Database(settings.data_path / settings.db_file, settings.busy_timeout_ms,
                  settings.sqlite_synchronous, settings.max_page_count)
    migrations.migrate(db)
    embedder = embedder or Embedder(settings.embedding_model, threads=settings.embed_threads,
                                    background_chunk=settings.embed_background_chunk,
                                    step_aside_seconds=settings.background_step_aside_seconds)
    embedder.start_loading()
    return Services(settings, db, embedder, get_counter(settings.tokenizer), clock or Clock())


def _counted(wsgi_app: Callable[..., Any]) -> Callable[..., Any]:
    """The app counting its requests in flight: background work steps aside meanwhile (priority)."""
    def counted(environ: dict, start_response: Callable[..., Any]) -> Any:
        with priority.serving():
            return wsgi_app(environ, start_response)
    return counted


def create_app(settings: Settings, *, services: Services | None = None) -> Flask:
    """A ready Flask app (serve it with waitress; see cli.py)."""
    services = services or build_services(settings)
    token, _ = ensure_token(settings)
    app = Flask("chronicler", static_folder=None)  # no static route: an API only
    # An id holding a percent-encoded '/' arrives as '//' in the path; Werkzeug would answer with a
    # 308 redirect to the path with one slash, i.e. to ANOTHER id (and a browser re-sends the PUT
    # there). Without merging, such a path matches no route: 404 in the envelope.
    app.url_map.merge_slashes = False
    app.config["MAX_CONTENT_LENGTH"] = max(settings.max_body_bytes, settings.max_import_bytes,
                                            settings.max_messages_body_bytes)
    app.json.sort_keys = False
    app.extensions[EXTENSION_KEY] = services
    guard = Guard(settings, token)
    app.extensions["chronicler_guard"] = guard
    # CORS for the exact allowlist only; credentials are a bearer header, never cookies.
    CORS(app, resources={r"/v1/*": {"origins": list(settings.origins)}},
         allow_headers=["Authorization", "Content-Type"],
         methods=["GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"], max_age=600,
         supports_credentials=False)
    install(app, guard)
    _install_error_envelope(app)
    api.register(app)
    app.wsgi_app = _counted(app.wsgi_app)  # type: ignore[method-assign]
    app.extensions["chronicler_worker"] = queue.start(services)
    search.start(services)  # builds the in-memory search index in the background
    return app
