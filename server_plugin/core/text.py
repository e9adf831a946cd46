"""How Chronicler reads text: folding, stop words, content words, sentences, month names. Pure.

Every room asks this module for a concept (`fold`, `content_words`, `sentences`, a stop-word set,
`MONTHS`) instead of keeping a regex of its own, so that the rules live once and can grow here:
today they are written for English and other scripts separated by spaces; this is where words of
scripts without spaces (Chinese, Japanese, Korean bigrams) will be added for every caller at once.

Where two rooms read text differently on purpose (the stop-word sets, the sentence splitters),
each rule has its own name below and says what it is for. Their outputs are stored (search terms,
passage vectors, secret refs) or shown (extractive summaries, quotes), so a rule changes only
with everything that depends on it.
"""

from __future__ import annotations

import re
from typing import Iterable

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

_SEARCH_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=\S)")
_ROLEPLAY_SENTENCE_END = re.compile(r"(?<=[.!?…])[*_)\]]*\s+(?=[^a-z])|\s*\n+\s*")
_SENTENCE_END = re.compile(r"(?<=[.!?…])\s")


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
    """The offsets in `text` of the whitespace that follows each . ! ? or …, in order."""
    return [m.start() for m in _SENTENCE_END.finditer(text)]


# --- dates --------------------------------------------------------------------------------------

MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August", "September",
          "October", "November", "December")  # English, in calendar order: MONTHS[0] is January
