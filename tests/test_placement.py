"""Where the query's embedding runs (placement.py): on CPUs of its own while the thread that
waits for it keeps off them, and that thread's CPUs given back once it has the vector."""

from __future__ import annotations

import os

import pytest

from server_plugin import placement
from server_plugin.retrieval import search

PLACEABLE = placement.halves() is not None
CHAT = "Placed - 2026-01-01@10h00m00s"


def test_op10_cpus_are_split_in_halves_only_when_all_are_of_one_kind():
    assert placement.split([0, 1], [None, None]) == (frozenset({0}), frozenset({1}))
    assert placement.split([3, 1, 2], [2000, 2000, 2000]) == (frozenset({1, 2}), frozenset({3}))
    assert placement.split(list(range(8)), [None] * 8) == (frozenset(range(4)), frozenset(range(4, 8)))
    assert placement.split([0], [None]) is None  # one CPU: nothing to place
    assert placement.split([0, 1, 2, 3], [("512", None)] * 2 + [("1024", None)] * 2) is None  # big, little
    assert placement.split([0, 1], [(None, "2400000"), (None, "4700000")]) is None  # efficiency, performance


def _watched(monkeypatch) -> dict[str, set[int]]:
    """What the pool's thread kept to while it embedded (the real embedding, watched)."""
    seen: dict[str, set[int]] = {}
    real = search._embedded

    def embedded(svc, text):
        seen["pool"] = os.sched_getaffinity(0)
        return real(svc, text)
    monkeypatch.setattr(search, "_embedded", embedded)
    return seen


@pytest.mark.skipif(not PLACEABLE, reason="needs Linux and two or more CPUs of one kind")
def test_op10_the_query_is_embedded_on_cpus_the_waiting_thread_has_left(services, monkeypatch):
    waiting, embedding = placement.halves()
    before = os.sched_getaffinity(0)
    seen = _watched(monkeypatch)
    pending = search.query_vector_soon(services, "Where did Mara hide the silver key?", CHAT)
    meanwhile = os.sched_getaffinity(0)
    vector = search.vector_of(pending)
    assert seen["pool"] == set(embedding)
    assert meanwhile == before - embedding and not meanwhile & embedding
    assert os.sched_getaffinity(0) == before  # given back with the vector
    assert vector.shape == (services.embedder.dim,)
    assert search.vector_of(search.query_vector_soon(services, "Where did Mara hide the silver key?",
                                                     CHAT)) is not None  # cached: no thread, nothing moved
    assert os.sched_getaffinity(0) == before


@pytest.mark.skipif(not PLACEABLE, reason="needs Linux and two or more CPUs of one kind")
@pytest.mark.parametrize("overrides", [{"cpu_placement": "off"}])
def test_op10_with_placement_off_the_waiting_thread_stays_where_it_was(services, monkeypatch):
    before = os.sched_getaffinity(0)
    _watched(monkeypatch)
    pending = search.query_vector_soon(services, "Who rang the bell at the old mill?", CHAT)
    assert os.sched_getaffinity(0) == before
    search.vector_of(pending)
    assert os.sched_getaffinity(0) == before


@pytest.mark.skipif(not PLACEABLE, reason="needs Linux and two or more CPUs of one kind")
def test_op10_a_request_that_never_waits_for_its_vector_gives_its_cpus_back(api):
    """The request's end gives a thread that left the embedding's CPUs its own back, even when
    nothing waited for the vector (app._counted)."""
    before = os.sched_getaffinity(0)
    placement.leave("auto")
    assert os.sched_getaffinity(0) != before
    response = api.get("/v1/health")
    assert response.status_code == 200
    assert os.sched_getaffinity(0) == before


@pytest.mark.skipif(not PLACEABLE, reason="needs Linux and two or more CPUs of one kind")
def test_op10_the_first_pass_second_half_runs_on_the_embedding_cpus_while_the_caller_waits_off_them(
        monkeypatch):
    """The int8 first pass in two halves (vectors.coarse_dots): the helper's half on the
    embedding's CPUs, the caller's half off them, the caller's CPUs given back after; with the
    setting off, nobody moves."""
    import numpy as np

    from server_plugin.retrieval.ranking import kernels
    from server_plugin.retrieval.ranking import vectors as V

    if kernels.compiled() is None or not V.int8_ready(16):
        pytest.skip("needs numba's loops and torch's int8 kernel")
    embedding = placement.halves()[1]
    rows = np.random.default_rng(3).standard_normal((64, 16)).astype(np.float32)
    copies = [V.Int8Rows(16).sync(rows, 40), V.Int8Rows(16).sync(rows, 24)]
    seen: list[tuple[str, frozenset[int]]] = []
    real = kernels.int8_rows

    def watched(*args):
        seen.append(("helper" if placement._thread.__dict__.get("embedding") else "caller",
                     frozenset(os.sched_getaffinity(0))))
        return real(*args)
    monkeypatch.setattr(kernels, "int8_rows", watched)
    monkeypatch.setattr(V, "SPLIT_ROWS", 1)
    before = os.sched_getaffinity(0)
    got = V.coarse_dots(copies, rows[0], True, "auto")
    assert np.abs(got[0] - rows[:40] @ rows[0]).max() < 0.05
    assert {who for who, _ in seen} == {"helper", "caller"}
    assert all(cpus <= embedding for who, cpus in seen if who == "helper")
    assert all(not cpus & embedding for who, cpus in seen if who == "caller")
    assert os.sched_getaffinity(0) == before
    seen.clear()
    V.coarse_dots(copies, rows[0], True, "off")
    assert [cpus for who, cpus in seen if who == "caller"] == [frozenset(before)]


@pytest.mark.skipif(not PLACEABLE, reason="needs Linux and two or more CPUs of one kind")
def test_op10_a_full_float16_scan_halves_on_the_embedding_cpus_as_the_first_pass_does(monkeypatch):
    """An exact pass over every row (vectors.dot, from SPLIT_ROWS rows) is cut in two as the
    first pass is (vectors.in_halves): the helper's half on the embedding's CPUs, the caller's
    off them and given back after, the scores those of one thread; with the setting off, nobody
    moves."""
    import numpy as np

    from server_plugin.retrieval.ranking import vectors as V

    embedding = placement.halves()[1]
    rows = np.random.default_rng(5).standard_normal((64, 16)).astype(np.float16)
    query = rows[3].astype(np.float32)
    whole = V._dot(rows, query)
    seen: list[tuple[str, int, frozenset[int]]] = []
    real = V._dot

    def watched(part, vector):
        who = "helper" if placement._thread.__dict__.get("embedding") else "caller"
        seen.append((who, len(part), frozenset(os.sched_getaffinity(0))))
        return real(part, vector)
    monkeypatch.setattr(V, "_dot", watched)
    monkeypatch.setattr(V, "SPLIT_ROWS", 1)
    before = os.sched_getaffinity(0)
    assert np.array_equal(V.dot(rows, query, "auto"), whole)
    assert sorted((who, n) for who, n, _ in seen) == [("caller", 32), ("helper", 32)]
    assert all(cpus <= embedding for who, _, cpus in seen if who == "helper")
    assert all(not cpus & embedding for who, _, cpus in seen if who == "caller")
    assert os.sched_getaffinity(0) == before
    seen.clear()
    assert np.array_equal(V.dot(rows, query, "off"), whole)
    assert [cpus for who, _, cpus in seen if who == "caller"] == [frozenset(before)]
