"""Lore that grows with play (SW7a), end to end in real SillyTavern + Chromium.

A sidecar in client mode leaves its model work to the extension, which runs it through
SillyTavern's connection (the fake model). The player introduces the walled port city of Veyra
and its ruling Council of Nine; /session-end queues the session's jobs; the lore-growth job's
answer (scripted: the fake answers it from the labels its prompt shows) becomes an entry of the
chat; a later turn that names the council carries that entry in the prompt SillyTavern sends.
Then, with review on, a proposal waits in the Lore tab until the person accepts it there.

Skipped on a sidecar without the lore-proposal routes."""

from __future__ import annotations

import json
import re
from functools import partial
from pathlib import Path
from typing import Any, Iterator

import pytest

from tests.helpers.episodes import EMPTY, SHARED, TASKS, sections_of
from tests.helpers.fakellm import FakeLLM, default_reply
from tests.helpers.sidecar import Sidecar
from tests.helpers.sillytavern import SillyTavernServer, STPage, configure_chronicler, quote_id, wait_until

_q = quote_id
_wait_until = partial(wait_until, timeout=60.0, interval=0.3)

INTRO = "I tell Seraphina of Veyra, a walled port city of white stone ruled by the Council of Nine."
COUNCIL_TEXT = "The Council of Nine rules Veyra, a walled port city of white stone."


def _system(body: dict) -> str:
    first = (body.get("messages") or [{}])[0]
    return str(first.get("content")) if first.get("role") == "system" else ""


def _user(body: dict) -> str:
    return "\n".join(str(m.get("content")) for m in body.get("messages") or [] if m.get("role") == "user")


def growing_model(body: dict) -> str:
    """The fake model: the lore-growth job gets the council, resting on the message that names it;
    every other session-end job an empty answer; chat turns the default reply."""
    system = _system(body)
    if SHARED in system:  # one call for the session end's jobs (MJ1): each section its answer
        return json.dumps({key: _answer(task, body) for key, task in sections_of(system).items()})
    task = next((name for name, marker in TASKS.items() if marker in system), None)
    if task is not None:
        return json.dumps(_answer(task, body))
    return default_reply(body)


def _answer(task: str, body: dict) -> dict:
    if task == "lore_growth":
        label = re.search(r"^\[(m\d+)\] [^\n]*Council of Nine", _user(body), re.M)
        entries = [] if label is None else [{
            "entry": None, "kind": "faction", "title": "Council of Nine", "text": COUNCIL_TEXT,
            "triggers": ["Council of Nine"], "sources": [label.group(1)]}]
        return {"entries": entries}
    return EMPTY[task]


def _sidecar(st_server: SillyTavernServer, data: Path, **env: str) -> Sidecar:
    # Parts (MJ1) are read as soon as their messages are due: the tests wait for session-end work.
    side = Sidecar(data, origins=[st_server.origin],
                   env={"CHRONICLER_LLM_MODE": "client", "CHRONICLER_PART_WAIT_SECONDS": "0", **env})
    side.start()
    if side.request("GET", "/v1/lore/proposals")[0] == 404:
        side.stop()
        pytest.skip("this sidecar has no lore-proposal routes yet")
    return side


@pytest.fixture
def growing_sidecar(st_server: SillyTavernServer, tmp_path: Path) -> Iterator[Sidecar]:
    side = _sidecar(st_server, tmp_path / "data")
    yield side
    side.stop()


@pytest.fixture
def reviewing_sidecar(st_server: SillyTavernServer, tmp_path: Path) -> Iterator[Sidecar]:
    side = _sidecar(st_server, tmp_path / "data", CHRONICLER_LORE_GROWTH_REVIEW="review")
    yield side
    side.stop()


def _start(st: STPage, side: Sidecar, fake: FakeLLM) -> str:
    fake.responder = growing_model
    configure_chronicler(st, sidecarUrl=side.url, token=side.token, llmMode="sillytavern",
                         workerIdleMs=300, workerPollMs=300, workerMaxPollMs=1000)
    st.select_character("Seraphina")
    chat_id = st.evaluate("() => SillyTavern.getContext().getCurrentChatId()")
    _wait_until(lambda: st.evaluate("() => window.chronicler.features.has('jobs')"), what="job routes seen")
    st.send(INTRO)
    _wait_until(lambda: (lambda r: r[0] == 200 and r[1]["total"] >= 3)(
        side.request("GET", f"/v1/chats/{_q(chat_id)}/messages?ids_only=true")), what="messages synced")
    st.run_command("/session-end")
    return chat_id


def _council(side: Sidecar) -> dict[str, Any] | None:
    status, body = side.request("GET", "/v1/lore")
    return next((e for e in body["lore"] if e["title"] == "Council of Nine"), None) if status == 200 else None


def _prompts_since(fake: FakeLLM, before: int) -> list[str]:
    """The chat requests (not jobs) the model got since `before`, as one text each."""
    return [json.dumps(b["messages"], ensure_ascii=False) for b in fake.completions()[before:]
            if not any(marker in _system(b) for marker in TASKS.values())]


def test_sw7a_an_entry_grown_at_a_session_end_fires_in_a_later_turns_prompt(
        st: STPage, growing_sidecar: Sidecar, fake: FakeLLM) -> None:
    """rule SW7a in real SillyTavern: the session end grows the council's entry (through
    SillyTavern's own connection), resting on the player's message; the next turn that names the
    council carries its text in the prompt SillyTavern sends to the model."""
    side = growing_sidecar
    chat_id = _start(st, side, fake)
    try:
        council = _wait_until(lambda: _council(side), what="the lore-growth job wrote the entry")
        assert council["source"] == "job" and council["chat_id"] == chat_id and len(council["sources"]) == 1
        before = len(fake.completions())
        st.send("What does the Council of Nine want from travellers?")
        sent = _wait_until(lambda: [p for p in _prompts_since(fake, before) if "travellers" in p] or None,
                           what="the next turn's prompt")
        assert COUNCIL_TEXT in sent[-1], sent[-1][:2000]
        st.shot("grown-lore-in-the-prompt")
    finally:
        st.run_command("/delchat")  # later tests expect Seraphina's chat to hold only her greeting


def test_sw7d_a_proposal_waits_in_the_lore_tab_until_accepted_there(
        st: STPage, reviewing_sidecar: Sidecar, fake: FakeLLM) -> None:
    """rule SW7d in real SillyTavern: with review on, the council waits as a proposal, out of the
    prompt; the Lore tab lists it with its source, and Accept writes the entry."""
    side = reviewing_sidecar
    chat_id = _start(st, side, fake)
    try:
        proposal = _wait_until(lambda: (lambda r: r[1]["proposals"][0] if r[0] == 200 and r[1]["proposals"] else None)(
            side.request("GET", f"/v1/lore/proposals?chat_id={_q(chat_id)}")), what="a pending proposal")
        assert proposal["reason"] == "review" and _council(side) is None
        page = st.page
        page.locator("#send_textarea").fill("/memories lore")
        page.locator("#send_but").click()
        page.locator("#chronicler_tab_lore[aria-selected='true']").wait_for(timeout=10_000)
        row = page.locator(".chronicler-lore-proposal", has_text="New faction: Council of Nine")
        row.wait_for()
        assert "Grown from play: 1 message" in row.inner_text()
        st.shot("lore-proposal-waiting")
        row.locator(".menu_button", has_text="Accept").click()
        page.locator(".chronicler-lore-entry", has_text="Council of Nine").wait_for()
        assert "Grown from play: 1 message" in page.locator(".chronicler-lore-entry", has_text="Council of Nine").inner_text()
        st.shot("lore-proposal-accepted")
        assert _council(side)["text"] == COUNCIL_TEXT
        page.keyboard.press("Escape")
    finally:
        st.run_command("/delchat")
