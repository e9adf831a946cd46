"""Running jobs: the worker thread of the sidecar, and the extension in client mode.

A job is claimed from the queue (`queue.claim_next`), its prompt built by its kind's handler, run
through `llm.run_prompt` (a model, or the extractive fallback) or by the extension's model
(`claim`, then `complete` or `fail`), and its result applied in the transaction that marks it
done. A failed attempt goes back to the queue after a backoff, or fails for good.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from .. import priority
from ..errors import Conflict, NotFound, Unprocessable
from ..services import Services
from ..core.tokens import get_counter
from ..store.db import sqlite3
from . import batch, calls, llm, queue
from .tasks.answers import Report
from .tasks.base import Prompt, PromptParseError
from .tasks.registry import task_of

log = logging.getLogger(__name__)


def runnable_here(svc: Services) -> list[str]:
    """Kinds the worker runs: all in extractive/openai mode; only non-LLM kinds in client mode."""
    client = svc.settings.llm_mode == "client"
    return [k for k, h in svc.jobs.items() if not (client and h.llm)]


# --- running ---------------------------------------------------------------------------------
def _prompt_for(svc: Services, job: queue.Job, handler: queue.Handler) -> Prompt | None:
    if handler.build is not None:
        return handler.build(svc, job)
    return Prompt.from_payload(job.prompt) if job.prompt else None


def _finish(svc: Services, job: queue.Job, handler: queue.Handler, result: Any,
            outcome: calls.Outcome | None = None) -> bool:
    """Store a result and mark the job done, in one transaction; False if the job was not ours.
    With a model `outcome`, the job's result says how the answer was used (`model`) and the job
    records what it cost."""
    prepared = handler.prepare(svc, job, result) if handler.prepare and result is not None else None
    with svc.db.write() as conn:
        if not queue.still_mine(conn, job):
            return False
        written = handler.apply(svc, conn, job, result, prepared) if result is not None else \
            {"skipped": "nothing left to do"}
        if outcome is not None:
            written = {**(written or {}), "model": outcome.summary()}
            queue.record_cost(conn, job.id, outcome.prompt_tokens, outcome.completion_tokens,
                              outcome.calls, outcome.model_ms)
        queue.mark_done(svc, conn, job.id, written)
    return True


def _retryable(exc: BaseException) -> bool:
    if isinstance(exc, PromptParseError):
        return True  # the model may follow the format next time
    return bool(getattr(exc, "retryable", True))


def _delay(svc: Services, attempts: int, exc: BaseException) -> float:
    asked = getattr(exc, "retry_after", None)
    if asked is not None:
        return float(asked)
    base, ceiling = svc.settings.job_backoff_base_seconds, svc.settings.job_backoff_max_seconds
    return min(ceiling, base * (2 ** max(0, attempts - 1)))


def fail_attempt(svc: Services, job: queue.Job, exc: BaseException,
                 outcome: calls.Outcome | None = None) -> dict[str, Any] | None:
    """Record a failed attempt (and what its model call cost): back to the queue after a
    backoff, or failed for good."""
    message = f"{type(exc).__name__}: {exc}"[:2000]
    with svc.db.write() as conn:
        if not queue.still_mine(conn, job):
            return None
        if outcome is not None:
            queue.record_cost(conn, job.id, outcome.prompt_tokens, outcome.completion_tokens,
                              outcome.calls, outcome.model_ms)
        row = queue.row_of(conn, job.id)
        if _retryable(exc) and row["attempts"] < row["max_attempts"]:
            queue.mark_retry(svc, conn, job.id, message, _delay(svc, row["attempts"], exc))
        else:
            queue.mark_failed(svc, conn, job.id, message)
        return queue.to_dict(queue.row_of(conn, job.id))


def _execute(svc: Services, job: queue.Job) -> None:
    handler = svc.jobs.handler(job.kind)
    try:
        result: Any = True
        outcome = None
        if handler.llm:
            prompt = _prompt_for(svc, job, handler)
            _step_aside(svc)
            if prompt is not None:
                # No retries inside the call: a job tries the model at most twice (calls.py).
                backend = llm.backend_from_settings(svc.settings, retries=0)
                if backend is not None:
                    members = batch.gather(svc, job, handler, prompt)
                    if len(members) > 1:
                        return _execute_shared(svc, members, backend)
                outcome = calls.run_job_prompt(calls.fit_answer(prompt, svc.settings), backend,
                                               **calls.model_options(svc.settings))
                result = outcome.result
                if backend is None:
                    outcome = None  # extractive: no model, no cost
            else:
                result = None
            _step_aside(svc)
        _finish(svc, job, handler, result, outcome)
    except Exception as exc:  # every failure is recorded on the job, never lost
        if not isinstance(exc, (llm.LLMError, PromptParseError)):
            log.exception("job %s (%s) failed", job.id, job.kind)
        fail_attempt(svc, job, exc)


def _execute_shared(svc: Services, members: list[batch.Member], backend: llm.Backend) -> None:
    """Jobs that read the same part: one model call, then each job stores its own section."""
    try:
        prompt = calls.fit_answer(batch.combined(members), svc.settings)
        outcome = calls.run_job_prompt(prompt, backend, **calls.model_options(svc.settings))
    except Exception as exc:  # the call never happened (or broke): every member tries again later
        if not isinstance(exc, llm.LLMError):
            log.exception("a shared call for jobs %s failed", [m.job.id for m in members])
        for member in members:
            fail_attempt(svc, member.job, exc)
        return
    _step_aside(svc)
    _finish_shared(svc, members, outcome)


def _finish_shared(svc: Services, members: list[batch.Member], outcome: calls.Outcome) -> bool | Exception:
    """Each job of a shared call stores its own section. Returns what became of the first (the
    leader): True stored, False no longer ours, or the exception its store raised (recorded)."""
    stored = [_store(svc, member.job, member.handler, result, share)
              for member, result, share in batch.split(members, outcome)]
    return stored[0]


def _store(svc: Services, job: queue.Job, handler: queue.Handler, result: Any,
           outcome: calls.Outcome) -> bool | Exception:
    """`_finish`, a failure recorded on the job (one job's store failing leaves the others of its
    call stored): True stored, False no longer ours, or the exception its store raised."""
    try:
        return _finish(svc, job, handler, result, outcome)
    except Exception as exc:
        log.exception("job %s (%s) failed", job.id, job.kind)
        fail_attempt(svc, job, exc)
        return exc


def _finish_client(svc: Services, job: queue.Job, handler: queue.Handler, members: list[batch.Member],
                   result: Any, outcome: calls.Outcome) -> None:
    """Store the extension's answer (for every job of its call); a store that failed is recorded
    on the job and raised as itself (a full disk is 507, a bug 500), never as a lost lease."""
    if members:
        outcome.result = result
        done = _finish_shared(svc, members, outcome)
    else:
        done = _store(svc, job, handler, result, outcome)
    if isinstance(done, Exception):
        raise done
    if not done:
        raise Conflict("job_not_running", f"Job {job.id} was rolled back or reclaimed meanwhile.")


def _step_aside(svc: Services) -> None:
    """Between a job's steps (its prompt, the model or extractive run, storing the result), let
    the requests in flight finish first (priority.py; only the background worker waits)."""
    priority.step_aside(svc.settings.background_step_aside_seconds)


def run_one(svc: Services) -> str | None:
    """Claim and run the next due job this process runs; returns its id, or None if none was due."""
    kinds = runnable_here(svc)
    if not queue.anything_to_claim(svc, kinds):
        return None
    with svc.db.write() as conn:
        job = queue.claim_next(svc, conn, "worker", kinds)
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
    wanted = [k for k, h in svc.jobs.items() if h.llm and (kinds is None or k in kinds)]
    while queue.anything_to_claim(svc, wanted):
        with svc.db.write() as conn:
            job = queue.claim_next(svc, conn, "client", wanted, chat_id)
        if job is None:
            return None
        handler = svc.jobs.handler(job.kind)
        try:
            prompt = _prompt_for(svc, job, handler)
        except Exception as exc:
            log.exception("job %s (%s) could not be prepared", job.id, job.kind)
            fail_attempt(svc, job, exc)
            continue
        if prompt is None:
            _finish(svc, job, handler, None)
            continue
        members = batch.gather(svc, job, handler, prompt, by="client", kinds=wanted)
        if len(members) > 1:
            prompt = batch.combined(members)
        prompt = calls.fit_answer(prompt, svc.settings)
        with svc.db.write() as conn:
            row = queue.store_prompt(conn, job.id, prompt.to_payload())
            for member in members[1:]:
                queue.store_prompt(conn, member.job.id, member.prompt.to_payload())
        out = {"id": job.id, "kind": job.kind, "chat_id": job.chat_id, "attempt": job.attempts,
               "lease_until": row["lease_until"], "task": prompt.task, "request": prompt.for_client()}
        if len(members) > 1:
            out["shared_with"] = [m.job.id for m in members]
        return out
    return None


def _client_job(svc: Services, job_id: str, attempt: int | None) -> tuple[queue.Job, Any]:
    row = queue.row_of(svc.db.reader(), job_id)
    if row is None:
        raise NotFound("job_not_found", f"No job with id {job_id!r}.")
    if row["state"] != "running" or row["claimed_by"] != "client":
        raise Conflict("job_not_running", f"Job {job_id} is {row['state']}, not claimed by the extension: "
                       "its lease may have ended (claim it again).", [{"state": row["state"]}])
    if attempt is not None and attempt != row["attempts"]:
        raise Conflict("stale_attempt", f"Job {job_id} is at attempt {row['attempts']}, not {attempt}.")
    return queue.job_of(row), row


def complete(svc: Services, job_id: str, text: str, attempt: int | None = None) -> dict[str, Any]:
    """The extension's model answered: read it keeping its valid parts and apply; an answer with
    nothing to keep fails the first attempt (to be retried) and stores nothing; after a second
    such answer the result comes from the text itself (the job's result says why)."""
    job, _ = _client_job(svc, job_id, attempt)
    handler = svc.jobs.handler(job.kind)
    if handler is None or job.prompt is None:
        raise Conflict("job_not_runnable", f"Job {job_id} has no prompt or no handler here.")
    prompt = Prompt.from_payload(job.prompt)
    outcome = calls.Outcome(None, "first_try" if job.attempts <= 1 else "retry", Report(), None,
                            calls.count_messages(prompt.messages), get_counter().count(text), 1)
    members = batch.members_of(svc, job, prompt)  # a shared call's jobs, the leader first
    try:
        result = task_of(prompt).parse_answer(prompt, text, outcome.report)
    except PromptParseError as exc:
        if job.attempts < calls.TRIES:
            state = fail_attempt(svc, job, exc, outcome)
            for member in members[1:]:
                fail_attempt(svc, member.job, exc)
            raise Unprocessable("model_output_invalid", str(exc), [{"job": state}]) from None
        # The second answer could not be used either: the result comes from the text itself.
        result = task_of(prompt).fallback(prompt, None)
        outcome.answer, outcome.error = "fallback", (
            "The model's answer could not be used after two tries, so this result was made from "
            f"the text itself. Last try: {exc.reason}")
    _finish_client(svc, job, handler, members, result, outcome)
    return queue.get(svc, job_id)


def fail(svc: Services, job_id: str, error: str, retryable: bool = True,
         attempt: int | None = None) -> dict[str, Any]:
    """The extension could not run a claimed job."""
    job, _ = _client_job(svc, job_id, attempt)
    failure = queue.ClientFailure(error, retryable)
    fail_attempt(svc, job, failure)
    if job.prompt is not None:  # the jobs that were to share its call go back with it
        for member in batch.members_of(svc, job, Prompt.from_payload(job.prompt))[1:]:
            fail_attempt(svc, member.job, failure)
    return queue.get(svc, job_id)


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
        # A request's query embedding goes before a job's; its Python work before the job's too.
        with priority.background(yield_calls=self.svc.settings.background_yield_calls):
            self._run()

    def _run(self) -> None:
        poll = self.svc.settings.worker_poll_seconds
        while not self._stop.is_set():
            self.svc.jobs_wake.clear()
            _step_aside(self.svc)
            try:
                if run_one(self.svc) is not None:
                    continue
                due = queue.next_due_in(self.svc, runnable_here(self.svc))
            except sqlite3.ProgrammingError:
                return  # the database was closed: the sidecar is shutting down
            except Exception:
                log.exception("the job worker hit an error; it goes on")
                due = None
            self.svc.jobs_wake.wait(poll if due is None else min(poll, max(due, 0.01)))


def start(svc: Services) -> Worker | None:
    """At startup: recover interrupted jobs, then start the worker if `worker_enabled`."""
    queue.recover(svc)
    return Worker(svc).start() if svc.settings.worker_enabled else None
