"""Schema migration 6, `m006_summary_counter`: what it does is its function's docstring."""

from __future__ import annotations

from ..db import Connection
from .script import run_script


def m006_summary_counter(conn: Connection) -> None:
    """A change counter for the Story Summary's tables (read by every context call)."""
    run_script(conn, """
    -- The summaries and the finished sessions' summaries: the context keeps the Story Summary
    -- until one of them changes (context.story_summary). A session's other columns (its last
    -- message time, moved by every message) do not count.
    INSERT INTO generations(name, n) VALUES ('summaries', 0);
    CREATE TRIGGER summaries_gen_insert AFTER INSERT ON summaries
        BEGIN UPDATE generations SET n = n + 1 WHERE name = 'summaries'; END;
    CREATE TRIGGER summaries_gen_update AFTER UPDATE ON summaries
        BEGIN UPDATE generations SET n = n + 1 WHERE name = 'summaries'; END;
    CREATE TRIGGER summaries_gen_delete AFTER DELETE ON summaries
        BEGIN UPDATE generations SET n = n + 1 WHERE name = 'summaries'; END;
    CREATE TRIGGER sessions_gen_insert AFTER INSERT ON sessions
        BEGIN UPDATE generations SET n = n + 1 WHERE name = 'summaries'; END;
    CREATE TRIGGER sessions_gen_update AFTER UPDATE OF chat_id, n, full, short, quotes ON sessions
        BEGIN UPDATE generations SET n = n + 1 WHERE name = 'summaries'; END;
    CREATE TRIGGER sessions_gen_delete AFTER DELETE ON sessions
        BEGIN UPDATE generations SET n = n + 1 WHERE name = 'summaries'; END;
    """)
