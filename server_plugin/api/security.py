"""Security by default: bearer token, exact Origin allowlist, Host check, JSON only, size and depth limits.

Every request passes, in this order: Host (against DNS rebinding), Origin (exact allowlist; a CORS
preflight from an allowed origin then goes on without a token, as browsers send it without
credentials), the bearer token (except for GET /v1/health), then for bodies: size, content type,
strict JSON (no NaN/Infinity, no duplicate keys, bounded nesting, valid Unicode). A refused request
changes nothing (rule RV17).
"""

from __future__ import annotations

import hmac
import json
import re
import tempfile
from typing import IO, Any

from flask import Flask, current_app, g, request

from ..errors import BadRequest, Forbidden, PayloadTooLarge, Unauthorized, UnsupportedMediaType
from ..settings import Settings
from ..stores import HANDLE

LOOPBACK_NAMES = {"127.0.0.1", "localhost", "::1"}
PUBLIC_PATHS = {"/v1/health"}
BODY_METHODS = {"POST", "PUT", "PATCH", "DELETE"}
_MESSAGES_PATH = re.compile(r"/v1/chats/[^/]+/messages/?")
STORE_IMPORT_PATH = "/v1/import"  # a whole store: its own limit, read through a temporary file
SPOOL_CHUNK = 1 << 20
# The SillyTavern user a request is for, set by the server plugin (per-user mode only).
STORE_HEADER = "X-Chronicler-User"


def token_matches(header: str | None, token: str) -> bool:
    """Constant-time check of an `Authorization: Bearer …` header."""
    if not header or not header.startswith("Bearer "):
        return False
    return hmac.compare_digest(header[len("Bearer "):].strip().encode(), token.encode())


# --- Host and Origin -------------------------------------------------------------------------
def split_host(host: str) -> tuple[str, int | None]:
    """'example.com:80' -> ('example.com', 80); '[::1]:7711' -> ('::1', 7711)."""
    match = re.fullmatch(r"\[([^\]]+)\](?::(\d+))?|([^:\[\]]+)(?::(\d+))?", host.strip())
    if not match:
        return "", None
    name = (match.group(1) or match.group(3) or "").lower()
    port = match.group(2) or match.group(4)
    return name, int(port) if port else None


class Guard:
    """The request checks, configured from settings; `ports` may be updated once the server binds."""

    def __init__(self, settings: Settings, token: str, *, per_user: bool = False) -> None:
        self.settings = settings
        self.token = token
        self.per_user = per_user
        self.origins = set(settings.origins)
        names = set(LOOPBACK_NAMES)
        if settings.host not in {"0.0.0.0", "::", ""}:
            names.add(settings.host.lower())
        self.host_names = names | {split_host(h)[0] for h in settings.allowed_hosts}
        self.ports = {settings.port} if settings.port else set()

    def check_host(self) -> None:
        name, port = split_host(request.host or "")
        if name not in self.host_names or (port is not None and self.ports and port not in self.ports):
            raise Forbidden("host_not_allowed", f"Host {request.host!r} is not this sidecar's address; "
                            "add it to allowed_hosts if you really reach it by that name.")

    def check_origin(self) -> None:
        origin = request.headers.get("Origin")
        if origin is not None and origin not in self.origins:
            raise Forbidden("origin_not_allowed", f"Origin {origin!r} is not allowed. Add it to the "
                            "origins setting (CHRONICLER_ORIGINS) if it is your SillyTavern.")

    def check_token(self) -> None:
        if not token_matches(request.headers.get("Authorization"), self.token):
            raise Unauthorized("unauthorized", "A valid 'Authorization: Bearer <token>' header is "
                               "required; the token is in the sidecar's data folder.")

    def store_handle(self) -> str | None:
        """The user handle whose store this request is for; None: the default store.

        Only in per-user mode, and only with the token (which only the server plugin knows there):
        the browser never reaches the sidecar itself, and the plugin sets the header from the
        SillyTavern session, so no browser can choose another user's store.
        """
        name = request.headers.get(STORE_HEADER)
        if name is None:
            return None
        if not self.per_user:
            raise BadRequest("store_header_refused", f"This sidecar serves one store; {STORE_HEADER} "
                             "is for the SillyTavern server plugin's sidecar (serve --per-user).")
        if not token_matches(request.headers.get("Authorization"), self.token):
            return None  # a public route asked without the token: the default store answers
        if not HANDLE.fullmatch(name):
            raise BadRequest("invalid_user", f"{STORE_HEADER} must be a SillyTavern user handle.")
        return name

    def store_import(self) -> bool:
        return request.method == "POST" and request.path.rstrip("/") == STORE_IMPORT_PATH

    def body_limit(self) -> int:
        if self.store_import():
            return self.settings.max_store_import_bytes
        if request.path.rstrip("/").endswith("/import"):  # a card, a World Info file
            return self.settings.max_import_bytes
        if request.method == "POST" and _MESSAGES_PATH.fullmatch(request.path):
            # A batch of long messages (100,000 characters each) must not turn into a 413.
            return self.settings.max_messages_body_bytes
        return self.settings.max_body_bytes

    def read_body(self) -> None:
        """Check size and type of a body and parse it into g.json_body (None when there is none)."""
        g.json_body = None
        limit = self.body_limit()
        length = request.content_length
        if length is not None and length > limit:
            raise PayloadTooLarge("payload_too_large", f"The body has {length} bytes; at most {limit} "
                                  "are accepted here.", [{"max_bytes": limit}])
        if self.store_import():  # hundreds of MB: never held twice (spool, then parse)
            g.json_body = self._read_spooled(limit)
            return
        raw = request.get_data(cache=True)
        if len(raw) > limit:
            raise _too_large(limit)
        if not raw:
            return
        self._check_type()
        g.json_body = parse_json(raw, self.settings.max_json_depth)

    def _check_type(self) -> None:
        if request.mimetype != "application/json":
            raise UnsupportedMediaType("unsupported_media_type", "Bodies must be sent as "
                                       f"'Content-Type: application/json' (got {request.mimetype or 'none'!r}).")
        charset = request.mimetype_params.get("charset", "utf-8").lower()
        if charset not in {"utf-8", "utf8"}:
            raise UnsupportedMediaType("unsupported_media_type", "JSON bodies must be UTF-8.")

    def _read_spooled(self, limit: int) -> Any:
        """The body read in chunks into a temporary file (in memory while small), its size and
        nesting measured on the way; then parsed from the file: the raw bytes are never kept
        beside the parsed document."""
        meter, size, max_depth = DepthMeter(), 0, self.settings.max_json_depth
        with tempfile.SpooledTemporaryFile(max_size=8 * SPOOL_CHUNK) as spool:
            while chunk := request.stream.read(SPOOL_CHUNK):
                size += len(chunk)
                if size > limit:
                    raise _too_large(limit)
                meter.feed(chunk)
                if meter.deepest > max_depth:
                    raise _too_deep(max_depth)
                spool.write(chunk)
            if not size:
                return None
            self._check_type()
            spool.seek(0)
            return parse_text(_decoded(spool))


def _decoded(spool: IO[bytes]) -> str:
    """The spooled body as text (its bytes are freed once decoded)."""
    try:
        return spool.read().decode("utf-8")
    except UnicodeError as exc:
        raise BadRequest("invalid_json", f"The body is not valid JSON: {exc}") from None


def _too_large(limit: int) -> PayloadTooLarge:
    return PayloadTooLarge("payload_too_large", f"The body is larger than {limit} bytes.", [{"max_bytes": limit}])


def _too_deep(max_depth: int) -> BadRequest:
    return BadRequest("too_deep", f"The JSON body nests deeper than {max_depth} levels.", [{"max_depth": max_depth}])


# --- strict JSON -----------------------------------------------------------------------------
_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.S)
_BRACKETS = re.compile(rb"[\[\]{}]")


def json_depth(raw: bytes) -> int:
    """Deepest nesting of arrays/objects, found without parsing (so a deep body cannot recurse)."""
    depth = deepest = 0
    for match in _BRACKETS.finditer(_STRING.sub(b'""', raw)):
        if match.group() in (b"[", b"{"):
            depth += 1
            deepest = max(deepest, depth)
        else:
            depth -= 1
    return deepest


class DepthMeter:
    """`json_depth` of a body fed in chunks (a string may run across chunks): strings are skipped
    by one match each, brackets counted outside them."""

    _INSIDE = re.compile(rb'(?:[^"\\]|\\.)*', re.S)  # the rest of a string, up to its closing quote
    _OUTSIDE = re.compile(rb'["\[\]{}]')

    def __init__(self) -> None:
        self.depth = self.deepest = 0
        self.in_string = False
        self.carry = b""  # a backslash that ended a chunk inside a string

    def feed(self, chunk: bytes) -> None:
        data, at = self.carry + chunk, 0
        self.carry = b""
        while at < len(data):
            if self.in_string:
                at = self._INSIDE.match(data, at).end()  # type: ignore[union-attr]  (always matches)
                if at < len(data) and data[at:at + 1] == b'"':
                    self.in_string, at = False, at + 1
                elif at < len(data):  # a lone backslash at the end: it escapes the next chunk's byte
                    self.carry, at = data[at:], len(data)
                continue
            found = self._OUTSIDE.search(data, at)
            if found is None:
                return
            token, at = found.group(), found.end()
            if token == b'"':
                self.in_string = True
            elif token in (b"[", b"{"):
                self.depth += 1
                self.deepest = max(self.deepest, self.depth)
            else:
                self.depth -= 1


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number JSON allows")


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicate key {key!r}")
        out[key] = value
    return out


SQLITE_INT_MIN, SQLITE_INT_MAX = -(2 ** 63), 2 ** 63 - 1


def sqlite_int(text: str) -> int:
    """An integer that fits SQLite's 64 bits (a bigger one cannot be stored or compared there)."""
    value = int(text)
    if not SQLITE_INT_MIN <= value <= SQLITE_INT_MAX:
        raise ValueError(f"the integer {text[:30]} is out of the 64-bit range")
    return value


# Only a \u escape of a surrogate can put a lone one in a parsed string (UTF-8 cannot hold one).
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def parse_json(raw: bytes, max_depth: int) -> Any:
    """Parse a request body strictly, or raise BadRequest/PayloadTooLarge with a clear message."""
    if json_depth(raw) > max_depth:
        raise _too_deep(max_depth)
    try:
        text = raw.decode("utf-8")
    except UnicodeError as exc:
        raise BadRequest("invalid_json", f"The body is not valid JSON: {exc}") from None
    return parse_text(text)


def parse_text(text: str) -> Any:
    """`parse_json` of a decoded body whose nesting was measured already."""
    try:
        value = json.loads(text, parse_constant=_reject_constant, object_pairs_hook=_no_duplicates,
                           parse_int=sqlite_int)
        if _SURROGATE_ESCAPE.search(text):  # lone surrogates cannot be stored
            json.dumps(value, ensure_ascii=False).encode("utf-8")
    except (UnicodeError, ValueError, RecursionError) as exc:
        raise BadRequest("invalid_json", f"The body is not valid JSON: {exc}") from None
    return value


# --- wiring ----------------------------------------------------------------------------------
def install(app: Flask, guard: Guard) -> None:
    """Run the checks before every request, and add safe headers to every answer."""

    @app.before_request
    def _guard() -> None:
        guard.check_host()
        guard.check_origin()
        if request.method == "OPTIONS":
            # A preflight from an allowed origin: answer it here, even for a path no route (or no
            # route with that method) serves, so the browser then sends the real request and reads
            # our JSON 404/405 instead of failing as a network error. flask-cors adds its headers.
            return current_app.make_default_options_response()
        if request.path not in PUBLIC_PATHS:
            guard.check_token()
        if request.method in BODY_METHODS:
            guard.read_body()
        else:
            g.json_body = None

    @app.after_request
    def _headers(response: Any) -> Any:
        response.headers["X-Content-Type-Options"] = "nosniff"
        response.headers["Cache-Control"] = "no-store"
        return response
