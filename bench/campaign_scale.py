"""A campaign of 300 sessions: one store grown in steps (10,000, 30,000, 100,000 messages) and
measured at each step with the same code in the same run.

The store (one campaign chat, 40 characters with sheets and secrets): at the full 100,000
messages 300 sessions (a day's gap every 333 messages starts one), 5,000 saved memories and 2,000
lore cards; smaller steps hold the same things in proportion. Everything is written through the
domain layer (characters.put, cards.import_world_info, memories.create, conversation.ingest): the
saved memories embedded in one batch first (memories.create then hits the embedder's cache),
each batch of messages embedded in one call by ingest itself. Character
memories and scene and session summaries come from the session-end jobs themselves, run by the
sidecar in extractive mode (so they are in proportion by construction). Messages are LoCoMo
turns, each made distinct by its turn number and a speaker name.

At each step, against a real sidecar process (waitress) on the store:
- the catch-up: the background jobs the fill queued, drained (not counted in the rest);
- ready: time from starting the process to /v1/health saying embedder and search index ready,
  beside what touching new memory costs on this machine just before (`fresh_memory_s_per_gb`);
- the first context call and the first search after ready (`first_context_ms`, `first_search_ms`):
  what a sidecar leaves to its first calls;
- `POST /v1/context` and `POST /v1/search` p50/p95 over HTTP, each call with a new LoCoMo question
  as the player's action / the query; the floor (one new query embedding, same model, in this
  process) between the calls;
- the context call as a typed turn reaches it (`context_typed`): the text sent to
  `POST /v1/context/prefetch` 0.8 s before the call, so the sidecar has the turn assembled ahead
  (story/ahead.py); p50/p95 of the call, and how many were answered that way;
- resident memory of the sidecar and every process under it (sum of RSS from /proc);
- the store's size on disk (the data folder), `chronicler backup` time, `chronicler export` time
  and size, and `chronicler import` of that file into an empty folder;
- the same without vectors (`chronicler export --no-vectors`, its size, its import), and the
  rebuild after it: a sidecar started on the imported folder, from ready to health's `reembed`
  null (every row embedded again in the background).

`--exports-only` measures only the catch-up, disk, backup and the exports and imports (no timed
calls): what docs/scaling.md's export sizes come from at small steps.

    nice python bench/campaign_scale.py --keep /work/bench_cache/campaign [--steps 10000,30000,100000]

`--keep DIR` keeps the grown store: a rerun measures what is there and fills only what a step
still lacks. Results are appended as JSON lines to DIR.results.jsonl (beside the folder).

The fill of 100,000 messages takes longer than a sitting, and the steps must be measured with the
same code: `--fill-only --snapshots` grows the store step by step, drains each step's jobs and keeps
a copy of it as `DIR@STEP`; `--from-snapshots` then measures every step on a fresh copy of its
snapshot, in one run with the code of that run (the snapshots are never changed).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ["HF_HUB_OFFLINE"] = "1"

import requests  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from assemble_latency import (CAST, TOKEN, embed_ms, floor_model, free_port,  # noqa: E402
                              percentile, sentence)

LOCOMO = Path("/work/shared/bench/locomo/locomo_dev.json")
CHAT = "Campaign - 2026-01-01@18h00m00s"
MEMBERS = ["char00.png", "char01.png", "char02.png"]
FULL = 100_000
PER_SESSION = FULL // 300
SHARES = {"memories": 5_000 / FULL, "lore": 2_000 / FULL}
PAUSE = 0.1


def locomo() -> tuple[list[tuple[str, str]], list[str]]:
    """Every LoCoMo turn (speaker, text) and every question of categories 1-4."""
    turns, questions = [], []
    for sample in json.loads(LOCOMO.read_text()):
        conv, n = sample["conversation"], 1
        while f"session_{n}" in conv:
            turns += [(t["speaker"], t["text"]) for t in conv[f"session_{n}"]]
            n += 1
        questions += [q["question"] for q in sample["qa"] if q.get("category") in (1, 2, 3, 4)]
    return turns, questions


# --- the fill ----------------------------------------------------------------------------------
def open_services(data_dir: Path):
    from server_plugin.app import build_services
    from server_plugin.settings import load_settings

    svc = build_services(load_settings({"data_dir": str(data_dir), "sqlite_synchronous": "NORMAL"},
                                       environ={}))
    svc.embedder.wait(300)
    return svc


def count(svc, table: str, where: str = "") -> int:
    return svc.db.reader().execute(f"SELECT count(*) FROM {table} {where}").fetchone()[0]


def fill_cast(svc, rnd: random.Random) -> None:
    from server_plugin.story import characters, chats

    for i, (cid, name) in enumerate(CAST):
        characters.put(svc, cid, {"name": name, "aliases": [f"Alias{i:02d}"], "sheet": {
            "personality": sentence(rnd, 60), "appearance": sentence(rnd, 50),
            "backstory": sentence(rnd, 150),
            "secrets": [{"text": sentence(rnd, 20)}, {"text": sentence(rnd, 15),
                                                      "known_by": [CAST[(i + 1) % 40][0]]}]}})
    chats.put(svc, CHAT, {"member_ids": MEMBERS})


def fill_lore(svc, rnd: random.Random, start: int, stop: int) -> None:
    from server_plugin.sillytavern import cards

    for lo in range(start, stop, 500):  # one World Info file per 500 cards
        hi = min(stop, lo + 500)
        entries = {str(i): {"uid": i, "key": [f"lorekey{i}", rnd.choice(["river", "tower", "oath"]) + f" {i}"],
                            "comment": f"Place {i}", "content": sentence(rnd, rnd.randint(40, 160)),
                            "constant": i < 3} for i in range(lo, hi)}
        cards.import_world_info(svc, {"world_info": {"entries": entries}, "name": f"World {lo}"})


def fill_memories(svc, rnd: random.Random, start: int, stop: int) -> None:
    from server_plugin.errors import Conflict
    from server_plugin.story import memories

    texts = []
    for i in range(start, stop):
        # One in nine global; the rest spread over the cast; a few pinned (within the quotas of
        # 20 per scope: one in 50 of the first 1,500, then one in 250).
        cid = None if i % 9 == 0 else CAST[i % 40][0]
        pinned = i % 50 == 0 if i < 1500 else i % 250 == 0
        texts.append((cid, pinned, f"[{i}] " + sentence(rnd, rnd.randint(8, 30))))
    svc.embedder.embed([t for *_, t in texts], svc.embed_wait())
    for cid, pinned, text in texts:
        body = {"text": text, "scope": "character" if cid else "global",
                "character_id": cid, "pinned": pinned, "actor": "user", "chat_id": CHAT}
        try:
            memories.create(svc, body)
        except Conflict:  # the scope's pinned quota is full (a store filled by an earlier version)
            memories.create(svc, {**body, "pinned": False})


def message(i: int, turns: list[tuple[str, str]]) -> dict:
    """Message i of the campaign: a LoCoMo turn, 3 minutes after the previous, a day's gap
    starting each new session."""
    start = datetime(2026, 1, 1, 18, tzinfo=timezone.utc)
    sent = start + timedelta(minutes=3 * i, days=i // PER_SESSION)
    speaker, text = turns[i % len(turns)]
    user = i % 2 == 0
    return {"id": f"m{i:06d}", "role": "user" if user else "assistant",
            "name": "Player" if user else CAST[i % 3][1],
            "text": f"{text} ({speaker}, {CAST[(i // 7) % 40][1]}, turn {i})",
            "sent_at": sent.isoformat()}


def fill_messages(svc, turns, start: int, stop: int) -> None:
    from server_plugin.story import conversation

    batch = int(svc.settings.messages_per_batch)
    begun = time.perf_counter()
    for lo in range(start, stop, 2000):  # ingest embeds each batch in one call (what it indexes)
        rows = [message(i, turns) for i in range(lo, min(stop, lo + 2000))]
        for b in range(0, len(rows), batch):
            conversation.ingest(svc, CHAT, rows[b:b + batch])
        done = min(stop, lo + 2000)
        rate = (done - start) / (time.perf_counter() - begun)
        print(f"    {done} messages ({rate:.0f}/s)", flush=True)


def grow(data_dir: Path, target: int, turns) -> dict:
    """Fill the store up to `target` messages (and the rest in proportion); returns timings."""
    svc = open_services(data_dir)
    rnd = random.Random(target)
    out = {}
    try:
        if count(svc, "characters") < len(CAST):
            fill_cast(svc, rnd)
        have = {"messages": count(svc, "messages"), "memories": count(svc, "memories"),
                "lore": count(svc, "lore")}
        plan = [("lore", lambda a, b: fill_lore(svc, rnd, a, b)),
                ("memories", lambda a, b: fill_memories(svc, rnd, a, b)),
                ("messages", lambda a, b: fill_messages(svc, turns, a, b))]
        for what, step in plan:
            want = target if what == "messages" else int(target * SHARES[what])
            if have[what] < want:
                began = time.perf_counter()
                print(f"  {what}: {have[what]} -> {want}", flush=True)
                step(have[what], want)
                out[f"fill_{what}_s"] = round(time.perf_counter() - began, 1)
    finally:
        svc.db.close()
    return out


# --- the measurements --------------------------------------------------------------------------
def fresh_memory_s_per_gb(mb: int = 512) -> float:
    """Seconds per GB a new process takes to touch memory it never used. On a bare machine about
    0.1; in a virtual machine whose host backs guest memory lazily it was 1 to 5 here, varying by
    the hour, and a restart of a campaign touches about 1 GB: read `ready_s` beside it."""
    code = (f"import time, numpy; t = time.perf_counter(); numpy.ones({mb} << 20, dtype=numpy.uint8);"
            " print(time.perf_counter() - t)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return float(done.stdout.strip()) * 1024 / mb


def tree_rss_mb(pid: int) -> float:
    """Resident memory of a process and every process under it (MB)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        todo += children.get(p, [])
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except OSError:
            pass
    return total / 1024


def du_mb(folder: Path) -> float:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file()) / 2 ** 20


class Sidecar:
    """A real `chronicler serve` process on the store."""

    def __init__(self, data_dir: Path, worker: bool = True) -> None:
        self.port = free_port()
        env = {**os.environ, "CHRONICLER_TOKEN": TOKEN, "OPENBLAS_NUM_THREADS": "1",
               "PYTHONPATH": str(ROOT), "CHRONICLER_WORKER_ENABLED": "true" if worker else "false"}
        self.started = time.perf_counter()
        self.proc = subprocess.Popen([sys.executable, "-m", "server_plugin.cli", "serve", "--port",
                                      str(self.port), "--data-dir", str(data_dir)], env=env, cwd=ROOT,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.session = requests.Session()
        self.session.headers["Authorization"] = f"Bearer {TOKEN}"
        self.base = f"http://127.0.0.1:{self.port}/v1"

    def wait_ready(self, limit: float = 600) -> float:
        """Seconds from the start of the process to embedder and search index ready."""
        while time.perf_counter() - self.started < limit:
            try:
                health = self.session.get(f"{self.base}/health", timeout=10).json()
                if health["embedder"]["ready"] and health["search"]["ready"]:
                    return time.perf_counter() - self.started
            except (requests.RequestException, ValueError, KeyError):  # busy machine: ask again
                pass
            time.sleep(0.05)
        raise RuntimeError("the sidecar did not become ready")

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)


def first_call_ms(car: Sidecar, route: str, body: dict) -> float:
    """Wall time (ms) of one call, the first of its route since the sidecar started."""
    started = time.perf_counter()
    car.session.post(f"{car.base}/{route}", json=body, timeout=60).raise_for_status()
    return round((time.perf_counter() - started) * 1e3, 1)


def timed_calls(car: Sidecar, route: str, bodies: list[dict], model, floor_texts: list[str],
                warm: int = 10) -> dict:
    times, floors = [], []
    for i, body in enumerate(bodies):
        started = time.perf_counter()
        response = car.session.post(f"{car.base}/{route}", json=body, timeout=60)
        elapsed = (time.perf_counter() - started) * 1000
        assert response.status_code == 200, response.text[:300]
        time.sleep(PAUSE)
        floor, _ = embed_ms(model, floor_texts[i])
        time.sleep(PAUSE)
        if i >= warm:
            times.append(elapsed)
            floors.append(floor)
    return {"p50": round(statistics.median(times), 1), "p95": round(percentile(times, 95), 1),
            "floor_p50": round(statistics.median(floors), 1), "floor_p95": round(percentile(floors, 95), 1)}


def typed_calls(car: Sidecar, bodies: list[dict], pause: float = 0.8, warm: int = 5) -> dict:
    """`POST /v1/context` as a typed turn reaches it: its text sent to `POST /v1/context/prefetch`
    (a pause in typing), the call `pause` s later. The sidecar then has the turn assembled ahead
    (story/ahead.py; its Server-Timing says `ahead`) unless something was written meanwhile."""
    times, ahead = [], 0
    for i, body in enumerate(bodies):
        text = body["last_action"]["text"]
        car.session.post(f"{car.base}/context/prefetch", json={"chat_id": body["chat_id"], "text": text},
                         timeout=60).raise_for_status()
        time.sleep(pause)
        started = time.perf_counter()
        response = car.session.post(f"{car.base}/context", json=body, timeout=60)
        elapsed = (time.perf_counter() - started) * 1000
        assert response.status_code == 200, response.text[:300]
        if i >= warm:
            times.append(elapsed)
            ahead += "ahead" in response.headers.get("Server-Timing", "")
    return {"p50": round(statistics.median(times), 1), "p95": round(percentile(times, 95), 1),
            "n": len(times), "assembled_ahead": ahead}


def cli(*args: str) -> tuple[float, str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "server_plugin.cli", *args], env=env, cwd=ROOT,
                          capture_output=True, text=True)
    took = time.perf_counter() - started
    if done.returncode:
        return took, "FAILED: " + (done.stderr or done.stdout).strip()[-300:]
    return took, done.stdout.strip()[-200:]


def wait_drained(session: requests.Session, base: str, limit: float) -> float:
    """Seconds until no job is pending or running (RuntimeError past `limit`)."""
    started = time.time()
    while time.time() - started < limit:
        try:
            counts = session.get(f"{base}/jobs", timeout=30).json()["counts"]
            if counts.get("pending", 0) == 0 and counts.get("running", 0) == 0:
                return time.time() - started
        except requests.RequestException:  # a busy machine: ask again
            pass
        time.sleep(2)
    raise RuntimeError("the background jobs did not finish")


def catch_up(data_dir: Path, limit: float) -> dict:
    """Run the jobs the fill queued, up to `limit` seconds; what is left is reported."""
    car = Sidecar(data_dir)
    try:
        car.wait_ready()
        try:
            return {"catch_up_s": round(wait_drained(car.session, car.base, limit=limit), 1)}
        except RuntimeError:
            counts = car.session.get(f"{car.base}/jobs", timeout=30).json()["counts"]
            return {"catch_up_s": None, "jobs_left": counts}
    finally:
        car.stop()


def rebuild(data_dir: Path, limit: float = 6 * 3600) -> dict:
    """A sidecar on a store imported without vectors: ready, then every row embedded again."""
    car = Sidecar(data_dir, worker=False)
    try:
        out = {"bare_ready_s": round(car.wait_ready(), 1)}
        began = time.perf_counter()
        while time.perf_counter() - began < limit:
            try:
                moving = car.session.get(f"{car.base}/health", timeout=10).json()["reembed"]
            except (requests.RequestException, ValueError, KeyError):  # busy machine: ask again
                moving = {}
            if moving is None:
                out["rebuild_s"] = round(time.perf_counter() - began, 1)
                return out
            time.sleep(1)
        out["rebuild_s"] = None
        return out
    finally:
        car.stop()


REBUILD_LIMIT = [6 * 3600.0]  # --rebuild-limit: seconds the background rebuild is followed


def exports(data_dir: Path) -> dict:
    """Disk, backup, and the export and import with and without vectors (then the rebuild)."""
    out: dict = {"disk_mb": round(du_mb(data_dir), 1)}
    with tempfile.TemporaryDirectory(dir=data_dir.parent) as tmp:
        took, said = cli("backup", "--data-dir", str(data_dir), "--out", f"{tmp}/backup.sqlite3")
        out["backup_s"], out["backup"] = round(took, 1), said[:120]
        for tag, extra in (("", ()), ("_bare", ("--no-vectors",))):
            file = f"{tmp}/export{tag}.json"
            took, said = cli("export", "--data-dir", str(data_dir), "--out", file, *extra)
            out[f"export{tag}_s"] = round(took, 1)
            out[f"export{tag}_mb"] = round(os.path.getsize(file) / 2 ** 20, 1) if os.path.exists(file) else None
            out[f"export{tag}"] = said[:120]
            if out[f"export{tag}_mb"] is not None:
                took, said = cli("import", file, "--data-dir", f"{tmp}/imported{tag}")
                out[f"import{tag}_s"], out[f"import{tag}"] = round(took, 1), said[:160]
            if os.path.exists(file):
                os.remove(file)
        if out.get("import_bare_s") is not None and not out["import_bare"].startswith("FAILED"):
            out.update(rebuild(Path(f"{tmp}/imported_bare"), REBUILD_LIMIT[0]))
    return out


def snapshot_of(data_dir: Path, step: int) -> Path:
    return data_dir.parent / f"{data_dir.name}@{step}"


def take_snapshot(data_dir: Path, step: int, limit: float) -> dict:
    """Drain the step's jobs, then keep a copy of the store as it is at this step."""
    out = catch_up(data_dir, limit)
    target = snapshot_of(data_dir, step)
    if target.exists():
        shutil.rmtree(target)
    shutil.copytree(data_dir, target)
    return {**out, "snapshot": str(target)}


def measure(data_dir: Path, step: int, questions: list[str], n: int, model, limit: float,
            exports_only: bool = False, calls_only: bool = False) -> dict:
    out: dict = {"messages": step, **catch_up(data_dir, limit)}
    if exports_only:
        return {**out, **exports(data_dir)}
    # The restart: what a user waits for. Jobs left (a catch-up cut short) stay queued: the
    # calls below measure the store, not a backlog (bench/context_backlog.py does that).
    out["fresh_memory_s_per_gb"] = round(fresh_memory_s_per_gb(), 2)
    car = Sidecar(data_dir, worker="jobs_left" not in out)
    try:
        out["ready_s"] = round(car.wait_ready(), 2)
        out["rss_idle_mb"] = round(tree_rss_mb(car.proc.pid), 0)
        rnd = random.Random(step)
        picked = rnd.sample(questions, min(len(questions), 3 * (n + 10)))
        asks, finds, floors = picked[:n + 10], picked[n + 10:2 * (n + 10)], picked[2 * (n + 10):]
        # New texts at every step: the floor's embedder keeps what it embedded in an earlier step.
        # Enough for both routes (context reads from the front, search from the back) however
        # few questions are left after the calls' own: a repeated text is a cached vector.
        floors = [f"{q} ({step}, {i})" for i, q in enumerate(floors)] + [f"floor {step} {i}"
                                                                         for i in range(2 * (n + 10))]
        ctx = {"chat_id": CHAT, "speaker_id": "char00.png", "context_tokens": 16384,
               "generation_type": "normal", "memory_bank": True,
               "instructions": sentence(rnd, 250), "authors_note": sentence(rnd, 40)}
        # The first turn after the restart, then the first search: work a sidecar leaves to its
        # first calls is not in ready_s (texts of their own: the timed calls' stay new).
        first_turn = {**ctx, "last_action": {"text": f"{asks[-1]} (first)"}}
        out["first_context_ms"] = first_call_ms(car, "context", first_turn)
        first_query = {"query": f"{finds[-1]} (first)", "chat_id": CHAT, "k": 10}
        out["first_search_ms"] = first_call_ms(car, "search", first_query)
        out["context"] = timed_calls(car, "context", [{**ctx, "last_action": {"text": q}} for q in asks],
                                     model, floors)
        out["search"] = timed_calls(car, "search", [{"query": q, "chat_id": CHAT, "k": 10} for q in finds],
                                    model, floors[::-1])
        # The same context call as a typed turn reaches it (prefetched at a pause): new texts.
        out["context_typed"] = typed_calls(car, [{**ctx, "last_action": {"text": f"{q} (typed)"}}
                                                 for q in asks[:max(10, n // 2)]])
        out["rss_mb"] = round(tree_rss_mb(car.proc.pid), 0)
        out["items"] = car.session.get(f"{car.base}/health", timeout=5).json()["search"]["rows"]
    finally:
        car.stop()
    return out if calls_only else {**out, **exports(data_dir)}


def measure_snapshot(data_dir: Path, step: int, questions: list[str], args, model) -> dict:
    """A step measured on a fresh copy of its snapshot (so every run starts from the same store)."""
    source = snapshot_of(data_dir, step)
    if not source.exists():
        raise SystemExit(f"no snapshot {source}: fill it first with --fill-only --snapshots")
    work = data_dir.parent / f"{data_dir.name}@{step}.work"
    if work.exists():
        shutil.rmtree(work)
    shutil.copytree(source, work)
    try:
        print(f"step {step}: measuring a copy of {source}", flush=True)
        return {"from_snapshot": str(source),
                **measure(work, step, questions, args.requests, model, args.catch_up_limit, args.exports_only,
                          args.calls_only)}
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep", required=True, help="the store's folder (kept between runs)")
    parser.add_argument("--steps", default="10000,30000,100000")
    parser.add_argument("--requests", type=int, default=100, help="timed calls per route and step")
    parser.add_argument("--fill-only", action="store_true", help="grow the store, measure nothing")
    parser.add_argument("--snapshots", action="store_true",
                        help="after each step's fill, drain its jobs and keep a copy as KEEP@STEP")
    parser.add_argument("--from-snapshots", action="store_true",
                        help="measure each step on a fresh copy of KEEP@STEP (no fill)")
    parser.add_argument("--exports-only", action="store_true",
                        help="measure only disk, backup, exports and imports (with and without vectors)")
    parser.add_argument("--calls-only", action="store_true",
                        help="measure ready, memory and the timed calls only (no disk, backup, exports)")
    parser.add_argument("--rebuild-limit", type=float, default=6 * 3600,
                        help="seconds the rebuild after the vectorless import is followed (rebuild_s null past it)")
    parser.add_argument("--catch-up-limit", type=float, default=6 * 3600,
                        help="seconds the fill's jobs may run before measuring (the rest wait)")
    args = parser.parse_args()
    REBUILD_LIMIT[0] = args.rebuild_limit
    data_dir = Path(args.keep)
    data_dir.mkdir(parents=True, exist_ok=True)
    turns, questions = locomo()
    model = None if args.fill_only or args.exports_only else floor_model()
    for step in [int(s) for s in args.steps.split(",")]:
        if args.from_snapshots:
            result = measure_snapshot(data_dir, step, questions, args, model)
        else:
            print(f"step {step} messages: filling", flush=True)
            began = time.perf_counter()
            result = {"fill": grow(data_dir, step, turns)}
            result["fill_s"] = round(time.perf_counter() - began, 1)
            if args.snapshots:
                result.update(take_snapshot(data_dir, step, args.catch_up_limit))
        if not args.fill_only and not args.from_snapshots:
            print(f"step {step}: measuring", flush=True)
            result.update(measure(data_dir, step, questions, args.requests, model, args.catch_up_limit,
                                  args.exports_only, args.calls_only))
        result["load_avg"] = round(os.getloadavg()[0], 1)
        result["at"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
        print(json.dumps(result), flush=True)
        with open(data_dir.parent / f"{data_dir.name}.results.jsonl", "a") as fh:
            fh.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
