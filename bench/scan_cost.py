"""What the dense scan costs a search, and what the int4 first pass (shipped: `ranking/refine.py`,
`search_first_pass` int4), the int8 first pass (`search_first_pass` int8), an int8 index or a
bfloat16 index (neither shipped) save and change.

    python bench/scan_cost.py --store /work/bench_cache/campaign@100000            # cost
    python bench/scan_cost.py --store /work/bench_cache/campaign@100000 --quality  # + answers
    python bench/scan_cost.py --quality                     # answers on LoCoMo's local conversations
    python bench/scan_cost.py --store /work/bench_cache/campaign@100000 --first-pass --n 80  # loops vs numpy

Cost: the live index of a campaign_scale snapshot (item and passage vectors, float16, as the
sidecar keeps them), each product timed after an idle pause (`--gap`, as turns come) and back to
back: the shipped `vectors.dot` (split over two threads from 32,768 rows, the second placed as
`cpu_placement` auto places it; and unplaced, as before stop 42), the same on one thread,
torch's `mv` on one thread (what `dot` used before: the same scores), torch's bfloat16 product on
one thread, the shipped first pass over the int4 copy (`vectors.int4_dot`: 4 bits a component, a
bfloat16 scale and zero point per 128 components, the query in one bfloat16 row), the first pass
over the int8 copy by torch's kernel (`vectors.int8_dot`: the query as two bfloat16 rows, its
rounding and the rest) and by the compiled loop the sidecar reads it with where numba compiles
(`kernels.int8_rows`: the float32 query; on one thread, and as shipped, in two halves with
the second thread placed as `cpu_placement` auto places it), and
torch's weight-only int8 product with the query in one bfloat16 row (`_weight_int8pack_mm`, one
byte a component, a scale a row) where this torch has it. Each with its largest error against
float32 and the share of the dense channel's top 10 it keeps.

Quality (`--quality`): the fused search in two passes as shipped (`search_refine_rows`, the int4
copy), in two passes over the int8 copy, with the float16 index in one exact pass, with the index's vectors rounded to int8 (a symmetric scale
per row, then back to float32: the int8 product's answers without its bfloat16 output rounding)
and with torch's bfloat16 product (rows, query and scores rounded to bfloat16, as a bfloat16
index would compute them), against float32: LoCoMo's recall, or at a store the share of the top
10 kept and of the lists in the same order (as a person and as one character).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
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
import torch  # noqa: E402

import query_precision as QP  # noqa: E402
from server_plugin.retrieval.ranking import kernels  # noqa: E402
from server_plugin.retrieval.ranking import score  # noqa: E402
from server_plugin.retrieval.ranking import vectors as V  # noqa: E402


def int8_rows(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`rows` as int8 with one scale a row (largest component → ±127; the scale a bfloat16
    value, so the kernel's bfloat16 scales are exact)."""
    r = np.asarray(rows, dtype=np.float32)
    top = np.abs(r).max(axis=1) / 127 * 1.008  # rounded up below: no component past 127
    scale = torch.from_numpy(np.maximum(top, 1e-12)).to(torch.bfloat16).float().numpy()
    return np.round(r / scale[:, None]).astype(np.int8), scale


def dequantized(rows: np.ndarray) -> np.ndarray:
    """What an int8 index would hold, back in float32."""
    q, scale = int8_rows(rows)
    return q.astype(np.float32) * scale[:, None]


def bfloat16_rows(rows: np.ndarray) -> torch.Tensor:
    """What a bfloat16 index would hold: the rows rounded to bfloat16."""
    return torch.from_numpy(np.ascontiguousarray(rows, dtype=np.float32)).to(torch.bfloat16)


def bfloat16_product(rows: torch.Tensor, vector: np.ndarray) -> np.ndarray:
    """The scores a bfloat16 index would give from its `bfloat16_rows`: the query rounded to
    bfloat16 too, torch's product (its sums in float32, its results rounded to bfloat16)."""
    return torch.mv(rows, torch.from_numpy(np.asarray(vector, dtype=np.float32)).to(torch.bfloat16)).float().numpy()


@contextlib.contextmanager
def bfloat16_for(arrays: list[np.ndarray] | None):
    """Ranking's products made by `bfloat16_product` for rows of `arrays` (None: for every row)."""
    real = score.dot

    def dot(rows: np.ndarray, vector: np.ndarray) -> np.ndarray:
        ours = arrays is None or any(rows is a or rows.base is a for a in arrays)
        return bfloat16_product(bfloat16_rows(rows), vector) if ours else real(rows, vector)
    score.dot = dot
    try:
        yield
    finally:
        score.dot = real


def int8_product():
    """A function `(int8 rows, scales, vector) -> float32 scores`, or None where this torch
    has no weight-only int8 kernel (its shapes are checked: it fails hard on a dimension not
    a multiple of 16)."""
    kernel = getattr(torch, "_weight_int8pack_mm", None)
    if kernel is None:
        return None

    def product(q: torch.Tensor, scale: torch.Tensor, vector: np.ndarray) -> np.ndarray:
        x = torch.from_numpy(np.asarray(vector, dtype=np.float32)[None]).to(torch.bfloat16)
        return kernel(x, q, scale)[0].float().numpy()
    return product


def timed(fn, gap: float, n: int) -> tuple[float, float]:
    """p50 and p95 (ms) of `fn()`, each call after `gap` seconds idle."""
    times = []
    for _ in range(n + 5):
        time.sleep(gap)
        started = time.perf_counter()
        fn()
        times.append((time.perf_counter() - started) * 1000)
    times = sorted(times[5:])
    return statistics.median(times), times[int(len(times) * 0.95)]


def cost(store: str, n: int, gaps: list[float]) -> None:
    svc, folder, state = QP.open_snapshot(store)
    try:
        corpus = state.live.corpus()
        vectors = [svc.embedder.embed_one(f"where did they meet {i}", 30, kind="query") for i in range(8)]
        product = int8_product()
        print(f"{len(corpus.vectors):,} item vectors, {len(corpus.sent_vectors):,} passage vectors, "
              f"dimension {corpus.vectors.shape[1]}; int8 kernel: {'yes' if product else 'no'}")
        print("| rows | product | gap s | p50 ms | p95 ms | max error | dense top 10 kept |")
        print("| --- | --- | --- | --- | --- | --- | --- |")
        for label, rows in (("items", corpus.vectors), ("passages", corpus.sent_vectors)):
            exact = [rows.astype(np.float32) @ v for v in vectors]
            ways = {"float16, shipped dot (halves, placed)": lambda v: V.dot(rows, v, "auto"),
                    "float16, halves unplaced": lambda v: V.dot(rows, v, "off"),
                    "float16, one thread": lambda v: V._dot(rows, v),
                    "float16, torch.mv, one thread": lambda v: torch.mv(torch.from_numpy(rows), torch.from_numpy(
                        np.asarray(v, dtype=np.float16))).numpy().astype(np.float32)}
            as_bf16 = bfloat16_rows(rows)
            ways["bfloat16, one thread"] = lambda v: bfloat16_product(as_bf16, v)
            if V.int4_ready(rows.shape[1]):
                copy4 = V.Int4Rows(rows.shape[1]).sync(rows, len(rows))
                ways["int4 copy, the shipped first pass"] = lambda v: V.int4_dot(copy4, v)
            if V.int8_ready(rows.shape[1]):
                copy = V.Int8Rows(rows.shape[1]).sync(rows, len(rows))
                ways["int8 copy, first pass, torch's kernel"] = lambda v: V.int8_dot(*copy, v)
                if kernels.compiled() is not None:
                    ways["int8 copy, compiled loop, one thread"] = lambda v: compiled_int8(copy, v)
                    ways["int8 copy, compiled loop, shipped (halves, placed)"] = lambda v: V.coarse_dot(
                        copy, v, True, "auto")
            if product and rows.shape[1] % 16 == 0:
                q, scale = int8_rows(rows)
                qt, st = torch.from_numpy(q), torch.from_numpy(scale).to(torch.bfloat16)
                ways["int8 (bfloat16 activations)"] = lambda v: product(qt, st, v)
            for name, way in ways.items():
                got = [way(v) for v in vectors]
                error = max(float(np.abs(g - e).max()) for g, e in zip(got, exact))
                kept = statistics.mean(len(set(np.argsort(-g)[:10]) & set(np.argsort(-e)[:10])) / 10
                                       for g, e in zip(got, exact))
                for gap in gaps:
                    turn = iter(range(10**9))
                    p50, p95 = timed(lambda: way(vectors[next(turn) % len(vectors)]), gap, n)
                    print(f"| {label} | {name} | {gap} | {p50:.2f} | {p95:.2f} | {error:.1e} | {kept:.3f} |")
    finally:
        shutil.rmtree(folder)


def compiled_int8(copy: tuple[np.ndarray, np.ndarray], vector: np.ndarray) -> np.ndarray:
    """The int8 copy's scores by the compiled loop on this thread alone (`vectors.coarse_dots`
    halves the rows from SPLIT_ROWS on)."""
    out = np.empty(len(copy[0]), dtype=np.float32)
    kernels.int8_rows(*copy, np.ascontiguousarray(vector, dtype=np.float32), 0, len(out), out)
    return out


def quality_at_store(store: str, n: int) -> None:
    from server_plugin.retrieval import live_index

    svc, folder, state = QP.open_snapshot(store)
    try:
        full_index = live_index.build(svc.db, state._weights(), False)
        half_index = live_index.build(svc.db, state._weights(), True)  # every row exact, one pass
        int8_index = live_index.build(svc.db, state._weights(), False)
        int8_index.vectors[:int8_index.n] = dequantized(int8_index.vectors[:int8_index.n])
        int8_index.pvec[:int8_index.pn] = dequantized(int8_index.pvec[:int8_index.pn])
        bf16_index = live_index.build(svc.db, state._weights(), False)  # float32 rows, bfloat16 products
        int8_pass = live_index.build(svc.db, state._weights(), True, coarse="int8")
        indexes = {"float32": full_index, "float16 index, one exact pass": half_index,
                   "two passes (shipped)": state.live, "two passes, int8 copy": int8_pass,
                   "int8 index": int8_index, "bfloat16 index": bf16_index}

        def vectors(text: str) -> dict[str, np.ndarray]:
            vector = svc.embedder.embed_one(text, 30)  # float32
            return dict.fromkeys(indexes, vector)
        with bfloat16_for([bf16_index.vectors, bf16_index.pvec]):
            top = QP.searches(svc, state, n, indexes, vectors)
        for name in ("float16 index, one exact pass", "two passes (shipped)", "two passes, int8 copy",
                     "int8 index", "bfloat16 index"):
            QP.agreement(name, top[name], top["float32"], "float32")
        for name in ("two passes (shipped)", "two passes, int8 copy"):
            QP.agreement(name, top[name], top["float16 index, one exact pass"], "the float16 index in one exact pass")
    finally:
        shutil.rmtree(folder)


def quality_on_locomo() -> None:
    LP, params, _, preps = QP.locomo_preps()
    ranked = {}
    in_half = lambda r: r.astype(np.float16).astype(np.float32)  # noqa: E731
    exact = dataclasses.replace(params, refine_rows=0)
    ways = (("float32", None), ("float16", in_half), ("two passes (shipped)", None),
            ("two passes, int8 copy", None), ("int8", dequantized), ("bfloat16", None))
    for name, round_rows in ways:
        runs = []
        for p in preps:
            c = p.corpus
            if round_rows is not None:
                c = dataclasses.replace(c, vectors=round_rows(c.vectors), sent_vectors=None
                                        if c.sent_vectors is None else round_rows(c.sent_vectors))
            if name.startswith("two passes"):  # as the live index keeps them: float16 and a copy
                c = two_pass_corpus(c, "int8" if "int8" in name else "int4")
            runs.append(LP.Prepared(p.conv, p.cast, c, p.queries))
        with bfloat16_for(None) if name == "bfloat16" else contextlib.nullcontext():
            used = params if name.startswith("two passes") else exact
            print(LP.fmt_table(f"index in {name}", LP.evaluate(runs, used)))
            ranked[name] = QP.top10(runs, used)
    for name, _ in ways[1:]:
        QP.agreement(name, ranked[name], ranked["float32"], "float32")
    for name in ("two passes (shipped)", "two passes, int8 copy"):
        QP.agreement(name, ranked[name], ranked["float16"], "float16")


def two_pass_corpus(c, kind: str):
    """A prepared corpus as the live index keeps it: float16 vectors and their `kind` copies."""
    half = c.vectors.astype(np.float16)
    sent = None if c.sent_vectors is None else c.sent_vectors.astype(np.float16)
    items, passages = V.coarse_copies(kind, half.shape[1])
    return dataclasses.replace(c, vectors=half, sent_vectors=sent, coarse=items.sync(half, len(half)),
                               coarse_sent=None if sent is None else passages.sync(sent, len(sent)))


def first_pass(store: str, n: int, gap: float) -> None:
    """`rank` with the first pass as numba's loops (`search_compiled_first_pass`, shipped) and as
    numpy's passes, alternating on the same queries (LoCoMo questions, as a person and as one
    character), each after `gap` s idle and another text embedded (as turns come); the words'
    side (`text_side`: BM25 and the priors, with the loops also the words' fusion, which numpy's
    passes do in `rank`) the same way. p50 / p95 ms, and how many top-10 lists the two agree on."""
    import random

    import campaign_scale as CS
    from server_plugin.retrieval import search as S

    svc, folder, state = QP.open_snapshot(store)
    try:
        live = state.live
        corpus = live.corpus()
        _, questions = CS.locomo()
        times: dict[str, list[float]] = {}
        same = total = 0
        for i, q in enumerate(random.Random(19).sample(questions, n)):
            viewer = None if i % 2 else "char00.png"
            scopes = S.visibility.readable_scopes(svc.db.reader(), viewer) if viewer else ()
            mask = live.candidates(viewer, scopes, [CS.CHAT], None)
            params = S.reading_params(svc, q)
            cast = S.query_cast(svc, CS.CHAT)
            words = S.R.prepare_query(q, cast, None, params)
            vector = svc.embedder.embed_one(S._dense_text(svc, q, cast), 30, kind="query")
            query = S.R.with_vector(words, vector)
            top = {}
            for compiled in ((True, False) if i % 2 else (False, True)):
                used = dataclasses.replace(params, compiled=compiled)
                name = "loops" if compiled else "numpy"
                for part in ("words", "rank"):
                    time.sleep(gap)
                    svc.embedder.embed_one(f"another turn {i} {name} {part}", 30)
                    started = time.perf_counter()
                    text = S.R.text_side(corpus, words, used, mask)
                    if part == "rank":
                        started = time.perf_counter()
                        top[name] = S.R.top_k(S.R.rank(corpus, query, used, mask, text), 10, compiled)
                    times.setdefault(f"{part}, {name}", []).append((time.perf_counter() - started) * 1000)
            same += bool(np.array_equal(top["loops"], top["numpy"]))
            total += 1
        print(f"{len(corpus):,} rows; the two first passes give the same top 10 in the same order in "
              f"{same} of {total} searches")
        print("| part | first pass | p50 ms | p95 ms |\n| --- | --- | --- | --- |")
        for key, values in times.items():
            values = sorted(values[4:])
            part, name = key.split(", ")
            p95 = values[int(len(values) * 0.95)]
            print(f"| {part} | {name} | {statistics.median(values):.2f} | {p95:.2f} |")
    finally:
        shutil.rmtree(folder)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--store", help="a campaign_scale snapshot's folder (copied, never written)")
    parser.add_argument("--n", type=int, default=40, help="timed calls per product and gap")
    parser.add_argument("--gaps", default="0.1,0", help="idle seconds before each timed call")
    parser.add_argument("--quality", action="store_true", help="also the answers of each way")
    parser.add_argument("--questions", type=int, default=100, help="questions per viewer at the store")
    parser.add_argument("--first-pass", action="store_true",
                        help="at the store, rank with the first pass as numba's loops and as numpy's passes")
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.store and args.first_pass:
        first_pass(args.store, args.n, float(args.gaps.split(",")[0]))
    elif args.store:
        cost(args.store, args.n, [float(g) for g in args.gaps.split(",")])
    if args.quality:
        quality_at_store(args.store, args.questions) if args.store else quality_on_locomo()


if __name__ == "__main__":
    main()
