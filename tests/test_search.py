"""Search through the real store (SW6) and who may find what (SW9b): POST /v1/search, the in-memory
index kept current by revisions, visibility, kinds and chats, deletes, restarts, renamed names."""

from __future__ import annotations

import threading
import time
from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from server_plugin.app import build_services, open_store
from server_plugin.jobs import worker
from server_plugin.retrieval import docs as index
from server_plugin.retrieval import columns, live_index, ranking, search
from server_plugin.settings import SEARCH, defaults, load_settings
from server_plugin.store import migrations
from tests.helpers.api import expect_error, expect_ok
from tests.helpers.world import character, chat

A, B, C = "ayla", "bren", "cato"


@pytest.fixture
def quiet(api, services):
    """The API with the search thread stopped once the index is built: the background passes
    (catch-up after commits, rebuilds, re-embedding) then run only when a test calls them."""
    state = live_index.state_of(services)
    assert state.ready.wait(30)
    live_index.stop(services)
    return api


def setup_cast(api) -> None:
    for cid, name in ((A, "Ayla"), (B, "Bren"), (C, "Cato"), ("kai", "Kai")):
        character(api, cid, name)


def say(api, chat_id: str, messages: list[tuple[str, str, str]], **extra: Any) -> None:
    """messages: (id, speaker id, text); the speaker's name is its id capitalised."""
    body = [{"id": mid, "role": "user" if who == "kai" else "assistant", "name": who.capitalize(),
             "text": text, "speaker_id": who, **extra} for mid, who, text in messages]
    expect_ok(api.post(f"/v1/chats/{chat_id}/messages", json={"messages": body}), 200)


def memory(api, text: str, **fields: Any) -> dict:
    data = {"text": text, "scope": "global", "actor": "user", **fields}
    return expect_ok(api.post("/v1/memories", json=data), 201)["memory"]


def find(api, query: str, **body: Any) -> list[dict]:
    out = expect_ok(api.post("/v1/search", json={"query": query, **body}), 200, "search.response")
    return out["results"]


def ids(results: list[dict]) -> list[str]:
    return [r["id"] for r in results]


def no_orphans(services) -> None:
    counts = index.orphans(services.db.reader())
    assert counts == dict.fromkeys(counts, 0), counts


# --- visibility (SW9b) ------------------------------------------------------------------------------
def test_sw9b_memory_witnessed_by_two_is_found_by_them_not_by_a_third_until_told(api, services):
    """rule SW9b: a memory known by A and B is found by A's and B's search, not by C's; once C is
    told (known_by gains C, the path a "told" event takes), C finds it; a person always does."""
    setup_cast(api)
    secret = memory(api, "The silver key is hidden under the chapel floorboard.", known_by=[A, B])
    memory(api, "The harbour master sells fish on Tuesdays.")
    query = "where is the silver key hidden?"
    assert ids(find(api, query, viewer_id=A))[0] == secret["id"]
    assert ids(find(api, query, viewer_id=B))[0] == secret["id"]
    assert secret["id"] not in ids(find(api, query, viewer_id=C))
    assert secret["id"] in ids(find(api, query))  # a person
    expect_ok(api.patch(f"/v1/memories/{secret['id']}", json={"actor": "user", "known_by": [A, B, C]}), 200)
    assert ids(find(api, query, viewer_id=C))[0] == secret["id"]


def test_sw9b_told_event_through_update_meta_reaches_search(api, services):
    """rule SW9b: index.update_meta(known_by=…) — what extraction calls for "X told Y" — widens
    what search lets the told character find, without re-embedding."""
    setup_cast(api)
    chat(api, "ca", [A])
    say(api, "ca", [("m1", "kai", "Ayla, the smuggler's boat leaves at midnight from the north pier.")])
    query = "when does the smuggler's boat leave?"
    assert find(api, query, viewer_id=B) == []
    seq = services.db.reader().execute("SELECT seq FROM messages WHERE id='m1'").fetchone()[0]
    with services.db.write() as conn:
        index.update_meta(conn, "message", str(seq), known_by=[A, "kai", B])
    assert ids(find(api, query, viewer_id=B)) == ["m1"]


def test_sw9b_a_message_said_in_aylas_chat_is_not_found_by_bren(api):
    """rule SW9b: one store, two chats: what the player told Ayla in her chat is not found by
    Bren's search (Bren did not witness it); Ayla and the player find it; a person sees all."""
    setup_cast(api)
    chat(api, "ca", [A])
    chat(api, "cb", [B])
    say(api, "ca", [("1", "kai", "Ayla, I buried the gold coins beneath the old oak tree."),
                    ("2", A, "Your secret is safe with me.")])
    say(api, "cb", [("1", "kai", "Bren, the weather is terrible today."),
                    ("2", B, "Rain again. The roads will be mud.")])
    query = "where are the gold coins buried?"
    mine = find(api, query, viewer_id=A)
    assert (mine[0]["id"], mine[0]["chat_id"]) == ("1", "ca")
    assert {r["chat_id"] for r in find(api, query, viewer_id=B)} == {"cb"}
    assert {r["chat_id"] for r in find(api, query, viewer_id="kai")} == {"ca", "cb"}
    everything = find(api, query)
    assert (everything[0]["id"], everything[0]["chat_id"]) == ("1", "ca")
    assert len(everything) == 4


def test_sw9b_rv5_unrestricted_memory_of_a_scope_is_known_to_who_reads_that_scope(api):
    """rules SW9b + RV5: a memory in Ayla's scope with no known_by list is known to whoever reads
    her scope — Ayla, and characters sharing a chat with her — not to a stranger; global ones to all."""
    setup_cast(api)
    mine = memory(api, "Ayla is afraid of deep water since the shipwreck.", scope="character",
                  character_id=A)
    common = memory(api, "Deep water surrounds the island of Vell.")
    query = "who is afraid of deep water?"
    assert set(ids(find(api, query, viewer_id=A))) == {mine["id"], common["id"]}
    assert ids(find(api, query, viewer_id=B)) == [common["id"]]
    chat(api, "group", [A, B])
    assert set(ids(find(api, query, viewer_id=B))) == {mine["id"], common["id"]}


# --- filters ---------------------------------------------------------------------------------------
def test_sw6_kinds_filter(api):
    """rule SW6: `kinds` keeps only those kinds; without it every kind competes."""
    setup_cast(api)
    chat(api, "ca", [A])
    say(api, "ca", [("m1", A, "The lighthouse keeper drowned during the autumn storm.")])
    mem = memory(api, "The lighthouse keeper drowned in the storm.")
    query = "what happened to the lighthouse keeper?"
    assert {r["kind"] for r in find(api, query)} == {"message", "memory"}
    assert ids(find(api, query, kinds=["memory"])) == [mem["id"]]
    only = find(api, query, kinds=["message"])
    assert ids(only) == ["m1"] and only[0]["source_message_ids"] == ["m1"]  # a message cites itself
    assert find(api, query, kinds=["lore"]) == []


def test_sw6_chat_filter_keeps_that_chat_and_items_of_no_chat(api):
    """rule SW6: `chat_id` keeps the chat's own items plus items that belong to no chat."""
    setup_cast(api)
    chat(api, "ca", [A])
    chat(api, "cb", [B])
    say(api, "ca", [("1", "kai", "The red lantern marks the thieves' door.")])
    say(api, "cb", [("1", "kai", "A red lantern hangs over the tavern.")])
    mem = memory(api, "Red lanterns are lit for the harvest festival.")
    got = find(api, "red lantern", chat_id="ca")
    assert {(r["id"], r["chat_id"]) for r in got} == {("1", "ca"), (mem["id"], None)}


def test_sw6_result_shape_and_bad_requests(api):
    """rule SW6: results carry id, kind, text, score, sources; bad bodies are refused."""
    setup_cast(api)
    mem = memory(api, "Kai owes the blacksmith twelve crowns.", source_message_ids=["x1", "x2"])
    got = find(api, "how much does Kai owe?", k=1)
    assert got[0]["id"] == mem["id"] and got[0]["kind"] == "memory"
    assert got[0]["text"] == mem["text"] and got[0]["source_message_ids"] == ["x1", "x2"]
    assert isinstance(got[0]["score"], float)
    expect_error(api.post("/v1/search", json={"query": ""}), 400, "invalid_request")
    expect_error(api.post("/v1/search", json={"query": "x", "kinds": ["nope"]}), 400, "invalid_request")
    assert api.post("/v1/search", json={"query": "x"}, token=None).status_code == 401


# --- the index stays current ------------------------------------------------------------------------
def test_sw6_index_follows_writes_edits_and_deletes_without_rebuilding(quiet, services):
    """rule SW6: messages, edits and deletes are searchable at once; the in-memory index is
    patched (old rows die, new ones are appended), never rebuilt for a write."""
    setup_cast(quiet)
    chat(quiet, "ca", [A])
    say(quiet, "ca", [("1", "kai", "My horse is called Thunder."), ("2", A, "A fine name for a horse.")])
    assert ids(find(quiet, "what is the horse called?"))[0] == "1"
    live = live_index.state_of(services).live
    say(quiet, "ca", [("1", "kai", "My falcon is called Whisper.")])  # an edit
    assert ids(find(quiet, "what is the falcon called?"))[0] == "1"
    assert "Whisper" in find(quiet, "falcon", k=1)[0]["text"]
    assert not any("Thunder" in r["text"] for r in find(quiet, "Thunder"))
    expect_ok(quiet.delete("/v1/chats/ca/messages/1"))
    assert "1" not in ids(find(quiet, "what is the falcon called?"))
    assert live_index.state_of(services).live is live and live.dead == 2
    no_orphans(services)


def test_sw6_cached_neighbour_counts_follow_new_messages_edits_and_deletes(quiet, services):
    """rule SW6 (neighbour context): BM25's per-term spread of counts to session neighbours, and
    its length normalisation per candidate mask (`LiveIndex.memo`), are kept between queries;
    after new messages beside a holder, an edit and a delete, every score is still the one
    computed without them, and a change empties the memo."""
    setup_cast(quiet)
    chat(quiet, "ca", [A, B])
    say(quiet, "ca", [("1", "kai", "The lantern went out at the harbour."),
                      ("2", A, "I relit it with my last match."),
                      ("3", B, "The harbour master saw the lantern."),
                      ("4", A, "Then the storm came in.")])
    queries = ["lantern at the harbour", "who relit the lantern", "storm harbour master"]

    def compare() -> None:
        state = live_index.state_of(services)
        with state.lock:
            live = state.current()
            corpus = live.corpus()
            params = search.params_of(services.settings)
            for q in queries:
                terms = ranking.prepare_query(q, search.query_cast(services, "ca"),
                                              np.zeros(live_index.DIM, np.float32), params).terms
                cached = ranking.bm25(corpus.terms, terms, neighbours=corpus.neighbours,
                                      neighbour_weights=params.neighbour_weights)
                plain = ranking.bm25(replace(corpus.terms, spread_cache=None), terms,
                                     neighbours=corpus.neighbours,
                                     neighbour_weights=params.neighbour_weights)
                assert np.array_equal(cached, plain), q
                mask = live.candidates(None, (), ["ca"], None)
                kept = ranking.bm25(corpus.terms, terms, mask=mask, neighbours=corpus.neighbours,
                                    neighbour_weights=params.neighbour_weights, memo=corpus.memo)
                fresh = ranking.bm25(corpus.terms, terms, mask=mask, neighbours=corpus.neighbours,
                                     neighbour_weights=params.neighbour_weights)
                assert np.array_equal(kept, fresh), q
            assert live.spread_cache and live.memo  # both were filled and used

    for q in queries:
        find(quiet, q)
    compare()
    compare()  # the second pass reads the cache
    say(quiet, "ca", [("5", B, "A second lantern burned on the pier."), ("6", A, "Nobody answered.")])
    state = live_index.state_of(services)
    with state.lock:
        assert not state.current().memo  # the new rows emptied it
    compare()
    say(quiet, "ca", [("2", A, "I relit the lantern with my last match.")])  # an edit
    expect_ok(quiet.delete("/v1/chats/ca/messages/3"))
    compare()
    assert ids(find(quiet, "who relit the lantern"))[0] == "2"


def test_rv10_rollback_and_deletes_remove_results_and_vectors(api, services):
    """rules RV10, SW6: a rolled-back turn's memory, a deleted memory and a deleted chat leave no
    result and no vector behind."""
    setup_cast(api)
    chat(api, "ca", [A])
    say(api, "ca", [("u1", "kai", "Remember: the password is juniper."), ("a1", A, "Juniper. Got it.")])
    made = expect_ok(api.post("/v1/memories", json={
        "text": "The password to the cellar is juniper.", "scope": "character", "character_id": A,
        "actor": "model", "chat_id": "ca", "turn_id": "t1"}), 201)["memory"]
    other = memory(api, "The cellar door creaks.")
    assert made["id"] in ids(find(api, "cellar password"))
    expect_ok(api.post("/v1/chats/ca/turns/t1/rollback", json={}))
    assert made["id"] not in ids(find(api, "cellar password"))
    expect_ok(api.delete(f"/v1/memories/{other['id']}", query_string={"actor": "user"}))
    assert other["id"] not in ids(find(api, "cellar door"))
    expect_ok(api.delete("/v1/chats/ca"))
    assert find(api, "juniper password") == []
    conn = services.db.reader()
    assert conn.execute("SELECT count(*) FROM docs").fetchone()[0] == 0
    assert conn.execute("SELECT count(*) FROM docs_vec").fetchone()[0] == 0
    assert conn.execute("SELECT count(*) FROM docs_passages").fetchone()[0] == 0
    no_orphans(services)


def test_sw6_long_items_get_passage_vectors_and_lose_them_with_the_item(api, services):
    """rule SW6: an item of several passages stores one vector per passage, in its transaction."""
    setup_cast(api)
    long_text = " ".join(f"Sentence number {i} tells of the journey across the {w} hills and valleys."
                         for i, w in enumerate(["green", "grey", "misty", "windy", "stony"]))
    mem = memory(api, long_text)
    conn = services.db.reader()
    n = conn.execute("SELECT passages FROM docs WHERE ref_id=?", (mem["id"],)).fetchone()[0]
    assert n > 1 and conn.execute("SELECT count(*) FROM docs_passages").fetchone()[0] == n
    assert ids(find(api, "misty hills"))[0] == mem["id"]
    expect_ok(api.delete(f"/v1/memories/{mem['id']}", query_string={"actor": "user"}))
    assert conn.execute("SELECT count(*) FROM docs_passages").fetchone()[0] == 0
    no_orphans(services)


def test_sw6_restart_rebuilds_the_same_results(api, services, settings, embedder, clock):
    """rule SW6: the in-memory index is rebuilt from SQLite at start-up and ranks exactly as the
    patched one did (same ids, same scores)."""
    setup_cast(api)
    chat(api, "ca", [A, B])
    say(api, "ca", [("1", "kai", "The bridge at Varn collapsed last spring."),
                    ("2", A, "I was on it when the stones gave way."),
                    ("3", B, "Ayla still limps from that day.")])
    say(api, "ca", [("2", A, "I was standing on it when the old stones gave way.")])  # an edit
    memory(api, "Bren rebuilt the bridge at Varn with his brothers.")
    queries = ["what happened to the bridge at Varn?", "why does Ayla limp?", "who rebuilt the bridge"]
    before = [find(api, q, viewer_id=v) for q in queries for v in (None, A)]
    again = build_services(settings, embedder=embedder, clock=clock)
    try:
        after = [search.search(again, q, viewer_id=v) for q in queries for v in (None, A)]
        assert live_index.state_of(again).live.dead == 0
    finally:
        again.db.close()
    assert [ids(r) for r in after] == [ids(r) for r in before]
    for old, new in zip(before, after):
        assert np.allclose([r["score"] for r in old], [r["score"] for r in new], atol=1e-3)


def test_sw6_float16_vectors_rank_as_float32_ones(api, services, settings, embedder, clock):
    """rule SW6: with search_half_vectors off the index keeps float32 vectors; the same store
    ranks the same ids in the same order either way, with scores within 2e-3. (A cosine moves
    by under 3e-4; a fused score is a sum of z-scores, each cosine divided by its channel's
    spread over these five items: 1.1e-3 was seen with queries embedded in bfloat16.)"""
    setup_cast(api)
    chat(api, "ca", [A, B])
    say(api, "ca", [("1", "kai", "The bridge at Varn collapsed last spring."),
                    ("2", A, "I was on it when the stones gave way."),
                    ("3", B, "Ayla still limps from that day."),
                    ("4", "kai", "We sailed to the salt islands for the spring market.")])
    memory(api, "Bren rebuilt the bridge at Varn with his brothers.")
    queries = ["what happened to the bridge at Varn?", "why does Ayla limp?", "where did we sail?"]
    half = [find(api, q) for q in queries]
    assert live_index.state_of(services).live.vectors.dtype == np.float16
    off = load_settings({**settings.as_dict(redact=False), "search_half_vectors": False}, environ={})
    full = build_services(off, embedder=embedder, clock=clock)
    try:
        again = [search.search(full, q) for q in queries]
        assert live_index.state_of(full).live.vectors.dtype == np.float32
    finally:
        full.db.close()
    assert [ids(r) for r in again] == [ids(r) for r in half]
    for old, new in zip(half, again):
        assert np.allclose([r["score"] for r in old], [r["score"] for r in new], atol=2e-3)


@pytest.mark.parametrize("batch", [8192, 3])
def test_sw6_a_fresh_index_loaded_in_bulk_equals_one_appended_row_by_row(quiet, services, monkeypatch, batch):
    """rule SW6: the start-up build fills the index column by column, a batch of rows at a time
    (live_bulk.load); it holds exactly what appending each row in order holds: fields, vectors,
    passages, postings, codes, session lists and links."""
    monkeypatch.setattr(live_index.live_bulk, "BATCH", batch)
    api = quiet
    setup_cast(api)
    chat(api, "ca", [A, B])
    chat(api, "cb", [B, C])
    say(api, "ca", [("1", "kai", "The bridge at Varn collapsed last spring."),
                    ("2", A, "I was on it when the stones gave way. " * 6 + "Nobody came for hours."),
                    ("3", B, "Ayla still limps from that day.")])
    say(api, "cb", [("4", C, "Cato keeps the ledger of the salt trade."), ("5", B, "And the key to it.")])
    say(api, "ca", [("2", A, "I was standing on it when the old stones gave way.")])  # an edit: a dead row
    memory(api, "Bren rebuilt the bridge at Varn with his brothers.", scope="character", character_id=B)
    memory(api, "The salt road runs north past the old watchtower and the river ford. " * 5)
    with services.db.read() as conn:
        rows = index.all_rows(conn, live_index._COLUMNS)
        vecs, pvecs = index.item_vectors(conn, None), index.passage_vectors(conn, None)
    assert pvecs, "the long memory has passages"
    for kind in ("int4", "int8"):
        bulk = live_index.build(services.db, (1.0, 0.6), True, coarse=kind, torch_imported=lambda: True)
        one = live_index.LiveIndex((1.0, 0.6), dim=bulk.dim, half=True, coarse=kind)
        one.rev, one.cast_version = bulk.rev, bulk.cast_version
        one.settle_first_pass()  # as the build: int8 where this torch reads int4 copies otherwise
        four = isinstance(bulk.coarse[0], ranking.vectors.Int4Rows)
        assert type(one.coarse[0]) is type(bulk.coarse[0])
        assert four == (kind == "int4" and ranking.vectors.int4_ready(bulk.dim))
        live_index._add_rows(one, rows[:3], vecs, pvecs, link=False)
        one.corpus()  # a copy of the first rows, then of the rest as they come
        live_index._add_rows(one, rows[3:], vecs, pvecs, link=False)
        one.link_all()
        # the first pass's copies: of every row, made in one batch or in steps
        for got, want in ((one.corpus().coarse, bulk.corpus().coarse), (one.corpus().coarse_sent, bulk.corpus().coarse_sent)):
            if four:
                assert got.n == want.n and np.array_equal(got.packed, want.packed) and np.array_equal(got.scale_zero, want.scale_zero)
            else:
                assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1])
        if four:
            assert (bulk.corpus().coarse.n, bulk.corpus().coarse_sent.n) == (bulk.n, bulk.pn)
            exact = bulk.vectors[:bulk.n].astype(np.float32).reshape(bulk.n, -1, ranking.vectors.INT4_GROUP)
            error = np.abs(ranking.vectors.dequantize4(bulk.corpus().coarse).reshape(exact.shape) - exact)
            # each component within half a step (a fifteenth of its group's range), and the
            # bfloat16 rounding of the group's zero point
            assert np.all(error.max(axis=2) <= (exact.max(axis=2) - exact.min(axis=2)) / 30 * 1.01 + 1e-3)
        else:
            assert len(bulk.corpus().coarse[0]) == bulk.n and len(bulk.corpus().coarse_sent[0]) == bulk.pn
            assert np.array_equal(bulk.corpus().coarse[0], ranking.vectors.quantize(bulk.vectors[:bulk.n])[0])
    assert live_index.build(services.db, (1.0, 0.6), True).corpus().coarse is None
    assert (bulk.n, bulk.pn, bulk.stale_cast) == (one.n, one.pn, one.stale_cast)
    for name in bulk.a:
        assert np.array_equal(bulk.a[name][:bulk.n], one.a[name][:one.n], equal_nan=True), name
    assert np.array_equal(bulk.vectors[:bulk.n], one.vectors[:one.n])
    assert np.array_equal(bulk.pvec[:bulk.pn], one.pvec[:one.pn])
    assert np.array_equal(bulk.powner[:bulk.pn], one.powner[:one.pn])
    assert np.array_equal(bulk.nbr[:bulk.n], one.nbr[:one.n])
    for radius, name in ((1, "win1"), (2, "win2")):  # the window norms, as ranking computes them
        exact = bulk.vectors[:bulk.n].astype(np.float32)
        want = ranking.window_norms(exact, bulk.nbr[:bulk.n], radius, (1.0, 0.6))
        assert np.allclose(bulk.a[name][:bulk.n], want, rtol=1e-6), name
    assert bulk.postings.terms() == one.postings.terms() and bulk.postings.terms()
    for term in one.postings.terms():
        (bulk_rows, bulk_tfs), (one_rows, one_tfs) = bulk.postings.get(term), one.postings.get(term)
        assert np.array_equal(bulk_rows, one_rows) and np.array_equal(bulk_tfs, one_tfs), term
    assert list(bulk.row_terms) == list(one.row_terms)
    assert bulk.row_of == one.row_of and bulk.groups == one.groups
    for codes in ("kinds", "chats", "owners", "known_sets", "sessions", "days"):
        assert getattr(bulk, codes).values == getattr(one, codes).values, codes
    corpus = bulk.corpus()  # each row's day, as a code into the distinct days
    assert corpus.day_table is not None and len(corpus.day_table) == len(bulk.days.values) >= 1
    assert len(rows) == bulk.n and np.all(corpus.day_codes >= 0)
    assert np.array_equal(corpus.day_table[corpus.day_codes], [columns.day_of(r["created_at"]) for r in rows])


def test_sw6_an_int4_copy_this_torch_cannot_read_becomes_an_int8_copy(api, services, monkeypatch):
    """rule SW6: the int4 copy is packed as torch's kernel reads it on a CPU with AVX-512; where
    `int4_ready` finds this torch reading it otherwise, the first query replaces it by an int8
    copy (made then) and search goes on, the same results."""
    setup_cast(api)
    chat(api, "ca", [A, B])
    say(api, "ca", [("1", "kai", "The bridge at Varn collapsed last spring."),
                    ("2", A, "I was on it when the stones gave way.")])
    before = find(api, "what happened to the bridge?")
    live = live_index.state_of(services).live
    kind = ranking.vectors.Int4Rows if ranking.vectors.int4_ready(live.dim) else ranking.vectors.Int8Rows
    assert isinstance(live.coarse[0], kind) and isinstance(live.coarse[1], kind)
    monkeypatch.setattr(ranking.vectors, "int4_ready", lambda dim: False)
    after = find(api, "what happened to the bridge?")
    assert isinstance(live.coarse[0], ranking.vectors.Int8Rows) and isinstance(live.coarse[1], ranking.vectors.Int8Rows)
    rows, _ = live.corpus().coarse
    assert len(rows) == live.n and np.array_equal(rows, ranking.vectors.quantize(live.vectors[:live.n])[0])
    assert ids(after) == ids(before) and before


def test_sw6_the_build_makes_the_copy_this_torch_reads(api, services, monkeypatch):
    """rule SW6: the build asks `int4_ready` before it makes its copies: where this torch reads
    int4 copies otherwise, it makes int8 copies of every row and no int4 one, and a search finds
    them made (the first query of a campaign does not make them)."""
    setup_cast(api)
    chat(api, "ca", [A, B])
    say(api, "ca", [("1", "kai", "The bridge at Varn collapsed last spring."),
                    ("2", A, "I was on it when the stones gave way under the carts of the autumn fair. "
                             "The river took three wagons and the miller's mule before anyone could shout. "
                             "We pulled the carter out below the weir, half drowned and cursing the duke.")])
    monkeypatch.setattr(ranking.vectors, "int4_ready", lambda dim: False)
    packed: list[int] = []
    quantize4 = ranking.vectors.quantize4
    monkeypatch.setattr(ranking.vectors, "quantize4",
                        lambda rows: packed.append(len(rows)) or quantize4(rows))
    state = live_index.state_of(services)
    fresh = state.fresh()
    assert all(isinstance(copy, ranking.vectors.Int8Rows) for copy in fresh.coarse)
    assert fresh.coarse[0].n == fresh.n >= 2 and fresh.coarse[1].n == fresh.pn >= 1 and packed == []
    with state.lock:
        state.live = fresh
    made: list[int] = []
    quantize = ranking.vectors.quantize
    monkeypatch.setattr(ranking.vectors, "quantize", lambda rows: made.append(len(rows)) or quantize(rows))
    assert ids(find(api, "what happened to the bridge?")) and made == [] and packed == []


def test_sw6_a_build_before_the_embedder_has_loaded_leaves_the_copy_to_the_first_query(services, monkeypatch):
    """rule SW6: the build asks torch about its int4 kernel only once the embedder has loaded
    (an import of torch on the build's thread beside the embedder's aborted the process at
    exit); until then it makes the copy the setting names, and a query settles it."""
    asked: list[int] = []
    monkeypatch.setattr(ranking.vectors, "int4_ready", lambda dim: asked.append(dim) or False)
    early = live_index.build(services.db, (1.0, 0.6), True, coarse="int4", torch_imported=lambda: False)
    assert isinstance(early.coarse[0], ranking.vectors.Int4Rows) and asked == []
    early.settle_first_pass()
    assert isinstance(early.coarse[0], ranking.vectors.Int8Rows) and asked
    asked.clear()
    ready = live_index.build(services.db, (1.0, 0.6), True, coarse="int4", torch_imported=lambda: True)
    assert isinstance(ready.coarse[0], ranking.vectors.Int8Rows) and asked


def test_op10_the_compiled_loops_load_beside_the_build_not_in_the_first_search(settings, embedder, clock,
                                                                              monkeypatch):
    """rule OP10: the index's thread starts loading the first pass's compiled loops (numba's
    cache, or a compilation) on a thread of its own as the build begins, not after it: a search
    right after ready waited ~0.6 s for them at 100,000 messages. Off with the setting."""
    for on in (True, False):
        loaded: list[str] = []
        monkeypatch.setattr(live_index.kernels, "compiled",
                            lambda: loaded.append(threading.current_thread().name))
        values = {**settings.as_dict(redact=False), "search_compiled_first_pass": on}
        chosen = load_settings(values, environ={})
        svc = build_services(chosen, embedder=embedder, clock=clock)
        try:
            state = live_index.start(svc)
            assert state.ready.wait(60)
            deadline = time.monotonic() + 10
            while on and not loaded and time.monotonic() < deadline:
                time.sleep(0.01)
            assert loaded == (["search-loops"] if on else [])
        finally:
            svc.db.close()


def test_sw6_writes_of_another_process_are_seen(api, services, settings, embedder, clock):
    """rule SW6: another process writing the same store (here: a second Services on the file)
    bumps the docs revision; the next search catches up from it."""
    setup_cast(api)
    assert find(api, "the comet") == []
    other = build_services(settings, embedder=embedder, clock=clock)
    try:
        from server_plugin.story import memories

        made = memories.create(other, {"text": "A green comet crossed the sky on midsummer night.",
                                       "scope": "global", "actor": "user"})
    finally:
        other.db.close()
    assert ids(find(api, "the comet")) == [made["id"]]


def test_sw6_many_dead_rows_trigger_a_fresh_index(quiet, services):
    """rule SW6: once dead rows pass search_rebuild_share, the background pass swaps in a fresh
    index with the same answers."""
    setup_cast(quiet)
    chat(quiet, "ca", [A])
    say(quiet, "ca", [(str(i), "kai", f"Entry {i}: the caravan reached oasis number {i}.") for i in range(10)])
    find(quiet, "oasis")  # the index now holds the ten rows
    say(quiet, "ca", [(str(i), "kai", f"Entry {i}: the caravan left oasis number {i}.") for i in range(4)])
    before = find(quiet, "which oasis did the caravan leave?")
    state = live_index.state_of(services)
    old = state.live
    assert old.dead == 4
    state.maintain()
    assert state.live is not old and state.live.dead == 0
    assert find(quiet, "which oasis did the caravan leave?") == before


# --- character names -------------------------------------------------------------------------------
def test_sw6_names_are_taken_out_of_vectors_and_renames_re_embed(quiet, services):
    """rule SW6: vectors are embedded without character names (MiniLM ranks by the names it sees);
    a character created after texts that name it makes those vectors stale, and the background pass
    re-embeds exactly those rows (the others only move to the new cast version)."""
    setup_cast(quiet)
    chat(quiet, "ca", [A])
    say(quiet, "ca", [("1", A, "Yuki cried in the hallway after the exam."),
                    ("2", A, "The exam results were posted at noon.")])
    conn = services.db.reader()

    def row(mid: str) -> Any:
        return conn.execute("SELECT d.* FROM docs d JOIN messages m ON d.ref_id = CAST(m.seq AS TEXT)"
                            " WHERE d.kind='message' AND m.id=?", (mid,)).fetchone()

    first, second = row("1"), row("2")
    assert first["dense_hash"] == index.dense_hash("Yuki cried in the hallway after the exam.")
    expect_ok(quiet.put("/v1/characters/yuki", json={"name": "Yuki"}), 201)
    version = index.cast_version(conn)
    assert version > first["cast_version"]
    redone = live_index.state_of(services).reembed()
    assert redone == 1
    first2, second2 = row("1"), row("2")
    assert first2["dense_hash"] == index.dense_hash("cried in the hallway after the exam.")
    assert first2["rev"] > first["rev"] and first2["cast_version"] == version
    assert second2["rev"] == second["rev"] and second2["cast_version"] == version  # no new vector
    vec = np.frombuffer(conn.execute("SELECT embedding FROM docs_vec WHERE rowid=?", (first2["id"],)
                                     ).fetchone()[0], dtype=np.float32)
    expected = services.embedder.embed_one("cried in the hallway after the exam.", services.embed_wait())
    assert np.allclose(vec, expected, atol=1e-5)
    assert ids(find(quiet, "Yuki crying in the hallway"))[0] == "1"
    no_orphans(services)


def test_cast_names_only_where_capitalised():
    """rule SW6: a character called Will does not take "will" out of every stored text."""
    cast = ranking.Cast.build([("w", ["Will"])])
    assert ranking.dense_text("Will said he will come.", cast) == "said he will come."


# --- hybrid through the store ------------------------------------------------------------------------
DOCS = [
    "Yuki sobbed quietly in the school corridor after the exam results were posted.",
    "The hallway lights flickered as Yuki walked past the lockers.",
    "Yuki ate lunch with her friends in the cafeteria and laughed a lot.",
    "The dragon Vexmoor burned the eastern watchtower to ash.",
    "A fire destroyed the old mill by the river last winter.",
    "Ayla hid the silver key under the loose floorboard in the chapel.",
    "Bren lost his map somewhere on the road to Highgate.",
    "The innkeeper complained that the ale barrels were nearly empty.",
    "Bren paid the blacksmith twelve crowns to mend his broken sword.",
    "Mira keeps the Quillon Codex wrapped in oilcloth inside her satchel.",
    "The old librarian guards an ancient book of spells in the tower.",
    "The vault door opens only to the passphrase ember-nine.",
    "Ayla lost her mother's ring while crossing the river.",
    "Yuki lost her notebook on the train home.",
]
QUERIES = [  # (query, the one relevant item)
    ("Yuki crying in the hallway", 0),
    ("What did Vexmoor destroy?", 3),
    ("Where is the silver key hidden?", 5),
    ("How much did the sword repair cost?", 8),
    ("the tavern is running out of beer", 7),
    ("Who has the Quillon Codex?", 9),
    ("ember-nine", 11),
    ("What did Bren lose?", 6),
    ("What did Ayla lose?", 12),
    ("What did Yuki lose?", 13),
]
ONLY = {s.name: 0.0 for s in SEARCH if s.name.startswith("search_w_")}


def test_sw6_hybrid_beats_bm25_alone_and_dense_alone_through_the_store(api, services, settings):
    """rule SW6: items stored through the API and ranked by POST /v1/search's code path: the
    z-score fusion of BM25 and the dense channels (shipped weights, priors off — they are tuned
    for conversations) beats BM25 alone and dense alone on MRR and first places; each single
    method fails somewhere."""
    for cid, name in ((A, "Ayla"), (B, "Bren"), ("yuki", "Yuki"), ("mira", "Mira")):
        assert api.put(f"/v1/characters/{cid}", json={"name": name}).status_code in (200, 201)
    made = [memory(api, text)["id"] for text in DOCS]
    configs = {"bm25": {**ONLY, "search_w_bm25": 1.0}, "dense": {**ONLY, "search_w_dense": 1.0},
               "hybrid": {**ONLY, **{f"search_{w}": getattr(search.params_of(settings), w)
                                     for w in ("w_bm25", "w_dense", "w_dense_sent")}}}
    ranks: dict[str, list[int]] = {}
    for name, weights in configs.items():
        svc = replace(services, settings=load_settings({**settings.as_dict(redact=False), **weights},
                                                       environ={}), _caches={})
        ranks[name] = []
        for text, gold in QUERIES:
            order = ids(search.search(svc, text, k=len(DOCS)))
            ranks[name].append(order.index(made[gold]) + 1)
    mrr = {n: float(np.mean([1 / r for r in rs])) for n, rs in ranks.items()}
    firsts = {n: sum(r == 1 for r in rs) for n, rs in ranks.items()}
    assert mrr["hybrid"] > mrr["bm25"] and mrr["hybrid"] > mrr["dense"], (ranks, mrr)
    assert firsts["hybrid"] > firsts["bm25"] and firsts["hybrid"] > firsts["dense"], ranks
    assert max(ranks["bm25"]) > 1 and max(ranks["dense"]) > 1, ranks


# --- the store side ------------------------------------------------------------------------------
def test_sw6_messages_are_stored_with_speaker_place_and_session(api, services):
    """rule SW6: a message's row holds its speaker, position, session, BM25 terms of
    "[date] speaker: text", temporal cues and itself as source; a session end moves the key."""
    setup_cast(api)
    chat(api, "ca", [A])
    say(api, "ca", [("1", "kai", "Yesterday we sailed to Port Vell.")], sent_at="2023-05-08T13:56:00Z")
    r = services.db.reader().execute("SELECT * FROM docs WHERE kind='message'").fetchone()
    assert (r["character_id"], r["speaker_name"], r["position"]) == ("kai", "Kai", 0)
    assert r["session_key"] == "ca#1" and loads_list(r["sources"]) == ["1"]
    terms = loads_list(r["terms"])
    assert {"kai", "8", "may", "2023", "sail", "vell"} <= set(terms)
    assert r["cues"] >= 1 and r["content_len"] == 4  # yesterday, sailed, port, vell
    expect_ok(api.post("/v1/chats/ca/sessions/end", json={}))
    say(api, "ca", [("2", A, "And today we rest.")], sent_at="2023-05-09T10:00:00Z")
    keys = [row[0] for row in services.db.reader().execute(
        "SELECT session_key FROM docs WHERE kind='message' ORDER BY position")]
    assert keys == ["ca#1", "ca#2"]


def loads_list(text: str) -> Any:
    import json

    return json.loads(text)


def test_sw2_sw6_session_summaries_are_searchable_and_leave_with_their_chat(api, services):
    """rules SW2, SW6: an ended session's summary is indexed (known by the session's witnesses,
    citing the messages it quotes) and removed with its chat."""

    setup_cast(api)
    chat(api, "ca", [A])
    say(api, "ca", [("1", "kai", "\"I will find the lost crown of Elder Marsh,\" Kai swore."),
                    ("2", A, "\"Then I will guide you through the marsh,\" Ayla said.")])
    expect_ok(api.post("/v1/chats/ca/sessions/end", json={}))
    worker.run_pending(services)
    got = find(api, "the lost crown", kinds=["session_summary"])
    assert len(got) == 1 and got[0]["id"] == "ca#1" and got[0]["chat_id"] == "ca"
    assert set(got[0]["source_message_ids"]) <= {"1", "2"}
    assert find(api, "the lost crown", kinds=["session_summary"], viewer_id=B) == []
    expect_ok(api.delete("/v1/chats/ca"))
    assert find(api, "the lost crown") == []
    no_orphans(services)


def test_m003_backfills_items_indexed_before_it(tmp_path, embedder):
    """Migration m003 gives rows indexed under m001/m002 their placement and marks their BM25
    terms for the application, which analyses them when the store is opened (before it serves);
    their vectors (embedded with names, without passages) are redone by the background pass."""
    db = open_store(tmp_path / "old.sqlite3", defaults(), migrate=False)
    with db.write() as conn:
        conn.execute("CREATE TABLE schema_migrations (number INTEGER PRIMARY KEY, name TEXT NOT NULL,"
                     " applied_at TEXT NOT NULL)")
        for number, func in migrations.MIGRATIONS[:2]:
            func(conn)
            conn.execute("INSERT INTO schema_migrations VALUES (?, ?, 'then')", (number, func.__name__))
        conn.execute("INSERT INTO characters(id, name, created_at, updated_at) VALUES ('a', 'Ayla', 'x', 'x')")
        conn.execute("INSERT INTO messages(chat_id, id, role, name, text, sent_at, position, tokens,"
                     " session_n, created_at, updated_at) VALUES ('c', 'm1', 'user', 'Kai',"
                     " 'Ayla, meet me at the mill.', '2024-01-02T00:00:00Z', 0, 9, 1, 'x', 'x')")
        conn.execute("INSERT INTO docs(kind, ref_id, chat_id, text, created_at) VALUES"
                     " ('message', '1', 'c', 'Ayla, meet me at the mill.', '2024-01-02T00:00:00Z')")
        conn.execute("INSERT INTO docs_fts(rowid, text) VALUES (1, 'Ayla, meet me at the mill.')")
        conn.execute("INSERT INTO docs_vec(rowid, embedding) VALUES (1, ?)",
                     (embedder.embed_one("Ayla, meet me at the mill.", 60.0).tobytes(),))
    assert migrations.migrate(db) == [n for n, _ in migrations.MIGRATIONS[2:]]
    assert db.reader().execute("SELECT terms FROM docs").fetchone()[0] == index.UNANALYSED
    assert index.analyse_pending(db) == 1 and index.analyse_pending(db) == 0
    r = db.reader().execute("SELECT * FROM docs").fetchone()
    assert r["session_key"] == "c#1" and r["speaker_name"] == "Kai" and r["cast_version"] == -1
    assert {"kai", "ayla", "meet", "mill"} <= set(loads_list(r["terms"]))
    assert index.orphans(db.reader()) == dict.fromkeys(index.orphans(db.reader()), 0)
    db.close()

