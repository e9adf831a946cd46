"""Schema migration 10, `m010_grown_lore`: what it does is its function's docstring."""

from __future__ import annotations

from ..db import Connection
from .script import run_script


def m010_grown_lore(conn: Connection) -> None:
    """Lore that grows with play (SW7): a model's proposals of new entries and updates, the
    messages each proposal and each grown entry rests on, and on lore the chat an entry grew in,
    a person's lock and the mark that its sources changed."""
    run_script(conn, """
    -- The chat a grown entry belongs to (NULL: every chat), a person's lock, why it waits for a look.
    ALTER TABLE lore ADD COLUMN chat_id TEXT;
    ALTER TABLE lore ADD COLUMN locked INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE lore ADD COLUMN review TEXT;
    CREATE INDEX lore_chat ON lore(chat_id);

    -- A lore-growth job's proposal: a new entry (lore_id NULL) or an update; `before` is the entry
    -- as an update found it (a rollback puts it back). pending: waits for a person (review, protected).
    CREATE TABLE lore_proposals (
        id TEXT PRIMARY KEY,
        chat_id TEXT NOT NULL,
        lore_id TEXT,
        kind TEXT NOT NULL DEFAULT '',
        title TEXT NOT NULL,
        text TEXT NOT NULL,
        triggers TEXT NOT NULL DEFAULT '[]',
        known_by TEXT,
        state TEXT NOT NULL CHECK (state IN ('pending', 'applied', 'rejected')),
        reason TEXT NOT NULL DEFAULT '',
        before TEXT,
        written_version INTEGER,
        job_id TEXT,
        turn_id TEXT,
        created_at TEXT NOT NULL,
        updated_at TEXT NOT NULL
    );
    CREATE INDEX lore_proposals_chat ON lore_proposals(chat_id, state);
    CREATE INDEX lore_proposals_lore ON lore_proposals(lore_id);

    -- The messages a proposal or a grown entry rests on (owner: 'proposal' or 'lore').
    CREATE TABLE lore_sources (
        owner TEXT NOT NULL CHECK (owner IN ('proposal', 'lore')),
        owner_id TEXT NOT NULL,
        chat_id TEXT NOT NULL,
        message_id TEXT NOT NULL,
        PRIMARY KEY (owner, owner_id, chat_id, message_id)
    );
    CREATE INDEX lore_sources_message ON lore_sources(chat_id, message_id);
    """)
