"""The two-pass dense scan (rule SW6): an int4 (or int8) copy of the vectors scores every row
roughly, then ranking rescores its best rows exactly (ranking/refine.py, vectors.Int4Rows and
Int8Rows)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from server_plugin.retrieval import ranking as R
from server_plugin.retrieval.ranking import refine, score
from server_plugin.retrieval.ranking import vectors as V
from server_plugin.retrieval.search import params_of
from server_plugin.settings import defaults

DIM = 384
NOISE = 1.5
pytestmark = pytest.mark.skipif(not V.int8_ready(DIM), reason="this torch has no int8 kernel")
KINDS = [pytest.param("int4", marks=pytest.mark.skipif(not V.int4_ready(DIM), reason="no int4 kernel")), "int8"]


def _unit(rows: np.ndarray) -> np.ndarray:
    return (rows / np.linalg.norm(rows, axis=-1, keepdims=True)).astype(np.float32)


def test_sw6_int8_copy_scores_within_3e_3_and_copies_only_new_rows():
    """rule SW6: the int8 copy's products are within 3e-3 of the exact cosines (a first pass,
    never an answer); `sync` quantizes only the rows added since its last call, and a copy made
    in steps equals one made at once."""
    rng = np.random.default_rng(5)
    rows = _unit(rng.standard_normal((3000, DIM))).astype(np.float16)
    query = _unit(rows[42].astype(np.float32) + 0.2 * rng.standard_normal(DIM))
    exact = rows.astype(np.float64) @ query.astype(np.float64)
    stepwise, whole = V.Int8Rows(DIM), V.Int8Rows(DIM)
    stepwise.sync(rows, 10)
    stepwise.sync(rows, 2000)
    q, bits = stepwise.sync(rows, 3000)
    q1, bits1 = whole.sync(rows, 3000)
    assert np.array_equal(q, q1) and np.array_equal(bits, bits1) and q.shape == (3000, DIM)
    got = V.int8_dot(q, bits, query)
    assert got.dtype == np.float32 and np.abs(got - exact).max() < 3e-3
    assert np.abs(got - exact).max() > 1e-5  # approximate indeed: what the second pass is for
    assert int(np.argmax(got)) == 42
    # the scales are bfloat16 values: what the kernel reads is what was meant
    scale = (bits.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    assert np.abs(q.astype(np.float32) * scale[:, None] - rows.astype(np.float32)).max() <= scale.max()


def test_sw6_int4_copy_scores_within_2e_2_packs_as_torch_and_copies_only_new_rows():
    """rule SW6: the int4 copy's products are within 2e-2 of the exact cosines (about 5e-3 a
    score: a first pass, never an answer) and are the products of the rows `dequantize4` reads
    back (the packed layout is the one torch's kernel reads); a copy made in steps — the last
    partial block of 64 rows packed again as rows come — equals one made at once."""
    if not V.int4_ready(DIM):
        pytest.skip("this torch has no int4 kernel")
    rng = np.random.default_rng(6)
    rows = _unit(rng.standard_normal((3001, DIM))).astype(np.float16)
    query = _unit(rows[42].astype(np.float32) + 0.2 * rng.standard_normal(DIM))
    exact = rows.astype(np.float64) @ query.astype(np.float64)
    stepwise, whole = V.Int4Rows(DIM), V.Int4Rows(DIM)
    for n in (10, 64, 70, 2000, 3001):
        view = stepwise.sync(rows, n)
        assert view.n == n and len(view.packed) == -(-n // 64) * 64 and view.scale_zero.shape[1] == len(view.packed)
    once = whole.sync(rows, 3001)
    assert np.array_equal(view.packed, once.packed) and np.array_equal(view.scale_zero, once.scale_zero)
    assert stepwise.sync(rows, 3001) is view  # nothing new: nothing packed again
    got = V.int4_dot(view, query)
    assert got.dtype == np.float32 and got.shape == (3001,)
    assert np.abs(got - exact).max() < 2e-2 and np.abs(got - exact).std() < 8e-3
    assert np.abs(got - V.dequantize4(view) @ query).max() < 8e-3  # the kernel's bfloat16 output
    assert int(np.argmax(got)) == 42


def _campaign(rng: np.random.Generator, n: int = 3000, session: int = 30, kind: str = "int8"):
    """A corpus of `n` messages in sessions of `session`, a few hundred with passages, words
    from a small vocabulary and vectors around a few topics (so that many rows score close)."""
    words = ["sword", "river", "key", "dragon", "bread", "storm", "ring", "map", "salt", "tower"]
    own = [{str(w): int(rng.integers(1, 3)) for w in rng.choice(words, 3, replace=False)} for _ in range(n)]
    topics = rng.standard_normal((6, DIM))
    vectors = _unit(topics[rng.integers(0, 6, n)] + NOISE * rng.standard_normal((n, DIM))).astype(np.float16)
    gids = R.group_ids([i // session for i in range(n)])
    nbr = R.neighbour_index(gids)
    owners = np.sort(rng.choice(n, 400, replace=False).repeat(3))
    passages = _unit(vectors[owners].astype(np.float32) + rng.standard_normal((len(owners), DIM))).astype(np.float16)
    corpus = R.Corpus(
        ids=[str(i) for i in range(n)], terms=R.TermIndex.build(own), vectors=vectors, gids=gids,
        speakers=["a" if i % 3 else "b" for i in range(n)], neighbours=nbr,
        win1_norm=R.window_norms(vectors.astype(np.float32), nbr, 1),
        win2_norm=R.window_norms(vectors.astype(np.float32), nbr, 2),
        sent_vectors=passages, sent_owner=owners,
        temporal=rng.integers(0, 3, n).astype(float), content_len=rng.integers(1, 30, n).astype(float))
    items, parts = V.coarse_copies(kind, DIM)
    coarse = replace(corpus, coarse=items.sync(vectors, n), coarse_sent=parts.sync(passages, len(passages)))
    return corpus, coarse, topics


def test_sw6_the_int4_first_pass_spreads_are_corrected_for_its_rounding():
    """rule SW6: over the int4 copy, the spreads the second pass fuses with are the first
    pass's less the variance its rounding adds (`first_pass_noise`), which comes within a fifth
    of that variance as measured; the int8 copy (ten times more precise) is left as it is."""
    params = params_of(defaults())
    _, int8, topics8 = _campaign(np.random.default_rng(31), n=600, kind="int8")
    assert refine.first_pass_noise(int8, _unit(topics8[0]), params, None) == {}
    if not V.int4_ready(DIM):  # the live index makes an int8 copy there (LiveIndex.settle_first_pass)
        pytest.skip("this torch's int4 kernel reads another layout on this CPU")
    rng = np.random.default_rng(31)
    corpus, coarse, topics = _campaign(rng, n=20000, kind="int4")
    mask = np.ones(len(corpus), dtype=bool)
    mask[rng.choice(len(corpus), 500, replace=False)] = False
    for t in range(3):
        vector = _unit(topics[t] + 2.0 * rng.standard_normal(DIM))
        exact = score.dense_channels(corpus, vector, params)
        rough = score.dense_channels(coarse, vector, params, coarse=True)
        noise = refine.first_pass_noise(coarse, vector, params, mask)
        assert set(noise) == set(exact)
        for name in exact:
            added = float(np.var((rough[name] - exact[name])[mask]))
            assert abs(noise[name] - added) < 0.2 * added, name


def test_sw6_rescoring_gives_each_row_its_exact_channels_windows_passages_and_session():
    """rule SW6: the second pass recomputes a row's own cosine, its ±1 / ±2 windows (from its
    neighbours' exact cosines), its best passage and its session's best exactly: handed the
    exact ranking's own channels and statistics, it gives back the exact scores of the rows it
    rescores, and leaves every other row as it was."""
    rng = np.random.default_rng(29)
    corpus, coarse, topics = _campaign(rng)
    params = replace(params_of(defaults()), refine_rows=150)
    mask = np.ones(len(corpus), dtype=bool)
    mask[rng.choice(len(corpus), 300, replace=False)] = False
    q = R.Query("the salt key", {"salt": 1.0, "key": 1.0}, _unit(topics[1] + rng.standard_normal(DIM)),
                named=("b",))
    exact = R.rank(corpus, q, replace(params, refine_rows=0), mask)
    channels = R.channel_scores(corpus, q, params, mask)
    stats: dict = {}
    priors = R.text_side(corpus, q, params, mask).priors
    fused = R.fuse(channels, params.channel_weights(), mask, stats) + priors
    best = R.group_max(fused, corpus.gids, mask)
    session = (float(best[mask].mean()), float(best[mask].std()))
    # the first pass's own (rough) channels, where the second pass must not read them
    rough = {name: values + (rng.standard_normal(len(values)) * 0.01 if name.startswith("dense") else 0)
             for name, values in channels.items()}
    rough["dense"] = channels["dense"]  # read for rows whose neighbours it does not rescore
    start = np.where(np.isneginf(exact), -np.inf, exact + rng.standard_normal(len(exact)) * 1e-9)
    got = refine.rescored(coarse, q.vector, params, start, refine.Pass(rough, stats, priors, fused, session, mask))
    top = R.top_k(start, 150)  # the rows it rescores
    assert np.allclose(got[top], exact[top], rtol=0, atol=1e-6)
    others = np.setdiff1d(np.arange(len(got)), top)
    assert np.array_equal(got[others], start[others])


@pytest.mark.parametrize("kind", KINDS)
def test_sw6_two_passes_keep_the_exact_order_at_the_top(kind):
    """rule SW6: ranked in two passes, the first 50 rows are the exact ranking's, in its order
    (over the int4 copy: the first 10 in order; rows further down may swap near ties, as the
    spreads of 3,000 rows are corrected for the copy's rounding only on average); the rescored
    rows' scores move only by the first pass's statistics (well under the first pass's own
    error, which rows past them keep); a viewer's hidden rows stay -inf."""
    in_order, moves = {"int8": (50, 2e-3), "int4": (10, 1e-2)}[kind]
    rng = np.random.default_rng(17)
    corpus, coarse, topics = _campaign(rng, kind=kind)
    exact_params = replace(params_of(defaults()), refine_rows=0)
    two_params = replace(exact_params, refine_rows=200)
    mask = np.ones(len(corpus), dtype=bool)
    mask[rng.choice(len(corpus), 300, replace=False)] = False
    for t in range(6):
        q = R.Query("the salt key", {"salt": 1.0, "key": 1.0},
                    _unit(topics[t] + 2.0 * rng.standard_normal(DIM)), named=("b",) if t % 2 else ())
        exact = R.rank(corpus, q, exact_params, mask)
        two = R.rank(coarse, q, two_params, mask)
        assert np.array_equal(np.isneginf(two), ~mask)
        assert set(R.top_k(two, 50)) == set(R.top_k(exact, 50))
        assert list(R.top_k(two, in_order)) == list(R.top_k(exact, in_order))
        top = R.top_k(two, 200)
        rest = np.setdiff1d(np.flatnonzero(mask), top)
        moved = np.abs(two[top] - exact[top])
        assert np.median(moved) < moves < np.abs(two[rest] - exact[rest]).max()


@pytest.mark.parametrize("kind", KINDS)
def test_sw6_two_passes_need_a_copy_and_a_share_of_rows(kind):
    """rule SW6: without an int4 or int8 copy, with `refine_rows` 0, or with no more candidates than
    `refine_rows`, every row is scored exactly: the same scores to the bit as the exact ranking."""
    rng = np.random.default_rng(23)
    corpus, coarse, topics = _campaign(rng, n=600, kind=kind)
    exact_params = replace(params_of(defaults()), refine_rows=0)
    q = R.Query("storm", {"storm": 1.0}, _unit(topics[0] + rng.standard_normal(DIM)))
    exact = R.rank(corpus, q, exact_params)
    assert np.array_equal(R.rank(coarse, q, exact_params), exact)
    assert np.array_equal(R.rank(corpus, q, replace(exact_params, refine_rows=300)), exact)
    assert np.array_equal(R.rank(coarse, q, replace(exact_params, refine_rows=600)), exact)
    assert not np.array_equal(R.rank(coarse, q, replace(exact_params, refine_rows=599)), exact)
