"""Branching a long chat (rule CP2): a parent of N messages with every job done, then a branch
registered at message M (`PUT /v1/chats/{id}` with `branch_of`) and the copied messages uploaded
as the extension does (batches of `messages_per_batch`). Prints the time to branch (the PUT, and
the PUT plus the upload), the jobs that queued, what the branch holds, and the first context call.

In process, through the Flask app (no HTTP socket), real SQLite + sqlite-vec, real MiniLM,
extractive mode. The parent's ingest and its jobs are timed too, for scale.

    HF_HUB_OFFLINE=1 OPENBLAS_NUM_THREADS=1 .venv/bin/python bench/branch.py [--messages 2000] [--at 1500]
        [--turn-by-turn]

Target (CP2): at most the jobs for what straddles M, and under 1 s.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from server_plugin.app import build_services, create_app  # noqa: E402
from server_plugin.jobs import worker  # noqa: E402
from server_plugin.settings import load_settings  # noqa: E402

TOKEN = "bench-token-0123456789"
T0 = datetime(2026, 1, 1, 12, 0, tzinfo=timezone.utc)
PLACES = ["the harbour", "the old mill", "the lighthouse", "the market", "the chapel", "the forest road"]


def messages(n: int) -> list[dict]:
    """n messages, a turn (player, then Ayla) a minute apart, a new session every 40 messages."""
    out = []
    for i in range(n):
        turn, at = i // 2, T0 + timedelta(minutes=i) + timedelta(hours=8 * (i // 40))
        place = PLACES[turn % len(PLACES)]
        if i % 2 == 0:
            out.append({"id": f"u{turn}", "role": "user", "name": "Kai", "speaker_id": "kai.png",
                        "text": f"Kai walks to {place}. \"Ayla, did you see lantern {turn} there?\"",
                        "sent_at": at.isoformat()})
        else:
            out.append({"id": f"a{turn}", "role": "assistant", "name": "Ayla", "speaker_id": "ayla.png",
                        "turn_id": f"t{turn}", "sent_at": at.isoformat(),
                        "text": f"*Ayla looks toward {place}.* \"Lantern {turn} burned near the water, Kai.\""})
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=2000)
    parser.add_argument("--at", type=int, default=1500, help="the branch point: this many messages copied")
    parser.add_argument("--turn-by-turn", action="store_true",
                        help="post the parent a turn at a time, as the extension does (slower to build)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        settings = load_settings({"data_dir": tmp, "token": TOKEN, "worker_enabled": False,
                                  "llm_mode": "extractive"}, environ={})
        svc = build_services(settings)
        svc.embedder.wait(300)
        client = create_app(settings, services=svc).test_client()
        headers = {"Authorization": f"Bearer {TOKEN}"}

        def call(method: str, path: str, body: dict | None = None) -> dict:
            r = client.open(path, method=method, json=body, headers=headers)
            assert r.status_code < 300, (path, r.status_code, r.get_data(as_text=True)[:300])
            return r.get_json()

        call("PUT", "/v1/characters/ayla.png", {"name": "Ayla"})
        call("PUT", "/v1/characters/kai.png", {"name": "Kai", "is_player": True})
        call("PUT", "/v1/chats/parent", {"member_ids": ["ayla.png"]})
        batch = settings.messages_per_batch
        chat = messages(args.messages)
        started = time.perf_counter()
        step = 2 if args.turn_by_turn else batch  # batches: the parent's build is not what is measured
        for i in range(0, len(chat), step):
            call("POST", "/v1/chats/parent/messages", {"messages": chat[i:i + step]})
        ingest = time.perf_counter() - started
        started = time.perf_counter()
        done = 0
        while True:
            ran = worker.run_pending(svc)
            done += ran
            if not ran:
                break
        jobs = time.perf_counter() - started
        conn = svc.db.reader()
        total_jobs = conn.execute("SELECT count(*) FROM jobs").fetchone()[0]
        print(f"parent: {args.messages} messages ingested in {ingest:.1f} s; {done} jobs done in {jobs:.1f} s")

        m = chat[args.at - 1]["id"]
        started = time.perf_counter()
        call("PUT", "/v1/chats/branch", {"member_ids": ["ayla.png"],
                                         "branch_of": {"chat_id": "parent", "message_id": m}})
        put = time.perf_counter() - started
        copies = chat[: args.at]
        queued = 0
        for i in range(0, len(copies), batch):
            queued += call("POST", "/v1/chats/branch/messages", {"messages": copies[i:i + batch]})["jobs_enqueued"]
        both = time.perf_counter() - started
        conn = svc.db.reader()
        new_jobs = conn.execute("SELECT count(*) FROM jobs").fetchone()[0] - total_jobs
        held = {t: conn.execute(f"SELECT count(*) FROM {t} WHERE chat_id='branch'").fetchone()[0]
                for t in ("messages", "summaries", "sessions", "episodes", "docs")}
        started = time.perf_counter()
        out = call("POST", "/v1/context", {"chat_id": "branch", "speaker_id": "ayla.png", "context_tokens": 8192,
                                           "last_action": {"text": "Where did we see the lanterns?"}})
        first = time.perf_counter() - started
        summary = sum(len(b["text"]) for b in out["blocks"] if b["section"] == "story_summary")
        print(f"branch at message {args.at} ({m}): PUT {put * 1000:.0f} ms; PUT + upload of {len(copies)} "
              f"copied messages in batches of {batch}: {both * 1000:.0f} ms")
        print(f"jobs queued by the branch: {new_jobs} (upload reported {queued})")
        print(f"branch holds: {held}")
        print(f"first context: {first * 1000:.0f} ms, story summary {summary} characters")
        svc.db.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
