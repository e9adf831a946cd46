"""A store exported without its vectors and imported whole (rule OP8 at a campaign's scale):
`GET /v1/export?vectors=false`, `chronicler export --no-vectors`, and `POST /v1/import` of such a
document, whose rows get placeholder vectors that the background re-embed (retrieval/reembed.py,
the move an embedder change makes) replaces, with its progress in health and search answering
meanwhile. The whole-store import has its own body limit (max_store_import_bytes), read through a
spooled file with its nesting measured on the way.
"""

from __future__ import annotations

import copy
import gzip
import io
import json
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from server_plugin.api.security import DepthMeter, json_depth
from server_plugin.app import build_services, create_app
from server_plugin.cli import main
from server_plugin.clock import FakeClock
from server_plugin.errors import Unprocessable
from server_plugin.retrieval import docs as index
from server_plugin.retrieval import embedders, live_index, reembed
from server_plugin.settings import load_settings
from server_plugin.store import portable
from tests.helpers.api import T0, TOKEN, Api, expect_error, expect_ok
from tests.helpers.ledger import store_problems
from tests.helpers.world import TOWN, character, chat

MINILM = "minilm:all-MiniLM-L6-v2"
LINES = [*TOWN,
         # Long enough for passage vectors: the placeholders have none, the rebuild makes them.
         " ".join(["Ayla told the whole story of the shipwreck that night, how the storm came from the"
                   " north, how the mast split, how the lighthouse keeper rowed out alone."] * 4)]
# Said in other words: only the dense channel finds these (the words are not the messages').
PARAPHRASES = {"Which tradesman needs his tool repaired?": None,
               "What did the royal girl grow near her home?": None,
               "Who charges money for a boat trip?": None}


def setup_store(api: Api) -> None:
    character(api, "kai", "Kai")
    character(api, "ayla", "Ayla")
    chat(api, "c", ["kai", "ayla"])
    body = [{"id": f"m{i}", "role": "user", "name": "Kai", "speaker_id": "kai", "text": t}
            for i, t in enumerate(LINES)]
    expect_ok(api.post("/v1/chats/c/messages", json={"messages": body}), 200)
    expect_ok(api.post("/v1/memories", json={"text": "Kai owes Ayla three silver.", "scope": "global",
                                             "pinned": True, "actor": "user"}), 201)


def search(api: Api, query: str, k: int = 3) -> list[str]:
    found = expect_ok(api.post("/v1/search", json={"query": query, "chat_id": "c", "kinds": ["message"],
                                                   "k": k}), 200, "search.response")["results"]
    return [r["id"] for r in found]


def health(api: Api) -> dict[str, Any]:
    return expect_ok(api.get("/v1/health"), 200, "health.response")


def export(api: Api, vectors: bool = True) -> dict[str, Any]:
    response = api.get("/v1/export" + ("" if vectors else "?vectors=false"))
    document = expect_ok(response, 200, "export.document")
    assert response.data == portable.canonical(document)  # canonical, as with vectors
    return document


def open_store(tmp_path: Path, embedder: Any, name: str, **extra: Any) -> tuple[Any, Api]:
    """Another store (own data folder) with its own app, as a second installation would have."""
    settings = load_settings({"data_dir": str(tmp_path / name), "token": TOKEN, "sqlite_synchronous": "NORMAL",
                              "worker_enabled": False, **extra}, environ={})
    svc = build_services(settings, embedder=embedder, clock=FakeClock(T0))
    return svc, Api(create_app(settings, services=svc).test_client())


def rows_of(document: dict[str, Any], name: str) -> list[list[Any]]:
    return document["tables"][name]["rows"]


def vector_tables(svc: Any) -> set[str]:
    with svc.db.read() as conn:
        return {t.name for t in portable.tables(conn) if t.vectors}


@pytest.fixture
def source(api, services):
    """A store with messages (one with passages), a memory, and its answers to paraphrases."""
    setup_store(api)
    answers = {q: search(api, q) for q in PARAPHRASES}
    return {"api": api, "svc": services, "answers": answers, "full": export(api),
            "bare": export(api, vectors=False)}


# --- the export --------------------------------------------------------------------------------
def test_op8_the_export_without_vectors_is_the_same_document_but_the_vectors(source):
    full, bare = source["full"], source["bare"]
    assert bare["vectors"] is False and "vectors" not in full
    assert vector_tables(source["svc"]) == {"docs_vec", "docs_passages", "reembed_vectors"}
    assert rows_of(full, "docs_vec") and rows_of(full, "docs_passages")
    for name, table in full["tables"].items():
        expected = [] if name in ("docs_vec", "docs_passages", "reembed_vectors") else table["rows"]
        assert bare["tables"][name] == {"columns": table["columns"], "rows": expected}, name
    assert {k: v for k, v in bare.items() if k != "vectors"} != full
    # Streamed in chunks, it is the canonical bytes of the document made whole.
    chunks = b"".join(portable.export_chunks(source["svc"].db, rows_per_chunk=2, vectors=False))
    assert chunks == portable.canonical(portable.export_store(source["svc"].db, vectors=False)) \
        == portable.canonical(bare)
    assert len(portable.canonical(bare)) * 3 < len(portable.canonical(full))


def test_op8_the_export_query_is_typed_and_refused_in_the_envelope(api):
    for bad in ("?vectors=maybe", "?vectors=false&vectors=true", "?vector=false"):
        expect_error(api.get("/v1/export" + bad), 400, "invalid_request")
    response = api.get("/v1/export?vectors=false")
    assert "no-vectors" in response.headers["Content-Disposition"]


# --- the import and the rebuild ----------------------------------------------------------------
def test_op8_a_store_imported_without_vectors_is_searched_meanwhile_and_rebuilt_in_the_background(
        source, tmp_path, embedder, monkeypatch):
    """The rows get placeholders (BM25 answers), health shows the move to the settings' model with
    its progress, and after it every vector is what the source store had: search finds the same
    messages as there, by meaning too."""
    monkeypatch.setattr(reembed, "_loop", lambda ref: None)  # the passes run by hand below
    svc, api = open_store(tmp_path, embedder, "b")
    try:
        result = expect_ok(api.post("/v1/import", json={"document": source["bare"]}), 200, "import.response")
        total = len(rows_of(source["full"], "docs"))
        assert result["vectors_pending"] == total and result["imported"]["docs_vec"] == 0
        placeholder = embedders.placeholder_key(384)
        state = health(api)
        assert "export_without_vectors" in state["capabilities"]
        assert state["reembed"] == {"model": MINILM, "from": placeholder, "done": 0, "total": 0, "error": None}
        assert state["embedder"]["key"] == placeholder and state["embedder"]["ready"]
        conn = svc.db.reader()
        assert index.model(conn) == (placeholder, 384)
        assert not any(np.any(v) for v in index.item_vectors(conn, None).values())
        assert index.passage_vectors(conn, None) == {}
        assert index.orphans(conn) == dict.fromkeys(index.orphans(conn), 0)
        assert store_problems(Path(svc.db.path)) == []
        # Search answers meanwhile, from the words alone; writes go on.
        assert search(api, "ferryman silver coins river")[0] == "m6"
        expect_ok(api.post("/v1/chats/c/messages", json={"messages": [
            {"id": "late", "role": "user", "name": "Kai", "speaker_id": "kai",
             "text": "The miller's daughter found a silver key under the bridge."}]}), 200)

        assert reembed.run(svc, limit=4) is False  # part of the way
        moving = health(api)["reembed"]
        assert (moving["model"], moving["done"], moving["total"]) == (MINILM, 4, total + 1)
        assert reembed.run(svc) is True  # the rest, the late row too, then the switch
        state = health(api)
        assert state["reembed"] is None and state["embedder"]["key"] == MINILM == svc.embedder.key

        conn = svc.db.reader()
        assert index.model(conn) == (MINILM, 384)
        assert index.orphans(conn) == dict.fromkeys(index.orphans(conn), 0)
        assert conn.execute("SELECT count(*) FROM reembed_vectors").fetchone()[0] == 0
        # Every row has the vector (and passages) the source store had for it.
        before = {r[0]: r for r in source["svc"].db.reader().execute("SELECT id, passages FROM docs")}
        source_vectors = index.item_vectors(source["svc"].db.reader(), None)
        after = index.item_vectors(conn, None)
        for doc_id, vector in source_vectors.items():
            assert float(np.dot(vector, after[doc_id])) > 0.999, doc_id
        passages = {r[0]: r[1] for r in conn.execute("SELECT id, passages FROM docs")}
        assert {d: passages[d] for d in before} == {d: r[1] for d, r in before.items()}
        assert any(passages.values())
        for query, answer in source["answers"].items():
            assert search(api, query) == answer, query
        assert search(api, "Which tradesman needs his tool repaired?")[0] == "m0"
        assert search(api, "a key found beneath a bridge")[0] == "late"
        live = live_index.state_of(svc).live
        assert live is not None and live.n - live.dead == total + 1
    finally:
        svc.db.close()


def test_op8_the_background_thread_rebuilds_a_vectorless_import_by_itself(source, tmp_path, embedder):
    svc, api = open_store(tmp_path, embedder, "b")
    try:
        expect_ok(api.post("/v1/import", json={"document": source["bare"]}), 200, "import.response")
        deadline_checks = 0
        while health(api)["reembed"] is not None:  # the thread of the embedder-change move
            deadline_checks += 1
            assert deadline_checks < 6000, "the rebuild never finished"
            reembed.move_of(svc).stopping.wait(0.05)
        assert svc.embedder.key == MINILM
        for query, answer in source["answers"].items():
            assert search(api, query) == answer, query
    finally:
        svc.db.close()


def test_op8_a_store_reopened_mid_rebuild_goes_on_where_it_was(source, tmp_path, embedder, monkeypatch):
    monkeypatch.setattr(reembed, "_loop", lambda ref: None)
    svc, api = open_store(tmp_path, embedder, "b")
    try:
        expect_ok(api.post("/v1/import", json={"document": source["bare"]}), 200)
        reembed.run(svc, limit=3)
    finally:
        svc.db.close()
    svc, api = open_store(tmp_path, embedder, "b")  # reopened: still placeholders, the move resumes
    try:
        assert svc.embedder.key == embedders.placeholder_key(384)
        assert health(api)["reembed"]["model"] == MINILM
        assert svc.db.reader().execute("SELECT count(*) FROM reembed_vectors").fetchone()[0] == 3
        assert reembed.run(svc) is True
        for query, answer in source["answers"].items():
            assert search(api, query) == answer, query
    finally:
        svc.db.close()


def test_op8_an_older_document_without_vectors_is_upgraded_and_rebuilt(api, services, monkeypatch):
    """A document of an older version, its vectors left out, is upgraded by the migrations (its
    "vectors": false kept through the scratch store) and then rebuilt like any other."""
    monkeypatch.setattr(reembed, "_loop", lambda ref: None)
    fixtures = Path(__file__).parent / "fixtures" / "upgrade" / "m1-2-3-4-5-6-7-8-9-10"
    old = json.loads(gzip.decompress((fixtures / "export.json.gz").read_bytes()))
    manifest = json.loads((fixtures / "manifest.json").read_text())
    for name in ("docs_vec", "docs_passages"):
        old["tables"][name]["rows"] = []
    old["vectors"] = False
    result = expect_ok(api.post("/v1/import", json={"document": old}), 200, "import.response")
    assert result["upgraded_from"] == manifest["migrations"]
    assert result["vectors_pending"] == len(old["tables"]["docs"]["rows"]) > 0
    assert health(api)["reembed"]["from"] == embedders.placeholder_key(384)
    assert reembed.run(services) is True
    conn = services.db.reader()
    assert index.model(conn) == (MINILM, 384) and all(np.any(v) for v in index.item_vectors(conn, None).values())
    assert index.orphans(conn) == dict.fromkeys(index.orphans(conn), 0)
    message_id, text = manifest["messages"][0]
    found = expect_ok(api.post("/v1/search", json={"query": text, "k": 3}), 200, "search.response")["results"]
    assert message_id in [r["id"] for r in found]


# --- refusals ----------------------------------------------------------------------------------
def _still_empty(svc: Any) -> None:
    with svc.db.read() as conn:
        assert portable.data_counts(conn, portable.tables(conn), portable.seeded_tables(
            tuple(r[0] for r in conn.execute("SELECT number FROM schema_migrations ORDER BY number")))) == {}


def test_op8_documents_that_lie_about_their_vectors_are_refused_and_change_nothing(source, tmp_path, embedder):
    svc, api = open_store(tmp_path, embedder, "b")
    try:
        # Claims its vectors (no "vectors": false) but has none: the index is not whole.
        missing = copy.deepcopy(source["bare"])
        del missing["vectors"]
        error = expect_error(api.post("/v1/import", json={"document": missing}), 422, "invalid_import")
        assert '"vectors": false' in error["error"]["message"]
        assert error["error"]["details"][0]["docs_without_vec"] == len(rows_of(source["full"], "docs"))
        # Says it has none but holds some.
        holding = copy.deepcopy(source["bare"])
        holding["tables"]["docs_vec"]["rows"] = rows_of(source["full"], "docs_vec")
        error = expect_error(api.post("/v1/import", json={"document": holding}), 422, "invalid_import")
        assert error["error"]["details"][0]["path"] == "/tables/docs_vec/rows"
        # Some of the vectors only: the index is not whole either.
        partial = copy.deepcopy(source["full"])
        partial["tables"]["docs_vec"]["rows"] = rows_of(source["full"], "docs_vec")[:3]
        expect_error(api.post("/v1/import", json={"document": partial}), 422, "invalid_import")
        # Not a boolean: the schema refuses it over HTTP, the check anywhere else.
        odd = {**source["bare"], "vectors": "no"}
        expect_error(api.post("/v1/import", json={"document": odd}), 400, "invalid_request")
        with pytest.raises(Unprocessable) as refused:
            portable.import_store(svc.db, odd, placeholders=reembed.without_vectors)
        assert refused.value.code == "invalid_import"
        # A caller that cannot make placeholders (no `placeholders`) refuses before writing.
        with pytest.raises(Unprocessable):
            portable.import_store(svc.db, source["bare"])
        _still_empty(svc)
        assert health(api)["reembed"] is None
        # ...and the same document, told the truth, imports.
        expect_ok(api.post("/v1/import", json={"document": source["bare"]}), 200, "import.response")
    finally:
        svc.db.close()


def test_op8_a_vectorless_document_replaces_a_store_of_another_size(source, tmp_path, embedder, monkeypatch):
    """The importing store's vector tables may be of another size than the document's model (a
    store once on another embedder): they are made anew for the placeholders."""
    monkeypatch.setattr(reembed, "_loop", lambda ref: None)
    svc, api = open_store(tmp_path, embedder, "b")
    try:
        with svc.db.write() as conn:
            index.install_vectors(conn, "openai:http://x#y", 256, {})
        expect_ok(api.post("/v1/import", json={"document": source["bare"], "mode": "replace",
                                               "confirm_replace": True}), 200)
        assert index.model(svc.db.reader()) == (embedders.placeholder_key(384), 384)
        assert reembed.run(svc) is True
        assert search(api, "Which tradesman needs his tool repaired?")[0] == "m0"
    finally:
        svc.db.close()


# --- the body limit ----------------------------------------------------------------------------
def test_op8_the_store_import_has_its_own_limit_and_the_cards_keep_theirs(source, tmp_path, embedder):
    size = len(json.dumps({"document": source["bare"]}))
    svc, api = open_store(tmp_path, embedder, "b", max_store_import_bytes=size - 100,
                          max_import_bytes=size * 4)
    try:
        assert health(api)["limits"]["max_store_import_bytes"] == size - 100
        error = expect_error(api.post("/v1/import", json={"document": source["bare"]}), 413, "payload_too_large")
        assert error["error"]["details"] == [{"max_bytes": size - 100}]
        # Sent without a length (chunked), it is counted as it is read.
        raw = json.dumps({"document": source["bare"]}).encode()
        chunked = api.raw.post("/v1/import", input_stream=io.BytesIO(raw), headers={
            "Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json",
            "Transfer-Encoding": "chunked"}, environ_overrides={"wsgi.input_terminated": True})
        expect_error(chunked, 413, "payload_too_large")
        _still_empty(svc)
    finally:
        svc.db.close()
    svc, api = open_store(tmp_path, embedder, "c", max_import_bytes=4096)
    try:
        assert health(api)["limits"]["max_store_import_bytes"] == 512 * 1024 * 1024
        expect_ok(api.post("/v1/import", json={"document": source["bare"]}), 200)
        card = {"entries": {str(i): {"uid": i, "key": ["x"], "content": "y" * 100} for i in range(60)}}
        expect_error(api.post("/v1/lore/import", json={"world_info": card}), 413, "payload_too_large")
    finally:
        svc.db.close()


def test_op8_the_spooled_store_import_still_refuses_deep_bad_and_untyped_bodies(api):
    deep = "null"
    for _ in range(40):
        deep = f"[{deep}]"
    headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    expect_error(api.raw.post("/v1/import", data=f'{{"document": {deep}}}', headers=headers), 400, "too_deep")
    expect_error(api.raw.post("/v1/import", data='{"document": [1,]}', headers=headers), 400, "invalid_json")
    expect_error(api.raw.post("/v1/import", data=b'{"document": "\xff"}', headers=headers), 400, "invalid_json")
    expect_error(api.raw.post("/v1/import", data='{"document": "\\ud800"}', headers=headers), 400, "invalid_json")
    expect_error(api.raw.post("/v1/import", data='{"a": 1, "a": 2}', headers=headers), 400, "invalid_json")
    expect_error(api.raw.post("/v1/import", data="{}", headers={**headers, "Content-Type": "text/plain"}),
                 415, "unsupported_media_type")
    expect_error(api.raw.post("/v1/import", headers=headers), 400, "invalid_request")  # no body: no document


def test_op8_the_depth_measured_in_chunks_is_the_depth_of_the_whole_body():
    rng = random.Random(7)

    def value(depth: int) -> Any:
        pick = rng.random()
        if depth > 7 or pick < 0.3:
            return rng.choice(['a"b\\', "[]{}", "x\\\\", '\\"[', "plain", "é中", "\\u0041{"])
        if pick < 0.65:
            return [value(depth + 1) for _ in range(rng.randint(0, 3))]
        return {f"{i}[{{\\": value(depth + 1) for i in range(rng.randint(0, 3))}

    for _ in range(500):
        raw = json.dumps(value(0), ensure_ascii=rng.random() < 0.5).encode()
        meter, at = DepthMeter(), 0
        while at < len(raw):
            step = rng.randint(1, 9)
            meter.feed(raw[at:at + step])
            at += step
        assert meter.deepest == json_depth(raw), raw


# --- the command line --------------------------------------------------------------------------
def test_op8_cli_export_no_vectors_and_its_import_offline(source, settings, tmp_path, embedder, capsys,
                                                            monkeypatch):
    out = tmp_path / "bare.json"
    source["svc"].db.close()  # the sidecar is stopped
    assert main(["export", "--data-dir", str(settings.data_path), "--out", str(out), "--no-vectors"]) == 0
    said = capsys.readouterr().out
    assert "without vectors" in said and "docs_vec" not in said and " docs," in said
    document = json.loads(out.read_text(encoding="utf-8"))
    assert document == source["bare"] and out.read_bytes() == portable.canonical(source["bare"])
    other = tmp_path / "other"
    assert main(["import", str(out), "--data-dir", str(other)]) == 0
    assert "embedded in the background" in capsys.readouterr().out
    monkeypatch.setattr(reembed, "_loop", lambda ref: None)
    svc, api = open_store(tmp_path, embedder, "other")  # the sidecar starts: the move begins
    try:
        assert health(api)["reembed"]["from"] == embedders.placeholder_key(384)
        assert reembed.run(svc) is True
        for query, answer in source["answers"].items():
            assert search(api, query) == answer, query
    finally:
        svc.db.close()
