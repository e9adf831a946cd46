"""One sidecar, many stores: one per SillyTavern user in per-user mode (the server plugin's sidecar),
named by a header honoured only with the token; the direct mode keeps its one store. And the
settings a person changes at run time (GET/PATCH /v1/settings), per store."""

from __future__ import annotations

import json
import os
import stat

import pytest

from server_plugin import store_settings
from server_plugin.app import create_app
from server_plugin.settings import TABLE
from tests.helpers.api import Api, expect_error, expect_ok

USER = "X-Chronicler-User"


@pytest.fixture
def per_user(settings, services):
    app = create_app(settings, services=services, per_user=True)
    yield Api(app.test_client()), app
    app.extensions["chronicler_stores"].close_all()


def _pin(api: Api, user: str, text: str) -> dict:
    return expect_ok(api.post("/v1/memories", {"text": text, "scope": "global", "pinned": True, "actor": "user"},
                              headers={USER: user}), 201, "memory.response")


def _texts(api: Api, user: str | None) -> list[str]:
    headers = {USER: user} if user else {}
    return [m["text"] for m in expect_ok(api.get("/v1/memories", headers=headers), 200)["memories"]]


def test_each_user_has_their_own_store_and_the_model_once(per_user, settings):
    api, app = per_user
    _pin(api, "alice", "Alice's dragon is called Ember.")
    _pin(api, "bob", "Bob's ship is the Gull.")
    assert _texts(api, "alice") == ["Alice's dragon is called Ember."]
    assert _texts(api, "bob") == ["Bob's ship is the Gull."]
    assert _texts(api, None) == []  # no header: the default user's store, which holds neither
    stores = app.extensions["chronicler_stores"]
    alice, bob = stores.get("alice"), stores.get("bob")
    assert alice.db is not bob.db and alice.embedder is bob.embedder  # the model is loaded once
    for handle in ("alice", "bob"):
        assert (settings.data_path / "users" / handle / settings.db_file).is_file()


def test_the_header_needs_the_token(per_user):
    api, _ = per_user
    _pin(api, "alice", "Alice's secret.")
    expect_error(api.get("/v1/memories", headers={USER: "alice"}, token=None), 401, "unauthorized")
    expect_error(api.get("/v1/memories", headers={USER: "alice"}, token="wrong-token-xyz"), 401,
                 "unauthorized")
    # Health is public: without the token the header is not honoured (the default store answers).
    health = expect_ok(api.get("/v1/health", headers={USER: "alice"}, token=None), 200, "health.response")
    assert health["store"] == {"user": "default-user", "per_user": True}
    health = expect_ok(api.get("/v1/health", headers={USER: "alice"}), 200, "health.response")
    assert health["store"]["user"] == "alice" and "per_user_stores" in health["capabilities"]


@pytest.mark.parametrize("handle", ["../bob", "Alice", "a/b", "", "x" * 65, ".hidden"])
def test_a_handle_that_cannot_name_a_folder_is_refused(per_user, handle, settings):
    api, _ = per_user
    expect_error(api.get("/v1/memories", headers={USER: handle}), 400, "invalid_user")
    assert not (settings.data_path / "users").exists() or \
        sorted(p.name for p in (settings.data_path / "users").iterdir()) == ["default-user"]


def test_direct_mode_keeps_one_store_and_refuses_the_header(api):
    expect_error(api.get("/v1/memories", headers={USER: "alice"}), 400, "store_header_refused")
    health = expect_ok(api.get("/v1/health"), 200, "health.response")
    assert health["store"] == {"user": "default-user", "per_user": False}
    assert "settings" in health["capabilities"] and "per_user_stores" not in health["capabilities"]
    # What the extension's features read from here (extension/src/features.js CAPABILITY_OF).
    assert {"search", "sessions", "context", "message_ids", "client_jobs"} <= set(health["capabilities"])


# --- settings at run time --------------------------------------------------------------------
def test_settings_read_without_secrets(api):
    expect_ok(api.patch("/v1/settings", {"llm_key": "sk-secret-123"}), 200, "settings.response")
    body = expect_ok(api.get("/v1/settings"), 200, "settings.response")
    assert "sk-secret-123" not in json.dumps(body)
    assert body["secrets"] == {"llm_key": {"set": True}, "embedder_key": {"set": False}} and "llm_key" not in body["settings"]
    assert body["settings"]["llm_mode"] == "extractive" and body["changed"] == ["llm_key"]


def test_a_change_applies_at_once_and_survives_a_restart(api, app, settings, services):
    body = expect_ok(api.patch("/v1/settings", {"llm_mode": "client", "live_window_max_messages": 12}),
                     200, "settings.response")
    assert body["settings"]["llm_mode"] == "client" and body["settings"]["live_window_max_messages"] == 12
    assert services.settings.llm_mode == "client"  # what the worker and concepts read
    assert expect_ok(api.get("/v1/health"), 200)["llm"]["mode"] == "client"
    path = settings.data_path / store_settings.SETTINGS_FILE
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    # A new app on the same folder (a restart) reads the store's changes.
    reopened = store_settings.layered(settings, store_settings.read(settings.data_path, settings),
                                      settings.data_path)
    assert reopened.llm_mode == "client" and reopened.live_window_max_messages == 12
    assert reopened.source_of("llm_mode") == "store settings"


@pytest.mark.parametrize("name", store_settings.PROTECTED)
def test_network_and_security_settings_are_refused(api, services, name):
    before = services.settings.as_dict(redact=False)
    value = TABLE[name].default
    body = expect_error(api.patch("/v1/settings", {name: value, "llm_mode": "client"}), 400,
                        "setting_not_changeable")
    assert body["error"]["details"][0]["field"] == name
    assert services.settings.as_dict(redact=False) == before


@pytest.mark.parametrize("changes, field", [
    ({"llm_mode": "telepathy"}, "llm_mode"),
    ({"live_window_max_messages": 0}, "live_window_max_messages"),
    ({"live_window_max_messages": "12"}, "live_window_max_messages"),
    ({"live_window_max_messages": True}, "live_window_max_messages"),
    ({"llm_temperature": "hot"}, "llm_temperature"),
    ({"llm_url": 5}, "llm_url"),
    ({"llm_mode": "client", "context_required_percent": 101}, "context_required_percent"),
    ({"context_cards_percent": 60, "context_history_percent": 50}, "context_cards_percent"),
    ({"no_such_setting": 1}, "no_such_setting"),
])
def test_a_bad_value_is_refused_naming_the_field_and_nothing_changes(api, services, settings, changes, field):
    before = services.settings.as_dict(redact=False)
    response = api.patch("/v1/settings", changes)
    assert response.status_code == 400, response.get_data(as_text=True)
    error = response.get_json()["error"]
    assert error["details"][0]["field"] == field and field in error["message"]
    assert services.settings.as_dict(redact=False) == before
    assert not (settings.data_path / store_settings.SETTINGS_FILE).exists()


def test_an_empty_or_non_object_body_is_refused(api):
    expect_error(api.patch("/v1/settings", {}), 400, "invalid_request")
    expect_error(api.patch("/v1/settings", ["llm_mode"]), 400, "invalid_request")


def test_one_users_settings_never_reach_another(per_user):
    api, app = per_user
    expect_ok(api.patch("/v1/settings", {"llm_mode": "client", "llm_key": "alice-key"},
                        headers={USER: "alice"}), 200, "settings.response")
    bob = expect_ok(api.get("/v1/settings", headers={USER: "bob"}), 200, "settings.response")
    assert bob["store"] == "bob" and bob["settings"]["llm_mode"] == "extractive"
    assert bob["secrets"]["llm_key"]["set"] is False and bob["changed"] == []
    alice = expect_ok(api.get("/v1/settings", headers={USER: "alice"}), 200, "settings.response")
    assert alice["settings"]["llm_mode"] == "client" and alice["secrets"]["llm_key"]["set"] is True
    stores = app.extensions["chronicler_stores"]
    assert stores.get("bob").settings.llm_key == "" and stores.get("alice").settings.llm_key == "alice-key"


def test_a_saved_value_no_longer_valid_is_dropped_on_open(settings):
    settings.data_path.mkdir(parents=True, exist_ok=True)
    (settings.data_path / store_settings.SETTINGS_FILE).write_text(json.dumps(
        {"llm_mode": "client", "live_window_max_messages": -3, "port": 9}))
    assert store_settings.read(settings.data_path, settings) == {"llm_mode": "client"}
