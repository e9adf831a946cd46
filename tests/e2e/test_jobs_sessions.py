"""Background jobs on SillyTavern's own connection, and sessions (SW2), end to end.

A sidecar in client mode (`CHRONICLER_LLM_MODE=client`) queues its model work; the extension, set to
"SillyTavern's current connection", claims the jobs while the user is idle and runs them with
generateRaw through SillyTavern's model (the fake), then completes them. /session-end closes a
session; its summary is written that way; the model then reads it with read_session_summary.

Skipped on a sidecar without the job and session routes."""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path
from typing import Iterator

import pytest

from tests.helpers.episodes import EMPTY, SHARED, sections_of
from tests.helpers.fakellm import FakeLLM, default_reply
from tests.helpers.sidecar import Sidecar
from tests.helpers.sillytavern import (
    SillyTavernServer,
    STPage,
    configure_chronicler,
    quote_id,
    save_settings,
    wait_until,
)

_q = quote_id
_wait_until = partial(wait_until, timeout=30.0, interval=0.2)


FULL = "The traveller woke in Seraphina's glade, asked about the watchtower and agreed to rest."
SHORT = "The traveller recovered in the glade and asked about the watchtower."


def _system(body: dict) -> str:
    first = (body.get("messages") or [{}])[0]
    return str(first.get("content")) if first.get("role") == "system" else ""


def summarising_model(body: dict) -> str:
    """The fake model: a valid session record for the session-summary job, chat replies otherwise."""
    system = _system(body)
    record = {"full": FULL, "short": SHORT, "quotes": [], "open_threads": [], "resolved": []}
    if SHARED in system:  # the session end's jobs share one call (MJ1): each section its answer
        return json.dumps({key: record if task == "session_summary" else EMPTY[task]
                           for key, task in sections_of(system).items()})
    if "record of one finished session" in system:
        return json.dumps(record)
    return default_reply(body)


@pytest.fixture
def client_sidecar(st_server: SillyTavernServer, tmp_path: Path) -> Iterator[Sidecar]:
    """A sidecar of its own that leaves model work to the extension."""
    # Parts (MJ1) are read as soon as their messages are due: this test waits for the session end's jobs.
    side = Sidecar(tmp_path / "data", origins=[st_server.origin],
                   env={"CHRONICLER_LLM_MODE": "client", "CHRONICLER_PART_WAIT_SECONDS": "0"})
    side.start()
    status, _ = side.request("POST", "/v1/jobs/claim", {"__probe__": True})
    if status == 404:
        side.stop()
        pytest.skip("this sidecar has no job routes yet")
    yield side
    side.stop()


def test_dc2_sw2_jobs_run_on_sillytaverns_connection_and_the_model_reads_the_session(
        st: STPage, client_sidecar: Sidecar, fake: FakeLLM) -> None:
    """DC2/SW2: /session-end queues the session summary; the extension runs it through SillyTavern's
    model while idle and completes it; RV9a/SW2: read_session_summary gives the model that summary."""
    side = client_sidecar
    fake.responder = summarising_model
    configure_chronicler(st, sidecarUrl=side.url, token=side.token, llmMode="sillytavern",
                         workerIdleMs=300, workerPollMs=300, workerMaxPollMs=1000)
    st.select_character("Seraphina")
    chat_id = st.evaluate("() => SillyTavern.getContext().getCurrentChatId()")
    _wait_until(lambda: st.evaluate("() => window.chronicler.features.has('jobs')"), what="job routes seen")
    st.send("I ask Seraphina about the old watchtower.")
    st.send("I agree to rest for the night.")
    _wait_until(lambda: (lambda r: r[0] == 200 and r[1]["total"] >= 4)(
        side.request("GET", f"/v1/chats/{_q(chat_id)}/messages?ids_only=true")), what="messages synced")

    st.record_toasts()
    before = len(fake.completions())
    st.run_command("/session-end")
    session = _wait_until(lambda: (lambda r: r[1]["session"] if r[0] == 200 and r[1]["session"].get("full") else None)(
        side.request("GET", f"/v1/chats/{_q(chat_id)}/sessions/1")), what="session summary written")
    assert session["full"].startswith(FULL[:40]), session
    jobs_sent = [b for b in fake.completions()[before:] if "record of one finished session" in _system(b)]
    assert jobs_sent, "the job went through SillyTavern's connection to the model"
    assert "watchtower" in json.dumps(jobs_sent[0]), "with the session's messages"
    # The worker counts the job once the sidecar has answered its result: the summary may be read
    # here first (a race that failed one CI run in stop 45).
    _wait_until(lambda: st.evaluate("() => window.chronicler.worker.stats.done") >= 1, what="the job counted")
    st.shot("session-summarised-by-sillytavern")
    assert not any("stopped" in t for t in st.recorded_toasts())

    # The model asks for that session's full summary with its tool.
    st.evaluate("() => { SillyTavern.getContext().chatCompletionSettings.function_calling = true; }")
    try:
        fake.script_tool_calls([{"name": "read_session_summary", "arguments": {"n": 1}}])
        before = len(fake.completions())
        st.send("What happened last time?")
        # The session's other jobs (character memories, scenes, told events) may run through the
        # same connection meanwhile: the follow-up is the request that carries the tool's result.
        follow_up = _wait_until(lambda: next((b for b in fake.completions()[before:] if any(
            m.get("role") == "tool" for m in b["messages"])), None), what="the tool call's follow-up")
        results = [str(m.get("content")) for m in follow_up["messages"] if m.get("role") == "tool"]
        assert any(FULL[:40] in r for r in results), results
    finally:
        st.evaluate("() => { SillyTavern.getContext().chatCompletionSettings.function_calling = false; }")
        save_settings(st)
        # Later tests (the panel's) expect Seraphina's chat to hold only her greeting.
        st.run_command("/delchat")
