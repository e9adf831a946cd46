"""Export and import of the whole store as one versioned JSON document (`GET /v1/export`,
`POST /v1/import`, `chronicler export` / `chronicler import`).

The document is the store, table by table, discovered from the database itself: a table added by
a later migration is exported and imported without a line here. Format (version 1):

    {"format": "chronicler-store", "format_version": 1, "migrations": [1, 2, ...],
     "tables": {"<name>": {"columns": ["<col>", ...], "rows": [[<value>, ...], ...]}, ...}}

- Every ordinary table is included, rows ordered by primary key (rowid where there is none), so
  the same store always gives the same document. `schema_migrations` is the `migrations` list;
  SQLite's own tables and the shadow tables of virtual tables are left out.
- The search index is included, not rebuilt: `docs` (who knows each item, as it was when said)
  and every virtual table by rowid — the full-text entries as text and the vectors as
  `{"base64": …}` of their little-endian float32 bytes — so an import needs no embedding model
  and is exact. Any BLOB value is written the same way; every other value is plain JSON.
- A document from an older version (its migrations a subset of this one's) is upgraded first
  by the migrations themselves: imported into a scratch store migrated only as far as the
  document's, then that store migrated the rest of the way and exported again (`upgrade`). A
  document with a migration this version does not know is newer, and refused (409).
- Import checks the whole document before it touches the store (portable_check.py: shape, format
  version, the migration numbers equal to this store's once upgraded, every table and column known,
  value types, NOT NULL, duplicate keys, references), then writes it in ONE transaction with the triggers paused (the
  rows are the document's, counters included), checks foreign keys and the index's integrity,
  and commits — or rolls back and leaves the store exactly as it was.
- Modes: "empty" (the default) imports only into a store holding no data; "replace" deletes
  everything first and needs `confirm_replace: true`. Merging into a non-empty store is not
  supported: ids from two stores would collide, and the document's rows would lose their meaning.
"""

from __future__ import annotations

import base64
import json
import re
import tempfile
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

from ..errors import Conflict, Unprocessable
from . import migrations
from .db import Connection, Database
from .portable_check import FORMAT, FORMAT_VERSION, MAX_PROBLEMS, check_document, check_header

MODES = ("empty", "replace")


# --- what the store holds ----------------------------------------------------------------------
@dataclass(frozen=True)
class Table:
    """One exported table, as read from the schema."""

    name: str
    columns: tuple[str, ...]
    virtual: bool
    order: tuple[str, ...]                      # ORDER BY of the export
    affinity: dict[str, str] = field(default_factory=dict)   # column -> INTEGER/TEXT/REAL/ANY
    required: frozenset[str] = frozenset()      # NOT NULL columns
    key: tuple[str, ...] = ()                   # primary key (duplicates refused)
    references: tuple[tuple[tuple[str, ...], str, tuple[str, ...]], ...] = ()  # declared FKs
    vectors: bool = False  # holds vectors: a vec0 table, or one with a BLOB column (left out by vectors=False)


def _affinity(declared: str) -> str:
    """SQLite's affinity rules, reduced to what a JSON value must be."""
    upper = (declared or "").upper()
    if "INT" in upper:
        return "INTEGER"
    if any(word in upper for word in ("CHAR", "CLOB", "TEXT")):
        return "TEXT"
    if any(word in upper for word in ("REAL", "FLOA", "DOUB")):
        return "REAL"
    return "ANY"


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _shadow_names(conn: Connection, virtual: list[str]) -> set[str]:
    """Tables that store a virtual table's data (FTS5 and vec0 keep theirs in `<name>_…`)."""
    listed = {r[1] for r in conn.execute("PRAGMA table_list") if r[2] == "shadow"}
    names = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")]
    return listed | {n for n in names for v in virtual if n.startswith(v + "_")}


def _describe(conn: Connection, name: str, virtual: bool, sql: str = "") -> Table:
    info = conn.execute(f"PRAGMA table_xinfo({_quote(name)})").fetchall()
    if virtual:
        if re.search(r"\bcontent\s*=", sql, re.I):
            # A contentless or external-content FTS table returns no text to export: it would
            # need a rebuild rule here, and silently exporting NULLs would lose the index.
            raise RuntimeError(f"{name}: FTS tables with content= are not exportable as rows; "
                               "give portable.py a rebuild rule for it")
        # Hidden columns (fts5's rank, vec0's distance and k) are not data; the rowid is.
        columns = ("rowid",) + tuple(r[1] for r in info if not r[6] and r[1] != "rowid")
        return Table(name, columns, True, ("rowid",), vectors="vec0" in sql.lower())
    columns = tuple(r[1] for r in info if not r[6])
    key = tuple(r[1] for r in sorted((r for r in info if r[5]), key=lambda r: r[5]))
    fks: dict[int, list[Any]] = {}
    for r in conn.execute(f"PRAGMA foreign_key_list({_quote(name)})"):
        fks.setdefault(r[0], []).append(r)
    refs = tuple((tuple(r[3] for r in rows), rows[0][2], tuple(r[4] for r in rows))
                 for rows in fks.values())
    return Table(name, columns, False, key or ("rowid",),
                 {r[1]: _affinity(r[2]) for r in info},
                 frozenset(r[1] for r in info if r[3] and not r[5]), key, refs,
                 any("BLOB" in (r[2] or "").upper() for r in info))


def tables(conn: Connection) -> list[Table]:
    """Every table the document carries, by name."""
    rows = conn.execute("SELECT name, sql FROM sqlite_master WHERE type='table' ORDER BY name").fetchall()
    virtual = [r[0] for r in rows if (r[1] or "").upper().startswith("CREATE VIRTUAL")]
    skip = _shadow_names(conn, virtual) | {"schema_migrations"}
    return [_describe(conn, r[0], r[0] in virtual, r[1] or "") for r in rows
            if r[0] not in skip and not r[0].startswith("sqlite_")]


def _scratch(folder: str) -> Database:
    # A private scratch file: no other process waits on its locks, no crash need be survived,
    # and it holds only what this process puts there (so no cap either).
    return Database(Path(folder) / "scratch.sqlite3", busy_timeout_ms=0, synchronous="OFF", max_page_count=0)


@lru_cache(maxsize=8)
def seeded_tables(numbers: tuple[int, ...]) -> frozenset[str]:
    """Tables that hold rows right after migrating (counters): an 'empty' store may have those."""
    with tempfile.TemporaryDirectory() as folder:
        db = _scratch(folder)
        try:
            migrations.migrate(db, only=numbers)
            conn = db.reader()
            return frozenset(t.name for t in tables(conn)
                             if conn.execute(f"SELECT 1 FROM {_quote(t.name)} LIMIT 1").fetchone())
        finally:
            db.close()


# --- export ------------------------------------------------------------------------------------
def _cell(value: Any) -> Any:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return {"base64": base64.b64encode(bytes(value)).decode("ascii")}
    return value


def export_store(db: Database, vectors: bool = True) -> dict[str, Any]:
    """The whole store as one document, read in one snapshot (see the module doc); `vectors`
    False: the tables that hold vectors with no rows, and the document says `"vectors": false`."""
    with db.read() as conn:
        numbers = [r[0] for r in conn.execute("SELECT number FROM schema_migrations ORDER BY number")]
        out: dict[str, Any] = {}
        for table in tables(conn):
            out[table.name] = {"columns": list(table.columns), "rows": [] if table.vectors and not vectors
                               else [[_cell(v) for v in row] for row in _rows(conn, table)]}
    document = {"format": FORMAT, "format_version": FORMAT_VERSION, "migrations": numbers, "tables": out}
    return document if vectors else {**document, "vectors": False}


def _rows(conn: Connection, table: Table) -> Any:
    """A cursor over the table's rows, in the export's order."""
    columns = ", ".join(_quote(c) for c in table.columns)
    order = ", ".join(_quote(c) if c != "rowid" else "rowid" for c in table.order)
    return conn.execute(f"SELECT {columns} FROM {_quote(table.name)} ORDER BY {order}")


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, sort_keys=True, separators=(",", ":"), allow_nan=False)


def export_chunks(db: Database, rows_per_chunk: int = 500, vectors: bool = True) -> Iterator[bytes]:
    """The bytes of `canonical(export_store(db, vectors))`, made table by table and a few hundred
    rows at a time from one snapshot: what is held in memory does not grow with the store (a
    campaign's export is hundreds of MB)."""
    with db.read() as conn:
        numbers = [r[0] for r in conn.execute("SELECT number FROM schema_migrations ORDER BY number")]
        # sort_keys order: format < format_version < migrations < tables; columns < rows.
        yield (f'{{"format":{_json(FORMAT)},"format_version":{FORMAT_VERSION},'
               f'"migrations":{_json(numbers)},"tables":{{').encode("utf-8")
        for n, table in enumerate(tables(conn)):
            yield (("," if n else "") + f'{_json(table.name)}:{{"columns":{_json(list(table.columns))},'
                   '"rows":[').encode("utf-8")
            first = True
            cursor = _rows(conn, table) if vectors or not table.vectors else None
            while cursor is not None and (batch := cursor.fetchmany(rows_per_chunk)):
                part = ",".join(_json([_cell(v) for v in row]) for row in batch)
                yield (("" if first else ",") + part).encode("utf-8")
                first = False
            yield b"]}"
        yield b"}}" if vectors else b'},"vectors":false}'


def canonical(document: dict[str, Any]) -> bytes:
    """The document's canonical JSON (sorted keys, no spaces, UTF-8): equal stores, equal bytes."""
    return json.dumps(document, ensure_ascii=False, sort_keys=True, separators=(",", ":"),
                      allow_nan=False).encode("utf-8")


def write_file(document: dict[str, Any] | Iterable[bytes], out: Path) -> int:
    """Write the document (or its chunks, `export_chunks`) beside `out`, then rename it into
    place (private: mode 0600). Returns the bytes written."""
    import os

    out.parent.mkdir(parents=True, exist_ok=True)
    part = out.with_name(out.name + ".part")
    part.unlink(missing_ok=True)
    chunks = [canonical(document)] if isinstance(document, dict) else document
    size = 0
    # O_BINARY (Windows only): "wb" on a descriptor opened in text mode still turns "\n" into "\r\n".
    fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o600)
    try:
        with os.fdopen(fd, "wb") as fh:
            for chunk in chunks:
                fh.write(chunk)
                size += len(chunk)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(part, out)
    except BaseException:
        part.unlink(missing_ok=True)
        raise
    return size


# --- upgrading an older document ---------------------------------------------------------------
def upgrade(document: dict[str, Any], finish: Callable[[Database], Any] | None = None) -> dict[str, Any]:
    """An older document as this version exports the same store: imported into a scratch store
    migrated only as far as the document's, the remaining migrations applied to it (then
    `finish`, what the application does after migrating: app.open_store), exported again."""
    with tempfile.TemporaryDirectory() as folder:
        db = _scratch(folder)
        try:
            migrations.migrate(db, only=set(document["migrations"]))
            # Checked against the schema of its own version; without vectors, none are made here.
            import_store(db, document, placeholders=lambda conn: 0)
            migrations.migrate(db)
            if finish is not None:
                finish(db)
            return export_store(db, vectors=document.get("vectors", True))
        finally:
            db.close()


# --- importing ---------------------------------------------------------------------------------
def data_counts(conn: Connection, known: list[Table], seeded: frozenset[str]) -> dict[str, int]:
    """Rows in each table that holds data (counters excluded), only the non-empty ones."""
    out = {}
    for t in known:
        if t.name in seeded:
            continue
        n = conn.execute(f"SELECT count(*) FROM {_quote(t.name)}").fetchone()[0]
        if n:
            out[t.name] = n
    return out


def import_store(db: Database, document: Any, mode: str = "empty", confirm_replace: bool = False,
                 check: Callable[[Connection], Any] | None = None,
                 finish: Callable[[Database], Any] | None = None,
                 placeholders: Callable[[Connection], int] | None = None) -> dict[str, Any]:
    """Check the whole document (an older one upgraded first), then write it in one transaction
    (see the module doc).

    `check(conn)` runs inside that transaction once every row is written; it raises to refuse
    the document (the concepts' `hooks.store_importing`: the search index must be whole).
    `finish(db)` is what the application does after migrating a store (see `upgrade`).
    `placeholders(conn)`, for a document without vectors (`"vectors": false`), runs in the same
    transaction before `check`: it gives the index's rows placeholder vectors, to be embedded in
    the background (retrieval/reembed.without_vectors), and returns how many rows wait for one.

    Raises Unprocessable (422) for a document that is not valid here, Conflict (409) for
    migrations that differ, a non-empty store in mode 'empty', or 'replace' without confirmation.
    """
    if mode not in MODES:
        raise Unprocessable("invalid_import", f"mode must be one of {list(MODES)}, got {mode!r}.")
    if mode == "replace" and confirm_replace is not True:
        raise Conflict("confirmation_required", "Replacing the store deletes everything in it; send "
                       "confirm_replace: true to do it. Nothing was imported.")
    applied = migrations.applied(db)
    check_header(document, applied)
    vectors = document.get("vectors", True)
    if not vectors and placeholders is None:  # a caller's mistake, not the document's
        raise Unprocessable("invalid_import", "This document has no vectors (\"vectors\": false), and "
                            "this import cannot make them; import it through the sidecar or the "
                            "chronicler command. Nothing was imported.")
    upgraded_from = None
    if document["migrations"] != applied:
        upgraded_from = list(document["migrations"])
        document = upgrade(document, finish)
    seeded = seeded_tables(tuple(applied))
    with db.read() as conn:
        known = tables(conn)
    rows = check_document(document, known, vectors)
    with db.write() as conn:
        present = data_counts(conn, known, seeded)
        if present and mode == "empty":
            held = ", ".join(f"{n} {name}" for name, n in sorted(present.items()))
            raise Conflict("store_not_empty", f"This store already holds data ({held}). Import into "
                           "an empty store, or send mode 'replace' with confirm_replace: true to "
                           "replace everything; merging two stores is not supported. Nothing was "
                           "imported.", [{"table": k, "rows": v} for k, v in sorted(present.items())])
        pending = _write(conn, known, rows, seeded, check, None if vectors else placeholders)
    counts = {t.name: len(rows[t.name]) for t in known if t.name not in seeded}
    out: dict[str, Any] = {"mode": mode, "imported": counts, "replaced": present}
    if not vectors:
        out["vectors_pending"] = pending
    if upgraded_from is not None:
        out["upgraded_from"] = upgraded_from
    return out


def _write(conn: Connection, known: list[Table], rows: dict[str, list[list[Any]]],
           seeded: frozenset[str], check: Callable[[Connection], Any] | None,
           placeholders: Callable[[Connection], int] | None = None) -> int:
    """Inside the write transaction: clear, pause triggers, insert (placeholder vectors where the
    document has none), check, restore triggers. Returns how many rows got a placeholder."""
    conn.execute("PRAGMA defer_foreign_keys=ON")  # checked once, at the end
    triggers = conn.execute("SELECT name, sql FROM sqlite_master WHERE type='trigger'").fetchall()
    for name, _ in triggers:  # DDL is transactional: a rollback brings them back
        conn.execute(f"DROP TRIGGER {_quote(name)}")
    for table in known:
        conn.execute(f"DELETE FROM {_quote(table.name)}")
    for table in known:
        if not rows[table.name]:
            continue
        if table.virtual:
            _fit_vectors(conn, table.name, rows[table.name][0])
        marks = ", ".join("?" * len(table.columns))
        sql = (f"INSERT INTO {_quote(table.name)}({', '.join(_quote(c) for c in table.columns)})"
               f" VALUES ({marks})")
        for n, row in enumerate(rows[table.name]):
            try:
                conn.execute(sql, row)
            except Exception as exc:  # a CHECK, UNIQUE or vector-size failure: name the row
                storage = Database._translate(exc)
                if storage is not exc:  # a full disk or an I/O error is not the document's fault
                    raise storage from exc
                raise Unprocessable("invalid_import", f"/tables/{table.name}/rows/{n}: the store refused "
                                    f"it: {exc}. Nothing was imported.",
                                    [{"path": f"/tables/{table.name}/rows/{n}", "message": str(exc)}]) from exc
    pending = placeholders(conn) if placeholders is not None else 0
    broken = conn.execute("PRAGMA foreign_key_check").fetchall()
    if broken:
        raise Unprocessable("invalid_import", f"Rows point at rows that do not exist (first: table "
                            f"{broken[0][0]}, row {broken[0][1]}, to {broken[0][2]}). Nothing was imported.",
                            [{"table": r[0], "rowid": r[1], "parent": r[2]} for r in broken[:MAX_PROBLEMS]])
    if check is not None:
        check(conn)
    for _, sql in triggers:
        conn.execute(sql)
    return pending


def _fit_vectors(conn: Connection, name: str, first: list[Any]) -> None:
    """A vec0 table made anew for the document's vectors when they are of another size (a store
    of another embedder, docs/search.md section 6); it was emptied above."""
    sql = conn.execute("SELECT sql FROM sqlite_master WHERE name = ?", (name,)).fetchone()[0] or ""
    size = re.search(r"float\[(\d+)\]", sql)
    blob = next((v for v in first if isinstance(v, (bytes, bytearray))), None)
    if "vec0" in sql.lower() and size and blob is not None and len(blob) // 4 != int(size.group(1)):
        conn.execute(f"DROP TABLE {_quote(name)}")
        conn.execute(sql.replace(size.group(0), f"float[{len(blob) // 4}]"))


# --- after an import, in a running sidecar -----------------------------------------------------
def import_into(svc: Any, document: Any, mode: str = "empty", confirm_replace: bool = False,
                finish: Callable[[Database], Any] | None = None,
                placeholders: Callable[[Connection], int] | None = None) -> dict[str, Any]:
    """`import_store` for a running sidecar (its concepts check the rows: `hooks.store_importing`),
    then drop its caches and wake the job worker (the document's pending jobs resume)."""
    result = import_store(svc.db, document, mode, confirm_replace, check=svc.hooks.store_importing.send,
                          finish=finish, placeholders=placeholders)
    svc.clear_caches()
    svc.jobs_wake.set()
    return result
