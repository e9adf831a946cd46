"""A first pass over the index's top principal components: what it would save and change
(measured, not built; docs/scaling.md section 2).

    python bench/projected_pass.py --store /work/bench_cache/campaign@100000 [--dims 128,256]
        [--n 40] [--gap 0.15] [--questions 100]

At campaign size what a search's dense scan still costs is its first pass (`refine.py`): every
item's and passage's cosine from the int4 copy, 384 components a row, ~5.5 ms after an idle pause
at 100,000 messages. The same pass over the first D components of the rows in the basis of their
principal directions (the eigenvectors of the rows' second moment, largest first) reads D/384 of
the bytes; what it drops is each row's remaining components, whose product with the query's is
no longer in the first pass (the second pass scores its best rows from every component, as now).

Cost: the shipped int4 first pass (items and passages) against int4 copies of the projected rows
(D a multiple of 128, the kernel's group), alternating, each after `--gap` s idle.

Answers: at the store, `--questions` LoCoMo questions as a person and as one character, the
fused top 10 of the float16 index in one exact pass against the shipped two passes, two passes
whose first reads the projected rows in float32, and two passes whose first reads an int4 copy
of them. The spreads the first pass measures are used as they are: nothing corrects for the
components left out (the shipped int4 pass corrects its own rounding, `first_pass_noise`), which
is what a built version would add. The bound of any such correction: the same two passes whose
second takes each dense channel's exact mean and spread over the candidates ("exact spreads",
computed here from a full exact scan, which a built version could not afford).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import random
import shutil
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ["HF_HUB_OFFLINE"] = "1"
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402

import query_precision as QP  # noqa: E402
from server_plugin.retrieval.ranking import fusion, refine, score  # noqa: E402
from server_plugin.retrieval.ranking import vectors as V  # noqa: E402


def principal_basis(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The rows' principal directions (columns, largest first) and each one's share of their energy."""
    x = np.asarray(rows, dtype=np.float32)
    values, basis = np.linalg.eigh(x.T @ x / len(x))
    return basis[:, ::-1].copy(), values[::-1] / values.sum()


@dataclasses.dataclass(frozen=True)
class Projected:
    """A first pass's copy: the rows' first components (float32, or read back from int4)."""

    rows: np.ndarray
    basis: np.ndarray
    n: int
    exact_spreads: bool = False


class ProjectedRows:
    """`Int4Rows`' role for projected rows: `sync` gives the copy of `source[:n]`."""

    def __init__(self, basis: np.ndarray, int4: bool, exact_spreads: bool = False) -> None:
        self.basis, self.int4, self.exact_spreads, self.view = basis, int4, exact_spreads, None

    def sync(self, source: np.ndarray, n: int) -> Projected:
        if self.view is None or self.view.n != n:
            rows = np.asarray(source[:n], dtype=np.float32) @ self.basis
            if self.int4:
                rows = V.dequantize4(V.Int4Rows(rows.shape[1]).sync(rows, n))
            self.view = Projected(np.ascontiguousarray(rows, dtype=np.float32), self.basis, n,
                                  self.exact_spreads)
        return self.view


def read_projected() -> None:
    """Ranking reads a `Projected` copy as it reads the int4 / int8 ones (this process only)."""
    dot, dots, ready = score.coarse_dot, score.coarse_dots, score.coarse_ready
    score.coarse_dot = lambda copy, v, compiled=False: (
        copy.rows @ (np.asarray(v, np.float32) @ copy.basis) if isinstance(copy, Projected)
        else dot(copy, v, compiled))
    score.coarse_dots = lambda copies, v, compiled=False: (
        [score.coarse_dot(copy, v) for copy in copies] if any(isinstance(copy, Projected) for copy in copies)
        else dots(copies, v, compiled))
    score.coarse_ready = lambda copy, dim: isinstance(copy, Projected) or ready(copy, dim)
    rescored = refine.rescored

    def exact(corpus, vector, params, fused, first):
        if isinstance(corpus.coarse, Projected) and corpus.coarse.exact_spreads:
            channels = score.dense_channels(corpus, vector, params)  # every row, exactly
            stats = {name: fusion.mean_sd(channels[name], first.mask)[:2] if name in channels else kept
                     for name, kept in first.stats.items()}
            first = dataclasses.replace(first, stats=stats)
        return rescored(corpus, vector, params, fused, first)
    refine.rescored = exact


def cost(corpus, basis: np.ndarray, dims: list[int], n: int, gap: float) -> None:
    x = np.asarray(corpus.vectors, dtype=np.float32)
    p = np.asarray(corpus.sent_vectors, dtype=np.float32)
    ways = {"384 components (shipped)": (corpus.coarse, corpus.coarse_sent, None)}
    for d in (d for d in dims if d % V.INT4_GROUP == 0):
        b = basis[:, :d].copy()
        ways[f"top {d}"] = (V.Int4Rows(d).sync(x @ b, len(x)), V.Int4Rows(d).sync(p @ b, len(p)), b)
    rnd = random.Random(3)
    times: dict[str, list[float]] = {name: [] for name in ways}
    for i in range(n * len(ways)):
        name = list(ways)[i % len(ways)]
        items, passages, b = ways[name]
        vector = x[rnd.randrange(len(x))]
        time.sleep(gap)
        started = time.perf_counter()
        query = vector if b is None else vector @ b
        V.int4_dot(items, query)
        V.int4_dot(passages, query)
        times[name].append((time.perf_counter() - started) * 1000)
    print(f"| int4 first pass, {len(x):,} items and {len(p):,} passages | p50 ms | p95 ms |")
    print("| --- | --- | --- |")
    for name, values in times.items():
        values = sorted(values[2:])
        print(f"| {name} | {statistics.median(values):.2f} | {values[int(len(values) * 0.95)]:.2f} |")


def answers(svc, state, basis: np.ndarray, dims: list[int], questions: int) -> None:
    from server_plugin.retrieval import live_index

    weights = state._weights()
    one_pass = live_index.build(svc.db, weights, True)
    indexes = {"float16 index, one exact pass": one_pass, "two passes (shipped)": state.live}
    for d in dims:
        for int4, exact in ((False, False), (True, False), (True, True)):
            if int4 and d % V.INT4_GROUP:
                continue
            index = live_index.build(svc.db, weights, True, coarse="int8")
            first = basis[:, :d].copy()
            index.coarse = (ProjectedRows(first, int4, exact), ProjectedRows(first, int4, exact))
            index.corpus()
            name = f"two passes, top {d} components{' in int4' if int4 else ''}"
            indexes[name + (", exact spreads" if exact else "")] = index

    def vectors(text: str) -> dict[str, np.ndarray]:
        return dict.fromkeys(indexes, svc.embedder.embed_one(text, 30))

    top = QP.searches(svc, state, questions, indexes, vectors)
    for name in list(indexes)[1:]:
        QP.agreement(name, top[name], top["float16 index, one exact pass"],
                     "the float16 index in one exact pass")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--store", required=True,
                        help="a campaign_scale snapshot's folder (copied, never written)")
    parser.add_argument("--dims", default="128,256", help="components the first pass reads")
    parser.add_argument("--n", type=int, default=40, help="timed first passes per way")
    parser.add_argument("--gap", type=float, default=0.15, help="idle seconds before each timed pass")
    parser.add_argument("--questions", type=int, default=100, help="questions per viewer")
    args = parser.parse_args()
    dims = [int(d) for d in args.dims.split(",")]
    svc, folder, state = QP.open_snapshot(args.store)
    try:
        state.live.settle_first_pass()
        corpus = state.live.corpus()
        basis, share = principal_basis(corpus.vectors)
        print("energy of the rows in their first D principal components: "
              + ", ".join(f"{d}: {share[:d].sum():.3f}" for d in dims))
        cost(corpus, basis, dims, args.n, args.gap)
        read_projected()
        answers(svc, state, basis, dims, args.questions)
    finally:
        shutil.rmtree(folder)


if __name__ == "__main__":
    main()
