"""Sessions (rule SW2): ended by a call or by a gap between messages, each with a full summary and
a one-paragraph short one; the Story Summary parts for the context; the session-end hook."""

from __future__ import annotations

import json

import pytest

from server_plugin.jobs import queue as jobs
from server_plugin.story import sessions
from tests.helpers.api import expect_error, expect_ok
from tests.helpers.conversation import drain, job_rows, post, setup_chat, turn_messages, turns

SMALL = {"live_window_max_messages": 4, "summary_chunk_messages": 2,
         "deep_memory_min_new_messages": 10_000}
HOURS = 60  # minutes


@pytest.fixture
def overrides(request):
    return dict(SMALL, **getattr(request, "param", {}))


def listed(api, chat_id="c1"):
    return expect_ok(api.get(f"/v1/chats/{chat_id}/sessions"), 200, "sessions.response")["sessions"]


def one(api, n, chat_id="c1"):
    return expect_ok(api.get(f"/v1/chats/{chat_id}/sessions/{n}"), 200, "session.response")["session"]


def test_sw2_session_ends_on_call_and_gets_full_and_short_summaries(api, services):
    """rule SW2: POST …/sessions/end closes the open session; its job writes a full summary and a
    one-paragraph short one; the list shows the short one, the single fetch the full one."""
    setup_chat(api)
    turns(api, 0, 6)
    ended = expect_ok(api.post("/v1/chats/c1/sessions/end", json={}), 200, "session.response")["session"]
    assert (ended["n"], ended["state"], ended["end_reason"], ended["message_count"]) == (1, "ended", "call", 12)
    assert [r["ref"] for r in job_rows(services, kind="session_summary")] == ["1"]
    drain(services)
    [session] = listed(api)
    assert session["state"] == "summarized" and "full" not in session
    assert session["short"] and "\n" not in session["short"]
    full = one(api, 1)
    assert full["full"] and full["short"] == session["short"]
    assert len(full["full"]) > len(full["short"])
    # the next message opens session 2
    post(api, turn_messages(6))
    assert [s["n"] for s in listed(api)] == [1, 2] and listed(api)[1]["state"] == "open"


@pytest.mark.parametrize("gap_minutes,new_session", [(6 * HOURS, False), (6 * HOURS + 1, True)])
def test_sw2_session_ends_after_a_gap(api, services, gap_minutes, new_session):
    """rule SW2: a message more than session_gap_hours (6) after the previous one starts a new
    session, and the old one is ended (at its last message) and summarised."""
    setup_chat(api)
    post(api, turn_messages(0, minutes=0))
    out = post(api, turn_messages(1, minutes=0.5 + gap_minutes))
    assert out["sessions_ended"] == ([1] if new_session else [])
    sessions_now = listed(api)
    if not new_session:
        assert [s["n"] for s in sessions_now] == [1] and sessions_now[0]["message_count"] == 4
        return
    first, second = sessions_now
    assert (first["state"], first["end_reason"], first["message_count"]) == ("ended", "gap", 2)
    assert first["ended_at"] == turn_messages(0)[1]["sent_at"]
    assert (second["state"], second["message_count"]) == ("open", 2)
    rows = api.get("/v1/chats/c1/messages").get_json()["messages"]
    assert [m["session_n"] for m in rows] == [1, 1, 2, 2]
    drain(services)
    assert one(api, 1)["state"] == "summarized"


def test_sw2_gap_inside_one_batch(api, services):
    """A batch (an import of an old chat) can hold several sessions."""
    setup_chat(api)
    batch = turn_messages(0, minutes=0) + turn_messages(1, minutes=8 * HOURS) + turn_messages(2, minutes=20 * HOURS)
    out = post(api, batch)
    assert out["sessions_ended"] == [1, 2]
    assert [(s["n"], s["state"], s["message_count"]) for s in listed(api)] == \
        [(1, "ended", 2), (2, "ended", 2), (3, "open", 2)]


def test_sw2_end_without_an_open_session(api):
    setup_chat(api)
    assert expect_ok(api.post("/v1/chats/c1/sessions/end", json={}), 200, "session.response")["session"] is None
    expect_error(api.get("/v1/chats/c1/sessions/1"), 404, "session_not_found")
    expect_error(api.get("/v1/chats/c1/sessions/zero"), 400, "invalid_id")
    expect_error(api.get("/v1/chats/nope/sessions"), 404, "chat_not_found")


@pytest.mark.parametrize("overrides", [{"llm_mode": "client", "session_prompt_max_tokens": 200}], indirect=True)
def test_sw2_a_long_session_goes_in_as_its_summaries_plus_the_rest(api, services):
    """A session too long for one prompt is summarised from its chunk summaries plus the newest
    messages they do not cover (client mode lets us read the prompt the model would get)."""
    setup_chat(api)
    turns(api, 0, 8)
    while (job := api.post("/v1/jobs/claim", json={"kinds": ["chunk_summary"]}).get_json()["job"]):
        api.post(f"/v1/jobs/{job['id']}/complete",
                 json={"text": json.dumps({"summary": f"Chunk told by {job['id'][-4:]}.", "quotes": []})})
    api.post("/v1/chats/c1/sessions/end", json={})
    job = api.post("/v1/jobs/claim", json={"kinds": ["session_summary"]}).get_json()["job"]
    prompt = job["request"]["prompt"]
    assert "Summaries of the earlier part of the session" in prompt and "Chunk told by" in prompt
    assert "lantern number 7" in prompt and "lantern number 0?" not in prompt
    answer = {"full": "Everything, in order.", "short": "The gist.", "quotes": [],
              "open_threads": [], "resolved": []}
    expect_ok(api.post(f"/v1/jobs/{job['id']}/complete", json={"text": json.dumps(answer)}), 200)
    assert (one(api, 1)["full"], one(api, 1)["short"]) == ("Everything, in order.", "The gist.")


def test_sw2_story_summary_parts(api, services):
    """rule SW2: the context gets the latest full session summary, the 5 previous short ones
    (oldest first), then the summary tiers (long-term, consolidated, recent)."""
    setup_chat(api)
    for n in range(8):  # eight sessions of one turn each, 7 hours apart
        post(api, turn_messages(n, minutes=n * 7 * HOURS))
    api.post("/v1/chats/c1/sessions/end", json={})
    drain(services)
    parts = sessions.story_summary_parts(services, "c1")
    kinds = [p["kind"] for p in parts]
    assert kinds == ["session_full"] + ["session_short"] * 5 + ["consolidated", "recent", "recent"]
    assert [p["session"] for p in parts[:6]] == [8, 3, 4, 5, 6, 7]
    assert parts[0]["text"] == one(api, 8)["full"] and parts[1]["text"] == one(api, 3)["short"]
    assert len({p["id"] for p in parts}) == len(parts)


def test_sw2_session_end_hook_lets_other_modules_queue_work(api, services):
    """Other concepts (episodes, sheets) connect work to queue at session end, in the same write."""
    seen = []

    def hook(svc, conn, chat_id, n):
        seen.append((chat_id, n))
        jobs.enqueue(svc, "test_extract", chat_id=chat_id, ref=str(n))
        return 1

    services.hooks.session_ended.connect(hook)
    setup_chat(api)
    turns(api, 0, 2)
    api.post("/v1/chats/c1/sessions/end", json={})
    assert seen == [("c1", 1)]
    assert [r["ref"] for r in job_rows(services, kind="test_extract")] == ["1"]


def test_sw2_edit_marks_a_summarised_session_stale_and_it_can_be_redone(api, services):
    setup_chat(api)
    turns(api, 0, 3)
    api.post("/v1/chats/c1/sessions/end", json={})
    drain(services)
    post(api, turn_messages(0, reply="*Ayla burns the letter from the Duke of Mereth.*")[1:])
    assert one(api, 1)["stale"] is True
    out = expect_ok(api.post("/v1/chats/c1/sessions/1/rebuild", json={}), 200, "session_rebuild.response")
    assert out["jobs_enqueued"] == 1
    drain(services)
    again = one(api, 1)
    assert again["stale"] is False and "Mereth" in again["full"]
