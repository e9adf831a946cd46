"""Rule MJ1 with parts of the transcript: with a model, each message is read about once.

A message is due once it leaves the live window or its session ends; the due messages make the
chat's open part, read in one model call by every task that needs them (the chunk summary, deep
memory's facts, the characters' memories, scenes, told events, sheet updates, lore growth and the
summary of each session that ends in the part) once it holds `part_tokens` or has waited
`part_wait_seconds`. Each task's section goes through its own job's parse, checks and apply."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from server_plugin.core.tokens import get_counter
from server_plugin.settings import load_settings
from server_plugin.story import parts
from tests.helpers.api import expect_ok
from tests.helpers.conversation import drain, job_rows
from tests.helpers.episodes import SHARED, Answers, chat, end_session, episodes, line, post_lines, register_cast

KEEPER = "I left the harbour because of the lantern keeper."
PIER = [  # session 1
    ("u1", "kai.png", f'Kai sets the lantern down on the pier. "Ayla, {KEEPER}"'),
    ("a1", "ayla.png", '*Ayla stares at the dark water.* "You never told me that, Kai."'),
    ("u2", "kai.png", '"I promise I will tell you the rest tomorrow."'),
    ("a2", "ayla.png", '*She pulls her cloak tighter.* "Then I will wait for you at the chapel."'),
]
CHAPEL = [  # session 2, a day later
    ("u3", "kai.png", '"The chapel bell rang at dawn, Ayla."'),
    ("a3", "ayla.png", '*Ayla lights a candle.* "My birthday is on the first of May, remember it."'),
]
PART_KINDS = {"chunk_summary", "durable_memories", "session_summary", "character_memories",
              "scene_summaries", "sheet_updates", "lore_growth"}
WAIT = 600.0


@pytest.fixture
def overrides(fake, request):
    return {"llm_mode": "openai", "llm_url": fake.url, "llm_model": "fake-model", "llm_retries": 0,
            "llm_read_timeout": 5, "live_window_max_messages": 50, "part_wait_seconds": WAIT,
            **getattr(request, "param", {})}


def post(api, lines, start_minutes: float) -> None:
    post_lines(api, "c1", [line(i, who, text, start_minutes + n) for n, (i, who, text) in enumerate(lines)])


def two_sessions(api) -> None:
    """Session 1 on the pier, ended; session 2 at the chapel a day later, ended."""
    register_cast(api)
    chat(api, "c1", "ayla.png")
    post(api, PIER, 0)
    end_session(api, "c1")
    post(api, CHAPEL, 24 * 60)
    end_session(api, "c1")


def part_jobs(services) -> list:
    return [r for r in job_rows(services) if r["kind"] in PART_KINDS]


def results(services) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for r in part_jobs(services):
        out.setdefault(r["kind"], []).append(json.loads(r["result"]))
    return out


def memory(lb, quotes) -> dict:
    return {"memories": [{
        "character": lb.c("Ayla"), "summary": "Kai told me why he left the harbour.", "feeling": "hurt",
        "quotes": quotes, "participants": [lb.c("Ayla"), lb.c("Kai")], "importance": 4,
        "messages": [lb.m("lantern keeper")]}]}


def test_mj1_a_part_waits_to_grow_and_is_read_after_the_wait(api, services, fake):
    """rule MJ1: a part smaller than part_tokens is not read at its session end; the worker's
    close_part job reads it once it has waited part_wait_seconds (the injectable clock), in one call."""
    register_cast(api)
    chat(api, "c1", "ayla.png")
    post(api, PIER, 0)
    end_session(api, "c1")
    drain(services)
    assert fake.completions() == []
    [waiting] = job_rows(services, kind=parts.KIND)
    assert waiting["state"] == "pending"
    services.clock.advance(seconds=WAIT - 5)
    drain(services)
    assert fake.completions() == []
    services.clock.advance(seconds=10)
    drain(services)
    assert len(fake.completions()) == 1
    assert {r["kind"] for r in part_jobs(services)} == PART_KINDS
    assert all(r["state"] == "done" for r in part_jobs(services))
    sessions = expect_ok(api.get("/v1/chats/c1/sessions"), 200)["sessions"]
    assert [s["state"] for s in sessions] == ["summarized"]


def test_mj1_sw2_a_session_ended_by_a_gap_is_read_without_the_open_sessions_live_messages(api, services, fake):
    """A message after session_gap_hours ends session 1: its messages are due, the new session's
    live ones are not; after the wait one call reads session 1 alone and summarises it."""
    register_cast(api)
    chat(api, "c1", "ayla.png")
    post(api, PIER, 0)
    post(api, CHAPEL, 24 * 60)  # a day later: the gap ends session 1
    services.clock.advance(seconds=WAIT + 1)
    drain(services)
    [body] = fake.completions()
    assert KEEPER in body["messages"][1]["content"] and "chapel bell" not in body["messages"][1]["content"]
    sessions = expect_ok(api.get("/v1/chats/c1/sessions"), 200)["sessions"]
    assert [(s["n"], s["state"]) for s in sessions] == [(1, "summarized"), (2, "open")]


def test_mj1_sw2_a_part_spans_a_session_end_and_both_sessions_are_summarised(api, services, fake):
    """rule SW2 with parts: one call reads both sessions (each message once); each session's
    summary is its own section, told which messages are its own, and both sessions get theirs."""
    two_sessions(api)
    services.clock.advance(seconds=WAIT + 1)
    drain(services)
    [body] = fake.completions()
    system, user = (m["content"] for m in body["messages"])
    assert SHARED in system
    for _, _, text in PIER + CHAPEL:  # every message shown once
        assert user.count(text.split('"')[1] if '"' in text else text) == 1
    assert "Its messages: m1-m4" in user and "Its messages: m5-m6" in user
    assert system.count("finished session") == 1  # the two sessions' rules are said once
    sessions = expect_ok(api.get("/v1/chats/c1/sessions"), 200)["sessions"]
    assert [(s["n"], s["state"]) for s in sessions] == [(1, "summarized"), (2, "summarized")]
    assert all(s["short"] for s in sessions)
    covers = [json.loads(r["covers"]) for r in services.db.reader().execute(
        "SELECT covers FROM summaries WHERE chat_id='c1' AND tier='recent'")]
    assert covers == [["u1", "a1", "u2", "a2", "u3", "a3"]]  # one recent summary for the part (RV3)


def test_mj1_sw8_every_section_of_a_part_is_stored_through_its_own_checks(api, services, fake):
    """rules MJ1, SW8, MJ2: each section of one part call goes through its own job's checks. In
    the memories section a made-up quote and a quote put in the wrong mouth are dropped and
    counted (the true one kept); the chunk summary's made-up quote is dropped too; the facts
    section files its fact with its witnesses; the two sessions' summaries are stored."""
    answers: Answers = fake.responder
    answers.builders["character_memories"] = lambda lb: memory(lb, [
        {"speaker": "Kai", "text": KEEPER, "message": lb.m("lantern keeper")},
        {"speaker": "Kai", "text": "I never loved the sea.", "message": lb.m("lantern keeper")},
        {"speaker": "Ayla", "text": "I promise I will tell you the rest tomorrow.", "message": lb.m("I promise")}])
    answers.builders["chunk_summary"] = lambda lb: {
        "summary": "Kai told Ayla about the lantern keeper; a day later she named her birthday.",
        "quotes": [{"speaker": "Ayla", "text": "I hate the chapel.", "message": lb.m("chapel bell")}]}
    answers.builders["durable_memories"] = lambda lb: {"memories": [{
        "character": lb.c("Ayla"), "scope": "character", "kind": "birthday",
        "text": "Ayla's birthday is on the first of May.", "messages": [lb.m("first of May")]}]}
    two_sessions(api)
    services.clock.advance(seconds=WAIT + 1)
    drain(services)
    # One call reads the part. (The fact it files is one Kai did not witness, a secret: the told
    # events' job, built before it existed, then looks for its telling in a call of its own.)
    assert sum(SHARED in b["messages"][0]["content"] for b in fake.completions()) == 1
    got = results(services)
    [kept] = episodes(api, kind="character_memory")
    assert kept["quotes"] == [{"speaker": "Kai", "text": KEEPER, "message_id": "u1"}]
    assert got["character_memories"][0]["dropped_quote_reasons"] == {"not_verbatim": 1, "wrong_speaker": 1}
    assert "never loved the sea" not in json.dumps(episodes(api))
    [summary] = expect_ok(api.get("/v1/chats/c1/summaries"), 200)["recent"]
    assert summary["text"].startswith("Kai told Ayla") and summary["quotes"] == []
    assert got["chunk_summary"][0]["dropped_quotes"] == 1
    assert got["chunk_summary"][0]["dropped_quote_reasons"] == {"not_verbatim": 1}  # why, as for memories
    [fact] = got["durable_memories"][0]["memories"]
    row = services.db.reader().execute("SELECT text, known_by FROM memories WHERE id=?", (fact,)).fetchone()
    assert row["text"] == "Ayla's birthday is on the first of May." and "ayla.png" in row["known_by"]
    assert len(got["session_summary"]) == 2 and all(r["model"]["answer"] == "first_try"
                                                    for rs in got.values() for r in rs)


SIZE = sum(get_counter().count(text) for _, _, text in PIER) + 2  # session 1 and a little more


@pytest.mark.parametrize("overrides", [{"part_tokens": SIZE}], indirect=True)
def test_mj1_part_tokens_close_a_part_without_waiting(api, services, fake):
    """The token-size setting closes a part: due messages past part_tokens are read at once in
    parts within that size (cut at a session end when one is inside), the rest waits; every
    message is read exactly once, and no part is larger than part_tokens."""
    size = SIZE
    two_sessions(api)
    drain(services)
    first = fake.completions()
    assert len(first) == 1  # session 1's messages, cut at its end; session 2's wait
    assert "Its messages: m1-m4" in first[0]["messages"][1]["content"]
    services.clock.advance(seconds=WAIT + 1)
    drain(services)
    bodies = fake.completions()
    assert len(bodies) == 2
    for _, _, text in PIER + CHAPEL:
        words = text.split('"')[1] if '"' in text else text
        assert sum(b["messages"][1]["content"].count(words) for b in bodies) == 1, words
    covers = [json.loads(r["covers"]) for r in services.db.reader().execute(
        "SELECT covers FROM summaries WHERE chat_id='c1' AND tier='recent' ORDER BY pos_seq")]
    assert covers == [["u1", "a1", "u2", "a2"], ["u3", "a3"]]
    rows = services.db.reader().execute("SELECT id, tokens FROM messages WHERE chat_id='c1'").fetchall()
    tokens = {r["id"]: r["tokens"] for r in rows}
    assert all(sum(tokens[m] for m in c) <= size for c in covers)


def test_mj1_a_part_is_bounded_by_the_models_context(tmp_path):
    """part_tokens never exceeds the model's context less the room kept for instructions and answer."""
    def size(**values) -> int:
        return parts.size(SimpleNamespace(settings=load_settings(
            {"data_dir": str(tmp_path), "part_tokens": 8000, "part_reserve_tokens": 6000, **values}, environ={})))
    assert size(llm_context_tokens=16384) == 8000
    assert size(llm_context_tokens=12000) == 12000 - 6000
    assert size(llm_context_tokens=8192) == 8192 // 2  # the reserve takes at most half the context
    assert size(llm_context_tokens=4096) == 2048


@pytest.mark.parametrize("overrides", [{"llm_context_tokens": 4000, "part_tokens": 50}], indirect=True)
def test_mj1_mj2_a_part_call_never_asks_more_than_the_models_context(api, services, fake):
    """rules MJ1, MJ2: small parts in a small model context, and no call asks for a longer answer
    than the context leaves after its prompt."""
    two_sessions(api)
    services.clock.advance(seconds=WAIT + 1)
    drain(services)
    bodies = fake.completions()
    assert len(bodies) >= 2  # 50 tokens a part: the six messages do not fit one
    counter = get_counter()
    asked = [body["max_tokens"] + sum(counter.count(m["content"]) for m in body["messages"]) for body in bodies]
    assert all(n <= 4000 for n in asked), asked
    assert 4000 in asked  # the context was the bound
    sessions = expect_ok(api.get("/v1/chats/c1/sessions"), 200)["sessions"]
    assert [s["state"] for s in sessions] == ["summarized", "summarized"]


def test_mj1_rebuilt_summaries_read_a_part_again_for_its_summary_only(api, services, fake):
    """RV3 with parts: rebuilding the summaries reads each part again for its summary alone; the
    memories, facts, scenes and session summaries it filed are not filed twice."""
    two_sessions(api)
    services.clock.advance(seconds=WAIT + 1)
    drain(services)
    before = len(part_jobs(services))
    expect_ok(api.post("/v1/chats/c1/summaries/rebuild", json={}), 200)
    services.clock.advance(seconds=WAIT + 1)
    drain(services)
    again = part_jobs(services)[before:]
    assert [r["kind"] for r in again] == ["chunk_summary"] and again[0]["state"] == "done"
    [summary] = expect_ok(api.get("/v1/chats/c1/summaries"), 200)["recent"]
    assert summary["covers"] == ["u1", "a1", "u2", "a2", "u3", "a3"]


def test_mj1_cut_prefers_the_last_session_end_inside_the_part():
    rows = [{"tokens": 10, "session_n": n} for n in (1, 1, 2, 2, 2, 3)]
    assert parts.cut(rows, 45, 1500) == 2  # four fit; session 1 ends after the second
    assert parts.cut(rows, 25, 1500) == 2
    assert parts.cut(rows[2:], 25, 1500) == 2  # no session end inside: as many as fit
    assert parts.cut(rows, 100, 1500) == 0  # all fit: the part may still grow


def test_mj1_cost_of_a_part_call_is_counted_once_and_shared(api, services, fake):
    """One call's cost: counted once (model_calls on the leader), each job's share of the prompt
    tokens by the size of its own prompt, the shares adding up to the call."""
    two_sessions(api)
    services.clock.advance(seconds=WAIT + 1)
    drain(services)
    rows = part_jobs(services)
    assert sum(r["model_calls"] for r in rows) == 1
    assert all(r["prompt_tokens"] > 0 for r in rows)
    stats = api.get("/v1/jobs/stats?chat_id=c1").get_json()
    assert stats["total"]["calls"] == 1
    assert stats["total"]["prompt_tokens"] == sum(r["prompt_tokens"] for r in rows)
    ids = sorted(r["id"] for r in rows)
    assert all(sorted(json.loads(r["result"])["model"]["shared_call"]) == ids for r in rows)


def as_body(request: dict) -> dict:
    return {"messages": [{"role": "system", "content": request["systemPrompt"]},
                         {"role": "user", "content": request["prompt"]}]}


@pytest.mark.parametrize("overrides", [{"llm_mode": "client"}], indirect=True)
def test_mj1_client_mode_is_given_the_part_prompt_and_its_answer_is_split(api, services):
    """Client mode: the extension claims the part's shared prompt under the leading job's id (every
    job of the part claimed with it); one answer completes each job through its own checks."""
    answers = Answers()
    answers.builders["character_memories"] = lambda lb: memory(
        lb, [{"speaker": "Kai", "text": KEEPER, "message": lb.m("lantern keeper")},
             {"speaker": "Kai", "text": "I never loved the sea.", "message": lb.m("lantern keeper")}])
    two_sessions(api)
    services.clock.advance(seconds=WAIT + 1)
    drain(services)  # the close_part job is local work: the worker runs it in every mode
    job = expect_ok(api.post("/v1/jobs/claim", json={}), 200, "job_claim.response")["job"]
    assert job["task"] == "part_notes" and job["shared_with"][0] == job["id"]
    rows = part_jobs(services)
    assert {r["kind"] for r in rows} == PART_KINDS
    assert sorted(job["shared_with"]) == sorted(r["id"] for r in rows)
    assert all(r["state"] == "running" and r["claimed_by"] == "client" for r in rows)
    text = answers(as_body(job["request"]))
    expect_ok(api.post(f"/v1/jobs/{job['id']}/complete", json={"text": text, "attempt": job["attempt"]}),
              200, "job.response")
    assert all(r["state"] == "done" for r in part_jobs(services))
    [kept] = episodes(api, kind="character_memory")
    assert kept["quotes"] == [{"speaker": "Kai", "text": KEEPER, "message_id": "u1"}]
    sessions = expect_ok(api.get("/v1/chats/c1/sessions"), 200)["sessions"]
    assert [s["state"] for s in sessions] == ["summarized", "summarized"]
    assert expect_ok(api.post("/v1/jobs/claim", json={}), 200, "job_claim.response")["job"] is None


def test_mj1_dc6_the_models_context_and_the_part_size_change_at_run_time(api, services):
    """A person with a smaller local model sets its context from the drawer: the next part is
    sized to it at once, and a value under the minimum is refused with nothing changed."""
    assert parts.size(services) == 8000  # the defaults: a 32k model
    body = expect_ok(api.patch("/v1/settings", json={"llm_context_tokens": 8192, "part_wait_seconds": 30}),
                     200, "settings.response")
    assert body["settings"]["llm_context_tokens"] == 8192 and body["settings"]["part_wait_seconds"] == 30
    assert parts.size(services) == 4096
    refused = api.patch("/v1/settings", json={"llm_context_tokens": 512, "part_tokens": 2000})
    assert refused.status_code == 400
    assert refused.get_json()["error"]["details"][0]["field"] == "llm_context_tokens"
    assert (services.settings.llm_context_tokens, services.settings.part_tokens) == (8192, 8000)
