"""One model call for the jobs of a chat that read the same part of the transcript (rule MJ1).

When the worker is about to call a model for a job whose task has a section in a per-part call
(`tasks/parts.SECTIONS`: summaries, deep memory, character memories, scenes, told events, the
session summary, sheet updates, lore growth), it first looks at the chat's other due jobs of such
kinds. Those whose prompts read exactly the same messages (and name the same characters) are
claimed too, up to `part_call_max_jobs` in all, and the model reads the part once: each job is a
section of one answer (`parts.combine`). Every job keeps its own row, its own `prepare` and
`apply` (and so its own checks: verified quotes, witnesses, locked fields), and records its share
of the call's cost (by the size of its own prompt; the call itself is counted once, on the job
that led it). A section that cannot be used falls back for its job alone. A companion's prompt is
built ahead of its turn, so never ahead of a pending job that writes what it reads
(`Handler.feeds`); local work is claimed first anyway (`queue.claim_next`).

The worker batches in `openai` mode; in client mode `worker.claim` gives the extension the shared
prompt under the leader's id (the companions are claimed for the extension too, with the same
lease), and `worker.complete` splits its answer the same way (`members_of`). In extractive mode
there is no model to share.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from ..core.tokens import get_counter
from . import queue
from .tasks import parts
from .tasks.answers import Report

if TYPE_CHECKING:
    from ..services import Services
    from .calls import Outcome
    from .tasks.base import Prompt

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Member:
    """One job of a shared call: the job, its handler, its own prompt and its key in the answer."""

    job: queue.Job
    handler: queue.Handler
    prompt: Prompt
    key: str


def in_parts(svc: Services) -> bool:
    """Whether the transcript is read in parts (MJ1): with a model (`openai`, `client`) and
    `part_tokens` set. Without a model, jobs stay per chunk and per session end (cheap local work)."""
    return svc.settings.llm_mode != "extractive" and svc.settings.part_tokens > 0


def joinable_kinds(svc: Services) -> list[str]:
    """The registered model kinds whose task can be a section of a per-part call."""
    return [k for k, h in svc.jobs.items() if h.llm and h.build is not None and k in parts.BY_TASK]


def _key(prompt: Prompt, taken: set[str]) -> str:
    base = parts.BY_TASK[prompt.task].key
    key, n = base, 1
    while key in taken:
        n += 1
        key = f"{base}_{n}"
    taken.add(key)
    return key


def gather(svc: Services, leader: queue.Job, handler: queue.Handler, prompt: Prompt,
           by: str = "worker", kinds: list[str] | None = None) -> list[Member]:
    """The leader and the companions claimed (for `by`: the worker or the extension, of `kinds`
    when given) to share its call; just the leader when none can."""
    most = svc.settings.part_call_max_jobs
    if most <= 1 or leader.chat_id is None or prompt.task not in parts.BY_TASK:
        return [Member(leader, handler, prompt, prompt.task)]
    taken: set[str] = set()
    members = [Member(leader, handler, prompt, _key(prompt, taken))]
    joinable = set(joinable_kinds(svc))
    if kinds is not None:
        joinable &= set(kinds)
    chosen: list[tuple[Any, queue.Handler, Prompt]] = []
    # A job's prompt is built now, ahead of its turn: never ahead of a pending job that writes what
    # it reads (`Handler.feeds`: a sheet drafted at the session end is in the sheet updates' prompt).
    waiting: set[str] = set(handler.feeds)
    for row in queue.pending_of_chat(svc, svc.db.reader(), leader.chat_id, most * 4):
        if len(members) + len(chosen) >= most:
            break
        other = svc.jobs.handler(row["kind"])
        if other is None:
            continue
        waiting.update(other.feeds)
        if row["kind"] not in joinable or row["kind"] in waiting:
            continue
        try:
            built = other.build(svc, queue.job_of(row)) if other.build else None
        except Exception:  # its own run will record the failure; it just does not join
            log.exception("job %s (%s) could not be built to share a call", row["id"], row["kind"])
            continue
        if built is not None and parts.joins([prompt, *(p for _, _, p in chosen)], built):
            chosen.append((row, other, built))
    if not chosen:
        return members
    with svc.db.write() as conn:
        for row, other, built in chosen:
            job = queue.claim_row(svc, conn, row, by)
            if job is not None:  # not taken meanwhile
                members.append(Member(job, other, built, _key(built, taken)))
    return members


def combined(members: list[Member]) -> Prompt:
    """The one prompt of a shared call; its inputs name each section's job (`members_of`)."""
    prompt = parts.combine({m.key: m.prompt for m in members})
    prompt.inputs["jobs"] = {m.key: m.job.id for m in members}
    return prompt


def members_of(svc: Services, leader: queue.Job, prompt: Prompt) -> list[Member]:
    """The members of the shared call a client-mode job leads, from the prompt it was given:
    those still running for the extension (a job rolled back meanwhile is left out)."""
    jobs = prompt.inputs.get("jobs") if prompt.task == parts.PART_NOTES.name else None
    if not jobs:
        return []
    conn = svc.db.reader()
    out = []
    for key, job_id in jobs.items():
        job = leader if job_id == leader.id else _claimed_by_client(conn, job_id)
        handler = svc.jobs.handler(job.kind) if job is not None else None
        if job is not None and handler is not None:
            out.append(Member(job, handler, parts.section_prompt(prompt, key), key))
    return out


def _claimed_by_client(conn: Any, job_id: str) -> queue.Job | None:
    row = queue.row_of(conn, job_id)
    if row is None or row["state"] != "running" or row["claimed_by"] != "client":
        return None
    return queue.job_of(row)


def _report(whole: Report, notes: parts.PartNotes, key: str) -> Report:
    """A member's notes: what was said of the whole answer (how it was read, a retry) and of its
    own section, not the other sections' notes."""
    mine = notes.reports.get(key, Report())
    return Report([n for n in whole.changed if n not in notes.copied] + mine.changed,
                  [n for n in whole.dropped if n not in notes.copied] + mine.dropped)


def _why(notes: parts.PartNotes, key: str) -> str:
    """In plain words, why a member's section fell back."""
    reason = notes.reasons.get(key, "")
    return (f"The shared answer's \"{key}\" section could not be used"
            + (f" ({reason})" if reason else "") + ", so this result was made from the text itself.")


def _shares(total: int, weights: list[int]) -> list[int]:
    """`total` split by weight; the leader (first) takes what rounding leaves, so the sum is exact."""
    parts_ = [total * w // sum(weights) for w in weights]
    parts_[0] += total - sum(parts_)
    return parts_


def split(members: list[Member], outcome: Outcome) -> list[tuple[Member, Any, Outcome]]:
    """Each member's result and its share of the call (a member whose section fell back says so)."""
    notes: parts.PartNotes = outcome.result
    counter = get_counter()
    weights = [max(1, counter.count(m.prompt.system) + counter.count(m.prompt.user)) for m in members]
    prompt, completion, ms = (_shares(n, weights) for n in
                              (outcome.prompt_tokens, outcome.completion_tokens, outcome.model_ms))
    ids = tuple(m.job.id for m in members)
    out = []
    for i, member in enumerate(members):
        fell_back = outcome.answer == "fallback" or member.key in notes.fell_back
        share = replace(
            outcome, result=notes.sections[member.key], report=_report(outcome.report, notes, member.key),
            answer="fallback" if fell_back else outcome.answer,
            error=outcome.error or (_why(notes, member.key) if fell_back else None),
            prompt_tokens=prompt[i], completion_tokens=completion[i], model_ms=ms[i],
            calls=outcome.calls if i == 0 else 0, shared_with=ids)
        out.append((member, notes.sections[member.key], share))
    return out
