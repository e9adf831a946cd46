"""Parts of the transcript (rule MJ1): with a model, each message is read about once.

A message is *due* once it has left the live window (RV2) or its session has ended (SW2). The due
messages no part has read yet, oldest first, make the chat's open part. It is read (closed) when
it holds `part_tokens` (never more than the model's context, `llm_context_tokens`, less
`part_reserve_tokens`, at most half of it, for the instructions and the answer), cut at the last
session end inside it when there is one; or, smaller, once it has waited `part_wait_seconds` (the
worker's `close_part` job: a quiet chat gets its memory without more play, and a session's memory
is never lost).

Reading a part queues, in one transaction, every task's job over exactly its messages: its
chunk summary (RV3: one recent summary covers the part), deep memory (RV13), and through
`hooks.part_closed` the characters' memories (SW4), the scenes (SW5), the told events (SW9b), the
sheet updates (SW1), lore growth (SW7) and the summary of each session that ends in it (SW2).
Their prompts show the same messages, so the worker reads the part in one model call
(`jobs/batch.py`); each job keeps its own row, checks and apply.

Until then, messages that left the live window reach the context through search (each message
is indexed when it is written), not through a summary.

Without a model (`extractive`) or with `part_tokens` 0 there are no parts: a job per chunk and
per session end, as before (`batch.in_parts`). A part is the recent summary row that covers it
(`messages.summary_id`), so this module owns no table.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from ..hooks import Hooks
from ..jobs import batch, queue
from ..jobs.queue import JobKinds
from ..services import Services
from ..store.db import Connection
from . import chats, deep_memory, messages, sessions, summaries

KIND = "close_part"
WAIT_REF = "part"  # the one pending close_part job of a chat


def size(svc: Services) -> int:
    """Message tokens of a full part: `part_tokens`, within what the model's context leaves. The
    reserve never takes more than half the context, so a small local model (4k, 8k) still reads
    parts of half its context rather than parts of a few tokens."""
    s = svc.settings
    reserve = min(s.part_reserve_tokens, s.llm_context_tokens // 2)
    return max(1, min(s.part_tokens, s.llm_context_tokens - reserve))


def due(svc: Services, conn: Connection, chat_id: str) -> list[Any]:
    """The chat's due messages no part has read, oldest first: the run of unread messages from
    the first on that have left the live window or whose session has ended."""
    live = {r["seq"] for r in summaries.window_rows(svc, conn, chat_id)}
    current = sessions.open_n(conn, chat_id)
    out = []
    for row in messages.ordered(conn, chat_id, "summary_id IS NULL"):
        if row["seq"] in live and (row["session_n"] is None or row["session_n"] == current):
            break  # still live in the open session: it and what follows are not due
        out.append(row)
    return out


def cut(rows: Sequence[Any], limit: int, message_cap: int) -> int:
    """How many of `rows` make the next full part: the longest run within `limit` tokens (at
    least one message), ending at the last session end inside it when there is one; 0 when all
    of them fit (the part may still grow)."""
    used, fit = 0, 0
    for row in rows:
        used += min(row["tokens"], message_cap)
        if used > limit:
            break
        fit += 1
    if fit == len(rows):
        return 0
    fit = max(fit, 1)
    ends = [i + 1 for i in range(fit) if rows[i]["session_n"] != rows[i + 1]["session_n"]]
    return ends[-1] if ends else fit


def close(svc: Services, conn: Connection, chat_id: str, turn_id: str | None,
          everything: bool = False) -> int:
    """Read the chat's due messages in full parts; the rest waits to grow (a `close_part` job
    reads it after `part_wait_seconds`), or is read now when `everything` (the wait is over) or
    the wait is 0. Returns the jobs queued."""
    if not batch.in_parts(svc):
        return 0
    rows = due(svc, conn, chat_id)
    now = everything or svc.settings.part_wait_seconds <= 0
    queued = read = 0
    while rows:
        n = cut(rows, size(svc), svc.settings.prompt_message_max_tokens) or (len(rows) if now else 0)
        if n == 0:
            break
        queued += _read(svc, conn, chat_id, turn_id, rows[:n])
        read += 1
        rows = rows[n:]
    if rows:
        _wait(svc, conn, chat_id, restart=read > 0)
    return queued


def _wait(svc: Services, conn: Connection, chat_id: str, restart: bool) -> None:
    """The open part waits `part_wait_seconds` from when it began (a part was just read: from
    now) before the worker reads it anyway."""
    when = queue.later(svc, svc.settings.part_wait_seconds)
    if restart:
        queue.postpone(conn, KIND, chat_id, WAIT_REF, when)
    queue.enqueue(svc, KIND, chat_id=chat_id, ref=WAIT_REF, not_before=when)


def _read(svc: Services, conn: Connection, chat_id: str, turn_id: str | None, rows: Sequence[Any]) -> int:
    """Queue every task's job over this part's messages (in one transaction, so they share a call).
    Messages every task has read already (their summaries were rebuilt, or a rolled-back turn's
    summary went) are only summarised again: nothing else is filed twice."""
    queued = summaries.open_part(svc, conn, chat_id, rows, turn_id)
    if all(r["deep_job"] is not None for r in rows):
        return queued
    queued += deep_memory.queue_part(svc, conn, chat_id, turn_id, rows)
    return queued + svc.hooks.part_closed.count(svc, conn, chat_id, turn_id, [r["id"] for r in rows])


def reader(kind: str) -> Callable[..., int]:
    """A `part_closed` listener that queues `kind`'s job over exactly a part's messages (so it
    shares the part's call), none where the chat's memory is off."""
    def queue_over_part(svc: Services, conn: Connection, chat_id: str, turn_id: str | None,
                        message_ids: list[str]) -> int:
        if not chats.memory_enabled(conn, chat_id):
            return 0
        queue.enqueue(svc, kind, chat_id=chat_id, turn_id=turn_id, dedupe=False,
                      target={"message_ids": list(message_ids)})
        return 1
    return queue_over_part


def _on_due(svc: Services, conn: Connection, chat_id: str, turn_id: str | None) -> int:
    return close(svc, conn, chat_id, turn_id)


def _apply_close(svc: Services, conn: Connection, job: queue.Job, result: Any, prepared: Any) -> dict[str, Any]:
    """The wait is over: read what is due, however small."""
    return {"jobs_queued": close(svc, conn, job.chat_id, job.turn_id, everything=True)} if job.chat_id \
        else {"skipped": "no chat"}


def register(jobs: JobKinds, hooks: Hooks) -> None:
    """The worker's `close_part` job and the listener that reads full parts (MJ1)."""
    jobs.register(KIND, _apply_close, llm=False)
    hooks.messages_due.connect(_on_due)
