"""Schema migration 9, `m009_campaigns`: what it does is its function's docstring."""

from __future__ import annotations

from ..db import Connection
from .script import run_script


def m009_campaigns(conn: Connection) -> None:
    """Campaigns and branches (CP1, CP2): the campaign a chat belongs to (its own id for a lone
    chat), the chat and message a branch was made from, and the campaign a memory derived from
    play belongs to (a model's or a job's: a person's memories keep RV4's scopes)."""
    run_script(conn, """
    ALTER TABLE chats ADD COLUMN campaign_id TEXT;
    ALTER TABLE chats ADD COLUMN branch_of_chat TEXT;
    ALTER TABLE chats ADD COLUMN branch_of_message TEXT;
    UPDATE chats SET campaign_id = id;
    CREATE INDEX chats_campaign ON chats(campaign_id, created_at);

    ALTER TABLE memories ADD COLUMN campaign_id TEXT;
    -- Memories a model or a job filed in a chat so far followed their character everywhere; each
    -- chat was its own campaign, so they now belong to their chat's.
    UPDATE memories SET campaign_id = chat_id WHERE actor != 'user' AND chat_id IS NOT NULL;
    CREATE INDEX memories_campaign ON memories(campaign_id);

    -- Sheet fields a job learned from play, per campaign: the sheet shows a learned field only
    -- in the campaign that learned it (characters.sheet keeps the newest value, for the panel).
    CREATE TABLE sheet_learned (
        character_id TEXT NOT NULL,
        campaign_id TEXT NOT NULL,
        field TEXT NOT NULL,
        value TEXT NOT NULL,
        updated_at TEXT NOT NULL,
        PRIMARY KEY (character_id, campaign_id, field)
    );
    CREATE INDEX sheet_learned_campaign ON sheet_learned(campaign_id);
    CREATE TRIGGER sheet_learned_gen_insert AFTER INSERT ON sheet_learned
        BEGIN UPDATE generations SET n = n + 1 WHERE name = 'characters'; END;
    CREATE TRIGGER sheet_learned_gen_update AFTER UPDATE ON sheet_learned
        BEGIN UPDATE generations SET n = n + 1 WHERE name = 'characters'; END;
    CREATE TRIGGER sheet_learned_gen_delete AFTER DELETE ON sheet_learned
        BEGIN UPDATE generations SET n = n + 1 WHERE name = 'characters'; END;
    """)
