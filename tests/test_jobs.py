"""The job queue: retries with backoff, Retry-After, timeouts, leases and reclaim, restart with
pending jobs, the worker thread, and the three LLM modes — openai (against tests/helpers/fakellm.py over
HTTP), client (claim/complete by the extension), extractive (no model). Rules RV3, RV13, RV15, SW2."""

from __future__ import annotations

import json
import time

import pytest

from server_plugin.app import build_services, create_app
from server_plugin.clock import parse_iso
from server_plugin.jobs import queue as jobs
from server_plugin.jobs import worker
from tests.helpers.api import Api, expect_error, expect_ok
from tests.helpers.conversation import CHAT, drain, job_rows, post, setup_chat, summaries, turn_messages, turns
from tests.helpers.fakellm import FakeLLM

# Parts off (MJ1): these tests run one chunk summary job at a time.
SMALL = {"live_window_max_messages": 4, "summary_chunk_messages": 2,
         "deep_memory_min_new_messages": 10_000, "part_tokens": 0}

CHUNK_ANSWER = {"summary": "Kai and Ayla searched the harbour for the lanterns.", "quotes": []}
MERGE_ANSWER = {"summary": "The lantern hunt went on for days.", "keep_quotes": []}
SESSION_ANSWER = {"full": "Kai and Ayla found the lantern keeper's boat.", "short": "They found the boat.",
                  "quotes": [], "open_threads": [{"text": "Who lit lantern 3?", "priority": 4}], "resolved": []}


def answer_for(body: dict) -> str:
    """A valid answer for each task, told apart by its system prompt."""
    system = body["messages"][0]["content"]
    if "summarise a stretch" in system:
        return json.dumps(CHUNK_ANSWER)
    if "merge consecutive summaries" in system:
        return json.dumps(MERGE_ANSWER)
    if "finished session" in system:
        return json.dumps(SESSION_ANSWER)
    return json.dumps({"memories": []})


@pytest.fixture
def fake():
    server = FakeLLM().start()
    server.responder = answer_for
    yield server
    server.stop()


@pytest.fixture
def overrides(request, fake):
    mode = getattr(request, "param", "openai")
    values = dict(SMALL, llm_mode=mode)
    if mode == "openai":
        values.update(llm_url=fake.url, llm_model="fake-model", llm_retries=0, llm_read_timeout=0.5)
    return values


def chunk_job(services):
    return jobs.get(services, job_rows(services, kind="chunk_summary")[0]["id"])


def seconds_until(services, row) -> float:
    return (parse_iso(row["not_before"]) - services.clock.now()).total_seconds()


def compacted(api):
    """A chat with one chunk left out of the window (its job queued)."""
    setup_chat(api)
    turns(api, 0, 3)


# --- openai mode ---------------------------------------------------------------------------
def test_openai_mode_runs_jobs_through_the_endpoint(api, services, fake):
    """LLM mode openai: the worker calls the OpenAI-compatible endpoint; a reply never waits for it
    (the POST only queued the job: nothing reached the model until the job ran)."""
    compacted(api)
    assert fake.completions() == [] and chunk_job(services)["state"] == "pending"
    assert worker.run_one(services) is not None
    sent = fake.completions()
    assert len(sent) == 1 and "lantern number 0" in sent[0]["messages"][1]["content"]
    assert summaries(api)["recent"][0]["text"] == CHUNK_ANSWER["summary"]
    assert chunk_job(services)["state"] == "done"


def test_retry_with_exponential_backoff(api, services, fake):
    """A failed call (HTTP 500) goes back to the queue after job_backoff_base_seconds, doubled
    for each further attempt; it is not run before then."""
    compacted(api)
    fake.fail_next(2, 500)
    worker.run_one(services)
    row = chunk_job(services)
    assert (row["state"], row["attempts"]) == ("pending", 1) and "500" in row["error"]
    assert seconds_until(services, row) == pytest.approx(10, abs=0.05)
    assert worker.run_pending(services) == 0  # not due yet
    services.clock.advance(seconds=10)
    worker.run_one(services)
    row = chunk_job(services)
    assert row["attempts"] == 2 and seconds_until(services, row) == pytest.approx(20, abs=0.05)
    services.clock.advance(seconds=20)
    worker.run_pending(services)
    assert chunk_job(services)["state"] == "done"


def test_retry_after_is_honoured(api, services, fake):
    """A 429 with Retry-After: the job waits exactly what the server asked."""
    compacted(api)
    fake.fail_next(1, 429, retry_after=42)
    worker.run_one(services)
    assert seconds_until(services, chunk_job(services)) == pytest.approx(42, abs=0.05)


def test_rejected_request_fails_at_once_and_can_be_retried(api, services, fake):
    """A 401 cannot succeed by retrying: the job fails with a clear error; a person may retry it."""
    compacted(api)
    fake.fail_next(1, 401)
    worker.run_one(services)
    row = chunk_job(services)
    assert row["state"] == "failed" and "401" in row["error"] and "llm_key" in row["error"]
    listed = expect_ok(api.get("/v1/jobs?state=failed"), 200, "jobs.response")
    assert [j["id"] for j in listed["jobs"]] == [row["id"]] and listed["counts"]["failed"] == 1
    retried = expect_ok(api.post(f"/v1/jobs/{row['id']}/retry", json={}), 200, "job.response")["job"]
    assert (retried["state"], retried["attempts"], retried["error"]) == ("pending", 0, None)
    worker.run_pending(services)
    assert chunk_job(services)["state"] == "done"
    expect_error(api.post(f"/v1/jobs/{row['id']}/retry", json={}), 409, "job_not_failed")


@pytest.fixture
def few_attempts(overrides):
    overrides["job_max_attempts"] = 2
    return overrides


def test_garbage_twice_falls_back_with_a_plain_error(few_attempts, api, services, fake):
    """rule MJ1: an unusable answer gets one retry that tells the model what was wrong; a second
    unusable one ends the job with the extractive result, and its error says what the model did.
    The model was asked exactly twice."""
    compacted(api)
    fake.garbage_next(2)
    worker.run_one(services)
    row = chunk_job(services)
    assert row["state"] == "done" and len(fake.completions()) == 2
    model = row["result"]["model"]
    assert model["answer"] == "fallback" and "could not be used after two tries" in model["error"]
    assert "beyond repair" in model["error"]
    retry = fake.completions()[1]["messages"]
    assert retry[-1]["role"] == "user" and "could not be used" in retry[-1]["content"]
    assert summaries(api)["recent"][0]["text"]  # the extractive summary was stored


def test_garbage_then_a_good_answer_is_used(api, services, fake):
    """The retry's answer is used, and the job says it took a retry."""
    compacted(api)
    fake.garbage_next(1)
    worker.run_one(services)
    row = chunk_job(services)
    assert row["result"]["model"]["answer"] == "retry"
    assert summaries(api)["recent"][0]["text"] == CHUNK_ANSWER["summary"]


def test_a_timeout_counts_as_a_try(api, services, fake):
    """A model that does not start answering within llm_read_timeout: tried twice in all, then
    the fallback, so a one-slot server never gets the same prompt a third time."""
    compacted(api)
    fake.delay = 1.0
    worker.run_pending(services)
    fake.delay = 0
    row = chunk_job(services)
    assert len(fake.completions()) == 2 and row["state"] == "done"
    assert row["result"]["model"]["answer"] == "fallback"
    assert "did not start answering within 0.5 s" in row["result"]["model"]["error"]


def test_a_slow_streamed_answer_is_not_timed_out(api, services, fake):
    """Answers are streamed: the read timeout (0.5 s here) counts silence, not length; an answer
    written over about 3 s is used."""
    compacted(api)
    fake.chunk_delay = 0.2
    worker.run_one(services)
    row = chunk_job(services)
    assert row["result"]["model"]["answer"] == "first_try" and len(fake.completions()) == 1
    assert fake.completions()[0]["stream"] is True
    assert summaries(api)["recent"][0]["text"] == CHUNK_ANSWER["summary"]


def test_a_stuck_model_is_stopped_and_retried_with_a_penalty(api, services, fake):
    """rule MJ2: a streamed answer that repeats one sentence is stopped after it has said it
    `llm_stop_repeats` times in a row, not read to its cap; the retry asks for a
    frequency_penalty and its answer is used."""
    compacted(api)
    loop = json.dumps({"summary": "Kai asks Tomas what he told them at the ferry. " * 400, "quotes": []})
    fake.script([loop, json.dumps(CHUNK_ANSWER)])
    worker.run_one(services)
    row = chunk_job(services)
    model = row["result"]["model"]
    assert model["answer"] == "retry" and "repeated the same words 3 times" in model["changed"][0]
    first, second = fake.completions()
    assert "frequency_penalty" not in first and second["frequency_penalty"] == 0.5
    stored = services.db.reader().execute("SELECT completion_tokens FROM jobs WHERE id=?", (row["id"],)).fetchone()
    assert stored[0] < services.tokens.count(loop) / 10  # stopped early, not read to the end
    assert summaries(api)["recent"][0]["text"] == CHUNK_ANSWER["summary"]


def test_a_sentence_said_twice_is_not_taken_for_a_stuck_model(api, services, fake):
    """rule MJ2: a repetition below `llm_stop_repeats` (here twice) is read as it is."""
    compacted(api)
    twice = {"summary": "Kai asks Tomas what he told them at the ferry. " * 2 + "Then they left.", "quotes": []}
    fake.script([json.dumps(twice)])
    worker.run_one(services)
    assert chunk_job(services)["result"]["model"]["answer"] == "first_try"
    assert summaries(api)["recent"][0]["text"] == twice["summary"].strip()


def test_every_model_job_records_its_cost(api, services, fake):
    """rule MJ1: prompt and completion tokens (our count when the API gives no usage) and time."""
    compacted(api)
    worker.run_pending(services)
    row = services.db.reader().execute("SELECT * FROM jobs WHERE kind='chunk_summary'").fetchone()
    assert row["model_calls"] == 1 and row["prompt_tokens"] > 100 and row["completion_tokens"] > 5
    stats = expect_ok(api.get(f"/v1/jobs/stats?chat_id={CHAT}"), 200, "jobs_stats.response")
    kind = stats["by_kind"]["chunk_summary"]
    assert kind["prompt_tokens"] == row["prompt_tokens"] and kind["first_try"] == 1
    assert stats["total"]["prompt_tokens"] >= row["prompt_tokens"] and stats["today"] == stats["total"]
    assert stats["waiting"] is None


def test_lease_expiry_reclaims_a_job_and_discards_the_late_result(api, services, fake):
    """A job claimed and not finished before its lease ends returns to the queue; the lost
    worker's late result is then not applied (the job is someone else's attempt)."""
    compacted(api)
    with services.db.write() as conn:  # a worker claims it, then hangs (or dies)
        lost = jobs.claim_next(services, conn, "worker", ["chunk_summary"])
    assert chunk_job(services)["state"] == "running"
    assert worker.run_pending(services) == 0  # leased: nobody else takes it
    services.clock.advance(seconds=services.settings.job_lease_seconds + 1)
    assert worker.run_one(services) == lost.id  # reclaimed and run again
    row = chunk_job(services)
    assert (row["state"], row["attempts"]) == ("done", 2)
    from server_plugin.jobs.tasks.summaries import Summary
    late = Summary("A stale result from the lost worker.", (), ("u0", "a0"))
    assert worker._finish(services, lost, services.jobs.handler("chunk_summary"), late) is False
    assert summaries(api)["recent"][0]["text"] == CHUNK_ANSWER["summary"]


# --- restart -------------------------------------------------------------------------------
@pytest.mark.parametrize("overrides", ["extractive"], indirect=True)
def test_jobs_survive_a_restart(api, services, settings, embedder, clock):
    """Jobs are rows: a new sidecar on the same data folder finds them; one left running by the
    stopped sidecar goes back to the queue, and all of them run."""
    setup_chat(api)
    turns(api, 0, 5)
    with services.db.write() as conn:
        jobs.claim_next(services, conn, "worker", ["chunk_summary"])  # running when the sidecar stops
    states = sorted(r["state"] for r in job_rows(services))
    assert states == ["pending", "pending", "running"]
    services.db.close()
    again = build_services(settings, embedder=embedder, clock=clock)
    try:
        create_app(settings, services=again)  # startup: recover
        assert sorted(r["state"] for r in job_rows(again)) == ["pending"] * 3
        assert worker.run_pending(again) == 3
        assert {r["state"] for r in job_rows(again)} == {"done"}
        assert len(Api(create_app(settings, services=again).test_client())
                   .get("/v1/chats/c1/summaries").get_json()["recent"]) == 3
    finally:
        again.db.close()


# --- the worker thread ---------------------------------------------------------------------
@pytest.mark.parametrize("overrides", ["extractive"], indirect=True)
def test_worker_thread_drains_the_queue(settings, embedder, clock, overrides):
    """With worker_enabled, create_app starts a thread that wakes on enqueue and runs the jobs."""
    from server_plugin.settings import load_settings

    live = load_settings({**{k: getattr(settings, k) for k in ("data_dir", "token")},
                          "sqlite_synchronous": "NORMAL", "worker_enabled": True,
                          "worker_poll_seconds": 30.0, **overrides}, environ={})
    svc = build_services(live, embedder=embedder, clock=clock)
    app = create_app(live, services=svc)
    worker = app.extensions["chronicler_worker"]
    try:
        api = Api(app.test_client())
        setup_chat(api)
        turns(api, 0, 6)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and jobs.counts(svc)["done"] < 5:
            time.sleep(0.05)  # woken by enqueue, not by the 30 s poll
        assert jobs.counts(svc) == {"pending": 0, "running": 0, "done": 5, "failed": 0}
        assert len(api.get("/v1/chats/c1/summaries").get_json()["consolidated"]) == 1
    finally:
        worker.stop()
        svc.db.close()
    assert not worker.alive


# --- client mode ---------------------------------------------------------------------------
@pytest.mark.parametrize("overrides", ["client"], indirect=True)
def test_client_mode_claim_and_complete(api, services):
    """LLM mode client: the worker runs no LLM job; the extension claims one with generateRaw's
    arguments, runs it, posts the text back; it is parsed strictly and applied."""
    compacted(api)
    assert worker.run_pending(services) == 0
    claimed = expect_ok(api.post("/v1/jobs/claim", json={}), 200, "job_claim.response")
    job = claimed["job"]
    assert claimed["mode"] == "client" and job["kind"] == "chunk_summary" and job["attempt"] == 1
    assert "lantern number 0" in job["request"]["prompt"] and job["request"]["responseLength"] > 0
    assert expect_ok(api.post("/v1/jobs/claim", json={}), 200)["job"] is None  # nothing else due
    done = expect_ok(api.post(f"/v1/jobs/{job['id']}/complete",
                              json={"text": json.dumps(CHUNK_ANSWER), "attempt": 1}), 200, "job.response")
    assert done["job"]["state"] == "done"
    assert summaries(api)["recent"][0]["text"] == CHUNK_ANSWER["summary"]
    expect_error(api.post(f"/v1/jobs/{job['id']}/complete", json={"text": "{}"}), 409, "job_not_running")


@pytest.mark.parametrize("overrides", ["client"], indirect=True)
def test_client_mode_malformed_answer_is_rejected_and_stores_nothing(api, services):
    compacted(api)
    job = api.post("/v1/jobs/claim", json={}).get_json()["job"]
    body = expect_error(api.post(f"/v1/jobs/{job['id']}/complete", json={"text": "Sure! Here is a summary."}),
                        422, "model_output_invalid")
    assert "chunk_summary" in body["error"]["message"]
    row = chunk_job(services)
    assert row["state"] == "pending" and row["attempts"] == 1 and "rejected" in row["error"]
    assert summaries(api)["recent"] == []


@pytest.mark.parametrize("overrides", ["client"], indirect=True)
def test_client_mode_lease_expiry_and_stale_completion(api, services):
    """A job the extension claimed and did not complete in time is claimed again; the first
    claimer's late answer is refused (409), the new one's applied."""
    compacted(api)
    first = api.post("/v1/jobs/claim", json={}).get_json()["job"]
    services.clock.advance(seconds=services.settings.job_client_lease_seconds + 1)
    second = api.post("/v1/jobs/claim", json={}).get_json()["job"]
    assert (second["id"], second["attempt"]) == (first["id"], 2)
    expect_error(api.post(f"/v1/jobs/{first['id']}/complete",
                          json={"text": json.dumps(CHUNK_ANSWER), "attempt": 1}), 409, "stale_attempt")
    expect_ok(api.post(f"/v1/jobs/{first['id']}/complete",
                       json={"text": json.dumps(CHUNK_ANSWER), "attempt": 2}), 200)


@pytest.mark.parametrize("overrides", ["client"], indirect=True)
def test_client_mode_reported_failure(api, services):
    compacted(api)
    job = api.post("/v1/jobs/claim", json={}).get_json()["job"]
    out = expect_ok(api.post(f"/v1/jobs/{job['id']}/fail", json={"error": "generateRaw timed out"}),
                    200, "job.response")["job"]
    assert out["state"] == "pending" and "generateRaw timed out" in out["error"]
    expect_error(api.post("/v1/jobs/j_missing/complete", json={"text": "{}"}), 404, "job_not_found")


# --- extractive mode -----------------------------------------------------------------------
@pytest.mark.parametrize("overrides", ["extractive"], indirect=True)
def test_extractive_mode_needs_no_model(api, services, fake):
    """LLM mode extractive (the default): summaries are built from the chunk's own sentences,
    quotes verbatim; nothing is sent anywhere; claim hands out nothing."""
    compacted(api)
    claimed = expect_ok(api.post("/v1/jobs/claim", json={}), 200, "job_claim.response")
    assert claimed == {"job": None, "mode": "extractive"}
    drain(services)
    summary = summaries(api)["recent"][0]
    assert "harbour" in summary["text"] and fake.completions() == []
    sources = {"u0": turn_messages(0)[0]["text"], "a0": turn_messages(0)[1]["text"]}
    assert summary["quotes"] and all(q["text"] in sources[q["message_id"]] for q in summary["quotes"])


def test_jobs_listing_filters(api, services):
    compacted(api)
    setup_chat(api, "c2")
    post(api, turn_messages(0), "c2")
    listed = expect_ok(api.get("/v1/jobs?chat_id=c1&state=pending"), 200, "jobs.response")
    assert [j["kind"] for j in listed["jobs"]] == ["chunk_summary"]
    assert listed["counts"] == {"pending": 1, "running": 0, "done": 0, "failed": 0}
    one = expect_ok(api.get(f"/v1/jobs/{listed['jobs'][0]['id']}"), 200, "job.response")
    assert one["job"]["ref"] == listed["jobs"][0]["ref"]
    expect_error(api.get("/v1/jobs?state=stuck"), 400, "invalid_request")


@pytest.mark.parametrize("overrides", ["extractive"], indirect=True)
def test_worker_is_woken_only_once_the_job_is_committed(services):
    """enqueue inside a write: the worker's wake-up comes after the commit (woken before, it would
    look, find nothing yet, and sleep a whole poll); a rolled-back enqueue wakes nobody."""
    services.jobs_wake.clear()
    with services.db.write():
        jobs.enqueue(services, "chunk_summary", chat_id="c1", ref="s_x", target={"summary_id": "s_x"})
        assert not services.jobs_wake.is_set()
    assert services.jobs_wake.is_set()
    services.jobs_wake.clear()
    with pytest.raises(RuntimeError):
        with services.db.write():
            jobs.enqueue(services, "chunk_summary", chat_id="c1", ref="s_y", target={"summary_id": "s_y"})
            raise RuntimeError("rolled back")
    assert not services.jobs_wake.is_set()
    assert [r["ref"] for r in job_rows(services)] == ["s_x"]
