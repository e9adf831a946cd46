"""What the model work costs: calls per 100 messages and model tokens read per transcript token.

LoCoMo's 4 development conversations are posted, each as one chat, to a real sidecar process in
`openai` mode whose model is the recording fake of tests/helpers (a real HTTP server on loopback).
The fake answers every task with a small valid answer (so nothing is retried for its form), and
records every prompt it was sent. When the queue is empty the bench prints, per task and in all:
model calls, calls per 100 messages, prompt tokens (system + user, counted with our tokenizer)
and **model tokens read per transcript token** (all prompt tokens of all jobs, instructions
included, divided by the tokens of the transcript's messages).

    HF_HUB_OFFLINE=1 OPENBLAS_NUM_THREADS=1 python bench/model_cost.py [--conversations 4] [--per-post 2]

The sidecar reads the transcript in parts (MJ1) with the default `part_tokens`; its part wait is
`CHRONICLER_PART_WAIT_SECONDS` (60 here) so that the last part of each chat is read soon after.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import requests  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
from locomo_proto import load  # noqa: E402
from locomo_retrieval import DEFAULT_DATA, TOKEN, drain, free_port, ingest, stop, wait_ready  # noqa: E402

from server_plugin.core.tokens import get_counter  # noqa: E402
from tests.helpers.episodes import EMPTY, sections_of, task_of  # noqa: E402
from tests.helpers.fakellm import FakeLLM  # noqa: E402

def respond(body: dict[str, Any]) -> str:
    """A small valid answer to every task (a shared call: to each of its sections)."""
    if task_of(body) == "part_notes":
        return json.dumps({k: EMPTY[t] for k, t in sections_of(body["messages"][0]["content"]).items()})
    return json.dumps(EMPTY[task_of(body)])


def start(data_dir: str, log_path: str, model_url: str) -> tuple[Any, str]:
    import subprocess
    port = free_port()
    env = {**os.environ, "CHRONICLER_TOKEN": TOKEN, "CHRONICLER_LLM_MODE": "openai",
           "CHRONICLER_LLM_URL": model_url, "CHRONICLER_LLM_MODEL": "fake",
           "CHRONICLER_WORKER_ENABLED": "true", "CHRONICLER_JOBS_LIST_MAX": "100000",
           "CHRONICLER_JOB_BACKOFF_BASE_SECONDS": "0", "CHRONICLER_LLM_BACKOFF_BASE": "0",
           # A conversation is posted in less than this: its parts fill by size (MJ1); the last one
           # of each chat is read once it has waited this long (the product's default is 600 s).
           "CHRONICLER_PART_WAIT_SECONDS": os.environ.get("CHRONICLER_PART_WAIT_SECONDS", "60"),
           "PYTHONPATH": str(ROOT)}
    log = open(log_path, "w")
    proc = subprocess.Popen([sys.executable, "-m", "server_plugin.cli", "serve", "--port", str(port),
                             "--data-dir", data_dir], env=env, cwd=ROOT, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)
    log.close()
    return proc, f"http://127.0.0.1:{port}/v1"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default=str(DEFAULT_DATA))
    parser.add_argument("--conversations", type=int, default=4)
    parser.add_argument("--per-post", type=int, default=200,
                        help="messages per request: 2 posts a turn at a time, as in play (default 200: whole sessions)")
    args = parser.parse_args()
    convs = load(Path(args.data))[: args.conversations]
    counter = get_counter()
    fake = FakeLLM().start()
    fake.responder = respond
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        proc, base = start(tmp, os.path.join(tmp, "sidecar.log"), fake.url)
        try:
            session = requests.Session()
            session.headers["Authorization"] = f"Bearer {TOKEN}"
            wait_ready(session, base, proc)
            for conv in convs:
                ingest(session, base, conv, args.per_post)
            counts = drain(session, base)
            failed = session.get(f"{base}/jobs", params={"state": "failed", "limit": 5}).json()["jobs"]
        finally:
            stop(proc)
    fake.stop()
    messages = sum(len(c.turns) for c in convs)
    transcript = sum(counter.count(t.text) for c in convs for t in c.turns)
    calls: Counter[str] = Counter()
    read: Counter[str] = Counter()
    for body in fake.completions():
        task = task_of(body)
        calls[task] += 1
        read[task] += sum(counter.count(m["content"]) for m in body["messages"])
    print(f"{len(convs)} conversations, {messages} messages ({args.per_post} per post), {transcript} transcript tokens; "
          f"jobs {counts}; {time.monotonic() - t0:.0f} s\n")
    for job in failed:  # a failed job is a defect to look at, not a cost saved
        print(f"failed: {job['kind']}: {(job['error'] or '')[:300]}")
    print("| task | calls | calls / 100 messages | prompt tokens | read / transcript token |")
    print("| --- | --- | --- | --- | --- |")
    for task, n in calls.most_common():
        print(f"| {task} | {n} | {100 * n / messages:.1f} | {read[task]} | {read[task] / transcript:.2f} |")
    total, tokens = sum(calls.values()), sum(read.values())
    print(f"| **all** | {total} | {100 * total / messages:.1f} | {tokens} | **{tokens / transcript:.2f}** |")


if __name__ == "__main__":
    main()
