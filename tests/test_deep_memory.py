"""Deep memory (rule RV13): after a compaction, once enough new messages are summarised, a bounded
job files durable facts (RV18) as unpinned memories; pinned items untouched (RV11); learning off
(RV14) and memory off (RV16) respected; works without tools (RV15); rolled back with its turn (RV10)."""

from __future__ import annotations

import pytest

from server_plugin.jobs import queue
from tests.helpers.api import expect_ok
from tests.helpers.conversation import drain, job_rows, post, setup_chat, turn_messages

FACTS = [
    "My birthday is on March 3.",
    "I'm allergic to bees.",
    "My favourite colour is green.",
    "Please call me Kit.",
    "I promise I will find the lighthouse keeper.",
    "I was born on the island of Sel.",
]


@pytest.fixture
def overrides():
    return {"live_window_max_messages": 4, "summary_chunk_messages": 2,
            "deep_memory_min_new_messages": 4, "deep_memory_max_messages": 4, "deep_memory_max_items": 2}


def fact_turn(api, n: int) -> None:
    post(api, turn_messages(n, user=f"*Kai leans in.* {FACTS[n % len(FACTS)]}",
                            reply="*Ayla nods slowly and keeps rowing.*"))


def deep_jobs(services):
    return job_rows(services, kind="durable_memories")


def saved(api, **params):
    qs = "&".join(f"{k}={v}" for k, v in params.items())
    return expect_ok(api.get(f"/v1/memories?{qs}"), 200, "memories.response")["memories"]


def test_rv13_runs_only_after_enough_new_messages_and_files_a_few_facts(api, services):
    """rule RV13: no run until deep_memory_min_new_messages summarised messages wait; a run reads at
    most deep_memory_max_messages and files at most deep_memory_max_items unpinned memories, with
    actor background, the turn that compacted, its sources and its witnesses (SW9b)."""
    setup_chat(api)
    for n in range(3):  # turn 2 compacts the first chunk: 2 messages waiting, fewer than 4
        fact_turn(api, n)
    assert deep_jobs(services) == []
    fact_turn(api, 3)  # the second chunk: 4 messages wait
    [job] = deep_jobs(services)
    assert job["turn_id"] == "t3"
    drain(services)
    memories = saved(api, scope="character", character_id="ayla.png")
    assert len(memories) == 2  # the chunk states two facts; both within deep_memory_max_items
    assert {m["text"] for m in memories} == {"Kai's birthday is March 3.", "Kai is allergic to bees."}
    for m in memories:
        assert (m["pinned"], m["actor"], m["chat_id"], m["turn_id"]) == (False, "background", "c1", "t3")
        assert m["known_by"] == ["ayla.png", "kai.png"] and len(m["source_message_ids"]) == 1
    fact_turn(api, 4)  # 2 more summarised: below the threshold again
    assert len(deep_jobs(services)) == 1


def test_rv13_at_most_max_items_per_run(api, services, overrides):
    """rule RV13: bounded — a chunk full of facts still yields at most deep_memory_max_items."""
    setup_chat(api)
    post(api, [{"id": f"f{i}", "role": "user", "name": "Kai", "speaker_id": "kai.png",
                "text": FACTS[i]} for i in range(6)])
    post(api, turn_messages(9))
    [job] = deep_jobs(services)
    drain(services)
    assert len(saved(api, scope="character", character_id="ayla.png")) == 2
    result = queue.get(services, job["id"])["result"]
    assert len(result["memories"]) == 2 and any("over the limit" in s for s in result["skipped"])


def test_rv11_pinned_items_are_never_touched_and_saved_facts_not_repeated(api, services):
    """rule RV11/RV13: a fact already saved (here pinned by a person) is not filed again, and the
    pinned item is left exactly as it was."""
    setup_chat(api)
    pinned = expect_ok(api.post("/v1/memories", json={
        "text": "Kai's birthday is March 3.", "scope": "character", "character_id": "ayla.png",
        "pinned": True, "actor": "user"}), 201)["memory"]
    for n in range(4):
        fact_turn(api, n)
    drain(services)
    memories = saved(api, scope="character", character_id="ayla.png")
    assert [m["text"] for m in memories if not m["pinned"]] == ["Kai is allergic to bees."]
    assert [m for m in memories if m["pinned"]] == [
        {**pinned, "recent": True, "archived": False}]


def test_rv14_learning_off_files_nothing_for_that_character(api, services):
    """rule RV14: with learn-from-chat off, deep memory files nothing for the character."""
    setup_chat(api)
    api.put("/v1/characters/ayla.png", json={"name": "Ayla", "learn_from_chat": False})
    for n in range(4):
        fact_turn(api, n)
    drain(services)
    assert saved(api) == []
    assert queue.get(services, deep_jobs(services)[0]["id"])["result"] == {"skipped": "nothing left to do"}


def test_rv16_memory_switched_off_stops_a_queued_run(api, services):
    """rule RV16: a chat whose memory was switched off after its run was queued files nothing."""
    setup_chat(api)
    for n in range(4):
        fact_turn(api, n)
    assert len(deep_jobs(services)) == 1
    api.put("/v1/chats/c1", json={"memory_enabled": False})
    drain(services)
    assert saved(api) == []


def test_rv15_deep_memory_needs_no_tool_support(api, services):
    """rule RV15: the model need not call tools mid-reply; deep memory is our own background job."""
    setup_chat(api)
    for n in range(4):
        fact_turn(api, n)
    drain(services)
    assert len(saved(api, scope="character", character_id="ayla.png")) == 2


def test_rv10_rollback_of_the_turn_removes_its_deep_memories(api, services):
    """rule RV10: regenerating the turn that compacted removes the memories its deep-memory run
    wrote (pinned ones survive), and those messages are read again after the new reply."""
    setup_chat(api)
    keep = expect_ok(api.post("/v1/memories", json={
        "text": "Kai owes Ayla a boat.", "scope": "character", "character_id": "ayla.png",
        "pinned": True, "actor": "user", "chat_id": "c1", "turn_id": "t3"}), 201)["memory"]
    for n in range(4):
        fact_turn(api, n)
    drain(services)
    assert len(saved(api, scope="character", character_id="ayla.png", pinned="false")) == 2
    out = expect_ok(api.post("/v1/chats/c1/turns/t3/rollback", json={}), 200, "turn_rollback.response")
    assert out["removed"]["memories"] == 2 and out["removed"]["jobs"] >= 2
    remaining = saved(api, scope="character", character_id="ayla.png")
    assert [m["id"] for m in remaining] == [keep["id"]]
    post(api, turn_messages(3, user=f"*Kai leans in.* {FACTS[3]}", reply="*Ayla smiles.*", turn_id="t3b"))
    drain(services)
    again = saved(api, scope="character", character_id="ayla.png", pinned="false")
    assert {m["turn_id"] for m in again} == {"t3b"} and len(again) == 2
