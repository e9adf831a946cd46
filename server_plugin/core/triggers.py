"""Trigger matching, the story-card scan window (QS6) and who is present (SW1).

Pure helpers: the stdlib, `regex` and `core.text` only, no database, no clock. The assembler uses
them for story cards; `context.py` uses `present_characters` to decide whose sheets to load before
it calls the assembler.

Matching rule (one rule for lore triggers and character names). Both sides are compared in
`core.text.match_form` (NFKC, casefolded, Traditional Chinese as Simplified; a case-sensitive card
keeps the case), whitespace runs as one space. Then, per card (`Match.whole_words`):
- "auto" (the default): whole words in scripts written with spaces, substrings in scripts without
  them. An edge of the trigger in a script with spaces must not touch a letter, mark, digit or
  underscore of any script; an edge in Han, Kana, Hangul, Thai, Lao, Khmer or Burmese is not
  checked. So "cat" fires on "Cat!" and "the cat's tail" but not on "concatenate" or "cats";
  "кот" not on "скотина"; "黑塔" on "我们明天去黑塔看看吧" and "흑탑" on "흑탑이".
- "on": every edge is checked, in every script (a Chinese trigger must stand between spaces or
  punctuation).
- "off": substrings everywhere ("Turm" fires in "Schwarzturmstraße").
A trigger written `/pattern/flags` (World Info's regex keys; flags i, s, m, x, u, g) is a regular
expression searched in the texts as written (whitespace runs as one space), each search bounded
by `regex_seconds`; one that runs out of time does not fire.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Iterable, Sequence

import regex

from .text import fold_width, match_form, script_without_spaces

WHOLE_WORDS = ("auto", "on", "off")

_WORD_CHARS = r"\p{L}\p{M}\p{N}_"
_WORD = regex.compile(rf"[{_WORD_CHARS}]+")
_REGEX_TRIGGER = regex.compile(r"^/(.+)/([a-z]*)$", regex.S)
_FLAGS = {"i": regex.IGNORECASE, "s": regex.DOTALL, "m": regex.MULTILINE, "x": regex.VERBOSE,
          "u": 0, "g": 0}


@dataclass(frozen=True)
class Match:
    """How a card's triggers match: `whole_words` one of WHOLE_WORDS; `case_sensitive`."""

    whole_words: str = "auto"
    case_sensitive: bool = False


AUTO = Match()


def _collapse(text: str) -> str:
    return " ".join(text.split())


@lru_cache(maxsize=2048)  # the live window's texts come back every turn
def normalize(text: str) -> str:
    """The form both sides are matched in: `core.text.match_form`, whitespace runs as one space."""
    return _collapse(match_form(text))


@lru_cache(maxsize=2048)
def _cased(text: str) -> str:
    return _collapse(fold_width(text))


@lru_cache(maxsize=16384)
def _needle(trigger: str, case_sensitive: bool) -> str:
    return _cased(trigger) if case_sensitive else normalize(trigger)


def is_regex(trigger: str) -> bool:
    """Whether `trigger` is written as a regular expression (`/pattern/flags`)."""
    return bool(_REGEX_TRIGGER.match(trigger.strip()))


@lru_cache(maxsize=4096)
def compile_regex(trigger: str) -> regex.Pattern[str] | None:
    """The pattern of a `/pattern/flags` trigger, or None when it is not one or does not compile."""
    m = _REGEX_TRIGGER.match(trigger.strip())
    if m is None or any(f not in _FLAGS for f in m.group(2)):
        return None
    flags = 0
    for f in m.group(2):
        flags |= _FLAGS[f]
    try:
        return regex.compile(m.group(1), flags)
    except (regex.error, ValueError, OverflowError):
        return None


@lru_cache(maxsize=16384)
def _edges(needle: str, whole_words: str) -> tuple[bool, bool]:
    """Which ends of `needle` must not touch a word character: (left, right)."""
    if whole_words == "off" or not needle:
        return False, False
    if whole_words == "on":
        return True, True
    return not script_without_spaces(needle[0]), not script_without_spaces(needle[-1])


@lru_cache(maxsize=16384)
def _pattern(needle: str, left: bool, right: bool) -> regex.Pattern[str]:
    return regex.compile((rf"(?<![{_WORD_CHARS}])" if left else "") + regex.escape(needle)
                         + (rf"(?![{_WORD_CHARS}])" if right else ""))


@lru_cache(maxsize=2048)
def _words(normalized_text: str) -> frozenset[str]:
    """The distinct words of a normalized text (cached: the live window returns every turn)."""
    return frozenset(_WORD.findall(normalized_text))


class ScanWindow:
    """Texts to search for triggers, newest first (index 0 is the latest action)."""

    def __init__(self, texts: Sequence[str], regex_seconds: float = 0.05) -> None:
        self.raw = list(texts)
        self.texts = [normalize(t) for t in texts]
        self.regex_seconds = regex_seconds
        self._cased: list[str] | None = None
        # A one-word trigger occurs as a whole word exactly when it is one of the text's words:
        # a dict answers those (most triggers) without scanning every text for every trigger.
        self._newest_with_word: dict[str, int] = {}
        for i, text in enumerate(self.texts):
            for word in _words(text):
                self._newest_with_word.setdefault(word, i)

    def _texts(self, case_sensitive: bool) -> list[str]:
        if not case_sensitive:
            return self.texts
        if self._cased is None:
            self._cased = [_cased(t) for t in self.raw]
        return self._cased

    def first_hit(self, trigger: str, match: Match = AUTO) -> int | None:
        """Index of the newest text where `trigger` occurs (by `match`), or None."""
        if is_regex(trigger):
            return self._regex_hit(trigger)
        needle = _needle(trigger, match.case_sensitive)
        if not needle:
            return None
        left, right = _edges(needle, match.whole_words)
        if left and right and not match.case_sensitive:
            if _WORD.fullmatch(needle):
                return self._newest_with_word.get(needle)
            if any(word not in self._newest_with_word for word in _WORD.findall(needle)):
                return None  # a word of the phrase occurs nowhere
        for i, text in enumerate(self._texts(match.case_sensitive)):
            # The substring test is a cheap filter; the pattern then checks the word edges.
            if needle in text and (not (left or right) or _pattern(needle, left, right).search(text)):
                return i
        return None

    def _regex_hit(self, trigger: str) -> int | None:
        pattern = compile_regex(trigger)
        if pattern is None:
            return None
        for i, text in enumerate(self.raw):
            try:
                if pattern.search(_collapse(text), timeout=self.regex_seconds):
                    return i
            except TimeoutError:
                return None  # a pattern that runs this long on one text is not let fire
        return None

    def hits(self, triggers: Iterable[str], match: Match = AUTO) -> dict[str, int]:
        """The triggers that occur, each with the index of the newest text holding it."""
        found: dict[str, int] = {}
        for trigger in triggers:
            index = self.first_hit(trigger, match)
            if index is not None:
                found[trigger] = index
        return found


class TriggerIndex:
    """Which cards could fire in some texts, found without matching every trigger.

    A whole-words trigger can occur in a text only if each of its words is one of the texts'
    words; a card is a candidate when that holds for one of its triggers. A superset: the exact
    match (ScanWindow) still decides. A card with a trigger that matches inside words (a script
    without spaces, whole words "off", case-sensitive, a regex) or with no word at all ("???") is
    a candidate always.
    """

    def __init__(self, cards: Iterable[tuple[str, Sequence[str]] | tuple[str, Sequence[str], Match]]) -> None:
        self._by_word: dict[str, list[tuple[str, tuple[str, ...]]]] = {}
        self._unindexed: set[str] = set()
        for card in cards:
            card_id, triggers = card[0], card[1]
            match = card[2] if len(card) > 2 else AUTO  # type: ignore[misc]
            for trigger in triggers:
                needle = _needle(trigger, False)
                words = tuple(_WORD.findall(needle))
                exact = _edges(needle, match.whole_words) == (True, True) and not match.case_sensitive
                if words and exact and not is_regex(trigger):
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
    any other cast member is present when its name or an alias occurs in `texts` (the scan
    window) by the automatic rule: whole words in scripts with spaces, inside words in scripts
    without them ("林月说" names 林月, "서연이" names 서연). Only present characters' sheets go
    into the context.
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
            not is_regex(name) and window.first_hit(name) is not None for name in (member.name, *member.aliases)
        ):
            add(member.id, "mentioned")
    return present
