"""Swipe and regenerate roll back what the replaced turn wrote (RV10), in real SillyTavern with the
real sidecar. The "model" saving memories during its reply is played by the test through the
sidecar's API (tools come with phase 2), tagged with the turn id the extension gave the reply."""

from __future__ import annotations

from functools import partial

from tests.helpers.fakellm import FakeLLM
from tests.helpers.sidecar import Sidecar
from tests.helpers.sillytavern import STPage, configure_chronicler, quote_id, wait_until

_q = quote_id
_wait_until = partial(wait_until, timeout=10.0, interval=0.1)


def _memory_ids(sidecar: Sidecar, character_id: str) -> set[str]:
    status, body = sidecar.request("GET", f"/v1/memories?scope=character&character_id={_q(character_id)}")
    assert status == 200, body
    return {m["id"] for m in body["memories"]}


def _save(sidecar: Sidecar, text: str, character_id: str, chat_id: str, turn_id: str,
          pinned: bool = False) -> str:
    status, body = sidecar.request("POST", "/v1/memories", {
        "text": text, "scope": "character", "character_id": character_id, "pinned": pinned,
        "actor": "user" if pinned else "model", "chat_id": chat_id, "turn_id": turn_id,
    })
    assert status == 201, body
    return body["memory"]["id"]


def _last(st: STPage) -> dict:
    return st.evaluate("() => { const m = SillyTavern.getContext().chat.at(-1);"
                       " return {id: m.extra?.chronicler_id, turn: m.extra?.chronicler_turn_id,"
                       " swipes: m.swipes?.length ?? 1, mes: m.mes}; }")


def test_rv10_swipe_and_regenerate_roll_back_the_replaced_turn(st: STPage, sidecar: Sidecar, fake: FakeLLM) -> None:
    """rule RV10 (and RV11): a swipe rolls back the memories the replaced reply's turn wrote; so
    does a regenerate; pinned items and other turns' items stay."""
    configure_chronicler(st, sidecarUrl=sidecar.url, token=sidecar.token)
    st.select_character("Seraphina")
    avatar, chat_id = st.evaluate("() => { const c = SillyTavern.getContext();"
                                  " return [c.characters[c.characterId].avatar, c.getCurrentChatId()]; }")
    st.send("I ask Seraphina about the old watchtower.")
    first = _last(st)
    assert first["turn"], "the reply carries the turn id of its generation"

    unpinned = _save(sidecar, "The watchtower fell in the winter war.", avatar, chat_id, first["turn"])
    pinned = _save(sidecar, "Seraphina never lies about the forest.", avatar, chat_id, first["turn"], pinned=True)
    other = _save(sidecar, "The traveller is afraid of wolves.", avatar, chat_id, "some-other-turn")
    st.shot("before-swipe")

    before = len(fake.completions())
    st.swipe_right()
    st.shot("after-swipe")
    swiped = _last(st)
    assert swiped["id"] == first["id"], "a swipe keeps the message's id"
    assert swiped["swipes"] == 2 and st.swipe_counter().startswith("2")
    assert swiped["turn"] and swiped["turn"] != first["turn"], "the new swipe is a new turn"
    _wait_until(lambda: unpinned not in _memory_ids(sidecar, avatar), what="rollback after swipe")
    remaining = _memory_ids(sidecar, avatar)
    assert {pinned, other} <= remaining
    # The swipe's prompt ends with the user's message: the replaced reply is not in it.
    swipe_prompt = fake.completions()[before]["messages"]
    assert "watchtower" in str(swipe_prompt[-1].get("content")) and swipe_prompt[-1]["role"] == "user"

    from_swipe = _save(sidecar, "The tower's bell still rings at night.", avatar, chat_id, swiped["turn"])
    st.regenerate()
    st.shot("after-regenerate")
    regenerated = _last(st)
    assert regenerated["id"] != swiped["id"] and regenerated["turn"] not in (None, swiped["turn"])
    _wait_until(lambda: from_swipe not in _memory_ids(sidecar, avatar), what="rollback after regenerate")
    assert {pinned, other} <= _memory_ids(sidecar, avatar)
