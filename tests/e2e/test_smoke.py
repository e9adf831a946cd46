"""Smoke test of the end-to-end harness: real SillyTavern + Chromium + our extension + the fake model."""

from __future__ import annotations

from tests.e2e.st import STPage
from tests.fakellm import FakeLLM


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
