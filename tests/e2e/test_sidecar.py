"""The extension against the real sidecar process (needs the foundation's CLI; skipped before it)."""

from __future__ import annotations

import urllib.parse
from functools import partial

from tests.helpers.sidecar import Sidecar
from tests.helpers.sillytavern import STPage, configure_chronicler, wait_until

_wait_for = partial(wait_until, timeout=15.0, interval=0.2)


def test_rv17_test_connection_reports_reachable_sidecar_and_accepted_token(st: STPage, sidecar: Sidecar) -> None:
    """rule RV17 (and DC2's settings drawer): "Test connection" says the sidecar is reachable and
    the token accepted; with a wrong token it says the token was refused."""
    configure_chronicler(st, sidecarUrl=sidecar.url, token=sidecar.token)
    drawer = st.open_chronicler_settings()
    result = st.page.locator("#chronicler_test_result")
    st.page.locator("#chronicler_test").click()
    st.page.wait_for_function("() => /Connected|not|refused|No answer/.test(document.querySelector('#chronicler_test_result').textContent)")
    assert "Connected to Chronicler" in result.inner_text(), result.inner_text()
    assert drawer.is_visible()
    st.shot("connection-ok")

    configure_chronicler(st, token="wrong-token")
    st.page.locator("#chronicler_test").click()
    st.page.wait_for_function("() => /token was not accepted/.test(document.querySelector('#chronicler_test_result').textContent)")
    st.shot("connection-bad-token")


def test_dc2_opening_a_chat_registers_the_character_and_the_chat(st: STPage, sidecar: Sidecar) -> None:
    """rule DC2: on opening a chat the extension registers the character card (by avatar file
    name) and the chat with its members in the sidecar."""
    configure_chronicler(st, sidecarUrl=sidecar.url, token=sidecar.token)
    st.select_character("Seraphina")
    avatar, chat_id = st.evaluate("() => { const c = SillyTavern.getContext();"
                                  " return [c.characters[c.characterId].avatar, c.getCurrentChatId()]; }")
    status, body = _wait_for(lambda: (lambda r: r if r[0] == 200 else None)(
        sidecar.request("GET", f"/v1/characters/{urllib.parse.quote(avatar, safe='')}")), what="character")
    character = body.get("character", body)
    assert character["name"] == "Seraphina"
    status, body = _wait_for(lambda: (lambda r: r if r[0] == 200 else None)(
        sidecar.request("GET", f"/v1/chats/{urllib.parse.quote(chat_id, safe='')}")), what="chat")
    assert body["chat"]["member_ids"] == [avatar]
    ids = st.evaluate("() => SillyTavern.getContext().chat.map(m => m.extra?.chronicler_id)")
    assert ids and all(isinstance(i, str) and i for i in ids), ids
    st.shot("chat-registered")


def test_dc6_the_drawers_job_mode_switches_the_sidecars_own_without_a_restart(st: STPage, sidecar: Sidecar) -> None:
    """rule DC6: choosing "SillyTavern's current connection" in the drawer sets this store's
    llm_mode to client through PATCH /v1/settings; choosing the sidecar's own again puts back the
    mode it had. No restart, no environment variable."""
    status, body = sidecar.request("GET", "/v1/settings")
    assert status == 200, body
    before = body["settings"]["llm_mode"]
    assert before != "client"
    configure_chronicler(st, sidecarUrl=sidecar.url, token=sidecar.token, llmMode="sidecar")
    st.open_chronicler_settings()
    page = st.page
    mode = page.locator("#chronicler_llm_mode")
    try:
        page.wait_for_function("() => !document.querySelector('#chronicler_llm_mode option[value=sillytavern]').disabled",
                               timeout=20_000)
        mode.select_option("sillytavern")
        _wait_for(lambda: sidecar.request("GET", "/v1/settings")[1]["settings"]["llm_mode"] == "client",
                  what="the sidecar in client mode")
        page.get_by_text("The sidecar now leaves its jobs to this page.").wait_for()
        mode.select_option("sidecar")
        _wait_for(lambda: sidecar.request("GET", "/v1/settings")[1]["settings"]["llm_mode"] == before,
                  what="the sidecar's own mode back")
    finally:
        sidecar.request("PATCH", "/v1/settings", {"llm_mode": before})
        configure_chronicler(st, llmMode="sidecar")
