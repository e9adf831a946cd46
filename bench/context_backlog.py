"""`POST /v1/context` while the job worker drains a backlog (rules OP4, OP10; requests go first, priority.py).

Takes a copy of a store filled by `assemble_latency.py --keep DIR` (the 10,000-message campaign),
serves it in this process with the job worker on, asks for every rolling summary to be rebuilt
(`POST /v1/chats/{id}/summaries/rebuild`: about 1,250 jobs), then sends a context call every
`--gap` seconds (as turns come, but faster) and times those answered while jobs were pending.
Prints their p50/p95/max against the same calls' before the backlog (idle), how long the backlog
took to drain, and the time of each step of `context.answer` (p50/p95, idle and busy), with the CPU
time of the thread that answered: wall time above it is time the call waited (for the
interpreter, a lock or a core) — in process, through Flask's test client (no HTTP).

    .venv/bin/python bench/assemble_latency.py --keep /tmp/ctx_bench     # once, fills the store
    .venv/bin/python bench/context_backlog.py --store /tmp/ctx_bench [--calls 190] [--gap 0.05]
"""

from __future__ import annotations

import argparse
import collections
import cProfile
import functools
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

from server_plugin.retrieval import live_index

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ["HF_HUB_OFFLINE"] = "1"

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import assemble_latency as AL  # noqa: E402

from server_plugin.app import build_services, create_app  # noqa: E402
from server_plugin.jobs import queue
from server_plugin.retrieval import bank  # noqa: E402
from server_plugin.settings import load_settings  # noqa: E402
from server_plugin.story import context

# The steps of context.answer (the whole call), by the module each lives in (context.answer calls
# them through it).
STEPS = {"answer": context, "query_vector_soon": bank, "assemble": context, "story_summary": context,
         "bank_search": bank, "history": context, "saved_memories": context,
         "story_cards": context, "record_turn": context}


class Timings:
    """The time of each step of context.answer, per phase ("idle", "busy"): wall and CPU time of
    the answering thread (ms). Wall minus CPU is time the step waited — for the interpreter,
    a lock or a core — rather than worked."""

    def __init__(self) -> None:
        self.phase = "warm-up"
        self.wall: dict[tuple[str, str], list[float]] = collections.defaultdict(list)
        self.cpu: dict[tuple[str, str], list[float]] = collections.defaultdict(list)

    def wrap(self) -> "Timings":
        """Wrap the steps of context.answer (once) so each call's times are recorded."""
        for name, module in STEPS.items():
            step = getattr(module, name)

            @functools.wraps(step)
            def wrapper(*args, _step=step, _name=name, **kwargs):
                wall, cpu = time.perf_counter(), time.thread_time()
                try:
                    return _step(*args, **kwargs)
                finally:
                    self.wall[self.phase, _name].append((time.perf_counter() - wall) * 1000)
                    self.cpu[self.phase, _name].append((time.thread_time() - cpu) * 1000)
            setattr(module, name, wrapper)
        return self

    def table(self) -> None:
        """Print each step's p50/p95 wall time and mean wall/CPU time, idle and busy."""
        names = sorted(STEPS, key=lambda n: -sum(self.wall.get(("busy", n), [0])))
        print("  step            idle p50/p95 ms   mean wall/cpu    busy p50/p95 ms   mean wall/cpu")
        for name in names:
            row = []
            for phase in ("idle", "busy"):
                wall, cpu = self.wall.get((phase, name), []), self.cpu.get((phase, name), [])
                if not wall:
                    break
                row.append(f"{pct(wall, .5):6.1f} {pct(wall, .95):6.1f}    "
                           f"{sum(wall) / len(wall):6.1f} {sum(cpu) / len(cpu):6.1f}")
            if len(row) == 2:
                print(f"  {name:15s} {row[0]}     {row[1]}")


def timed_call(client, body: dict, headers: dict, profile: cProfile.Profile | None = None) -> tuple[float, float]:
    """One context call: its wall time and the CPU time of the thread that answered it (ms);
    with `profile`, the call is profiled (this thread only: the worker's is not)."""
    wall, cpu = time.perf_counter(), time.thread_time()
    if profile is not None:
        profile.enable()
    client.post("/v1/context", json=body, headers=headers)
    if profile is not None:
        profile.disable()
    return (time.perf_counter() - wall) * 1000, (time.thread_time() - cpu) * 1000


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p * len(ordered)))]


def report(args: argparse.Namespace, idle: list[tuple[float, float]], busy: list[tuple[float, float]],
           drained: float, counts: dict[str, int]) -> None:
    """Print the idle and busy calls' wall p50/p95 (and CPU means), the ratio, the drain time."""
    def line(calls: list[tuple[float, float]]) -> str:
        wall = [w for w, _ in calls]
        return (f"n={len(calls)} p50 {pct(wall, .5):.1f} ms, p95 {pct(wall, .95):.1f} ms, "
                f"max {max(wall):.1f} ms; CPU of the answering thread mean {sum(c for _, c in calls) / len(calls):.1f} ms")
    print(f"background_yield_calls {args.yield_calls}, cpu_placement {args.cpu_placement}; "
          f"idle context calls: {line(idle)}")
    if busy:
        ratio = pct([w for w, _ in busy], .95) / pct([w for w, _ in idle], .95)
        print(f"context calls answered while jobs were pending: {line(busy)}")
        print(f"p95 during the backlog / idle p95 {ratio:.2f} (target <= 1.3)")
    print(f"backlog drained {drained:.1f} s after the rebuild; jobs {counts}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", default="/tmp/ctx_bench", help="a store filled by assemble_latency.py --keep")
    parser.add_argument("--calls", type=int, default=190)
    parser.add_argument("--gap", type=float, default=0.05, help="seconds between context calls")
    parser.add_argument("--idle-calls", type=int, default=60, help="calls timed before the backlog, with no job")
    parser.add_argument("--yield-calls", choices=("on", "off"), default="on",
                        help="the setting background_yield_calls (off: the jobs' Python work shares the interpreter)")
    parser.add_argument("--cpu-placement", choices=("auto", "off"), default="auto",
                        help="the setting cpu_placement (off: the query's embedding runs wherever the system puts it)")
    parser.add_argument("--profile", metavar="PREFIX",
                        help="cProfile the idle and the busy calls into PREFIX.idle.prof and PREFIX.busy.prof")
    args = parser.parse_args()
    if not (Path(args.store) / "chronicler.sqlite3").exists():
        print(f"no store in {args.store}: run bench/assemble_latency.py --keep {args.store} first")
        return 2
    with tempfile.TemporaryDirectory(prefix="chronicler-backlog-") as folder:
        shutil.copytree(args.store, folder, dirs_exist_ok=True, ignore=shutil.ignore_patterns("*.lock"))
        cfg = load_settings({"data_dir": folder, "token": AL.TOKEN, "worker_enabled": True,
                             "background_yield_calls": args.yield_calls == "on",
                             "cpu_placement": args.cpu_placement}, environ={})
        svc = build_services(cfg)
        app = create_app(cfg, services=svc)
        svc.embedder.wait(120)
        live_index.state_of(svc).ensure_loaded(300)
        client, headers = app.test_client(), {"Authorization": f"Bearer {AL.TOKEN}"}
        rnd = random.Random(11)
        body = {"chat_id": AL.CHAT, "speaker_id": "char00.png", "context_tokens": 16384,
                "generation_type": "normal", "memory_bank": True, "instructions": AL.sentence(rnd, 250),
                "authors_note": AL.sentence(rnd, 40), "plot_essentials": AL.sentence(rnd, 120)}
        texts = AL.actions(rnd, args.calls + args.idle_calls + 10)
        timings = Timings().wrap()
        for text in texts[:10]:  # warm up
            client.post("/v1/context", json={**body, "last_action": {"text": text}}, headers=headers)
        timings.phase = "idle"
        profiles = {phase: cProfile.Profile() if args.profile else None for phase in ("idle", "busy")}
        idle: list[tuple[float, float]] = []
        for text in texts[10:10 + args.idle_calls]:  # the same calls with no job pending
            idle.append(timed_call(client, {**body, "last_action": {"text": text}}, headers, profiles["idle"]))
            time.sleep(args.gap)
        texts = texts[10 + args.idle_calls:]
        queued = client.post(f"/v1/chats/{AL.CHAT}/summaries/rebuild", json={}, headers=headers).get_json()
        print(f"rebuild: {queued.get('jobs_enqueued')} jobs queued; jobs {queue.counts(svc)}")
        busy: list[tuple[float, float]] = []
        started, drained = time.perf_counter(), None
        for text in texts:
            pending = queue.counts(svc)["pending"] > 0
            if not pending and drained is None:
                drained = time.perf_counter() - started
            timings.phase = "busy" if pending else "after"
            timed = timed_call(client, {**body, "last_action": {"text": text}}, headers,
                               profiles["busy"] if pending else None)
            if pending:
                busy.append(timed)
            time.sleep(args.gap)
        while drained is None and queue.counts(svc)["pending"]:
            time.sleep(0.2)
        drained = drained if drained is not None else time.perf_counter() - started
        report(args, idle, busy, drained, queue.counts(svc))
        timings.table()
        for phase, profile in profiles.items():
            if profile is not None:
                profile.dump_stats(f"{args.profile}.{phase}.prof")
        worker = app.extensions.get("chronicler_worker")
        if worker is not None:
            worker.stop()
        live_index.stop(svc)
        svc.db.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
