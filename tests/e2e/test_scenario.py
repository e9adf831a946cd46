"""The end-to-end scenario in real SillyTavern with the real sidecar (DC2, RV2, RV5, RV10,
RV11, SW9b): what reaches the model each turn is read from the fake model's request log.

Needs the sidecar's POST /v1/context; on a sidecar without it these tests are skipped with that
reason (the extension then fails open, which test_smoke covers)."""

from __future__ import annotations

from functools import partial
from typing import Any, Iterator

import pytest

from tests.helpers.fakellm import FakeLLM
from tests.helpers.sidecar import Sidecar
from tests.helpers.sillytavern import (
    GROUP_NAME,
    STPage,
    configure_chronicler,
    quote_id,
    save_settings,
    wait_until,
)

_q = quote_id
_wait_until = partial(wait_until, timeout=20.0, interval=0.1)


FILLER = ("We walk on between the tall pines while the light fades, talking about the road ahead, the "
          "weather in the hills, the price of bread in the valley towns and the songs the millers sing "
          "when the river is high and the wheels turn all night long.")


def prompt_text(body: dict) -> str:
    """Everything the model was sent, as one text (word joiners from macro neutralising removed)."""
    parts = []
    for message in body.get("messages", []):
        content = message.get("content")
        if isinstance(content, list):
            content = " ".join(p.get("text", "") for p in content if isinstance(p, dict))
        parts.append(str(content))
    return "\n".join(parts).replace("\u2060", "")


def _memory(sidecar: Sidecar, text: str, character_id: str | None, *, pinned: bool = False,
            actor: str = "user", turn_id: str | None = None, chat_id: str | None = None,
            known_by: list[str] | None = None) -> str:
    body: dict[str, Any] = {"text": text, "scope": "character" if character_id else "global",
                            "character_id": character_id, "pinned": pinned, "actor": actor}
    if turn_id:
        body["turn_id"] = turn_id
    if chat_id:
        body["chat_id"] = chat_id
    if known_by is not None:
        body["known_by"] = known_by
    status, answer = sidecar.request("POST", "/v1/memories", body)
    assert status == 201, answer
    return answer["memory"]["id"]


def _registered(sidecar: Sidecar, chat_id: str, *avatars: str) -> None:
    _wait_until(lambda: sidecar.request("GET", f"/v1/chats/{_q(chat_id)}")[0] == 200, what="chat registered")
    for avatar in avatars:
        _wait_until(lambda: sidecar.request("GET", f"/v1/characters/{_q(avatar)}")[0] == 200,
                    what=f"character {avatar}")


@pytest.fixture
def chronicled(st: STPage, sidecar: Sidecar) -> Iterator[STPage]:
    """The page pointed at the sidecar, with a small model context (2048 tokens) so the live window
    (RV2: 25% of it) is shorter than the chat after a few turns; restored afterwards."""
    status, _ = sidecar.request("POST", "/v1/context", {"__probe__": True})
    if status == 404:
        pytest.skip("this sidecar has no POST /v1/context yet")
    timeout = st.evaluate("() => SillyTavern.getContext().extensionSettings.chronicler?.contextTimeoutMs ?? null")
    # These tests check what reaches the model, not the fail-open deadline (test_fail_open does): a
    # context call slowed by a loaded machine must not leave the previous turn's blocks in place.
    configure_chronicler(st, sidecarUrl=sidecar.url, token=sidecar.token, contextTimeoutMs=5000)
    original = st.evaluate("() => SillyTavern.getContext().chatCompletionSettings.openai_max_context")
    st.evaluate("() => { SillyTavern.getContext().chatCompletionSettings.openai_max_context = 2048; }")
    yield st
    st.evaluate("n => { SillyTavern.getContext().chatCompletionSettings.openai_max_context = n; }", original)
    configure_chronicler(st, contextTimeoutMs=timeout)
    save_settings(st)


def test_dc2_rv2_rv10_character_chat_pinned_memory_live_window_swipe_rollback_and_outage(
        chronicled: STPage, sidecar: Sidecar, fake: FakeLLM) -> None:
    """DC2: every turn the model gets the sidecar's context; RV11: the pinned memory is in every
    prompt; RV2: old messages beyond the live window are not sent, though the chat keeps them;
    RV10: a swipe rolls back what the replaced reply's turn wrote, before the swipe's own prompt is
    built; DC2 (fail open): with the sidecar stopped, generation goes on and one toast says so."""
    st = chronicled
    st.select_character("Seraphina")
    avatar, chat_id = st.evaluate("() => { const c = SillyTavern.getContext();"
                                  " return [c.characters[c.characterId].avatar, c.getCurrentChatId()]; }")
    _registered(sidecar, chat_id, avatar)
    pinned_text = "Seraphina keeps a silver key under the old oak."
    _memory(sidecar, pinned_text, avatar, pinned=True)
    st.shot("pinned-memory-added")

    before = len(fake.completions())
    for i in range(7):
        st.send(f"Turn {i}. {FILLER} MARKER-{i}-END")
    st.shot("after-seven-turns")
    bodies = fake.completions()[before:]
    assert len(bodies) == 7
    for body in bodies:
        assert pinned_text in prompt_text(body), ("RV11: the pinned memory is in every prompt", st.evaluate("() => JSON.stringify(window.chronicler.stats.lastReport)"), sidecar.request("GET", f"/v1/memories/for-turn?chat_id={_q(chat_id)}&speaker_id={_q(avatar)}"))
    last = prompt_text(bodies[-1])
    assert "MARKER-6-END" in last, "the newest message is sent"
    history = prompt_text({"messages": [m for m in bodies[-1]["messages"] if "[Memories]" not in str(m.get("content"))]})
    # It may come back as a recalled memory (QS8: search results in the memory bank), not as chat.
    assert "MARKER-0-END" not in history, "RV2: the oldest message is out of the live window"
    assert any("MARKER-0-END" in m["mes"] for m in st.messages()), "the chat itself keeps it"
    trimmed = st.evaluate("() => window.chronicler.stats.lastTrimmed")
    assert trimmed > 0, trimmed

    # RV10: the last reply's turn wrote a memory; another turn wrote another one.
    turn = st.evaluate("() => SillyTavern.getContext().chat.at(-1).extra.chronicler_turn_id")
    rolled = _memory(sidecar, "The traveller is secretly afraid of moths.", avatar, actor="model",
                     turn_id=turn, chat_id=chat_id)
    kept_text = "The traveller once sailed to the island of Vell."
    kept = _memory(sidecar, kept_text, avatar, actor="model", turn_id="some-other-turn", chat_id=chat_id)
    before = len(fake.completions())
    st.swipe_right()
    st.shot("after-swipe")
    swipe_prompt = prompt_text(fake.completions()[before])
    assert "afraid of moths" not in swipe_prompt, "the rolled-back memory is gone before the swipe's prompt"
    assert kept_text in swipe_prompt or kept in str(st.evaluate("() => window.chronicler.stats.lastReport")), \
        "another turn's memory still reaches the model"
    status, body = sidecar.request("GET", f"/v1/memories?scope=character&character_id={_q(avatar)}")
    ids = {m["id"] for m in body["memories"]}
    assert rolled not in ids and kept in ids

    # Fail open: the sidecar stops; generation goes on; one toast for the whole outage.
    st.record_toasts()
    sidecar.stop()
    try:
        before = len(fake.completions())
        for i in range(2):
            assert st.send(f"While the sidecar is down, turn {i}.").startswith("Fake reply")
        assert len(fake.completions()) - before == 2
        st.shot("sidecar-down")
        toasts = [t for t in st.recorded_toasts() if "Chronicler" in t]
        assert len(toasts) == 1, toasts
    finally:
        sidecar.start()


def test_rv5_sw9b_group_chat_union_of_memories_and_secrets_known_by_one(
        chronicled: STPage, sidecar: Sidecar, fake: FakeLLM) -> None:
    """RV5: in a group each speaker reads the union of the members' memories, so an ordinary memory
    of either member reaches both turns; SW9b: a memory known only by Seraphina reaches her turn and
    not Luke's."""
    st = chronicled
    st.select_group(GROUP_NAME)
    chat_id, members = st.evaluate("() => { const c = SillyTavern.getContext();"
                                   " return [c.getCurrentChatId(), c.groups.find(g => g.id == c.groupId).members]; }")
    sera, luke = members
    _registered(sidecar, chat_id, sera, luke)
    of_sera = "Seraphina planted the first rowan of the glade."
    of_luke = "Luke lost his brother at the northern ford."
    secret = "Seraphina alone knows the glade's spring is poisoned."
    _memory(sidecar, of_sera, sera, pinned=True)
    _memory(sidecar, of_luke, luke, pinned=True)
    _memory(sidecar, secret, sera, pinned=True, known_by=[sera])
    st.shot("group-opened")

    before = len(fake.completions())
    st.submit(f"Hello both of you. {FILLER}")
    _wait_until(lambda: len(fake.completions()) - before >= 2, what="both members' turns")
    st.wait_idle()
    st.shot("group-both-replied")
    bodies = fake.completions()[before:before + 2]
    by_speaker = {("luke" if "LUKE-CARD" in prompt_text(b) else "seraphina"): prompt_text(b) for b in bodies}
    assert set(by_speaker) == {"seraphina", "luke"}, list(by_speaker)
    for who, text in by_speaker.items():
        assert of_sera in text and of_luke in text, f"RV5: both members' memories reach {who}"
    assert secret in by_speaker["seraphina"], "SW9b: Seraphina's own secret reaches her turn"
    assert secret not in by_speaker["luke"], "SW9b: Luke never gets what only Seraphina knows"
