"""The persistent job queue and the registry of job kinds (`worker.py` runs the jobs).

Every piece of background LLM work (summarise a chunk, merge tiers, summarise a session, file deep
memories, and whatever other modules register) is a row in `jobs`: state pending → running →
done | failed, with attempts, a `not_before` time for backoff and a lease. Routes only enqueue;
a reply never waits for a job.

A concept registers its kinds in its `register(jobs, hooks)`, with
`jobs.register(kind, apply, build=…, prepare=…)` on the store's `JobKinds`:
- `build(svc, job) -> Prompt | None` renders the prompt when the job is run or claimed (so a merge
  reads the texts as they are then, edits included); None means there is nothing left to do.
  Without `build`, the prompt stored at `enqueue(prompt=…)` is used.
- `prepare(svc, job, result) -> Any` runs outside any transaction (e.g. to embed texts);
- `apply(svc, conn, job, result, prepared) -> dict | None` stores the result inside the write
  transaction that marks the job done; what it returns is kept as the job's `result`.

Who runs a job depends on `llm_mode`: `extractive` and `openai` — the worker thread here (through
`llm.run_prompt`); `client` — the SillyTavern extension, via `worker.claim()` and `worker.complete()` (the
worker then runs only kinds registered with `llm=False`). A claimed job not finished before its
`lease_until` goes back to the queue; jobs left running by a stopped sidecar go back at startup.

Owns: jobs.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Callable, Sequence

from ..clock import parse_iso, to_iso
from ..errors import Conflict, NotFound
from ..services import Services
from ..store.db import Connection, dumps, loads

if TYPE_CHECKING:
    from .tasks.base import Prompt

log = logging.getLogger(__name__)

STATES = ("pending", "running", "done", "failed")


@dataclass(frozen=True)
class Job:
    """One claimed job, as a handler sees it."""

    id: str
    kind: str
    chat_id: str | None
    turn_id: str | None
    ref: str | None
    attempts: int
    claimed_by: str | None
    target: dict[str, Any]
    prompt: dict[str, Any] | None


ApplyFn = Callable[["Services", Connection, Job, Any, Any], "dict[str, Any] | None"]
BuildFn = Callable[["Services", Job], "Prompt | None"]
PrepareFn = Callable[["Services", Job, Any], Any]


@dataclass(frozen=True)
class Handler:
    """How to run one kind of job (see the module docstring)."""

    kind: str
    apply: ApplyFn
    build: BuildFn | None = None
    prepare: PrepareFn | None = None
    llm: bool = True
    feeds: tuple[str, ...] = ()  # kinds whose prompts read what this kind writes (batch.py)


class JobKinds:
    """The registry of job kinds of one store's services: each concept registers its kinds in
    its `register(jobs, hooks)`; the worker and the client-mode routes look them up here."""

    def __init__(self) -> None:
        self._handlers: dict[str, Handler] = {}

    def register(self, kind: str, apply: ApplyFn, *, build: BuildFn | None = None,
                 prepare: PrepareFn | None = None, llm: bool = True,
                 feeds: tuple[str, ...] = ()) -> Handler:
        """Make a job kind runnable (registering a kind again replaces its handler).

        `llm=False` marks work that needs no model (the worker runs it in every mode; `apply`
        then gets `result=True`). `feeds`: the kinds whose prompts read what this kind writes, so
        a shared model call never takes one of those ahead of a pending job of this kind."""
        handler = Handler(kind, apply, build, prepare, llm, tuple(feeds))
        self._handlers[kind] = handler
        return handler

    def handler(self, kind: str) -> Handler | None:
        return self._handlers.get(kind)

    def names(self) -> list[str]:
        """Every registered kind, sorted."""
        return sorted(self._handlers)

    def items(self) -> list[tuple[str, Handler]]:
        """(kind, handler) in the order they were registered."""
        return list(self._handlers.items())


class ClientFailure(Exception):
    """The extension could not run a job (its model call failed)."""

    def __init__(self, message: str, retryable: bool = True) -> None:
        super().__init__(message)
        self.retryable = retryable


# --- rows ------------------------------------------------------------------------------------
def to_dict(row: Any) -> dict[str, Any]:
    """A job as the API shows it (the prompt itself is not listed)."""
    return {
        "id": row["id"], "kind": row["kind"], "chat_id": row["chat_id"], "turn_id": row["turn_id"],
        "ref": row["ref"], "state": row["state"], "attempts": row["attempts"],
        "max_attempts": row["max_attempts"], "not_before": row["not_before"],
        "lease_until": row["lease_until"], "claimed_by": row["claimed_by"], "error": row["error"],
        "result": loads(row["result"]), "created_at": row["created_at"],
        "updated_at": row["updated_at"], "finished_at": row["finished_at"],
    }


def job_of(row: Any) -> Job:
    payload = loads(row["payload"])
    return Job(row["id"], row["kind"], row["chat_id"], row["turn_id"], row["ref"], row["attempts"],
               row["claimed_by"], payload.get("target") or {}, payload.get("prompt"))


def row_of(conn: Connection, job_id: str) -> Any:
    return conn.execute("SELECT * FROM jobs WHERE id=?", (job_id,)).fetchone()


def get(svc: Services, job_id: str) -> dict[str, Any]:
    row = row_of(svc.db.reader(), job_id)
    if row is None:
        raise NotFound("job_not_found", f"No job with id {job_id!r}.")
    return to_dict(row)


def list_jobs(svc: Services, *, state: str | None = None, chat_id: str | None = None,
              kind: str | None = None, limit: int | None = None) -> list[dict[str, Any]]:
    """Jobs for the panel, newest first."""
    where, args = ["1"], []
    for column, value in (("state", state), ("chat_id", chat_id), ("kind", kind)):
        if value is not None:
            where.append(f"{column}=?")
            args.append(value)
    cap = svc.settings.jobs_list_max
    rows = svc.db.reader().execute(f"SELECT * FROM jobs WHERE {' AND '.join(where)}"
                                   " ORDER BY seq DESC LIMIT ?", (*args, min(cap, limit or cap)))
    return [to_dict(r) for r in rows]


def counts(svc: Services, chat_id: str | None = None) -> dict[str, int]:
    """How many jobs are in each state (for health and the panel)."""
    where, args = ("chat_id=?", [chat_id]) if chat_id else ("1", [])
    found = dict(svc.db.reader().execute(
        f"SELECT state, count(*) FROM jobs WHERE {where} GROUP BY state", args).fetchall())
    return {s: found.get(s, 0) for s in STATES}


# --- enqueue ---------------------------------------------------------------------------------
def enqueue(svc: Services, kind: str, *, chat_id: str | None = None, turn_id: str | None = None,
            ref: str | None = None, target: dict[str, Any] | None = None,
            prompt: Prompt | None = None, dedupe: bool = True, not_before: str | None = None) -> str:
    """Queue a job (joining the caller's write transaction if there is one); returns its id.

    With `dedupe` and a `ref`, a pending job of the same kind, chat and ref is reused: it has not
    started, so it will read the current state when it runs. `not_before`: not due before then.
    """
    now = svc.clock.iso()
    with svc.db.write() as conn:
        if dedupe and ref is not None:
            found = conn.execute("SELECT id FROM jobs WHERE kind=? AND ref=? AND chat_id IS ? AND"
                                 " state='pending'", (kind, ref, chat_id)).fetchone()
            if found:
                return found[0]
        job_id = "j_" + uuid.uuid4().hex
        payload = {"target": target or {}, "prompt": prompt.to_payload() if prompt else None}
        conn.execute(
            "INSERT INTO jobs(id, kind, chat_id, turn_id, ref, state, max_attempts, not_before,"
            " payload, created_at, updated_at) VALUES (?,?,?,?,?,'pending',?,?,?,?,?)",
            (job_id, kind, chat_id, turn_id, ref, svc.settings.job_max_attempts, not_before or now,
             dumps(payload), now, now))
        # Wake the worker once the job is committed: woken earlier, it would not see the job yet.
        svc.db.after_commit(svc.jobs_wake.set)
    return job_id


# --- claiming --------------------------------------------------------------------------------
def postpone(conn: Connection, kind: str, chat_id: str, ref: str, not_before: str) -> int:
    """Move a pending job of a kind, chat and ref to `not_before`; returns how many were moved."""
    return conn.execute("UPDATE jobs SET not_before=? WHERE kind=? AND chat_id=? AND ref=? AND"
                        " state='pending'", (not_before, kind, chat_id, ref)).rowcount


def later(svc: Services, seconds: float) -> str:
    return to_iso(svc.clock.now() + timedelta(seconds=seconds))


def reclaim_expired(svc: Services, conn: Connection) -> int:
    """Running jobs past their lease go back to the queue (or fail, out of attempts). Inside a write."""
    now = svc.clock.iso()
    rows = conn.execute("SELECT * FROM jobs WHERE state='running' AND lease_until < ?", (now,)).fetchall()
    for row in rows:
        error = f"timed out: not finished before its lease ended at {row['lease_until']}"
        if row["attempts"] >= row["max_attempts"]:
            conn.execute("UPDATE jobs SET state='failed', error=?, lease_until=NULL, updated_at=?,"
                         " finished_at=? WHERE seq=?", (error, now, now, row["seq"]))
        else:
            conn.execute("UPDATE jobs SET state='pending', error=?, lease_until=NULL, not_before=?,"
                         " updated_at=? WHERE seq=?", (error, now, now, row["seq"]))
    return len(rows)


def _day_start(svc: Services) -> str:
    now = svc.clock.now()
    return to_iso(now - timedelta(hours=now.hour, minutes=now.minute, seconds=now.second,
                                  microseconds=now.microsecond))


def tokens_today(svc: Services, conn: Connection) -> int:
    """Model tokens (read and written) of the jobs that ran since midnight UTC."""
    return int(conn.execute("SELECT coalesce(sum(prompt_tokens + completion_tokens), 0) FROM jobs"
                            " WHERE model_calls > 0 AND updated_at >= ?", (_day_start(svc),)).fetchone()[0])


def model_gate(svc: Services, conn: Connection, model_kinds: Sequence[str]) -> str | None:
    """Why no model job may start now, in plain words, or None. Read inside the claiming write
    transaction, so two claimers (the worker, browser tabs in client mode) cannot both pass."""
    s = svc.settings
    if s.llm_mode == "extractive" or not model_kinds:
        return None
    if s.jobs_paused:
        return "paused: model jobs are paused (setting jobs_paused)"
    if s.llm_daily_token_cap and tokens_today(svc, conn) >= s.llm_daily_token_cap:
        return (f"waiting: today's {s.llm_daily_token_cap} model tokens are used up "
                "(setting llm_daily_token_cap); jobs go on tomorrow")
    marks = ",".join("?" * len(model_kinds))
    running, last = conn.execute(
        f"SELECT count(*) FILTER (WHERE state='running'), max(claimed_at) FROM jobs WHERE kind IN ({marks})",
        tuple(model_kinds)).fetchone()
    if running >= s.llm_concurrency:
        return f"busy: {running} model call(s) running, the most allowed at once (setting llm_concurrency)"
    if s.llm_min_gap_seconds and last and \
            (svc.clock.now() - parse_iso(last)).total_seconds() < s.llm_min_gap_seconds:
        return f"waiting: at least {s.llm_min_gap_seconds:g} s between model calls (setting llm_min_gap_seconds)"
    return None


def claim_next(svc: Services, conn: Connection, by: str, kinds: list[str],
           chat_id: str | None = None) -> Job | None:
    """The next due job of `kinds` (model kinds only while `model_gate` lets them), now running."""
    reclaim_expired(svc, conn)
    model_kinds = [k for k in kinds if (h := svc.jobs.handler(k)) is not None and h.llm]
    if model_gate(svc, conn, model_kinds) is not None:
        kinds = [k for k in kinds if k not in model_kinds]
    if not kinds:
        return None
    now = svc.clock.iso()
    marks = ",".join("?" * len(kinds))
    extra, args = ("AND chat_id=?", [chat_id]) if chat_id else ("", [])
    # Local work first: it never waits for a model, and a model job's prompt may read what it
    # writes (a sheet drafted at the session end), so a shared call finds it done.
    local = [k for k in kinds if k not in model_kinds] or [""]
    first = ",".join("?" * len(local))
    row = conn.execute(f"SELECT * FROM jobs WHERE state='pending' AND not_before <= ? AND kind IN"
                       f" ({marks}) {extra} ORDER BY kind IN ({first}) DESC, seq LIMIT 1",
                       (now, *kinds, *args, *local)).fetchone()
    if row is None:
        return None
    return claim_row(svc, conn, row, by)


def claim_row(svc: Services, conn: Connection, row: Any, by: str) -> Job | None:
    """Claim one job row that is still pending (now running, for `by`); None if it no longer is."""
    now = svc.clock.iso()
    lease = svc.settings.job_client_lease_seconds if by == "client" else svc.settings.job_lease_seconds
    done = conn.execute("UPDATE jobs SET state='running', attempts=attempts+1, claimed_by=?, lease_until=?,"
                        " updated_at=?, claimed_at=? WHERE seq=? AND state='pending'",
                        (by, later(svc, float(lease)), now, now, row["seq"]))
    return job_of(row_of(conn, row["id"])) if done.rowcount == 1 else None


def pending_of_chat(svc: Services, conn: Connection, chat_id: str, limit: int) -> list[Any]:
    """The due pending jobs of one chat, oldest first."""
    return conn.execute("SELECT * FROM jobs WHERE state='pending' AND not_before <= ? AND chat_id=?"
                        " ORDER BY seq LIMIT ?", (svc.clock.iso(), chat_id, limit)).fetchall()


def still_mine(conn: Connection, job: Job) -> bool:
    """The job is still this attempt's: not rolled back, reclaimed, or finished by someone else."""
    row = row_of(conn, job.id)
    return (row is not None and row["state"] == "running" and row["attempts"] == job.attempts
            and row["claimed_by"] == job.claimed_by)


def retry(svc: Services, job_id: str) -> dict[str, Any]:
    """Give a failed job a fresh set of attempts."""
    with svc.db.write() as conn:
        row = row_of(conn, job_id)
        if row is None:
            raise NotFound("job_not_found", f"No job with id {job_id!r}.")
        if row["state"] != "failed":
            raise Conflict("job_not_failed", f"Job {job_id} is {row['state']}; only a failed job can be retried.")
        now = svc.clock.iso()
        conn.execute("UPDATE jobs SET state='pending', attempts=0, not_before=?, error=NULL,"
                     " finished_at=NULL, updated_at=? WHERE id=?", (now, now, job_id))
        svc.db.after_commit(svc.jobs_wake.set)
    return get(svc, job_id)


def anything_to_claim(svc: Services, kinds: list[str]) -> bool:
    """Whether a job of these kinds is due (or a lease ran out). A read-only look first, so an
    idle poll opens no write transaction (a write would bump `db.generation` and empty the caches
    keyed by it)."""
    if not kinds:
        return False
    now = svc.clock.iso()
    marks = ",".join("?" * len(kinds))
    return svc.db.reader().execute(
        f"SELECT 1 FROM jobs WHERE (state='pending' AND not_before <= ? AND kind IN ({marks}))"
        " OR (state='running' AND lease_until < ?) LIMIT 1", (now, *kinds, now)).fetchone() is not None


def next_due_in(svc: Services, kinds: list[str]) -> float | None:
    """Seconds until the earliest pending job of these kinds is due, or None if none waits."""
    if not kinds:
        return None
    row = svc.db.reader().execute(
        f"SELECT min(not_before) FROM jobs WHERE state='pending' AND kind IN ({','.join('?' * len(kinds))})",
        kinds).fetchone()
    if row[0] is None:
        return None
    return max(0.0, (parse_iso(row[0]) - svc.clock.now()).total_seconds())


# --- finishing: inside the worker's write transaction ----------------------------------------
def mark_done(svc: Services, conn: Connection, job_id: str, result: Any) -> None:
    """The job is done; `result` is kept as what it wrote."""
    now = svc.clock.iso()
    conn.execute("UPDATE jobs SET state='done', result=?, error=NULL, lease_until=NULL,"
                 " updated_at=?, finished_at=? WHERE id=?", (dumps(result), now, now, job_id))


def mark_retry(svc: Services, conn: Connection, job_id: str, error: str, delay: float) -> None:
    """A failed attempt: back to the queue after `delay` seconds."""
    now = svc.clock.iso()
    conn.execute("UPDATE jobs SET state='pending', error=?, lease_until=NULL, not_before=?,"
                 " updated_at=? WHERE id=?", (error, later(svc, delay), now, job_id))


def mark_failed(svc: Services, conn: Connection, job_id: str, error: str) -> None:
    """The job failed for good."""
    now = svc.clock.iso()
    conn.execute("UPDATE jobs SET state='failed', error=?, lease_until=NULL, updated_at=?,"
                 " finished_at=? WHERE id=?", (error, now, now, job_id))


def record_cost(conn: Connection, job_id: str, prompt_tokens: int, completion_tokens: int,
                calls: int, model_ms: int) -> None:
    """Add one attempt's model cost to the job (inside the transaction that finishes the attempt)."""
    conn.execute("UPDATE jobs SET prompt_tokens=prompt_tokens+?, completion_tokens=completion_tokens+?,"
                 " model_calls=model_calls+?, model_ms=model_ms+? WHERE id=?",
                 (prompt_tokens, completion_tokens, calls, model_ms, job_id))


def stats(svc: Services, chat_id: str | None = None) -> dict[str, Any]:
    """What the model work cost, per kind, today and in all (`GET /v1/jobs/stats`)."""
    where, args = ("chat_id=?", [chat_id]) if chat_id else ("1", [])
    conn = svc.db.reader()
    sums = ("count(*), coalesce(sum(model_calls),0), coalesce(sum(prompt_tokens),0),"
            " coalesce(sum(completion_tokens),0), coalesce(sum(model_ms),0)")
    names = ("jobs", "calls", "prompt_tokens", "completion_tokens", "model_ms")

    def total(extra: str = "", more: tuple[Any, ...] = ()) -> dict[str, int]:
        row = conn.execute(f"SELECT {sums} FROM jobs WHERE {where} {extra}", (*args, *more)).fetchone()
        return dict(zip(names, (int(x) for x in row)))

    by_kind: dict[str, dict[str, Any]] = {}
    for row in conn.execute(f"SELECT kind, {sums} FROM jobs WHERE {where} GROUP BY kind", args):
        by_kind[row[0]] = {**dict(zip(names, (int(x) for x in row[1:]))),
                           "first_try": 0, "retry": 0, "fallback": 0, "extractive": 0}
    for kind, answer, n in conn.execute(
            f"SELECT kind, json_extract(result, '$.model.answer'), count(*) FROM jobs WHERE {where}"
            " AND state='done' AND json_extract(result, '$.model.answer') IS NOT NULL"
            " GROUP BY 1, 2", args):
        if kind in by_kind and answer in by_kind[kind]:
            by_kind[kind][answer] = n
    return {"chat_id": chat_id, "today": total("AND updated_at >= ?", (_day_start(svc),)),
            "total": total(), "by_kind": by_kind, "tokens_today_all_chats": tokens_today(svc, conn),
            "daily_token_cap": svc.settings.llm_daily_token_cap, "paused": svc.settings.jobs_paused,
            "waiting": model_gate(svc, conn, [k for k, h in svc.jobs.items() if h.llm])}


def store_prompt(conn: Connection, job_id: str, prompt: dict[str, Any]) -> Any:
    """Keep the prompt a claimed job was given (client mode); returns the job's row."""
    row = row_of(conn, job_id)
    conn.execute("UPDATE jobs SET payload=? WHERE id=?",
                 (dumps({**loads(row["payload"]), "prompt": prompt}), job_id))
    return row


# --- lifecycle -------------------------------------------------------------------------------
def recover(svc: Services) -> int:
    """At startup: jobs a stopped sidecar left running go back to the queue; the interrupted
    attempt does not count."""
    now = svc.clock.iso()
    with svc.db.write() as conn:
        return conn.execute(
            "UPDATE jobs SET state='pending', attempts=max(0, attempts-1), lease_until=NULL,"
            " not_before=?, error='interrupted by a restart', updated_at=? WHERE state='running'",
            (now, now)).rowcount


def delete_for_chat(conn: Connection, chat_id: str) -> int:
    return conn.execute("DELETE FROM jobs WHERE chat_id=?", (chat_id,)).rowcount


def rollback_turn(conn: Connection, chat_id: str, turn_id: str) -> list[str]:
    """RV10: a regenerated turn's jobs go, whatever their state (a running one's late result is
    then discarded). Returns their ids; what done ones wrote is removed by the modules that wrote it."""
    ids = [r[0] for r in conn.execute("SELECT id FROM jobs WHERE chat_id=? AND turn_id=?",
                                      (chat_id, turn_id))]
    conn.executemany("DELETE FROM jobs WHERE id=?", [(i,) for i in ids])
    return ids


def ids_of_turn(conn: Connection, chat_id: str, turn_id: str, kinds: Sequence[str]) -> list[str]:
    """The ids of one turn's jobs of some kinds, whatever their state."""
    marks = ",".join("?" * len(kinds))
    return [r[0] for r in conn.execute(
        f"SELECT id FROM jobs WHERE chat_id=? AND turn_id=? AND kind IN ({marks})", (chat_id, turn_id, *kinds))]


def cancel(conn: Connection, chat_id: str, kinds: list[str], ref: str | None = None) -> int:
    """Drop not-yet-finished jobs of some kinds (and one ref) of a chat (e.g. before a rebuild)."""
    marks = ",".join("?" * len(kinds))
    extra, args = ("AND ref=?", [ref]) if ref is not None else ("", [])
    return conn.execute(f"DELETE FROM jobs WHERE chat_id=? AND kind IN ({marks}) AND state IN"
                        f" ('pending','running','failed') {extra}", (chat_id, *kinds, *args)).rowcount


