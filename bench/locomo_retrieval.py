"""LoCoMo retrieval through the product: a real sidecar process, its HTTP API and its store (SW6).

Each LoCoMo conversation becomes a chat of one store: its two speakers are registered characters
(name plus the nicknames the transcript uses, as a person would type them as aliases), every turn
is posted as a message with its speaker and session date (one POST per LoCoMo session), and
`POST /v1/chats/{id}/sessions/end` closes each session. The sidecar runs its background jobs
(extractive mode: session summaries, summaries, deep memories) until none is left. Then, for every
question of categories 1-4:

1. `POST /v1/search {query, chat_id, kinds: ["message"], k: 50}`: recall@5/@10/@20 of the evidence
   turns (share of a question's evidence in the top k, averaged), MRR of the first evidence turn
   (within the 50), per category and overall; and the query latency over HTTP (embedding included).
2. `POST /v1/search {query, chat_id, k: 50}` over every kind: results, best first, fill a
   1,000-token memory bank (tokens counted with tokens.py; a result that does not fit is skipped,
   the next is tried); reported: the share of questions all of whose evidence turns are cited
   (`source_message_ids`) by what fits, and the mean share of evidence cited.

    HF_HUB_OFFLINE=1 OPENBLAS_NUM_THREADS=1 python bench/locomo_retrieval.py
    ... --data /tmp/locomo/locomo10.json --exclude conv-26,conv-30,conv-41,conv-42

The default data is `../shared/bench/locomo/locomo_dev.json` relative to the repository (the
nearest such folder upwards; the 4 development conversations the weights were tuned on). Numbers are printed as markdown tables.
"""

from __future__ import annotations

import argparse
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import requests  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
from locomo_proto import CATEGORIES, Conversation, load  # noqa: E402

from server_plugin.core.tokens import get_counter  # noqa: E402

DEV_FILE = Path("shared") / "bench" / "locomo" / "locomo_dev.json"
# ../shared relative to the repository (a git worktree may sit one folder deeper: look upwards).
DEFAULT_DATA = next((p / DEV_FILE for p in ROOT.parents if (p / DEV_FILE).exists()), ROOT.parent / DEV_FILE)
TOKEN = "bench-token-0123456789"
KS = (5, 10, 20)
DEPTH = 50  # results asked per query (MRR is within these)
BANK_TOKENS = 1000


# --- the sidecar -------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_sidecar(data_dir: str, log_path: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    env = {**os.environ, "CHRONICLER_TOKEN": TOKEN, "CHRONICLER_LLM_MODE": "extractive",
           "CHRONICLER_WORKER_ENABLED": "true", "CHRONICLER_JOBS_LIST_MAX": "100000",
           "OPENBLAS_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    log = open(log_path, "w")
    proc = subprocess.Popen([sys.executable, "-m", "server_plugin.cli", "serve", "--port", str(port),
                             "--data-dir", data_dir], env=env, cwd=ROOT, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)
    log.close()
    return proc, f"http://127.0.0.1:{port}/v1"


def wait_ready(session: requests.Session, base: str, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit("the sidecar exited; see its log")
        try:
            health = session.get(f"{base}/health", timeout=2).json()
            if health["embedder"]["ready"] and health.get("search", {}).get("ready", True):
                return
        except (requests.ConnectionError, requests.Timeout, ValueError):
            pass  # starting, or a busy machine answering slowly: ask again
        time.sleep(0.2)
    raise SystemExit("the sidecar did not become ready within 300 s")


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


# --- ingesting one conversation ------------------------------------------------------------------
def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def aliases(conv: Conversation, name: str) -> list[str]:
    """Nicknames a person would list: capitalised words of the transcript that are a proper prefix
    (3+ letters) of the name ("Mel" for Melanie)."""
    words = set(re.findall(r"\b[A-Z][a-z]{2,}\b", " ".join(t.text for t in conv.turns)))
    return sorted(w for w in words if w != name and name.startswith(w))


def session_time(date: str, fallback: datetime) -> datetime:
    """LoCoMo's '1:56 pm on 8 May, 2023' as a UTC time (the previous session's + 1 day if odd)."""
    try:
        return datetime.strptime(date.strip(), "%I:%M %p on %d %B, %Y").replace(tzinfo=timezone.utc)
    except ValueError:
        return fallback + timedelta(days=1)


def ingest(session: requests.Session, base: str, conv: Conversation, per_post: int = 200) -> None:
    """Post one conversation as one chat (message ids are LoCoMo's dia ids), `per_post` messages
    per request (2: a turn at a time, as in play)."""
    chat = f"locomo {conv.sample_id}"
    ids = {name: f"{conv.sample_id}-{slug(name)}" for name in conv.speakers}
    for name, cid in ids.items():
        session.put(f"{base}/characters/{cid}", json={"name": name, "aliases": aliases(conv, name),
                                                      "is_player": name == conv.speakers[0]}
                    ).raise_for_status()
    url = f"{base}/chats/{requests.utils.quote(chat, safe='')}"
    session.put(url, json={"member_ids": list(ids.values())}).raise_for_status()
    by_session: dict[int, list[Any]] = defaultdict(list)
    for t in conv.turns:
        by_session[t.session].append(t)
    when = datetime(2020, 1, 1, tzinfo=timezone.utc)
    index = 0
    for n in sorted(by_session):
        when = session_time(by_session[n][0].date, when)
        batch = []
        for i, t in enumerate(by_session[n]):
            batch.append({"id": t.dia_id, "role": "user" if t.speaker == conv.speakers[0] else "assistant",
                          "name": t.speaker, "text": t.text, "speaker_id": ids[t.speaker], "index": index,
                          "sent_at": (when + timedelta(seconds=30 * i)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")})
            index += 1
        for start in range(0, len(batch), per_post):
            session.post(f"{url}/messages", json={"messages": batch[start:start + per_post]},
                         timeout=300).raise_for_status()
        session.post(f"{url}/sessions/end", json={}).raise_for_status()


def drain(session: requests.Session, base: str) -> dict[str, int]:
    while True:
        counts = session.get(f"{base}/jobs", params={"limit": 1}).json()["counts"]
        if counts["pending"] == 0 and counts["running"] == 0:
            return counts
        time.sleep(0.5)


# --- measuring ---------------------------------------------------------------------------------------
def ask(session: requests.Session, base: str, body: dict[str, Any]) -> tuple[list[dict], float]:
    t = time.perf_counter()
    response = session.post(f"{base}/search", json=body, timeout=60)
    ms = (time.perf_counter() - t) * 1000
    response.raise_for_status()
    return response.json()["results"], ms


def bank(results: list[dict], counter: Any, budget: int = BANK_TOKENS) -> set[str]:
    """Message ids cited by the results that fit the budget, best first (a result too big for
    what is left is skipped)."""
    used, cited = 0, set()
    for r in results:
        cost = counter.count(r["text"])
        if used + cost > budget:
            continue
        used += cost
        cited.update(r["source_message_ids"])
    return cited


def run(session: requests.Session, base: str, convs: list[Conversation]) -> dict[str, Any]:
    counter = get_counter()
    turn_rows: dict[Any, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    bank_rows: dict[Any, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    latencies: list[float] = []
    kinds_seen: dict[str, int] = defaultdict(int)
    for conv in convs:
        chat = f"locomo {conv.sample_id}"
        for q in conv.questions:
            evidence = [conv.turns[i].dia_id for i in q.evidence]
            results, ms = ask(session, base, {"query": q.text, "chat_id": chat, "kinds": ["message"],
                                              "k": DEPTH})
            latencies.append(ms)
            ranked = [r["id"] for r in results]
            ranks = sorted(ranked.index(e) for e in evidence if e in ranked)
            row = {f"R@{k}": sum(r < k for r in ranks) / len(evidence) for k in KS}
            row["MRR"] = 1.0 / (ranks[0] + 1) if ranks else 0.0
            every, _ = ask(session, base, {"query": q.text, "chat_id": chat, "k": DEPTH})
            cited = bank(every, counter)
            for r in every:
                kinds_seen[r["kind"]] += 1
            got = sum(e in cited for e in evidence)
            brow = {"all cited": float(got == len(evidence)), "share cited": got / len(evidence)}
            for key in (q.category, "all"):
                turn_rows[key]["n"] += 1
                bank_rows[key]["n"] += 1
                for name, v in row.items():
                    turn_rows[key][name] += v
                for name, v in brow.items():
                    bank_rows[key][name] += v
    return {"turns": turn_rows, "bank": bank_rows, "latencies": latencies, "kinds": dict(kinds_seen)}


def table(rows: dict[Any, dict[str, float]], columns: list[str]) -> str:
    out = ["| category | n | " + " | ".join(columns) + " |", "| --- | --- |" + " --- |" * len(columns)]
    for key in [1, 2, 3, 4, "all"]:
        if key not in rows:
            continue
        r = rows[key]
        name = "**overall**" if key == "all" else CATEGORIES[key]
        out.append(f"| {name} | {int(r['n'])} | " + " | ".join(f"{r[c] / r['n']:.3f}" for c in columns) + " |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=str(DEFAULT_DATA), help="a LoCoMo JSON file (default: the dev 4)")
    ap.add_argument("--only", default="", help="comma-separated sample ids to use (default: all)")
    ap.add_argument("--exclude", default="", help="comma-separated sample ids to leave out")
    ap.add_argument("--keep", default="", help="keep the store in this folder (default: a temporary one)")
    args = ap.parse_args(argv)
    convs = load(args.data)
    if args.only:
        convs = [c for c in convs if c.sample_id in args.only.split(",")]
    if args.exclude:
        convs = [c for c in convs if c.sample_id not in args.exclude.split(",")]
    if not convs:
        raise SystemExit("no conversation left to run")
    with tempfile.TemporaryDirectory() as tmp:
        data_dir = args.keep or os.path.join(tmp, "data")
        log_path = os.path.join(tmp, "sidecar.log") if not args.keep else os.path.join(args.keep, "sidecar.log")
        os.makedirs(data_dir, exist_ok=True)
        proc, base = start_sidecar(data_dir, log_path)
        try:
            session = requests.Session()
            session.headers["Authorization"] = f"Bearer {TOKEN}"
            wait_ready(session, base, proc)
            started = time.perf_counter()
            turns = 0
            for conv in convs:
                ingest(session, base, conv)
                turns += len(conv.turns)
            posted = time.perf_counter() - started
            counts = drain(session, base)
            drained = time.perf_counter() - started
            print(f"data: {args.data} — {len(convs)} conversations ({', '.join(c.sample_id for c in convs)}), "
                  f"{turns} turns, {sum(len(c.questions) for c in convs)} questions (categories 1-4)")
            print(f"ingest: {posted:.0f} s for {turns} messages over HTTP; jobs done after {drained:.0f} s "
                  f"({counts})")
            health = session.get(f"{base}/health").json()
            print(f"search index: {health.get('search')}; load average {os.getloadavg()}")
            result = run(session, base, convs)
        finally:
            stop(proc)
    lat = sorted(result["latencies"])
    print("\n### Turn retrieval: POST /v1/search, kinds [message] (evidence turns in the top k)")
    print(table(result["turns"], ["R@5", "R@10", "R@20", "MRR"]))
    print(f"\nquery latency over HTTP, embedding included ({len(lat)} queries, k={DEPTH}): "
          f"p50 {statistics.median(lat):.1f} ms, p95 {lat[int(0.95 * len(lat)) - 1]:.1f} ms, "
          f"max {lat[-1]:.1f} ms")
    print(f"\n### Memory bank: every kind, top results filling {BANK_TOKENS} tokens (evidence cited by what fits)")
    print(table(result["bank"], ["all cited", "share cited"]))
    print(f"\nkinds among the top {DEPTH} of the every-kind searches: {result['kinds']}")


if __name__ == "__main__":
    main()
