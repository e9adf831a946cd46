"""Numbered schema migrations, each applied once in its own transaction and recorded in a table.

A migration is a function taking the writer connection, one module each (`mNNN_<what>.py`). Add a
new one at the end of MIGRATIONS with the next number; never edit or renumber one that has shipped.

Every table is created here; the module that owns one (reads and writes it; the others call its
functions) says so in its docstring, `Owns: <tables>.` (tests/test_architecture.py checks both).

Owns: meta, schema_migrations.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Callable, Collection

from ..db import Connection, Database
from .m001_foundation import m001_foundation
from .m002_conversation import m002_conversation
from .m003_search import m003_search
from .m004_lore_and_context import m004_lore_and_context
from .m005_episodes import m005_episodes
from .m006_summary_counter import m006_summary_counter
from .m007_job_costs import m007_job_costs
from .m008_analyzer_version import m008_analyzer_version
from .m009_campaigns import m009_campaigns
from .m010_grown_lore import m010_grown_lore
from .m011_embedders import m011_embedders
from .m012_summary_tops import m012_summary_tops


MIGRATIONS: list[tuple[int, Callable[[Connection], None]]] = [
    (1, m001_foundation),
    (2, m002_conversation),
    (3, m003_search),
    (4, m004_lore_and_context),
    (5, m005_episodes),
    (6, m006_summary_counter),
    (7, m007_job_costs),
    (8, m008_analyzer_version),
    (9, m009_campaigns),
    (10, m010_grown_lore),
    (11, m011_embedders),
    (12, m012_summary_tops),
]


def applied(db: Database) -> list[int]:
    """Numbers of the migrations already applied, in order."""
    conn = db.reader()
    exists = conn.execute(
        "SELECT 1 FROM sqlite_master WHERE type='table' AND name='schema_migrations'").fetchone()
    if not exists:
        return []
    return [row[0] for row in conn.execute("SELECT number FROM schema_migrations ORDER BY number")]


def known() -> list[int]:
    """Numbers of every migration this version has, in the order they apply."""
    return [number for number, _ in MIGRATIONS]


def migrate(db: Database, only: Collection[int] | None = None) -> list[int]:
    """Apply every pending migration (or those of `only`: a store as an older version left it),
    each in its own transaction; return the numbers applied."""
    with db.write() as conn:
        conn.execute("""CREATE TABLE IF NOT EXISTS schema_migrations (
            number INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at TEXT NOT NULL)""")
    done = set(applied(db))
    newly: list[int] = []
    for number, func in MIGRATIONS:
        if number in done or (only is not None and number not in only):
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
