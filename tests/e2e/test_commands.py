"""Slash commands typed into SillyTavern's input box (RV9b: a person adds a memory and picks the scope)."""

from __future__ import annotations

from functools import partial

from tests.helpers.sidecar import Sidecar
from tests.helpers.sillytavern import STPage, configure_chronicler, quote_id, wait_until

_q = quote_id
_wait_for = partial(wait_until, timeout=15.0, interval=0.2)


def test_rv9b_slash_remember_saves_pinned_and_global_memories_as_the_person(st: STPage, sidecar: Sidecar) -> None:
    """rule RV9b (and RV11): /remember saves a memory for the chat's character, pinned when asked;
    scope=global saves one for everyone. A person wrote them: actor user, no turn."""
    configure_chronicler(st, sidecarUrl=sidecar.url, token=sidecar.token)
    st.select_character("Seraphina")
    avatar = st.evaluate("() => SillyTavern.getContext().characters[SillyTavern.getContext().characterId].avatar")
    _wait_for(lambda: sidecar.request("GET", f"/v1/characters/{_q(avatar)}")[0] == 200, what="character")
    st.record_toasts()
    before = st.chat_length()

    st.run_command("/remember pin=true Seraphina swore to guard the glade.")
    st.run_command("/remember scope=global The old war ended in the year 1312.")

    def found(text: str, query: str):
        status, body = sidecar.request("GET", f"/v1/memories?{query}")
        assert status == 200, body
        return next((m for m in body["memories"] if m["text"] == text), None)

    pinned = _wait_for(lambda: found("Seraphina swore to guard the glade.", f"scope=character&character_id={_q(avatar)}"),
                       what="pinned memory")
    assert pinned["pinned"] is True and pinned["actor"] == "user" and pinned["turn_id"] is None
    glob = _wait_for(lambda: found("The old war ended in the year 1312.", "scope=global"), what="global memory")
    assert glob["pinned"] is False and glob["character_id"] is None
    st.shot("after-remember-commands")
    assert st.chat_length() == before, "commands add nothing to the chat"
    toasts = st.recorded_toasts()
    assert any("Saved a pinned memory of Seraphina" in t for t in toasts), toasts
    assert any("Saved a global memory" in t for t in toasts), toasts
