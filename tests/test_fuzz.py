"""Bad input (rule OP7): property-based fuzzing of every route, generated from shared_schema/.

Routes are discovered from the app's URL map, and each view's body/query schema from its source
(`body("<schema>")`, `query("<schema>")`), so a new route family is fuzzed without a line here.
For each route Hypothesis sends valid-ish bodies and query strings (generated from the schema),
mutated ones (a field dropped, an unknown field, a value of the wrong type, huge, deeply nested or
full of Unicode edge cases), raw bytes no JSON parser should accept (NaN, Infinity, duplicate keys,
lone surrogates, invalid UTF-8, 1e999) and hostile ids in the path (`/`, `%2F`, `..`, `%00`, very
long). Every answer must be below 500, every error in the one envelope (error.response), and a
refused request must leave the store exactly as it was (a hash of every table).

FUZZ_EXAMPLES (default 30 per route) raises the count for a long run.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import os
import re
import socket
from dataclasses import dataclass
from typing import Any, Iterator
from urllib.parse import quote

import pytest
from flask import Flask
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from server_plugin import api
from server_plugin.app import build_services, create_app
from server_plugin.retrieval import live_index
from server_plugin.settings import load_settings
from tests.helpers.api import TOKEN, assert_schema
from tests.helpers.schema_strategies import ANY_JSON, Generator

EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "30"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=not os.environ.get("FUZZ_EXAMPLES"),
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.filter_too_much, HealthCheck.large_base_example])


# --- the routes ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Route:
    method: str
    rule: str                      # Flask rule, e.g. /v1/memories/<memory_id>
    body: str | None               # request schema name, when the view validates a body
    query: str | None              # query-string schema name

    @property
    def params(self) -> list[str]:
        return re.findall(r"<(?:[^:>]+:)?([^>]+)>", self.rule)

    def __str__(self) -> str:
        return f"{self.method} {self.rule}"


def discover_routes() -> list[Route]:
    """Every (method, rule) of the API with the schemas its view validates against."""
    app = Flask("routes-only")
    api.register(app)
    routes = []
    for rule in app.url_map.iter_rules():
        if rule.endpoint == "static":
            continue
        source = inspect.getsource(app.view_functions[rule.endpoint])
        body = re.search(r'\bbody\("([^"]+)"\)', source)
        query = re.search(r'\bquery\("([^"]+)"\)', source)
        for method in sorted(rule.methods - {"HEAD", "OPTIONS"}):
            routes.append(Route(method, rule.rule, body and body.group(1), query and query.group(1)))
    return routes


ROUTES = discover_routes()
BODY_METHODS = {"POST", "PUT", "PATCH", "DELETE"}


def test_route_discovery_finds_the_schemas_of_known_routes():
    """The fuzzer covers what it thinks it covers (a check on discover_routes itself)."""
    found = {str(r): (r.body, r.query) for r in ROUTES}
    assert found["POST /v1/memories"] == ("memory_create.request", None)
    assert found["PATCH /v1/memories/<memory_id>"] == ("memory_patch.request", None)
    assert found["DELETE /v1/memories/<memory_id>"] == (None, "memory_delete.query")
    assert found["GET /v1/memories/for-turn"] == (None, "memories_for_turn.query")
    assert found["PUT /v1/characters/<character_id>"] == ("character_put.request", None)
    assert len(ROUTES) >= 15


# --- one store for the whole module (Hypothesis runs many examples per test) -------------------
@pytest.fixture(scope="module")
def fuzz_app(tmp_path_factory: pytest.TempPathFactory, embedder) -> Iterator[Any]:
    data = tmp_path_factory.mktemp("fuzz") / "data"
    # No background worker: a job finishing between the two fingerprints would look like a
    # refused request that changed the store.
    cfg = load_settings({"data_dir": str(data), "token": TOKEN, "sqlite_synchronous": "NORMAL",
                         "worker_enabled": False}, environ={})
    services = build_services(cfg, embedder=embedder)
    app = create_app(cfg, services=services)
    # Nor search's background maintenance (pruning, re-embedding after a cast change), for the same
    # reason; queries still catch the index up themselves.
    live_index.stop(services)
    client = app.test_client()
    auth = {"Authorization": f"Bearer {TOKEN}"}
    for path, body in (("/v1/characters/hero.png", {"name": "Hero"}),
                       ("/v1/characters/Mira", {"name": "Mira"}),
                       ("/v1/chats/Seraphina - 2026-11-29@16h52m03s", {"member_ids": ["hero.png", "Mira"]})):
        assert client.put(quote(path, safe="/"), json=body, headers=auth).status_code == 201
    ids = []
    for pinned in (False, True):
        answer = client.post("/v1/memories", headers=auth, json={
            "text": "Call me Captain.", "scope": "character", "character_id": "hero.png",
            "pinned": pinned, "actor": "user", "chat_id": "Seraphina - 2026-11-29@16h52m03s", "turn_id": "t1"})
        assert answer.status_code == 201
        ids.append(answer.get_json()["memory"]["id"])
    yield app, services, ids
    services.db.close()


def fingerprint(services: Any) -> str:
    """A hash of every row of every table (the store is small: a few ms)."""
    conn = services.db.reader()
    digest = hashlib.sha256()
    tables = [r[0] for r in conn.execute(
        "SELECT name FROM sqlite_master WHERE type='table' AND sql NOT LIKE 'CREATE VIRTUAL%' ORDER BY name")]
    for table in tables:
        digest.update(table.encode())
        for row in sorted(repr(tuple(r)) for r in conn.execute(f'SELECT * FROM "{table}"')):
            digest.update(row.encode())
    return digest.hexdigest()


# --- what is sent -------------------------------------------------------------------------------
KNOWN_IDS = ["hero.png", "Mira", "Seraphina - 2026-11-29@16h52m03s", "t1", "nobody"]
EDGE_TEXT = ["", " ", "\x00", "a\x00b", "\u200f\u202eevil\u202c", "\u200b", "\ufeff", "e\u0301\u0301\u0301",
             "👩‍👩‍👧‍👦" * 20, "𝕏", "\uffff", "\u2028\u2029", "Z̤͔ͧ̑̓ä͖̭̈̇lͮ̒ͫǧ̗͚̚o̙̔ͮ̇", "'; DROP TABLE memories; --",
             "%s%n%x", "<script>alert(1)</script>", "../../etc/passwd", "a" * 501, "a" * 5000,
             "ß" * 4001, "\r\n\t", "null", "0", "-1", "1e999", "NaN"]
HOSTILE_IDS = ["a/b", "%2F", "..", "../..", "..%2F..%2Fetc%2Fpasswd", "%00", "a%00b", "%ED%A0%80",
               "%FF%FE", "x" * 300, "x" * 10_000, "%20", "@", "?x=1", "#frag", ";", "\\", "*", "..;/"]
HOSTILE_VALUES = st.one_of(
    st.sampled_from(EDGE_TEXT), st.integers(), st.integers(min_value=2 ** 63), st.floats(allow_nan=False, allow_infinity=False),
    st.booleans(), st.none(), st.just([]), st.just({}), st.just([[[[[[[[["deep"]]]]]]]]]),
    st.just("x" * 200_000), ANY_JSON)
RAW_BODIES = [b"", b"null", b"[]", b"{}", b'"text"', b"{", b"[" * 5000, b'{"a":' * 40 + b"1" + b"}" * 40,
              b'{"text": NaN, "scope": "global", "actor": "user"}',
              b'{"text": "x", "scope": "global", "actor": "user", "pinned": Infinity}',
              b'{"text": "x", "scope": "global", "actor": "user", "version": -Infinity}',
              b'{"text": "x", "scope": "global", "actor": "user", "version": 1e999}',
              b'{"text": "x", "text": "y", "scope": "global", "actor": "user"}',
              b'{"text": "\\ud800", "scope": "global", "actor": "user"}',
              b'{"text": "\\udfff\\ud800", "name": "\\ud83d", "actor": "user", "scope": "global"}',
              b'{"text": "\xff\xfe", "scope": "global", "actor": "user"}',
              b'\xef\xbb\xbf{"text": "bom", "scope": "global", "actor": "user"}',
              b'{"name": "x", "sheet": {"personality": "\\u0000"}}',
              b'{"version": 99999999999999999999999999, "actor": "user", "text": "big"}',
              b'{"context_tokens": 1e400, "member_ids": []}',
              b"\x00\x00\x00", "{\"text\": \"\u00e9\"}".encode("latin-1")]


@st.composite
def mutated(draw: st.DrawFn, base: st.SearchStrategy[Any]) -> Any:
    """A valid-ish value with one thing wrong: a field dropped, added, or given a hostile value."""
    value = draw(base)
    if not isinstance(value, dict) or not value:
        return draw(st.one_of(st.just(value), HOSTILE_VALUES))
    value = dict(value)
    how = draw(st.sampled_from(["drop", "unknown", "hostile", "hostile", "nest"]))
    key = draw(st.sampled_from(sorted(value)))
    if how == "drop":
        del value[key]
    elif how == "unknown":
        value[draw(st.sampled_from(["__proto__", "constructor", "id", "created_at", "x" * 300, ""]))] = 1
    elif how == "hostile":
        value[key] = draw(HOSTILE_VALUES)
    else:
        nested: Any = value[key]
        for _ in range(draw(st.integers(30, 80))):
            nested = [nested]
        value[key] = nested
    return value


@dataclass
class Request:
    method: str
    path: str
    data: bytes | None
    content_type: str | None

    def __repr__(self) -> str:
        return f"{self.method} {self.path[:200]!r} {self.content_type} {(self.data or b'')[:300]!r}"


GEN = Generator()


def body_strategy(route: Route) -> st.SearchStrategy[tuple[bytes | None, str | None]]:
    schema = GEN.for_name(route.body) if route.body else ANY_JSON
    as_json = st.one_of(schema, schema, mutated(schema), HOSTILE_VALUES).map(
        lambda v: json.dumps(v, ensure_ascii=False, allow_nan=False).encode("utf-8"))
    raw = st.sampled_from(RAW_BODIES)
    content_type = st.sampled_from(["application/json"] * 6 + [
        "text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x",
        "application/json; charset=latin-1", "application/JSON", None])
    return st.tuples(st.one_of(as_json, as_json, raw), content_type)


def query_strategy(route: Route) -> st.SearchStrategy[str]:
    schema = GEN.for_name(route.query) if route.query else st.just({})
    values = st.one_of(schema, mutated(schema))

    def encode(value: Any) -> str:
        if not isinstance(value, dict):
            return quote(json.dumps(value), safe="")
        parts = []
        for key, item in value.items():
            text = item if isinstance(item, str) else json.dumps(item).lower()
            parts.append(f"{quote(str(key), safe='')}={quote(text, safe='', errors='surrogatepass')}")
        return "&".join(parts)

    raw = st.sampled_from(["scope=global&scope=global", "pinned=yes", "archived=1", "q=%ED%A0%80",
                           "chat_id=%00&speaker_id=x", "actor=user&actor=model", "%FF=%FE", "q=" + "x" * 5000,
                           "chat_id=..%2F..&speaker_id=%2F"])
    return st.one_of(values.map(encode), raw)


def path_strategy(route: Route) -> st.SearchStrategy[str]:
    ids = st.one_of(st.sampled_from(KNOWN_IDS).map(lambda i: quote(i, safe="")),
                    st.sampled_from(HOSTILE_IDS),
                    st.text(min_size=1, max_size=30).map(lambda i: quote(i, safe="", errors="surrogatepass")))
    pieces = st.fixed_dictionaries({p: ids for p in route.params})

    def fill(values: dict[str, str]) -> str:
        path = route.rule
        for name, value in values.items():
            path = re.sub(rf"<(?:[^:>]+:)?{name}>", lambda _: value, path)
        return path

    return pieces.map(fill)


def request_strategy(route: Route, memory_ids: list[str]) -> st.SearchStrategy[Request]:
    path = path_strategy(route)
    if "<memory_id>" in route.rule:  # reach the deep code too: real memory ids, quoted
        path = st.one_of(path, st.sampled_from(memory_ids).map(lambda i: route.rule.replace("<memory_id>", i)))
    body = body_strategy(route) if route.method in BODY_METHODS else st.just((None, None))
    return st.builds(lambda p, qs, b: Request(route.method, p + (f"?{qs}" if qs else ""), b[0], b[1]),
                     path, query_strategy(route), body)


# --- the property -------------------------------------------------------------------------------
def check(app: Any, services: Any, request: Request) -> None:
    """No 5xx; an error is in the envelope; a refused request stored nothing."""
    client = app.test_client()
    before = fingerprint(services)
    headers = {"Authorization": f"Bearer {TOKEN}"}
    if request.content_type:
        headers["Content-Type"] = request.content_type
    response = client.open(request.path, method=request.method, data=request.data, headers=headers)
    status = response.status_code
    assert status < 500, (request, status, response.get_data(as_text=True)[:500])
    if status >= 400:
        assert response.is_json, (request, status, response.get_data()[:300])
        assert_schema("error.response", response.get_json())
        assert fingerprint(services) == before, (request, status, "a refused request changed the store")
    else:
        json.loads(response.get_data(as_text=True), parse_constant=_no_constant)  # strict JSON out


def _no_constant(name: str) -> Any:
    raise AssertionError(f"the answer holds {name}, which is not JSON")


@pytest.mark.parametrize("route", ROUTES, ids=str)
def test_fuzz_route_never_5xx_errors_in_envelope_refusals_store_nothing(route: Route, fuzz_app) -> None:
    """Rule OP7 / API.md "Transport": bad input of every kind is refused cleanly (RV17: a refused
    request changes nothing)."""
    app, services, memory_ids = fuzz_app

    @FUZZ
    @given(request=request_strategy(route, memory_ids))
    def run(request: Request) -> None:
        check(app, services, request)

    run()


@pytest.mark.parametrize("raw", RAW_BODIES, ids=lambda b: repr(b[:40]))
def test_raw_bodies_no_parser_should_accept_are_refused(raw: bytes, fuzz_app) -> None:
    """Each raw body on the richest route, every time (not left to chance): NaN, Infinity,
    1e999, duplicate keys, lone surrogates, invalid UTF-8, deep nesting."""
    app, services, _ = fuzz_app
    check(app, services, Request("POST", "/v1/memories", raw, "application/json"))


# --- over a real socket: what the HTTP server itself does with hostile paths -------------------
@pytest.fixture(scope="module")
def real_sidecar(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from tests.helpers.process import SidecarProcess

    side = SidecarProcess.create(tmp_path_factory.mktemp("fuzz-real") / "data")
    side.start()
    yield side
    side.stop()


def raw_http(port: int, request_line: str, headers: dict[str, str], body: bytes = b"") -> tuple[int, bytes]:
    """One HTTP/1.1 exchange with bytes exactly as given (no client library normalising the path)."""
    head = [request_line, f"Host: 127.0.0.1:{port}", "Connection: close", f"Content-Length: {len(body)}"]
    head += [f"{k}: {v}" for k, v in headers.items()]
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall("\r\n".join(head).encode("latin-1") + b"\r\n\r\n" + body)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    status = int(data.split(b" ", 2)[1])
    return status, data.split(b"\r\n\r\n", 1)[1]


@pytest.mark.parametrize("target", [
    "/v1/memories/%2F", "/v1/memories/..%2F..%2Fetc%2Fpasswd", "/v1/memories/%00", "/v1/memories/a%00b",
    "/v1/memories/%ED%A0%80", "/v1/memories/%FF", "/v1/characters/" + "x" * 20_000, "/v1/characters/../memories",
    "/v1/characters/%2e%2e", "/v1//memories", "/v1/memories?q=%00%ED%A0%80", "/v1/memories/for-turn?chat_id=%FF&speaker_id=%00",
    "/v1/chats/a%2Fb/turns/..%2F/rollback", "/v1/memories?" + "a=1&" * 2000,
])
def test_hostile_paths_over_a_real_socket_are_refused_in_the_envelope(real_sidecar, target: str) -> None:
    """Rule OP7: ids with path characters reach waitress + Flask as raw bytes: no 5xx, the envelope."""
    method = "POST" if target.endswith("/rollback") else "GET"
    status, body = raw_http(real_sidecar.port, f"{method} {target} HTTP/1.1",
                            {"Authorization": f"Bearer {real_sidecar.token}", "Content-Type": "application/json"},
                            b"{}" if method == "POST" else b"")
    assert status < 500, (target, status, body[:300])
    if status >= 400:
        assert_schema("error.response", json.loads(body))


@pytest.mark.parametrize("method,path", [("PUT", "/v1/characters/%2F0"), ("GET", "/v1/characters/%2Fhero.png"),
                                         ("DELETE", "/v1/characters/%2F0"), ("PUT", "/v1/chats/%2F0"),
                                         ("POST", "/v1/chats/c/turns/a%2F/rollback"), ("GET", "/v1//memories")])
def test_percent_encoded_slash_in_an_id_is_refused_not_redirected_to_another_id(fuzz_app, method, path):
    """Bug found by the fuzzer: '/v1/characters/%2F0' was answered 308 -> '/v1/characters/0' (HTML),
    which a browser follows, re-sending a PUT to another character. Now: 404 in the envelope."""
    app, services, _ = fuzz_app
    before = fingerprint(services)
    response = app.test_client().open(path, method=method, json={"name": "Other"} if method == "PUT" else None,
                                      headers={"Authorization": f"Bearer {TOKEN}"})
    assert response.status_code == 404 and "Location" not in response.headers
    assert_schema("error.response", response.get_json())
    assert fingerprint(services) == before


@pytest.mark.parametrize("method,path,body", [
    ("GET", "/v1/chats/{chat}/messages?offset=99999999999999999999", None),
    ("GET", "/v1/chats/{chat}/messages?limit=5&offset=9223372036854775808", None),
    ("POST", "/v1/chats/{chat}/messages",
     b'{"messages": [{"id": "m1", "role": "user", "name": "A", "text": "hi", "index": 18446744073709551616}]}'),
    ("PATCH", "/v1/memories/{memory}", b'{"actor": "user", "text": "x", "version": 99999999999999999999999999}'),
])
def test_integers_beyond_64_bits_are_400_not_500(fuzz_app, method, path, body):
    """Bug found by the fuzzer: GET …/messages?offset=<20 digits> reached SQLite and failed with
    OverflowError (500). Integers outside SQLite's 64 bits are now refused at the edge, in query
    strings and JSON bodies alike."""
    app, services, memory_ids = fuzz_app
    chat = quote("Seraphina - 2026-11-29@16h52m03s", safe="")
    before = fingerprint(services)
    response = app.test_client().open(path.format(chat=chat, memory=memory_ids[0]), method=method, data=body,
                                      headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"})
    assert response.status_code == 400, response.get_data(as_text=True)[:300]
    assert_schema("error.response", response.get_json())
    assert fingerprint(services) == before
