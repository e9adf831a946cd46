"""How Chronicler reads text: folding, stop words, content words, sentences, month names. Pure.

Every room asks this module for a concept (`fold`, `content_words`, `sentences`, a stop-word set,
`MONTHS`) instead of keeping a regex of its own, so that the rules live once and can grow here:
words of scripts separated by spaces, and character bigrams of the scripts written without them
(Chinese, Japanese, Korean, Thai, Lao, Khmer, Burmese): `analyzer_terms` for search and
`match_form` / `script_without_spaces` for triggers and names (section "words of every script").

Where two rooms read text differently on purpose (the stop-word sets, the sentence splitters),
each rule has its own name below and says what it is for. Their outputs are stored (search terms,
passage vectors, secret refs) or shown (extractive summaries, quotes), so a rule changes only
with everything that depends on it.
"""

from __future__ import annotations

import re
import unicodedata
from functools import lru_cache
from typing import Iterable

import regex
import snowballstemmer

# --- folding ------------------------------------------------------------------------------------


def fold(text: str) -> str:
    """The form texts are compared (and hashed) in: casefolded, every run of whitespace one space,
    none at either end. "Ayla  IS\\nhere " and "ayla is here" fold alike."""
    return " ".join(text.casefold().split())


# --- stop words ---------------------------------------------------------------------------------
# Three lists for three uses. Merging them would change results that are stored or shown, so each
# keeps its exact contents:
# - BM25_STOP_WORDS: search terms. Function words of every length, the apostrophe-less contractions
#   the search tokenizer makes ("don't" -> "dont") and chat fillers ("oh", "yeah"). Names, numbers
#   and content words stay.
# - RELATED_STOP_WORDS and RETOLD_STOP_WORDS: for `content_words`, which only sees words of four
#   letters or more, so they hold only such words. RELATED_STOP_WORDS ranks the secrets a scene's
#   messages touch on (what a told-events job is shown); RETOLD_STOP_WORDS decides, without a model,
#   whether a sentence retells a secret, and also ignores the reflexive pronouns and a few
#   connectives, which a sentence and a secret share without one retelling the other.

BM25_STOP_WORDS = frozenset(
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

RELATED_STOP_WORDS = frozenset(
    """about above after again also been before being below between both could does doing down
    during each from further have having here into just more most once only other over same
    should some such than that their them then there these they this those through under until
    very what when where which while will with would your""".split()
)

RETOLD_STOP_WORDS = RELATED_STOP_WORDS | frozenset(
    """against among because herself himself itself myself ourselves theirs themselves whom
    yours yourself""".split()
)


# --- content words ------------------------------------------------------------------------------

_CONTENT_WORD = re.compile(r"[^\W\d_]{4,}")  # four letters or more: no digits, no underscore


def content_words(text: str, stop: frozenset[str], ignore: Iterable[str] = ()) -> set[str]:
    """The casefolded words of four letters or more in `text` that carry meaning: those not in
    `stop` (one of the stop-word sets above) nor in `ignore` (e.g. the cast's names)."""
    skip = stop | {w.casefold() for w in ignore}
    return {w for w in _CONTENT_WORD.findall(text.casefold()) if w not in skip}


# --- sentences ----------------------------------------------------------------------------------
# Three rules, side by side, because their callers cut text for different ends:
# - `sentences`: passages for search. Loose (it ends at . ! ? before whitespace, not at "…") and
#   keeps every character; its pieces are embedded and stored, so it stays as it is.
# - `roleplay_sentences`: what the no-model fallbacks quote. A sentence ends at . ! ? … (after any
#   closing emphasis or bracket) only before a character that is not a lower-case letter, so
#   "2 a.m. because" goes on; a line break always ends one; emphasis marks around a piece go.
# - `sentence_ends`: where a line may be cut short at a sentence end (any . ! ? … before
#   whitespace); positions, not pieces, because the caller cuts the text it already holds.

# Every rule also ends a sentence at the Devanagari danda (। ॥) and the Arabic full stop and
# question mark (۔ ؟) before whitespace, and at the CJK full stops 。！？ with or without a space
# after them (Chinese and Japanese put none), after any closing quote or bracket (。」 ends there).
_STOPS = ".!?।॥۔؟"
_CJK_STOPS = "。！？"
_CLOSERS = r"」』”’）)］\]"
# Whitespace as Python's str.isspace() and `re` read it: the `regex` module's \s leaves out the
# separators \x1c-\x1f, and the passages cut before it (stored with their vectors) counted them.
_WS, _NWS = r"[\s\x1c-\x1f]", r"[^\s\x1c-\x1f]"
_CJK_END = (rf"(?<=[{_CJK_STOPS}])(?![{_CLOSERS}{_CJK_STOPS}]){_WS}*(?={_NWS})"
            rf"|(?<=[{_CJK_STOPS}][{_CLOSERS}])(?![{_CLOSERS}]){_WS}*(?={_NWS})")
_SEARCH_SENTENCE_END = regex.compile(rf"(?<=[{_STOPS}]){_WS}+(?={_NWS})|{_CJK_END}")
_ROLEPLAY_SENTENCE_END = regex.compile(rf"(?<=[{_STOPS}…])[*_)\]]*{_WS}+(?=[^a-z])|{_WS}*\n+{_WS}*|{_CJK_END}")
_SENTENCE_END = regex.compile(rf"(?<=[{_STOPS}…]){_WS}|{_CJK_END}")


def sentences(text: str, min_chars: int = 12) -> list[str]:
    """Split `text` into sentences; fragments shorter than `min_chars` join the previous one."""
    parts: list[str] = []
    for piece in _SEARCH_SENTENCE_END.split(text.strip()):
        if parts and len(piece) < min_chars:
            parts[-1] += " " + piece
        elif piece:
            parts.append(piece)
    return parts


def _unmarked(piece: str) -> str:
    return piece.strip().strip("*_").strip()


def roleplay_sentences(text: str) -> list[str]:
    """The sentences of a roleplay message, stripped of emphasis marks (see the rules above)."""
    parts = (_unmarked(s) for s in _ROLEPLAY_SENTENCE_END.split(text))
    # A bare quotation mark or "said." left between two speeches is not a sentence.
    return [s for s in parts if sum(ch.isalnum() for ch in s) >= 2]


def sentence_ends(text: str) -> list[int]:
    """The offsets in `text` of the whitespace that follows each . ! ? … । ۔ ؟ (or of the character
    after 。！？ and their closing quote), in order."""
    return [m.start() for m in _SENTENCE_END.finditer(text)]


# --- dates --------------------------------------------------------------------------------------

MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August", "September",
          "October", "November", "December")  # English, in calendar order: MONTHS[0] is January


# --- words of every script ----------------------------------------------------------------------
# One analyzer for every user of words. Texts are first brought to a match form: NFKC (full-width
# Latin "ＡＢＣ" is "ABC", half-width Katakana "ｶﾀｶﾅ" is "カタカナ"), casefolded, and Traditional
# Chinese written as Simplified (OpenCC's table, when the package is installed), so "黑塔" and a
# Traditional "黑塔" or "ＢＬＡＣＫ" and "black" are one word. Then:
# - scripts written with spaces (Latin, Cyrillic, Greek, Arabic, Devanagari, ...) give words:
#   letters, marks and digits, inner apostrophes joined ("don't" -> "dont"), a possessive 's dropped;
# - scripts written without spaces give overlapping bigrams of their runs: Han with Hiragana and
#   Katakana (one run: Japanese mixes them inside a word), Hangul (Korean has spaces, but particles
#   stick to the noun: "흑탑이" holds the bigram "흑탑"), and Thai, Lao, Khmer and Burmese, whose
#   bigrams are of grapheme clusters (a consonant with its vowel and tone marks), not code points.
#   A run of one character is its own unigram. A dictionary segmenter (e.g. a Thai word list) would
#   give real words instead: fewer false bigram matches across word edges and better BM25 weights,
#   at the cost of a dictionary per language.
# Users choose what they need: BM25 drops stop words and stems (Snowball: English for Latin script,
# as the ranking was tuned; Russian, Greek, Arabic and Hindi stemmers for their scripts); trigger
# and name matching use `match_form` and `script_without_spaces` without any stemming.

ANALYZER_VERSION = 2
"""Stored with every row's BM25 terms: rows of an older version are re-analysed in the background.
(1: English-only words; 2: every script as above.)"""

try:  # Traditional -> Simplified; without the package Chinese still works, unfolded.
    import opencc as _opencc

    _T2S = _opencc.OpenCC("t2s")
except Exception:  # pragma: no cover - the package is a dependency; a broken install degrades
    _T2S = None

_NO_SPACE_CJK = r"\p{Han}\p{Hiragana}\p{Katakana}\u30fc\u3005-\u3007"  # ー and 々〆〇 are "Common"
_NO_SPACE_SCRIPTS = (_NO_SPACE_CJK, r"\p{Hangul}", r"\p{Thai}", r"\p{Lao}", r"\p{Khmer}", r"\p{Myanmar}")
_NO_SPACE_ANY = "".join(_NO_SPACE_SCRIPTS)
_HAN = regex.compile(r"[\p{Han}]")
_WORD_START = rf"[[\p{{L}}\p{{N}}]--[{_NO_SPACE_ANY}]]"  # a mark alone (U+FE0F after an emoji) is no word
_WORD_CHAR = rf"[[\p{{L}}\p{{M}}\p{{N}}]--[{_NO_SPACE_ANY}]]"
_WORD_PART = rf"{_WORD_START}{_WORD_CHAR}*"
_TOKEN = regex.compile(
    "|".join(f"(?P<r{i}>[{chars}]+)" for i, chars in enumerate(_NO_SPACE_SCRIPTS))
    + rf"|(?P<word>{_WORD_PART}(?:['’]{_WORD_PART})*)",
    regex.V1,
)
_GRAPHEME_RUNS = {"r2", "r3", "r4", "r5"}  # Thai, Lao, Khmer, Burmese: marks stay with their base
_GRAPHEME = regex.compile(r"\P{M}\p{M}*")  # a base with its marks (\\X leaves Burmese ာ alone)
_NO_SPACE_CHAR = regex.compile(f"[{_NO_SPACE_ANY}]", regex.V1)
_STEMMER_BY_SCRIPT = (
    (regex.compile(r"\p{Cyrillic}"), "russian"),
    (regex.compile(r"\p{Greek}"), "greek"),
    (regex.compile(r"\p{Arabic}"), "arabic"),
    (regex.compile(r"\p{Devanagari}"), "hindi"),
)
_STEMMERS = {name: snowballstemmer.stemmer(name) for name in ("english", "russian", "greek", "arabic", "hindi")}
_ASCII_WORD = re.compile(r"[a-z0-9]+")


@lru_cache(maxsize=8192)
def match_form(text: str) -> str:
    """`text` as words are compared: NFKC, casefolded, Traditional Chinese as Simplified. Lengths
    may change (NFKC "ﬁ" -> "fi"), so use it to test, not to cut the original."""
    return fold_width(text).casefold()


def fold_width(text: str) -> str:
    """NFKC and Traditional -> Simplified Chinese, without casefolding (for case-sensitive triggers)."""
    if not text.isascii():
        text = unicodedata.normalize("NFKC", text)
        if _T2S is not None and _HAN.search(text):
            text = _T2S.convert(text)
    return text


def script_without_spaces(text: str) -> bool:
    """True when `text` holds a character of a script written without spaces between words (Han,
    Kana, Hangul, Thai, Lao, Khmer, Burmese): such a trigger or name matches inside words."""
    return bool(_NO_SPACE_CHAR.search(text))


def _bigrams(run: str, graphemes: bool) -> list[str]:
    units = _GRAPHEME.findall(run) if graphemes else list(run)
    if len(units) == 1:
        return units
    return [a + b for a, b in zip(units, units[1:])]


def analyzer_words(text: str) -> list[str]:
    """The words of `text` in match form, in order: words of spaced scripts (apostrophes removed,
    possessive 's dropped) and bigrams (unigrams for one-character runs) of scripts without spaces."""
    folded = match_form(text) if len(text) < 512 else fold_width(text).casefold()
    out: list[str] = []
    for m in _TOKEN.finditer(folded):
        kind = m.lastgroup
        if kind == "word":
            word = m.group()
            if word.endswith(("'s", "’s")):
                word = word[:-2]
            word = word.replace("'", "").replace("’", "")
            if word:
                out.append(word)
        else:
            out.extend(_bigrams(m.group(), kind in _GRAPHEME_RUNS))
    return out


@lru_cache(maxsize=200_000)
def stem(word: str) -> str:
    """The Snowball stem of one analysed word, by its script (cached: the vocabulary is small).
    Bigrams of scripts without spaces and words of scripts without a stemmer stay as they are."""
    if _ASCII_WORD.fullmatch(word) or word.isascii():
        return _STEMMERS["english"].stemWord(word)
    if _NO_SPACE_CHAR.search(word):
        return word
    for pattern, name in _STEMMER_BY_SCRIPT:
        if pattern.search(word):
            return _STEMMERS[name].stemWord(word)
    if regex.fullmatch(r"[\p{Latin}\p{N}]+", word):
        return _STEMMERS["english"].stemWord(word)
    return word


def analyzer_terms(text: str, *, stems: bool = True, stop: frozenset[str] = frozenset()) -> list[str]:
    """Terms of `text` for an index: `analyzer_words` without the words in `stop`, each stemmed
    when `stems` (BM25: stems and BM25_STOP_WORDS; exact matchers: neither)."""
    words = [w for w in analyzer_words(text) if w not in stop]
    return [stem(w) for w in words] if stems else words


def share_without_spaces(text: str) -> float:
    """The share of `text`'s analysed words that are bigrams of scripts without spaces (0 for an
    English sentence, 1 for a Chinese one): how much of it an English-only embedder cannot read."""
    found = analyzer_words(text)
    if not found:
        return 0.0
    return sum(1 for w in found if _NO_SPACE_CHAR.search(w)) / len(found)
