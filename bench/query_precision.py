"""What a search's query in bfloat16, or with int8 products, changes in the answers
(docs/search.md section 6).

    python bench/query_precision.py                          # LoCoMo's local conversations
    python bench/query_precision.py --precision int8
    python bench/query_precision.py --store /work/bench_cache/campaign@100000 --n 100

Without `--store`: the ranking core on LoCoMo (bench/locomo_proto.py's corpus and cached stored
vectors), every question ranked with its query embedded in float32 and in `--precision`: recall@k,
MRR and how many top-10 lists keep their order. With `--store` (a copy of a campaign_scale
snapshot, searched in process as a person and as one character): the share of the top 10 kept
and of the lists in the same order, for that query and, to compare, for the float16
index the sidecar keeps against a float32 one (the same float32 query).
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ["HF_HUB_OFFLINE"] = "1"
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from server_plugin.retrieval import bert, embeddings  # noqa: E402


def encoder_with_half(precision: str = "bfloat16") -> bert.Encoder:
    """The packaged MiniLM with its query layers in `precision` (bfloat16 or int8) made whatever
    this CPU's speed."""
    path = embeddings.packaged_model_path()
    enc = bert.Encoder(path, bert.layout(path))
    enc.use_int8() if precision == "int8" else enc.use_half()
    return enc


def locomo_preps():
    """LoCoMo's local conversations prepared for the ranking core:
    (locomo_proto, params, its Build, the prepared conversations)."""
    import locomo_proto as LP
    from server_plugin.retrieval.search import params_of
    from server_plugin.settings import defaults

    params, build = params_of(defaults()), LP.Build()
    emb = LP.Embedder("/tmp/chronicler_bench/emb_cache.sqlite")
    return LP, params, build, [LP.prepare(c, emb, build, params) for c in LP.load(LP.DEFAULT_DATA)]


def top10(runs, params) -> list[list[int]]:
    """Every question's top 10 (row numbers) by the ranking core."""
    from server_plugin.retrieval import ranking as R

    return [np.argsort(-R.rank(p.corpus, q, params), kind="stable")[:10].tolist()
            for p in runs for q in p.queries]


def agreement(name: str, got: list[list], reference: list[list], against: str) -> None:
    """Print the share of each reference top 10 that `got` keeps, and how many lists keep
    their order."""
    pairs = list(zip(got, reference))
    kept = sum(len(set(a) & set(b)) for a, b in pairs) / (10 * len(pairs))
    print(f"{name} against {against}: top 10 kept {kept:.4f}, same order "
          f"{sum(a == b for a, b in pairs)} of {len(pairs)}")


def on_locomo(enc: bert.Encoder) -> None:
    from server_plugin.retrieval import ranking as R

    LP, params, build, preps = locomo_preps()
    ranked = {}
    for query in (False, True):
        runs = []
        for p in preps:
            texts = [LP.dense_query(q.text, p.cast, build, params) for q in p.conv.questions]
            vectors = [enc.encode([t], query=query)[0] for t in texts]
            runs.append(LP.Prepared(p.conv, p.cast, p.corpus,
                                    [R.with_vector(q, v) for q, v in zip(p.queries, vectors)]))
        name = enc.query_precision if query else "float32"
        print(LP.fmt_table(f"queries in {name}", LP.evaluate(runs, params)))
        ranked[query] = top10(runs, params)
    agreement(f"{enc.query_precision} query", ranked[True], ranked[False], "float32")


def open_snapshot(store: str):
    """A copy of a campaign_scale snapshot (the caller deletes `folder`), its services and its
    search state with the (float16) live index loaded: (svc, folder, state)."""
    from server_plugin.app import build_services
    from server_plugin.retrieval import live_index
    from server_plugin.settings import load_settings

    folder = tempfile.mkdtemp()
    shutil.copytree(store, folder, dirs_exist_ok=True, ignore=shutil.ignore_patterns("*.lock"))
    svc = build_services(load_settings({"data_dir": folder, "token": "x" * 20, "worker_enabled": False},
                                       environ={}))
    svc.embedder.wait(300)
    state = live_index.state_of(svc)
    state.ensure_loaded(600)
    return svc, folder, state


def searches(svc, state, n: int, indexes: dict, query_vectors) -> dict[str, list[list[str]]]:
    """The top 10 ids of `n` LoCoMo questions for a person, then as one character, at a store,
    with each of `indexes` (name -> live index) swapped in in turn; `query_vectors(text)` gives
    the vector each name searches with (name -> float32 array)."""
    import campaign_scale as CS
    from server_plugin.retrieval import search as S

    _, questions = CS.locomo()
    out: dict[str, list[list[str]]] = {name: [] for name in indexes}
    for viewer in (None, "char00.png"):
        for q in random.Random(11).sample(questions, n):
            vectors = query_vectors(S._dense_text(svc, q, S.query_cast(svc, CS.CHAT)))
            for name, index in indexes.items():
                v = vectors[name].view(S.QueryVector)
                v.model_key = svc.embedder.key
                state.live = index
                out[name].append([r["id"] for r in S.search(svc, q, chat_id=CS.CHAT, viewer_id=viewer,
                                                            k=10, vector=v)])
    return out


def on_store(enc: bert.Encoder, store: str, n: int) -> None:
    from server_plugin.retrieval import live_index

    svc, folder, state = open_snapshot(store)
    try:
        half_index = state.live
        full_index = live_index.build(svc.db, state._weights(), False)

        def vectors(text: str) -> dict[str, np.ndarray]:
            full_q, half_q = enc.encode([text])[0], enc.encode([text], query=True)[0]
            return {"float32 index": full_q, "shipped": full_q, "query": half_q}
        top = searches(svc, state, n, {"float32 index": full_index, "shipped": half_index,
                                       "query": half_index}, vectors)
        agreement(f"{enc.query_precision} query", top["query"], top["shipped"],
                  "the float16 index with a float32 query")
        agreement("float16 index", top["shipped"], top["float32 index"], "a float32 index")
    finally:
        shutil.rmtree(folder)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--store", help="a campaign_scale snapshot's folder (copied, never written)")
    parser.add_argument("--n", type=int, default=100, help="questions per viewer at the store")
    parser.add_argument("--precision", choices=("bfloat16", "int8"), default="bfloat16",
                        help="the query's precision compared with float32")
    args = parser.parse_args()
    torch.set_num_threads(1)
    enc = encoder_with_half(args.precision)
    if args.store:
        on_store(enc, args.store, args.n)
    else:
        on_locomo(enc)


if __name__ == "__main__":
    main()
