"""The drawer's "Memory settings" form in real SillyTavern against the real sidecar (rule DC6),
directly and through the server plugin: the store's settings are read from GET /v1/settings, Save
sends PATCH /v1/settings, a refused value is shown under its field and changes nothing. Every value
changed in the shared sidecar is put back (the plugin's sidecar is the test's own)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.helpers.plugin_st import PluginST, keep, open_page
from tests.helpers.sidecar import Sidecar
from tests.helpers.sillytavern import STPage, configure_chronicler

FIELD = "#chronicler_store_{}"


def _settings(sidecar: Sidecar) -> dict[str, Any]:
    status, body = sidecar.request("GET", "/v1/settings")
    assert status == 200, body
    return body


def _open_form(st: STPage, loaded_value: str) -> Any:
    """Open the drawer and its Memory settings section; wait until the store's values are in."""
    st.open_chronicler_settings()
    section = st.page.locator("#chronicler_store_settings")
    section.locator(".inline-drawer-toggle").click()
    section.locator(".inline-drawer-content").wait_for(state="visible", timeout=10_000)
    st.page.wait_for_function(
        "v => document.querySelector('#chronicler_store_context_required_percent').value === v",
        arg=loaded_value, timeout=15_000)
    section.scroll_into_view_if_needed()
    return section


def _save_and_wait(st: STPage, expect: str) -> str:
    st.page.locator("#chronicler_store_save").click()
    st.page.wait_for_function(
        "re => new RegExp(re).test(document.querySelector('#chronicler_store_status').textContent)",
        arg=f"{expect}|Not saved|Nothing changed", timeout=15_000)
    return st.page.locator("#chronicler_store_status").inner_text()


def test_dc6_the_drawer_changes_the_stores_budget_and_model_url_and_refuses_a_bad_value(
        st: STPage, sidecar: Sidecar) -> None:
    """rule DC6: a budget and the model's URL changed in the drawer's form reach the store's
    settings (GET /v1/settings), and the form shows the values read back; a value the sidecar
    refuses (QS4: story cards and history over 100%) is shown under its field and nothing changes;
    a value the form itself refuses is never sent."""
    before = _settings(sidecar)
    old = before["settings"]
    assert old["llm_mode"] != "client"
    budget = 60 if old["context_required_percent"] != 60 else 65
    url = "http://127.0.0.1:59999/v1"
    assert old["llm_url"] != url
    configure_chronicler(st, sidecarUrl=sidecar.url, token=sidecar.token)
    page = st.page
    try:
        _open_form(st, str(old["context_required_percent"]))
        assert page.locator(FIELD.format("llm_url")).input_value() == old["llm_url"]
        assert page.locator(FIELD.format("llm_key")).input_value() == "", "a key is never shown"
        assert page.locator(FIELD.format("llm_key_status")).inner_text() == "No key is set."
        assert page.locator(FIELD.format("embedder")).input_value() == old["embedder"]
        assert not page.locator(FIELD.format("llm_key_clear")).is_visible(), "no key: nothing to clear"
        assert not page.locator(FIELD.format("embedder_key_clear")).is_visible()

        page.locator(FIELD.format("context_required_percent")).fill(str(budget))
        page.locator(FIELD.format("llm_url")).fill(url)
        assert _save_and_wait(st, "^Saved$") == "Saved"
        now = _settings(sidecar)
        assert now["settings"]["context_required_percent"] == budget
        assert now["settings"]["llm_url"] == url
        # Only what changed was sent: everything else is as it was.
        edited = ("context_required_percent", "llm_url")
        assert {k: v for k, v in now["settings"].items() if k not in edited} == \
            {k: v for k, v in old.items() if k not in edited}
        assert now["changed"] == sorted({*before["changed"], *edited}), "a field not edited was sent"
        assert page.locator(FIELD.format("context_required_percent")).input_value() == str(budget)
        assert page.locator(FIELD.format("llm_url")).input_value() == url
        st.shot("saved")

        # The sidecar refuses: story cards + history over 100 (QS4), named by the field.
        new = now["settings"]
        history = new["context_history_percent"]
        cards = 101 - history
        page.locator(FIELD.format("context_cards_percent")).fill(str(cards))
        page.locator(FIELD.format("live_window_max_tokens")).fill(str(new["live_window_max_tokens"] + 1))
        status = _save_and_wait(st, "^Saved$")
        assert status.startswith("Not saved"), status
        error = page.locator(FIELD.format("context_cards_percent_error"))
        assert "at most 100" in error.inner_text(), error.inner_text()
        assert _settings(sidecar)["settings"] == new, "a refused change changes nothing"
        st.shot("refused-by-the-sidecar")

        # The form refuses before sending: not a whole number.
        page.locator(FIELD.format("context_cards_percent")).fill(str(new["context_cards_percent"]))
        page.locator(FIELD.format("live_window_max_messages")).fill("2.5")
        status = _save_and_wait(st, "^Saved$")
        assert status.startswith("Not saved"), status
        message = page.locator(FIELD.format("live_window_max_messages_error")).inner_text()
        assert message == "A whole number is needed here.", message
        assert page.locator(FIELD.format("context_cards_percent_error")).inner_text() == ""
        assert _settings(sidecar)["settings"] == new, "nothing was sent"

        # A key: written, then shown only as set; "Clear key" takes it away.
        page.locator(FIELD.format("live_window_max_messages")).fill(str(new["live_window_max_messages"]))
        page.locator(FIELD.format("live_window_max_tokens")).fill(str(new["live_window_max_tokens"]))
        page.locator(FIELD.format("llm_key")).fill("sk-e2e-secret")
        assert _save_and_wait(st, "^Saved$") == "Saved"
        assert _settings(sidecar)["secrets"]["llm_key"] == {"set": True}
        assert page.locator(FIELD.format("llm_key")).input_value() == ""
        assert page.locator(FIELD.format("llm_key_status")).inner_text() == "A key is set."
        assert page.locator(FIELD.format("llm_key_clear")).is_visible()
        assert "sk-e2e-secret" not in page.locator("#chronicler_store_settings").inner_html()
        page.locator(FIELD.format("llm_key_clear")).click()
        page.wait_for_function("() => document.querySelector('#chronicler_store_llm_key_status').textContent"
                               " === 'No key is set.'", timeout=15_000)
        assert _settings(sidecar)["secrets"]["llm_key"] == {"set": False}
        st.shot("key-cleared")
    finally:
        touched = ("context_required_percent", "llm_url", "context_cards_percent", "live_window_max_tokens",
                   "live_window_max_messages")
        restore = {name: old[name] for name in touched}
        sidecar.request("PATCH", "/v1/settings", {**restore, "llm_key": ""})
        configure_chronicler(st, llmMode="sidecar")
    assert _settings(sidecar)["settings"] == old


def test_dc6_through_the_plugin_the_form_changes_this_sillytavern_users_store(
        plugin_st: PluginST, browser: Any, request: pytest.FixtureRequest) -> None:
    """rule DC6 through SillyTavern's server plugin (no sidecar URL or token in the page): the form
    reads and changes the store of the SillyTavern user the page is logged in as."""
    st = plugin_st
    st.running()
    old = st.direct("GET", "/v1/settings")["settings"]
    gap = old["session_gap_hours"] + 1.5
    context, page, seen = open_page(browser, st, request.node.name)
    try:
        page.open()
        _open_form(page, str(old["context_required_percent"]))
        assert page.page.locator("#chronicler_store_name").inner_text() == "Store: default-user"
        page.page.locator(FIELD.format("session_gap_hours")).fill(str(gap))
        assert _save_and_wait(page, "^Saved$") == "Saved"
        assert st.direct("GET", "/v1/settings")["settings"]["session_gap_hours"] == gap
        assert any(u.endswith("/api/plugins/chronicler/v1/settings") for u in seen), "not through the plugin"
        page.shot("saved-through-the-plugin")
    finally:
        keep(page, seen)
        context.close()
