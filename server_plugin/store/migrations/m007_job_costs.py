"""Schema migration 7, `m007_job_costs`: what it does is its function's docstring."""

from __future__ import annotations

from ..db import Connection
from .script import run_script


def m007_job_costs(conn: Connection) -> None:
    """What each model job cost: tokens read and written, model calls, time with the model, and
    when it was last claimed (the concurrency cap and the gap between calls read it)."""
    run_script(conn, """
    ALTER TABLE jobs ADD COLUMN prompt_tokens INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE jobs ADD COLUMN completion_tokens INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE jobs ADD COLUMN model_calls INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE jobs ADD COLUMN model_ms INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE jobs ADD COLUMN claimed_at TEXT;
    CREATE INDEX jobs_cost ON jobs(chat_id, kind, finished_at);
    """)
