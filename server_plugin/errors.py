"""Errors that carry their meaning to the HTTP edge: a status, a snake_case code, a sentence.

Domain modules raise these; the app turns every one (and every other failure) into the single
error envelope `{"ok": false, "error": {"code", "message", "details"}}`.
"""

from __future__ import annotations

from typing import Any


class ChroniclerError(Exception):
    """Base of all errors a client may see. Subclasses fix the HTTP status."""

    status = 400

    def __init__(self, code: str, message: str, details: list[Any] | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.details = details or []


class BadRequest(ChroniclerError):
    status = 400


class Unauthorized(ChroniclerError):
    status = 401


class Forbidden(ChroniclerError):
    status = 403


class NotFound(ChroniclerError):
    status = 404


class Conflict(ChroniclerError):
    status = 409


class PayloadTooLarge(ChroniclerError):
    status = 413


class UnsupportedMediaType(ChroniclerError):
    status = 415


class Unprocessable(ChroniclerError):
    status = 422


class ServiceUnavailable(ChroniclerError):
    status = 503

