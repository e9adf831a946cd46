"""Where a context call and a search spend their time on a campaign store (the scale profile).

Takes a copy of a store kept by `campaign_scale.py --fill-only --snapshots` (KEEP@STEP) or by
`assemble_latency.py --keep`, serves it in this process with the worker off (Flask's test client,
no HTTP), and times N context calls and N searches, each with a new LoCoMo question: the wall time
of each step of `context.answer` (as `context_backlog.py` splits it) and of the search's own steps
(query embedding, index catch-up and mask, ranking, results), p50/p95. With `--profile PREFIX`
both phases are profiled into PREFIX.context.prof and PREFIX.search.prof, and the functions with
the most own time are printed.

    HF_HUB_OFFLINE=1 OPENBLAS_NUM_THREADS=1 python bench/scale_profile.py --store /work/bench_cache/campaign@30000
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ["HF_HUB_OFFLINE"] = "1"

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import campaign_scale as CS  # noqa: E402
from context_backlog import Timings, pct  # noqa: E402

from server_plugin.app import build_services, create_app  # noqa: E402
from server_plugin.retrieval import live_index  # noqa: E402
from server_plugin.retrieval import ranking as R  # noqa: E402
from server_plugin.retrieval import search as S  # noqa: E402
from server_plugin.settings import load_settings  # noqa: E402

TOKEN = "scale-profile-token"


def timed_search_steps() -> dict[str, list[float]]:
    """Wrap the search's steps (once) so each call's wall times are recorded."""
    steps: dict[str, list[float]] = {}
    # _embedded: the query embedding (on its own thread); vector_of: how long search waited for it.
    targets = {"_embedded": S, "vector_of": S, "text_side": R, "rank": R, "top_k": R, "_results": S}

    def wrap(module, name):
        step = getattr(module, name)

        def wrapper(*args, **kwargs):
            began = time.perf_counter()
            try:
                return step(*args, **kwargs)
            finally:
                steps.setdefault(name, []).append((time.perf_counter() - began) * 1000)
        setattr(module, name, wrapper)

    for name, module in targets.items():
        wrap(module, name)
    for name in ("current", "candidates"):
        owner = live_index.SearchState if name == "current" else live_index.LiveIndex
        original = getattr(owner, name)

        def method(self, *args, _original=original, _name=name, **kwargs):
            began = time.perf_counter()
            try:
                return _original(self, *args, **kwargs)
            finally:
                steps.setdefault(_name, []).append((time.perf_counter() - began) * 1000)
        setattr(owner, name, method)
    return steps


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", required=True)
    parser.add_argument("--calls", type=int, default=60)
    parser.add_argument("--profile", metavar="PREFIX")
    args = parser.parse_args()
    _, questions = CS.locomo()
    rnd = random.Random(5)
    picked = rnd.sample(questions, 2 * args.calls + 20)
    with tempfile.TemporaryDirectory(prefix="chronicler-profile-", dir=Path(args.store).parent) as folder:
        shutil.copytree(args.store, folder, dirs_exist_ok=True, ignore=shutil.ignore_patterns("*.lock"))
        cfg = load_settings({"data_dir": folder, "token": TOKEN, "worker_enabled": False}, environ={})
        began = time.perf_counter()
        svc = build_services(cfg)
        app = create_app(cfg, services=svc)
        svc.embedder.wait(300)
        live_index.state_of(svc).ensure_loaded(600)
        print(f"ready in process {time.perf_counter() - began:.1f} s; index build "
              f"{live_index.state_of(svc).build_seconds:.1f} s; rows {live_index.status(svc)['rows']}")
        client, headers = app.test_client(), {"Authorization": f"Bearer {TOKEN}"}
        ctx = {"chat_id": CS.CHAT, "speaker_id": "char00.png", "context_tokens": 16384,
               "generation_type": "normal", "memory_bank": True,
               "instructions": CS.sentence(rnd, 250), "authors_note": CS.sentence(rnd, 40)}
        for q in picked[:10]:  # warm up
            client.post("/v1/context", json={**ctx, "last_action": {"text": q + " warm"}}, headers=headers)
            client.post("/v1/search", json={"query": q + " warm", "chat_id": CS.CHAT, "k": 10}, headers=headers)
        timings = Timings().wrap()
        timings.phase = "idle"
        steps = timed_search_steps()
        for phase, route, texts in (("context", "context", picked[20:20 + args.calls]),
                                    ("search", "search", picked[20 + args.calls:])):
            profile = cProfile.Profile() if args.profile else None
            walls = []
            for name in steps:
                steps[name].clear()
            for q in texts:
                body = ({**ctx, "last_action": {"text": q}} if route == "context"
                        else {"query": q, "chat_id": CS.CHAT, "k": 10})
                began = time.perf_counter()
                if profile is not None:
                    profile.enable()
                answer = client.post(f"/v1/{route}", json=body, headers=headers)
                if profile is not None:
                    profile.disable()
                walls.append((time.perf_counter() - began) * 1000)
                assert answer.status_code == 200, answer.get_data(as_text=True)[:300]
            print(f"\n{route}: n={len(walls)} p50 {pct(walls, .5):.1f} ms, p95 {pct(walls, .95):.1f} ms")
            for name, values in sorted(steps.items(), key=lambda kv: -sum(kv[1])):
                if values:
                    print(f"  {name:14s} p50 {pct(values, .5):6.2f} p95 {pct(values, .95):6.2f} ms (x{len(values)})")
            if route == "context":
                for (_, name), values in sorted(timings.wall.items(), key=lambda kv: -sum(kv[1])):
                    print(f"  context.{name:14s} p50 {pct(values, .5):6.2f} p95 {pct(values, .95):6.2f} ms")
                timings.wall.clear()
            if profile is not None:
                path = f"{args.profile}.{route}.prof"
                profile.dump_stats(path)
                pstats.Stats(path).sort_stats("tottime").print_stats(18)
        live_index.stop(svc)
        svc.db.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
