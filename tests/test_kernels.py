"""The first pass as numba's loops (rule SW6, ranking/kernels.py): the same scores as numpy's
passes over every row, where numba is there, and numpy's passes where it is not."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from server_plugin.retrieval import ranking as R
from server_plugin.retrieval.ranking import bfloat16, kernels, lexical
from server_plugin.retrieval.ranking import vectors as V
from server_plugin.retrieval.ranking.windows import group_best, runs_of
from server_plugin.retrieval.search import params_of
from server_plugin.settings import defaults
from tests.test_refine import DIM, KINDS, _campaign, _unit

pytestmark = [pytest.mark.skipif(not V.int8_ready(DIM), reason="this torch has no int8 kernel"),
              pytest.mark.skipif(kernels.compiled() is None, reason="numba cannot compile the loops here")]


def _both(coarse: R.Corpus, query: R.Query, params: R.RankingParams,
          mask: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    # The loops against numpy's passes from the same first-pass cosines: torch's int8 kernel on
    # both sides (the compiled scan of an int8 copy has a test of its own, below).
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(kernels, "int8_rows", lambda *args: False)
        return (R.rank(coarse, query, replace(params, compiled=True), mask),
                R.rank(coarse, query, replace(params, compiled=False), mask))


def test_sw6_the_compiled_int8_scan_reads_every_row_of_both_copies_once_in_two_halves(monkeypatch):
    """rule SW6: the int8 copies' first pass by the compiled loop (vectors.coarse_dots): every
    row of the items' and the passages' copies within 3e-3 of the exact cosine and within 1e-3
    of torch's int8 kernel; the rows cut in two halves on two threads wherever the middle
    falls (in the items, in the passages, between them) give the scores of one thread to the
    bit; with the setting off (`compiled` False) or without numba, torch's kernel's scores."""
    rng = np.random.default_rng(47)
    for n_items, n_sent in ((900, 300), (300, 900), (600, 600), (5, 1000)):
        items = _unit(rng.standard_normal((n_items, DIM))).astype(np.float32)
        sent = _unit(rng.standard_normal((n_sent, DIM))).astype(np.float32)
        copies = [V.Int8Rows(DIM).sync(items, n_items), V.Int8Rows(DIM).sync(sent, n_sent)]
        query = _unit(items[1] + 0.3 * rng.standard_normal(DIM))
        torchs = [V.int8_dot(*copy, query) for copy in copies]
        monkeypatch.setattr(V, "SPLIT_ROWS", 10**9)
        whole = V.coarse_dots(copies, query, compiled=True)
        monkeypatch.setattr(V, "SPLIT_ROWS", 1)
        halves = V.coarse_dots(copies, query, compiled=True)
        for got, one, rows, theirs in zip(halves, whole, (items, sent), torchs):
            assert got.dtype == np.float32 and np.array_equal(got, one)
            assert np.abs(got - rows @ query).max() < 3e-3 and np.abs(got - theirs).max() < 1e-3
        assert all(np.array_equal(a, b) for a, b in zip(V.coarse_dots(copies, query), torchs))
        monkeypatch.setattr(kernels, "compiled", lambda: None)
        assert all(np.array_equal(a, b) for a, b in zip(V.coarse_dots(copies, query, compiled=True), torchs))
        monkeypatch.undo()


def test_sw6_the_bfloat16_table_holds_each_patterns_value_and_rounds_back():
    """rule SW6: the one table the compiled int8 scan reads a row's scale from (bfloat16.py): each of the
    65,536 patterns' float32 value, the same array every time, read-only; rounding a value back
    gives its pattern (every finite one), and rounding halfway goes to the even pattern."""
    table = bfloat16.table()
    assert table is bfloat16.table() and not table.flags.writeable and table.dtype == np.float32
    every = np.arange(1 << 16, dtype=np.uint16)
    assert np.array_equal(table.view(np.uint32), bfloat16.value(every).view(np.uint32))
    assert table[0x3F80] == 1.0 and table[0xC000] == -2.0 and np.isinf(table[0x7F80])
    finite = np.isfinite(table)
    assert np.array_equal(bfloat16.bits(table[finite]), every[finite])
    halfway = np.array([0x3F808000, 0x3F818000], dtype=np.uint32).view(np.float32)  # 1 + 2^-8, 1 + 3·2^-8
    assert bfloat16.bits(halfway).tolist() == [0x3F80, 0x3F82]
    assert bfloat16.bits(halfway, up=True).tolist() == [0x3F81, 0x3F82]


@pytest.mark.parametrize("kind", KINDS)
def test_sw6_the_compiled_first_pass_scores_every_row_as_numpys_passes(kind):
    """rule SW6: with the loops, every candidate's score is numpy's within 1e-6 (numpy
    weighs a window's neighbours in float32, the loops in float64; the first pass's channels are
    kept in float32), the best 20 in the same order; rows outside the candidates are -inf in
    both. For a person (no mask), a viewer (a mask), and weights that leave channels out (a
    window, the passages, the session prior)."""
    rng = np.random.default_rng(41)
    corpus, coarse, topics = _campaign(rng, n=4000, kind=kind)
    base = replace(params_of(defaults()), refine_rows=200)
    mask = np.ones(len(corpus), dtype=bool)
    mask[rng.choice(len(corpus), 700, replace=False)] = False
    assert kernels.fits(coarse, base)
    variants = [base, replace(base, w_dense_win2=0.0), replace(base, w_dense_sent=0.0),
                replace(base, w_session=0.0)]
    for t, params in enumerate(variants):
        vector = _unit(topics[t] + 2.0 * rng.standard_normal(DIM))
        words = R.prepare_query("the sword by the river", R.Cast.build([]), None, params)
        query = R.with_vector(words, vector)
        for m in (None, mask):
            fast, slow = _both(coarse, query, params, m)
            finite = np.isfinite(slow)
            assert np.array_equal(np.isfinite(fast), finite)
            assert finite.sum() == (len(corpus) if m is None else m.sum())
            assert np.abs(fast[finite] - slow[finite]).max() < 1e-6
            assert np.array_equal(R.top_k(fast, 20), R.top_k(slow, 20))
            assert not np.array_equal(fast, slow)  # the loops ran: another rounding than numpy's


def test_sw6_without_the_loops_or_without_passages_numpys_passes_rank():
    """rule SW6: where numba cannot compile the loops (`compiled` None), `rank` takes numpy's
    passes: the same scores to the bit as with the setting off. Where the corpus has no passages
    (`fits` False), the first pass is numpy's (BM25 still the loop's: within 1e-9)."""
    rng = np.random.default_rng(43)
    corpus, coarse, topics = _campaign(rng, n=2000)
    params = replace(params_of(defaults()), refine_rows=100)
    vector = _unit(topics[0] + 2.0 * rng.standard_normal(DIM))
    query = R.with_vector(R.prepare_query("a storm at the tower", R.Cast.build([]), None, params), vector)
    slow = R.rank(coarse, query, replace(params, compiled=False))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(kernels, "compiled", lambda: None)
        assert np.array_equal(R.rank(coarse, query, params), slow)
    bare = replace(coarse, sent_vectors=None, sent_owner=None, coarse_sent=None)
    assert not kernels.fits(bare, params) and kernels.fits(coarse, params)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(kernels, "first_pass", lambda *a: pytest.fail("no passages: numpy's passes"))
        patch.setattr(kernels, "int8_rows", lambda *args: False)  # torch's scan, as with the setting off
        got = R.rank(bare, query, params)
    numpys = R.rank(bare, query, replace(params, compiled=False))
    assert np.isfinite(got).all() and np.abs(got - numpys).max() < 1e-9


def test_sw6_best_outside_is_each_sessions_best_candidate_not_rescored():
    """rule SW6: the second pass's sessions read each session's best first-pass score among the
    candidates it did not rescore, as `group_best` over those rows gives it."""
    rng = np.random.default_rng(47)
    gids = np.repeat(np.arange(50), 20)
    gids[rng.choice(len(gids), 60, replace=False)] = -1
    fused = rng.standard_normal(len(gids))
    mask = rng.random(len(gids)) > 0.2
    rows = rng.choice(len(gids), 120, replace=False)
    pool = mask.copy()
    pool[rows] = False
    want = group_best(fused, gids, pool, runs_of(gids))
    before = mask.copy()
    got = kernels.best_outside(fused, gids, mask, rows, int(gids.max()))
    assert got is not None and np.array_equal(got, want)
    assert np.array_equal(mask, before)  # the caller's candidates are left as they were
    everyone = kernels.best_outside(fused, gids, None, rows, int(gids.max()))
    every = np.ones(len(gids), dtype=bool)
    every[rows] = False
    assert np.array_equal(everyone, group_best(fused, gids, every, runs_of(gids)))


def test_sw6_compiled_bm25_sums_the_neighbour_context_as_numpys_spread():
    """rule SW6: BM25 with its neighbour context summed by the compiled loop gives numpy's
    scores (spread per term) within 1e-12, for every row, with and without candidates, for a
    rare and a common term. The loop keeps each term's spread in the spread cache (the rows and
    counts numpy's `spread` gives), and a later query scores the terms it finds there from it,
    beside terms it does not find: the same scores again."""
    rng = np.random.default_rng(53)
    corpus = _campaign(rng, n=3000)[0]
    mask = rng.random(len(corpus)) > 0.3
    weights = (0.9, 0.5)
    cols = lexical.columns(2, weights)
    for query in ({"sword": 1.0}, {"sword": 1.0, "river": 2.0, "nothing": 1.0}, {}):
        for m in (None, mask):
            common = dict(k1=1.5, b=0.9, mask=m, neighbours=corpus.neighbours, neighbour_weights=weights)
            slow = R.bm25(corpus.terms, query, **common)
            terms = replace(corpus.terms, spread_cache=R.SpreadCache())
            fast = R.bm25(terms, query, compiled=True, **common)
            assert np.abs(fast - slow).max() <= 1e-12 * max(1.0, slow.max())
            assert set(terms.spread_cache) == {t for t in query if t in corpus.terms.postings}
            for term, (key, rows, counts) in terms.spread_cache.items():
                ix, tf = corpus.terms.postings[term]
                want_rows, want_counts = R.spread(ix, tf, corpus.neighbours, cols, len(corpus))
                order = np.argsort(rows)
                assert key == tuple(cols) and np.array_equal(rows[order], want_rows)
                assert np.allclose(counts[order], want_counts, rtol=0, atol=1e-12)
            again = R.bm25(terms, {**query, "ring": 1.0}, compiled=True, **common)  # kept + one new
            want = R.bm25(corpus.terms, {**query, "ring": 1.0}, **common)
            assert np.abs(again - want).max() <= 1e-12 * max(1.0, want.max())
            assert "ring" in terms.spread_cache
            assert (slow > 0).sum() > 100 if query else not slow.any()


def test_sw6_compiled_k_best_picks_the_same_rows_as_a_selection():
    """rule SW6: `kernels.k_best` gives the rows of the k best scores (a selection's set), in one
    pass over them; it leaves small arrays, mostly -inf arrays and ties past its room to
    `vectors.k_best` (None), and `top_k` then still answers."""
    rng = np.random.default_rng(59)
    scores = rng.standard_normal(109_000)
    scores[rng.random(len(scores)) < 0.3] = -np.inf  # outside the candidates
    for k in (1, 20, 300, 2000):
        got = kernels.k_best(scores, k)
        assert got is not None and len(got) == k
        assert set(got.tolist()) == set(np.argpartition(-scores, k - 1)[:k].tolist())
    assert np.array_equal(R.top_k(scores, 20, compiled=True), R.top_k(scores, 20))
    assert kernels.k_best(scores[:1000], 20) is None  # small: a selection is as quick
    hidden = np.full(len(scores), -np.inf)
    hidden[:500] = scores[:500]
    assert kernels.k_best(hidden, 20) is None  # the sample sees only -inf
    assert np.array_equal(R.top_k(hidden, 20, compiled=True), R.top_k(hidden, 20))
    flat = np.zeros(len(scores))
    assert kernels.k_best(flat, 20) is None  # every row ties at the threshold: past its room
    assert len(R.top_k(flat, 20, compiled=True)) == 20
