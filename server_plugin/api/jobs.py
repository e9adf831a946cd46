"""Background jobs: the panel's list, retry, and client mode (the extension claims a job, runs
its prompt through SillyTavern's model, and posts the answer back)."""

from __future__ import annotations

from flask import Blueprint

from ..jobs import queue, worker
from .common import body, path_id, query, svc

bp = Blueprint("jobs", __name__)


@bp.get("/jobs")
def list_jobs() -> dict:
    args = query("jobs_list.query")
    return {"jobs": queue.list_jobs(svc(), **args), "counts": queue.counts(svc(), args.get("chat_id"))}


@bp.get("/jobs/stats")
def job_stats() -> dict:
    args = query("jobs_stats.query")
    return queue.stats(svc(), args.get("chat_id"))


@bp.get("/jobs/<job_id>")
def get_job(job_id: str) -> dict:
    return {"job": queue.get(svc(), path_id(job_id, "job id"))}


@bp.post("/jobs/claim")
def claim_job() -> dict:
    data = body("job_claim.request")
    return {"job": worker.claim(svc(), data.get("kinds"), data.get("chat_id")),
            "mode": svc().settings.llm_mode}


@bp.post("/jobs/<job_id>/complete")
def complete_job(job_id: str) -> dict:
    data = body("job_complete.request")
    return {"job": worker.complete(svc(), path_id(job_id, "job id"), data["text"], data.get("attempt"))}


@bp.post("/jobs/<job_id>/fail")
def fail_job(job_id: str) -> dict:
    data = body("job_fail.request")
    return {"job": worker.fail(svc(), path_id(job_id, "job id"), data["error"],
                             data.get("retryable", True), data.get("attempt"))}


@bp.post("/jobs/<job_id>/retry")
def retry_job(job_id: str) -> dict:
    body("empty.request")
    return {"job": queue.retry(svc(), path_id(job_id, "job id"))}
