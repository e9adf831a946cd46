"""Ingest a 2,000-message chat through the HTTP API of a real sidecar, then wait for its jobs.

The chat is LoCoMo's four development conversations (/work/shared/bench/locomo, 2,080 messages over
99 sessions days apart) laid end to end in one chat, cut at --messages; or, with --generated, a
plausible generated roleplay. It is posted one turn at a time (two messages per POST, the second
with a turn id), as the extension does, to a sidecar process in `extractive` mode with its worker
thread on. Prints messages/second ingested, POST latency, and the time from the last POST until
every job (chunk summaries, merges, session summaries, deep memory) is done.

With --drain-after the worker is off while the chat is posted; the sidecar is then restarted with
its worker on (the queued jobs survive the restart) and the time to drain the whole backlog is
measured: the cost of the jobs themselves, without ingestion competing for the two cores.

    .venv/bin/python bench/ingest.py [--messages 2000] [--generated] [--drain-after]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Iterator

import requests

ROOT = Path(__file__).resolve().parent.parent
LOCOMO = Path("/work/shared/bench/locomo/locomo_dev.json")
TOKEN = "bench-token-0123456789"
CHAT = "bench chat@ingest"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") + ".png"


def locomo_messages() -> Iterator[dict[str, Any]]:
    """LoCoMo's conversations one after another, each shifted to start 30 days after the last."""
    start = datetime(2024, 1, 1, tzinfo=timezone.utc)
    for sample in json.loads(LOCOMO.read_text()):
        conv = sample["conversation"]
        user = conv["speaker_a"]  # speaker_a plays the user, speaker_b the character
        numbers = sorted(int(k.split("_")[1]) for k in conv if re.fullmatch(r"session_\d+", k))
        first = datetime.strptime(conv[f"session_{numbers[0]}_date_time"], "%I:%M %p on %d %B, %Y")
        last = start
        for n in numbers:
            when = datetime.strptime(conv[f"session_{n}_date_time"], "%I:%M %p on %d %B, %Y")
            at = start + (when - first)
            for i, turn in enumerate(conv[f"session_{n}"]):
                text = turn["text"] + (f" [shares {turn['blip_caption']}]" if turn.get("blip_caption") else "")
                last = at + timedelta(minutes=i)
                yield {"speaker": turn["speaker"], "is_user": turn["speaker"] == user, "text": text,
                       "at": last, "id": f"{sample['sample_id']}:{turn['dia_id']}"}
        start = last + timedelta(days=30)


PLACES = ["the harbour", "the old mill", "the lighthouse", "the market", "the chapel", "the forest road"]


def generated_messages(n: int) -> Iterator[dict[str, Any]]:
    """A roleplay between Kai (the player) and Ayla, sessions of 80 messages a day apart."""
    at = datetime(2024, 1, 1, 18, tzinfo=timezone.utc)
    for i in range(n):
        if i and i % 80 == 0:
            at += timedelta(days=1)
        at += timedelta(minutes=1)
        place = PLACES[i % len(PLACES)]
        if i % 2 == 0:
            text = f"*Kai walks to {place}.* \"Ayla, did you see the lantern number {i}? I promise I'll find it.\""
        else:
            text = (f"*Ayla looks toward {place}, her cloak heavy with rain.* \"I saw lantern {i} burning "
                    f"near the water, Kai. My brother Tomas kept it lit for years.\" She frowns.")
        yield {"speaker": "Kai" if i % 2 == 0 else "Ayla", "is_user": i % 2 == 0, "text": text, "at": at,
               "id": f"g{i}"}


def as_message(m: dict[str, Any], index: int, turn: int) -> dict[str, Any]:
    return {"id": m["id"], "role": "user" if m["is_user"] else "assistant", "name": m["speaker"],
            "text": m["text"], "sent_at": m["at"].strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
            "speaker_id": slug(m["speaker"]), "index": index, "turn_id": f"turn-{turn}"}


def start_sidecar(data_dir: str, worker: bool = True) -> tuple[subprocess.Popen, str]:
    port = free_port()
    env = {**os.environ, "CHRONICLER_TOKEN": TOKEN, "CHRONICLER_LLM_MODE": "extractive",
           "CHRONICLER_WORKER_ENABLED": str(worker).lower(), "CHRONICLER_JOBS_LIST_MAX": "100000",
           "OPENBLAS_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "server_plugin.cli", "serve", "--port", str(port),
                             "--data-dir", data_dir], env=env, cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return proc, f"http://127.0.0.1:{port}/v1"


def wait_ready(session: requests.Session, base: str) -> None:
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        try:
            health = session.get(f"{base}/health", timeout=2).json()
            if health["embedder"]["ready"]:
                return
        except (requests.ConnectionError, ValueError):
            pass
        time.sleep(0.2)
    raise SystemExit("the sidecar did not become ready within 180 s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=2000)
    parser.add_argument("--generated", action="store_true", help="a generated roleplay instead of LoCoMo")
    parser.add_argument("--drain-after", action="store_true",
                        help="worker off while posting; restart with it on and time the drain")
    args = parser.parse_args()
    source = generated_messages(args.messages) if args.generated else locomo_messages()
    chat = [m for _, m in zip(range(args.messages), source)]
    label = "generated" if args.generated else "LoCoMo (4 conversations)"
    with tempfile.TemporaryDirectory() as data_dir:
        proc, base = start_sidecar(data_dir, worker=not args.drain_after)
        try:
            session = client()
            wait_ready(session, base)
            ingest(session, base, chat, label)
            since = time.perf_counter()
            if args.drain_after:
                proc.terminate()
                proc.wait(20)
                since = time.perf_counter()  # the worker starts before the model has loaded
                proc, base = start_sidecar(data_dir, worker=True)
                session = client()
                wait_ready(session, base)
                print(f"restarted the sidecar with its worker on (ready after "
                      f"{time.perf_counter() - since:.1f} s; the drain is timed from the restart)")
            drain(session, base, since)
        finally:
            proc.terminate()
            proc.wait(20)


def client() -> requests.Session:
    session = requests.Session()
    session.headers["Authorization"] = f"Bearer {TOKEN}"
    return session


def chat_url(base: str) -> str:
    return f"{base}/chats/{requests.utils.quote(CHAT, safe='')}"


def counts(session: requests.Session, base: str) -> dict[str, int]:
    return session.get(f"{base}/jobs", params={"limit": 1}).json()["counts"]


def ingest(session: requests.Session, base: str, chat: list[dict[str, Any]], label: str) -> None:
    speakers = sorted({m["speaker"] for m in chat})
    for name in speakers:
        session.put(f"{base}/characters/{slug(name)}", json={"name": name}).raise_for_status()
    url = chat_url(base)
    session.put(url, json={"member_ids": [slug(n) for n in speakers], "context_tokens": 8192}
                ).raise_for_status()

    latencies = []
    started = time.perf_counter()
    for turn, i in enumerate(range(0, len(chat), 2)):
        batch = [as_message(m, i + k, turn) for k, m in enumerate(chat[i:i + 2])]
        t = time.perf_counter()
        response = session.post(f"{url}/messages", json={"messages": batch}, timeout=60)
        latencies.append((time.perf_counter() - t) * 1000)
        response.raise_for_status()
    ingest_s = time.perf_counter() - started
    latencies.sort()
    print(f"chat: {label}, {len(chat)} messages, {len(latencies)} POSTs of one turn each")
    print(f"ingest: {ingest_s:.1f} s = {len(chat) / ingest_s:.1f} messages/s "
          f"(POST median {statistics.median(latencies):.1f} ms, p95 "
          f"{latencies[int(len(latencies) * .95) - 1]:.1f} ms, max {latencies[-1]:.1f} ms)")
    print(f"jobs at the last POST: {counts(session, base)}")


def drain(session: requests.Session, base: str, started: float) -> None:
    while True:
        now = counts(session, base)
        if now["pending"] == 0 and now["running"] == 0:
            break
        time.sleep(0.1)
    drain_s = time.perf_counter() - started
    jobs = session.get(f"{base}/jobs", params={"chat_id": CHAT, "limit": 10000}).json()["jobs"]
    kinds: dict[str, int] = {}
    for job in jobs:
        kinds[job["kind"]] = kinds.get(job["kind"], 0) + 1
    url = chat_url(base)
    summaries = session.get(f"{url}/summaries").json()
    sessions = session.get(f"{url}/sessions").json()["sessions"]
    memories = session.get(f"{base}/memories", params={"chat_id": CHAT}).json()["memories"]
    print(f"drain: {drain_s:.1f} s until no job was pending or running ({now['done']} done, "
          f"{now['failed']} failed; by kind {kinds})")
    print(f"summaries: recent {len(summaries['recent'])}, consolidated {len(summaries['consolidated'])}, "
          f"long_term {len(summaries['long_term'])}, unsummarized {summaries['unsummarized_count']}; "
          f"sessions {len(sessions)} ({sum(s['state'] == 'summarized' for s in sessions)} summarised); "
          f"deep memories {len(memories)}")


if __name__ == "__main__":
    main()
