"""The search index: every searchable item as a `docs` row with its full-text entry, its vector and
its passage vectors, all written in the same transaction as the item itself (SW6).

Domain modules call `prepare()` before opening a write transaction (embedding takes milliseconds
and must not hold the writer lock), then `put()` / `update_meta()` / `remove()` inside it, so the
item, its text entry and its vectors are committed together or not at all.

What a row holds (docs/search.md, section 2): the item's text, chat, speaker or owner, who knows it
(`known_by`, SW9b), its place in the conversation (`session_key`, `position`), the message ids it
cites, and what ranking needs from the text, computed here at write time: BM25 term counts of
"[date] speaker: text", temporal cues and content length. The vector is of the text with the
store's character names removed (MiniLM ranks by the names it sees), and `cast_version` records
which names; long items also get one vector per passage. All of the one model `docs_model` names.

Every change bumps the store's docs revision (`search_meta.docs_rev`) and stamps the row with it (a
deletion leaves a `docs_gone` row): search.py's in-memory index catches up by reading what is
newer than the revision it holds, whichever process wrote it.

Owns: docs, docs_fts, docs_vec, docs_passages, docs_gone, search_meta, docs_model.

Reads one other table: every character's name and aliases (`characters`, the cast), to take them
out of texts before embedding; a trigger on that table bumps `cast_version`.
"""

from __future__ import annotations

import hashlib
import json
import weakref
from dataclasses import dataclass
from datetime import date
from typing import TYPE_CHECKING, Any, Iterable, Iterator, Mapping, Sequence

import numpy as np

from ..core.text import ANALYZER_VERSION, MONTHS
from ..errors import Unprocessable
from ..hooks import Hooks
from ..store.db import Connection, Database, dumps, loads
from . import ranking, vec_chunks

if TYPE_CHECKING:
    from ..jobs.queue import JobKinds
    from ..services import Services

MAX_PASSAGES = 16  # passage rowids are doc id * MAX_PASSAGES + n


@dataclass(frozen=True)
class Prepared:
    """A text and its vectors, computed outside the write transaction.

    `vector` is the embedding of the text with character names removed (`ranking.dense_text`
    with the store's cast of `cast_version`); `cast_version` -1 means the names were kept (the
    caller asked `keep_names`), and search.py re-embeds such rows in the background.
    """

    text: str
    vector: np.ndarray
    passages: tuple[np.ndarray, ...] = ()
    dense_hash: str = ""
    cast_version: int = -1
    model_key: str = ""  # the embedder's (embedders.py); "" only for vectors made elsewhere


def dense_hash(text: str) -> str:
    """A short fingerprint of the text that was embedded (re-embedding is needed when it changes)."""
    return hashlib.sha1(text.encode("utf-8")).hexdigest()[:16]


# --- the cast (character names and aliases) --------------------------------------------------
Names = list[tuple[str, list[str]]]  # (character id, its name and aliases)
_CASTS: "weakref.WeakKeyDictionary[Database, tuple[int, Names, ranking.Cast]]" = weakref.WeakKeyDictionary()


def cast_version(conn: Connection) -> int:
    row = conn.execute("SELECT value FROM search_meta WHERE key='cast_version'").fetchone()
    return int(row[0]) if row else 0


def load_names(conn: Connection) -> Names:
    """Every character's name and aliases, by id."""
    rows = conn.execute("SELECT id, name, aliases FROM characters ORDER BY id").fetchall()
    return [(r[0], [r[1], *(loads(r[2]) or [])]) for r in rows]


def _cached(db: Database) -> tuple[int, Names, ranking.Cast]:
    conn = db.reader()
    version = cast_version(conn)
    cached = _CASTS.get(db)
    if cached is None or cached[0] != version:
        names = load_names(conn)
        cached = _CASTS[db] = (version, names, ranking.Cast.build(names))
    return cached


def store_cast(db: Database) -> tuple[int, ranking.Cast]:
    """The store's cast and its version (bumped by a trigger on every name or alias change)."""
    version, _, cast = _cached(db)
    return version, cast


def store_names(db: Database) -> tuple[int, Names]:
    """The characters' names and aliases behind `store_cast` (to build casts that prefer some)."""
    version, names, _ = _cached(db)
    return version, names


# --- write time ------------------------------------------------------------------------------
def prepare(svc: Services, texts: Sequence[str], timeout: float | None = None, *,
            keep_names: bool = False, embedder: Any = None) -> list[Prepared]:
    """Embed texts (in one batch) for later `put()` calls.

    Names of the store's characters are taken out of the texts before embedding, unless
    `keep_names` (the vectors are then replaced in the background). Long texts get passages of
    at least the setting search_passage_min_words; `timeout` defaults to `svc.embed_wait()`;
    `embedder` to the store's (`svc.embedder`, the model of its vectors).
    """
    embedder, timeout = embedder or svc.embedder, svc.embed_wait() if timeout is None else timeout
    version, cast = (-1, None) if keep_names else store_cast(svc.db)
    min_words = svc.settings.search_passage_min_words
    dense = [t if cast is None else ranking.dense_text(t, cast) for t in texts]
    parts = [ranking.chunks(d, min_words=min_words, max_chunks=MAX_PASSAGES) for d in dense]
    extra = [p for ps in parts if len(ps) > 1 for p in ps]
    vectors = embedder.embed(dense + extra, timeout=timeout, kind="passage") if texts else []
    out, at = [], len(dense)
    for i, text in enumerate(texts):
        n = len(parts[i]) if len(parts[i]) > 1 else 0
        out.append(Prepared(text, vectors[i], tuple(vectors[at:at + n]), dense_hash(dense[i]), version,
                            embedder.key))
        at += n
    return out


def day_label(created_at: str | None) -> str:
    """'2023-05-08T13:56:00Z' -> '8 May 2023' (what a person would write; '' if unreadable)."""
    try:
        d = date.fromisoformat((created_at or "")[:10])
    except ValueError:
        return ""
    return f"{d.day} {MONTHS[d.month - 1]} {d.year}"


def derive(text: str, speaker_name: str | None, created_at: str | None) -> dict[str, Any]:
    """What ranking reads from an item's text, computed once at write time."""
    bm25_text = text if not speaker_name else f"[{day_label(created_at)}] {speaker_name}: {text}"
    return {"terms": json.dumps(ranking.analyze(bm25_text), separators=(",", ":")),
            "content_len": sum(ranking.analyze(text).values()),
            "cues": ranking.temporal_cues(text), "analyzer": ANALYZER_VERSION}


def _bump(conn: Connection) -> int:
    """The next docs revision (one writer at a time: revisions follow commit order)."""
    return int(conn.execute("UPDATE search_meta SET value = value + 1 WHERE key='docs_rev'"
                            " RETURNING value").fetchone()[0])


def _blob(vector: np.ndarray) -> bytes:
    return np.asarray(vector, dtype=np.float32).tobytes()


def _drop_vectors(conn: Connection, doc_id: int, passages: int) -> None:
    conn.execute("DELETE FROM docs_fts WHERE rowid=?", (doc_id,))
    conn.execute("DELETE FROM docs_vec WHERE rowid=?", (doc_id,))
    conn.executemany("DELETE FROM docs_passages WHERE rowid=?",
                     [(doc_id * MAX_PASSAGES + i,) for i in range(passages)])


def _write_vectors(conn: Connection, doc_id: int, prepared: Prepared) -> Prepared:
    """One row's vectors; made by another model than the store's (it moved on meanwhile), a zero
    vector instead (BM25 alone ranks it until the cast pass embeds it again: two models never mix)."""
    key, dim = model(conn)
    if not key and prepared.model_key:  # the store's first vector: its model is the store's
        key = adopt_model(conn, prepared.model_key, len(prepared.vector))
    if prepared.model_key and prepared.model_key != key:
        prepared = Prepared(prepared.text, np.zeros(dim, np.float32), (), "", -1, key)
    conn.execute("INSERT INTO docs_vec(rowid, embedding) VALUES (?,?)", (doc_id, _blob(prepared.vector)))
    conn.executemany("INSERT INTO docs_passages(rowid, embedding) VALUES (?,?)",
                     [(doc_id * MAX_PASSAGES + i, _blob(v)) for i, v in enumerate(prepared.passages)])
    return prepared


def model(conn: Connection) -> tuple[str, int]:
    """(the key of the model every vector is of — "" before the first —, their dimension)."""
    row = conn.execute("SELECT model_key, dim FROM docs_model").fetchone()
    return (row[0], int(row[1])) if row else ("", 384)


def adopt_model(conn: Connection, key: str, dim: int) -> str:
    """A store without vectors takes model `key` (tables of `dim`); returns the store's model."""
    held = model(conn)[0]
    if not (held and conn.execute("SELECT 1 FROM docs_vec LIMIT 1").fetchone()):
        install_vectors(conn, held := key, dim, {})
    return held


def install_vectors(conn: Connection, key: str, dim: int, vectors: dict[int, tuple[np.ndarray, list]],
                    remake: bool = False) -> None:
    """Every row's vectors replaced by model `key`'s (doc id -> (vector, passages)); `remake`: tables made anew."""
    for table in ("docs_vec", "docs_passages"):
        conn.execute(f"DELETE FROM {table}")
        if remake or dim != model(conn)[1]:  # vec0 tables have one size: made anew for the new model
            conn.execute(f"DROP TABLE {table}")
            conn.execute(f"CREATE VIRTUAL TABLE {table} USING vec0(embedding float[{dim}] distance_metric=cosine)")
    conn.execute("INSERT OR REPLACE INTO docs_model(id, model_key, dim) VALUES (1, ?, ?)", (key, dim))
    for doc_id, (vector, passages) in vectors.items():
        _write_vectors(conn, doc_id, Prepared("", vector, tuple(passages), model_key=key))
    rev = _bump(conn)
    conn.executemany("UPDATE docs SET passages=?, rev=? WHERE id=?",
                     [(len(p), rev, d) for d, (_, p) in vectors.items()])


def put(conn: Connection, kind: str, ref_id: str, prepared: Prepared, *, created_at: str,
        chat_id: str | None = None, character_id: str | None = None,
        known_by: Iterable[str] | None = None, session_key: str | None = None,
        position: int | None = None, speaker_name: str | None = None,
        importance: int | None = None, source_message_ids: Iterable[str] | None = None) -> int:
    """Insert or replace the index entry of one item (every field as given); returns its doc id.

    `character_id` is the message's speaker or the item's owner (the speaker prior of search);
    `speaker_name` puts "[date] name:" before the text for BM25 (messages); `session_key` and
    `position` place a message among its neighbours; `source_message_ids` are what a search
    result of this item cites.
    """
    known = None if known_by is None else sorted(set(known_by))
    sources = None if source_message_ids is None else list(dict.fromkeys(source_message_ids))
    values = {"chat_id": chat_id, "character_id": character_id, "known_by": dumps(known),
              "text": prepared.text, "created_at": created_at, "session_key": session_key,
              "position": position, "speaker_name": speaker_name, "importance": importance,
              "sources": dumps(sources), **derive(prepared.text, speaker_name, created_at),
              "passages": len(prepared.passages), "dense_hash": prepared.dense_hash,
              "cast_version": prepared.cast_version, "rev": _bump(conn)}
    row = conn.execute("SELECT id, passages FROM docs WHERE kind=? AND ref_id=?", (kind, ref_id)).fetchone()
    if row is None:
        names = ", ".join(values)
        doc_id = conn.execute(f"INSERT INTO docs(kind, ref_id, {names}) VALUES (?,?,{','.join('?' * len(values))})",
                              (kind, ref_id, *values.values())).lastrowid
    else:
        doc_id = row[0]
        _drop_vectors(conn, doc_id, row[1])
        conn.execute(f"UPDATE docs SET {', '.join(f'{k}=?' for k in values)} WHERE id=?",
                     (*values.values(), doc_id))
    conn.execute("INSERT INTO docs_fts(rowid, text) VALUES (?,?)", (doc_id, prepared.text))
    if _write_vectors(conn, doc_id, prepared) is not prepared:  # another model's: embedded again soon
        conn.execute("UPDATE docs SET passages=0, dense_hash='', cast_version=-1 WHERE id=?", (doc_id,))
    return doc_id


def _ids_of(conn: Connection, kind: str, refs: Sequence[str]) -> dict[str, tuple[int, int, str]]:
    """{ref: (doc id, passages, text)} of the entries of these refs."""
    out: dict[str, tuple[int, int, str]] = {}
    for start in range(0, len(refs), 500):
        chunk = list(refs[start:start + 500])
        for r in conn.execute(f"SELECT ref_id, id, passages, text FROM docs WHERE kind=? AND ref_id IN"
                              f" ({','.join('?' * len(chunk))})", (kind, *chunk)):
            out[r[0]] = (int(r[1]), int(r[2]), r[3])
    return out


def copy(conn: Connection, kind: str, old_ref: str, new_ref: str, *, chat_id: str | None) -> int | None:
    """An item's entry copied under another ref and chat, its vectors too (CP2); None without one."""
    return copy_many(conn, kind, [(old_ref, new_ref)], chat_id=chat_id).get(old_ref)


def copy_many(conn: Connection, kind: str, pairs: Sequence[tuple[str, str]], *, chat_id: str | None,
              from_chat: str | None = None) -> dict[str, int]:
    """`copy` for many items of one kind at once, in a few prepared statements (a branch copies thousands in one
    write): `pairs` are (old ref, new ref); `from_chat` given, session keys "<from_chat>#n" become
    "<chat_id>#n". Returns {old ref: new doc id} of the items that had an entry."""
    if not pairs:
        return {}
    columns = [c[1] for c in conn.execute("PRAGMA table_info(docs)")
               if c[1] not in ("id", "kind", "ref_id", "chat_id", "session_key", "rev")]
    session = "session_key" if from_chat is None else \
        "CASE WHEN session_key LIKE ? || '#%' THEN ? || substr(session_key, ?) ELSE session_key END"
    args: list[Any] = [] if from_chat is None else [from_chat, chat_id, len(from_chat) + 1]
    rev = _bump(conn)
    # One prepared statement run per pair: each a lookup by the (kind, ref_id) index.
    conn.executemany(
        f"INSERT INTO docs(kind, ref_id, chat_id, session_key, rev, {', '.join(columns)})"
        f" SELECT kind, ?, ?, {session}, ?, {', '.join(columns)} FROM docs WHERE kind=? AND ref_id=?",
        [(new, chat_id, *args, rev, kind, old) for old, new in pairs])
    old_ids = _ids_of(conn, kind, [old for old, _ in pairs])
    new_ids = _ids_of(conn, kind, [new for _, new in pairs])
    ids = [(old, old_ids[old][0], new_ids[new][0], old_ids[old][1], old_ids[old][2])
           for old, new in pairs if old in old_ids and new in new_ids]
    conn.executemany("INSERT INTO docs_fts(rowid, text) VALUES (?,?)", [(r[2], r[4]) for r in ids])
    old = {r[1]: r[2] for r in ids}
    vectors = item_vectors(conn, list(old))
    conn.executemany("INSERT INTO docs_vec(rowid, embedding) VALUES (?,?)",
                     [(old[d], _blob(v)) for d, v in vectors.items()])
    passage_ids = {r[1] * MAX_PASSAGES + i: r[2] * MAX_PASSAGES + i for r in ids for i in range(r[3])}
    if passage_ids:
        conn.executemany("INSERT INTO docs_passages(rowid, embedding) VALUES (?,?)",
                         [(passage_ids[p], _blob(v)) for p, v in passage_vectors(conn, list(passage_ids)).items()])
    return {r[0]: r[2] for r in ids}


META_FIELDS = ("chat_id", "character_id", "known_by", "session_key", "position", "speaker_name",
               "importance", "source_message_ids", "created_at")


def update_meta(conn: Connection, kind: str, ref_id: str, **fields: Any) -> None:
    """Change who/where an item belongs to without re-embedding: any of `META_FIELDS`.

    A new `speaker_name` or `created_at` re-derives the BM25 terms (they hold "[date] speaker:").
    """
    if not fields or set(fields) - set(META_FIELDS):
        raise ValueError(f"update_meta takes {list(META_FIELDS)}")
    row = conn.execute("SELECT id, text, speaker_name, created_at FROM docs WHERE kind=? AND ref_id=?",
                       (kind, ref_id)).fetchone()
    if row is None:
        return
    values: dict[str, Any] = {}
    for key, value in fields.items():
        if key == "known_by":
            value = None if value is None else dumps(sorted(set(value)))
        elif key == "source_message_ids":
            key, value = "sources", None if value is None else dumps(list(dict.fromkeys(value)))
        values[key] = value
    if "speaker_name" in fields or "created_at" in fields:
        derived = derive(row["text"], fields.get("speaker_name", row["speaker_name"]),
                         fields.get("created_at", row["created_at"]))
        values["terms"], values["analyzer"] = derived["terms"], derived["analyzer"]
    values["rev"] = _bump(conn)
    conn.execute(f"UPDATE docs SET {', '.join(f'{k}=?' for k in values)} WHERE id=?",
                 (*values.values(), row["id"]))


def remove(conn: Connection, kind: str, ref_ids: Iterable[str]) -> int:
    """Delete the index entries of items; returns how many existed."""
    removed = 0
    for ref_id in ref_ids:
        row = conn.execute("SELECT id, passages FROM docs WHERE kind=? AND ref_id=?", (kind, ref_id)).fetchone()
        if row is None:
            continue
        _drop_vectors(conn, row[0], row[1])
        conn.execute("DELETE FROM docs WHERE id=?", (row[0],))
        conn.execute("INSERT OR REPLACE INTO docs_gone(id, rev) VALUES (?,?)", (row[0], _bump(conn)))
        removed += 1
    return removed


def moved_chat(conn: Connection, old_id: str, new_id: str) -> None:
    """After a chat rename moved every `chat_id` (conversation.rename_chat): its rows' session
    keys (and ids made from them) follow, and they get a new revision so search sees the move."""
    rev = _bump(conn)
    rows = conn.execute("SELECT id, session_key, ref_id FROM docs WHERE chat_id=?", (new_id,)).fetchall()
    for doc_id, key, ref_id in rows:
        conn.execute("UPDATE docs SET session_key=?, ref_id=?, rev=? WHERE id=?",
                     (_rechat(key, old_id, new_id), _rechat(ref_id, old_id, new_id), rev, doc_id))


def _rechat(key: str | None, old_id: str, new_id: str) -> str | None:
    """'<old chat>#<n>' -> '<new chat>#<n>' (session keys, session summaries' ids); others unchanged."""
    if key is None or key.rpartition("#")[0] != old_id:
        return key
    return f"{new_id}#{key.rpartition('#')[2]}"


def revision(conn: Connection) -> int:
    """The store's docs revision: it grows with every put, update_meta and remove."""
    row = conn.execute("SELECT value FROM search_meta WHERE key='docs_rev'").fetchone()
    return int(row[0]) if row else 0


# --- reading the index (search, the in-memory index, visibility) ----------------------------
def entry_known_by(conn: Connection, kind: str, ref_id: str) -> tuple[bool, list[str] | None]:
    """(the item has an index entry, who its entry says knows it: None for everyone)."""
    row = conn.execute("SELECT known_by FROM docs WHERE kind=? AND ref_id=?", (kind, ref_id)).fetchone()
    return (False, None) if row is None else (True, loads(row[0]))


def results(conn: Connection, doc_ids: Sequence[int]) -> dict[int, Any]:
    """What a search result shows of some rows, by doc id (rows deleted meanwhile are left out)."""
    return {r["id"]: r for r in conn.execute(
        "SELECT id, kind, ref_id, chat_id, character_id, text, sources, created_at FROM docs"
        f" WHERE id IN ({','.join('?' * len(doc_ids))})", list(doc_ids))}


def all_rows(conn: Connection, columns: str) -> list[Any]:
    """These columns of every row, by doc id."""
    return conn.execute(f"SELECT {columns} FROM docs ORDER BY id").fetchall()


def rows_in_batches(conn: Connection, columns: str, size: int) -> tuple[int, Iterator[list[Any]]]:
    """How many rows there are, and these columns of every row by doc id, `size` at a time."""
    def batches() -> Iterator[list[Any]]:  # from a rowid: with an OR, SQLite read from row 1 each time
        after, sql = (), f"SELECT {columns} FROM docs ORDER BY id LIMIT ?"
        while batch := conn.execute(sql, (*after, size)).fetchall():
            yield batch
            after, sql = (batch[-1]["id"],), f"SELECT {columns} FROM docs WHERE id > ? ORDER BY id LIMIT ?"
    return conn.execute("SELECT count(*) FROM docs").fetchone()[0], batches()


def rows_since(conn: Connection, columns: str, rev: int) -> list[Any]:
    """These columns of the rows written after revision `rev`, in revision order."""
    return conn.execute(f"SELECT {columns} FROM docs WHERE rev > ? ORDER BY rev", (rev,)).fetchall()


def gone_since(conn: Connection, rev: int) -> list[int]:
    """Doc ids deleted after revision `rev`."""
    return [r[0] for r in conn.execute("SELECT id FROM docs_gone WHERE rev > ?", (rev,))]


def gone_floor(conn: Connection) -> int:
    """The oldest revision whose deletions `docs_gone` still holds."""
    return conn.execute("SELECT value FROM search_meta WHERE key='docs_gone_floor'").fetchone()[0]


def prune_gone(conn: Connection, rev: int) -> None:
    """Forget the deletions up to revision `rev` (an index at `rev` or later has applied them)."""
    conn.execute("DELETE FROM docs_gone WHERE rev <= ?", (rev,))
    conn.execute("UPDATE search_meta SET value = max(value, ?) WHERE key='docs_gone_floor'", (rev,))


def item_vectors(conn: Connection, doc_ids: Sequence[int] | None) -> Mapping[int, np.ndarray]:
    """The vectors of these rows (None: of every row), by doc id."""
    return vec_chunks.read(conn, "docs_vec", doc_ids, model(conn)[1])


def passage_vectors(conn: Connection, rowids: Sequence[int] | None) -> Mapping[int, np.ndarray]:
    """Passage vectors by passage rowid (doc id * MAX_PASSAGES + n; None: every one)."""
    return vec_chunks.read(conn, "docs_passages", rowids, model(conn)[1])


# --- re-embedding (names changed, or a row prepared without the cast) -----------------------
def replace_vectors(conn: Connection, doc_id: int, rev: int, prepared: Prepared) -> bool:
    """Give an unchanged row (still at `rev`, same text) new vectors; False if it changed meanwhile."""
    row = conn.execute("SELECT passages, text FROM docs WHERE id=? AND rev=?", (doc_id, rev)).fetchone()
    if row is None or row[1] != prepared.text:
        return False
    conn.execute("DELETE FROM docs_vec WHERE rowid=?", (doc_id,))
    conn.executemany("DELETE FROM docs_passages WHERE rowid=?",
                     [(doc_id * MAX_PASSAGES + i,) for i in range(row[0])])
    prepared = _write_vectors(conn, doc_id, prepared)
    conn.execute("UPDATE docs SET passages=?, dense_hash=?, cast_version=?, rev=? WHERE id=?",
                 (len(prepared.passages), prepared.dense_hash, prepared.cast_version, _bump(conn), doc_id))
    return True


def stale_cast(conn: Connection, version: int, limit: int) -> list[Any]:
    """Up to `limit` rows embedded under another cast than `version` (id, text, dense_hash, rev)."""
    return conn.execute("SELECT id, text, dense_hash, rev FROM docs WHERE cast_version != ? LIMIT ?",
                        (version, limit)).fetchall()


def mark_cast(conn: Connection, doc_ids: Sequence[int], version: int) -> None:
    """Rows whose embedded text is the same under the new cast: only their cast version moves
    (no revision: nothing search holds in memory changes)."""
    conn.executemany("UPDATE docs SET cast_version=? WHERE id=?", [(version, i) for i in doc_ids])


def mark_cast_at(conn: Connection, doc_id: int, rev: int, version: int) -> None:
    """`mark_cast` for one row, only while it is still at revision `rev`."""
    conn.execute("UPDATE docs SET cast_version=? WHERE id=? AND rev=?", (version, doc_id, rev))


def vectors_of(conn: Connection, kind: str, ref_ids: Sequence[str]) -> dict[str, np.ndarray]:
    """The index's vectors of some items (by kind and ref id)."""
    marks = ",".join("?" * len(ref_ids))
    rows = conn.execute(
        f"SELECT d.ref_id, v.embedding FROM docs d JOIN docs_vec v ON v.rowid = d.id"
        f" WHERE d.kind=? AND d.ref_id IN ({marks})", [kind, *ref_ids])
    return {ref: np.frombuffer(blob, dtype=np.float32) for ref, blob in rows}


# Migrations may leave a row's terms to the application (m003 did, for rows written before it):
# such a row's `terms` is this marker until `analyse_pending` reads its text with today's analyzer.
UNANALYSED = ""


def analyse_pending(db: Database) -> int:
    """BM25 terms, cues and length of the rows a migration left unanalysed; returns how many.

    Run when a store is opened, after its migrations (app.open_store): a migration must not call
    the analyzer, which may change after it."""
    with db.write() as conn:
        rows = conn.execute(
            "SELECT d.id, d.kind, d.text, d.created_at, d.speaker_name FROM docs d WHERE d.terms = ?",
            (UNANALYSED,)).fetchall()
        for r in rows:
            values = {**derive(r[2], r[4], r[3]), "rev": _bump(conn)}
            conn.execute(f"UPDATE docs SET {', '.join(f'{k}=?' for k in values)} WHERE id=?",
                         (*values.values(), r[0]))
    return len(rows)


def count_stale_terms(conn: Connection) -> int:
    """How many rows still wait for today's analyzer (a migration marked them stale)."""
    return conn.execute("SELECT count(*) FROM docs WHERE analyzer != ?", (ANALYZER_VERSION,)).fetchone()[0]


def reanalyse(db: Database, limit: int) -> int:
    """Today's BM25 terms, length and cues for up to `limit` rows an older analyzer made, each a new
    revision, in one write; returns how many (none left: no write, which would move the generation)."""
    if not db.reader().execute("SELECT 1 FROM docs WHERE analyzer != ? LIMIT 1",
                               (ANALYZER_VERSION,)).fetchone():
        return 0
    with db.write() as conn:
        rows = conn.execute("SELECT id, text, created_at, speaker_name FROM docs WHERE analyzer != ? LIMIT ?",
                            (ANALYZER_VERSION, limit)).fetchall()
        for r in rows:
            values = {**derive(r["text"], r["speaker_name"], r["created_at"]), "rev": _bump(conn)}
            conn.execute(f"UPDATE docs SET {', '.join(f'{k}=?' for k in values)} WHERE id=?",
                         (*values.values(), r["id"]))
    return len(rows)


# --- integrity -------------------------------------------------------------------------------
def check_whole(conn: Connection) -> None:
    """Refuse an imported store whose search index is not whole (every orphan count zero)."""
    broken = {k: v for k, v in orphans(conn).items() if v}
    if broken:
        raise Unprocessable("invalid_import", f"The search index in the document is not whole: {broken} (one "
                            "without vectors says \"vectors\": false). Nothing was imported.", [broken])


def orphans(conn: Connection) -> dict[str, int]:
    """Counts of broken index entries (docs without text entry or vectors, and the reverse).

    Used by integrity checks and the crash tests: every count must be zero.
    """
    counts = {
        "docs_without_fts": conn.execute(
            "SELECT count(*) FROM docs WHERE id NOT IN (SELECT rowid FROM docs_fts)").fetchone()[0],
        "docs_without_vec": conn.execute(
            "SELECT count(*) FROM docs WHERE id NOT IN (SELECT rowid FROM docs_vec)").fetchone()[0],
        "fts_without_doc": conn.execute(
            "SELECT count(*) FROM docs_fts WHERE rowid NOT IN (SELECT id FROM docs)").fetchone()[0],
        "vec_without_doc": conn.execute(
            "SELECT count(*) FROM docs_vec WHERE rowid NOT IN (SELECT id FROM docs)").fetchone()[0],
    }
    tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    if "docs_passages" not in tables:  # a store from before migration m003
        return counts
    held: dict[int, int] = {}
    for (rowid,) in conn.execute("SELECT rowid FROM docs_passages"):
        held[rowid // MAX_PASSAGES] = held.get(rowid // MAX_PASSAGES, 0) + 1
    wanted = dict(conn.execute("SELECT id, passages FROM docs WHERE passages > 0").fetchall())
    counts["passages_without_doc"] = sum(n for d, n in held.items() if d not in wanted)
    counts["docs_missing_passages"] = sum(1 for d, n in wanted.items() if held.get(d, 0) != n)
    counts["docs_without_terms"] = conn.execute(
        "SELECT count(*) FROM docs WHERE terms = '{}' AND content_len > 0").fetchone()[0]
    return counts


def register(jobs: JobKinds, hooks: Hooks) -> None:
    """An imported store's search index must be whole."""
    hooks.store_importing.connect(check_whole)
