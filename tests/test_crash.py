"""Crash safety (rule OP5): SIGKILL the sidecar process at random moments while clients write.

Every acknowledged write must survive with its acknowledged content; a write cut by the kill must be
there whole or not at all; the database must pass `PRAGMA integrity_check`, and no row may exist
without its vector or full-text entry (or the reverse). The long variant is `bench/crash.py`.
CRASH_KILLS (default 20) and CRASH_SEED make a run longer or repeatable.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from tests.helpers.client import q
from tests.helpers.crash import run_crash_cycles
from tests.helpers.fakellm import FakeLLM
from tests.helpers.ledger import copy_store, store_problems
from tests.helpers.process import SidecarProcess

KILLS = int(os.environ.get("CRASH_KILLS", "20"))
SEED = int(os.environ["CRASH_SEED"]) if os.environ.get("CRASH_SEED") else None


def test_rv1_rv4_rv6_rv10_acknowledged_writes_survive_sigkill(tmp_path: Path) -> None:
    """Rule OP5 ("nothing lost") over rules RV4 (memories by scope), RV6 (deleting a character moves
    its memories to global in the same transaction), RV10 (rollback by turn), RV11 (pins) and RV1
    (the transcript: message batches, edits, deletes, chat delete and rename):
    20 SIGKILLs at random moments, each followed by a restart and a full check."""
    report = run_crash_cycles(tmp_path, kills=KILLS, seed=SEED, log=print)
    print(f"crash: {report.kills} kills ({report.kills_while_loading} while the model loaded), "
          f"{sum(report.acked.values())} acknowledged writes {dict(report.acked)}, "
          f"{report.in_flight} cut in flight ({report.in_flight_applied} of them applied), "
          f"jobs {dict(report.jobs)}, "
          f"{report.seconds:.1f} s")
    assert report.kills == KILLS
    assert report.problems == []
    assert report.failures == []
    # The kills really land between writes of every kind, not on an idle server.
    for op in ("memory.create", "memory.edit", "memory.delete", "memory.pin", "character.put",
               "character.delete", "chat.put", "turn.rollback", "messages.upsert", "message.delete"):
        assert report.acked[op] > 0, (op, report.acked)
    assert report.in_flight >= KILLS // 2
    assert report.jobs["done"] > 0 and report.jobs["failed"] == 0, report.jobs


def _answer_for(body: dict) -> str:
    """A valid answer for each job kind, told apart by its system prompt (as in test_jobs.py)."""
    system = body["messages"][0]["content"]
    if "summarise a stretch" in system:
        return json.dumps({"summary": "Kai and Ayla searched the harbour for the lanterns.", "quotes": []})
    if "merge consecutive summaries" in system:
        return json.dumps({"summary": "The lantern hunt went on for days.", "keep_quotes": []})
    return json.dumps({"memories": []})


def _jobs(side: SidecarProcess) -> list[dict]:
    status, body = side.request("GET", "/v1/jobs")
    assert status == 200, body
    return body["jobs"]


def _wait(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def test_rv3_pending_jobs_resume_after_sigkill(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Rules OP5, RV3: summary jobs queued, and one running (its model call hanging), when
    the process is SIGKILLed are all run after the restart, each exactly once: every job is done,
    one recent summary per chunk, no chunk summarised twice, and the store passes every check."""
    fake = FakeLLM().start()
    fake.responder = _answer_for
    fake.delay = 60.0   # the first job's model call hangs until the kill
    for name, value in {"LLM_MODE": "openai", "LLM_URL": fake.url, "LLM_MODEL": "fake-model",
                        "LLM_RETRIES": "0", "LLM_READ_TIMEOUT": "120", "LIVE_WINDOW_MAX_MESSAGES": "4",
                        "SUMMARY_CHUNK_MESSAGES": "2", "DEEP_MEMORY_MIN_NEW_MESSAGES": "10000",
                        "PART_TOKENS": "0"}.items():  # one job per chunk (parts: test_parts.py)
        monkeypatch.setenv("CHRONICLER_" + name, value)
    side = SidecarProcess.create(tmp_path / "data")
    try:
        side.start()
        side.wait_ready()
        chat = "Lanterns - 2026-11-29@16h52m03s"
        assert side.request("PUT", "/v1/characters/ayla.png", {"name": "Ayla"})[0] == 201
        assert side.request("PUT", f"/v1/chats/{q(chat)}", {"member_ids": ["ayla.png"]})[0] == 201
        for n in range(8):
            status, body = side.request("POST", f"/v1/chats/{q(chat)}/messages", {"messages": [
                {"id": f"u{n}", "role": "user", "name": "Kai", "text": f"Kai asks about lantern {n}."},
                {"id": f"a{n}", "role": "assistant", "name": "Ayla", "text": f"Ayla saw lantern {n} by the water.",
                 "turn_id": f"t{n}", "speaker_id": "ayla.png"}]})
            assert status == 200, body
        running = _wait(lambda: [j for j in _jobs(side) if j["state"] == "running"], 60, "a running job")
        before = {j["id"]: j for j in _jobs(side)}
        assert len(before) >= 3 and all(j["state"] in ("pending", "running") for j in before.values()), before
        side.kill()
        fake.delay = 0.0
        assert store_problems(copy_store(side.db_path, tmp_path / "crashed")) == []
        side.start()
        after = _wait(lambda: (lambda js: js if all(j["state"] == "done" for j in js) else None)(_jobs(side)),
                      120, "every job done after the restart")
        assert {j["id"] for j in after} >= set(before)
        assert next(j for j in after if j["id"] == running[0]["id"])["attempts"] == 1  # the cut try not counted
        status, summaries = side.request("GET", f"/v1/chats/{q(chat)}/summaries")
        assert status == 200
        chunks = [j for j in after if j["kind"] == "chunk_summary"]
        covered = [m for s in summaries["recent"] for m in s["covers"]]
        consolidated = [c for s in summaries["consolidated"] for c in s["covers"]]
        print(f"jobs before kill {len(before)} ({len(running)} running), after {len(after)}: "
              f"{[(j['kind'], j['attempts']) for j in after]}; recent {len(summaries['recent'])}, "
              f"consolidated {len(summaries['consolidated'])} covering {consolidated}")
        assert len(summaries["recent"]) + len(consolidated) == len(chunks)   # one summary per chunk
        assert len(covered) == len(set(covered))                             # no chunk twice
        side.stop()
        assert store_problems(copy_store(side.db_path, tmp_path / "final")) == []
    finally:
        side.kill()
        fake.stop()
