"""The app factory: wires settings, database, embedder, token counter, security and the routes."""

from __future__ import annotations

import logging
import re
import time
from typing import Any, Callable

from flask import Flask, g
from flask_cors import CORS
from werkzeug.exceptions import HTTPException

from . import api, placement, priority, store_settings
from .api.common import EXTENSION_KEY
from .api.security import Guard, install
from .clock import Clock
from .core.tokens import get_counter
from .errors import ChroniclerError
from .hooks import Hooks
from .jobs import worker
from .jobs.queue import JobKinds
from .retrieval import docs, embedders, live_index, reembed
from .retrieval.embeddings import Embedder, EmbedderNotReady
from .services import Services
from .settings import Settings, ensure_token
from .store import migrations
from .store.db import Database, StorageFull, StorageUnavailable
from .stores import Stores
from .story import (branches, context, conversation, deep_memory, episodes, lore_growth, memories, parts,
                    sessions, sheets, summaries, told)

log = logging.getLogger("chronicler")


def error_body(code: str, message: str, details: list[Any] | None = None) -> dict[str, Any]:
    """The one error envelope (API.md "Transport")."""
    return {"ok": False, "error": {"code": code, "message": message, "details": details or []}}


def _snake(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_") or "error"


def _install_server_timing(app: Flask) -> None:
    """Every answer says the sidecar's own time (`Server-Timing: app;dur=<ms>`, from before the
    checks to the answer), so a caller can tell it from the path's: the page records it for each
    context call (bench/extension_overhead.py), the plugin's proxy passes it on. A route may add
    marks (`g.chronicler_timing_marks`): `ahead` on a context assembled ahead (story/ahead.py)."""

    @app.before_request
    def _started() -> None:
        g.chronicler_started = time.perf_counter()

    @app.after_request
    def _timing(response: Any) -> Any:
        started = g.get("chronicler_started")
        if started is not None:
            marks = "".join(f", {mark}" for mark in g.get("chronicler_timing_marks", ()))
            response.headers["Server-Timing"] = f"app;dur={(time.perf_counter() - started) * 1000:.1f}{marks}"
        return response


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


# Every concept that registers job kinds or listens to hooks, once, in this order: a hook's
# listeners run in it. So a rolled-back turn's saved memories go first, then what its jobs wrote
# (episodes, before the jobs go), then its jobs, summaries and notes (conversation); and at a
# session's end its character memories and scenes are queued before its sheet jobs.
CONCEPTS = (deep_memory, summaries, sessions, memories, episodes, told, sheets, branches, lore_growth,
            parts, context, conversation, docs)


def wire(jobs: JobKinds, hooks: Hooks) -> None:
    """Let every concept register its job kinds and connect its listeners (CONCEPTS)."""
    for concept in CONCEPTS:
        concept.register(jobs, hooks)


def open_store(path: Any, settings: Settings, *, migrate: bool = True) -> Database:
    """The database at `path`, migrated, with what migrations left to the application done."""
    db = Database(path, busy_timeout_ms=settings.busy_timeout_ms, synchronous=settings.sqlite_synchronous,
                  max_page_count=settings.max_page_count)
    if migrate:
        migrations.migrate(db)
        docs.analyse_pending(db)
    return db


def build_services(settings: Settings, embedder: Embedder | None = None,
                   clock: Clock | None = None) -> Services:
    """Open (and migrate) the database, wire the concepts, start loading the model: the one the
    store's vectors are of (`embedder` when it is that one; shared with every store that uses it)."""
    settings.data_path.mkdir(parents=True, exist_ok=True)
    db = open_store(settings.data_path / settings.db_file, settings)
    svc = Services(settings, db, embedder or embedders.for_key(embedders.key_of(settings), settings),
                   get_counter(settings.tokenizer), clock or Clock(), JobKinds())
    svc.embedder = reembed.store_embedder(svc, embedder).start_loading()
    wire(svc.jobs, svc.hooks)
    return svc


def _counted(wsgi_app: Callable[..., Any]) -> Callable[..., Any]:
    """The app counting its requests in flight: background work steps aside meanwhile (priority).
    A request thread that left the embedding's CPUs and never waited for its vector takes its
    own back at the end (placement)."""
    def counted(environ: dict, start_response: Callable[..., Any]) -> Any:
        try:
            with priority.serving():
                return wsgi_app(environ, start_response)
        finally:
            placement.rejoin()
    return counted


def _store_opener(settings: Settings, services: Services | None,
                  workers: dict[int, Any]) -> tuple[Callable[[Settings], Services], Callable[[Services], None]]:
    """How the app opens and closes a store: the embedding model, token counter and clock are
    made once and shared by every store; each store has its own database, worker and index."""
    first = services
    embedder = services.embedder if services else None
    clock = services.clock if services else Clock()

    def open_one(store: Settings) -> Services:
        nonlocal first
        if first is not None:  # the store a caller built (tests): its own settings stay
            svc, first = first, None
            if any(store.source_of(name) == "store settings" for name in store_settings.EDITABLE):
                svc.settings = store  # ...but what the person changed at run time applies
        else:
            svc = build_services(store, embedder=embedder, clock=clock)
        workers[id(svc)] = worker.start(svc)
        live_index.start(svc)  # builds the in-memory search index in the background
        reembed.ensure(svc)  # the settings name another model than the store's vectors': move
        return svc

    def close_one(svc: Services) -> None:
        running = workers.pop(id(svc), None)
        if running is not None:
            running.stop()
        svc.db.close()

    return open_one, close_one


def create_app(settings: Settings, *, services: Services | None = None, per_user: bool = False) -> Flask:
    """A ready Flask app (serve it with waitress; see cli.py). `per_user`: one store per
    SillyTavern user, chosen by the server plugin (stores.py); otherwise the one store."""
    token, _ = ensure_token(settings)
    app = Flask("chronicler", static_folder=None)  # no static route: an API only
    # An id holding a percent-encoded '/' arrives as '//' in the path; Werkzeug would answer with a
    # 308 redirect to the path with one slash, i.e. to ANOTHER id (and a browser re-sends the PUT
    # there). Without merging, such a path matches no route: 404 in the envelope.
    app.url_map.merge_slashes = False
    app.config["MAX_CONTENT_LENGTH"] = max(settings.max_body_bytes, settings.max_import_bytes,
                                            settings.max_messages_body_bytes, settings.max_store_import_bytes)
    app.json.sort_keys = False
    workers: dict[int, Any] = {}
    stores = Stores(settings, *_store_opener(settings, services, workers), per_user=per_user)
    app.extensions["chronicler_stores"] = stores
    app.extensions[EXTENSION_KEY] = default = stores.get()
    app.extensions["chronicler_worker"] = workers.get(id(default))
    guard = Guard(settings, token, per_user=per_user)
    app.extensions["chronicler_guard"] = guard
    # CORS for the exact allowlist only; credentials are a bearer header, never cookies.
    CORS(app, resources={r"/v1/*": {"origins": list(settings.origins)}},
         allow_headers=["Authorization", "Content-Type"],
         methods=["GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"], max_age=600,
         supports_credentials=False, expose_headers=["Server-Timing"])
    _install_server_timing(app)
    install(app, guard)

    @app.before_request
    def _choose_store() -> None:
        # After the guard: the handle is honoured only with the plugin's token (Guard.store_handle).
        handle = guard.store_handle()
        g.chronicler_store = handle or "default-user"
        g.chronicler_services = stores.get(handle)

    _install_error_envelope(app)
    api.register(app)
    app.wsgi_app = _counted(app.wsgi_app)  # type: ignore[method-assign]
    return app
