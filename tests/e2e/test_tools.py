"""The model's memory tools in real SillyTavern with function calling on (RV9a, RV10, RV11, RV15).

The fake model plays a tool-capable model: it answers the first completion of a turn with a tool
call, SillyTavern runs our tool (which calls the real sidecar), then asks the model again and the
reply follows. The memory the tool saved carries the reply's turn id, so a swipe rolls it back.
"""

from __future__ import annotations

import json
from functools import partial

import pytest

from tests.helpers.fakellm import FakeLLM
from tests.helpers.sidecar import Sidecar
from tests.helpers.sillytavern import STPage, configure_chronicler, quote_id, save_settings, wait_until

_q = quote_id
_wait_until = partial(wait_until, timeout=15.0, interval=0.1)


def _memories(sidecar: Sidecar, character_id: str) -> list[dict]:
    status, body = sidecar.request("GET", f"/v1/memories?scope=character&character_id={_q(character_id)}")
    assert status == 200, body
    return body["memories"]


def _tool_names(body: dict) -> list[str]:
    return [t["function"]["name"] for t in body.get("tools") or []]


def _tool_results(body: dict) -> list[str]:
    return [str(m.get("content")) for m in body.get("messages", []) if m.get("role") == "tool"]


@pytest.fixture
def tools_on(st: STPage, sidecar: Sidecar):
    """Function calling switched on for this test (SillyTavern saves its settings on its own, so it
    is switched off and saved again afterwards), the sidecar configured."""
    configure_chronicler(st, sidecarUrl=sidecar.url, token=sidecar.token)
    # SillyTavern's default model context: with a small one (an earlier test's, kept by its
    # autosave) SillyTavern's own history fitting can leave the tool result out of the follow-up.
    original = st.evaluate("() => { const s = SillyTavern.getContext().chatCompletionSettings;"
                           " const n = s.openai_max_context; s.openai_max_context = 4095;"
                           " s.function_calling = true; return n; }")
    assert st.evaluate("() => SillyTavern.getContext().isToolCallingSupported()") is True
    yield st
    st.evaluate("n => { const s = SillyTavern.getContext().chatCompletionSettings;"
                " s.function_calling = false; s.openai_max_context = n; }", original)
    save_settings(st)


def _open(st: STPage) -> tuple[str, str]:
    st.select_character("Seraphina")
    # Let the extension register the card and the chat before the model acts for it.
    return st.evaluate("() => { const c = SillyTavern.getContext();"
                       " return [c.characters[c.characterId].avatar, c.getCurrentChatId()]; }")


def test_rv9a_remember_tool_saves_a_memory_of_the_speaker_tagged_with_the_turn_and_a_swipe_rolls_it_back(
        tools_on: STPage, sidecar: Sidecar, fake: FakeLLM) -> None:
    """rule RV9a: the model saves during its reply through a tool; RV10: the memory carries the
    reply's turn id (the follow-up generation after the tool call is the same turn), so swiping
    the reply rolls it back."""
    st = tools_on
    avatar, chat_id = _open(st)
    _wait_until(lambda: sidecar.request("GET", f"/v1/chats/{_q(chat_id)}")[0] == 200, what="chat registered")
    fake.script_tool_calls([{"name": "remember", "arguments": {"text": "The traveller's name is Arin."}}])
    before = len(fake.completions())
    st.send("My name is Arin, remember it.")
    st.shot("after-remember")
    bodies = fake.completions()[before:]
    assert len(bodies) == 2, "the tool call, then the reply"
    assert {"remember", "update_memory", "forget_memory"} <= set(_tool_names(bodies[0]))
    assert any("Saved memory" in r for r in _tool_results(bodies[1])), _tool_results(bodies[1])

    reply = st.evaluate("() => SillyTavern.getContext().chat.at(-1).extra")
    saved = [m for m in _memories(sidecar, avatar) if m["text"] == "The traveller's name is Arin."]
    assert len(saved) == 1
    memory = saved[0]
    assert memory["actor"] == "model" and memory["pinned"] is False and memory["chat_id"] == chat_id
    assert memory["turn_id"] == reply["chronicler_turn_id"], "the reply and the tool share one turn"
    assert memory["known_by"] == [avatar]

    st.swipe_right()
    st.shot("after-swipe")
    _wait_until(lambda: all(m["id"] != memory["id"] for m in _memories(sidecar, avatar)), what="rollback")


def test_rv11_forget_tool_cannot_touch_a_pinned_memory(tools_on: STPage, sidecar: Sidecar, fake: FakeLLM) -> None:
    """rule RV11: only a person may change a pinned memory; the model's forget_memory is refused
    and told why, and the memory stays."""
    st = tools_on
    avatar, chat_id = _open(st)
    _wait_until(lambda: sidecar.request("GET", f"/v1/characters/{_q(avatar)}")[0] == 200, what="character")
    status, body = sidecar.request("POST", "/v1/memories", {
        "text": "Seraphina swore an oath to the forest.", "scope": "character", "character_id": avatar,
        "pinned": True, "actor": "user"})
    assert status == 201, body
    pinned = body["memory"]["id"]
    fake.script_tool_calls([{"name": "forget_memory", "arguments": {"id": pinned}}])
    before = len(fake.completions())
    st.send("Forget your oath.")
    st.shot("after-forget-refused")
    results = _tool_results(fake.completions()[before + 1])
    assert any("pinned" in r for r in results), results
    assert any(m["id"] == pinned for m in _memories(sidecar, avatar))


def test_rv15_without_tool_calling_no_tools_are_sent_and_chat_works(st: STPage, sidecar: Sidecar, fake: FakeLLM) -> None:
    """rule RV15: on a connection without function calling nothing is offered and nothing breaks."""
    configure_chronicler(st, sidecarUrl=sidecar.url, token=sidecar.token)
    st.evaluate("() => { SillyTavern.getContext().chatCompletionSettings.function_calling = false; }")
    assert st.evaluate("() => SillyTavern.getContext().isToolCallingSupported()") is False
    _open(st)
    before = len(fake.completions())
    reply = st.send("Hello without tools.")
    assert reply.startswith("Fake reply")
    body = fake.completions()[before]
    assert "tools" not in body, json.dumps(body)[:500]
