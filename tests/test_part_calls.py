"""Rule MJ1: the jobs of a chat that read the same part of the transcript share one model call.

At a session end the session summary, the characters' memories, the scene summaries, the told
events, the sheet updates and lore growth each have their own job; the worker claims them
together and the model reads the session once, each job a section of one answer. Every job keeps
its own checks (verified quotes, speakers), its own result and its share of the cost; a section
that cannot be used falls back alone."""

from __future__ import annotations

import json

import pytest

from server_plugin.jobs.tasks import parts
from server_plugin.jobs.tasks.base import COMMON_RULES, QUOTE_RULE, CharacterRef, ChatMessage
from server_plugin.jobs.tasks.episodes import character_memories, scene_summaries
from server_plugin.jobs.tasks.summaries import session_summary
from tests.helpers.api import expect_error, expect_ok
from tests.helpers.conversation import drain, job_rows
from tests.helpers.episodes import QUIET, SHARED, Answers, chat, end_session, episodes, line, post_lines, register_cast

KEEPER = "I left the harbour because of the lantern keeper."
PIER = [
    ("u1", "kai.png", f'Kai sets the lantern down on the pier. "Ayla, {KEEPER}"'),
    ("a1", "ayla.png", '*Ayla stares at the dark water.* "You never told me that, Kai."'),
    ("u2", "kai.png", '"I promise I will tell you the rest tomorrow."'),
    ("a2", "ayla.png", '*She pulls her cloak tighter.* "Then I will wait for you at the chapel."'),
]
# Told events need a secret to be told (none here): that job asks no model.
SESSION_END = {"session_summary", "character_memories", "scene_summaries", "sheet_updates", "lore_growth"}


def pier(api, chat_id: str = "c1") -> None:
    register_cast(api)
    chat(api, chat_id, "ayla.png")
    post_lines(api, chat_id, [line(i, who, text, n, turn_id=f"t{n // 2}" if who != "kai.png" else None)
                              for n, (i, who, text) in enumerate(PIER)])
    end_session(api, chat_id)


def memory(lb, quotes) -> dict:
    return {"memories": [{
        "character": lb.c("Ayla"), "summary": "Kai told me why he left the harbour.", "feeling": "hurt",
        "quotes": quotes, "participants": [lb.c("Ayla"), lb.c("Kai")], "importance": 4,
        "messages": [lb.m("lantern keeper")]}]}


@pytest.fixture
def overrides(fake, request):
    return {**QUIET, "llm_mode": "openai", "llm_url": fake.url, "llm_model": "fake-model", "llm_retries": 0,
            "llm_read_timeout": 5, **getattr(request, "param", {})}


def model_jobs(services) -> list:
    return [r for r in job_rows(services) if r["kind"] in SESSION_END]


def results(services) -> dict[str, dict]:
    return {r["kind"]: json.loads(r["result"]) for r in model_jobs(services)}


def test_mj1_a_session_end_reads_the_session_once(api, services, fake):
    """rule MJ1: one model call answers every session-end job; each job is done with its own
    result, names the jobs it shared the call with, and the call's cost is counted once."""
    pier(api)
    drain(services)
    bodies = fake.completions()
    assert len(bodies) == 1 and SHARED in bodies[0]["messages"][0]["content"]
    user = bodies[0]["messages"][1]["content"]
    assert user.count(KEEPER) == 1  # the session's messages are shown once
    rows = model_jobs(services)
    assert {r["kind"] for r in rows} == SESSION_END and all(r["state"] == "done" for r in rows)
    ids = sorted(r["id"] for r in rows)
    for kind, result in results(services).items():
        assert sorted(result["model"]["shared_call"]) == ids, kind
        assert result["model"]["answer"] == "first_try", kind
    assert sum(r["model_calls"] for r in rows) == 1
    assert all(r["prompt_tokens"] > 0 for r in rows)
    stats = api.get("/v1/jobs/stats?chat_id=c1").get_json()
    assert stats["total"]["calls"] == 1, stats
    assert stats["total"]["prompt_tokens"] == sum(r["prompt_tokens"] for r in rows)


def test_mj1_sw8_each_section_keeps_its_own_checks(api, services, fake):
    """rule SW8 in a shared call: an invented quote and a quote put in the wrong mouth are dropped
    from the memories' section and counted on that job, the true quote is kept."""
    fake.responder.builders["character_memories"] = lambda lb: memory(lb, [
        {"speaker": "Kai", "text": KEEPER, "message": lb.m("lantern keeper")},
        {"speaker": "Kai", "text": "I never loved the sea.", "message": lb.m("lantern keeper")},
        {"speaker": "Ayla", "text": "I promise I will tell you the rest tomorrow.", "message": lb.m("I promise")}])
    pier(api)
    drain(services)
    assert len(fake.completions()) == 1
    [kept] = episodes(api, kind="character_memory")
    assert kept["quotes"] == [{"speaker": "Kai", "text": KEEPER, "message_id": "u1"}]
    result = results(services)["character_memories"]
    assert result["dropped_quotes"] == 2
    assert result["dropped_quote_reasons"] == {"not_verbatim": 1, "wrong_speaker": 1}
    assert "never loved the sea" not in json.dumps(episodes(api))
    assert results(services)["scene_summaries"]["dropped_quotes"] == 0


def test_mj1_a_bad_section_falls_back_alone(api, services, fake):
    """A section the job cannot use (scenes that are not a list) is made from the text for that job
    alone, and its result says so; the other sections' answers are kept as the model gave them."""
    fake.responder.builders["character_memories"] = lambda lb: memory(
        lb, [{"speaker": "Kai", "text": KEEPER, "message": lb.m("lantern keeper")}])
    fake.responder.builders["scene_summaries"] = lambda lb: {"scenes": "the pier"}
    pier(api)
    drain(services)
    assert len(fake.completions()) == 1
    got = results(services)
    assert got["scene_summaries"]["model"]["answer"] == "fallback"
    assert "scenes" in got["scene_summaries"]["model"]["error"]
    assert any("could not be used" in n for n in got["scene_summaries"]["model"]["dropped"])
    assert got["character_memories"]["model"]["answer"] == "first_try"
    assert not any("scenes" in n for n in got["character_memories"]["model"]["dropped"])
    [kept] = episodes(api, kind="character_memory")
    assert kept["summary"] == "Kai told me why he left the harbour."


def test_mj1_a_section_citing_only_unknown_labels_says_which(api, services, fake):
    """MJ2 in a shared call: a scene whose only sources are labels the prompt never showed leaves
    nothing to keep; that job's error names the label, the other jobs are unaffected."""
    fake.responder.builders["scene_summaries"] = lambda lb: {"scenes": [{
        "title": "Pier", "summary": "They talk.", "quotes": [], "participants": [lb.c("Ayla")],
        "messages": ["m99"]}]}
    pier(api)
    drain(services)
    got = results(services)
    assert got["scene_summaries"]["model"]["answer"] == "fallback"
    assert "m99" in got["scene_summaries"]["model"]["error"]
    assert all(got[k]["model"]["answer"] == "first_try" for k in SESSION_END - {"scene_summaries"})


@pytest.mark.parametrize("overrides", [{"part_call_max_jobs": 1}], indirect=True)
def test_mj1_one_job_per_call_when_sharing_is_off(api, services, fake):
    """`part_call_max_jobs` 1: every job has its own call, as before."""
    pier(api)
    drain(services)
    rows = model_jobs(services)
    assert len(fake.completions()) == len(rows) >= len(SESSION_END)
    assert not any(SHARED in b["messages"][0]["content"] for b in fake.completions())
    assert all("shared_call" not in json.loads(r["result"])["model"] for r in rows)


def test_mj1_chats_do_not_share_a_call(api, services, fake):
    """Two chats' session ends: each chat's jobs share a call, never the other chat's."""
    pier(api, "c1")
    chat(api, "c2", "ayla.png")
    post_lines(api, "c2", [line(f"{i}b", who, text, n) for n, (i, who, text) in enumerate(PIER)])
    end_session(api, "c2")
    drain(services)
    assert len(fake.completions()) == 2
    by_chat: dict[str, set] = {}
    for row in model_jobs(services):
        by_chat.setdefault(row["chat_id"], set()).update(json.loads(row["result"])["model"]["shared_call"])
    assert by_chat["c1"].isdisjoint(by_chat["c2"])


# --- combine and joins, pure -------------------------------------------------------------------
MESSAGES = [ChatMessage("u1", "Kai", f'"{KEEPER}"', "user", "kai.png"),
            ChatMessage("a1", "Ayla", '"You never told me."', "assistant", "ayla.png")]
CAST = [CharacterRef("ayla.png", "Ayla", False), CharacterRef("kai.png", "Kai", True)]


def memories_of(messages, cast):
    return character_memories(messages, cast, per_character=2, max_quotes=2, memory_tokens=200)


def scenes_of(messages, cast):
    return scene_summaries(messages, cast, max_scenes=2, max_quotes=2, scene_tokens=200,
                           gap_minutes=60, max_messages=100)


def session_of(messages):
    return session_summary(messages, full_tokens=300, short_tokens=80, max_quotes=2, max_threads=3,
                           thread_max_chars=200)


def test_mj1_combine_says_the_common_rules_once_and_each_section_its_own():
    prompt = parts.combine({"memories": memories_of(MESSAGES, CAST), "scenes": scenes_of(MESSAGES, CAST),
                            "session": session_of(MESSAGES)})
    assert prompt.system.count(COMMON_RULES) == 1 and prompt.system.count(QUOTE_RULE) == 1
    for key in ("memories", "scenes", "session"):
        assert f'Its answer goes under "{key}"' in prompt.system
    assert prompt.user.count(KEEPER) == 1
    assert set(prompt.json_schema["properties"]) == {"memories", "scenes", "session"}


def test_mj1_joins_refuses_other_messages_or_other_characters():
    base = [memories_of(MESSAGES, CAST)]
    assert parts.joins(base, scenes_of(MESSAGES, CAST))
    assert parts.joins(base, session_of(MESSAGES))  # shows no characters: labels cannot clash
    assert not parts.joins(base, scenes_of(MESSAGES[:1], CAST))
    assert not parts.joins(base, scenes_of(MESSAGES, CAST[:1] + [CharacterRef("bren.png", "Bren", False)]))
    with pytest.raises(ValueError):
        parts.combine({"memories": base[0], "scenes": scenes_of(MESSAGES[:1], CAST)})


# --- client mode: the extension runs the shared prompt -----------------------------------------
def as_body(request: dict) -> dict:
    """A claimed job's generateRaw arguments as the chat-completion body a model would get."""
    return {"messages": [{"role": "system", "content": request["systemPrompt"]},
                         {"role": "user", "content": request["prompt"]}]}


@pytest.mark.parametrize("overrides", [{"llm_mode": "client"}], indirect=True)
def test_mj1_client_mode_claims_one_shared_prompt_and_completes_every_job(api, services):
    """rule MJ1 in client mode: one claim gives the session-end jobs' shared prompt (listing the
    jobs it serves, all claimed for the extension); one answer completes each with its own result."""
    answers = Answers()
    answers.builders["character_memories"] = lambda lb: memory(
        lb, [{"speaker": "Kai", "text": KEEPER, "message": lb.m("lantern keeper")}])
    pier(api)
    drain(services)  # local work (sheet drafts) runs in every mode
    job = expect_ok(api.post("/v1/jobs/claim", json={}), 200, "job_claim.response")["job"]
    assert job["task"] == "part_notes" and job["shared_with"][0] == job["id"]
    rows = model_jobs(services)
    assert sorted(job["shared_with"]) == sorted(r["id"] for r in rows)
    assert all(r["state"] == "running" and r["claimed_by"] == "client" for r in rows)
    done = expect_ok(api.post(f"/v1/jobs/{job['id']}/complete",
                              json={"text": answers(as_body(job["request"])), "attempt": job["attempt"]}),
                     200, "job.response")["job"]
    assert done["state"] == "done"
    assert all(r["state"] == "done" for r in model_jobs(services))
    assert sum(r["model_calls"] for r in model_jobs(services)) == 1
    [kept] = episodes(api, kind="character_memory")
    assert kept["quotes"] == [{"speaker": "Kai", "text": KEEPER, "message_id": "u1"}]
    assert expect_ok(api.post("/v1/jobs/claim", json={}), 200, "job_claim.response")["job"] is None


@pytest.mark.parametrize("overrides", [{"llm_mode": "client"}], indirect=True)
def test_mj1_client_mode_a_refused_answer_or_a_failure_sends_every_job_back(api, services):
    """An unusable answer to a shared prompt (422) or the extension's failure puts every job of
    the call back in the queue, nothing stored."""
    pier(api)
    drain(services)
    job = expect_ok(api.post("/v1/jobs/claim", json={}), 200, "job_claim.response")["job"]
    expect_error(api.post(f"/v1/jobs/{job['id']}/complete", json={"text": "no json here"}), 422,
                 "model_output_invalid")
    assert all(r["state"] == "pending" for r in model_jobs(services))
    assert episodes(api) == []
    services.clock.advance(seconds=3600)  # past the retry's back-off
    again = expect_ok(api.post("/v1/jobs/claim", json={}), 200, "job_claim.response")["job"]
    assert sorted(again["shared_with"]) == sorted(job["shared_with"])
    expect_ok(api.post(f"/v1/jobs/{again['id']}/fail", json={"error": "the model is busy"}), 200, "job.response")
    assert all(r["state"] == "pending" for r in model_jobs(services))


@pytest.mark.parametrize("overrides", [{"llm_mode": "client"}], indirect=True)
def test_mj1_client_mode_a_store_that_fails_is_said_as_itself(api, services, monkeypatch):
    """When storing the leader's section fails (here: a bug), `complete` answers 500 with the
    error envelope, not 409 "rolled back or reclaimed"; the leader's attempt is recorded as failed
    (back in the queue, its error kept) and the other jobs of the call are stored."""
    from server_plugin.jobs import queue as job_queue
    pier(api)
    drain(services)
    job = expect_ok(api.post("/v1/jobs/claim", json={}), 200, "job_claim.response")["job"]
    real = job_queue.mark_done

    def broken(svc, conn, job_id, result):
        if job_id == job["id"]:
            raise RuntimeError("the leader's store broke")
        return real(svc, conn, job_id, result)

    monkeypatch.setattr(job_queue, "mark_done", broken)
    expect_error(api.post(f"/v1/jobs/{job['id']}/complete",
                          json={"text": Answers()(as_body(job["request"])), "attempt": job["attempt"]}),
                 500, "internal_error")
    rows = {r["id"]: r for r in model_jobs(services)}
    assert rows[job["id"]]["state"] == "pending"
    assert "the leader's store broke" in rows[job["id"]]["error"]
    assert all(r["state"] == "done" for i, r in rows.items() if i != job["id"])


def test_mj2_an_answer_is_capped_by_what_it_reads(api, services, fake):
    """rule MJ2: a shared call asks for at most `llm_answer_base_tokens` per section plus
    `llm_answer_tokens_per_message_token` per token shown, not the sum of every task's longest
    answer, so a model that loops stops early; the answer is still used."""
    pier(api)
    drain(services)
    body = fake.completions()[0]
    settings = services.settings
    sections = len(SESSION_END)
    shown = services.tokens.count("\n".join(text for _, _, text in PIER))
    assert body["max_tokens"] <= sections * settings.llm_answer_base_tokens + \
        int(shown * settings.llm_answer_tokens_per_message_token) + 10
    assert all(r["state"] == "done" for r in model_jobs(services))
    assert all(v["model"]["answer"] == "first_try" for v in results(services).values())


@pytest.mark.parametrize("overrides", [{**QUIET, "llm_answer_base_tokens": 0}], indirect=True)
def test_mj2_the_answer_cap_can_be_turned_off(api, services, fake):
    """rule MJ2: with `llm_answer_base_tokens` 0 each task's own cap is sent (their sum)."""
    pier(api)
    drain(services)
    body = fake.completions()[0]
    assert body["max_tokens"] > len(SESSION_END) * 300


def arrays(schema) -> list[dict]:
    """Every array schema inside a JSON Schema."""
    found = []
    if isinstance(schema, dict):
        if schema.get("type") == "array":
            found.append(schema)
        for value in schema.values():
            found += arrays(value)
    elif isinstance(schema, list):
        for value in schema:
            found += arrays(value)
    return found


@pytest.mark.parametrize("overrides", [{"llm_json_mode": "json_schema", "llm_answer_max_items": 3}], indirect=True)
def test_mj2_every_list_of_a_schema_held_answer_is_bounded(api, services, fake):
    """rule MJ2: in json_schema mode every list of the answer's schema sent to the model is
    bounded by `llm_answer_max_items` (a model held to it that repeats an item ends the list),
    and the answer is still used."""
    pier(api)
    drain(services)
    sent = fake.completions()[0]["response_format"]["json_schema"]["schema"]
    lists = arrays(sent)
    assert len(lists) >= 5 and all(1 <= a["maxItems"] <= 3 for a in lists)
    assert all(v["model"]["answer"] == "first_try" for v in results(services).values())


@pytest.mark.parametrize("overrides", [{"llm_json_mode": "json_schema", "llm_answer_max_items": 0}], indirect=True)
def test_mj2_the_list_bound_can_be_turned_off(api, services, fake):
    """rule MJ2: `llm_answer_max_items` 0 sends each task's schema as it is."""
    pier(api)
    drain(services)
    sent = fake.completions()[0]["response_format"]["json_schema"]["schema"]
    assert arrays(sent) and not any("maxItems" in a for a in arrays(sent))
