"""Campaigns in real SillyTavern (rules CP1e, CP1f, CP2c): "Convert to group" keeps the campaign
and derives nothing again; "Continue in a new chat" opens a chat of the same campaign with a
"previously" recap."""

from __future__ import annotations

from tests.helpers.fakellm import FakeLLM
from tests.helpers.sidecar import Sidecar
from tests.helpers.sillytavern import STPage, quote_id
from tests.helpers.st_story import chat_jobs, open_chat_id, stored_count, summarised_chat, wait_long

_q = quote_id
_wait_until = wait_long
_jobs, _stored, _chat_id = chat_jobs, stored_count, open_chat_id
_summarised_chat = summarised_chat


def _chat(sidecar: Sidecar, chat_id: str) -> dict | None:
    status, body = sidecar.request("GET", f"/v1/chats/{_q(chat_id)}")
    return body["chat"] if status == 200 else None


def test_cp1e_convert_to_group_keeps_the_campaign_and_derives_nothing_again(
        st: STPage, sidecar: Sidecar, fake: FakeLLM) -> None:
    """rule CP1e, CP2c: SillyTavern's own "Convert to group" (the chat menu's item, confirmed)
    gives a group chat that the extension registers as a branch of the one-to-one chat at its last
    message, in its campaign; its messages are the copies (no job queued); its first prompt holds
    the session's summary once."""
    parent = _summarised_chat(st, sidecar)
    campaign = _chat(sidecar, parent)["campaign_id"]
    st.evaluate("() => document.querySelector('#option_convert_to_group').click()")
    st.page.locator(".popup-button-ok").first.click()
    _wait_until(lambda: _chat_id(st) not in (None, parent), what="the group chat opened")
    group = _chat_id(st)
    _wait_until(lambda: (_chat(sidecar, group) or {}).get("branch_of") is not None, what="the group registered")
    chat = _chat(sidecar, group)
    assert chat["branch_of"]["chat_id"] == parent and chat["campaign_id"] == campaign, chat
    _wait_until(lambda: _stored(sidecar, group) == len(st.messages()), what="the group synced")
    assert _jobs(sidecar, group) == [], "the copies derive nothing again"
    before = len(fake.completions())
    st.send("What did I tell you about the bell?")
    prompt = "\n".join(str(m.get("content")) for m in fake.completions()[before]["messages"])
    assert "[Story so far]" in prompt, prompt[:3000]
    story = prompt.split("[Story so far]", 1)[1].split("\n[", 1)[0]
    lines = [line for line in story.splitlines() if line.strip()]
    assert any("silver bell" in line for line in lines), story
    assert len(lines) == len(set(lines)), story  # the session's summary, once
    status, found = sidecar.request("POST", "/v1/search", {"query": "silver bell", "chat_id": group, "k": 20})
    assert status == 200 and found["results"], found
    assert {r["chat_id"] for r in found["results"] if r["kind"] == "message"} == {group}, found  # CP2c
    st.shot("converted-group-first-prompt")


def test_cp1f_continue_opens_a_new_chat_of_the_campaign_with_a_recap(
        st: STPage, sidecar: Sidecar, fake: FakeLLM) -> None:
    """rule CP1f: /chronicler-continue opens a new chat with the same character, registered in
    the first chat's campaign, whose first message is the "Previously:" recap of the summarised
    session; the new chat's first prompt holds the campaign's story summary."""
    parent = _summarised_chat(st, sidecar)
    campaign = _chat(sidecar, parent)["campaign_id"]
    st.run_command("/chronicler-continue")
    _wait_until(lambda: _chat_id(st) not in (None, parent), what="the new chat opened")
    new = _chat_id(st)
    try:
        _recap_chat_checks(st, sidecar, fake, new, campaign)
    finally:
        # Later tests open Seraphina's latest chat: not this one, whose recap is never synced.
        st.run_command("/delchat")
        _wait_until(lambda: _chat_id(st) != new, what="the recap chat deleted")


def _recap_chat_checks(st: STPage, sidecar: Sidecar, fake: FakeLLM, new: str, campaign: str) -> None:
    _wait_until(lambda: (_chat(sidecar, new) or {}).get("campaign_id") == campaign, what="the new chat joined")
    _wait_until(lambda: any("Previously:" in (m.get("mes") or "") for m in st.messages()), what="the recap")
    recap = next(m for m in st.messages() if "Previously:" in (m.get("mes") or ""))
    assert recap["extra"].get("chronicler_recap") is True
    before = len(fake.completions())
    st.send("Where were we?")
    prompt = "\n".join(str(m.get("content")) for m in fake.completions()[before]["messages"])
    assert "silver bell" in prompt.lower() or "chapel" in prompt.lower(), prompt[:2000]
    st.shot("continued-campaign")
