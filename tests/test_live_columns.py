"""The in-memory index's compact columns (retrieval/columns.py) and its bounded caches (SW6)."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest

from server_plugin.retrieval import columns, docs, live_bulk, live_index
from server_plugin.retrieval import ranking as R
from server_plugin.retrieval.ranking import lexical
from server_plugin.store.db import sqlite3

COUNTS = [{"salt": 2.0, "road": 1.0}, {"road": 1.0}, {"tower": 3.0, "salt": 1.0}, {"salt": 1.0}]


def test_sw6_postings_loaded_at_once_equal_postings_added_row_by_row():
    one, bulk = columns.Postings(), columns.Postings()
    for row, counts in enumerate(COUNTS):
        one.add(row, counts)
    bulk.load(COUNTS)
    assert one.terms() == bulk.terms() == {"salt", "road", "tower"}
    for term in one.terms():
        assert [a.tolist() for a in one.get(term)] == [b.tolist() for b in bulk.get(term)]
    bulk.add(4, {"salt": 5.0, "well": 1.0})  # a row written after the load joins its terms
    assert bulk.get("salt")[0].tolist() == [0, 2, 3, 4] and bulk.get("salt")[1].tolist() == [2, 1, 1, 5]
    assert bulk.get("well")[0].tolist() == [4] and bulk.get("nothing") is None


def test_sw6_the_loader_keeps_each_rows_terms_and_length_in_batches():
    """rule SW6: the bulk loader (live_bulk.py) numbers terms batch by batch; each row's terms come back in
    its own order (rows without terms among them, the last one too) and its length is the sum of
    its counts, as `append` computes them."""
    rows = [{"salt": 2.0, "road": 1.5}, {}, {"tower": 3.0, "salt": 1.0},
            {"road": 0.1, "well": 0.2, "salt": 0.7}, {}]
    loader, postings = columns.PostingsLoader(), columns.Postings()
    lengths = [loader.add(0, rows[:2]).tolist(), loader.add(2, rows[2:]).tolist()]
    assert lengths == [[3.5, 0.0], [4.0, sum(rows[3].values()), 0.0]]
    terms = loader.into(postings)
    assert len(terms) == 5 and list(terms) == [tuple(c) for c in rows]
    assert postings.get("salt")[0].tolist() == [0, 2, 3]
    assert postings.get("well")[1].tolist() == [np.float32(0.2)]
    terms.append(("harbour",))  # a row appended after the load
    assert terms[5] == ("harbour",) and terms[3] == ("road", "well", "salt") and len(terms) == 6
    with pytest.raises(IndexError):
        terms[6]
    assert list(columns.PostingsLoader().into(columns.Postings())) == []


def test_sw6_the_arrays_kept_for_queried_terms_are_bounded_by_bytes(monkeypatch):
    postings = columns.Postings()
    postings.load([{f"t{i}": 1.0 for i in range(50)} for _ in range(100)])
    monkeypatch.setattr(columns, "ARRAYS_BYTES", 100 * 16 * 3)  # about three terms' pairs
    for i in range(50):
        assert postings.get(f"t{i}")[0].tolist() == list(range(100))
        assert len(postings.arrays) <= 5
    assert postings._held <= columns.ARRAYS_BYTES + 100 * 16


def test_sw6_spread_postings_are_bounded_by_bytes_and_score_the_same(monkeypatch):
    counts = [{"salt": 1.0, f"w{i}": 1.0} for i in range(400)]
    nbr = R.neighbour_index(np.zeros(400, dtype=np.int64), radius=2)
    plain = R.TermIndex.build(counts)
    kept = R.TermIndex(plain.postings, plain.doc_len, plain.n_docs, R.SpreadCache())
    monkeypatch.setattr(lexical, "SPREAD_CACHE_BYTES", 400 * 16 * 2)
    for i in range(40):
        query = {"salt": 1.0, f"w{i}": 1.0}
        want = R.bm25(plain, query, neighbours=nbr, neighbour_weights=(0.9, 0.5))
        assert np.allclose(R.bm25(kept, query, neighbours=nbr, neighbour_weights=(0.9, 0.5)), want)
        assert kept.spread_cache.nbytes <= lexical.SPREAD_CACHE_BYTES + 2 * 400 * 16
    kept.spread_cache.clear()
    assert kept.spread_cache.nbytes == 0 and not kept.spread_cache


def _row(doc_id: int, kind: str, chat_id: str | None, owner: str | None, known: list[str] | None) -> dict:
    return {"id": doc_id, "kind": kind, "chat_id": chat_id, "character_id": owner,
            "known_by": None if known is None else json.dumps(known), "session_key": None,
            "position": None, "created_at": "2026-01-01T00:00:00Z", "content_len": 10, "cues": 0,
            "terms": json.dumps({"salt": 1.0}), "cast_version": 0}


def test_sw9b_kept_candidate_masks_follow_appended_and_killed_rows():
    """rule SW9b: the masks a search index keeps between searches (columns.Masks) always equal
    the mask made afresh, as rows are appended and killed, for every viewer, chats and kinds;
    a caller changing the mask it got changes nothing kept."""
    live = live_index.LiveIndex((1.0, 0.6), dim=4)
    rnd = random.Random(7)
    next_id = iter(range(1, 10 ** 6))

    def add(count: int) -> None:
        for _ in range(count):
            live.append(_row(next(next_id), rnd.choice(["message", "memory", "lore", "character_memory"]),
                             rnd.choice(["c1", "c2", "c3", None]), rnd.choice([None, "ayla", "bren"]),
                             rnd.choice([None, None, ["ayla"], ["bren", "cato"]])),
                        np.ones(4, dtype=np.float32), [])

    asks = [(None, (), None, None), ("bren", ("bren",), ["c1"], ["message", "memory"]),
            ("ayla", ("ayla", "bren"), ["c1", "c2"], None), ("cato", (), None, ["character_memory"])]
    add(30)
    for _ in range(6):
        for viewer, scopes, chats, kinds in asks:
            got = live.candidates(viewer, scopes, chats, kinds)
            fresh = live._candidates(0, live.n, viewer, frozenset(scopes), chats, kinds)
            assert got.shape == (live.n,) and np.array_equal(got, fresh)
            got[:] = False
        add(rnd.randint(0, 5))
        for doc_id in rnd.sample(sorted(live.row_of), 3):
            live.kill(doc_id)
    secret = live.append(_row(next(next_id), "memory", None, None, ["ayla"]), np.ones(4, np.float32), [])
    assert live.candidates("ayla", (), None, None)[secret]
    assert not live.candidates("bren", (), None, None)[secret]
    live.kill(int(live.a["doc_id"][secret]))
    assert not live.candidates("ayla", (), None, None)[secret]


def test_sw6_window_norms_of_a_full_index_equal_rankings():
    """rule SW6: a row's missing neighbour adds nothing to its window norm, also in a full index,
    where the missing neighbour's -1 reads the last real row (a campaign's build fills it exactly)."""
    rng = np.random.default_rng(3)
    live = live_index.LiveIndex((1.0, 0.6), capacity=7, dim=4)
    for i in range(7):
        row = {**_row(i + 1, "message", "c1", None, None), "session_key": f"s{i // 4}", "position": float(i)}
        live.append(row, rng.standard_normal(4).astype(np.float32), [], link=False)
    live.link_all()
    assert live.n == live.cap and live.nbr[3, 1] == -1  # the first session's last row: no next
    for radius, name in ((1, "win1"), (2, "win2")):
        want = R.window_norms(live.vectors[:live.n], live.nbr[:live.n], radius, (1.0, 0.6))
        assert np.allclose(live.a[name][:live.n], want, rtol=1e-6), name


def test_sw6_a_batch_read_as_columns_leaves_out_rows_without_a_vector(caplog):
    """rule SW6: the bulk load reads a batch of rows as columns (live_bulk._columns); a row with
    no vector (it cannot happen in one transaction) is left out and logged, never ranked; each
    row's passages are numbered as docs numbers their rowids."""
    conn = sqlite3.connect(":memory:")
    conn.row_factory = sqlite3.Row
    rows = conn.execute("SELECT 1 AS id, 'a' AS kind UNION ALL SELECT 2, 'b' UNION ALL SELECT 3, 'c'")
    rows = rows.fetchall()
    assert live_bulk._columns(rows, None) == {"id": (1, 2, 3), "kind": ("a", "b", "c")}
    assert live_bulk._columns(rows, {1, 3}) == {"id": [1, 3], "kind": ["a", "c"]}
    assert "doc 2 has no vector" in caplog.text
    assert live_bulk._columns(rows, set()) is None and live_bulk._columns([], None) is None
    most = docs.MAX_PASSAGES
    pairs = live_bulk._passage_pairs(np.array([7, 9, 4]), np.array([2, 0, 3]), 10)
    assert pairs.tolist() == [[7 * most, 10], [7 * most + 1, 10], [4 * most, 12], [4 * most + 1, 12],
                              [4 * most + 2, 12]]
