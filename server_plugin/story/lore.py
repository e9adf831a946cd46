"""Lore entries and story cards (SW7, QS5, QS6): world facts with triggers, and how each card's
triggers were used per chat.

An entry: `title`, `text`, `triggers[]` (whole words, case-insensitive; see triggers.py),
`always` (in every turn's candidates, no trigger needed), `enabled`, `known_by` (SW9b: None is
public, a list restricts who may know it), `metadata` (what an import could not map), `source`
(user | import | job), `chat_id` (the chat an entry grown from play belongs to; None is every
chat), `locked` (a person's lock) and `review` (why it waits for a person's look: a source message
changed). An entry a person wrote or edited, imported or locked is `protected`: a model's proposal
for it waits for the person (story/lore_growth, SW7). Every entry is indexed for search (kind "lore") in the transaction that
writes it. Per chat, `lore_stats` records when each card last fired (turn and time) and how many
turns it fired in, for QS5's ranking; `context.py` updates it after each assembly.

Owns: lore, lore_stats.
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any, Iterable, Sequence

from ..core.triggers import AUTO, WHOLE_WORDS, Match
from ..errors import Conflict, NotFound, Unprocessable
from ..retrieval import docs
from ..services import Services
from ..store.db import Connection, dumps, loads

if TYPE_CHECKING:
    from ..sillytavern.formats import LoreDraft

KIND = "lore"
SOURCES = ("user", "import", "job")
TRIGGER_MAX_CHARS = 200
TITLE_MAX_CHARS = 300


# --- shapes ----------------------------------------------------------------------------------
def to_dict(row: Any) -> dict[str, Any]:
    """An entry as the API shows it."""
    return {
        "id": row["id"], "title": row["title"], "text": row["text"],
        "triggers": loads(row["triggers"]), "always": bool(row["always"]),
        "enabled": bool(row["enabled"]), "known_by": loads(row["known_by"]),
        "metadata": loads(row["metadata"]), "source": row["source"], "chat_id": row["chat_id"],
        "locked": bool(row["locked"]), "review": row["review"],
        "created_at": row["created_at"], "updated_at": row["updated_at"], "version": row["version"],
    }


def index_text(title: str, text: str) -> str:
    """What search indexes and what a story card shows: the title as a lead-in, then the text."""
    title = title.strip()
    return f"{title}: {text}" if title else text


def matching(metadata: dict[str, Any]) -> Match:
    """How an entry's triggers match, from its metadata's `matching` ({"whole_words": "auto" | "on"
    | "off", "case_sensitive": bool}, set by an import or a person); anything else is automatic."""
    given = metadata.get("matching") if isinstance(metadata, dict) else None
    if not isinstance(given, dict):
        return AUTO
    mode = given.get("whole_words")
    return Match(mode if mode in WHOLE_WORDS else "auto", given.get("case_sensitive") is True)


def normalize_triggers(triggers: Iterable[str]) -> list[str]:
    """Stripped, without empties and case-insensitive repeats, in the order given."""
    out: list[str] = []
    seen: set[str] = set()
    for trigger in triggers:
        cleaned = " ".join(str(trigger).split())
        if cleaned and cleaned.casefold() not in seen:
            seen.add(cleaned.casefold())
            out.append(cleaned)
    return out


def _known(known_by: Iterable[str] | None) -> list[str] | None:
    return None if known_by is None else sorted(set(known_by))


# --- reading ---------------------------------------------------------------------------------
def _fetch_row(conn: Connection, lore_id: str) -> Any:
    row = conn.execute("SELECT * FROM lore WHERE id=?", (lore_id,)).fetchone()
    if row is None:
        raise NotFound("lore_not_found", f"No lore entry with id {lore_id!r}.")
    return row


def get(svc: Services, lore_id: str) -> dict[str, Any]:
    return to_dict(_fetch_row(svc.db.reader(), lore_id))


def list_lore(svc: Services, *, q: str | None = None, source: str | None = None,
              enabled: bool | None = None, chat_id: str | None = None) -> list[dict[str, Any]]:
    """Every entry matching the filters (`q`: in title, text or triggers; `chat_id`: entries of
    every chat and those grown in that one), by title."""
    where, args = ["1"], []
    if chat_id is not None:
        where.append("(chat_id IS NULL OR chat_id=?)")
        args.append(chat_id)
    if q:
        where.append("(instr(lower(title), lower(?)) > 0 OR instr(lower(text), lower(?)) > 0"
                     " OR instr(lower(triggers), lower(?)) > 0)")
        args += [q, q, q]
    if source is not None:
        where.append("source=?")
        args.append(source)
    if enabled is not None:
        where.append("enabled=?")
        args.append(int(enabled))
    rows = svc.db.reader().execute(
        f"SELECT * FROM lore WHERE {' AND '.join(where)} ORDER BY title COLLATE NOCASE, created_at, id",
        args)
    return [to_dict(r) for r in rows]


# --- checks ----------------------------------------------------------------------------------
def _check(svc: Services, entry: dict[str, Any], where: str = "") -> None:
    """Limits a person can act on (422): text size, trigger count and length."""
    at = f" ({where})" if where else ""
    limit = svc.settings.lore_max_chars
    text = entry["text"]
    if not text.strip():
        raise Unprocessable("text_empty", f"A lore entry needs some text{at}.")
    if len(text) > limit:
        raise Unprocessable("text_too_long", f"A lore entry holds at most {limit} characters; this "
                            f"one has {len(text)}{at}.", [{"max": limit, "length": len(text)}])
    most = svc.settings.lore_max_triggers
    if len(entry["triggers"]) > most:
        raise Unprocessable("too_many_triggers", f"A lore entry has at most {most} triggers; this "
                            f"one has {len(entry['triggers'])}{at}.", [{"max": most}])
    long = [t for t in entry["triggers"] if len(t) > TRIGGER_MAX_CHARS]
    if long:
        raise Unprocessable("trigger_too_long", f"A trigger has at most {TRIGGER_MAX_CHARS} "
                            f"characters{at}: {long[0][:60]!r}…")
    if len(entry["title"]) > TITLE_MAX_CHARS:
        raise Unprocessable("title_too_long", f"A title has at most {TITLE_MAX_CHARS} characters{at}.")


def _entry(data: dict[str, Any], base: dict[str, Any] | None = None) -> dict[str, Any]:
    """The stored fields of an entry: `base` (the current entry) with `data` applied."""
    new = dict(base or {"title": "", "triggers": [], "always": False, "enabled": True,
                        "known_by": None, "metadata": {}, "locked": False})
    for key in ("title", "text", "triggers", "always", "enabled", "known_by", "metadata", "locked"):
        if key in data:
            new[key] = data[key]
    new["title"] = " ".join(str(new["title"]).split())
    new["triggers"] = normalize_triggers(new["triggers"])
    new["known_by"] = _known(new["known_by"])
    return new


# --- writing ---------------------------------------------------------------------------------
def _insert(conn: Connection, lore_id: str, entry: dict[str, Any], source: str, now: str,
            prepared: docs.Prepared, chat_id: str | None = None) -> None:
    conn.execute(
        "INSERT INTO lore(id, title, text, triggers, always, enabled, known_by, metadata, source,"
        " created_at, updated_at, chat_id, locked) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)",
        (lore_id, entry["title"], entry["text"], dumps(entry["triggers"]), int(entry["always"]),
         int(entry["enabled"]), dumps(entry["known_by"]), dumps(entry["metadata"]), source, now, now,
         chat_id, int(entry.get("locked", False))))
    docs.put(conn, KIND, lore_id, prepared, created_at=now, known_by=entry["known_by"])


def new_id() -> str:
    return "l_" + uuid.uuid4().hex


def create(svc: Services, data: dict[str, Any], source: str = "user") -> dict[str, Any]:
    """Add one entry (a person through the API, or a job with source "job")."""
    if source not in SOURCES:
        raise ValueError(f"source must be one of {SOURCES}")
    entry = _entry(data)
    _check(svc, entry)
    prepared = docs.prepare(svc, [index_text(entry["title"], entry["text"])], keep_names=True)[0]
    lore_id, now = new_id(), svc.clock.iso()
    with svc.db.write() as conn:
        _insert(conn, lore_id, entry, source, now, prepared)
        return to_dict(_fetch_row(conn, lore_id))


def update(svc: Services, lore_id: str, data: dict[str, Any]) -> dict[str, Any]:
    """A person changes an entry (optimistic `version`); re-indexed in the same transaction.

    An entry a job grew becomes the person's when its title, text or triggers change (a model
    then never overwrites it, SW7); sending `review: null` clears the mark of a changed source."""
    current = get(svc, lore_id)
    entry = _entry(data, current)
    _check(svc, entry)
    text = index_text(entry["title"], entry["text"])
    changed_text = text != index_text(current["title"], current["text"])
    prepared = docs.prepare(svc, [text], keep_names=True)[0] if changed_text else None
    with svc.db.write() as conn:
        row = _fetch_row(conn, lore_id)
        if "version" in data and data["version"] != row["version"]:
            raise Conflict("version_conflict", f"Lore entry {lore_id!r} was changed by someone else "
                           f"(version {row['version']}, you sent {data['version']}); reload and retry.",
                           [{"current_version": row["version"]}])
        if row["version"] != current["version"]:  # changed while we embedded outside the lock
            raise Conflict("version_conflict", f"Lore entry {lore_id!r} changed while it was being "
                           "saved; reload and retry.", [{"current_version": row["version"]}])
        wrote = any(entry[k] != current[k] for k in ("title", "text", "triggers"))
        source = "user" if wrote and row["source"] == "job" else row["source"]
        review = None if "review" in data else row["review"]
        conn.execute(
            "UPDATE lore SET title=?, text=?, triggers=?, always=?, enabled=?, known_by=?, metadata=?,"
            " locked=?, source=?, review=?, updated_at=?, version=version+1 WHERE id=?",
            (entry["title"], entry["text"], dumps(entry["triggers"]), int(entry["always"]),
             int(entry["enabled"]), dumps(entry["known_by"]), dumps(entry["metadata"]),
             int(entry["locked"]), source, review, svc.clock.iso(), lore_id))
        if prepared is not None:
            docs.put(conn, KIND, lore_id, prepared, created_at=row["created_at"],
                      known_by=entry["known_by"])
        else:
            docs.update_meta(conn, KIND, lore_id, known_by=entry["known_by"])
        return to_dict(_fetch_row(conn, lore_id))


def delete(svc: Services, lore_id: str) -> dict[str, Any]:
    """Delete an entry, its index entry and its per-chat statistics (by cascade)."""
    with svc.db.write() as conn:
        _fetch_row(conn, lore_id)
        docs.remove(conn, KIND, [lore_id])
        conn.execute("DELETE FROM lore WHERE id=?", (lore_id,))
    return {"deleted": lore_id}


# --- imports ---------------------------------------------------------------------------------
def _draft_entry(draft: LoreDraft, known_by: Sequence[str] | None) -> dict[str, Any]:
    return _entry({"title": draft.title, "text": draft.text, "triggers": draft.triggers,
                   "always": draft.always, "enabled": draft.enabled, "known_by": known_by,
                   "metadata": draft.metadata})


def prepare_drafts(svc: Services, drafts: Sequence[LoreDraft],
                   known_by: Sequence[str] | None = None) -> list[tuple[LoreDraft, dict, Any]]:
    """Check every draft and embed the ones to import (outside any transaction).

    Returns (draft, entry or None when skipped, prepared vector or None). Raises 422 naming the
    first entry over a limit: an import is all or nothing.
    """
    if len(drafts) > svc.settings.lore_import_max_entries:
        raise Unprocessable("too_many_entries", f"An import holds at most "
                            f"{svc.settings.lore_import_max_entries} entries; this one has {len(drafts)}.")
    checked = []
    for draft in drafts:
        entry = None if draft.skipped else _draft_entry(draft, known_by)
        if entry is not None:
            _check(svc, entry, where=f"entry {draft.ref!r}")
        checked.append((draft, entry))
    texts = [index_text(e["title"], e["text"]) for _, e in checked if e is not None]
    vectors = iter(docs.prepare(svc, texts, keep_names=True) if texts else [])
    return [(d, e, next(vectors) if e is not None else None) for d, e in checked]


def write_drafts(svc: Services, conn: Connection, prepared: Sequence[tuple[LoreDraft, dict, Any]]
                 ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Insert prepared drafts inside the caller's transaction -> (entries, per-entry report)."""
    now = svc.clock.iso()
    entries, report = [], []
    for draft, entry, vector in prepared:
        line: dict[str, Any] = {"ref": draft.ref, "title": draft.title, "not_mapped": draft.not_mapped,
                                "mapped": draft.mapped}
        if entry is None:
            line.update(status="skipped", reason=draft.skipped, id=None)
        else:
            lore_id = new_id()
            _insert(conn, lore_id, entry, "import", now, vector)
            entries.append(to_dict(_fetch_row(conn, lore_id)))
            line.update(status="imported", id=lore_id)
        report.append(line)
    return entries, report


def dry_report(prepared: Sequence[tuple[LoreDraft, dict, Any]]) -> list[dict[str, Any]]:
    """The per-entry report of an import that is not written (dry run)."""
    return [{"ref": d.ref, "title": d.title, "not_mapped": d.not_mapped, "mapped": d.mapped, "id": None,
             "status": "skipped" if e is None else "would_import",
             **({"reason": d.skipped} if e is None else {})} for d, e, _ in prepared]


def remove_card_book(conn: Connection, character_id: str) -> list[str]:
    """Inside a write: the entries an earlier import of this character's card created and nobody
    edited since go, with their index entries (a re-import then does not double them)."""
    ids = [r[0] for r in conn.execute(
        "SELECT id FROM lore WHERE source='import' AND version=1"
        " AND json_extract(metadata, '$.import.character_id')=?", (character_id,))]
    docs.remove(conn, KIND, ids)
    conn.executemany("DELETE FROM lore WHERE id=?", [(i,) for i in ids])
    return ids


def enabled_rows(conn: Connection) -> list[Any]:
    """Every enabled entry as a story card needs it (id, title, text, triggers, always, known_by,
    metadata: its `matching`; chat_id)."""
    return conn.execute("SELECT id, title, text, triggers, always, known_by, metadata, chat_id FROM lore"
                        " WHERE enabled=1 ORDER BY id").fetchall()


# --- entries grown from play (SW7; story/lore_growth decides, inside its write) -----------------
def protected(entry: dict[str, Any]) -> bool:
    """A person wrote (or edited), imported or locked it: a model never overwrites it."""
    return entry["source"] in ("user", "import") or bool(entry["locked"])


def fetch(conn: Connection, lore_id: str) -> dict[str, Any] | None:
    """An entry, or None."""
    row = conn.execute("SELECT * FROM lore WHERE id=?", (lore_id,)).fetchone()
    return None if row is None else to_dict(row)


def in_chat(conn: Connection, chat_id: str) -> list[dict[str, Any]]:
    """The entries a chat uses: those of every chat and those grown in it."""
    rows = conn.execute("SELECT * FROM lore WHERE chat_id IS NULL OR chat_id=? ORDER BY id", (chat_id,))
    return [to_dict(r) for r in rows]


def grown_entry(title: str, text: str, triggers: Sequence[str], known_by: Sequence[str] | None) -> dict[str, Any]:
    """The fields of an entry a proposal writes, as `_entry` shapes them."""
    return _entry({"title": title, "text": text, "triggers": list(triggers), "known_by": known_by})


def write_grown(svc: Services, conn: Connection, lore_id: str | None, entry: dict[str, Any],
                chat_id: str, prepared: docs.Prepared, source: str = "job") -> dict[str, Any]:
    """Inside the caller's write: create a grown entry (`lore_id` None) or rewrite one's title,
    text, triggers and known_by; returns the entry. The caller decided it may (`protected`)."""
    _check(svc, entry)
    now = svc.clock.iso()
    if lore_id is None:
        lore_id = new_id()
        _insert(conn, lore_id, entry, source, now, prepared, chat_id)
        return to_dict(_fetch_row(conn, lore_id))
    row = _fetch_row(conn, lore_id)
    conn.execute("UPDATE lore SET title=?, text=?, triggers=?, known_by=?, review=NULL, updated_at=?,"
                 " version=version+1 WHERE id=?", (entry["title"], entry["text"],
                                                   dumps(entry["triggers"]), dumps(entry["known_by"]), now, lore_id))
    docs.put(conn, KIND, lore_id, prepared, created_at=row["created_at"], known_by=entry["known_by"])
    return to_dict(_fetch_row(conn, lore_id))


def prepare_text(svc: Services, title: str, text: str) -> docs.Prepared:
    """The search index's vector of an entry's text (outside any transaction)."""
    return docs.prepare(svc, [index_text(title, text)], keep_names=True)[0]


def mark_review(conn: Connection, lore_ids: Iterable[str], reason: str) -> int:
    """Mark entries as waiting for a person's look (a source message changed); returns how many."""
    ids = list(dict.fromkeys(lore_ids))
    return sum(conn.execute("UPDATE lore SET review=? WHERE id=? AND (review IS NULL OR review<>?)",
                            (reason, i, reason)).rowcount for i in ids)


def remove_in(conn: Connection, lore_ids: Iterable[str]) -> int:
    """Inside the caller's write: delete entries with their index entries; returns how many."""
    ids = list(dict.fromkeys(lore_ids))
    docs.remove(conn, KIND, ids)
    return sum(conn.execute("DELETE FROM lore WHERE id=?", (i,)).rowcount for i in ids)


def chat_entries(conn: Connection, chat_id: str) -> list[str]:
    """Ids of the entries grown in a chat."""
    return [r[0] for r in conn.execute("SELECT id FROM lore WHERE chat_id=?", (chat_id,))]


# --- per-chat trigger statistics (QS5) -----------------------------------------------------------
def chat_stats(conn: Connection, chat_id: str,
               lore_ids: Sequence[str] | None = None) -> dict[str, tuple[int, int]]:
    """card id -> (uses, last turn it fired) in this chat (only these cards, if given)."""
    if lore_ids is None:
        rows = conn.execute("SELECT lore_id, uses, last_turn FROM lore_stats WHERE chat_id=?",
                            (chat_id,))
    elif not lore_ids:
        return {}
    else:
        rows = conn.execute(
            "SELECT lore_id, uses, last_turn FROM lore_stats WHERE chat_id=? AND lore_id IN"
            f" ({','.join('?' * len(lore_ids))})", (chat_id, *lore_ids))
    return {r[0]: (r[1], r[2]) for r in rows}


def record_fired(conn: Connection, chat_id: str, lore_ids: Iterable[str], turn: int, now: str) -> None:
    """Count one more use of each fired card in this chat (inside the caller's write).

    A card deleted meanwhile is skipped (the SELECT finds nothing), never an error.
    """
    conn.executemany(
        "INSERT INTO lore_stats(chat_id, lore_id, uses, last_turn, last_used_at)"
        " SELECT ?, id, 1, ?, ? FROM lore WHERE id=? ON CONFLICT(chat_id, lore_id) DO UPDATE SET"
        " uses = uses + 1, last_turn = excluded.last_turn, last_used_at = excluded.last_used_at",
        [(chat_id, turn, now, lore_id) for lore_id in lore_ids])


def stats_list(svc: Services, chat_id: str) -> list[dict[str, Any]]:
    """A chat's card statistics, most recently used first (for the panel)."""
    rows = svc.db.reader().execute(
        "SELECT lore_id, uses, last_turn, last_used_at FROM lore_stats WHERE chat_id=?"
        " ORDER BY last_turn DESC, uses DESC, lore_id", (chat_id,))
    return [{"lore_id": r[0], "uses": r[1], "last_turn": r[2], "last_used_at": r[3]} for r in rows]


def forget_chat(conn: Connection, chat_id: str) -> int:
    """A deleted chat's card statistics go (inside its write); returns how many."""
    return conn.execute("DELETE FROM lore_stats WHERE chat_id=?", (chat_id,)).rowcount
