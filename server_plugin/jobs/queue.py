"""The persistent job queue, its handlers, and the worker thread that runs them.

Every piece of background LLM work (summarise a chunk, merge tiers, summarise a session, file deep
memories, and whatever other modules register) is a row in `jobs`: state pending → running →
done | failed, with attempts, a `not_before` time for backoff and a lease. Routes only enqueue;
a reply never waits for a job.

A kind is registered with `register(kind, apply, build=…, prepare=…)`:
- `build(svc, job) -> Prompt | None` renders the prompt when the job is run or claimed (so a merge
  reads the texts as they are then, edits included); None means there is nothing left to do.
  Without `build`, the prompt stored at `enqueue(prompt=…)` is used.
- `prepare(svc, job, result) -> Any` runs outside any transaction (e.g. to embed texts);
- `apply(svc, conn, job, result, prepared) -> dict | None` stores the result inside the write
  transaction that marks the job done; what it returns is kept as the job's `result`.

Who runs a job depends on `llm_mode`: `extractive` and `openai` — the worker thread here (through
`llm.run_prompt`); `client` — the SillyTavern extension, via `claim()` and `complete()` (the
worker then runs only kinds registered with `llm=False`). A claimed job not finished before its
`lease_until` goes back to the queue; jobs left running by a stopped sidecar go back at startup.
"""

from __future__ import annotations

import logging
import threading
import uuid
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Callable

from . import llm, prompts
from .. import priority
from ..clock import parse_iso, to_iso
from ..store.db import Connection, dumps, loads, sqlite3
from ..errors import Conflict, NotFound, Unprocessable
from ..services import Services

log = logging.getLogger(__name__)

STATES = ("pending", "running", "done", "failed")
LIVE = ("pending", "running")


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


ApplyFn = Callable[[Services, Connection, Job, Any, Any], "dict[str, Any] | None"]
BuildFn = Callable[[Services, Job], "prompts.Prompt | None"]
PrepareFn = Callable[[Services, Job, Any], Any]


@dataclass(frozen=True)
class Handler:
    """How to run one kind of job (see the module docstring)."""

    kind: str
    apply: ApplyFn
    build: BuildFn | None = None
    prepare: PrepareFn | None = None
    llm: bool = True


_HANDLERS: dict[str, Handler] = {}


def register(kind: str, apply: ApplyFn, *, build: BuildFn | None = None,
             prepare: PrepareFn | None = None, llm: bool = True) -> Handler:
    """Make a job kind runnable (re-registering a kind replaces its handler).

    `llm=False` marks work that needs no model (the worker runs it in every mode; `apply` then
    gets `result=True`)."""
    handler = Handler(kind, apply, build, prepare, llm)
    _HANDLERS[kind] = handler
    return handler


def registered() -> list[str]:
    return sorted(_HANDLERS)


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


def _job(row: Any) -> Job:
    payload = loads(row["payload"])
    return Job(row["id"], row["kind"], row["chat_id"], row["turn_id"], row["ref"], row["attempts"],
               row["claimed_by"], payload.get("target") or {}, payload.get("prompt"))


def _row(conn: Connection, job_id: str) -> Any:
    return conn.execute("SELECT * FROM jobs WHERE id=?", (job_id,)).fetchone()


def get(svc: Services, job_id: str) -> dict[str, Any]:
    row = _row(svc.db.reader(), job_id)
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
    cap = int(svc.settings.jobs_list_max)
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
            prompt: prompts.Prompt | None = None, dedupe: bool = True) -> str:
    """Queue a job (joining the caller's write transaction if there is one); returns its id.

    With `dedupe` and a `ref`, a pending job of the same kind, chat and ref is reused: it has not
    started, so it will read the current state when it runs.
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
            (job_id, kind, chat_id, turn_id, ref, int(svc.settings.job_max_attempts), now,
             dumps(payload), now, now))
        # Wake the worker once the job is committed: woken earlier, it would not see the job yet.
        svc.db.after_commit(svc.jobs_wake.set)
    return job_id


# --- claiming --------------------------------------------------------------------------------
def _later(svc: Services, seconds: float) -> str:
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


def _claim(svc: Services, conn: Connection, by: str, kinds: list[str],
           chat_id: str | None = None) -> Job | None:
    reclaim_expired(svc, conn)
    if not kinds:
        return None
    now = svc.clock.iso()
    marks = ",".join("?" * len(kinds))
    extra, args = ("AND chat_id=?", [chat_id]) if chat_id else ("", [])
    row = conn.execute(f"SELECT * FROM jobs WHERE state='pending' AND not_before <= ? AND kind IN"
                       f" ({marks}) {extra} ORDER BY seq LIMIT 1", (now, *kinds, *args)).fetchone()
    if row is None:
        return None
    lease = svc.settings.job_client_lease_seconds if by == "client" else svc.settings.job_lease_seconds
    conn.execute("UPDATE jobs SET state='running', attempts=attempts+1, claimed_by=?, lease_until=?,"
                 " updated_at=? WHERE seq=?", (by, _later(svc, float(lease)), now, row["seq"]))
    return _job(_row(conn, row["id"]))


def _anything_to_claim(svc: Services, kinds: list[str]) -> bool:
    """A read-only look first, so an idle poll opens no write transaction (a write would bump
    `db.generation` and empty the caches keyed by it)."""
    if not kinds:
        return False
    now = svc.clock.iso()
    marks = ",".join("?" * len(kinds))
    return svc.db.reader().execute(
        f"SELECT 1 FROM jobs WHERE (state='pending' AND not_before <= ? AND kind IN ({marks}))"
        " OR (state='running' AND lease_until < ?) LIMIT 1", (now, *kinds, now)).fetchone() is not None


def _runnable_here(svc: Services) -> list[str]:
    """Kinds the worker runs: all in extractive/openai mode; only non-LLM kinds in client mode."""
    client = svc.settings.llm_mode == "client"
    return [k for k, h in _HANDLERS.items() if not (client and h.llm)]


def _still_mine(conn: Connection, job: Job) -> bool:
    """The job is still this attempt's: not rolled back, reclaimed, or finished by someone else."""
    row = _row(conn, job.id)
    return (row is not None and row["state"] == "running" and row["attempts"] == job.attempts
            and row["claimed_by"] == job.claimed_by)


# --- running ---------------------------------------------------------------------------------
def _prompt_for(svc: Services, job: Job, handler: Handler) -> prompts.Prompt | None:
    if handler.build is not None:
        return handler.build(svc, job)
    return prompts.Prompt.from_payload(job.prompt) if job.prompt else None


def _finish(svc: Services, job: Job, handler: Handler, result: Any) -> bool:
    """Store a result and mark the job done, in one transaction; False if the job was not ours."""
    prepared = handler.prepare(svc, job, result) if handler.prepare and result is not None else None
    with svc.db.write() as conn:
        if not _still_mine(conn, job):
            return False
        written = handler.apply(svc, conn, job, result, prepared) if result is not None else \
            {"skipped": "nothing left to do"}
        now = svc.clock.iso()
        conn.execute("UPDATE jobs SET state='done', result=?, error=NULL, lease_until=NULL,"
                     " updated_at=?, finished_at=? WHERE id=?", (dumps(written), now, now, job.id))
    return True


def _retryable(exc: BaseException) -> bool:
    if isinstance(exc, prompts.PromptParseError):
        return True  # the model may follow the format next time
    return bool(getattr(exc, "retryable", True))


def _delay(svc: Services, attempts: int, exc: BaseException) -> float:
    asked = getattr(exc, "retry_after", None)
    if asked is not None:
        return float(asked)
    base, ceiling = float(svc.settings.job_backoff_base_seconds), float(svc.settings.job_backoff_max_seconds)
    return min(ceiling, base * (2 ** max(0, attempts - 1)))


def fail_attempt(svc: Services, job: Job, exc: BaseException) -> dict[str, Any] | None:
    """Record a failed attempt: back to the queue after a backoff, or failed for good."""
    message = f"{type(exc).__name__}: {exc}"[:2000]
    with svc.db.write() as conn:
        if not _still_mine(conn, job):
            return None
        row = _row(conn, job.id)
        now = svc.clock.iso()
        if _retryable(exc) and row["attempts"] < row["max_attempts"]:
            conn.execute("UPDATE jobs SET state='pending', error=?, lease_until=NULL, not_before=?,"
                         " updated_at=? WHERE id=?",
                         (message, _later(svc, _delay(svc, row["attempts"], exc)), now, job.id))
        else:
            conn.execute("UPDATE jobs SET state='failed', error=?, lease_until=NULL, updated_at=?,"
                         " finished_at=? WHERE id=?", (message, now, now, job.id))
        return to_dict(_row(conn, job.id))


def _execute(svc: Services, job: Job) -> None:
    handler = _HANDLERS[job.kind]
    try:
        result: Any = True
        if handler.llm:
            prompt = _prompt_for(svc, job, handler)
            _step_aside(svc)
            result = None if prompt is None else llm.run_prompt(
                prompt, llm.backend_from_settings(svc.settings),
                json_mode=svc.settings.llm_json_mode, temperature=float(svc.settings.llm_temperature))
            _step_aside(svc)
        _finish(svc, job, handler, result)
    except Exception as exc:  # every failure is recorded on the job, never lost
        if not isinstance(exc, (llm.LLMError, prompts.PromptParseError)):
            log.exception("job %s (%s) failed", job.id, job.kind)
        fail_attempt(svc, job, exc)


def _step_aside(svc: Services) -> None:
    """Between a job's steps (its prompt, the model or extractive run, storing the result), let
    the requests in flight finish first (priority.py; only the background worker waits)."""
    priority.step_aside(float(svc.settings.background_step_aside_seconds))


def run_one(svc: Services) -> str | None:
    """Claim and run the next due job this process runs; returns its id, or None if none was due."""
    kinds = _runnable_here(svc)
    if not _anything_to_claim(svc, kinds):
        return None
    with svc.db.write() as conn:
        job = _claim(svc, conn, "worker", kinds)
    if job is None:
        return None
    _execute(svc, job)
    return job.id


def run_pending(svc: Services, limit: int = 100_000) -> int:
    """Run due jobs until none is left (tests and benchmarks); returns how many ran."""
    ran = 0
    while ran < limit and run_one(svc) is not None:
        ran += 1
    return ran


# --- client mode: the extension runs the prompt ----------------------------------------------
def claim(svc: Services, kinds: list[str] | None = None, chat_id: str | None = None) -> dict[str, Any] | None:
    """Give the extension the next LLM job with the `generateRaw` arguments, or None."""
    if svc.settings.llm_mode != "client":
        return None
    wanted = [k for k, h in _HANDLERS.items() if h.llm and (kinds is None or k in kinds)]
    while _anything_to_claim(svc, wanted):
        with svc.db.write() as conn:
            job = _claim(svc, conn, "client", wanted, chat_id)
        if job is None:
            return None
        handler = _HANDLERS[job.kind]
        try:
            prompt = _prompt_for(svc, job, handler)
        except Exception as exc:
            log.exception("job %s (%s) could not be prepared", job.id, job.kind)
            fail_attempt(svc, job, exc)
            continue
        if prompt is None:
            _finish(svc, job, handler, None)
            continue
        with svc.db.write() as conn:
            row = _row(conn, job.id)
            payload = {**loads(row["payload"]), "prompt": prompt.to_payload()}
            conn.execute("UPDATE jobs SET payload=? WHERE id=?", (dumps(payload), job.id))
        return {"id": job.id, "kind": job.kind, "chat_id": job.chat_id, "attempt": job.attempts,
                "lease_until": row["lease_until"], "task": prompt.task, "request": prompt.for_client()}
    return None


def _client_job(svc: Services, job_id: str, attempt: int | None) -> tuple[Job, Any]:
    row = _row(svc.db.reader(), job_id)
    if row is None:
        raise NotFound("job_not_found", f"No job with id {job_id!r}.")
    if row["state"] != "running" or row["claimed_by"] != "client":
        raise Conflict("job_not_running", f"Job {job_id} is {row['state']}, not claimed by the extension: "
                       "its lease may have ended (claim it again).", [{"state": row["state"]}])
    if attempt is not None and attempt != row["attempts"]:
        raise Conflict("stale_attempt", f"Job {job_id} is at attempt {row['attempts']}, not {attempt}.")
    return _job(row), row


def complete(svc: Services, job_id: str, text: str, attempt: int | None = None) -> dict[str, Any]:
    """The extension's model answered: parse strictly and apply; a malformed answer fails the
    attempt (to be retried) and stores nothing."""
    job, _ = _client_job(svc, job_id, attempt)
    handler = _HANDLERS.get(job.kind)
    if handler is None or job.prompt is None:
        raise Conflict("job_not_runnable", f"Job {job_id} has no prompt or no handler here.")
    try:
        result = prompts.parse(prompts.Prompt.from_payload(job.prompt), text)
    except prompts.PromptParseError as exc:
        state = fail_attempt(svc, job, exc)
        raise Unprocessable("model_output_invalid", str(exc), [{"job": state}]) from None
    if not _finish(svc, job, handler, result):
        raise Conflict("job_not_running", f"Job {job_id} was rolled back or reclaimed meanwhile.")
    return get(svc, job_id)


def fail(svc: Services, job_id: str, error: str, retryable: bool = True,
         attempt: int | None = None) -> dict[str, Any]:
    """The extension could not run a claimed job."""
    job, _ = _client_job(svc, job_id, attempt)
    fail_attempt(svc, job, ClientFailure(error, retryable))
    return get(svc, job_id)


def retry(svc: Services, job_id: str) -> dict[str, Any]:
    """Give a failed job a fresh set of attempts."""
    with svc.db.write() as conn:
        row = _row(conn, job_id)
        if row is None:
            raise NotFound("job_not_found", f"No job with id {job_id!r}.")
        if row["state"] != "failed":
            raise Conflict("job_not_failed", f"Job {job_id} is {row['state']}; only a failed job can be retried.")
        now = svc.clock.iso()
        conn.execute("UPDATE jobs SET state='pending', attempts=0, not_before=?, error=NULL,"
                     " finished_at=NULL, updated_at=? WHERE id=?", (now, now, job_id))
        svc.db.after_commit(svc.jobs_wake.set)
    return get(svc, job_id)


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


def cancel(conn: Connection, chat_id: str, kinds: list[str], ref: str | None = None) -> int:
    """Drop not-yet-finished jobs of some kinds (and one ref) of a chat (e.g. before a rebuild)."""
    marks = ",".join("?" * len(kinds))
    extra, args = ("AND ref=?", [ref]) if ref is not None else ("", [])
    return conn.execute(f"DELETE FROM jobs WHERE chat_id=? AND kind IN ({marks}) AND state IN"
                        f" ('pending','running','failed') {extra}", (chat_id, *kinds, *args)).rowcount


def next_due_in(svc: Services) -> float | None:
    """Seconds until the earliest pending job this process runs is due, or None if none waits."""
    kinds = _runnable_here(svc)
    if not kinds:
        return None
    row = svc.db.reader().execute(
        f"SELECT min(not_before) FROM jobs WHERE state='pending' AND kind IN ({','.join('?' * len(kinds))})",
        kinds).fetchone()
    if row[0] is None:
        return None
    return max(0.0, (parse_iso(row[0]) - svc.clock.now()).total_seconds())


class Worker:
    """The background thread: runs due jobs, sleeps until woken by `enqueue` or the next due time."""

    def __init__(self, svc: Services) -> None:
        self.svc = svc
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="chronicler-jobs", daemon=True)

    def start(self) -> "Worker":
        self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        self.svc.jobs_wake.set()
        self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def _loop(self) -> None:
        with priority.background():  # a request's query embedding goes before a job's
            self._run()

    def _run(self) -> None:
        poll = float(self.svc.settings.worker_poll_seconds)
        while not self._stop.is_set():
            self.svc.jobs_wake.clear()
            _step_aside(self.svc)
            try:
                if run_one(self.svc) is not None:
                    continue
                due = next_due_in(self.svc)
            except sqlite3.ProgrammingError:
                return  # the database was closed: the sidecar is shutting down
            except Exception:
                log.exception("the job worker hit an error; it goes on")
                due = None
            self.svc.jobs_wake.wait(poll if due is None else min(poll, max(due, 0.01)))


def start(svc: Services) -> Worker | None:
    """At startup: recover interrupted jobs, then start the worker if `worker_enabled`."""
    recover(svc)
    return Worker(svc).start() if svc.settings.worker_enabled else None
