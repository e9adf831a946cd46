"""Smoke test of the end-to-end harness: real SillyTavern + Chromium + our extension + the fake model."""

from __future__ import annotations

import time

from tests.helpers.fakellm import FakeLLM
from tests.helpers.sillytavern import STPage


def _prompt_text(body: dict) -> str:
    parts = []
    for message in body.get("messages", []):
        content = message.get("content")
        if isinstance(content, list):
            content = " ".join(p.get("text", "") for p in content if isinstance(p, dict))
        parts.append(str(content))
    return "\n".join(parts)


def test_dc2_extension_loads_and_a_message_reaches_the_model(st: STPage, fake: FakeLLM) -> None:
    """rule DC2: the extension loads in SillyTavern (its drawer is in the Extensions panel) and a
    chat turn goes through to the model and back while the extension is installed."""
    drawer = st.open_chronicler_settings()
    assert drawer.count() == 1
    assert "Chronicler" in drawer.locator(".inline-drawer-header").first.inner_text()
    assert st.page.locator("#chronicler_url").input_value().startswith("http://127.0.0.1:")
    st.shot("extensions-drawer")
    st.close_extensions()

    st.select_character("Seraphina")
    st.shot("seraphina-selected")
    before = len(fake.completions())
    reply = st.send("Hello from the smoke test, where am I?")
    st.shot("reply-rendered")

    bodies = fake.completions()[before:]
    assert len(bodies) == 1, f"expected one completion request, got {len(bodies)}"
    assert "Hello from the smoke test, where am I?" in _prompt_text(bodies[0])
    assert bodies[0].get("model") == "fake-model"
    assert reply.startswith("Fake reply"), reply
    last = st.messages()[-1]
    assert not last["is_user"] and last["mes"].startswith("Fake reply")


def test_dc2_sidecar_down_fails_open_with_one_toast(st: STPage, fake: FakeLLM) -> None:
    """rule DC2 (fail open): with no sidecar listening, every generation still goes through
    unchanged and the user sees one Chronicler toast for the outage, not one per turn."""
    st.record_toasts()
    st.select_character("Seraphina")
    before = len(fake.completions())
    for n in range(3):
        reply = st.send(f"Turn {n} while the sidecar is down")
        assert reply.startswith("Fake reply"), reply
    assert len(fake.completions()) - before == 3
    st.shot("after-three-turns")
    chronicler = [t for t in st.recorded_toasts() if "Chronicler" in t]
    assert len(chronicler) == 1, chronicler
    assert "not reachable" in chronicler[0]
    stats = st.evaluate("() => ({n: window.chronicler.stats.timings.items.length, "
                        "err: window.chronicler.stats.lastError?.code})")
    assert stats == {"n": 3, "err": "unreachable"}


def test_dc2_message_ids_and_turns_are_saved_with_the_chat(st: STPage) -> None:
    """rule DC2 (sync): every message gets a stable id in `extra`, replies carry their turn id,
    and both survive a page reload (SillyTavern saved them with the chat)."""
    st.select_character("Seraphina")
    st.send("Remember this message's id.")
    before = st.evaluate("() => SillyTavern.getContext().chat.map(m => [m.extra?.chronicler_id, m.extra?.chronicler_turn_id ?? null, m.is_user])")
    assert all(isinstance(i, str) and i for i, _, _ in before)
    assert len({i for i, _, _ in before}) == len(before), "ids are unique in the chat"
    assert before[-1][1] and not before[-1][2], "the reply carries its turn id"
    assert before[-2][1] is None and before[-2][2], "a user message has no turn id"
    st.reload()
    st.select_character("Seraphina")
    after = st.evaluate("() => SillyTavern.getContext().chat.map(m => [m.extra?.chronicler_id, m.extra?.chronicler_turn_id ?? null, m.is_user])")
    assert after == before


def test_dc2_a_new_message_id_is_saved_even_when_the_generation_fails(st: STPage, fake: FakeLLM, st_server) -> None:
    """rule DC2 (sync): SillyTavern saves a user's message before MESSAGE_SENT, so the extension
    asks for a save itself: the id reaches the chat file even when no reply (and no later save by
    SillyTavern) follows."""
    st.select_character("Seraphina")
    fake.fail_next(1, 500)
    st.submit("This generation will fail at the model.")
    st.wait_idle()
    message_id = st.evaluate("() => SillyTavern.getContext().chat.findLast(m => m.is_user).extra.chronicler_id")
    path = st.chat_file(st_server.data_root)
    deadline = time.monotonic() + 10
    while message_id not in path.read_text() and time.monotonic() < deadline:
        time.sleep(0.2)
    st.shot("generation-failed")
    assert message_id in path.read_text(), "the new id is in the saved chat file"
