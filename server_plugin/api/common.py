"""Helpers every view uses: the services, validated bodies and query strings, checked path ids."""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Any

from flask import current_app, g, request

from ..errors import BadRequest
from ..services import Services
from ..stores import DEFAULT_USER, Stores
from .schemas import default_schemas
from .security import sqlite_int

EXTENSION_KEY = "chronicler"


def svc() -> Services:
    """The store this request is for (app.py chooses it per request; one store in direct mode)."""
    chosen = g.get("chronicler_services")
    return chosen if chosen is not None else current_app.extensions[EXTENSION_KEY]


def stores() -> Stores:
    """Every store the sidecar serves (stores.py)."""
    return current_app.extensions["chronicler_stores"]


def store_handle() -> str:
    """The user handle of this request's store ('default-user' in direct mode)."""
    return g.get("chronicler_store") or DEFAULT_USER


def body(schema: str) -> dict[str, Any]:
    """The request's JSON body, validated against `shared_schema/<schema>.json`."""
    data = g.get("json_body")
    if data is None:
        data = {}
    default_schemas().validate(schema, data)
    return data


def _typed(value: str, spec: dict[str, Any]) -> Any:
    """A query-string value converted to the type its schema property declares."""
    kind = spec.get("type")
    if kind == "boolean":
        lowered = value.lower()
        return True if lowered == "true" else False if lowered == "false" else value
    if kind == "integer":
        try:
            return sqlite_int(value)
        except ValueError:
            return value  # left a string: the schema check then says it is not an integer
    return value


def query(schema: str) -> dict[str, Any]:
    """The query string as a dict of typed values, validated against `<schema>.json`."""
    spec = default_schemas().schemas[schema].get("properties", {})
    data: dict[str, Any] = {}
    for key in request.args:
        values = request.args.getlist(key)
        if len(values) > 1:
            raise BadRequest("invalid_request", f"Query parameter {key!r} was given more than once.")
        data[key] = _typed(values[0], spec.get(key, {}))
    default_schemas().validate(schema, data, what="query string")
    return data


@lru_cache(maxsize=1)
def _id_pattern() -> re.Pattern[str]:
    """The id rule of shared_schema/common.json, so an id valid in a body is valid in a path."""
    return re.compile(default_schemas().schemas["common"]["$defs"]["id"]["pattern"])


def path_id(value: str, what: str = "id") -> str:
    """A client id taken from the path, by the same rule as ids in bodies (API.md "Ids")."""
    limit = svc().settings.max_id_length
    if not value or len(value) > limit or not _id_pattern().search(value):
        raise BadRequest("invalid_id", f"The {what} in the path must be 1 to {limit} characters, "
                         "without control characters or '/'.")
    return value
