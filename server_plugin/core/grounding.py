"""Whether a text rests on its sources (SW7: nothing invented). Pure.

A model's lore entry may word things its own way, but the names and numbers it states must be
ones its source messages (or the entry it updates) hold: a name is a capitalised word that does
not open a sentence (and any capitalised word of a title or a trigger, which are names), a number
is a run of digits. A word is found when it occurs in the sources as a whole word, compared
casefolded. What is not found is returned, so the caller can drop the text and say why.
"""

from __future__ import annotations

import re
from typing import Iterable

from .text import fold

_WORD = re.compile(r"[^\W_]+(?:['’][^\W_]+)*")
_NUMBER = re.compile(r"\d+")
_SENTENCE_START = re.compile(r"(?:^|[.!?…:;\"“”«»()\[\]*\n-]\s*)$")
# Capitalised words that open clauses or are the product's own words, never names.
_NOT_NAMES = frozenset(
    """i i'm i’m i'll i’ll i'd i’d i've i’ve a an the and but or nor so yet then than
    he she it they we you his her its their our your my this that these those there here
    in on at of to for from by with without into over under after before when where while
    what who whom whose which why how if as not no yes all any some each every""".split())


def _words(text: str) -> set[str]:
    # Digit runs on their own too: "12" rests on "the 12th bell".
    return {fold(w) for w in _WORD.findall(text)} | set(_NUMBER.findall(text))


def names_in(text: str, *, whole: bool = False) -> list[str]:
    """The names a text states, in order, each once: capitalised words that do not open a
    sentence (`whole`: every capitalised word, for a title or a trigger)."""
    out: list[str] = []
    for match in _WORD.finditer(text):
        word = match.group(0)
        if not word[0].isupper() or fold(word) in _NOT_NAMES:
            continue
        if not whole and _SENTENCE_START.search(text[:match.start()]):
            continue
        if word not in out:
            out.append(word)
    return out


def numbers_in(text: str) -> list[str]:
    """The numbers a text states (runs of digits), each once."""
    return list(dict.fromkeys(_NUMBER.findall(text)))


def ungrounded(text: str, sources: Iterable[str], *, whole: bool = False) -> list[str]:
    """The names and numbers of `text` that none of `sources` holds as a whole word."""
    known: set[str] = set()
    for source in sources:
        known |= _words(source)
    return [w for w in names_in(text, whole=whole) + numbers_in(text)
            if not (_words(w) <= known)]
