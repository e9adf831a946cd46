"""Export and import of the whole store (rule OP8): `GET /v1/export`, `POST /v1/import`,
`chronicler export` / `chronicler import`.

The round trip is exact (export -> import into a fresh store -> export gives the same bytes), the
import checks the whole document first and writes it in one transaction or not at all, and a
failed import (a bad row in the middle, a full disk) leaves the store exactly as it was.
"""

from __future__ import annotations

import copy
import json
import os
import stat
from pathlib import Path
from typing import Any

import pytest

from server_plugin.app import build_services, create_app
from server_plugin.cli import lock_data_dir, main
from server_plugin.clock import FakeClock
from server_plugin.jobs import queue, worker
from server_plugin.settings import load_settings
from server_plugin.store import portable
from tests.helpers import conversation
from tests.helpers.api import T0, TOKEN, Api, expect_error, expect_ok
from tests.helpers.ledger import store_problems


# --- a store with something of everything ------------------------------------------------------
def fill_store(api: Api, services: Any) -> None:
    """Characters with sheets and secrets, a group chat and a solo chat, a transcript long enough
    for compaction and two sessions, summaries, memories (pinned, archived, known_by), notes,
    and jobs: done ones and pending ones."""
    expect_ok(api.put("/v1/characters/ayla.png", json={
        "name": "Ayla", "aliases": ["the healer"],
        "sheet": {"personality": "calm", "backstory": "raised by the lighthouse keeper",
                  "secrets": [{"text": "she sank the ship", "known_by": ["ayla.png"]}]}}), 201)
    expect_ok(api.put("/v1/characters/kai.png", json={"name": "Kai", "is_player": True}), 201)
    expect_ok(api.put("/v1/characters/brom.png", json={"name": "Brom", "learn_from_chat": False}), 201)
    conversation.setup_chat(api, "Seraphina - 2026-11-29@16h52m03s", ("ayla.png", "brom.png"),
                       characters=False, title="The harbour")
    conversation.setup_chat(api, "solo", ("ayla.png",), characters=False)
    group = "Seraphina - 2026-11-29@16h52m03s"
    conversation.turns(api, 0, 30, chat_id=group)
    conversation.drain(services)  # summaries, deep memory: done jobs with results
    conversation.turns(api, 30, 34, chat_id=group)
    conversation.post(api, conversation.turn_messages(40, minutes=60 * 8), chat_id=group)  # a gap: session 2
    conversation.turns(api, 0, 3, chat_id="solo")  # its jobs stay pending
    for i in range(4):
        expect_ok(api.post("/v1/memories", json={"text": f"Kai owes Brom {i + 1} silver.",
                                                 "scope": "character", "character_id": "brom.png",
                                                 "actor": "user"}), 201)
    expect_ok(api.post("/v1/memories", json={"text": "Kai's birthday is in spring.", "scope": "global",
                                             "pinned": True, "actor": "user"}), 201)
    expect_ok(api.post("/v1/memories", json={"text": "Ayla hid the map under the chapel.",
                                             "scope": "character", "character_id": "ayla.png",
                                             "actor": "model", "known_by": ["ayla.png"],
                                             "chat_id": group, "turn_id": "t3"}), 201)
    expect_ok(api.post("/v1/chats/solo/notes", json={"text": "Who lit lantern 7?", "priority": 4}), 201)
    assert queue.counts(services).get("pending", 0) > 0


def open_store(tmp_path: Path, embedder: Any, name: str, **extra: Any) -> tuple[Any, Api]:
    """Another store (own data folder) with its own app, as a second installation would have."""
    settings = load_settings({"data_dir": str(tmp_path / name), "token": TOKEN,
                              "sqlite_synchronous": "NORMAL", "worker_enabled": False, **extra},
                             environ={})
    svc = build_services(settings, embedder=embedder, clock=FakeClock(T0))
    return svc, Api(create_app(settings, services=svc).test_client())


def export(api: Api) -> dict[str, Any]:
    response = api.get("/v1/export")
    document = expect_ok(response, 200, "export.document")
    assert response.data == portable.canonical(document)  # served in canonical form
    return document


@pytest.fixture
def filled(api, services):
    fill_store(api, services)
    return export(api)


def _table(document: dict, name: str) -> list[dict]:
    t = document["tables"][name]
    return [dict(zip(t["columns"], row)) for row in t["rows"]]


# --- the round trip ----------------------------------------------------------------------------
def test_round_trip_is_byte_identical_and_complete(filled, tmp_path, embedder):
    """export -> import into a fresh store -> export: the same canonical bytes; every kind of
    row is there (messages, pinned/archived memories, sheets with secrets, members, summaries,
    sessions, notes, jobs, the index with its vectors)."""
    counts = {name: len(t["rows"]) for name, t in filled["tables"].items()}
    for name in ("characters", "chats", "chat_members", "messages", "memories", "summaries",
                 "sessions", "notes", "jobs", "docs", "docs_fts", "docs_vec"):
        assert counts[name] > 0, name
    assert any(m["pinned"] for m in _table(filled, "memories"))
    assert "she sank the ship" in _table(filled, "characters")[0]["sheet"]
    assert {j["state"] for j in _table(filled, "jobs")} >= {"done", "pending"}
    vector = _table(filled, "docs_vec")[0]["embedding"]
    assert set(vector) == {"base64"} and len(vector["base64"]) == 2048  # 384 float32, base64

    svc_b, api_b = open_store(tmp_path, embedder, "b")
    try:
        result = expect_ok(api_b.post("/v1/import", json={"document": filled}), 200, "import.response")
        assert result["imported"]["messages"] == counts["messages"] and result["replaced"] == {}
        again = export(api_b)
        assert portable.canonical(again) == portable.canonical(filled)
        assert store_problems(Path(svc_b.db.path)) == []
    finally:
        svc_b.db.close()


def test_the_streamed_export_is_the_canonical_document(filled, services):
    """The export is made in chunks (a few rows at a time here): joined, the canonical bytes."""
    chunks = list(portable.export_chunks(services.db, rows_per_chunk=2))
    assert len(chunks) > len(filled["tables"]) * 2
    assert b"".join(chunks) == portable.canonical(portable.export_store(services.db)) == portable.canonical(filled)


def test_archived_memories_survive_the_round_trip(api, services, tmp_path, embedder, overrides):
    """RV8's archive is data: an archived memory comes back archived."""
    svc_a, api_a = open_store(tmp_path, embedder, "quota", unpinned_per_scope=2)
    svc_b, api_b = open_store(tmp_path, embedder, "b")
    try:
        for i in range(3):
            expect_ok(api_a.post("/v1/memories", json={"text": f"Fact {i}", "scope": "global",
                                                       "actor": "user"}), 201)
        document = export(api_a)
        assert sum(m["archived"] for m in _table(document, "memories")) == 1
        expect_ok(api_b.post("/v1/import", json={"document": document}), 200, "import.response")
        archived = expect_ok(api_b.get("/v1/memories?archived=true"), 200)["memories"]
        assert len(archived) == 1
        assert portable.canonical(export(api_b)) == portable.canonical(document)
    finally:
        svc_a.db.close()
        svc_b.db.close()


def test_pending_jobs_resume_after_an_import(filled, tmp_path, embedder):
    """Jobs pending in the export run in the new store and write what they would have written."""
    svc_b, api_b = open_store(tmp_path, embedder, "b")
    try:
        expect_ok(api_b.post("/v1/import", json={"document": filled}), 200)
        pending = queue.counts(svc_b).get("pending", 0)
        assert pending > 0
        svc_b.clock.advance(hours=1)  # this store's clock started at T0; the jobs were due later
        assert worker.run_pending(svc_b) >= pending
        assert queue.counts(svc_b).get("pending", 0) == 0
        summaries = expect_ok(api_b.get("/v1/chats/Seraphina%20-%202026-11-29@16h52m03s/summaries"), 200)
        assert summaries["recent"] or summaries["consolidated"]
    finally:
        svc_b.db.close()


def test_imported_store_searches_and_serves_without_reembedding(filled, tmp_path, embedder):
    """The vectors come from the document: the imported store answers for-turn and lists at once."""
    svc_b, api_b = open_store(tmp_path, embedder, "b")
    try:
        expect_ok(api_b.post("/v1/import", json={"document": filled}), 200)
        got = expect_ok(api_b.get("/v1/memories/for-turn?chat_id=solo&speaker_id=ayla.png"), 200)
        assert any("birthday" in m["text"] for m in got["memories"])
        conn = svc_b.db.reader()
        assert conn.execute("SELECT count(*) FROM docs_vec").fetchone()[0] == len(filled["tables"]["docs"]["rows"])
    finally:
        svc_b.db.close()


# --- refusals: the store is left exactly as it was ---------------------------------------------
def test_import_into_a_non_empty_store_is_refused_and_says_how(filled, api):
    body = expect_error(api.post("/v1/import", json={"document": filled}), 409, "store_not_empty")
    assert "replace" in body["error"]["message"] and "merging" in body["error"]["message"]
    body = expect_error(api.post("/v1/import", json={"document": filled, "mode": "replace"}), 409,
                        "confirmation_required")
    assert portable.canonical(export(api)) == portable.canonical(filled)


def test_replace_with_confirmation_replaces_everything(filled, api, tmp_path, embedder):
    svc_b, api_b = open_store(tmp_path, embedder, "b")
    try:
        expect_ok(api_b.post("/v1/memories", json={"text": "Only in b.", "scope": "global",
                                                   "actor": "user"}), 201)
        other = export(api_b)
    finally:
        svc_b.db.close()
    result = expect_ok(api.post("/v1/import", json={"document": other, "mode": "replace",
                                                    "confirm_replace": True}), 200, "import.response")
    assert result["replaced"]["messages"] == len(filled["tables"]["messages"]["rows"])
    assert portable.canonical(export(api)) == portable.canonical(other)
    assert [m["text"] for m in expect_ok(api.get("/v1/memories"), 200)["memories"]] == ["Only in b."]


def test_migrations_and_format_version_must_match(filled, tmp_path, embedder):
    svc_b, api_b = open_store(tmp_path, embedder, "b")
    try:
        newer = {**filled, "migrations": filled["migrations"] + [999]}
        body = expect_error(api_b.post("/v1/import", json={"document": newer}), 409, "migrations_mismatch")
        assert "export is newer than this Chronicler" in body["error"]["message"]
        # Said to be older, but holding this version's tables: the upgrade checks it against the
        # schema of migration 1 and refuses it (real old documents: tests/test_upgrade.py).
        older = {**filled, "migrations": filled["migrations"][:1]}
        body = expect_error(api_b.post("/v1/import", json={"document": older}), 422, "invalid_import")
        assert "is not a table of this store" in json.dumps(body)
        # A version this sidecar does not read: the schema at the edge already says so.
        expect_error(api_b.post("/v1/import", json={"document": {**filled, "format_version": 2}}), 400,
                     "invalid_request")
        with pytest.raises(portable.Unprocessable, match="format version 2"):
            portable.import_store(svc_b.db, {**filled, "format_version": 2})
        assert export(api_b)["tables"]["messages"]["rows"] == []
    finally:
        svc_b.db.close()


def _broken(document: dict, table: str, row: int, column: str, value: Any) -> dict:
    bad = copy.deepcopy(document)
    columns = bad["tables"][table]["columns"]
    bad["tables"][table]["rows"][row][columns.index(column)] = value
    return bad


@pytest.mark.parametrize("table,column,value,words", [
    ("memories", "scope", "everyone", "refused"),            # a CHECK constraint, found by SQLite
    ("messages", "tokens", "many", "bad value"),             # wrong type, found before writing
    ("characters", "name", None, "bad value"),               # NOT NULL
    ("docs", "ref_id", "no-such-memory", "points at no"),    # a reference that leads nowhere
    ("docs_vec", "embedding", {"base64": "AAAA"}, "refused"),  # a vector of the wrong size
])
def test_a_bad_row_in_the_middle_changes_nothing(filled, api, table, column, value, words):
    """The replace is refused as a whole; the store is byte for byte what it was."""
    rows = filled["tables"][table]["rows"]
    middle = len(rows) // 2
    if table == "docs":  # a memory's doc, so the reference rule applies
        middle = next(i for i, r in enumerate(_table(filled, "docs")) if r["kind"] == "memory")
    bad = _broken(filled, table, middle, column, value)
    body = expect_error(api.post("/v1/import", json={"document": bad, "mode": "replace",
                                                     "confirm_replace": True}), 422, "invalid_import")
    assert f"/tables/{table}/rows/{middle}" in body["error"]["message"]
    assert words in body["error"]["message"]
    assert portable.canonical(export(api)) == portable.canonical(filled)


def test_unknown_tables_and_columns_are_named(filled, api):
    bad = copy.deepcopy(filled)
    bad["tables"]["spells"] = {"columns": ["id"], "rows": [["fireball"]]}
    bad["tables"]["chats"]["columns"][1] = "headline"
    del bad["tables"]["notes"]
    body = expect_error(api.post("/v1/import", json={"document": bad, "mode": "replace",
                                                     "confirm_replace": True}), 422, "invalid_import")
    paths = {d["path"] for d in body["error"]["details"]}
    assert {"/tables/spells", "/tables/chats/columns", "/tables/notes"} <= paths
    assert portable.canonical(export(api)) == portable.canonical(filled)


def test_a_full_disk_during_the_import_changes_nothing(filled, tmp_path, embedder):
    """SQLite's max_page_count stands in for a full disk (tests/test_disk_full.py does the real
    thing for ordinary writes): the import answers 507 and the store is as it was."""
    svc_b, api_b = open_store(tmp_path, embedder, "small")
    expect_ok(api_b.post("/v1/memories", json={"text": "Small store.", "scope": "global",
                                               "actor": "user"}), 201)
    before = export(api_b)
    pages = svc_b.db.reader().execute("PRAGMA page_count").fetchone()[0]
    svc_b.db.close()
    svc_b, api_b = open_store(tmp_path, embedder, "small", max_page_count=pages + 4)
    try:
        response = api_b.post("/v1/import", json={"document": filled, "mode": "replace",
                                                  "confirm_replace": True})
        expect_error(response, 507, "storage_full")
        assert portable.canonical(export(api_b)) == portable.canonical(before)
        assert store_problems(Path(svc_b.db.path)) == []
    finally:
        svc_b.db.close()


def test_the_store_import_takes_its_own_body_limit(filled, tmp_path, embedder):
    """The document may be far larger than an ordinary body or a card: POST /v1/import takes
    max_store_import_bytes, not max_body_bytes nor max_import_bytes (cards, World Info)."""
    size = len(json.dumps({"document": filled}))
    svc_b, api_b = open_store(tmp_path, embedder, "b", max_body_bytes=4096, max_import_bytes=4096,
                              max_store_import_bytes=size * 2)
    try:
        assert size > 4096
        expect_ok(api_b.post("/v1/import", json={"document": filled}), 200)
    finally:
        svc_b.db.close()
    svc_c, api_c = open_store(tmp_path, embedder, "c", max_store_import_bytes=4096)
    try:
        expect_error(api_c.post("/v1/import", json={"document": filled}), 413, "payload_too_large")
    finally:
        svc_c.db.close()


# --- the command line --------------------------------------------------------------------------
def test_cli_export_import_round_trip_offline(filled, services, settings, tmp_path, capsys):
    """`chronicler export` / `import` work on a stopped store, hold the lock, write privately."""
    out = tmp_path / "campaign.json"
    services.db.close()  # the sidecar is stopped
    assert main(["export", "--data-dir", str(settings.data_path), "--out", str(out)]) == 0
    assert stat.S_IMODE(os.stat(out).st_mode) == 0o600
    assert out.read_bytes() == portable.canonical(filled)
    target = tmp_path / "restored"
    assert main(["import", str(out), "--data-dir", str(target)]) == 0
    assert "messages" in capsys.readouterr().out
    assert main(["import", str(out), "--data-dir", str(target)]) == 1
    assert "already holds data" in capsys.readouterr().err
    assert main(["import", str(out), "--data-dir", str(target), "--replace"]) == 2
    assert main(["import", str(out), "--data-dir", str(target), "--replace", "--yes"]) == 0
    again = tmp_path / "again.json"
    assert main(["export", "--data-dir", str(target), "--out", str(again)]) == 0
    assert again.read_bytes() == out.read_bytes()


def test_cli_refuses_while_a_sidecar_holds_the_store(filled, settings, tmp_path, capsys):
    lock = lock_data_dir(settings.data_path)
    try:
        assert main(["export", "--data-dir", str(settings.data_path),
                     "--out", str(tmp_path / "x.json")]) == 3
        assert "already using" in capsys.readouterr().err
        assert not (tmp_path / "x.json").exists()
    finally:
        lock.close()


# --- SIGKILL while an import is being written --------------------------------------------------
def grown(document: dict, extra: int) -> dict:
    """The document with `extra` more global memories, each with its index entry and a vector."""
    import base64
    import struct

    big = copy.deepcopy(document)
    tables = big["tables"]

    def add(name: str, values: dict[str, Any]) -> None:
        tables[name]["rows"].append([values.get(c) for c in tables[name]["columns"]])

    next_doc = 1 + max((r[0] for r in tables["docs"]["rows"]), default=0)
    for n in range(extra):
        memory_id = f"m_import_{n:05d}"
        text = f"Imported fact {n}: the tower has {n} bells."
        add("memories", {"id": memory_id, "text": text, "scope": "global", "pinned": 0, "archived": 1,
                         "actor": "user", "source_message_ids": "[]", "created_at": "2026-03-01T12:00:00.000000Z",
                         "updated_at": "2026-03-01T12:00:00.000000Z", "version": 1})
        doc = next_doc + n
        add("docs", {"id": doc, "kind": "memory", "ref_id": memory_id, "text": text,
                     "created_at": "2026-03-01T12:00:00.000000Z"})
        add("docs_fts", {"rowid": doc, "text": text})
        vector = struct.pack("<384f", *([0.0] * (n % 384) + [1.0] + [0.0] * (383 - n % 384)))
        add("docs_vec", {"rowid": doc, "embedding": {"base64": base64.b64encode(vector).decode()}})
    for name in ("memories", "docs", "docs_fts", "docs_vec"):  # the export's order: by key
        tables[name]["rows"].sort(key=lambda r: r[0])
    return big


def test_sigkill_during_an_import_leaves_the_old_store_or_the_new_one(tmp_path):
    """The sidecar is killed (SIGKILL) at different moments while a 'replace' import of ~4,000
    rows is in flight; after each restart the store is exactly the old one or exactly the
    document, never a mix, and passes every check."""
    import threading
    import time

    import requests

    from tests.helpers.process import SidecarProcess

    side = SidecarProcess.create(tmp_path / "data")
    side.start()
    try:
        side.wait_ready()
        for i in range(3):
            assert side.request("POST", "/v1/memories", {"text": f"Old fact {i}.", "scope": "global",
                                                          "actor": "user"})[0] == 201
        before = requests.get(side.url + "/v1/export", headers={"Authorization": f"Bearer {side.token}"},
                              timeout=30).json()
        big = grown(before, 1000)
        body = json.dumps({"document": big, "mode": "replace", "confirm_replace": True})
        outcomes = []
        for delay in (0.2, 0.5, 0.8, 1.2, 1.6, 2.5):
            def send() -> None:
                try:
                    requests.post(side.url + "/v1/import", data=body, timeout=60, headers={
                        "Authorization": f"Bearer {side.token}", "Content-Type": "application/json"})
                except requests.RequestException:
                    pass  # the process was killed under it

            sender = threading.Thread(target=send)
            sender.start()
            time.sleep(delay)
            side.kill()
            sender.join(30)
            assert store_problems(side.db_path) == []
            side.start()
            current = requests.get(side.url + "/v1/export", timeout=30,
                                   headers={"Authorization": f"Bearer {side.token}"}).json()
            same_as = [name for name, doc in (("old", before), ("new", big))
                       if portable.canonical(current) == portable.canonical(doc)]
            assert len(same_as) == 1, f"after a kill at {delay}s the store is neither the old nor the new one"
            outcomes.append(same_as[0])
            if same_as == ["new"]:  # back to the old store for the next round
                status, _ = side.request("POST", "/v1/import", {"document": before, "mode": "replace",
                                                                "confirm_replace": True})
                assert status == 200
        print(f"kills during import: {len(outcomes)}, outcomes {outcomes}")
    finally:
        side.stop()


def test_the_export_file_is_opened_binary_where_windows_needs_it(tmp_path, monkeypatch):
    """Windows turns "\\n" into "\\r\\n" through a descriptor opened without O_BINARY, even under
    fdopen("wb"): the export file (`chronicler export`, portable.write_file) is opened with it.
    Faked: O_BINARY = 0x8000 (its Windows value, harmless on Linux)."""
    flags_seen: list[int] = []
    real_open = os.open

    def fake_open(path, flags, *rest):
        flags_seen.append(flags)
        return real_open(path, flags, *rest)

    monkeypatch.setattr(os, "O_BINARY", 0x8000, raising=False)
    monkeypatch.setattr(os, "open", fake_open)
    document = {"format": "chronicler-export", "text": "line one\nline two\r\n"}
    size = portable.write_file(document, tmp_path / "export.json")
    monkeypatch.undo()
    assert flags_seen and all(flags & 0x8000 for flags in flags_seen), flags_seen
    written = (tmp_path / "export.json").read_bytes()
    assert written == portable.canonical(document) and size == len(written)
