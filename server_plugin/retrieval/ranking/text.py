"""Text analysis for ranking (SW6): BM25 terms, names taken out of what is embedded, query
rewriting, temporal cues and passages. Pure functions. The rules every room shares (the BM25 stop
words, the sentence splitter passages are cut with, month names) are in core/text."""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Iterable, Mapping

from ...core.text import BM25_STOP_WORDS, MONTHS, analyzer_terms, analyzer_words, script_without_spaces, sentences

# ---------------------------------------------------------------------------------------------
# Text analysis (BM25 side): the one analyzer of core/text, with stems and stop words.


def tokenize(text: str) -> list[str]:
    """The analyzer's words (match form; bigrams for scripts without spaces), without stemming."""
    return analyzer_words(text)


def analyze(text: str, *, bigrams: bool = False) -> Counter[str]:
    """Term counts of `text` for BM25: stems of non-stop words, plus adjacent-pair bigrams.

    Bigrams join two consecutive content stems with "_" (stop words are skipped first, so
    "support group" and "support the group" share the bigram "support_group").
    """
    stems = analyzer_terms(text, stems=True, stop=BM25_STOP_WORDS)
    counts = Counter(stems)
    if bigrams:
        counts.update(f"{a}_{b}" for a, b in zip(stems, stems[1:]))
    return counts


# ---------------------------------------------------------------------------------------------
# Character names (dense side and speaker awareness)


@dataclass(frozen=True)
class Cast:
    """Character names and aliases of one store, mapped to character ids.

    Built from the characters table (name + aliases). Matching is case-insensitive, whole-word
    for names in scripts with spaces (a possessive "'s" is part of the match) and inside words for
    names in scripts without them ("林月说", "서연이"), as story-card triggers match (core/triggers).
    """

    aliases: Mapping[str, str]  # alias as written -> character id
    _pattern: re.Pattern | None = field(default=None, compare=False, repr=False)
    _bare: re.Pattern | None = field(default=None, compare=False, repr=False)  # scripts without spaces

    @classmethod
    def build(cls, characters: Iterable[tuple[str, Iterable[str]]]) -> "Cast":
        """`characters`: (character id, names and aliases) pairs. Empty names are ignored."""
        table: dict[str, str] = {}
        for char_id, names in characters:
            for name in names:
                name = name.strip()
                if name:
                    table.setdefault(name.lower(), char_id)
        if not table:
            return cls({}, None)
        # Longest first, so "Mel Jones" wins over "Mel".
        alts = sorted(table, key=len, reverse=True)
        spaced = [a for a in alts if not script_without_spaces(a)]
        bare = [a for a in alts if script_without_spaces(a)]
        pattern = re.compile(
            r"(?<![\w])(" + "|".join(re.escape(a) for a in spaced) + r")(['’]s)?(?![\w])",
            re.IGNORECASE,
        ) if spaced else None
        plain = re.compile("(" + "|".join(re.escape(a) for a in bare) + ")()", re.IGNORECASE) if bare else None
        return cls(table, pattern, plain)

    def _matches(self, text: str) -> list[re.Match]:
        found = [m for p in (self._pattern, self._bare) if p is not None for m in p.finditer(text)]
        return sorted(found, key=lambda m: m.start()) if self._bare is not None else found

    def mentioned(self, text: str) -> list[str]:
        """Character ids named in `text`, in order of first mention, without repeats."""
        seen: list[str] = []
        for m in self._matches(text):
            cid = self.aliases[m.group(1).lower()]
            if cid not in seen:
                seen.append(cid)
        return seen

    def sub(self, text: str, repl, *, capitalised_only: bool = False) -> str:
        """Replace every name; `repl(match, character_id, possessive)` returns the new text.

        With `capitalised_only`, a name is replaced only where it starts with a capital letter:
        stored texts write names capitalised, and a character called "Will" or "Hope" must not
        take the words "will" and "hope" out of every message.
        """
        def one(m: re.Match) -> str:
            # Scripts without spaces have no capitals: their names are always taken.
            if capitalised_only and m.re is self._pattern and not m.group(1)[:1].isupper():
                return m.group(0)
            return repl(m, self.aliases[m.group(1).lower()], bool(m.group(2)))

        for pattern in (self._pattern, self._bare):
            if pattern is not None:
                text = pattern.sub(one, text)
        return text


_SPACES = re.compile(r"\s+")
_ORPHAN_PUNCT = re.compile(r"\s+([,.!?;:])")
_LEADING_PUNCT = re.compile(r"^[\s,.;:!?]+")
_DOUBLE_PUNCT = re.compile(r"([,;:])\s*(?=[,.!?;:])")


def _tidy(text: str) -> str:
    text = _SPACES.sub(" ", text)
    text = _DOUBLE_PUNCT.sub("", text)
    text = _ORPHAN_PUNCT.sub(r"\1", text)
    return _LEADING_PUNCT.sub("", text).strip()


def dense_text(text: str, cast: Cast) -> str:
    """The text an item is embedded as: character names removed ("Ayla's" becomes "their").

    MiniLM's cosine is dominated by the names it sees; without them it ranks by what happened.
    BM25 keeps the names (it weighs them by rarity, which is what we want there).
    """
    return _tidy(cast.sub(text, lambda m, cid, poss: " their " if poss else " ", capitalised_only=True))


_PREPOSITIONS = frozenset(
    "to with for about from at of by on in like than and or as after before toward towards".split()
)


def rewrite_query(query: str, cast: Cast, mode: str) -> str:
    """The query text for the dense side, per `mode` (the setting search_query_person).

    - "strip": names removed, as in `dense_text`.
    - "first_person": the first character named becomes "I"/"me"/"my" (stored messages are in
      their speaker's first person: "When did Mel go camping?" -> "When did I go camping?");
      other names become "them"/"their" after a preposition or as a possessive, else vanish.
    """
    if mode == "strip":
        return dense_text(query, cast)
    named = cast.mentioned(query)
    if not named:
        return query
    first = named[0]

    def repl(m: re.Match, cid: str, poss: bool) -> str:
        before = query[: m.start()].split()
        after_prep = bool(before) and before[-1].lower().strip(",.;:!?\"'") in _PREPOSITIONS
        if cid != first:
            return " their " if poss else (" them " if after_prep else " ")
        if poss:
            return "my"
        return "me" if after_prep else "I"

    return _tidy(cast.sub(query, repl))


# ---------------------------------------------------------------------------------------------
# Temporal cues (a prior for "when" questions)

_TEMPORAL_QUERY = re.compile(
    r"^\s*(when|how long ago|since when|what (day|date|time|year|month|week)|which (day|year|month|week))\b"
    r"|\b(what|which) (day|date|year|month)\b|\bhow long\b",
    re.IGNORECASE,
)
_TEMPORAL_WORDS = frozenset(
    """yesterday today tonight tomorrow ago last next recently lately weekend week weeks month
    months year years morning evening afternoon night earlier later soon since before after
    monday tuesday wednesday thursday friday saturday sunday christmas birthday anniversary summer
    winter spring autumn fall""".split()
) | {m.lower() for m in MONTHS}  # tokenize lower-cases, so the month names are matched lower-case


def is_temporal_query(query: str) -> bool:
    """True for questions that ask when something happened or how long ago."""
    return bool(_TEMPORAL_QUERY.search(query))


def temporal_cues(text: str) -> int:
    """How many time expressions `text` holds (computed at write time; a small integer)."""
    words = tokenize(text)
    n = sum(1 for w in words if w in _TEMPORAL_WORDS)
    n += sum(1 for w in words if w.isdigit() and len(w) == 4 and w[:2] in ("19", "20"))
    return n


# ---------------------------------------------------------------------------------------------
# Conversation structure


def chunks(text: str, min_words: int = 0, max_words: int = 80, max_chunks: int = 16) -> list[str]:
    """Passages of `text` for the best-passage channel: sentences, merged until a passage has at
    least `min_words` words, split when one runs past `max_words`; at most `max_chunks` (the
    first ones). One passage means the item's own vector already covers it (no extra vector).
    """
    out: list[str] = []
    cur: list[str] = []
    for sent in sentences(text):
        words = sent.split()
        while len(words) > max_words:
            out.append(" ".join(words[:max_words]))
            words = words[max_words:]
        cur += words
        if len(cur) >= min_words:
            out.append(" ".join(cur))
            cur = []
    if cur:
        if out and len(cur) < min_words:
            out[-1] += " " + " ".join(cur)
        else:
            out.append(" ".join(cur))
    return out[:max_chunks]
