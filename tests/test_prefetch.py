"""POST /v1/context/prefetch: the next turn's query vector embedded ahead (rule OP10): the context
call then embeds nothing for it, and is the same answer as without the prefetch."""

from __future__ import annotations

import threading
import time

from tests.helpers.api import expect_error, expect_ok
from tests.helpers.world import character, chat

ACTION = "I ask Mira whether the ledger of Kelmar was ever found after the flood."


def setup_chat(api) -> str:
    character(api, "mira.png", "Mira")
    chat(api, "solo", ["mira.png"])
    expect_ok(api.post("/v1/memories", json={"text": "The ledger of Kelmar was lost in the flood.",
                                             "scope": "global", "actor": "user"}), 201)
    return "solo"


def context_body(chat_id: str, text: str) -> dict:
    return {"chat_id": chat_id, "speaker_id": "mira.png", "context_tokens": 4096,
            "last_action": {"text": text}}


def wait_encoded(services, n: int, limit: float = 30) -> None:
    deadline = time.monotonic() + limit
    while services.embedder.encoded < n and time.monotonic() < deadline:
        time.sleep(0.01)


def test_a_prefetched_action_is_not_embedded_again_by_the_context_call(api, services):
    chat_id = setup_chat(api)
    plain = expect_ok(api.post("/v1/context", json=context_body(chat_id, ACTION + " (plain)")), 200)
    before = services.embedder.encoded
    out = expect_ok(api.post("/v1/context/prefetch", json={"chat_id": chat_id, "text": ACTION}), 202,
                    "context_prefetch.response")
    assert out == {"started": True}
    wait_encoded(services, before + 1)
    assert services.embedder.encoded == before + 1
    got = expect_ok(api.post("/v1/context", json=context_body(chat_id, ACTION)), 200)
    assert services.embedder.encoded == before + 1  # the vector was there: nothing embedded
    bank = [i["id"] for i in got["report"]["sections"]["memory_bank"]["included"]]
    assert bank == [i["id"] for i in plain["report"]["sections"]["memory_bank"]["included"]]


def test_without_a_prefetch_the_context_call_embeds_its_action(api, services):
    chat_id = setup_chat(api)
    before = services.embedder.encoded  # (the model is shared by the tests: a text of its own)
    expect_ok(api.post("/v1/context", json=context_body(chat_id, ACTION + " (never prefetched)")), 200)
    assert services.embedder.encoded == before + 1


def test_two_askers_of_one_text_embed_it_once(services):
    """A context call arriving while its prefetch is being embedded waits for that vector."""
    texts = [ACTION + " (asked four times at once)"] * 4
    before = services.embedder.encoded
    vectors = [None] * len(texts)

    def ask(i: int) -> None:
        vectors[i] = services.embedder.embed_one(texts[i], 30)

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(texts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert services.embedder.encoded == before + 1
    assert all((v == vectors[0]).all() for v in vectors)


def test_health_lists_the_prefetch_so_the_extension_uses_it(api):
    """The extension sends prefetches only to a sidecar whose health lists `context_prefetch`."""
    health = expect_ok(api.get("/v1/health"), 200, "health.response")
    assert "context_prefetch" in health["capabilities"]


def test_a_bad_prefetch_is_refused(api):
    expect_error(api.post("/v1/context/prefetch", json={"text": ACTION}), 400, "invalid_request")
    out = expect_ok(api.post("/v1/context/prefetch", json={"chat_id": "solo", "text": "  "}), 202)
    assert out == {"started": False}


def test_the_query_is_embedded_beside_the_rest_of_the_search_and_ranks_the_same(api, services):
    """rule OP10: search starts its query's embedding on another thread and ranks BM25 and the
    priors meanwhile (a Future), or takes a prefetched vector at once (an array); either way the
    results are those of a vector computed before the call."""
    from concurrent.futures import Future

    from server_plugin.retrieval import search

    chat_id = setup_chat(api)
    query = "Was the ledger of Kelmar found after the flood? (beside)"
    ready = search.query_vector(services, query, chat_id)
    services.embedder._cache.clear()
    pending = search.query_vector_soon(services, query, chat_id)
    assert isinstance(pending, Future)
    assert search.search(services, query, chat_id=chat_id, vector=pending) == \
        search.search(services, query, chat_id=chat_id, vector=ready)
    again = search.query_vector_soon(services, query, chat_id)  # in the cache now: no thread
    assert not isinstance(again, Future) and (again == ready).all()


def test_an_embedding_that_fails_on_its_thread_fails_the_call_as_before(api, services, monkeypatch):
    """The embedding's error, raised on the helper thread, is the context call's: a 503 naming
    the model, nothing half-built."""
    from server_plugin.retrieval.embeddings import EmbedderNotReady

    chat_id = setup_chat(api)

    def broken(*args, **kwargs):
        raise EmbedderNotReady("the embedding model minilm failed: the endpoint is down")

    monkeypatch.setattr(services.embedder, "embed_one", broken)
    body = expect_error(api.post("/v1/context", json=context_body(chat_id, ACTION + " (broken)")), 503,
                        "embedder_not_ready")
    assert "endpoint is down" in body["error"]["message"]


def test_a_query_of_a_model_behind_the_network_is_not_awaited_under_the_index_lock(api, services, monkeypatch):
    """search waits for a query embedded out of process (or by a model still loading) before it
    takes the index's lock: the lock is free while the vector is on its way."""
    from server_plugin.retrieval import live_index, search

    chat_id = setup_chat(api)
    state = live_index.state_of(services)
    state.ensure_loaded(30)
    held: list[bool] = []
    real = services.embedder.embed_one

    def slow(*args, **kwargs):
        time.sleep(0.05)
        held.append(state.lock._lock.locked())
        return real(*args, **kwargs)

    monkeypatch.setattr(services.embedder, "embed_one", slow)
    monkeypatch.setattr(services.embedder, "in_process", False)
    assert search.search(services, "Was the ledger found? (over the network)", chat_id=chat_id)
    assert held == [False]
