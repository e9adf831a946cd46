"""Schema migration 12, `m012_summary_tops`: what it does is its function's docstring."""

from __future__ import annotations

from ..db import Connection
from .script import run_script


def m012_summary_tops(conn: Connection) -> None:
    """Indexes for the summaries a chat shows (summaries.visible, read by a context call each
    time a summary changes): its summaries not merged into another, and its summaries with no
    text yet (a merge in progress shows its children). Without them every summary of the chat
    was read, merged ones too (most of them: 1,552 of 1,632 at 10,000 messages)."""
    run_script(conn, """
    CREATE INDEX summaries_top ON summaries(chat_id, parent_id);
    CREATE INDEX summaries_unwritten ON summaries(chat_id) WHERE text IS NULL;
    """)
