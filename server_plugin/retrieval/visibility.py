"""Who knows what (rule SW9b), decided in one place for search, per-turn memories and context.

An item is public (`known_by` is None: everyone who reads its scope) or known by a list of
characters. A person (the panel: viewer None) sees everything.

Where knowledge comes from:
- witnessing: what is derived from a scene (messages, character memories, scene and session
  summaries) is known by that scene's witnesses, the members of the chat it happened in when it
  was said (and its speaker) — `witnesses()`;
- being told: a "told" event (X told Y about Z, extracted from a later scene and verified verbatim)
  adds the listeners to `known_by` of Z and of the messages Z was derived from — `tell()`. What a
  told event added is recorded (`knowledge_grants`), so undoing the event (its turn rolled back,
  its evidence message deleted, its chat deleted) removes exactly that — `untell()`.

Items a told event may refer to (`ItemRef.kind`): `message` (ref: the message's seq), `memory`,
`character_memory`, `scene_summary`, `lore` (ref: their id) and `sheet_secret` (ref:
`<hash of the text>:<character id>`; a sheet secret's owner always knows it, `known_by` names who
else does).

Owns: knowledge_grants.

It reads other concepts' tables, on purpose: deciding who knows what needs the facts knowledge
comes from, and this module sits below the story concepts (retrieval imports nothing of story),
so it cannot ask them. Read: who shares a chat (`chat_members`), a message's seq from its id
(`messages`), the messages an episode came from (`episode_sources`), and the `known_by` of every
tellable item (`memories`, `episodes`, `lore`, the secrets in `characters.sheet`). Written: only
those `known_by` values (a told event's grant, or its undoing) and its own grants; a message's
`known_by` lives in its index entry (docs.py). tests/test_architecture.py lists these reads.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, Collection, Iterable, Sequence

import numpy as np

from ..core.text import fold
from ..store.db import Connection, dumps, loads
from . import docs as index

MESSAGE = "message"
SHEET_SECRET = "sheet_secret"
# Kinds whose known_by is a column of their own table (and a field of their index entry).
_TABLES = {"memory": "memories", "character_memory": "episodes", "scene_summary": "episodes",
           "lore": "lore"}
TELLABLE = (MESSAGE, SHEET_SECRET, *_TABLES)


def can_see(viewer_id: str | None, known_by: Iterable[str] | None) -> bool:
    """True when the viewer may know an item with this `known_by` list."""
    if viewer_id is None or known_by is None:
        return True
    return viewer_id in known_by


def knows_secret(viewer_id: str | None, owner_id: str, known_by: Iterable[str] | None) -> bool:
    """A sheet secret (SW1, SW9b): its owner always knows it, `known_by` names who else does.

    Unlike a memory, a secret with no `known_by` is not public: only its owner knows it.
    """
    if viewer_id is None or viewer_id == owner_id:
        return True
    return known_by is not None and viewer_id in known_by


def known_by_sql(viewer_id: str | None, column: str) -> tuple[str, list[str]]:
    """The same rule as `can_see`, as an SQL condition on a JSON `known_by` column, and its args."""
    if viewer_id is None:
        return "1", []
    return (f"({column} IS NULL OR EXISTS (SELECT 1 FROM json_each({column}) WHERE value=?))",
            [viewer_id])


# --- search rows (SW6): the same rules, for a whole index at once ------------------------------
# A kind whose owner (`character_id` of its row) is a memory scope (RV4): an unrestricted item of
# such a kind is known to the characters that read that scope (RV5), not to everyone.
SCOPED_KINDS = frozenset({"memory"})


def chat_members(conn: Connection, chat_id: str) -> list[str]:
    """A chat's members, in order: who is present in it."""
    return [r[0] for r in conn.execute(
        "SELECT character_id FROM chat_members WHERE chat_id=? ORDER BY position", (chat_id,))]


def readable_scopes(conn: Any, viewer_id: str) -> frozenset[str]:
    """The character scopes a viewer reads (RV5): its own and those of everyone it shares a chat with."""
    rows = conn.execute("SELECT DISTINCT b.character_id FROM chat_members a JOIN chat_members b"
                        " ON a.chat_id = b.chat_id WHERE a.character_id = ?", (viewer_id,)).fetchall()
    return frozenset([viewer_id, *(r[0] for r in rows)])


def reads_scope(viewer_id: str | None, owner_id: str | None, scopes: Collection[str]) -> bool:
    """True when an unrestricted item owned by `owner_id` (None: global) is known to the viewer."""
    return viewer_id is None or owner_id is None or owner_id in scopes


def row_mask(viewer_id: str | None, *, known_sets: Sequence[Collection[str]], known_codes: np.ndarray,
             scoped: np.ndarray, owners: Sequence[str | None], owner_codes: np.ndarray,
             scopes: Collection[str] = ()) -> np.ndarray:
    """Which rows of a search index the viewer may know (SW9b), as a boolean array.

    Row i is known by `known_sets[known_codes[i]]` (code -1: unrestricted); an unrestricted row of
    a scoped kind (`scoped[i]`) is owned by `owners[owner_codes[i]]` (code -1: nobody). A listed
    `known_by` decides on its own (a character told a secret knows it whoever's scope it is in);
    otherwise `reads_scope` does. A person (viewer None) sees everything.
    """
    n = len(known_codes)
    if viewer_id is None:
        return np.ones(n, dtype=bool)
    listed = np.array([can_see(viewer_id, s) for s in known_sets] + [True], dtype=bool)
    readable = np.array([reads_scope(viewer_id, o, scopes) for o in owners] + [True], dtype=bool)
    # Code -1 picks the trailing True of each table.
    by_list = listed[known_codes]
    by_scope = np.where(scoped, readable[owner_codes], True)
    return np.where(known_codes >= 0, by_list, by_scope)


# --- witnesses ---------------------------------------------------------------------------------

def _message_known_by(conn: Connection, seq: int | str) -> list[str] | None:
    # The index entry of a message holds its witnesses (messages.py writes them).
    return index.entry_known_by(conn, MESSAGE, str(seq))[1]


def _message_seqs(conn: Connection, chat_id: str, message_ids: Iterable[str]) -> list[int]:
    ids = list(dict.fromkeys(message_ids))
    if not ids:
        return []
    marks = ",".join("?" * len(ids))
    return [r[0] for r in conn.execute(f"SELECT seq FROM messages WHERE chat_id=? AND id IN ({marks})",
                                       (chat_id, *ids))]


def witnesses(conn: Connection, chat_id: str, message_ids: Iterable[str]) -> list[str]:
    """Who witnessed these messages of a chat: the members of the chat when each was said and
    its speaker (and whoever was told of it since), united. Falls back to the chat's current
    members when none of the messages is known."""
    found: set[str] = set()
    for seq in _message_seqs(conn, chat_id, message_ids):
        found.update(_message_known_by(conn, seq) or [])
    if not found:
        found.update(chat_members(conn, chat_id))
    return sorted(found)


# --- items and their known_by ------------------------------------------------------------------

@dataclass(frozen=True)
class ItemRef:
    """An item someone may know: its kind (one of TELLABLE) and its id in that kind."""

    kind: str
    ref: str

    def key(self) -> str:
        """One string for a prompt's inputs or a job's result: `kind:ref`."""
        return f"{self.kind}:{self.ref}"

    @classmethod
    def parse(cls, key: str) -> "ItemRef":
        kind, _, ref = key.partition(":")
        if kind not in TELLABLE or not ref:
            raise ValueError(f"not an item key: {key!r}")
        return cls(kind, ref)


def secret_ref(character_id: str, text: str) -> str:
    """The ref of a sheet secret: a hash of its text (whitespace and case folded) and its owner."""
    digest = hashlib.sha1(fold(text).encode()).hexdigest()[:12]
    return f"{digest}:{character_id}"


def _secret(conn: Connection, ref: str) -> tuple[Any, dict[str, Any], int] | None:
    """(character row, sheet, index of the secret in sheet['secrets']) or None."""
    _, _, character_id = ref.partition(":")
    row = conn.execute("SELECT * FROM characters WHERE id=?", (character_id,)).fetchone()
    if row is None:
        return None
    sheet = loads(row["sheet"]) or {}
    for i, secret in enumerate(sheet.get("secrets") or []):
        if isinstance(secret, dict) and secret_ref(character_id, secret.get("text", "")) == ref:
            return row, sheet, i
    return None


_MISSING = object()


def _read(conn: Connection, item: ItemRef) -> Any:
    """The item's known_by list (None: public), or _MISSING when the item does not exist."""
    if item.kind == MESSAGE:
        indexed, known = index.entry_known_by(conn, MESSAGE, item.ref)
        return known if indexed else _MISSING
    if item.kind == SHEET_SECRET:
        found = _secret(conn, item.ref)
        if found is None:
            return _MISSING
        row, sheet, i = found
        # For a secret, "known by" always includes its owner.
        return sorted({row["id"], *(sheet["secrets"][i].get("known_by") or [])})
    table = _TABLES[item.kind]
    if not _table_exists(conn, table):
        return _MISSING
    row = conn.execute(f"SELECT known_by FROM {table} WHERE id=?", (item.ref,)).fetchone()
    return _MISSING if row is None else loads(row[0])


def _write(conn: Connection, item: ItemRef, known: list[str], now: str) -> None:
    known = sorted(set(known))
    if item.kind == MESSAGE:
        index.update_meta(conn, MESSAGE, item.ref, known_by=known)
        return
    if item.kind == SHEET_SECRET:
        found = _secret(conn, item.ref)
        if found is None:
            return
        row, sheet, i = found
        # Who knows a secret is not its content: this is no model writing the sheet (SW1).
        sheet["secrets"][i] = {**sheet["secrets"][i], "known_by": [k for k in known if k != row["id"]]}
        conn.execute("UPDATE characters SET sheet=?, updated_at=? WHERE id=?", (dumps(sheet), now, row["id"]))
        return
    conn.execute(f"UPDATE {_TABLES[item.kind]} SET known_by=? WHERE id=?", (dumps(known), item.ref))
    index.update_meta(conn, item.kind, item.ref, known_by=known)


def _table_exists(conn: Connection, table: str) -> bool:
    return conn.execute("SELECT 1 FROM sqlite_master WHERE type='table' AND name=?", (table,)).fetchone() is not None


def known_by(conn: Connection, item: ItemRef) -> list[str] | None:
    """Who knows an item (None: public). Raises KeyError when the item does not exist."""
    found = _read(conn, item)
    if found is _MISSING:
        raise KeyError(item.key())
    return found


def knows(conn: Connection, viewer_id: str | None, item: ItemRef) -> bool:
    """True when the viewer knows the item (False when it does not exist)."""
    found = _read(conn, item)
    return found is not _MISSING and can_see(viewer_id, found)


def sources_of(conn: Connection, item: ItemRef) -> list[ItemRef]:
    """The messages an item was derived from (being told about it makes them known too, so the
    listener's search can find the original words)."""
    if item.kind in ("character_memory", "scene_summary"):
        rows = conn.execute("SELECT m.seq FROM episode_sources s JOIN messages m ON m.chat_id = s.chat_id"
                            " AND m.id = s.message_id WHERE s.episode_id=?", (item.ref,)).fetchall()
        return [ItemRef(MESSAGE, str(r[0])) for r in rows]
    if item.kind == "memory":
        row = conn.execute("SELECT chat_id, source_message_ids FROM memories WHERE id=?", (item.ref,)).fetchone()
        if row is None or row["chat_id"] is None:
            return []
        return [ItemRef(MESSAGE, str(s)) for s in _message_seqs(conn, row["chat_id"], loads(row["source_message_ids"]))]
    return []


# --- telling and untelling ---------------------------------------------------------------------

def tell(svc: Any, conn: Connection, items: Sequence[ItemRef], listener_ids: Iterable[str],
         told_id: str) -> dict[str, int]:
    """The listeners now know these items (inside a write): each restricted item's `known_by`
    (and its index entry's) gains the listeners who did not know it yet, recorded under
    `told_id`. A public item stays public. Returns how many characters were added, by kind."""
    listeners = sorted(set(listener_ids))
    added: dict[str, int] = {}
    now = svc.clock.iso()
    for item in dict.fromkeys(items):
        current = _read(conn, item)
        if current is _MISSING or current is None:
            continue
        new = [c for c in listeners if c not in current]
        if not new:
            continue
        _write(conn, item, [*current, *new], now)
        conn.executemany("INSERT OR IGNORE INTO knowledge_grants(told_id, item_kind, item_ref, character_id)"
                         " VALUES (?,?,?,?)", [(told_id, item.kind, item.ref, c) for c in new])
        added[item.kind] = added.get(item.kind, 0) + len(new)
    return added


def copy_grants(conn: Connection, told_id: str, new_told_id: str, refs: dict[tuple[str, str], str]) -> None:
    """A told event copied into a branch (CP2) grants what the original granted, recorded under
    the copy: `refs` maps (item kind, ref) to the branch copy's ref; an item not in it keeps its."""
    grants = conn.execute("SELECT item_kind, item_ref, character_id FROM knowledge_grants WHERE told_id=?",
                          (told_id,)).fetchall()
    conn.executemany("INSERT OR IGNORE INTO knowledge_grants(told_id, item_kind, item_ref, character_id)"
                     " VALUES (?,?,?,?)", [(new_told_id, g[0], refs.get((g[0], g[1]), g[1]), g[2]) for g in grants])


def untell(svc: Any, conn: Connection, told_ids: Iterable[str]) -> int:
    """Undo told events (inside a write): remove the characters they added to items' known_by,
    except where another remaining told event added the same character. The events themselves
    are told.py's to delete. Returns how many characters were removed from items."""
    ids = list(dict.fromkeys(told_ids))
    if not ids:
        return 0
    marks = ",".join("?" * len(ids))
    grants = conn.execute(f"SELECT DISTINCT item_kind, item_ref, character_id FROM knowledge_grants"
                          f" WHERE told_id IN ({marks})", ids).fetchall()
    conn.execute(f"DELETE FROM knowledge_grants WHERE told_id IN ({marks})", ids)
    removed = 0
    now = svc.clock.iso()
    by_item: dict[ItemRef, set[str]] = {}
    for g in grants:
        still = conn.execute("SELECT 1 FROM knowledge_grants WHERE item_kind=? AND item_ref=? AND"
                             " character_id=?", (g[0], g[1], g[2])).fetchone()
        if still is None:
            by_item.setdefault(ItemRef(g[0], g[1]), set()).add(g[2])
    for item, gone in by_item.items():
        current = _read(conn, item)
        if current is _MISSING or current is None:
            continue
        _write(conn, item, [c for c in current if c not in gone], now)
        removed += len(gone & set(current))
    return removed


def forget(conn: Connection, items: Iterable[ItemRef]) -> None:
    """Items were deleted: the grants recorded on them go (the told events stay: the telling
    happened, and what else it granted stands)."""
    conn.executemany("DELETE FROM knowledge_grants WHERE item_kind=? AND item_ref=?",
                     [(i.kind, i.ref) for i in items])


def forget_deleted_messages(conn: Connection) -> None:
    """Grants recorded on deleted messages' index entries have nothing left to undo."""
    conn.execute("DELETE FROM knowledge_grants WHERE item_kind=? AND CAST(item_ref AS INTEGER) NOT IN"
                 " (SELECT seq FROM messages)", (MESSAGE,))


# --- secrets: what some characters know and others do not -------------------------------------

@dataclass(frozen=True)
class Secret:
    """An item some of a scene's characters know and some do not (a told event may pass it on)."""

    item: ItemRef
    text: str
    knowers: tuple[str, ...]  # the scene's characters who know it
    updated_at: str


def _split(known: Sequence[str], members: set[str]) -> tuple[str, ...] | None:
    """The members who know it, when some but not all of them do."""
    inside = tuple(sorted(members & set(known)))
    return inside if inside and len(inside) < len(members) else None


def secrets_among(conn: Connection, member_ids: Iterable[str]) -> list[Secret]:
    """Every restricted item that some but not all of these characters know: character memories,
    scene summaries, saved memories and lore with `known_by`, and sheet secrets."""
    members = set(member_ids)
    if len(members) < 2:
        return []
    out: list[Secret] = []
    for row in conn.execute("SELECT id, kind, title, summary, quotes, known_by, updated_at FROM episodes"):
        knowers = _split(loads(row["known_by"]), members)
        if knowers:
            text = f"{row['title']}: {row['summary']}" if row["title"] else row["summary"]
            text = " ".join([text, *(f"{q['speaker']}: \u201c{q['text']}\u201d" for q in loads(row["quotes"]))])
            out.append(Secret(ItemRef(row["kind"], row["id"]), text, knowers, row["updated_at"]))
    for row in conn.execute("SELECT id, text, known_by, updated_at FROM memories WHERE known_by IS NOT NULL"):
        knowers = _split(loads(row["known_by"]), members)
        if knowers:
            out.append(Secret(ItemRef("memory", row["id"]), row["text"], knowers, row["updated_at"]))
    if _table_exists(conn, "lore"):
        for row in conn.execute("SELECT id, title, text, known_by, updated_at FROM lore WHERE known_by IS NOT NULL"):
            knowers = _split(loads(row["known_by"]), members)
            if knowers:
                text = f"{row['title']}: {row['text']}" if row["title"] else row["text"]
                out.append(Secret(ItemRef("lore", row["id"]), text, knowers, row["updated_at"]))
    for row in conn.execute("SELECT id, sheet, updated_at FROM characters"):
        for secret in (loads(row["sheet"]) or {}).get("secrets") or []:
            if not isinstance(secret, dict) or not str(secret.get("text", "")).strip():
                continue
            knowers = _split([row["id"], *(secret.get("known_by") or [])], members)
            if knowers:
                out.append(Secret(ItemRef(SHEET_SECRET, secret_ref(row["id"], secret["text"])),
                                  secret["text"], knowers, row["updated_at"]))
    return out
