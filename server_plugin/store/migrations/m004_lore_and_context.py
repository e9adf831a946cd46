"""Schema migration 4, `m004_lore_and_context`: what it does is its function's docstring."""

from __future__ import annotations

from ..db import Connection
from .script import run_script


def m004_lore_and_context(conn: Connection) -> None:
    """Lore entries / story cards (SW7), their per-chat trigger statistics (QS5), the per-chat turn
    counter of the context call, sheet provenance and locks (SW1), and change counters (caches)."""
    run_script(conn, """
    CREATE TABLE lore (
        id TEXT PRIMARY KEY,
        title TEXT NOT NULL DEFAULT '',
        text TEXT NOT NULL,
        triggers TEXT NOT NULL DEFAULT '[]',
        always INTEGER NOT NULL DEFAULT 0,
        enabled INTEGER NOT NULL DEFAULT 1,
        known_by TEXT,
        metadata TEXT NOT NULL DEFAULT '{}',
        source TEXT NOT NULL CHECK (source IN ('user', 'import', 'job')),
        created_at TEXT NOT NULL,
        updated_at TEXT NOT NULL,
        version INTEGER NOT NULL DEFAULT 1
    );

    -- QS5: how recently and how often each card's triggers fired, per chat.
    CREATE TABLE lore_stats (
        chat_id TEXT NOT NULL REFERENCES chats(id) ON DELETE CASCADE,
        lore_id TEXT NOT NULL REFERENCES lore(id) ON DELETE CASCADE,
        uses INTEGER NOT NULL DEFAULT 0,
        last_turn INTEGER NOT NULL DEFAULT 0,
        last_used_at TEXT NOT NULL,
        PRIMARY KEY (chat_id, lore_id)
    );
    CREATE INDEX lore_stats_lore ON lore_stats(lore_id);

    -- One row per chat: the turns counted so far and the last action counted (a swipe or a
    -- repeated call for the same action is not a new turn).
    CREATE TABLE context_turns (
        chat_id TEXT PRIMARY KEY REFERENCES chats(id) ON DELETE CASCADE,
        turn INTEGER NOT NULL DEFAULT 0,
        action_key TEXT,
        updated_at TEXT NOT NULL
    );

    -- SW1: per sheet field who wrote it, and the fields a person locked.
    ALTER TABLE characters ADD COLUMN sheet_meta TEXT NOT NULL DEFAULT '{}';
    -- What a character card import could not map (kept, shown, never injected).
    ALTER TABLE characters ADD COLUMN metadata TEXT NOT NULL DEFAULT '{}';

    -- Change counters: every write to these tables bumps its counter (by trigger, whoever
    -- writes), so what is read every turn can be kept until its own tables change
    -- (server_plugin/store/changes.py): lore, the cast, the memories and the chats with their members.
    CREATE TABLE generations (name TEXT PRIMARY KEY, n INTEGER NOT NULL DEFAULT 0);
    INSERT INTO generations(name, n) VALUES ('lore', 0), ('characters', 0), ('memories', 0),
        ('chats', 0);
    CREATE TRIGGER lore_gen_insert AFTER INSERT ON lore
        BEGIN UPDATE generations SET n = n + 1 WHERE name = 'lore'; END;
    CREATE TRIGGER lore_gen_update AFTER UPDATE ON lore
        BEGIN UPDATE generations SET n = n + 1 WHERE name = 'lore'; END;
    CREATE TRIGGER lore_gen_delete AFTER DELETE ON lore
        BEGIN UPDATE generations SET n = n + 1 WHERE name = 'lore'; END;
    CREATE TRIGGER characters_gen_insert AFTER INSERT ON characters
        BEGIN UPDATE generations SET n = n + 1 WHERE name = 'characters'; END;
    CREATE TRIGGER characters_gen_update AFTER UPDATE ON characters
        BEGIN UPDATE generations SET n = n + 1 WHERE name = 'characters'; END;
    CREATE TRIGGER characters_gen_delete AFTER DELETE ON characters
        BEGIN UPDATE generations SET n = n + 1 WHERE name = 'characters'; END;
    CREATE TRIGGER memories_gen_insert AFTER INSERT ON memories
        BEGIN UPDATE generations SET n = n + 1 WHERE name = 'memories'; END;
    CREATE TRIGGER memories_gen_update AFTER UPDATE ON memories
        BEGIN UPDATE generations SET n = n + 1 WHERE name = 'memories'; END;
    CREATE TRIGGER memories_gen_delete AFTER DELETE ON memories
        BEGIN UPDATE generations SET n = n + 1 WHERE name = 'memories'; END;
    CREATE TRIGGER chats_gen_insert AFTER INSERT ON chats
        BEGIN UPDATE generations SET n = n + 1 WHERE name = 'chats'; END;
    CREATE TRIGGER chats_gen_update AFTER UPDATE ON chats
        BEGIN UPDATE generations SET n = n + 1 WHERE name = 'chats'; END;
    CREATE TRIGGER chats_gen_delete AFTER DELETE ON chats
        BEGIN UPDATE generations SET n = n + 1 WHERE name = 'chats'; END;
    CREATE TRIGGER chat_members_gen_insert AFTER INSERT ON chat_members
        BEGIN UPDATE generations SET n = n + 1 WHERE name = 'chats'; END;
    CREATE TRIGGER chat_members_gen_update AFTER UPDATE ON chat_members
        BEGIN UPDATE generations SET n = n + 1 WHERE name = 'chats'; END;
    CREATE TRIGGER chat_members_gen_delete AFTER DELETE ON chat_members
        BEGIN UPDATE generations SET n = n + 1 WHERE name = 'chats'; END;
    """)
