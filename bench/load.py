"""Load: several clients at a fixed total rate for a fixed time; throughput, p50/p95/p99, errors.

Target (rule OP10): 0 errors and p99 under 200 ms at 20 requests/s on these 2 cores.

Requests are scheduled open-loop (request i is due at start + i/rate, handed to the clients in
turn) and latency is measured from when a request was DUE, so a slow answer that delays the next
request shows up in the numbers instead of hiding (no coordinated omission). The mix is a list of
weighted operations; an operation is a function returning (method, path, body, params). The
default mix includes `context` (POST /v1/context, the per-turn assembly) when the sidecar has that
route; on a sidecar without it the operation is left out of the mix, and the run says so.

    .venv/bin/python bench/load.py                       # starts its own sidecar, default mix
    .venv/bin/python bench/load.py --rate 40 --seconds 60 --clients 6 \\
        --mix for_turn=5,messages_ingest=2,memory_create=2,memory_edit=1,memory_list=1
    .venv/bin/python bench/load.py --url http://127.0.0.1:7711 --token "$(cat ~/.local/share/chronicler/token)"
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.helpers.client import Client, Dead, q  # noqa: E402

CAST = [f"load-hero-{i}.png" for i in range(5)]
CHAT = "Load test - 2026-11-29@16h52m03s"


@dataclass
class Store:
    """What the operations pick from (memory ids grow as the run creates them)."""

    memory_ids: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    serial: int = 0

    def next(self) -> int:
        with self.lock:
            self.serial += 1
            return self.serial


Request = tuple[str, str, Any, dict | None]
Operation = Callable[[Store, random.Random], Request]


def op_for_turn(store: Store, rng: random.Random) -> Request:
    return "GET", "/v1/memories/for-turn", None, {"chat_id": CHAT, "speaker_id": rng.choice(CAST)}


def op_memory_create(store: Store, rng: random.Random) -> Request:
    n = store.next()
    scope = rng.choice(["global", "character"])
    body = {"text": f"Load fact {n}: the {rng.choice(['bell', 'gate', 'ship'])} was {n % 97} years old.",
            "scope": scope, "actor": rng.choice(["user", "model", "background"])}
    if scope == "character":
        body["character_id"] = rng.choice(CAST)
    return "POST", "/v1/memories", body, None


def op_memory_edit(store: Store, rng: random.Random) -> Request:
    with store.lock:
        memory_id = rng.choice(store.memory_ids)
    return "PATCH", f"/v1/memories/{q(memory_id)}", {"text": f"Edited fact {store.next()}.", "actor": "user"}, None


def op_memory_list(store: Store, rng: random.Random) -> Request:
    return "GET", "/v1/memories", None, {"scope": "global"}


def op_messages_ingest(store: Store, rng: random.Random) -> Request:
    """One new message, as the extension posts it after each send or reply."""
    n = store.next()
    user = n % 2 == 0
    message = {"id": f"load-msg-{n}", "role": "user" if user else "assistant",
               "name": "You" if user else "Hero", "text": f"Line {n}: the caravan reached the {n % 13}th gate.",
               "speaker_id": None if user else rng.choice(CAST)}
    return "POST", f"/v1/chats/{q(CHAT)}/messages", {"messages": [message]}, None


ACTIONS = ["I open the gate and ask Hero about the bell.", "We ride to the ship before dawn.",
           "\"Do you remember what the Duke owes us?\"", "I look for the silver key in the caravan."]


def op_context(store: Store, rng: random.Random) -> Request:
    """The extension's call before every generation (API.md `POST /v1/context`)."""
    body = {"chat_id": CHAT, "speaker_id": rng.choice(CAST), "present_ids": CAST,
            "context_tokens": rng.choice([4096, 8192, 16384]),
            "last_action": {"text": rng.choice(ACTIONS), "kind": "action"},
            "generation_type": "normal", "memory_bank": True}
    return "POST", "/v1/context", body, None


OPERATIONS: dict[str, Operation] = {
    "context": op_context,
    "messages_ingest": op_messages_ingest,
    "for_turn": op_for_turn,
    "memory_create": op_memory_create,
    "memory_edit": op_memory_edit,
    "memory_list": op_memory_list,
}
DEFAULT_MIX = "context=4,for_turn=2,messages_ingest=2,memory_create=1,memory_edit=1"


def available(client: Client, mix: list[tuple[str, float]]) -> list[tuple[str, float]]:
    """The mix without operations whose route this sidecar does not have (404/405 not_found)."""
    out = []
    for name, weight in mix:
        method, path, body, params = OPERATIONS[name](Store(memory_ids=["probe"]), random.Random(0))
        if name == "context":
            status, answer = client.call(method, path, body, params=params)
            code = answer.get("error", {}).get("code", "") if isinstance(answer, dict) else ""
            if status in (404, 405) and code in ("not_found", "method_not_allowed"):
                print(f"note: this sidecar has no {method} {path}; '{name}' is left out of the mix")
                continue
        out.append((name, weight))
    return out


def parse_mix(text: str) -> list[tuple[str, float]]:
    mix = []
    for part in text.split(","):
        name, _, weight = part.partition("=")
        if name.strip() not in OPERATIONS:
            raise SystemExit(f"unknown operation {name!r}; known: {', '.join(OPERATIONS)}")
        mix.append((name.strip(), float(weight or 1)))
    return mix


def seed(client: Client, store: Store, memories: int) -> None:
    """Characters, one group chat of them with 80 messages of history, and `memories` memories
    over their scopes and global."""
    for cid in CAST:
        status, body = client.call("PUT", f"/v1/characters/{q(cid)}", {"name": cid.split(".")[0]})
        assert status in (200, 201), body
    status, body = client.call("PUT", f"/v1/chats/{q(CHAT)}", {"member_ids": CAST})
    assert status in (200, 201), body
    rng = random.Random(1)
    history = [op_messages_ingest(store, rng)[2]["messages"][0] for _ in range(80)]
    status, body = client.call("POST", f"/v1/chats/{q(CHAT)}/messages", {"messages": history})
    assert status == 200, body
    for _ in range(memories):
        method, path, body, _ = op_memory_create(store, rng)
        status, answer = client.call(method, path, body)
        assert status == 201, answer
        store.memory_ids.append(answer["memory"]["id"])


@dataclass
class Result:
    name: str
    due: float
    latency: float        # from when it was due (includes waiting behind a slow one)
    service: float        # from when it was sent
    status: int
    code: str = ""


def run(url: str, token: str, rate: float, seconds: float, clients: int, mix: list[tuple[str, float]],
        store: Store, seed_value: int = 7) -> list[Result]:
    total = int(rate * seconds)
    rng = random.Random(seed_value)
    names = rng.choices([n for n, _ in mix], [w for _, w in mix], k=total)
    start = time.monotonic() + 0.2
    results: list[Result] = []
    lock = threading.Lock()

    def client_loop(k: int) -> None:
        client = Client(url, token, timeout=30)
        local = random.Random(seed_value + k)
        for i in range(k, total, clients):
            due = start + i / rate
            time.sleep(max(0.0, due - time.monotonic()))
            method, path, body, params = OPERATIONS[names[i]](store, local)
            sent = time.monotonic()
            try:
                status, answer = client.call(method, path, body, params=params)
            except Dead:
                status, answer = 0, {}
            done = time.monotonic()
            code = answer.get("error", {}).get("code", "") if isinstance(answer, dict) and status >= 400 else ""
            if status == 201 and names[i] == "memory_create":
                with store.lock:
                    store.memory_ids.append(answer["memory"]["id"])
            with lock:
                results.append(Result(names[i], due - start, done - due, done - sent, status, code))
        client.close()

    threads = [threading.Thread(target=client_loop, args=(k,)) for k in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def percentile(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


def report(results: list[Result], rate: float, seconds: float) -> dict[str, Any]:
    span = max((r.due + r.latency for r in results), default=0.0) or 1.0
    errors = Counter(f"{r.status} {r.code}".strip() for r in results if not 200 <= r.status < 300)
    by_op = {}
    for name in sorted({r.name for r in results}):
        lat = [r.latency * 1000 for r in results if r.name == name]
        by_op[name] = {"n": len(lat), "p50_ms": percentile(lat, 50), "p95_ms": percentile(lat, 95),
                       "p99_ms": percentile(lat, 99)}
    lat = [r.latency * 1000 for r in results]
    service = [r.service * 1000 for r in results]
    return {"target_rate": rate, "seconds": seconds, "requests": len(results),
            "throughput_rps": len(results) / span, "errors": dict(errors), "error_count": sum(errors.values()),
            "p50_ms": percentile(lat, 50), "p95_ms": percentile(lat, 95), "p99_ms": percentile(lat, 99),
            "max_ms": max(lat, default=float("nan")), "service_p99_ms": percentile(service, 99),
            "mean_ms": statistics.fmean(lat) if lat else float("nan"), "by_operation": by_op}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", help="a running sidecar (default: start one on a temporary data dir)")
    parser.add_argument("--token", help="its bearer token")
    parser.add_argument("--rate", type=float, default=20.0, help="requests per second, all clients together")
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--mix", default=DEFAULT_MIX, help=f"weighted operations, e.g. {DEFAULT_MIX}")
    parser.add_argument("--seed-memories", type=int, default=300)
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    args = parser.parse_args()
    mix = parse_mix(args.mix)
    side = None
    if args.url:
        url, token = args.url, args.token or ""
    else:
        from tests.helpers.process import SidecarProcess

        side = SidecarProcess.create(Path(tempfile.mkdtemp(prefix="chronicler-load-")) / "data")
        side.start()
        side.wait_ready()
        url, token = side.url, side.token
    try:
        store = Store()
        setup = Client(url, token)
        seed(setup, store, args.seed_memories)
        mix = available(setup, mix)
        setup.close()
        results = run(url, token, args.rate, args.seconds, args.clients, mix, store)
    finally:
        if side:
            side.stop()
    summary = report(results, args.rate, args.seconds)
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        import os

        used = ",".join(f"{n}={w:g}" for n, w in mix)
        print(f"{summary['requests']} requests in {args.seconds:.0f} s from {args.clients} clients at "
              f"{args.rate:g}/s target ({used}): {summary['throughput_rps']:.1f}/s achieved")
        print(f"load average after the run (1, 5, 15 min): {os.getloadavg()}")
        print(f"latency from due time: p50 {summary['p50_ms']:.1f} ms, p95 {summary['p95_ms']:.1f} ms, "
              f"p99 {summary['p99_ms']:.1f} ms, max {summary['max_ms']:.1f} ms")
        for name, row in summary["by_operation"].items():
            print(f"  {name:14s} n={row['n']:5d}  p50 {row['p50_ms']:7.1f}  p95 {row['p95_ms']:7.1f}  "
                  f"p99 {row['p99_ms']:7.1f} ms")
        print(f"errors: {summary['error_count']} {summary['errors']}")
    ok = summary["error_count"] == 0 and summary["p99_ms"] < 200
    print("target (0 errors, p99 < 200 ms):", "met" if ok else "NOT met")
    return 0


if __name__ == "__main__":
    sys.exit(main())
