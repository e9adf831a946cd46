"""Latency of GET /v1/memories/for-turn over HTTP (issue: p95 under 10 ms).

A store of 20 scopes x 120 memories (global + 19 characters; per scope 20 pinned + 100 unpinned),
one group chat of the 19 characters, a real sidecar process under waitress; then N requests from
one client. Prints median and p95 in milliseconds.

    .venv/bin/python bench/for_turn.py [--requests 500]
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from server_plugin.app import build_services  # noqa: E402
from server_plugin.settings import load_settings  # noqa: E402
from server_plugin.story import characters, chats  # noqa: E402
from server_plugin.story.memories import create  # noqa: E402

TOKEN = "bench-token"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def fill(data_dir: str) -> None:
    """Write the store directly through the domain layer (fast), then close it."""
    svc = build_services(load_settings({"data_dir": data_dir, "sqlite_synchronous": "NORMAL"}, environ={}))
    cast = [f"char{i:02d}.png" for i in range(19)]
    for cid in cast:
        characters.put(svc, cid, {"name": cid.split(".")[0].title()})
    chats.put(svc, "bench-chat", {"member_ids": cast})
    for scope, cid in [("global", None)] + [("character", c) for c in cast]:
        for i in range(120):
            create(svc, {"text": f"Memory {i} of {cid or 'the world'}: a durable fact worth keeping.",
                         "scope": scope, "character_id": cid, "pinned": i < 20, "actor": "user"})
    svc.db.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=500)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as data_dir:
        started = time.perf_counter()
        fill(data_dir)
        print(f"store filled: 20 scopes x 120 memories in {time.perf_counter() - started:.1f} s")
        port = free_port()
        env = {**os.environ, "CHRONICLER_TOKEN": TOKEN, "OPENBLAS_NUM_THREADS": "1"}
        proc = subprocess.Popen([sys.executable, "-m", "server_plugin.cli", "serve", "--port", str(port),
                                 "--data-dir", data_dir], env=env, cwd=ROOT,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            url = f"http://127.0.0.1:{port}/v1/memories/for-turn"
            session = requests.Session()
            session.headers["Authorization"] = f"Bearer {TOKEN}"
            params = {"chat_id": "bench-chat", "speaker_id": "char00.png"}
            for _ in range(200):
                try:
                    if session.get(url, params=params, timeout=2).status_code == 200:
                        break
                except requests.ConnectionError:
                    time.sleep(0.05)
            # Measure the settled sidecar: the model load and the search index build run in the
            # background after start and take both cores for a few seconds.
            health = f"http://127.0.0.1:{port}/v1/health"
            deadline = time.time() + 120
            while time.time() < deadline:
                state = session.get(health, timeout=5).json()
                if state["embedder"]["ready"] and state.get("search", {}).get("ready", True):
                    break
                time.sleep(0.2)
            for _ in range(20):  # warm-up
                session.get(url, params=params, timeout=5)
            times = []
            for _ in range(args.requests):
                t = time.perf_counter()
                response = session.get(url, params=params, timeout=5)
                times.append((time.perf_counter() - t) * 1000)
                assert response.status_code == 200
            body = response.json()
            times.sort()
            p95 = times[int(len(times) * 0.95) - 1]
            print(f"for-turn returned {body['pinned_count']} pinned + {body['unpinned_count']} unpinned")
            print(f"for-turn over HTTP, {args.requests} requests: median {statistics.median(times):.2f} ms, "
                  f"p95 {p95:.2f} ms, max {times[-1]:.2f} ms (target p95 < 10 ms)")
        finally:
            proc.terminate()
            proc.wait(10)


if __name__ == "__main__":
    main()
