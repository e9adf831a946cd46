"""What every migration uses: running a script of statements inside the caller's transaction."""

from __future__ import annotations

from ..db import Connection, sqlite3

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
