"""The background jobs against a real model: the sidecar in `openai` mode, llama.cpp's
OpenAI-compatible server (`python -m llama_cpp.server`) on loopback, and a roleplay of two
sessions (`roleplay_saltmarsh.py`: 104 messages, three characters, a secret).

Per job kind it prints: jobs, answers used on the first try, after the retry, fallbacks; parts of
answers dropped or changed (MJ2 notes); quotes proposed, kept and dropped (not verbatim, wrong
speaker, other); tokens read and written; time with the model. Then it checks every stored quote
(summaries, sessions, episodes, told events) against the transcript: verbatim in its message, and
said by its stored speaker. Nothing here is a test; llama.cpp and the model live outside the
repository (a folder under /work/bench_cache, never a dependency of the product).

    nice python bench/real_model.py --model /work/bench_cache/models/X.gguf \\
        --llama-python /work/bench_cache/llama_venv/bin/python [--messages 104]
    nice python bench/real_model.py --model X.gguf --node-llama /work/bench_cache/nodellama
    nice python bench/real_model.py --url http://127.0.0.1:8080/v1 --json-mode json_schema

`--node-llama DIR`: instead of llama-cpp-python (no wheel here; its build from source takes hours on
a loaded 2-core machine), llama.cpp through node-llama-cpp's prebuilt binaries
(`npm install --prefix DIR node-llama-cpp@3.22.1`) behind bench/llama_server.mjs.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Iterator

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import requests  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
import roleplay_saltmarsh as story  # noqa: E402

from server_plugin.core.quotes import find_verbatim, speaker_said  # noqa: E402

TOKEN = "bench-token-0123456789"
CHAT = "saltmarsh"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url: str, proc: subprocess.Popen, seconds: float, headers: dict | None = None) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{proc.args[0]} exited; see its log")
        try:
            if requests.get(url, timeout=2, headers=headers).status_code < 500:
                return
        except requests.RequestException:
            pass
        time.sleep(0.5)
    raise SystemExit(f"{url} did not answer within {seconds} s")


def start_llama(python: str, model: str, log: str, ctx: int) -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen([python, "-m", "llama_cpp.server", "--model", model, "--host", "127.0.0.1",
                             "--port", str(port), "--n_ctx", str(ctx), "--n_threads", "2"],
                            stdout=open(log, "w"), stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}/v1"
    wait_http(f"{base}/models", proc, 300)
    return proc, base


def start_node_llama(modules: str, model: str, log: str, ctx: int) -> tuple[subprocess.Popen, str]:
    """llama.cpp through node-llama-cpp behind bench/llama_server.mjs (OpenAI-compatible)."""
    port = free_port()
    proc = subprocess.Popen(["node", str(ROOT / "bench" / "llama_server.mjs"), "--modules", modules,
                             "--model", model, "--port", str(port), "--ctx", str(ctx), "--threads", "2"],
                            stdout=open(log, "w"), stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}/v1"
    wait_http(f"{base}/models", proc, 300)
    return proc, base


def start_sidecar(data_dir: str, log: str, model_url: str, ctx: int, part_wait: float) -> tuple[subprocess.Popen, str]:
    """The sidecar in `openai` mode, told the model's context (`llm_context_tokens`: it sizes the
    parts of MJ1) and how long a part smaller than `part_tokens` waits before it is read."""
    port = free_port()
    env = {**os.environ, "CHRONICLER_TOKEN": TOKEN, "CHRONICLER_LLM_MODE": "openai",
           "CHRONICLER_LLM_URL": model_url, "CHRONICLER_LLM_MODEL": "local",
           "CHRONICLER_LLM_READ_TIMEOUT": "300", "CHRONICLER_WORKER_ENABLED": "true",
           "CHRONICLER_JOBS_LIST_MAX": "100000", "CHRONICLER_JOB_BACKOFF_BASE_SECONDS": "1",
           "CHRONICLER_EPISODES_PROMPT_MAX_TOKENS": str(max(1000, ctx // 2)),
           "CHRONICLER_LLM_CONTEXT_TOKENS": str(ctx), "CHRONICLER_PART_WAIT_SECONDS": str(part_wait),
           "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "server_plugin.cli", "serve", "--port", str(port),
                             "--data-dir", data_dir], env=env, cwd=ROOT, stdout=open(log, "w"),
                            stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}/v1"
    wait_http(f"{base}/health", proc, 300, {"Authorization": f"Bearer {TOKEN}"})
    return proc, base


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def messages(limit: int) -> Iterator[tuple[int, dict[str, Any]]]:
    """(session, message) in order: session 2 a day after session 1, a minute between messages."""
    at = datetime(2025, 3, 1, 18, tzinfo=timezone.utc)
    index = 0
    for n, lines in ((1, story.SESSION_1), (2, story.SESSION_2)):
        for i, (who, text) in enumerate(lines):
            if index >= limit:
                return
            c = story.CAST[who]
            yield n, {"id": f"s{n}m{i + 1}", "role": "user" if c.get("is_player") else "assistant",
                      "name": c["name"], "text": text, "speaker_id": f"{who}.png", "index": index,
                      "sent_at": (at + timedelta(minutes=i)).strftime("%Y-%m-%dT%H:%M:%S.000Z")}
            index += 1
        at += timedelta(days=1)


def ingest(s: requests.Session, base: str, limit: int) -> dict[str, dict[str, Any]]:
    for who, c in story.CAST.items():
        sheet = {}
        if who == story.SECRET["character"]:
            sheet = {"secrets": [{"text": story.SECRET["text"], "known_by": [f"{who}.png"]}]}
        s.put(f"{base}/characters/{who}.png", json={"name": c["name"], "aliases": c.get("aliases", []),
                                                     "is_player": bool(c.get("is_player")),
                                                     **({"sheet": sheet} if sheet else {})}).raise_for_status()
    url = f"{base}/chats/{CHAT}"
    s.put(url, json={"member_ids": [f"{w}.png" for w in story.CAST]}).raise_for_status()
    by_session: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for n, m in messages(limit):
        by_session[n].append(m)
    sent: dict[str, dict[str, Any]] = {}
    for n in sorted(by_session):
        for i in range(0, len(by_session[n]), 2):  # a turn at a time, as the extension posts
            batch = by_session[n][i:i + 2]
            s.post(f"{url}/messages", json={"messages": batch}, timeout=300).raise_for_status()
            sent.update({m["id"]: m for m in batch})
        s.post(f"{url}/sessions/end", json={}).raise_for_status()
    return sent


def drain(s: requests.Session, base: str, budget: float) -> float:
    started = time.monotonic()
    while time.monotonic() - started < budget:
        counts = s.get(f"{base}/jobs", params={"limit": 1}).json()["counts"]
        if counts["pending"] == 0 and counts["running"] == 0:
            break
        time.sleep(2)
    return time.monotonic() - started


def quotes_in(data: Any) -> Iterator[dict[str, Any]]:
    """Every stored quote in an API answer: an object with speaker, text and message_id."""
    if isinstance(data, dict):
        if {"speaker", "text", "message_id"} <= set(data):
            yield data
        for v in data.values():
            yield from quotes_in(v)
    elif isinstance(data, list):
        for v in data:
            yield from quotes_in(v)


def check_stored(s: requests.Session, base: str, sent: dict[str, dict[str, Any]]) -> Counter:
    """Stored quotes: verbatim in their message, and said by their stored speaker."""
    found = []
    for path in (f"/chats/{CHAT}/summaries", f"/chats/{CHAT}/sessions", "/episodes", "/told"):
        found += list(quotes_in(s.get(f"{base}{path}", params={"chat_id": CHAT} if path[1] != "c" else None).json()))
    for n in (1, 2):
        found += list(quotes_in(s.get(f"{base}/chats/{CHAT}/sessions/{n}").json()))
    cast = [(c["name"], *c.get("aliases", [])) for c in story.CAST.values()]
    out: Counter = Counter()
    seen = set()
    for q in found:
        key = (q["speaker"], q["text"], q["message_id"])
        if key in seen:
            continue
        seen.add(key)
        m = sent.get(q["message_id"])
        if m is None or find_verbatim(q["text"], m["text"]) is None:
            out["not_verbatim"] += 1
        elif speaker_said(q["speaker"], (m["name"],), m["text"], q["text"], cast=cast) is None:
            out["wrong_speaker"] += 1
        else:
            out["good"] += 1
    return out


def report(jobs: list[dict[str, Any]], stats: dict[str, Any], stored: Counter, wall: float) -> None:
    rows: dict[str, Counter] = defaultdict(Counter)
    for j in jobs:
        r, model = j.get("result") or {}, (j.get("result") or {}).get("model") or {}
        c = rows[j["kind"]]
        c["jobs"] += 1
        c[model.get("answer") or j["state"]] += 1
        c["dropped"] += len(model.get("dropped") or [])
        c["changed"] += len(model.get("changed") or [])
        reasons = r.get("dropped_quote_reasons") or {}
        c["q_dropped"] += int(r.get("dropped_quotes") or 0)
        c["q_not_verbatim"] += int(reasons.get("not_verbatim", 0))
        c["q_wrong_speaker"] += int(reasons.get("wrong_speaker", 0))
    print("| kind | jobs | first try | after retry | fell back | failed | parts dropped | changed |"
          " quotes dropped (not verbatim / wrong speaker) | prompt tok | completion tok | model s |")
    print("| --- | " + " | ".join(["---"] * 11) + " |")
    for kind, c in sorted(rows.items()):
        k = stats["by_kind"].get(kind, {})
        print(f"| {kind} | {c['jobs']} | {c['first_try']} | {c['retry']} | {c['fallback']} | {c['failed']} |"
              f" {c['dropped']} | {c['changed']} | {c['q_dropped']} ({c['q_not_verbatim']} / {c['q_wrong_speaker']}) |"
              f" {k.get('prompt_tokens', 0)} | {k.get('completion_tokens', 0)} | {k.get('model_ms', 0) / 1000:.0f} |")
    model_jobs = [j for j in jobs if (j.get("result") or {}).get("model")]
    used = sum(1 for j in model_jobs if j["result"]["model"]["answer"] in ("first_try", "retry"))
    print(f"\nmodel jobs {len(model_jobs)}, with a used model answer {used} "
          f"({100 * used / max(1, len(model_jobs)):.0f} %); stored quotes: {dict(stored)}; "
          f"tokens {stats['total']['prompt_tokens']} read + {stats['total']['completion_tokens']} written; "
          f"wall {wall:.0f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="a GGUF file for llama.cpp")
    parser.add_argument("--fake", action="store_true",
                        help="the recording fake model instead (checks this script, measures nothing)")
    parser.add_argument("--llama-python", default="/work/bench_cache/llama_venv/bin/python")
    parser.add_argument("--node-llama", help="a folder with node-llama-cpp installed: serve the model with it")
    parser.add_argument("--url", help="an OpenAI-compatible server already running (its /v1 URL) instead")
    parser.add_argument("--json-mode", default="off", choices=("off", "json_object", "json_schema"),
                        help="the sidecar's llm_json_mode (json_schema: llama.cpp holds the answer to each task's shape)")
    parser.add_argument("--messages", type=int, default=10_000)
    parser.add_argument("--ctx", type=int, default=8192, help="the model's context (the server's and the sidecar's)")
    parser.add_argument("--part-wait", type=float, default=30.0,
                        help="part_wait_seconds: the ingest is fast, so the last part is read after this")
    parser.add_argument("--budget", type=float, default=5400.0, help="most seconds to wait for the jobs")
    args = parser.parse_args()
    if not args.fake and not args.model and not args.url:
        parser.error("--model, --url or --fake is needed")
    os.environ["CHRONICLER_LLM_JSON_MODE"] = args.json_mode
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        if args.fake:
            from model_cost import respond
            from tests.helpers.fakellm import FakeLLM
            fake = FakeLLM().start()
            fake.responder = respond
            llama, model_url = None, fake.url
        elif args.url:
            llama, model_url = None, args.url
        else:
            log = os.path.join(tmp, "llama.log")
            llama, model_url = (start_node_llama(args.node_llama, args.model, log, args.ctx) if args.node_llama
                                else start_llama(args.llama_python, args.model, log, args.ctx))
        try:
            sidecar, base = start_sidecar(os.path.join(tmp, "data"), os.path.join(tmp, "sidecar.log"),
                                          model_url, args.ctx, args.part_wait)
            try:
                s = requests.Session()
                s.headers["Authorization"] = f"Bearer {TOKEN}"
                sent = ingest(s, base, args.messages)
                drain(s, base, args.budget)
                jobs = s.get(f"{base}/jobs", params={"chat_id": CHAT, "limit": 10000}).json()["jobs"]
                stats = s.get(f"{base}/jobs/stats", params={"chat_id": CHAT}).json()
                stored = check_stored(s, base, sent)
                print(f"model {Path(args.model).name if args.model else args.url or 'fake'}, "
                      f"json mode {args.json_mode}, {len(sent)} messages")
                report(jobs, stats, stored, time.monotonic() - t0)
            finally:
                stop(sidecar)
        finally:
            if llama is not None:
                stop(llama)
            elif args.fake:
                fake.stop()


if __name__ == "__main__":
    main()
