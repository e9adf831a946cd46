"""Branches in real SillyTavern (rule CP2): "Create branch" on an earlier message opens a branch
whose first prompt holds the parent's story summary, with no job queued for what came before."""

from __future__ import annotations

import json

from tests.helpers.fakellm import FakeLLM
from tests.helpers.sidecar import Sidecar
from tests.helpers.sillytavern import STPage, quote_id
from tests.helpers.st_story import chat_jobs, open_chat_id, stored_count, summarised_chat, wait_long

_q = quote_id
_wait_until = wait_long
_jobs, _stored, _chat_id = chat_jobs, stored_count, open_chat_id


def test_cp2_create_branch_on_an_earlier_message_holds_the_parents_story_summary(
        st: STPage, sidecar: Sidecar, fake: FakeLLM) -> None:
    """rule CP2: the parent's first session is ended and summarised, a second one goes on; the
    branch made on a message of the second session is registered with branch_of, has no job of
    its own, and its first prompt carries the first session's summary."""
    parent = summarised_chat(st, sidecar)
    status, session = sidecar.request("GET", f"/v1/chats/{_q(parent)}/sessions/1")
    assert status == 200 and session["session"]["full"], session
    st.send("We walk to the harbour at dawn.")
    st.send("I ask Seraphina which boat is ours.")
    messages = st.messages()
    at = len(messages) - 3  # the reply about the harbour: an earlier message of session 2
    st.run_command(f"/branch-create {at}")
    _wait_until(lambda: _chat_id(st) != parent, what="the branch opened")
    branch = _chat_id(st)
    _wait_until(lambda: sidecar.request("GET", f"/v1/chats/{_q(branch)}")[0] == 200, what="the branch registered")
    status, body = sidecar.request("GET", f"/v1/chats/{_q(branch)}")
    assert body["chat"]["branch_of"]["chat_id"] == parent, body
    _wait_until(lambda: _stored(sidecar, branch) == at + 1, what="the branch's messages synced")
    assert _jobs(sidecar, branch) == [], "no job for what the parent derived already"
    before = len(fake.completions())
    st.send("What did I tell you about the bell?")
    prompt = json.dumps(fake.completions()[before]["messages"])
    first_words = session["session"]["full"].split(".")[0][:60]
    assert first_words and json.dumps(first_words)[1:-1] in prompt, (first_words, prompt[:2000])
    st.shot("branch-first-prompt")
