"""Numbered schema migrations, each applied once in its own transaction and recorded in a table.

A migration is a function taking the writer connection. Add new ones at the end of MIGRATIONS with
the next number; never edit or renumber one that has shipped.

Every table is created here; the module that owns one (reads and writes it; the others call its
functions) says so in its docstring, `Owns: <tables>.` (tests/test_architecture.py checks both).

Owns: meta, schema_migrations.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Callable

from .db import Connection, Database, sqlite3

EMBEDDING_DIM = 384  # all-MiniLM-L6-v2; a model of another size needs a new vector table


def run_script(conn: Connection, script: str) -> None:
    """Execute several statements without the driver's implicit COMMIT (unlike executescript)."""
    statement = ""
    for line in script.splitlines(keepends=True):
        statement += line
        if sqlite3.complete_statement(statement):
            conn.execute(statement)
            statement = ""
    if statement.strip():
        raise ValueError(f"incomplete SQL statement in migration: {statement[:80]!r}")


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


def m007_grown_lore(conn: Connection) -> None:
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


MIGRATIONS: list[tuple[int, Callable[[Connection], None]]] = [
    (1, m001_foundation),
    (2, m002_conversation),
    (3, m003_search),
    (4, m004_lore_and_context),
    (5, m005_episodes),
    (6, m006_summary_counter),
    (7, m007_grown_lore),
]


def applied(db: Database) -> list[int]:
    """Numbers of the migrations already applied, in order."""
    conn = db.reader()
    exists = conn.execute(
        "SELECT 1 FROM sqlite_master WHERE type='table' AND name='schema_migrations'").fetchone()
    if not exists:
        return []
    return [row[0] for row in conn.execute("SELECT number FROM schema_migrations ORDER BY number")]


def migrate(db: Database) -> list[int]:
    """Apply every pending migration, each in its own transaction; return the numbers applied."""
    with db.write() as conn:
        conn.execute("""CREATE TABLE IF NOT EXISTS schema_migrations (
            number INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at TEXT NOT NULL)""")
    done = set(applied(db))
    newly: list[int] = []
    for number, func in MIGRATIONS:
        if number in done:
            continue
        with db.write() as conn:
            # Re-check inside the write lock: another process may have migrated meanwhile.
            if conn.execute("SELECT 1 FROM schema_migrations WHERE number=?", (number,)).fetchone():
                continue
            func(conn)
            conn.execute("INSERT INTO schema_migrations(number, name, applied_at) VALUES (?,?,?)",
                         (number, func.__name__, datetime.now(timezone.utc).isoformat()))
        newly.append(number)
    return newly
