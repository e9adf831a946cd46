"""Schema migration 2, `m002_conversation`: what it does is its function's docstring."""

from __future__ import annotations

from ..db import Connection
from .script import run_script


def m002_conversation(conn: Connection) -> None:
    """The transcript, rolling summaries, sessions, campaign notes and the job queue (RV1-RV3,
    RV13, SW2, SW3). No foreign keys to `chats`: a chat rename rewrites `chat_id` everywhere."""
    run_script(conn, """
    -- Message ids are the client's and unique only within a chat (SillyTavern branches copy them).
    CREATE TABLE messages (
        seq INTEGER PRIMARY KEY,
        chat_id TEXT NOT NULL,
        id TEXT NOT NULL,
        role TEXT NOT NULL CHECK (role IN ('user', 'assistant', 'system')),
        name TEXT NOT NULL DEFAULT '',
        text TEXT NOT NULL,
        sent_at TEXT NOT NULL,
        turn_id TEXT,
        speaker_id TEXT,
        position INTEGER NOT NULL,
        tokens INTEGER NOT NULL,
        session_n INTEGER,
        summary_id TEXT,
        deep_job TEXT,
        created_at TEXT NOT NULL,
        updated_at TEXT NOT NULL,
        version INTEGER NOT NULL DEFAULT 1,
        UNIQUE (chat_id, id)
    );
    CREATE INDEX messages_order ON messages(chat_id, position, seq);
    CREATE INDEX messages_summary ON messages(summary_id);
    CREATE INDEX messages_session ON messages(chat_id, session_n);

    CREATE TABLE summaries (
        id TEXT PRIMARY KEY,
        chat_id TEXT NOT NULL,
        tier TEXT NOT NULL CHECK (tier IN ('recent', 'consolidated', 'long_term')),
        text TEXT,
        quotes TEXT NOT NULL DEFAULT '[]',
        covers TEXT NOT NULL,
        parent_id TEXT,
        edited INTEGER NOT NULL DEFAULT 0,
        stale INTEGER NOT NULL DEFAULT 0,
        pos_position INTEGER NOT NULL,
        pos_seq INTEGER NOT NULL,
        turn_id TEXT,
        created_at TEXT NOT NULL,
        updated_at TEXT NOT NULL,
        version INTEGER NOT NULL DEFAULT 1
    );
    CREATE INDEX summaries_chat ON summaries(chat_id, tier, pos_position, pos_seq);
    CREATE INDEX summaries_parent ON summaries(parent_id);
    CREATE INDEX summaries_turn ON summaries(chat_id, turn_id);

    CREATE TABLE sessions (
        chat_id TEXT NOT NULL,
        n INTEGER NOT NULL,
        state TEXT NOT NULL CHECK (state IN ('open', 'ended', 'summarized')),
        started_at TEXT NOT NULL,
        last_at TEXT NOT NULL,
        ended_at TEXT,
        end_reason TEXT,
        full TEXT,
        short TEXT,
        quotes TEXT NOT NULL DEFAULT '[]',
        stale INTEGER NOT NULL DEFAULT 0,
        updated_at TEXT NOT NULL,
        PRIMARY KEY (chat_id, n)
    );

    CREATE TABLE notes (
        id TEXT PRIMARY KEY,
        chat_id TEXT NOT NULL,
        text TEXT NOT NULL,
        status TEXT NOT NULL CHECK (status IN ('open', 'resolved')),
        priority INTEGER NOT NULL CHECK (priority BETWEEN 1 AND 5),
        source TEXT NOT NULL CHECK (source IN ('user', 'job')),
        session_n INTEGER,
        turn_id TEXT,
        job_id TEXT,
        created_at TEXT NOT NULL,
        updated_at TEXT NOT NULL,
        resolved_at TEXT,
        version INTEGER NOT NULL DEFAULT 1
    );
    CREATE INDEX notes_chat ON notes(chat_id, status, priority);

    -- The persistent queue of background work. `ref` names what a job works on (a summary id, a
    -- session number) so the same work is not queued twice.
    CREATE TABLE jobs (
        seq INTEGER PRIMARY KEY,
        id TEXT NOT NULL UNIQUE,
        kind TEXT NOT NULL,
        chat_id TEXT,
        turn_id TEXT,
        ref TEXT,
        state TEXT NOT NULL CHECK (state IN ('pending', 'running', 'done', 'failed')),
        attempts INTEGER NOT NULL DEFAULT 0,
        max_attempts INTEGER NOT NULL,
        not_before TEXT NOT NULL,
        lease_until TEXT,
        claimed_by TEXT,
        payload TEXT NOT NULL,
        result TEXT,
        error TEXT,
        created_at TEXT NOT NULL,
        updated_at TEXT NOT NULL,
        finished_at TEXT
    );
    CREATE INDEX jobs_due ON jobs(state, not_before, seq);
    CREATE INDEX jobs_chat ON jobs(chat_id, state);
    CREATE INDEX jobs_turn ON jobs(chat_id, turn_id);
    CREATE INDEX jobs_ref ON jobs(kind, ref, state);
    """)
