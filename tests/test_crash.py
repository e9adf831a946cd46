"""Crash safety (issue 8): SIGKILL the sidecar process at random moments while clients write.

Every acknowledged write must survive with its acknowledged content; a write cut by the kill must be
there whole or not at all; the database must pass `PRAGMA integrity_check`, and no row may exist
without its vector or full-text entry (or the reverse). The long variant is `bench/crash.py`.
CRASH_KILLS (default 20) and CRASH_SEED make a run longer or repeatable.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.harness.crash import run_crash_cycles

KILLS = int(os.environ.get("CRASH_KILLS", "20"))
SEED = int(os.environ["CRASH_SEED"]) if os.environ.get("CRASH_SEED") else None


def test_rv1_rv4_rv6_rv10_acknowledged_writes_survive_sigkill(tmp_path: Path) -> None:
    """Issue 8 "nothing lost" over rules RV4 (memories by scope), RV6 (deleting a character moves
    its memories to global in the same transaction), RV10 (rollback by turn), RV11 (pins) and RV1
    (the transcript: message batches, edits, deletes, chat delete and rename):
    20 SIGKILLs at random moments, each followed by a restart and a full check."""
    report = run_crash_cycles(tmp_path, kills=KILLS, seed=SEED, log=print)
    print(f"crash: {report.kills} kills ({report.kills_while_loading} while the model loaded), "
          f"{sum(report.acked.values())} acknowledged writes {dict(report.acked)}, "
          f"{report.in_flight} cut in flight ({report.in_flight_applied} of them applied), "
          f"{report.seconds:.1f} s")
    assert report.kills == KILLS
    assert report.problems == []
    assert report.failures == []
    # The kills really land between writes of every kind, not on an idle server.
    for op in ("memory.create", "memory.edit", "memory.delete", "memory.pin", "character.put",
               "character.delete", "chat.put", "turn.rollback", "messages.upsert", "message.delete"):
        assert report.acked[op] > 0, (op, report.acked)
    assert report.in_flight >= KILLS // 2


def test_pending_jobs_resume_after_sigkill() -> None:
    """Issue 8: jobs queued or running when the process dies are picked up again after restart.

    The persistent job queue (server_plugin/jobs.py, issue of h-conv) is not on main yet; this test
    is extended (not faked) when it lands: enqueue through message ingestion, SIGKILL while a job is
    running against tests/fakellm.py with a delay, restart, and see the job done exactly once.
    """
    jobs = Path(__file__).resolve().parent.parent / "server_plugin" / "jobs.py"
    if not jobs.exists():
        pytest.skip("server_plugin/jobs.py (the job queue) has not landed yet")
    pytest.skip("jobs.py landed: this check is to be written against it (issue 8)")
