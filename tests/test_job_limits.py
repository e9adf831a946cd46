"""What model work may cost and how much of it runs at once (rule MJ1): the concurrency cap holds
with two claiming clients, the daily token cap and the pause switch stop model jobs and say so,
and a minimum gap separates model calls. Client mode: the extension claims the jobs over HTTP."""

from __future__ import annotations

import json
import threading

import pytest

from server_plugin.jobs import queue
from tests.helpers.api import Api, expect_ok
from tests.helpers.conversation import CHAT, setup_chat, turns

SMALL = {"live_window_max_messages": 4, "summary_chunk_messages": 2,
         "deep_memory_min_new_messages": 10_000, "llm_mode": "client", "part_tokens": 0}
CHUNK = json.dumps({"summary": "Kai and Ayla searched the harbour.", "quotes": []})


@pytest.fixture
def overrides(request):
    return {**SMALL, **getattr(request, "param", {})}


def queued(api, n_turns: int = 10) -> None:
    setup_chat(api)
    turns(api, 0, n_turns)


def claim(api) -> dict | None:
    return expect_ok(api.post("/v1/jobs/claim", json={}), 200, "job_claim.response")["job"]


def running(services) -> int:
    return queue.counts(services)["running"]


def test_the_concurrency_cap_holds_with_two_claiming_clients(app, api, services):
    """Two browser tabs claim at the same moment, many times: never more than llm_concurrency (1)
    model jobs run at once; finishing one lets the next be claimed."""
    queued(api)
    assert queue.counts(services)["pending"] >= 3
    tabs = [Api(app.test_client()), Api(app.test_client())]
    for _ in range(3):
        got: list = []
        start = threading.Barrier(2)

        def tab(client: Api) -> None:
            start.wait()
            got.append(claim(client))

        threads = [threading.Thread(target=tab, args=(t,)) for t in tabs]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        claimed = [j for j in got if j is not None]
        assert len(claimed) == 1 and running(services) == 1
        expect_ok(api.post(f"/v1/jobs/{claimed[0]['id']}/complete", json={"text": CHUNK}), 200, "job.response")
        assert running(services) == 0


@pytest.mark.parametrize("overrides", [{**SMALL, "llm_concurrency": 2}], indirect=True)
def test_a_higher_cap_lets_two_run(api, services):
    queued(api)
    assert claim(api) is not None and claim(api) is not None and claim(api) is None
    assert running(services) == 2


@pytest.mark.parametrize("overrides", [{**SMALL, "jobs_paused": True}], indirect=True)
def test_the_pause_switch_stops_model_jobs_and_says_so(api, services):
    queued(api)
    assert claim(api) is None and queue.counts(services)["pending"] >= 1
    stats = expect_ok(api.get(f"/v1/jobs/stats?chat_id={CHAT}"), 200, "jobs_stats.response")
    assert stats["paused"] is True and stats["waiting"].startswith("paused")


@pytest.mark.parametrize("overrides", [{**SMALL, "llm_daily_token_cap": 50}], indirect=True)
def test_the_daily_token_cap_makes_jobs_wait_until_tomorrow(api, services, clock):
    """A day's tokens used up: nothing more is claimed that day (the panel is told why); the
    next day the jobs go on. The job's tokens are counted by us (the extension gives no usage)."""
    queued(api)
    job = claim(api)
    expect_ok(api.post(f"/v1/jobs/{job['id']}/complete", json={"text": CHUNK}), 200, "job.response")
    stats = expect_ok(api.get("/v1/jobs/stats"), 200, "jobs_stats.response")
    assert stats["today"]["prompt_tokens"] > 50 and stats["today"]["completion_tokens"] > 0
    assert claim(api) is None
    assert "llm_daily_token_cap" in stats["waiting"]
    clock.advance(days=1)
    assert claim(api) is not None


@pytest.mark.parametrize("overrides", [{**SMALL, "llm_min_gap_seconds": 30}], indirect=True)
def test_a_minimum_gap_between_model_calls(api, services, clock):
    queued(api)
    job = claim(api)
    expect_ok(api.post(f"/v1/jobs/{job['id']}/complete", json={"text": CHUNK}), 200, "job.response")
    assert claim(api) is None
    clock.advance(seconds=31)
    assert claim(api) is not None


def test_a_second_unusable_client_answer_falls_back(api, services, clock):
    """Client mode too: the first unusable answer fails the attempt (422), the second ends the job
    with the result made from the text itself, and the job says so."""
    queued(api)
    job = claim(api)
    assert api.post(f"/v1/jobs/{job['id']}/complete", json={"text": "no json here"}).status_code == 422
    clock.advance(seconds=3600)
    again = claim(api)
    assert again["id"] == job["id"]
    done = expect_ok(api.post(f"/v1/jobs/{job['id']}/complete", json={"text": "still none"}), 200,
                     "job.response")["job"]
    assert done["state"] == "done" and done["result"]["model"]["answer"] == "fallback"
    assert "could not be used after two tries" in done["result"]["model"]["error"]
