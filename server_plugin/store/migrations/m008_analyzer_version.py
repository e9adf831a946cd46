"""Schema migration 8, `m008_analyzer_version`: what it does is its function's docstring."""

from __future__ import annotations

from ..db import Connection
from .script import run_script


def m008_analyzer_version(conn: Connection) -> None:
    """Which analyzer made each search row's BM25 terms. Rows written before this migration are
    marked stale (0); the search index re-analyses them in the background with today's analyzer
    (a migration never calls the analyzer, which may change after it)."""
    run_script(conn, "ALTER TABLE docs ADD COLUMN analyzer INTEGER NOT NULL DEFAULT 0;")
