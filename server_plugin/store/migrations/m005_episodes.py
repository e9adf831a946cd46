"""Schema migration 5, `m005_episodes`: what it does is its function's docstring."""

from __future__ import annotations

from ..db import Connection
from .script import run_script


def m005_episodes(conn: Connection) -> None:
    """Character memories and scene summaries (SW4, SW5) with their source messages, "told" events
    and the knowledge they granted (SW9b), and which messages a character-memory run has read."""
    run_script(conn, """
    CREATE TABLE episodes (
        id TEXT PRIMARY KEY,
        kind TEXT NOT NULL CHECK (kind IN ('character_memory', 'scene_summary')),
        chat_id TEXT NOT NULL,
        session_n INTEGER,
        character_id TEXT,
        title TEXT,
        summary TEXT NOT NULL,
        feeling TEXT,
        quotes TEXT NOT NULL DEFAULT '[]',
        participants TEXT NOT NULL DEFAULT '[]',
        witnesses TEXT NOT NULL DEFAULT '[]',
        known_by TEXT NOT NULL DEFAULT '[]',
        importance INTEGER CHECK (importance BETWEEN 1 AND 5),
        origin TEXT NOT NULL CHECK (origin IN ('session', 'deep_memory')),
        pos INTEGER NOT NULL,  -- position of its first source message: the chat's order
        job_id TEXT,
        turn_id TEXT,
        created_at TEXT NOT NULL,
        updated_at TEXT NOT NULL,
        version INTEGER NOT NULL DEFAULT 1,
        CHECK ((kind = 'character_memory') = (character_id IS NOT NULL))
    );
    CREATE INDEX episodes_chat ON episodes(chat_id, kind, session_n, pos);
    CREATE INDEX episodes_character ON episodes(character_id, kind);
    CREATE INDEX episodes_turn ON episodes(chat_id, turn_id);

    -- Provenance (rules RV10, SW8): the messages an item was derived from, so a rollback or a
    -- message delete finds what it must take along.
    CREATE TABLE episode_sources (
        episode_id TEXT NOT NULL REFERENCES episodes(id) ON DELETE CASCADE,
        chat_id TEXT NOT NULL,
        message_id TEXT NOT NULL,
        PRIMARY KEY (episode_id, message_id)
    );
    CREATE INDEX episode_sources_message ON episode_sources(chat_id, message_id);

    -- "X told Y about Z" (SW9b): where it was said (evidence, verified verbatim) and what it
    -- referred to.
    CREATE TABLE told_events (
        id TEXT PRIMARY KEY,
        chat_id TEXT NOT NULL,
        session_n INTEGER,
        teller_id TEXT NOT NULL,
        listener_ids TEXT NOT NULL,
        item_kind TEXT NOT NULL,
        item_ref TEXT NOT NULL,
        message_id TEXT NOT NULL,
        evidence TEXT NOT NULL,
        job_id TEXT,
        turn_id TEXT,
        created_at TEXT NOT NULL
    );
    CREATE INDEX told_events_chat ON told_events(chat_id, message_id);
    CREATE INDEX told_events_turn ON told_events(chat_id, turn_id);

    -- Who was added to an item's known_by by which told event, so undoing the event (a rollback,
    -- a deleted message) removes exactly what it added.
    CREATE TABLE knowledge_grants (
        told_id TEXT NOT NULL REFERENCES told_events(id) ON DELETE CASCADE,
        item_kind TEXT NOT NULL,
        item_ref TEXT NOT NULL,
        character_id TEXT NOT NULL,
        PRIMARY KEY (told_id, item_kind, item_ref, character_id)
    );
    CREATE INDEX knowledge_grants_item ON knowledge_grants(item_kind, item_ref, character_id);

    -- The character-memory run that read a message ('session' for session-end runs), so a
    -- deep-memory run and the session end do not both file the same moments.
    ALTER TABLE messages ADD COLUMN memories_job TEXT;
    """)
