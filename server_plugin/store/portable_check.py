"""The checks a whole-store document passes before an import touches the store (portable.py):
its header (format, version, migrations), then every table and column known, every value of its
column's type, NOT NULL values present, no repeated key, references satisfied within the
document; each problem listed with its JSON path (422 `invalid_import`, at most MAX_PROBLEMS).
"""

from __future__ import annotations

import base64
from typing import TYPE_CHECKING, Any, Callable, Iterable

from ..errors import Conflict, Unprocessable
from . import migrations

if TYPE_CHECKING:
    from .portable import Table

FORMAT = "chronicler-store"
FORMAT_VERSION = 1
MAX_PROBLEMS = 20


class Problems:
    """What is wrong with a document, collected (up to a bound) so the answer lists them all."""

    def __init__(self) -> None:
        self.items: list[dict[str, str]] = []
        self.count = 0

    def add(self, path: str, message: str) -> None:
        self.count += 1
        if len(self.items) < MAX_PROBLEMS:
            self.items.append({"path": path, "message": message})

    def raise_if_any(self, what: str = "The import document is not valid") -> None:
        if self.items:
            first = self.items[0]
            more = f" (and {self.count - 1} more)" if self.count > 1 else ""
            raise Unprocessable("invalid_import", f"{what}: {first['path']}: {first['message']}{more}."
                                " Nothing was imported.", self.items)


def _value_ok(value: Any, affinity: str) -> bool:
    if value is None:
        return True
    if isinstance(value, dict):
        return (affinity in ("ANY",) and set(value) == {"base64"} and isinstance(value["base64"], str))
    if isinstance(value, bool):
        return False  # SQLite has no booleans: an export never holds one
    if affinity == "INTEGER":
        return isinstance(value, int)
    if affinity == "TEXT":
        return isinstance(value, str)
    if affinity == "REAL":
        return isinstance(value, (int, float))
    return isinstance(value, (int, float, str))


def _decode(value: Any) -> Any:
    if isinstance(value, dict):
        return base64.b64decode(value["base64"], validate=True)
    return value


def check_header(document: Any, applied: list[int]) -> None:
    """Format, version and migrations, before anything else is looked at."""
    if not isinstance(document, dict) or document.get("format") != FORMAT:
        raise Unprocessable("invalid_import", f"This is not a Chronicler export (its 'format' must be "
                            f"{FORMAT!r}). Nothing was imported.")
    version = document.get("format_version")
    if version != FORMAT_VERSION:
        raise Unprocessable("unsupported_format_version", f"This export has format version {version!r};"
                            f" this Chronicler reads version {FORMAT_VERSION}. Nothing was imported.",
                            [{"format_version": version, "supported": [FORMAT_VERSION]}])
    if not isinstance(document.get("vectors", True), bool):
        raise Unprocessable("invalid_import", "'vectors' must be true or false (false: a document "
                            "without vectors, made again in the background). Nothing was imported.")
    numbers = document.get("migrations")
    if not isinstance(numbers, list) or not all(isinstance(n, int) and not isinstance(n, bool)
                                                for n in numbers):
        raise Unprocessable("invalid_import", "'migrations' must be a list of migration numbers.")
    if numbers == applied:
        return
    unknown = sorted(set(numbers) - set(migrations.known()))
    if unknown:
        raise Conflict("migrations_mismatch", f"The export is newer than this Chronicler: it was made "
                       f"with migrations {numbers}, and {unknown} are unknown here (this version has "
                       f"{migrations.known()}). Update Chronicler, then import it. Nothing was imported.",
                       [{"document": numbers, "store": applied, "newer": "document", "unknown": unknown}])
    if len(set(numbers)) != len(numbers):
        raise Unprocessable("invalid_import", f"'migrations' repeats a number: {numbers}.")
    if set(numbers) - set(applied):
        # Only a store this version has not migrated yet lacks one it knows (never a served one).
        raise Conflict("migrations_mismatch", f"This store is older than the export: the store has "
                       f"migrations {applied}, the export {numbers}. Open the store with this version "
                       f"(it migrates), then import. Nothing was imported.",
                       [{"document": numbers, "store": applied, "newer": "document"}])



def check_document(document: dict[str, Any], known: list[Table],
                   vectors: bool = True) -> dict[str, list[list[Any]]]:
    """Every table and column known, every value of its column's type, required values present,
    no duplicate keys, declared references satisfied within the document; `vectors` False (the
    document says `"vectors": false`): no rows in the tables that hold vectors. Returns the rows
    by table (values decoded)."""
    problems = Problems()
    by_name = {t.name: t for t in known}
    given = document.get("tables")
    if not isinstance(given, dict):
        problems.add("/tables", "must be an object of tables")
        problems.raise_if_any()
    for name in sorted(set(given) - set(by_name)):
        problems.add(f"/tables/{name}", "is not a table of this store")
    for name in sorted(set(by_name) - set(given)):
        problems.add(f"/tables/{name}", "is missing (an export of this version has every table)")
    decoded: dict[str, list[list[Any]]] = {}
    for name in sorted(set(given) & set(by_name)):
        decoded[name] = _check_table(by_name[name], given[name], problems)
        if not vectors and by_name[name].vectors and decoded[name]:
            problems.add(f"/tables/{name}/rows", f"holds {len(decoded[name])} rows of vectors, but the "
                         "document says \"vectors\": false")
    problems.raise_if_any()
    _check_references(known, decoded, problems)
    problems.raise_if_any()
    return decoded


def _check_table(table: Table, data: Any, problems: Problems) -> list[list[Any]]:
    where = f"/tables/{table.name}"
    if not isinstance(data, dict) or set(data) != {"columns", "rows"}:
        problems.add(where, "must be an object with exactly 'columns' and 'rows'")
        return []
    columns, rows = data["columns"], data["rows"]
    if columns != list(table.columns):
        unknown = [c for c in columns if c not in table.columns] if isinstance(columns, list) else columns
        problems.add(f"{where}/columns", f"must be {list(table.columns)}" +
                     (f"; unknown: {unknown}" if unknown else ""))
        return []
    if not isinstance(rows, list):
        problems.add(f"{where}/rows", "must be a list of rows")
        return []
    key_at = [columns.index(c) for c in table.key]
    required_at = [i for i, c in enumerate(columns) if c in table.required or c in table.key]
    kinds = [table.affinity.get(c, "ANY") for c in columns]
    seen: set[tuple[Any, ...]] = set()
    out: list[list[Any]] = []
    for n, row in enumerate(rows):
        if not isinstance(row, list) or len(row) != len(columns):
            problems.add(f"{where}/rows/{n}", f"must be a list of {len(columns)} values")
            continue
        bad = [columns[i] for i, v in enumerate(row) if not _value_ok(v, kinds[i])]
        bad += [columns[i] for i in required_at if row[i] is None and columns[i] != "rowid"]
        if bad:
            problems.add(f"{where}/rows/{n}", f"bad value for {sorted(set(bad))}")
            continue
        if key_at:
            key = tuple(row[i] for i in key_at)
            if key in seen:
                problems.add(f"{where}/rows/{n}", f"repeats the key {dict(zip(table.key, key))}")
            seen.add(key)
        try:
            out.append([_decode(v) for v in row])
        except ValueError:
            problems.add(f"{where}/rows/{n}", "holds a 'base64' value that is not base64")
    return out


# References no foreign key declares, but every store keeps: checked like declared ones.
# (table, column, condition on the row or None) -> (target table, target column).
Reference = tuple[str, str, Callable[[dict[str, Any]], bool] | None, str, str]
REFERENCES: list[Reference] = [
    ("docs", "ref_id", lambda r: r["kind"] == "memory", "memories", "id"),
    ("docs", "ref_id", lambda r: r["kind"] == "message", "messages", "seq"),
    ("messages", "chat_id", None, "chats", "id"),
    ("summaries", "chat_id", None, "chats", "id"),
    ("sessions", "chat_id", None, "chats", "id"),
    ("notes", "chat_id", None, "chats", "id"),
]


def reference(table: str, column: str, target: str, target_column: str,
              when: Callable[[dict[str, Any]], bool] | None = None) -> None:
    """Register a reference an import must find satisfied (for a module's own tables)."""
    entry = (table, column, when, target, target_column)
    if entry not in REFERENCES:
        REFERENCES.append(entry)


def _check_references(known: list[Table], rows: dict[str, list[list[Any]]], problems: Problems) -> None:
    by_name = {t.name: t for t in known}

    def values(name: str, cols: Iterable[str]) -> set[tuple[Any, ...]]:
        at = [by_name[name].columns.index(c) for c in cols]
        return {tuple(str(r[i]) for i in at) for r in rows.get(name, [])}

    checks = [(t.name, cols, None, target, tcols) for t in known for cols, target, tcols in t.references]
    checks += [(t, (c,), when, target, (tc,)) for t, c, when, target, tc in REFERENCES
               if t in by_name and target in by_name]
    for name, cols, when, target, target_cols in checks:
        if target not in by_name:
            continue
        targets = values(target, target_cols)
        columns = by_name[name].columns
        at = [columns.index(c) for c in cols]
        for n, row in enumerate(rows.get(name, [])):
            if when is not None and not when(dict(zip(columns, row))):
                continue
            key = tuple(row[i] for i in at)
            if any(v is None for v in key):
                continue
            if tuple(str(v) for v in key) not in targets:
                problems.add(f"/tables/{name}/rows/{n}",
                             f"{'/'.join(cols)} {key[0] if len(key) == 1 else key!r} points at no "
                             f"{target} row")
