"""What a cheaper dense first pass could do for the context call's growth with the story (the
campaign target: the call's p95 at 100,000 messages within 1.3x its own at 10,000). Measured, not
built.

    python bench/first_pass_bound.py \
        --stores /work/bench_cache/campaign@10000,/work/bench_cache/campaign@100000 \
        [--calls 450] [--dims 128] [--gap 0.1]

At each store (a campaign_scale snapshot, copied, never written), in one process, `POST /v1/context`
through the app (Flask's test client: no HTTP) with a new LoCoMo question each call, after an idle
pause as a turn comes, three first passes taken in turn in blocks of five calls:

- shipped: the int4 copies of every item's and passage's 384 components (refine.py);
- projected: the items read from an int4 copy of their first `--dims` principal components (the
  rows' basis of projected_pass.py), the passages as shipped. The spreads fusion measures are left
  as they come (what a built version would correct: projected_pass.py); only the time counts;
- free: each copy's scores computed once and handed back at every call, so the scans cost
  nothing. The answers are wrong; the time is what the call would take if the first pass read no
  rows at all. It is the bound of any first pass, an approximate index included.

Everything else (BM25, the priors, the fusion's passes over every row, the rescoring, the
assembly) runs as shipped. The last store's p50 and p95 over the first's are each way's ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ["HF_HUB_OFFLINE"] = "1"
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402

import campaign_scale as CS  # noqa: E402
from projected_pass import principal_basis  # noqa: E402
from server_plugin.retrieval.ranking import score  # noqa: E402
from server_plugin.retrieval.ranking import vectors as V  # noqa: E402

WAYS = ("shipped", "projected", "free")
TOKEN = "b" * 32


class FirstPass:
    """`score.coarse_dots` while installed: reads as `way` says ("shipped", "projected", "free")."""

    def __init__(self, live, dims: int) -> None:
        corpus = live.corpus()
        self.basis = np.ascontiguousarray(principal_basis(corpus.vectors)[0][:, :dims])
        items = np.asarray(corpus.vectors, dtype=np.float32)
        self.projected = V.Int4Rows(dims).sync(items @ self.basis, len(items))
        self.items = live.coarse[0]  # the live index's int4 copy of the items (its views share its scales)
        self.shipped = score.coarse_dots
        self.kept: dict[int, np.ndarray] = {}
        self.way, self.unprojected = "shipped", 0

    def __call__(self, copies, vector: np.ndarray, compiled: bool = False) -> list[np.ndarray]:
        if self.way == "shipped":
            return self.shipped(copies, vector, compiled)
        return [self.one(copy, vector, compiled) for copy in copies]

    def one(self, copy, vector: np.ndarray, compiled: bool) -> np.ndarray:
        if self.way == "free":
            rows = copy.n if isinstance(copy, V.Int4View) else len(copy[0])
            if rows not in self.kept:
                self.kept[rows] = self.shipped([copy], vector, compiled)[0]
            return self.kept[rows]
        if isinstance(copy, V.Int4View) and copy.scale_zero is self.items.scale_zero:
            if copy.n != self.projected.n:  # rows added since: read as shipped, and say so
                self.unprojected += 1
                return self.shipped([copy], vector, compiled)[0]
            return V.int4_dot(self.projected, np.asarray(vector, dtype=np.float32) @ self.basis)
        return self.shipped([copy], vector, compiled)[0]


def measure(store: str, questions: list[str], dims: int, gap: float) -> dict[str, list[float]]:
    """Context call times (ms) at `store` for each way, alternating blocks of five calls, the
    first ten `questions` warming up. Run in a process of its own (`main` starts one a store):
    the model's cache of vectors and the memory the calls touched start fresh at every store,
    as at a sidecar's restart."""
    from server_plugin.app import build_services, create_app
    from server_plugin.retrieval import live_index
    from server_plugin.settings import load_settings

    folder = tempfile.mkdtemp(dir=Path(store).parent)
    try:
        shutil.copytree(store, folder, dirs_exist_ok=True, ignore=shutil.ignore_patterns("*.lock"))
        cfg = load_settings({"data_dir": folder, "token": TOKEN, "worker_enabled": False}, environ={})
        svc = build_services(cfg)
        app = create_app(cfg, services=svc)
        svc.embedder.wait(300)
        state = live_index.state_of(svc)
        state.ensure_loaded(600)
        svc.embedder.settle()
        state.live.settle_first_pass()
        first = FirstPass(state.live, dims)
        score.coarse_dots = first
        try:
            times = _calls(app.test_client(), svc, questions, gap, first)
        finally:
            score.coarse_dots = first.shipped
        if first.unprojected:
            print(f"{Path(store).name}: {first.unprojected} projected calls read as shipped (rows added)",
                  file=sys.stderr)
        return times
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _calls(client, svc, picked: list[str], gap: float, first: FirstPass) -> dict[str, list[float]]:
    rnd = random.Random(21)
    headers = {"Authorization": f"Bearer {TOKEN}"}
    body = {"chat_id": CS.CHAT, "speaker_id": "char00.png", "context_tokens": 16384,
            "generation_type": "normal", "memory_bank": True,
            "instructions": CS.sentence(rnd, 250), "authors_note": CS.sentence(rnd, 40)}
    for q in picked[:10]:  # warm: the first calls compile and fill caches
        client.post("/v1/context", json={**body, "last_action": {"text": f"{q} (warm)"}}, headers=headers)
    times: dict[str, list[float]] = {way: [] for way in WAYS}
    for i, q in enumerate(picked[10:]):
        way = WAYS[(i // 5) % len(WAYS)]
        first.way = way
        # As between turns: idle, another text embedded (the player's message), idle again.
        time.sleep(gap)
        svc.embedder.embed_one(f"between turns: {q}", 30)
        time.sleep(gap)
        started = time.perf_counter()
        response = client.post("/v1/context", json={**body, "last_action": {"text": q}}, headers=headers)
        times[way].append((time.perf_counter() - started) * 1000)
        assert response.status_code == 200, response.get_data(as_text=True)[:300]
    first.way = "shipped"
    return times


def p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * 0.95))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--stores", required=True, help="campaign_scale snapshots, smallest first, by commas")
    parser.add_argument("--calls", type=int, default=450,
                        help="timed context calls per store, all ways (LoCoMo has 584 questions)")
    parser.add_argument("--dims", type=int, default=128, help="components the projected first pass reads")
    parser.add_argument("--gap", type=float, default=0.1,
                        help="idle seconds on each side of the text embedded between calls")
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)  # one store, as JSON
    args = parser.parse_args()
    stores = args.stores.split(",")
    if args.one:
        _, questions = CS.locomo()
        picked = random.Random(21).sample(questions, min(len(questions), args.calls + 10))
        print(json.dumps(measure(stores[0], picked, args.dims, args.gap)))
        return
    results = {}
    for store in stores:
        command = [sys.executable, __file__, "--one", "--stores", store, "--calls", str(args.calls),
                   "--dims", str(args.dims), "--gap", str(args.gap)]
        done = subprocess.run(command, check=True, stdout=subprocess.PIPE, text=True)
        results[store] = json.loads(done.stdout.strip().splitlines()[-1])
    print("| store | first pass | calls | context p50 ms | p95 ms |")
    print("| --- | --- | --- | --- | --- |")
    for store, times in results.items():
        for way in WAYS:
            print(f"| {Path(store).name} | {way} | {len(times[way])} | {statistics.median(times[way]):.2f} "
                  f"| {p95(times[way]):.2f} |")
    if len(stores) > 1:
        small, big = results[stores[0]], results[stores[-1]]
        for way in WAYS:
            print(f"{way}: {Path(stores[-1]).name} over {Path(stores[0]).name}: p50 "
                  f"{statistics.median(big[way]) / statistics.median(small[way]):.2f}x, "
                  f"p95 {p95(big[way]) / p95(small[way]):.2f}x")


if __name__ == "__main__":
    main()
