"""What the no-model fallbacks (`llm_mode = extractive`) share: a chunk's own sentences and speech,
scored, chosen within a token budget and rendered verbatim.

Deterministic (no randomness, no clock): the same input gives the same output. Nothing is made up:
a summary is a selection of the chunk's own sentences, speech is kept verbatim and attributed to
its speaker (Ayla: “…”), quotes pass the same verification as a model's (SW8). Each task's own
fallback (facts by pattern, scenes, told events…) is in its family's module, next to its parser,
and returns the same types, so callers don't care which produced a result.

How a sentence is chosen (`score`): speech counts more than narration; so do sentences with a
durable cue (promise, swear, name, birthday, never, decided…), names of people in the chunk, and
numbers; very short or very long sentences count less. Ties go to the earlier sentence. The chosen
sentences are shown in their original order. The cue words are English: in other languages the
selection leans on speech, names and position only.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterable, Sequence

from ...core.quotes import Quote, find_speech, verify_quotes
from ...core.text import roleplay_sentences

if TYPE_CHECKING:
    from ...core.tokens import TokenCounter
    from .base import CharacterRef, ChatMessage

CUES = re.compile(
    r"\b(promis\w*|swear\w*|swore|vow\w*|oath|never|always|must|decid\w*|agree\w*|plan\w*|"
    r"tomorrow|secret\w*|remember\w*|name|birthday|allerg\w*|owe\w*|kill\w*|die|died|dead|"
    r"love\w*|hate\w*|will|won't|going to|need to|have to)\b", re.IGNORECASE)
_NUMBER = re.compile(r"\d")
_CAPITAL = re.compile(r"\b[A-Z][\w'’-]+")
_NOT_NAMES = {"I", "I'm", "I’m", "I'll", "I’ll", "I'd", "I’d", "I've", "I’ve", "The", "A", "An",
              "And", "But", "Then", "She", "He", "They", "We", "You", "It", "My", "Your", "His",
              "Her", "Their", "Our", "This", "That", "What", "Why", "How", "When", "Where", "Yes",
              "No", "Oh", "OK", "Okay", "Well", "So", "If", "As", "In", "On", "At"}


# --- units: the sentences and speech of a chunk --------------------------------------------------

@dataclass(frozen=True)
class Unit:
    """A sentence of narration or a stretch of speech, verbatim, with where it came from."""

    msg: int  # index of the message in the chunk
    pos: int  # order inside the message
    message_id: str
    speaker: str
    text: str
    speech: bool
    group: int = 0  # pieces of one stretch of speech share a group (rendered inside one pair of marks)


def units_of(messages: Sequence[ChatMessage]) -> list[Unit]:
    """Split messages into narration sentences and speech (quoted, or a player's unmarked line)."""
    out: list[Unit] = []
    for i, m in enumerate(messages):
        pieces: list[tuple[str, bool, int]] = []
        spans = find_speech(m.text)
        if not spans and m.role == "user" and "*" not in m.text:
            # A player's plain line is what they said (SillyTavern habit): keep it as speech.
            pieces = [(s, True, 0) for s in roleplay_sentences(m.text)]
        else:
            cursor = 0
            for k, span in enumerate(spans):
                pieces += [(s, False, -1) for s in roleplay_sentences(m.text[cursor:span.outer_start])]
                pieces.append((span.text.strip(), True, k))
                cursor = span.outer_end
            pieces += [(s, False, -1) for s in roleplay_sentences(m.text[cursor:])]
        speaker = m.speaker or m.role
        for j, (text, speech, group) in enumerate(x for x in pieces if x[0]):
            out.append(Unit(i, j, m.id, speaker, text, speech, group))
    return out


def score(unit: Unit, names: set[str]) -> float:
    """How much a unit is worth keeping (see the module docstring)."""
    words = unit.text.split()
    points = 2.0 if unit.speech else 0.0
    points += 3.0 if CUES.search(unit.text) else 0.0
    points += min(3, sum(1 for n in names if n and re.search(rf"\b{re.escape(n)}\b", unit.text)))
    caps = {w for w in _CAPITAL.findall(unit.text)[1:] if w not in _NOT_NAMES and w not in names}
    points += 0.5 * min(2, len(caps))
    points += 1.0 if _NUMBER.search(unit.text) else 0.0
    points += 0.5 if unit.pos == 0 else 0.0
    if len(words) < 4:
        points -= 2.0
    elif len(words) > 60:
        points -= 1.0
    return points


def names_in(messages: Sequence[ChatMessage], characters: Sequence[CharacterRef] = ()) -> set[str]:
    """The speakers' names, and the characters' names and aliases."""
    names = {m.speaker for m in messages if m.speaker}
    for c in characters:
        names.add(c.name)
        names.update(c.aliases)
    return {n for n in names if n}


def ranked(units: Sequence[Unit], names: set[str]) -> list[Unit]:
    """Best first; ties keep the original order (sorted is stable)."""
    return sorted(units, key=lambda u: -score(u, names))


def speaker_ref(m: ChatMessage, characters: Sequence[CharacterRef]) -> CharacterRef | None:
    """The character who wrote `m`: by its character id, else by name or alias."""
    by_id = {c.id: c for c in characters}
    if m.character_id in by_id:
        return by_id[m.character_id]
    name = (m.speaker or "").casefold()
    for c in characters:
        if name and name in {c.name.casefold(), *(a.casefold() for a in c.aliases)}:
            return c
    return None


# --- rendering within a budget ------------------------------------------------------------------

def render_lines(units: Iterable[Unit]) -> str:
    """One line per message, in order: `Speaker: narration “speech” narration`.

    Consecutive sentences of one stretch of speech share one pair of marks; a unit without a
    speaker (a summary's unattributed prose) gets no prefix.
    """
    lines: list[str] = []
    prev: Unit | None = None
    for u in sorted(units, key=lambda u: (u.msg, u.pos)):
        same_line = prev is not None and prev.msg == u.msg
        if (same_line and prev.speech and u.speech and prev.group == u.group
                and prev.pos + 1 == u.pos and lines[-1].endswith("\u201d")):
            lines[-1] = lines[-1][:-1] + " " + u.text + "\u201d"
        else:
            piece = f"\u201c{u.text}\u201d" if u.speech else u.text
            if same_line:
                lines[-1] += " " + piece
            else:
                lines.append(f"{u.speaker}: {piece}" if u.speaker else piece)
        prev = u
    return "\n".join(lines)


def select(candidates: Sequence[Unit], budget: int, counter: TokenCounter,
           render: Callable[[Sequence[Unit]], str] = render_lines, fixed: str = "") -> list[Unit]:
    """Greedy: take units best first while `render(chosen)` then `fixed` (the quote lines, as
    `Summary.render` places them) fits `budget` tokens."""
    chosen: list[Unit] = []
    used = counter.count(fixed)
    for u in candidates:
        cost = counter.count(u.text) + 4  # the speaker prefix, marks and line break, roughly
        if used + cost > budget:
            continue
        chosen.append(u)
        used += cost
    # The estimate can be off by a few tokens: trim the weakest until the real count fits.
    while chosen and counter.count(join_lines(render(chosen), fixed)) > budget:
        chosen.pop()
    return chosen


def join_lines(*parts: str) -> str:
    """The non-empty parts, one per line."""
    return "\n".join(x for x in parts if x)


def fallback_text(units: Sequence[Unit], budget: int, counter: TokenCounter) -> str:
    """When not even one sentence fits: the best one, cut to the budget (its beginning kept)."""
    if not units:
        return ""
    return counter.truncate(render_lines(units[:1]), max(1, budget))


def quotes_of(units: Iterable[Unit], messages: Sequence[ChatMessage]) -> list[tuple[Quote, Unit]]:
    """Speech units as verified quotes (SW8), each with the unit it came from."""
    sources = {m.id: m.text for m in messages}
    out = []
    for u in units:
        if u.speech:
            check = verify_quotes([Quote(u.speaker, u.text, u.message_id)], sources)
            out += [(q, u) for q in check.kept]
    return out


def fit_quotes(pairs: Sequence[tuple[Quote, Any]], budget: int,
               counter: TokenCounter) -> list[tuple[Quote, Any]]:
    """As many quotes as fit `budget` tokens, in the order given."""
    kept, used = [], 0
    for q, u in pairs:
        cost = counter.count(f"{q.speaker}: \u201c{q.text}\u201d") + 1
        if used + cost <= budget:
            kept.append((q, u))
            used += cost
    return kept


def quotes_and_rest(ranked_units: Sequence[Unit], messages: Sequence[ChatMessage], max_quotes: int,
                    budget: int, counter: TokenCounter) -> tuple[list[Quote], list[Unit]]:
    """The best lines as quotes (within `budget`), and the units left for the text."""
    pairs = fit_quotes(quotes_of([u for u in ranked_units if u.speech][:max_quotes], messages),
                       budget, counter)
    used = {u for _, u in pairs}
    return [q for q, _ in pairs], [u for u in ranked_units if u not in used]


def quote_lines(quotes: Sequence[Quote]) -> str:
    """Quotes as a summary renders them, one per line."""
    return "\n".join(f"{q.speaker}: \u201c{q.text}\u201d" for q in quotes)
