"""Every schema state the main line has shipped still opens (rule OP8): for each one a store and,
where that version had export, an export document, made by the code of that time
(tests/fixtures/upgrade/, rebuilt by make_upgrade_fixtures.py there). The store opens and
migrates with nothing lost; the document imports, upgraded; a newer document is refused."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from server_plugin.app import build_services, create_app
from server_plugin.store import migrations, portable
# The store's own SQLite library: a second copy in this process (the stdlib's, when pysqlite3 is the
# store's) does not see the store's locks, takes itself for the only connection and resets the WAL
# index the store has mapped: SIGBUS (seen in CI in this file).
from server_plugin.store.db import sqlite3
from tests.helpers.api import Api, expect_error, expect_ok

FIXTURES = Path(__file__).parent / "fixtures" / "upgrade"
STATES = sorted((p.name for p in FIXTURES.iterdir() if (p / "manifest.json").is_file()),
                key=lambda name: [int(n) for n in name[1:].split("-")])
EXPORTS = [s for s in STATES if (FIXTURES / s / "export.json.gz").is_file()]
ITEM_TABLES = ("characters", "chats", "chat_members", "memories", "messages", "lore", "notes")


def manifest(state: str) -> dict[str, Any]:
    return json.loads((FIXTURES / state / "manifest.json").read_text())


def document(state: str) -> dict[str, Any]:
    return json.loads(gzip.decompress((FIXTURES / state / "export.json.gz").read_bytes()))


def row_counts(path: Path) -> dict[str, int]:
    """Rows of every ordinary table of a store file, read without the application."""
    conn = sqlite3.connect(path)
    try:
        names = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table' AND sql "
                                            "NOT LIKE 'CREATE VIRTUAL%' AND name NOT LIKE 'sqlite_%'")]
        names = [n for n in names if not n.startswith(("docs_fts_", "docs_vec_"))]
        return {n: conn.execute(f'SELECT count(*) FROM "{n}"').fetchone()[0] for n in names}
    finally:
        conn.close()


def open_app(settings, embedder, clock) -> tuple[Any, Api]:
    svc = build_services(settings, embedder=embedder, clock=clock)
    return svc, Api(create_app(settings, services=svc).test_client())


def check_items(api: Api, m: dict[str, Any]) -> None:
    """Every item the old version wrote is there, as it answered it; and it is found by search."""
    characters = expect_ok(api.get("/v1/characters"), 200)["characters"]
    assert {c["id"]: c["name"] for c in characters} == m["characters"]
    sheet = expect_ok(api.get("/v1/characters/mira.png"), 200)["character"]["sheet"]
    assert sheet["secrets"][0]["text"] == "Mira carries the stolen ledger of Kelmar."
    chat = expect_ok(api.get(f"/v1/chats/{m['chat']}"), 200)["chat"]
    assert sorted(chat["member_ids"]) == ["mira.png", "oren.png"]
    memories = expect_ok(api.get("/v1/memories"), 200)["memories"]
    assert sorted((x["id"], x["text"], x["pinned"], x.get("character_id")) for x in memories) == \
        sorted((x["id"], x["text"], x["pinned"], x["character_id"]) for x in m["memories"])
    got = expect_ok(api.get(f"/v1/chats/{m['chat']}/messages"), 200)["messages"]
    assert [[x["id"], x["text"]] for x in got] == m["messages"]
    lore = expect_ok(api.get("/v1/lore"), 200)["lore"]
    assert sorted((x["id"], x["title"], x["text"]) for x in lore) == \
        sorted((x["id"], x["title"], x["text"]) for x in m["lore"])
    notes = expect_ok(api.get(f"/v1/chats/{m['chat']}/notes"), 200)["notes"] if m["notes"] else []
    assert sorted((x["id"], x["text"]) for x in notes) == sorted((x["id"], x["text"]) for x in m["notes"])
    for memory in m["memories"]:  # the search index came through (or was rebuilt) whole
        found = expect_ok(api.post("/v1/search", json={"query": memory["text"], "k": 5}), 200)["results"]
        assert memory["id"] in [r["id"] for r in found]


def test_every_shipped_state_has_a_fixture():
    """The states of the main line are all here (m004 shipped before m003), the current one too."""
    assert {"m1", "m1-2", "m1-2-4", "m1-2-3-4", "m1-2-3-4-5"} <= set(STATES)
    assert "m" + "-".join(str(n) for n in sorted(migrations.known())) in STATES
    assert {"m1-2", "m1-2-4", "m1-2-3-4", "m1-2-3-4-5"} <= set(EXPORTS)  # export from m1-2 on


@pytest.mark.parametrize("state", STATES)
def test_an_old_store_opens_and_migrates_with_nothing_lost(state, settings, embedder, clock):
    m = manifest(state)
    settings.data_path.mkdir(parents=True, exist_ok=True)
    path = settings.data_path / settings.db_file
    path.write_bytes(gzip.decompress((FIXTURES / state / "store.sqlite3.gz").read_bytes()))
    before = row_counts(path)
    assert sorted(json.loads(json.dumps(m["migrations"]))) == [int(n) for n in state[1:].split("-")]
    svc, api = open_app(settings, embedder, clock)
    try:
        assert migrations.applied(svc.db) == sorted(migrations.known())
        after = row_counts(path)
        for table, n in before.items():  # no table lost, no row lost
            assert after[table] == n if table in ITEM_TABLES else after[table] >= n, table
        check_items(api, m)
    finally:
        svc.db.close()


@pytest.mark.parametrize("state", EXPORTS)
def test_an_old_export_imports_upgraded(state, api, services):
    m = manifest(state)
    result = expect_ok(api.post("/v1/import", json={"document": document(state)}), 200, "import.response")
    if m["migrations"] == sorted(migrations.known()):
        assert "upgraded_from" not in result
    else:
        assert result["upgraded_from"] == m["migrations"]
    assert all(result["imported"].get(t, 0) == n for t, n in
               [("memories", len(m["memories"])), ("messages", len(m["messages"])), ("lore", len(m["lore"]))])
    check_items(api, m)
    # What the upgraded store exports is this version's document: it imports as it is.
    again = expect_ok(api.get("/v1/export"), 200, "export.document")
    assert again["migrations"] == sorted(migrations.known())


def test_the_upgrade_matches_migrating_the_store(settings, embedder, clock, tmp_path):
    """An old document upgraded gives the rows the old store gives once opened and migrated."""
    state = EXPORTS[0]
    settings.data_path.mkdir(parents=True, exist_ok=True)
    path = settings.data_path / settings.db_file
    path.write_bytes(gzip.decompress((FIXTURES / state / "store.sqlite3.gz").read_bytes()))
    svc, _ = open_app(settings, embedder, clock)
    try:
        migrated = portable.export_store(svc.db)
    finally:
        svc.db.close()
    upgraded = portable.upgrade(document(state), finish=None)
    for name in ITEM_TABLES:
        assert upgraded["tables"][name] == migrated["tables"][name], name


def test_a_newer_export_is_refused_and_says_it_is_newer(api, services):
    newest = document(EXPORTS[-1])
    newer = {**newest, "migrations": newest["migrations"] + [max(migrations.known()) + 1]}
    body = expect_error(api.post("/v1/import", json={"document": newer}), 409, "migrations_mismatch")
    message = body["error"]["message"]
    assert "export is newer than this Chronicler" in message and str(max(migrations.known()) + 1) in message
    assert expect_ok(api.get("/v1/memories"), 200)["memories"] == []


def test_the_cli_imports_an_old_export(tmp_path, capsys):
    from server_plugin import cli

    state = EXPORTS[0]
    shutil.copyfileobj(gzip.open(FIXTURES / state / "export.json.gz"), open(tmp_path / "old.json", "wb"))
    assert cli.main(["import", str(tmp_path / "old.json"), "--data-dir", str(tmp_path / "data")]) == 0
    assert "3 memories" in capsys.readouterr().out
