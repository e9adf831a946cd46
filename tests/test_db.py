"""The database layer: extension loading, WAL, migrations, one writer, all-or-nothing writes."""

from __future__ import annotations

import threading

import pytest

from server_plugin.app import open_store
from server_plugin.retrieval import docs as index
from server_plugin.settings import defaults
from server_plugin.store import migrations
from server_plugin.store.db import sqlite3
from tests.helpers.api import expect_error


def test_sqlite_module_can_load_extensions_and_has_vec_and_fts5(tmp_path):
    db = open_store(tmp_path / "x.db", defaults(), migrate=False)
    conn = db.reader()
    assert hasattr(sqlite3.Connection, "enable_load_extension")
    assert conn.execute("SELECT vec_version()").fetchone()[0].startswith("v")
    conn.execute("SELECT * FROM pragma_compile_options WHERE compile_options='ENABLE_FTS5'").fetchone()
    assert db.reader().execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    db.close()


def test_migrations_are_numbered_recorded_and_applied_once(tmp_path):
    db = open_store(tmp_path / "x.db", defaults(), migrate=False)
    first = migrations.migrate(db)
    assert first == [n for n, _ in migrations.MIGRATIONS]
    assert migrations.migrate(db) == []
    rows = db.reader().execute("SELECT number, name FROM schema_migrations ORDER BY number").fetchall()
    assert [(r[0], r[1]) for r in rows] == [(n, f.__name__) for n, f in migrations.MIGRATIONS]
    db.close()


def test_a_failing_migration_leaves_nothing_behind(tmp_path, monkeypatch):
    db = open_store(tmp_path / "x.db", defaults(), migrate=False)
    migrations.migrate(db)

    def broken(conn):
        conn.execute("CREATE TABLE half_done (x)")
        raise RuntimeError("boom")

    monkeypatch.setattr(migrations, "MIGRATIONS", [*migrations.MIGRATIONS, (999, broken)])
    with pytest.raises(RuntimeError):
        migrations.migrate(db)
    conn = db.reader()
    assert conn.execute("SELECT count(*) FROM sqlite_master WHERE name='half_done'").fetchone()[0] == 0
    assert 999 not in migrations.applied(db)
    db.close()


def test_write_is_all_or_nothing_row_text_and_vector(services):
    """A logical write (row + full-text + vector) commits together or not at all."""
    prepared = index.prepare(services, ["a fact"], keep_names=True)[0]
    with pytest.raises(RuntimeError):
        with services.db.write() as conn:
            index.put(conn, "memory", "m1", prepared, created_at="2026-01-01T00:00:00.000000Z")
            raise RuntimeError("crash between row and commit")
    conn = services.db.reader()
    assert conn.execute("SELECT count(*) FROM docs").fetchone()[0] == 0
    assert index.orphans(conn) == {k: 0 for k in index.orphans(conn)}
    with services.db.write() as conn:
        index.put(conn, "memory", "m1", prepared, created_at="2026-01-01T00:00:00.000000Z")
    assert services.db.reader().execute("SELECT count(*) FROM docs_vec").fetchone()[0] == 1


def test_nested_write_joins_the_outer_transaction(services):
    with pytest.raises(RuntimeError):
        with services.db.write() as outer:
            outer.execute("INSERT INTO meta(key, value) VALUES ('a', '1')")
            with services.db.write() as inner:
                inner.execute("INSERT INTO meta(key, value) VALUES ('b', '2')")
            raise RuntimeError("roll back both")
    assert services.db.reader().execute("SELECT count(*) FROM meta").fetchone()[0] == 0


def test_many_threads_writing_never_see_database_is_locked(services):
    errors: list[Exception] = []

    def worker(n: int) -> None:
        try:
            for i in range(50):
                with services.db.write() as conn:
                    conn.execute("INSERT INTO meta(key, value) VALUES (?, ?)", (f"{n}-{i}", "v"))
                services.db.reader().execute("SELECT count(*) FROM meta").fetchone()
        except Exception as exc:  # pragma: no cover - the assertion below reports it
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert services.db.reader().execute("SELECT count(*) FROM meta").fetchone()[0] == 400


@pytest.mark.parametrize("overrides", [{"max_page_count": 100_000}])
def test_max_page_count_setting_is_applied(services):
    assert services.db.reader().execute("PRAGMA max_page_count").fetchone()[0] == 100_000


def test_full_database_is_507_and_reads_keep_working(api, services):
    """Disk full (simulated with max_page_count): writes fail with 507, reads go on, nothing corrupt."""
    api.post("/v1/memories", json={"text": "first (allocates the vector chunk)", "scope": "global", "actor": "user"})
    writer = services.db._writer
    pages = writer.execute("PRAGMA page_count").fetchone()[0]
    writer.execute(f"PRAGMA max_page_count={pages + 12}")
    saved, response = 1, None
    for i in range(200):
        response = api.post("/v1/memories", json={"text": f"fact number {i} " + "x" * 450,
                                                  "scope": "global", "actor": "user"})
        if response.status_code != 201:
            break
        saved += 1
    expect_error(response, 507, "storage_full")
    assert 1 < saved < 200
    listed = api.get("/v1/memories?scope=global").get_json()["memories"]
    assert len(listed) == min(saved, 100)
    conn = services.db.reader()
    assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    assert all(v == 0 for v in index.orphans(conn).values())
    assert conn.execute("SELECT count(*) FROM memories").fetchone()[0] == saved
    assert conn.execute("SELECT count(*) FROM docs").fetchone()[0] == saved
