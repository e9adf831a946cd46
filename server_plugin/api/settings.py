"""GET/PATCH /v1/settings: the settings a person changes from the drawer, per store.

A change reaches only the store the request is for (one SillyTavern user's, in per-user mode).
The API key is write-only; network and security settings are refused; a bad value is a 400 that
names the field, with nothing changed (store_settings).
"""

from __future__ import annotations

from flask import Blueprint, g

from .. import store_settings
from ..retrieval import embedders, reembed
from ..errors import BadRequest
from .common import body, store_handle, stores, svc

bp = Blueprint("settings", __name__)


def _view() -> dict:
    handle = store_handle()
    return {"ok": True, "store": handle,
            **store_settings.public_view(svc().settings, stores().changes(handle))}


@bp.get("/settings")
def get_settings() -> dict:
    return _view()


@bp.patch("/settings")
def patch_settings() -> dict:
    changes = g.get("json_body")
    if not isinstance(changes, dict) or not changes:
        raise BadRequest("invalid_request", "The body must be an object of settings to change, by name.")
    handle = store_handle()
    try:
        # Our own checks first: they name the field and say why (protected, unknown, bad value).
        merged = store_settings.check_changes(stores().base, stores().changes(handle), changes)
        body("settings_patch.request")
        missing = embedders.unavailable(store_settings.layered(stores().base, merged, stores().folder(handle)))
        if missing and "embedder" in changes:
            raise store_settings.FieldError("embedder", "embedder_unavailable", missing)
        reembed.ensure(stores().change_settings(handle, changes))  # another model: re-embed in the background
    except store_settings.FieldError as exc:
        raise BadRequest(exc.code, exc.message, [{"field": exc.field, "message": exc.message}]) from None
    return _view()
