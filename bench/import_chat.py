"""Backfill speed: a generated SillyTavern chat of N messages through `chronicler import-chat`,
offline, extractive mode, jobs drained; the whole command timed (model load included).

    HF_HUB_OFFLINE=1 OPENBLAS_NUM_THREADS=1 .venv/bin/python bench/import_chat.py [--messages 2000]
        [--batch-size 100] [--kill-after 900]

--kill-after K: SIGKILL the import once K messages are stored, rerun it, and report both runs
(the resumed import must end with every message and nothing pending). Target (rule OP10): 2,000
messages in under 3 minutes on the 2-core machine.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.helpers import stchat  # noqa: E402

CHAT_ID = "Ayla - 2026-11-29@16h52m03s"


def count(db: Path, sql: str) -> int:
    if not db.exists():
        return 0
    try:
        conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=1)
        try:
            return conn.execute(sql).fetchone()[0]
        finally:
            conn.close()
    except sqlite3.Error:
        return 0


def start(path: Path, data: Path, batch: int) -> subprocess.Popen:
    env = {**os.environ, "CHRONICLER_TOKEN": "", "HF_HUB_OFFLINE": "1", "OPENBLAS_NUM_THREADS": "1",
           "CHRONICLER_LLM_MODE": "extractive"}
    return subprocess.Popen([sys.executable, "-m", "server_plugin.cli", "import-chat", str(path),
                             "--chat-id", CHAT_ID, "--data-dir", str(data), "--batch-size", str(batch),
                             "--no-progress"], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=2000)
    parser.add_argument("--batch-size", type=int, default=100)
    parser.add_argument("--kill-after", type=int, default=0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="chronicler-import-") as folder:
        path = stchat.write(Path(folder) / "chat.jsonl", args.messages, session_every=400)
        data = Path(folder) / "data"
        db = data / "chronicler.sqlite3"
        print(f"load average before: {os.getloadavg()}")
        started = time.monotonic()
        if args.kill_after:
            proc = start(path, data, args.batch_size)
            while count(db, "SELECT count(*) FROM messages") < args.kill_after and proc.poll() is None:
                time.sleep(0.05)
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            print(f"killed after {time.monotonic() - started:.1f} s with "
                  f"{count(db, 'SELECT count(*) FROM messages')} messages stored")
        proc = start(path, data, args.batch_size)
        out, err = proc.communicate()
        wall = time.monotonic() - started
        if proc.returncode != 0:
            print(err[-2000:])
            return 1
        print(out.strip())
        print(f"wall time (process start, model load, import, jobs drained): {wall:.1f} s")
        queries = {
            "messages": "SELECT count(*) FROM messages",
            "sessions": "SELECT count(*) FROM sessions",
            "summaries": "SELECT count(*) FROM summaries",
            "memories": "SELECT count(*) FROM memories",
            "notes": "SELECT count(*) FROM notes",
            "jobs done": "SELECT count(*) FROM jobs WHERE state='done'",
            "jobs pending/running": "SELECT count(*) FROM jobs WHERE state IN ('pending','running')",
            "jobs failed": "SELECT count(*) FROM jobs WHERE state='failed'",
        }
        print(", ".join(f"{k}: {count(db, q)}" for k, q in queries.items()))
        print(f"load average after: {os.getloadavg()}")
        match = re.search(r"(\d+) new messages", out)
        return 0 if match else 1


if __name__ == "__main__":
    sys.exit(main())
