"""Schema migration 1, `m001_foundation`: what it does is its function's docstring."""

from __future__ import annotations

from ..db import Connection
from .script import EMBEDDING_DIM, run_script


def m001_foundation(conn: Connection) -> None:
    """Characters, chats and members, saved memories, and the search index (row + text + vector)."""
    run_script(conn, f"""
    CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);

    CREATE TABLE characters (
        id TEXT PRIMARY KEY,
        name TEXT NOT NULL,
        aliases TEXT NOT NULL DEFAULT '[]',
        sheet TEXT NOT NULL DEFAULT '{{}}',
        is_player INTEGER NOT NULL DEFAULT 0,
        learn_from_chat INTEGER NOT NULL DEFAULT 1,
        created_at TEXT NOT NULL,
        updated_at TEXT NOT NULL
    );

    CREATE TABLE chats (
        id TEXT PRIMARY KEY,
        title TEXT,
        memory_enabled INTEGER NOT NULL DEFAULT 1,
        context_tokens INTEGER,
        created_at TEXT NOT NULL,
        updated_at TEXT NOT NULL
    );

    -- Members need not be registered characters yet: the extension registers cards lazily.
    CREATE TABLE chat_members (
        chat_id TEXT NOT NULL REFERENCES chats(id) ON DELETE CASCADE,
        character_id TEXT NOT NULL,
        position INTEGER NOT NULL,
        PRIMARY KEY (chat_id, character_id)
    );
    CREATE INDEX chat_members_character ON chat_members(character_id);

    CREATE TABLE memories (
        id TEXT PRIMARY KEY,
        text TEXT NOT NULL,
        scope TEXT NOT NULL CHECK (scope IN ('global', 'character')),
        character_id TEXT,
        pinned INTEGER NOT NULL DEFAULT 0,
        archived INTEGER NOT NULL DEFAULT 0,
        actor TEXT NOT NULL CHECK (actor IN ('user', 'model', 'background')),
        chat_id TEXT,
        turn_id TEXT,
        known_by TEXT,
        source_message_ids TEXT NOT NULL DEFAULT '[]',
        created_at TEXT NOT NULL,
        updated_at TEXT NOT NULL,
        version INTEGER NOT NULL DEFAULT 1,
        CHECK ((scope = 'global') = (character_id IS NULL)),
        CHECK (NOT (pinned AND archived))
    );
    CREATE INDEX memories_scope ON memories(scope, character_id, archived, pinned, updated_at);
    CREATE INDEX memories_turn ON memories(chat_id, turn_id);

    -- The search index: one row per searchable item, its full-text entry and its vector share
    -- the rowid and are written in the same transaction as the item itself.
    CREATE TABLE docs (
        id INTEGER PRIMARY KEY,
        kind TEXT NOT NULL,
        ref_id TEXT NOT NULL,
        chat_id TEXT,
        character_id TEXT,
        known_by TEXT,
        text TEXT NOT NULL,
        created_at TEXT NOT NULL,
        UNIQUE (kind, ref_id)
    );
    CREATE INDEX docs_chat ON docs(chat_id, kind);
    CREATE VIRTUAL TABLE docs_fts USING fts5(text, tokenize = 'porter unicode61');
    CREATE VIRTUAL TABLE docs_vec USING vec0(embedding float[{EMBEDDING_DIM}] distance_metric=cosine);
    """)
