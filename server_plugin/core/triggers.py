"""Whole-word trigger matching, the story-card scan window (QS6) and who is present (SW1).

Pure helpers: the stdlib and `core.text` only, no database, no clock. `assemble.py` uses them for
story cards; `context.py` uses `present_characters` to decide whose sheets to load before it calls
the assembler.

Matching rule (one rule for lore triggers and character names): case-insensitive, whitespace runs
count as one space, and the trigger must stand as whole words — not preceded or followed by a
letter, digit or underscore. So "cat" fires on "Cat!" and "the cat's tail" but not on
"concatenate" or "cats"; "dark lord" fires on "the Dark\nLord"; "C++" fires on "I like C++.".
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Iterable, Sequence

from .text import fold


@lru_cache(maxsize=2048)  # the live window's texts come back every turn
def normalize(text: str) -> str:
    """The form both sides are matched in: `core.text.fold` (casefolded, whitespace runs
    collapsed to one space)."""
    return fold(text)


@lru_cache(maxsize=16384)
def _whole_word(normalized_trigger: str) -> re.Pattern[str]:
    # Lookarounds rather than \b: \b fails for triggers that start or end with punctuation ("C++").
    return re.compile(r"(?<!\w)" + re.escape(normalized_trigger) + r"(?!\w)")


_WORD = re.compile(r"\w+")


@lru_cache(maxsize=16384)
def _normalized_trigger(trigger: str) -> str:
    return normalize(trigger)


@lru_cache(maxsize=2048)
def _words(normalized_text: str) -> frozenset[str]:
    """The distinct words of a normalized text (cached: the live window returns every turn)."""
    return frozenset(_WORD.findall(normalized_text))


class ScanWindow:
    """Texts to search for triggers, newest first (index 0 is the latest action)."""

    def __init__(self, texts: Sequence[str]) -> None:
        self.texts = [normalize(t) for t in texts]
        # A one-word trigger occurs as a whole word exactly when it is one of the text's words:
        # a dict answers those (most triggers) without scanning every text for every trigger.
        self._newest_with_word: dict[str, int] = {}
        for i, text in enumerate(self.texts):
            for word in _words(text):
                self._newest_with_word.setdefault(word, i)

    def first_hit(self, trigger: str) -> int | None:
        """Index of the newest text where `trigger` occurs as whole words, or None."""
        needle = _normalized_trigger(trigger)
        if not needle:
            return None
        if _WORD.fullmatch(needle):
            return self._newest_with_word.get(needle)
        if any(word not in self._newest_with_word for word in _WORD.findall(needle)):
            return None  # a word of the phrase occurs nowhere
        for i, text in enumerate(self.texts):
            # The substring test is a cheap filter; the regex then checks the word edges.
            if needle in text and _whole_word(needle).search(text):
                return i
        return None

    def hits(self, triggers: Iterable[str]) -> dict[str, int]:
        """The triggers that occur, each with the index of the newest text holding it."""
        found: dict[str, int] = {}
        for trigger in triggers:
            index = self.first_hit(trigger)
            if index is not None:
                found[trigger] = index
        return found


class TriggerIndex:
    """Which cards could fire in some texts, found without matching every trigger.

    A trigger can occur as whole words in a text only if each of its words is one of the texts'
    words; a card is a candidate when that holds for one of its triggers. A superset: the exact
    match (ScanWindow) still decides. A trigger with no word at all ("???") makes its card a
    candidate always.
    """

    def __init__(self, cards: Iterable[tuple[str, Sequence[str]]]) -> None:
        self._by_word: dict[str, list[tuple[str, tuple[str, ...]]]] = {}
        self._unindexed: set[str] = set()
        for card_id, triggers in cards:
            for trigger in triggers:
                words = tuple(_WORD.findall(_normalized_trigger(trigger)))
                if words:
                    self._by_word.setdefault(words[0], []).append((card_id, words[1:]))
                elif trigger.strip():
                    self._unindexed.add(card_id)

    def candidates(self, texts: Iterable[str]) -> set[str]:
        """Ids of the cards one of whose triggers has all its words in `texts`."""
        seen: set[str] = set()
        for text in texts:
            seen.update(_words(normalize(text)))
        found = set(self._unindexed)
        for word in seen:
            for card_id, rest in self._by_word.get(word, ()):
                if card_id not in found and all(w in seen for w in rest):
                    found.add(card_id)
        return found


def scan_window_size(
    card_tokens: int,
    min_actions: int,
    tokens_per_action: int,
    threshold_tokens: int,
) -> int:
    """How many latest actions are scanned for story-card triggers (rule QS6).

    At least `min_actions`; when more than `threshold_tokens` are available for story cards,
    floor(available / tokens_per_action). With the shipped settings (card_scan_*: 4, 100, 500):
    400 -> 4, 500 -> 4, 501 -> 5, 900 -> 9.
    """
    if card_tokens > threshold_tokens:
        return max(min_actions, card_tokens // tokens_per_action)
    return min_actions


@dataclass(frozen=True)
class CastMember:
    """A character that may appear in a scene: its id, name and the other names it goes by."""

    id: str
    name: str
    aliases: tuple[str, ...] = ()


def present_characters(
    cast: Iterable[CastMember],
    texts: Sequence[str],
    speaker_id: str | None = None,
    member_ids: Iterable[str] = (),
    present_ids: Iterable[str] = (),
) -> dict[str, str]:
    """Who is present in the scene (rule SW1), each id with why, in this order of reasons.

    The speaker, the chat's members and the client's `present_ids` are present by being named;
    any other cast member is present when its name or an alias occurs as whole words in `texts`
    (the scan window). Only present characters' sheets go into the context.
    """
    present: dict[str, str] = {}

    def add(character_id: str | None, reason: str) -> None:
        if character_id and character_id not in present:
            present[character_id] = reason

    add(speaker_id, "speaker")
    for character_id in member_ids:
        add(character_id, "member")
    for character_id in present_ids:
        add(character_id, "present_ids")
    window = ScanWindow(texts)
    for member in cast:
        if member.id not in present and any(
            window.first_hit(name) is not None for name in (member.name, *member.aliases)
        ):
            add(member.id, "mentioned")
    return present
