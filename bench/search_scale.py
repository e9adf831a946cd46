"""Search at campaign scale: is the design fast enough at ~13,000 items / ~40,000 vectors?

Builds a synthetic store the size the issue names (10,000 messages, 2,000 memories, 500 lore
cards, 300 character memories, 300 summaries) from LoCoMo turns, in a SQLite file under /tmp laid
out as the real store would be (see docs/search.md), then measures:

- write cost per item (term counts, cues, one row + its vectors in one transaction);
- cold load of the in-memory search corpus from SQLite (what a restart or a rebuild costs);
- the ranking (`ranking.rank`, all channels, a per-viewer mask) at that size, p50/p95;
- the alternatives: sqlite-vec KNN (`k`), numpy brute force at 40k vectors, FTS5 `bm25()`.

Vectors are random unit vectors (their values do not change the timings); query embedding is
measured by bench/locomo_proto.py (~10 ms) and adds to the scoring time here.

    OPENBLAS_NUM_THREADS=1 python bench/search_scale.py
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from server_plugin.core.text import BM25_STOP_WORDS  # noqa: E402
from server_plugin.retrieval import ranking as R  # noqa: E402
from server_plugin.retrieval.search import params_of  # noqa: E402
from server_plugin.settings import defaults  # noqa: E402

SHIPPED = params_of(defaults())  # the ranking weights the search_* settings ship

try:  # the wheel that can load extensions (as server_plugin/db.py will)
    import pysqlite3.dbapi2 as sqlite3
except ImportError:  # pragma: no cover
    import sqlite3

import sqlite_vec  # noqa: E402

DIM = 384
DATA = "/work/shared/bench/locomo/locomo_dev.json"


def texts_from_locomo(path: str) -> tuple[list[tuple[str, str]], list[str]]:
    """(speaker, text) of every turn, and every question, of the LoCoMo file."""
    turns, questions = [], []
    for sample in json.loads(Path(path).read_text()):
        conv = sample["conversation"]
        n = 1
        while f"session_{n}" in conv:
            turns += [(t["speaker"], t["text"]) for t in conv[f"session_{n}"]]
            n += 1
        questions += [q["question"] for q in sample["qa"] if q.get("category") in (1, 2, 3, 4)]
    return turns, questions


def synth_items(turns, sizes: dict[str, int]) -> list[dict]:
    """Items of a campaign-sized store: messages in chats and sessions, then the other kinds."""
    items, t = [], 0

    def take(n: int) -> list[tuple[str, str]]:
        nonlocal t
        out = [turns[(t + i) % len(turns)] for i in range(n)]
        t += n
        return out

    per_session = 24
    for i, (speaker, text) in enumerate(take(sizes["message"])):
        chat = i // 1000  # 10 chats of 1,000 messages
        items.append(dict(kind="message", text=text, speaker=speaker, chat=chat,
                          session=f"{chat}:{(i % 1000) // per_session}", day=738000 + i // per_session))
    for kind, per in (("memory", 1), ("lore", 6), ("character_memory", 2), ("summary", 10)):
        for _ in range(sizes[kind]):
            text = " ".join(x for _, x in take(per))
            items.append(dict(kind=kind, text=text, speaker=None, chat=None, session=None, day=None))
    return items


def unit(rng: np.random.Generator, n: int) -> np.ndarray:
    v = rng.normal(size=(n, DIM)).astype(np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def connect(path: str):
    db = sqlite3.connect(path)
    db.enable_load_extension(True)
    sqlite_vec.load(db)
    db.enable_load_extension(False)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=NORMAL")
    return db


SCHEMA = """
CREATE TABLE search_docs (
  id INTEGER PRIMARY KEY, kind TEXT NOT NULL, ref_id TEXT NOT NULL, chat_id TEXT,
  session_key TEXT, position INTEGER, speaker_id TEXT, day INTEGER,
  content_len INTEGER NOT NULL, cues INTEGER NOT NULL, terms TEXT NOT NULL
);
CREATE VIRTUAL TABLE vec_docs USING vec0(embedding float[384]);
CREATE VIRTUAL TABLE vec_passages USING vec0(embedding float[384], +doc_id INTEGER);
CREATE VIRTUAL TABLE fts_docs USING fts5(text, tokenize='porter unicode61');
"""


def write_store(db, items: list[dict], rng: np.random.Generator) -> dict:
    """Insert every item as the store would: row, vector, passage vectors, one transaction each."""
    db.executescript(SCHEMA)
    per_item, n_sent = [], 0
    for i, it in enumerate(items):
        t0 = time.perf_counter()
        own = R.analyze(f"{it['speaker'] or ''}: {it['text']}")
        passages = R.chunks(it["text"], min_words=SHIPPED.passage_min_words)
        vec = unit(rng, 1 + (len(passages) if len(passages) > 1 else 0))
        with db:
            db.execute(
                "INSERT INTO search_docs VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                (i + 1, it["kind"], f"r{i}", it["chat"], it["session"], i, it["speaker"], it["day"],
                 sum(R.analyze(it["text"]).values()), R.temporal_cues(it["text"]), json.dumps(own)),
            )
            db.execute("INSERT INTO vec_docs(rowid, embedding) VALUES (?, ?)", (i + 1, vec[0].tobytes()))
            for v in vec[1:]:
                db.execute("INSERT INTO vec_passages(embedding, doc_id) VALUES (?, ?)", (v.tobytes(), i + 1))
            db.execute("INSERT INTO fts_docs(rowid, text) VALUES (?, ?)", (i + 1, it["text"]))
        n_sent += len(vec) - 1
        per_item.append((time.perf_counter() - t0) * 1e3)
    return {"items": len(items), "passage_vectors": n_sent,
            "write_ms_p50": float(np.percentile(per_item, 50)), "write_ms_p95": float(np.percentile(per_item, 95))}


def load_corpus(db, params: R.RankingParams) -> R.Corpus:
    """What search.py would do at start-up (or on a rebuild): SQLite -> in-memory corpus."""
    rows = db.execute(
        "SELECT id, kind, session_key, speaker_id, day, content_len, cues, terms, position "
        "FROM search_docs ORDER BY id").fetchall()
    ids = [r[0] for r in rows]
    pos = {d: i for i, d in enumerate(ids)}
    vecs = np.zeros((len(ids), DIM), dtype=np.float32)
    for rowid, blob in db.execute("SELECT rowid, embedding FROM vec_docs"):
        vecs[pos[rowid]] = np.frombuffer(blob, dtype=np.float32)
    owner, sv = [], []
    for doc_id, blob in db.execute("SELECT doc_id, embedding FROM vec_passages"):
        owner.append(pos[doc_id])
        sv.append(np.frombuffer(blob, dtype=np.float32))
    gids = R.group_ids([r[2] for r in rows])
    nbr = R.neighbour_index(gids, np.array([r[8] for r in rows]))
    return R.Corpus(
        ids=[str(i) for i in ids],
        terms=R.TermIndex.build([json.loads(r[7]) for r in rows]),
        vectors=vecs,
        gids=gids,
        speakers=[r[3] for r in rows],
        neighbours=nbr,
        win1_norm=R.window_norms(vecs, nbr, 1, params.window_weights),
        win2_norm=R.window_norms(vecs, nbr, 2, params.window_weights),
        sent_vectors=np.stack(sv) if sv else None,
        sent_owner=np.asarray(owner, dtype=np.int64),
        temporal=np.array([r[6] for r in rows], dtype=np.float64),
        content_len=np.array([r[5] for r in rows], dtype=np.float64),
        days=np.array([np.nan if r[4] is None else r[4] for r in rows], dtype=np.float64),
    )


def pct(xs: list[float]) -> str:
    return f"p50 {np.percentile(xs, 50):.2f} ms, p95 {np.percentile(xs, 95):.2f} ms"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=DATA)
    ap.add_argument("--db", default="/tmp/chronicler_bench/scale.sqlite")
    ap.add_argument("--messages", type=int, default=10_000)
    ap.add_argument("--queries", type=int, default=300)
    args = ap.parse_args(argv)

    rng = np.random.default_rng(0)
    turns, questions = texts_from_locomo(args.data)
    sizes = {"message": args.messages, "memory": 2000, "lore": 500, "character_memory": 300, "summary": 300}
    items = synth_items(turns, sizes)
    Path(args.db).parent.mkdir(parents=True, exist_ok=True)
    for suffix in ("", "-wal", "-shm"):
        Path(args.db + suffix).unlink(missing_ok=True)
    db = connect(args.db)
    params = SHIPPED
    cast = R.Cast.build([(s, [s]) for s in sorted({s for s, _ in turns})])

    print(f"## store: {sizes}")
    w = write_store(db, items, rng)
    print(f"write per item (terms, cues, row + vectors + FTS row, one transaction each): {json.dumps(w)}")
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    print(f"SQLite file: {Path(args.db).stat().st_size / 2**20:.1f} MiB")

    t0 = time.perf_counter()
    corpus = load_corpus(db, params)
    load_s = time.perf_counter() - t0
    n_sent = 0 if corpus.sent_vectors is None else len(corpus.sent_vectors)
    vec_mb = (corpus.vectors.nbytes + (0 if corpus.sent_vectors is None else corpus.sent_vectors.nbytes)) / 2**20
    n_post = sum(len(ix) for ix, _ in corpus.terms.postings.values())
    print(f"cold load into memory: {load_s:.2f} s; {len(corpus)} items + {n_sent} passage vectors "
          f"= {len(corpus) + n_sent} vectors ({vec_mb:.0f} MiB); {len(corpus.terms.postings)} terms, "
          f"{n_post} postings (~{n_post * 16 / 2**20:.0f} MiB as arrays)")

    # Per-viewer mask: this viewer knows 70% of the sessions and 70% of the other items.
    sess_ok = {g: rng.random() < 0.7 for g in set(corpus.gids.tolist())}
    mask = np.array([sess_ok[g] if g >= 0 else rng.random() < 0.7 for g in corpus.gids])
    qtexts = [questions[i % len(questions)] for i in range(args.queries)]
    qvecs = unit(rng, args.queries)
    queries = [R.prepare_query(t, cast, v, params) for t, v in zip(qtexts, qvecs)]
    for q in queries[:5]:
        R.top_k(R.rank(corpus, q, params, mask), 10)  # warm up
    full, full_cpu, dense_t, bm25_t = [], [], [], []
    for q in queries:
        c0 = time.process_time()
        t0 = time.perf_counter()
        R.top_k(R.rank(corpus, q, params, mask), 10)
        full.append((time.perf_counter() - t0) * 1e3)
        full_cpu.append((time.process_time() - c0) * 1e3)
        t0 = time.perf_counter()
        corpus.vectors @ q.vector
        if corpus.sent_vectors is not None:
            corpus.sent_vectors @ q.vector
        dense_t.append((time.perf_counter() - t0) * 1e3)
        t0 = time.perf_counter()
        R.bm25(corpus.terms, q.terms, k1=params.k1, b=params.b, mask=mask,
               neighbours=corpus.neighbours, neighbour_weights=params.neighbour_weights)
        bm25_t.append((time.perf_counter() - t0) * 1e3)
    print(f"\n## ranking at {len(corpus)} items, all channels, viewer mask ({mask.mean():.0%} visible)")
    print(f"rank + top_k: {pct(full)} (CPU time: {pct(full_cpu)}; load average {os.getloadavg()[0]:.1f} "
          f"on {os.cpu_count()} cores)")
    print(f"  of which dense products ({len(corpus) + n_sent} vectors): {pct(dense_t)}")
    print(f"  of which BM25 with neighbour context at query time: {pct(bm25_t)}")

    # Alternatives at 40,000 vectors.
    print("\n## alternatives at 40,000 vectors")
    big = unit(rng, 40_000)
    db.execute("CREATE VIRTUAL TABLE vec_big USING vec0(embedding float[384] distance_metric=cosine)")
    with db:
        db.executemany("INSERT INTO vec_big(rowid, embedding) VALUES (?, ?)",
                       ((i + 1, v.tobytes()) for i, v in enumerate(big)))
    for k in (10, 100, 1000):
        ts = []
        for q in qvecs[:50]:
            t0 = time.perf_counter()
            db.execute("SELECT rowid, distance FROM vec_big WHERE embedding MATCH ? AND k = ?",
                       (q.tobytes(), k)).fetchall()
            ts.append((time.perf_counter() - t0) * 1e3)
        print(f"sqlite-vec vec0 KNN k={k}: {pct(ts)}")
    ts = []
    for q in qvecs[:100]:
        t0 = time.perf_counter()
        s = big @ q
        np.argpartition(-s, 100)[:100]
        ts.append((time.perf_counter() - t0) * 1e3)
    print(f"numpy brute force, all 40,000 cosines + top 100: {pct(ts)}")
    t0 = time.perf_counter()
    loaded = np.stack([np.frombuffer(b, dtype=np.float32)
                       for (b,) in db.execute("SELECT embedding FROM vec_big")])
    print(f"loading 40,000 vectors from vec0 into numpy: {(time.perf_counter() - t0):.2f} s "
          f"({loaded.nbytes / 2**20:.0f} MiB)")

    ts = []
    for q in queries[:100]:
        words = [w for w in R.tokenize(q.text) if w not in BM25_STOP_WORDS]
        if not words:
            continue
        match = " OR ".join(f'"{w}"' for w in words)
        t0 = time.perf_counter()
        db.execute("SELECT rowid, bm25(fts_docs) FROM fts_docs WHERE fts_docs MATCH ? "
                   "ORDER BY bm25(fts_docs) LIMIT 1000", (match,)).fetchall()
        ts.append((time.perf_counter() - t0) * 1e3)
    print(f"FTS5 bm25() top 1,000 for the same queries (OR of words, no neighbour context): {pct(ts)}")
    db.close()


if __name__ == "__main__":
    main()
