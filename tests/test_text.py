"""How text is read (server_plugin/core/text.py): fold, stop words, content words, sentences, months.

The rules used to be copied across several modules. The copies are kept below, as they stood, as
references: the one module must give what each of them gave, for every input.
"""

from __future__ import annotations

import hashlib
import re
import sys

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from server_plugin.core import text as T
from server_plugin.core.triggers import normalize
from server_plugin.retrieval import ranking as R
from server_plugin.retrieval.docs import day_label
from server_plugin.retrieval.ranking import dates
from server_plugin.retrieval.ranking import text as ranking_text
from server_plugin.retrieval.visibility import secret_ref

# --- the copies the module replaced, as they stood ----------------------------------------------

OLD_BM25_STOP = frozenset(
    """a about above after again against all am an and any are as at be because been before
    being below between both but by can could did do does doing down during each few for from
    further had has have having he her here hers herself him himself his how i if in into is it
    its itself just me more most my myself no nor not now of off on once only or other our ours
    ourselves out over own same she should so some such than that the their theirs them
    themselves then there these they this those through to too under until up very was we were
    what when where which while who whom why will with would you your yours yourself yourselves
    im ive id ill youre youve theyre thats dont didnt doesnt isnt wasnt cant wont also really
    oh yeah hey hi wow""".split()
)
OLD_VISIBILITY_STOP = frozenset(
    """about above after again also been before being below between both could does
doing down during each from further have having here into just more most once only other over
same should some such than that their them then there these they this those through under until
very what when where which while will with would your""".split())
OLD_TOLD_STOP = set("""about above after again against also among because been before being below between
both could does doing down during each from further have having here herself himself into itself
just more most myself once only other ourselves over same should some such than that their theirs
them themselves then there these they this those through under until very what when where which
while whom will with would your yours yourself""".split())
OLD_TEMPORAL_WORDS = frozenset(
    """yesterday today tonight tomorrow ago last next recently lately weekend week weeks month
    months year years morning evening afternoon night earlier later soon since before after
    monday tuesday wednesday thursday friday saturday sunday january february march april may june
    july august september october november december christmas birthday anniversary summer winter
    spring autumn fall""".split()
)
OLD_MONTH_RE = ("(january|february|march|april|may|june|july|august|september|october|november|december"
                "|jan|feb|mar|apr|may|jun|jul|aug|sep|oct|nov|dec)\\.?")
_OLD_SPACES = re.compile(r"\s+")
_OLD_WORD = re.compile(r"[^\W\d_]{4,}")
_OLD_SEARCH_SENTENCE = re.compile(r"(?<=[.!?])\s+(?=\S)")
_OLD_ROLEPLAY_END = re.compile(r"(?<=[.!?…])[*_)\]]*\s+(?=[^a-z])|\s*\n+\s*")
_OLD_SHEET_END = re.compile(r"(?<=[.!?…])\s")


def old_fold(text: str) -> str:  # notes, memories, deep_memory, visibility.secret_ref
    return " ".join(text.casefold().split())


def old_sheet_fold(text: str) -> str:  # sheets: names collapsed, then casefolded
    return " ".join(text.split()).casefold()


def old_trigger_fold(text: str) -> str:  # triggers.normalize
    return _OLD_SPACES.sub(" ", text).strip().casefold()


def old_visibility_words(text: str, ignore=()) -> set[str]:
    skip = {w.casefold() for w in ignore} | OLD_VISIBILITY_STOP
    return {w for w in _OLD_WORD.findall(text.casefold()) if w not in skip}


def old_told_words(text: str) -> set[str]:
    return {w for w in re.findall(r"[^\W\d_]{4,}", text.casefold()) if w not in OLD_TOLD_STOP}


def old_search_sentences(text: str, min_chars: int = 12) -> list[str]:
    parts: list[str] = []
    for piece in _OLD_SEARCH_SENTENCE.split(text.strip()):
        if parts and len(piece) < min_chars:
            parts[-1] += " " + piece
        elif piece:
            parts.append(piece)
    return parts


def old_roleplay_sentences(text: str) -> list[str]:
    parts = (s.strip().strip("*_").strip() for s in _OLD_ROLEPLAY_END.split(text))
    return [s for s in parts if sum(ch.isalnum() for ch in s) >= 2]


def old_sheet_ends(text: str) -> list[int]:
    return [m.start() for m in _OLD_SHEET_END.finditer(text)]


# --- inputs: text that exercises every branch ---------------------------------------------------

# Whitespace of every kind, sentence marks, emphasis and brackets, case pairs that casefold
# changes ("ß" -> "ss", "ﬁ" -> "fi", final sigma), digits, underscores, apostrophes.
PIECES = ["a", "b", "Z", "Q", "é", "ß", "ﬁ", "Σ", "ς", "İ", "7", "_", "'", "’", " ", "  ", "\n",
          "\n\n", "\t", "\x1c", "\u00a0", "\u2028", "\u3000", ".", "!", "?", "…", "*", "_", ")",
          "]", '"', "“", "”", ",", "a.m.", "Mr.", "2", "Ayla", "AYLA", "said."]
WORDS = sorted(OLD_BM25_STOP | OLD_TOLD_STOP) + ["secret", "Secrets", "dragon", "Straße", "naïve",
                                                 "abc", "abcd", "x2yz", "four", "ÉCOLE", "treasure"]
MARKS = ["", "", ".", "!", "?", "…", ".*", "!_", "…)", ".]", '."', ",", "*"]
GAPS = [" ", " ", "  ", "\n", " \n ", "\t", "\u00a0", "", "*"]
pieces = st.lists(st.sampled_from(PIECES + WORDS), max_size=40).map("".join)
sentences_of_words = st.lists(st.sampled_from(WORDS), max_size=30).map(" ".join)
# Prose: words with sentence marks and gaps after them, so that every rule has ends to find.
prose = st.lists(st.tuples(st.sampled_from(WORDS + ["été", "über", "Éa", "«", "2"]),
                           st.sampled_from(MARKS), st.sampled_from(GAPS)),
                 max_size=25).map(lambda parts: "".join(w + m + g for w, m, g in parts))
texts = st.one_of(st.text(max_size=80), pieces, sentences_of_words, prose)


# --- fold -----------------------------------------------------------------------------------------

@settings(max_examples=400, deadline=None)
@given(texts)
def test_fold_is_what_every_copy_gave(text):
    """The three spellings of the fold (casefold then collapse, collapse then casefold, a \\s+
    regex and strip) agree with `fold` for every text."""
    assert T.fold(text) == old_fold(text) == old_sheet_fold(text) == old_trigger_fold(text)
    # Triggers compare in match form (NFKC, Traditional as Simplified) since every script is read:
    # the fold of that form, and the fold itself wherever NFKC leaves the text as it is.
    assert normalize(text) == T.fold(T.match_form(text))
    if T.unicodedata.is_normalized("NFKC", text) and not T.script_without_spaces(text):
        assert normalize(text) == T.fold(text)


def test_fold_orders_agree_for_every_character():
    """Why the spellings agree for all texts, not only those tried: `str.split()` and the regex
    `\\s` see the same whitespace, and casefolding never makes or unmakes whitespace."""
    chars = [chr(i) for i in range(sys.maxunicode + 1)]
    space = re.compile(r"\s")
    assert all(c.isspace() == bool(space.match(c)) for c in chars)
    assert all(c.casefold() == c for c in chars if c.isspace())
    assert not any(x.isspace() for c in chars if not c.isspace() for x in c.casefold())


def test_fold_examples():
    """Casefolded (not just lower-cased), whitespace runs as one space, nothing at either end."""
    assert T.fold("  Ayla  IS\n\tthe\u00a0Queen ") == "ayla is the queen"
    assert T.fold("STRASSE") == T.fold("Straße") == "strasse"
    assert T.fold("") == T.fold(" \n ") == ""


def test_secret_refs_hash_as_before():
    """rule SW9b: a sheet secret's ref is a hash of its folded text; stored refs still match."""
    assert secret_ref("ayla", "Ayla  is\nthe QUEEN’s daughter. ") == "0cef2998f6f7:ayla"
    assert secret_ref("tom", "Straße ﬁre") == "fe73804e1990:tom"
    text = "She  hid\nthe KEY."
    assert secret_ref("x", text) == hashlib.sha1(old_fold(text).encode()).hexdigest()[:12] + ":x"


# --- stop words and content words -----------------------------------------------------------------

def test_stop_word_sets_keep_their_contents():
    """Each list is the one its room had; the retelling list is the related list and 13 more."""
    assert T.BM25_STOP_WORDS == OLD_BM25_STOP
    assert T.RELATED_STOP_WORDS == OLD_VISIBILITY_STOP
    assert T.RETOLD_STOP_WORDS == OLD_TOLD_STOP
    assert len(T.RETOLD_STOP_WORDS - T.RELATED_STOP_WORDS) == 13
    assert all(len(w) >= 4 for w in T.RELATED_STOP_WORDS | T.RETOLD_STOP_WORDS)


@settings(max_examples=400, deadline=None)
@given(texts, st.lists(st.sampled_from(["Ayla", "AYLA", "Old Tom", "secret", "Straße", "x"]), max_size=3))
def test_content_words_are_what_both_copies_gave(text, ignore):
    """rule SW9b: the related secrets (visibility's copy) and the retelling found without a model
    (the told task's copy) see the same words as before."""
    assert T.content_words(text, T.RELATED_STOP_WORDS, ignore) == old_visibility_words(text, ignore)
    assert T.content_words(text, T.RELATED_STOP_WORDS) == old_visibility_words(text)
    assert T.content_words(text, T.RETOLD_STOP_WORDS) == old_told_words(text)


def test_content_words_examples():
    """Four letters or more, no digits or underscores, casefolded; stop words and `ignore` go."""
    said = "Ayla told THEM about the dragon's hoard, x2yz snake_case Straße, because."
    assert T.content_words(said, T.RELATED_STOP_WORDS, ["AYLA"]) == {
        "told", "dragon", "hoard", "snake", "case", "strasse", "because"}
    assert "because" not in T.content_words(said, T.RETOLD_STOP_WORDS)


def test_bm25_terms_still_skip_the_stop_words():
    """rule SW6: search terms are the stems of the words not in the BM25 stop list."""
    assert R.analyze("I don't think the dragons were really there") == {"think": 1, "dragon": 1}


# --- sentences ------------------------------------------------------------------------------------
NEW_STOPS = set("。！？।॥۔؟")


def test_sentences_end_at_cjk_devanagari_and_arabic_full_stops():
    """rule LG1: 。！？ end a sentence with no space after them (after a closing quote when one
    follows); the danda । and the Arabic ۔ ؟ before a space."""
    zh = "我们明天去黑塔看看吧。听说塔顶藏着宝藏！你去吗？他说：「好的。」然后走了。"
    expected = ["我们明天去黑塔看看吧。", "听说塔顶藏着宝藏！", "你去吗？", "他说：「好的。」", "然后走了。"]
    assert T.sentences(zh, min_chars=0) == expected
    assert T.roleplay_sentences(zh) == expected
    assert [zh[:i] for i in T.sentence_ends(zh)][:2] == ["我们明天去黑塔看看吧。", "我们明天去黑塔看看吧。听说塔顶藏着宝藏！"]
    hi = "यह एक वाक्य है। यह दूसरा है॥ ठीक है؟ نعم۔ لا"
    assert T.sentences(hi, min_chars=0) == ["यह एक वाक्य है।", "यह दूसरा है॥", "ठीक है؟", "نعم۔", "لا"]
    assert T.roleplay_sentences(hi) == ["यह एक वाक्य है।", "यह दूसरा है॥", "ठीक है؟", "نعم۔", "لا"]
    assert T.sentences("ja: 行こう。いいね！", min_chars=0) == ["ja: 行こう。", "いいね！"]


@settings(max_examples=400, deadline=None)
@given(texts, st.integers(min_value=0, max_value=30))
def test_search_sentences_are_what_ranking_gave(text, min_chars):
    """rule SW6: passages are cut exactly as before (their vectors are stored), in every text
    without the full stops added since (。！？ । ॥ ۔ ؟)."""
    assume(not NEW_STOPS & set(text))
    assert T.sentences(text, min_chars) == old_search_sentences(text, min_chars)
    assert T.sentences(text) == old_search_sentences(text) == R.sentences(text)


@settings(max_examples=400, deadline=None)
@given(texts)
def test_roleplay_sentences_are_what_the_fallbacks_gave(text):
    """The no-model fallbacks quote the same sentences as before (texts without the new stops)."""
    assume(not NEW_STOPS & set(text))
    assert T.roleplay_sentences(text) == old_roleplay_sentences(text)


@settings(max_examples=400, deadline=None)
@given(texts)
def test_sentence_ends_are_what_sheets_gave(text):
    """A sheet's quoted line is cut at the same places as before (texts without the new stops)."""
    assume(not NEW_STOPS & set(text))
    assert T.sentence_ends(text) == old_sheet_ends(text)


def test_the_three_sentence_rules_differ_as_documented():
    """The search splitter ends at any . ! ? before whitespace (not at "…", not at a line break)
    and merges short fragments into the one before; the roleplay splitter goes on before a
    lower-case letter, ends at a line break and drops emphasis marks."""
    text = "*She waits…* Then at 2 a.m. because\nof you. Yes. It is late."
    assert T.sentences(text) == ["*She waits…* Then at 2 a.m.", "because\nof you. Yes. It is late."]
    assert T.roleplay_sentences(text) == ["She waits…", "Then at 2 a.m. because", "of you.",
                                          "Yes.", "It is late."]
    assert T.sentence_ends("Go. Now… ok!") == [3, 8]
    long_enough = "It was late… and the fire was out."
    assert T.sentences(long_enough, min_chars=0) == [long_enough]
    assert T.roleplay_sentences("It was late… The fire was out.") == ["It was late…", "The fire was out."]


# --- month names ----------------------------------------------------------------------------------

def test_month_names_serve_labels_query_dates_and_cues():
    """rule SW6: the day label of a message, the dates a query names and the temporal cues all
    read the one list of month names, as before."""
    assert T.MONTHS[0] == "January" and T.MONTHS[11] == "December" and len(T.MONTHS) == 12
    assert day_label("2023-05-08T13:56:00Z") == "8 May 2023"
    assert dates._MONTH_RE == OLD_MONTH_RE
    assert dates._MONTHS == {m: i for i, m in enumerate(
        "january february march april may june july august september october november december".split(),
        start=1)}
    assert ranking_text._TEMPORAL_WORDS == OLD_TEMPORAL_WORDS
    day = R.query_dates("on 7 September 2023")
    assert len(day) == 1 and day[0][0] == day[0][1]
    assert R.query_dates("what happened on 7 Sep. 2023?") == day
