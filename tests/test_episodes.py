"""Character memories (SW4) and scene summaries (SW5) extracted at session end and from deep-memory
chunks (RV13), in the standard format; strict parsing (a malformed answer fails the job and stores
nothing); verified quotes (SW8: a fabricated quote is dropped and counted); provenance (RV10:
rollback and message deletion remove what was derived only from them, and their vectors); routes."""

from __future__ import annotations

import json

import pytest

from server_plugin.jobs import worker
from tests.helpers.api import expect_error, expect_ok
from tests.helpers.conversation import drain, job_rows, turn_messages, turns
from tests.helpers.episodes import (
    QUIET,
    Labels,
    chat,
    end_session,
    episodes,
    index_count,
    index_entry,
    line,
    messages_by_id,
    no_orphans,
    post_lines,
    register_cast,
)

KEEPER = "I left the harbour because of the lantern keeper."
HARBOUR = [
    ("u1", "kai.png", f'Kai sets the lantern down on the pier. "Ayla, {KEEPER}"'),
    ("a1", "ayla.png", '*Ayla stares at the dark water.* "You never told me that, Kai. I thought you '
                       'were afraid of the sea."'),
    ("u2", "kai.png", '"I promise I will tell you the rest tomorrow."'),
    ("a2", "ayla.png", '*She pulls her cloak tighter.* "Then I will wait for you at the chapel."'),
]


def harbour(api, chat_id: str = "c1", members: tuple[str, ...] = ("ayla.png",)) -> None:
    """Ayla's chat: Kai (the player) tells her why he left; the session is ended."""
    register_cast(api)
    chat(api, chat_id, *members)
    post_lines(api, chat_id, [line(i, who, text, n, turn_id=f"t{n // 2}" if who != "kai.png" else None)
                              for n, (i, who, text) in enumerate(HARBOUR)])
    end_session(api, chat_id)


def ayla_memory(lb: Labels, quotes=None, messages=None) -> dict:
    return {"character": lb.c("Ayla"),
            "summary": "Kai finally told me why he left the harbour; I had thought he feared the sea.",
            "feeling": "hurt, then relieved",
            "quotes": quotes if quotes is not None else [
                {"speaker": "Kai", "text": KEEPER, "message": lb.m("lantern keeper")}],
            "participants": [lb.c("Ayla"), lb.c("Kai")], "importance": 4,
            "messages": messages or [lb.m("lantern keeper"), lb.m("You never told")]}


# --- extractive mode, end to end -------------------------------------------------------------
@pytest.fixture
def overrides(request):
    return dict(QUIET, **getattr(request, "param", {}))


def test_sw4_sw5_extractive_session_end_end_to_end(api, services):
    """rules SW4, SW5, SW8, SW9b (extractive mode): ending a session queues one character-memories
    job per learning non-player character, a scene-summaries job and a told-events job; they store
    items in the standard format, every quote verbatim in its cited message, known by the chat's
    witnesses, each with its index entry."""
    harbour(api)
    queued = {r["kind"]: r for r in job_rows(services)}
    assert {"character_memories", "scene_summaries", "told_events"} <= set(queued)
    assert json.loads(queued["character_memories"]["payload"])["target"]["character_ids"] == ["ayla.png"]
    drain(services)
    texts = {i: m["text"] for i, m in messages_by_id(api, "c1").items()}
    [memory] = episodes(api, kind="character_memory")
    assert memory["character_id"] == "ayla.png" and memory["session"] == 1
    assert memory["summary"] and memory["feeling"] and 1 <= memory["importance"] <= 5
    assert set(memory["participants"]) == {"ayla.png", "kai.png"}
    assert memory["witnesses"] == memory["known_by"] == ["ayla.png", "kai.png"]
    assert set(memory["source_message_ids"]) <= set(texts) and memory["origin"] == "session"
    scenes = episodes(api, kind="scene_summary", chat_id="c1", session=1)
    assert scenes and all(s["title"] and s["character_id"] is None for s in scenes)
    quotes = [q for item in [memory, *scenes] for q in item["quotes"]]
    assert quotes, "the scene has lines worth keeping"
    for q in quotes:
        assert q["text"] in texts[q["message_id"]]  # SW8: verbatim in the cited message
    for item in [memory, *scenes]:
        entry = index_entry(services, item["kind"], item["id"])
        assert entry == {"known_by": ["ayla.png", "kai.png"], "text": item["text"]}
    no_orphans(services)


@pytest.mark.parametrize("overrides", [{"episodes_prompt_max_tokens": 200}], indirect=True)
def test_sw4_a_long_session_is_read_in_parts(api, services):
    """rule SW4: a session longer than episodes_prompt_max_tokens is read in several parts, each
    within the budget, together covering every message once."""
    register_cast(api)
    chat(api, "c1", "ayla.png")
    turns(api, 0, 8)
    end_session(api, "c1")
    targets = [json.loads(r["payload"])["target"] for r in job_rows(services, kind="scene_summaries")]
    assert len(targets) > 1
    ids = [i for t in targets for i in t["message_ids"]]
    assert sorted(ids) == sorted(messages_by_id(api, "c1")) and len(ids) == len(set(ids))
    tokens = {i: m["tokens"] for i, m in messages_by_id(api, "c1").items()}
    assert all(sum(tokens[i] for i in t["message_ids"]) <= 200 for t in targets)


def test_rv14_a_character_not_learning_gets_no_memories(api, services):
    """rule RV14: learn-from-chat off — no character-memories job for that character (the scene
    is still summarised: scenes belong to the chat, not to a character)."""
    register_cast(api)
    api.put("/v1/characters/ayla.png", json={"name": "Ayla", "learn_from_chat": False})
    chat(api, "c1", "ayla.png")
    turns(api, 0, 2)
    end_session(api, "c1")
    assert job_rows(services, kind="character_memories") == []
    drain(services)
    assert episodes(api, kind="character_memory") == [] and episodes(api, kind="scene_summary")


def test_rv16_memory_off_queues_no_extraction(api, services):
    """rule RV16: a chat whose memory was switched off extracts nothing at session end."""
    register_cast(api)
    chat(api, "c1", "ayla.png")
    turns(api, 0, 2)
    api.put("/v1/chats/c1", json={"memory_enabled": False})
    end_session(api, "c1")
    assert [r for r in job_rows(services) if r["kind"] in services.jobs.names()
            and r["kind"] in ("character_memories", "scene_summaries", "told_events")] == []


@pytest.mark.parametrize("overrides", [{"live_window_max_messages": 4, "summary_chunk_messages": 2,
                                        "deep_memory_min_new_messages": 4,
                                        "deep_memory_max_messages": 4}], indirect=True)
def test_rv13_sw4_deep_memory_chunks_file_character_memories_once(api, services):
    """rules RV13, SW4: a deep-memory run also files character memories for its chunk (bounded:
    episodes_deep_per_character each, with the compacting turn); the session end then reads only
    the messages no run has read, so no moment is filed twice."""
    register_cast(api)
    chat(api, "c1", "ayla.png")
    turns(api, 0, 4)  # turn 3 compacts the second chunk: a deep run over 4 messages
    [deep] = job_rows(services, kind="character_memories")
    target = json.loads(deep["payload"])["target"]
    assert (deep["turn_id"], target["origin"], target["per_character"]) == ("t3", "deep_memory", 1)
    drain(services)
    [memory] = episodes(api, kind="character_memory")
    assert memory["origin"] == "deep_memory" and memory["turn_id"] == "t3"
    assert set(memory["source_message_ids"]) <= set(target["message_ids"])
    end_session(api, "c1")
    session_jobs = [json.loads(r["payload"])["target"] for r in job_rows(services, kind="character_memories")][1:]
    assert session_jobs and all(t["origin"] == "session" for t in session_jobs)
    read_at_end = {i for t in session_jobs for i in t["message_ids"]}
    assert read_at_end and not read_at_end & set(target["message_ids"])
    assert read_at_end | set(target["message_ids"]) == set(messages_by_id(api, "c1"))


# --- openai mode: the standard format, strict parsing, verified quotes -------------------------
def openai(fake, **extra):
    return dict(QUIET, llm_mode="openai", llm_url=fake.url, llm_model="fake-model", llm_retries=0,
                llm_read_timeout=5, **extra)


@pytest.fixture
def with_model(overrides, fake):
    overrides.update(openai(fake))
    return fake.responder


def test_sw4_model_memory_in_the_standard_format(with_model, api, services):
    """rule SW4: the model's memory is stored as given — from the character's point of view, with
    feeling, verbatim quotes (speaker and source message), participants, importance and sources —
    and its witnesses from the chat, never from the model (SW9b)."""
    with_model.builders["character_memories"] = lambda lb: {"memories": [ayla_memory(lb)]}
    harbour(api)
    drain(services)
    [memory] = episodes(api, kind="character_memory")
    assert memory["summary"] == "Kai finally told me why he left the harbour; I had thought he feared the sea."
    assert (memory["feeling"], memory["importance"], memory["session"]) == ("hurt, then relieved", 4, 1)
    assert memory["quotes"] == [{"speaker": "Kai", "text": KEEPER, "message_id": "u1"}]
    assert memory["participants"] == ["ayla.png", "kai.png"]
    assert memory["source_message_ids"] == ["u1", "a1"]
    assert memory["known_by"] == ["ayla.png", "kai.png"]
    assert "character_memories" in with_model.seen


def test_sw8_a_fabricated_quote_is_dropped_and_counted(with_model, api, services):
    """rule SW8: a quote not found verbatim in the message it cites never reaches the store; the
    job's result counts it (GET /v1/jobs/{id})."""
    with_model.builders["character_memories"] = lambda lb: {"memories": [ayla_memory(lb, quotes=[
        {"speaker": "Kai", "text": f"\u201c{KEEPER}\u201d", "message": lb.m("lantern keeper")},
        {"speaker": "Kai", "text": "I left because I never loved the sea.", "message": lb.m("lantern keeper")},
        {"speaker": "Ayla", "text": "I thought you were afraid of the sea.", "message": lb.m("lantern keeper")},
    ])]}
    with_model.builders["scene_summaries"] = lambda lb: {"scenes": [{
        "title": "On the pier", "summary": "Kai tells Ayla why he left; she promises to wait at the chapel.",
        "quotes": [{"speaker": "Ayla", "text": "Then I will wait for you at the chapel.", "message": lb.m("chapel")},
                   {"speaker": "Ayla", "text": "I will wait for you forever.", "message": lb.m("chapel")}],
        "participants": [lb.c("Ayla"), lb.c("Kai")], "messages": [m for m, _ in lb.messages]}]}
    harbour(api)
    drain(services)
    [memory] = episodes(api, kind="character_memory")
    assert memory["quotes"] == [{"speaker": "Kai", "text": KEEPER, "message_id": "u1"}]
    [scene] = episodes(api, kind="scene_summary")
    assert [q["text"] for q in scene["quotes"]] == ["Then I will wait for you at the chapel."]
    result = expect_ok(api.get(f"/v1/jobs/{memory['job_id']}"), 200, "job.response")["job"]["result"]
    assert result["dropped_quotes"] == 2  # one invented, one real line cited in the wrong message
    assert result["dropped_quote_reasons"] == {"not_verbatim": 2}
    scene_result = expect_ok(api.get(f"/v1/jobs/{scene['job_id']}"), 200, "job.response")["job"]["result"]
    assert scene_result["dropped_quotes"] == 1
    stored = " ".join(e["text"] for e in episodes(api))
    assert "never loved the sea" not in stored and "forever" not in stored


@pytest.fixture
def one_attempt(overrides):
    # Each job its own call (MJ1's shared calls are tested in test_part_calls.py), so a scripted
    # answer reaches one job.
    overrides.update(job_max_attempts=1, part_call_max_jobs=1)
    return overrides


def test_sw4_malformed_model_output_fails_the_job_and_stores_nothing(one_attempt, with_model, fake,
                                                                      api, services):
    """A garbage answer twice (the first try and its retry): nothing of it is stored; the job ends
    with the extractive memories and says why (MJ2)."""
    with_model.builders["character_memories"] = lambda lb: {"memories": [ayla_memory(lb)]}
    harbour(api)
    assert job_rows(services)[0]["kind"] == "session_summary"
    while job_rows(services, kind="session_summary")[0]["state"] != "done":
        worker.run_one(services)  # the session summary (and the local sheet drafts, run first)
    fake.garbage_next(2)
    worker.run_one(services)  # the character memories get garbage, twice
    [row] = job_rows(services, kind="character_memories")
    result = json.loads(row["result"])
    assert row["state"] == "done" and result["model"]["answer"] == "fallback"
    assert "beyond repair" in result["model"]["error"]
    stored = episodes(api, kind="character_memory")
    assert all("garbage" not in e["summary"] for e in stored)
    assert index_count(services, "character_memory") == len(stored)


def test_sw4_unknown_labels_fail_the_parse(one_attempt, with_model, api, services):
    """An answer whose only memory cites a message label the prompt never showed has nothing to
    keep: retried once, then the job's result comes from the text itself and names the label."""
    with_model.builders["character_memories"] = lambda lb: {"memories": [ayla_memory(lb, messages=["m99"])]}
    harbour(api)
    drain(services)
    [row] = job_rows(services, kind="character_memories")
    result = json.loads(row["result"])
    assert row["state"] == "done" and result["model"]["answer"] == "fallback"
    assert "m99" in result["model"]["error"] and result["model"]["calls"] == 2


# --- client mode: the extension claims and completes -------------------------------------------
@pytest.fixture
def client_mode(overrides):
    overrides.update(llm_mode="client")
    return overrides


def claim(api, kind: str) -> dict:
    job = expect_ok(api.post("/v1/jobs/claim", json={"kinds": [kind]}), 200, "job_claim.response")["job"]
    assert job is not None and job["kind"] == kind
    return job


def labels_of(job: dict) -> Labels:
    request = job["request"]
    return Labels({"messages": [{"content": request["systemPrompt"]}, {"content": request["prompt"]}]})


def test_sw8_client_path_rejects_garbage_then_drops_a_fabricated_quote(client_mode, api, services):
    """rules SW4, SW8 through claim/complete: a malformed answer is refused (422) and stores
    nothing; a later well-formed answer is stored without its fabricated quote, and the job's
    result counts the drop."""
    harbour(api)
    job = claim(api, "character_memories")
    expect_error(api.post(f"/v1/jobs/{job['id']}/complete", json={"text": "Sure, here you go!"}),
                 422, "model_output_invalid")
    assert episodes(api) == []
    services.clock.advance(seconds=3600)
    job = claim(api, "character_memories")
    lb = labels_of(job)
    answer = {"memories": [ayla_memory(lb, quotes=[
        {"speaker": "Kai", "text": KEEPER, "message": lb.m("lantern keeper")},
        {"speaker": "Kai", "text": "The keeper was my father.", "message": lb.m("lantern keeper")}])]}
    done = expect_ok(api.post(f"/v1/jobs/{job['id']}/complete", json={"text": json.dumps(answer)}),
                     200, "job.response")["job"]
    assert done["state"] == "done" and done["result"]["dropped_quotes"] == 1
    [memory] = episodes(api, kind="character_memory")
    assert [q["text"] for q in memory["quotes"]] == [KEEPER]


def test_sw8_quotes_are_checked_again_against_the_message_as_it_is_when_stored(client_mode, api, services):
    """rule SW8: a message edited between the claim and the answer — the quote the model copied
    from the old text is not in the message any more, so it is dropped when the result is stored."""
    harbour(api)
    job = claim(api, "character_memories")
    post_lines(api, "c1", [line("u1", "kai.png", "Kai sets the lantern down on the pier.", 0)])
    lb = labels_of(job)
    done = expect_ok(api.post(f"/v1/jobs/{job['id']}/complete",
                              json={"text": json.dumps({"memories": [ayla_memory(lb)]})}), 200)["job"]
    assert done["result"]["dropped_quotes"] == 1
    assert done["result"]["dropped_quote_reasons"] == {"not_verbatim": 1}
    [memory] = episodes(api, kind="character_memory")
    assert memory["quotes"] == []


def test_sw8_an_edited_message_keeps_only_the_quotes_still_in_it(with_model, api, services):
    """rule SW8: after a message is edited, a stored quote no longer verbatim in it is dropped
    (and the item's index text follows); a quote still in it stays."""
    with_model.builders["character_memories"] = two_memories
    harbour(api)
    drain(services)
    only_u1, both = episodes(api, kind="character_memory")
    post_lines(api, "c1", [line("u1", "kai.png", "Kai sets the lantern down on the pier.", 0),
                           line("a2", "ayla.png", '*She smiles.* "Then I will wait for you at the chapel."', 3,
                                turn_id="t1")])
    assert expect_ok(api.get(f"/v1/episodes/{only_u1['id']}"), 200)["episode"]["quotes"] == []
    kept = expect_ok(api.get(f"/v1/episodes/{both['id']}"), 200, "episode.response")["episode"]
    assert kept["quotes"] == [{"speaker": "Ayla", "text": "Then I will wait for you at the chapel.",
                               "message_id": "a2"}]
    assert index_entry(services, "character_memory", both["id"])["text"] == kept["text"]
    assert KEEPER not in index_entry(services, "character_memory", only_u1["id"])["text"]
    no_orphans(services)


# --- provenance (RV10) ---------------------------------------------------------------------------
def two_memories(lb: Labels) -> dict:
    """One memory from u1 only, one from u1 and a2 with a quote from each."""
    return {"memories": [
        ayla_memory(lb, messages=[lb.m("lantern keeper")]),
        {**ayla_memory(lb, messages=[lb.m("lantern keeper"), lb.m("chapel")], quotes=[
            {"speaker": "Kai", "text": KEEPER, "message": lb.m("lantern keeper")},
            {"speaker": "Ayla", "text": "Then I will wait for you at the chapel.", "message": lb.m("chapel")}]),
         "summary": "I promised Kai to wait for him at the chapel."}]}


def test_rv10_deleting_a_message_removes_what_was_derived_only_from_it(with_model, api, services):
    """Deleting a source message: an item derived only from it goes with its index entry; an item
    citing other messages too loses that id and the quote from it (its index text follows)."""
    with_model.builders["character_memories"] = two_memories
    harbour(api)
    drain(services)
    only_u1, both = episodes(api, kind="character_memory")
    assert (only_u1["source_message_ids"], both["source_message_ids"]) == (["u1"], ["u1", "a2"])
    out = expect_ok(api.delete("/v1/chats/c1/messages/u1"), 200, "message_deleted.response")
    assert out["removed"]["episodes"] == 1 and out["removed"]["episodes_trimmed"] == 1
    expect_error(api.get(f"/v1/episodes/{only_u1['id']}"), 404, "episode_not_found")
    assert index_entry(services, "character_memory", only_u1["id"]) is None
    kept = expect_ok(api.get(f"/v1/episodes/{both['id']}"), 200, "episode.response")["episode"]
    assert kept["source_message_ids"] == ["a2"]
    assert [q["message_id"] for q in kept["quotes"]] == ["a2"]
    assert index_entry(services, "character_memory", both["id"])["text"] == kept["text"]
    assert KEEPER not in kept["text"]
    no_orphans(services)


def test_rv10_rollback_removes_what_the_turn_derived(with_model, api, services):
    """RV10: rolling back a turn removes the items derived only from that turn's messages (here
    the reply a2 of turn t1) and trims the others, with their index entries."""
    with_model.builders["character_memories"] = lambda lb: {"memories": [
        ayla_memory(lb, messages=[lb.m("chapel")], quotes=[
            {"speaker": "Ayla", "text": "Then I will wait for you at the chapel.", "message": lb.m("chapel")}]),
        two_memories(lb)["memories"][1]]}
    harbour(api)
    drain(services)
    both, only_a2 = episodes(api, kind="character_memory")  # in story order: both starts at u1
    assert (both["source_message_ids"], only_a2["source_message_ids"]) == (["u1", "a2"], ["a2"])
    out = expect_ok(api.post("/v1/chats/c1/turns/t1/rollback", json={}), 200, "turn_rollback.response")
    assert out["removed"]["episodes"] == 1 and out["removed"]["episodes_trimmed"] == 1
    assert [e["id"] for e in episodes(api, kind="character_memory")] == [both["id"]]
    assert index_entry(services, "character_memory", only_a2["id"]) is None
    assert episodes(api, kind="character_memory")[0]["source_message_ids"] == ["u1"]
    no_orphans(services)


@pytest.mark.parametrize("overrides", [{"live_window_max_messages": 4, "summary_chunk_messages": 2,
                                        "deep_memory_min_new_messages": 4,
                                        "deep_memory_max_messages": 4}], indirect=True)
def test_rv10_rollback_of_the_compacting_turn_removes_its_deep_run_memories(api, services):
    """RV10: the character memories a deep-memory run filed go with the turn that compacted (and
    their vectors); the messages it read are read again by the next run."""
    register_cast(api)
    chat(api, "c1", "ayla.png")
    turns(api, 0, 4)
    drain(services)
    assert len(episodes(api, kind="character_memory")) == 1 and index_count(services, "character_memory") == 1
    out = expect_ok(api.post("/v1/chats/c1/turns/t3/rollback", json={}), 200, "turn_rollback.response")
    assert out["removed"]["episodes"] == 1
    assert episodes(api, kind="character_memory") == [] and index_count(services, "character_memory") == 0
    no_orphans(services)
    post_lines(api, "c1", turn_messages(3, turn_id="t3b"))
    [job] = [r for r in job_rows(services, kind="character_memories")]
    assert job["turn_id"] == "t3b"  # the released messages are read again
    drain(services)
    assert [e["turn_id"] for e in episodes(api, kind="character_memory")] == ["t3b"]


def test_rename_keeps_provenance(with_model, api, services):
    """A chat renamed by SillyTavern keeps its items' provenance: deleting a source message under
    the new id still removes what was derived only from it."""
    with_model.builders["character_memories"] = two_memories
    harbour(api)
    drain(services)
    expect_ok(api.post("/v1/chats/c1/rename", json={"new_id": "Ayla - 2026-03-01@12h00m00s"}), 200)
    assert {e["chat_id"] for e in episodes(api)} == {"Ayla - 2026-03-01@12h00m00s"}
    out = expect_ok(api.delete("/v1/chats/Ayla - 2026-03-01@12h00m00s/messages/u1"), 200)
    assert out["removed"]["episodes"] == 1 and out["removed"]["episodes_trimmed"] == 1
    no_orphans(services)


def test_chat_delete_removes_its_items_and_index_entries(api, services):
    """Deleting a chat removes its character memories and scene summaries from the store and the
    index (and its messages' entries)."""
    harbour(api)
    drain(services)
    assert episodes(api)
    out = expect_ok(api.delete("/v1/chats/c1"), 200, "chat_deleted.response")
    assert out["removed"]["episodes"] >= 2
    assert episodes(api) == []
    for kind in ("character_memory", "scene_summary", "message"):
        assert index_count(services, kind) == 0, kind
    no_orphans(services)


# --- routes ----------------------------------------------------------------------------------------
def test_routes_list_filter_get_and_delete(api, services):
    """GET /v1/episodes filters by kind, character, chat and session (wrapped list); GET one;
    DELETE (a person) removes the item and its index entry."""
    harbour(api)
    drain(services)
    everything = episodes(api)
    assert {e["kind"] for e in everything} == {"character_memory", "scene_summary"}
    assert episodes(api, character_id="ayla.png") == episodes(api, kind="character_memory")
    assert episodes(api, chat_id="c1", session=1) == everything
    assert episodes(api, session=2) == [] and episodes(api, chat_id="nope") == []
    assert episodes(api, limit=1) == everything[:1]
    one = everything[0]
    assert expect_ok(api.get(f"/v1/episodes/{one['id']}"), 200, "episode.response")["episode"] == one
    expect_error(api.get("/v1/episodes?kind=memory"), 400, "invalid_request")
    expect_error(api.get("/v1/episodes/e_missing"), 404, "episode_not_found")
    assert expect_ok(api.delete(f"/v1/episodes/{one['id']}"), 200, "deleted.response") == {"deleted": one["id"]}
    expect_error(api.get(f"/v1/episodes/{one['id']}"), 404, "episode_not_found")
    assert index_entry(services, one["kind"], one["id"]) is None
    no_orphans(services)
