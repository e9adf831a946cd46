"""`POST /v1/context` while the job worker drains a backlog (rules OP4, OP10; requests go first, priority.py).

Takes a copy of a store filled by `assemble_latency.py --keep DIR` (the 10,000-message campaign),
serves it in this process with the job worker on, asks for every rolling summary to be rebuilt
(`POST /v1/chats/{id}/summaries/rebuild`: about 1,250 jobs), then sends a context call every
`--gap` seconds (as turns come, but faster) and times those answered while jobs were pending.
Prints their p50/p95/max, how long the backlog took to drain, and the time of each step of
`context.build` (p50/p95) — in process, through Flask's test client (no HTTP).

    .venv/bin/python bench/assemble_latency.py --keep /tmp/ctx_bench     # once, fills the store
    .venv/bin/python bench/context_backlog.py --store /tmp/ctx_bench [--calls 190] [--gap 0.05]
"""

from __future__ import annotations

import argparse
import collections
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

# The steps of context.build, by the module each lives in (context.build calls them through it).
STEPS = {"build": context, "query_vector": bank, "assemble": context, "story_summary": context,
         "bank_search": bank, "history": context, "saved_memories": context,
         "story_cards": context, "record_turn": context}


def timed_steps() -> dict[str, list[float]]:
    """Wrap the steps of context.build so each call's time per step is recorded (ms)."""
    times: dict[str, list[float]] = collections.defaultdict(list)
    for name, module in STEPS.items():
        step = getattr(module, name)

        @functools.wraps(step)
        def wrapper(*args, _step=step, _name=name, **kwargs):
            started = time.perf_counter()
            try:
                return _step(*args, **kwargs)
            finally:
                times[_name].append((time.perf_counter() - started) * 1000)
        setattr(module, name, wrapper)
    return times


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p * len(ordered)))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", default="/tmp/ctx_bench", help="a store filled by assemble_latency.py --keep")
    parser.add_argument("--calls", type=int, default=190)
    parser.add_argument("--gap", type=float, default=0.05, help="seconds between context calls")
    parser.add_argument("--idle-calls", type=int, default=60, help="calls timed before the backlog, with no job")
    parser.add_argument("--yield-calls", choices=("on", "off"), default="on",
                        help="the setting background_yield_calls (off: the jobs' Python work shares the interpreter)")
    args = parser.parse_args()
    if not (Path(args.store) / "chronicler.sqlite3").exists():
        print(f"no store in {args.store}: run bench/assemble_latency.py --keep {args.store} first")
        return 2
    with tempfile.TemporaryDirectory(prefix="chronicler-backlog-") as folder:
        shutil.copytree(args.store, folder, dirs_exist_ok=True, ignore=shutil.ignore_patterns("*.lock"))
        cfg = load_settings({"data_dir": folder, "token": AL.TOKEN, "worker_enabled": True,
                             "background_yield_calls": args.yield_calls == "on"}, environ={})
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
        for text in texts[:10]:  # warm up
            client.post("/v1/context", json={**body, "last_action": {"text": text}}, headers=headers)
        idle: list[float] = []
        for text in texts[10:10 + args.idle_calls]:  # the same calls with no job pending
            before = time.perf_counter()
            client.post("/v1/context", json={**body, "last_action": {"text": text}}, headers=headers)
            idle.append((time.perf_counter() - before) * 1000)
            time.sleep(args.gap)
        texts = texts[:10] + texts[10 + args.idle_calls:]
        queued = client.post(f"/v1/chats/{AL.CHAT}/summaries/rebuild", json={}, headers=headers).get_json()
        print(f"rebuild: {queued.get('jobs_enqueued')} jobs queued; jobs {queue.counts(svc)}")
        steps = timed_steps()
        busy: list[float] = []
        started, drained = time.perf_counter(), None
        for text in texts[10:]:
            pending = queue.counts(svc)["pending"] > 0
            if not pending and drained is None:
                drained = time.perf_counter() - started
            before = time.perf_counter()
            client.post("/v1/context", json={**body, "last_action": {"text": text}}, headers=headers)
            if pending:
                busy.append((time.perf_counter() - before) * 1000)
            time.sleep(args.gap)
        while drained is None and queue.counts(svc)["pending"]:
            time.sleep(0.2)
        drained = drained if drained is not None else time.perf_counter() - started
        print(f"background_yield_calls {args.yield_calls}; idle context calls: n={len(idle)} "
              f"p50 {pct(idle, .5):.1f} ms, p95 {pct(idle, .95):.1f} ms")
        if busy:
            print(f"context calls answered while jobs were pending: n={len(busy)} p50 {pct(busy, .5):.1f} ms, "
                  f"p95 {pct(busy, .95):.1f} ms, max {max(busy):.1f} ms; p95 during the backlog / idle p95 "
                  f"{pct(busy, .95) / pct(idle, .95):.2f} (target <= 1.3)")
        print(f"backlog drained {drained:.1f} s after the rebuild; jobs {queue.counts(svc)}")
        for name, values in sorted(steps.items(), key=lambda kv: -sum(kv[1])):
            print(f"  {name:15s} p50 {pct(values, .5):6.1f} ms  p95 {pct(values, .95):6.1f} ms")
        worker = app.extensions.get("chronicler_worker")
        if worker is not None:
            worker.stop()
        live_index.stop(svc)
        svc.db.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
