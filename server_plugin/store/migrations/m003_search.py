"""Schema migration 3, `m003_search`: what it does is its function's docstring."""

from __future__ import annotations

from ..db import Connection
from .script import EMBEDDING_DIM, run_script


def m003_search(conn: Connection) -> None:
    """What search keeps per item (SW6, docs/search.md section 2): its place in the conversation,
    speaker, BM25 term counts, temporal cues and length, the character names its vector was
    embedded without, its passage vectors, and a revision number that lets the in-memory index
    catch up with every write (its own process's or another's)."""
    run_script(conn, f"""
    ALTER TABLE docs ADD COLUMN session_key TEXT;        -- neighbour group (a chat's session)
    ALTER TABLE docs ADD COLUMN position INTEGER;        -- order inside the group
    ALTER TABLE docs ADD COLUMN speaker_name TEXT;       -- BM25 text is "[date] speaker: text"
    ALTER TABLE docs ADD COLUMN importance INTEGER;      -- 1-5 where the item has one
    ALTER TABLE docs ADD COLUMN sources TEXT;            -- JSON message ids the item cites
    ALTER TABLE docs ADD COLUMN content_len INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE docs ADD COLUMN cues INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE docs ADD COLUMN terms TEXT NOT NULL DEFAULT '{{}}';  -- JSON {{stem: count}}
    ALTER TABLE docs ADD COLUMN passages INTEGER NOT NULL DEFAULT 0;  -- rows in docs_passages
    ALTER TABLE docs ADD COLUMN dense_hash TEXT;         -- hash of the text that was embedded
    ALTER TABLE docs ADD COLUMN cast_version INTEGER NOT NULL DEFAULT -1;
    ALTER TABLE docs ADD COLUMN rev INTEGER NOT NULL DEFAULT 0;
    CREATE INDEX docs_rev ON docs(rev);
    CREATE INDEX docs_cast ON docs(cast_version);

    -- Passage vectors of long items: rowid = doc id * 16 + passage number (at most 16), so they
    -- are found and deleted by rowid, never by scanning.
    CREATE VIRTUAL TABLE docs_passages USING vec0(embedding float[{EMBEDDING_DIM}] distance_metric=cosine);

    -- Deleted docs and the revision that deleted them, for the in-memory index to catch up.
    CREATE TABLE docs_gone (id INTEGER PRIMARY KEY, rev INTEGER NOT NULL);

    -- Counters of search: the docs revision, the oldest revision docs_gone still covers, and
    -- the version of the cast (character names) vectors are embedded without.
    CREATE TABLE search_meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL);
    INSERT INTO search_meta(key, value) VALUES ('docs_rev', 0), ('docs_gone_floor', 0),
        ('cast_version', 0);
    -- Character names are taken out of texts before embedding: a new name, a rename or an alias
    -- change makes earlier vectors out of date (search.py re-embeds what the change touches).
    CREATE TRIGGER characters_cast_insert AFTER INSERT ON characters BEGIN
        UPDATE search_meta SET value = value + 1 WHERE key = 'cast_version'; END;
    CREATE TRIGGER characters_cast_delete AFTER DELETE ON characters BEGIN
        UPDATE search_meta SET value = value + 1 WHERE key = 'cast_version'; END;
    CREATE TRIGGER characters_cast_update AFTER UPDATE OF name, aliases ON characters
        WHEN OLD.name IS NOT NEW.name OR OLD.aliases IS NOT NEW.aliases BEGIN
        UPDATE search_meta SET value = value + 1 WHERE key = 'cast_version'; END;
    """)
    # Items indexed before this migration: their place in the conversation now; their BM25 terms
    # are left to the application ('' marks them: retrieval/docs.analyse_pending reads them when
    # the store is opened, with the analyzer of that day), and their vectors are re-embedded
    # without names, with passages, by the search index's background pass (cast_version -1).
    run_script(conn, """
    UPDATE docs SET terms = '',
        speaker_name = (SELECT coalesce(nullif(m.name, ''), m.role) FROM messages m WHERE CAST(m.seq AS TEXT) = docs.ref_id),
        position = (SELECT m.position FROM messages m WHERE CAST(m.seq AS TEXT) = docs.ref_id),
        session_key = (SELECT m.chat_id || '#' || coalesce(m.session_n, '') FROM messages m
                       WHERE CAST(m.seq AS TEXT) = docs.ref_id),
        sources = coalesce((SELECT json_array(m.id) FROM messages m WHERE CAST(m.seq AS TEXT) = docs.ref_id),
                           sources)
        WHERE kind = 'message';
    UPDATE docs SET terms = '' WHERE kind != 'message';
    UPDATE docs SET sources = (SELECT m.source_message_ids FROM memories m WHERE m.id = docs.ref_id)
        WHERE kind = 'memory';
    """)
