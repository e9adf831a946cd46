"""Kill the sidecar with SIGKILL at random moments while workers write; check nothing is lost.

One cycle: start the sidecar; workers write (and read) from the moment it answers; SIGKILL it at a
random moment (60% of the time while the embedding model is still loading, when the workers do
the writes that need no model; otherwise once a random number of writes that embed text have been
acknowledged after it is ready, so a busy machine still gets them); copy the crashed files and check them
(integrity, index orphans, half-written items); restart and reconcile every worker's ledger with
what the API returns. A small live window and a "scribe" worker that only adds messages keep
background summary jobs running throughout; at the end every job must have finished (none failed,
none stuck). Used by tests/test_crash.py (20 kills) and bench/crash.py (as many as asked).
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from tests.helpers.client import Client
from tests.helpers.ledger import copy_store, store_problems
from tests.helpers.process import BUSY_JOBS, SidecarProcess
from tests.helpers.workload import SCRIBE_FAMILIES, Worker, reconcile

MODEL_WRITES = {"memory.create", "memory.edit", "messages.upsert"}


@dataclass
class CrashReport:
    kills: int = 0
    kills_while_loading: int = 0
    acked: Counter = field(default_factory=Counter)          # acknowledged writes by operation
    statuses: Counter = field(default_factory=Counter)       # every answer by (operation, status)
    jobs: Counter = field(default_factory=Counter)           # background jobs by final state
    in_flight: int = 0                                       # writes cut by a kill
    in_flight_applied: int = 0                               # ... found applied after restart
    problems: list[str] = field(default_factory=list)        # anything lost, half-written or corrupt
    failures: list[str] = field(default_factory=list)        # 5xx / "locked" answers
    seconds: float = 0.0
    restart_seconds: list[float] = field(default_factory=list)

    @property
    def lost(self) -> int:
        return sum(1 for p in self.problems if "missing" in p or "acknowledged" in p)


def run_crash_cycles(workdir: Path, kills: int = 20, workers: int = 3, seed: int | None = None,
                     loading_share: float = 0.6, after_ready_writes: tuple[int, int] = (3, 15),
                     log: Callable[[str], None] = lambda _: None) -> CrashReport:
    """Run `kills` crash cycles against one data dir; the report says what (if anything) was lost."""
    seed = random.randrange(1 << 30) if seed is None else seed
    rng = random.Random(seed)
    log(f"crash seed {seed}")
    report = CrashReport()
    started = time.monotonic()
    side = SidecarProcess.create(workdir / "data", env=BUSY_JOBS)
    model_ready = threading.Event()
    team = [Worker(f"w{i}", Client(side.url, side.token), seed=rng.randrange(1 << 30),
                   model_ready=model_ready) for i in range(workers)]
    team.append(Worker("scribe", Client(side.url, side.token), families=SCRIBE_FAMILIES,
                       seed=rng.randrange(1 << 30), model_ready=model_ready))
    try:
        for cycle in range(kills):
            t0 = time.monotonic()
            side.start()
            report.restart_seconds.append(time.monotonic() - t0)
            if cycle:
                report.problems += _reconcile(team, side, report)
            while_loading = rng.random() < loading_share
            model_ready.clear()
            stop = threading.Event()
            threads = [threading.Thread(target=w.run, args=(stop,), daemon=True) for w in team]
            threads.append(threading.Thread(target=_watch_model, args=(side, model_ready, stop), daemon=True))
            for t in threads:
                t.start()
            if while_loading:
                time.sleep(rng.uniform(0.05, 2.5))
                report.kills_while_loading += int(not model_ready.is_set())
            else:
                side.wait_ready()
                model_ready.set()
                _wait_for_model_writes(team, rng.randint(*after_ready_writes))
                time.sleep(rng.uniform(0.0, 0.3))
            side.kill()
            stop.set()
            for t in threads:
                t.join(30)
            report.kills += 1
            report.in_flight += sum(1 for w in team if w.ledger.pending is not None)
            copy = copy_store(side.db_path, workdir / f"crashed-{cycle}")
            report.problems += [f"cycle {cycle} (seed {seed}): {p}" for p in store_problems(copy)]
            log(f"cycle {cycle}: killed {'while loading' if while_loading else 'after ready'} "
                f"{time.monotonic() - t0:.1f} s after start, "
                f"acked so far {sum(sum(dict(w.ledger.acked).values()) for w in team)}")
        side.start()
        report.problems += _reconcile(team, side, report)
        # Background jobs cut by the kills resume: all of them finish, none fails.
        settled = side.wait_jobs_settled()
        report.jobs = Counter(j["state"] for j in settled)
        report.problems += [f"job {j['kind']} failed: {j['error']}" for j in settled if j["state"] == "failed"]
        side.stop()
        copy = copy_store(side.db_path, workdir / "final")
        report.problems += [f"final: {p}" for p in store_problems(copy)]
    finally:
        side.kill()
        for w in team:
            w.client.close()
    for w in team:
        report.acked.update(w.ledger.acked)
        report.statuses.update(w.statuses)
        report.failures += w.failures
    report.seconds = time.monotonic() - started
    return report


def _wait_for_model_writes(team: list[Worker], count: int, limit: float = 30.0) -> None:
    """Until the team has `count` more acknowledged writes that needed the model (or `limit` s)."""
    def done() -> int:
        return sum(n for w in team for op, n in dict(w.ledger.acked).items() if op in MODEL_WRITES)

    target = done() + count
    deadline = time.monotonic() + limit
    while done() < target and time.monotonic() < deadline:
        time.sleep(0.01)


def _watch_model(side: SidecarProcess, ready: threading.Event, stop: threading.Event) -> None:
    """Set `ready` once /v1/health says the embedding model is loaded."""
    while not stop.is_set():
        try:
            if side.health(timeout=10)["embedder"]["ready"]:
                ready.set()
                return
        except Exception:  # slow (a busy machine) or killed meanwhile: `stop` ends the loop
            pass
        time.sleep(0.05)


def _reconcile(team: list[Worker], side: SidecarProcess, report: CrashReport) -> list[str]:
    before = sum(w.ledger.in_flight_applied for w in team)
    client = Client(side.url, side.token)
    try:
        problems = reconcile(team, client)
    finally:
        client.close()
    report.in_flight_applied += sum(w.ledger.in_flight_applied for w in team) - before
    for w in team:
        w.died = False
    return problems
