"""The no-model fallback (`llm_mode = extractive`): every task, built from the text's own words.

Deterministic (no randomness, no clock): the same input gives the same output. Nothing is made up:
a summary is a selection of the chunk's own sentences, speech is kept verbatim and attributed to
its speaker (Ayla: “…”), quotes pass the same verification as a model's (SW8), facts come from
fixed patterns ("my name is", "call me", "my birthday is", "I'm allergic to", "I promise"…).
The results are the same types the parsers in `prompts.py` return, so callers don't care which
produced them; `run(prompt)` takes the same `Prompt` a model would get.

How a sentence is chosen (`_score`): speech counts more than narration; so do sentences with a
durable cue (promise, swear, name, birthday, never, decided…), names of people in the chunk, and
numbers; very short or very long sentences count less. Ties go to the earlier sentence. The chosen
sentences are shown in their original order. The cue words are English: in other languages the
selection leans on speech, names and position only.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Iterable, Sequence

from ..core.quotes import Quote, find_speech, verify_quotes
from ..core.tokens import TokenCounter, get_counter
from . import prompts as p
from .prompts import (
    CharacterMemory,
    CharacterRef,
    ChatMessage,
    Extraction,
    MemoryDraft,
    NoteInput,
    NoteProposal,
    Prompt,
    SceneSummary,
    SecretInput,
    SessionSummary,
    Summary,
    SummaryInput,
    ToldEvent,
)

CHARACTER_MEMORY_TOKENS = 150  # setting character_memory_tokens (extractive memory length)
SCENE_TOKENS = 250  # setting scene_summary_tokens
SCENE_GAP_MINUTES = 60  # setting scene_gap_minutes: a longer pause starts a new scene
SCENE_MAX_MESSAGES = 12  # setting scene_max_messages

_CUES = re.compile(
    r"\b(promis\w*|swear\w*|swore|vow\w*|oath|never|always|must|decid\w*|agree\w*|plan\w*|"
    r"tomorrow|secret\w*|remember\w*|name|birthday|allerg\w*|owe\w*|kill\w*|die|died|dead|"
    r"love\w*|hate\w*|will|won't|going to|need to|have to)\b", re.IGNORECASE)
_NUMBER = re.compile(r"\d")
_CAPITAL = re.compile(r"\b[A-Z][\w'’-]+")
# A sentence ends at . ! ? … before a space and a non-lowercase letter ("2 a.m. because" goes on).
_SENTENCE_END = re.compile(r"(?<=[.!?…])[*_)\]]*\s+(?=[^a-z])|\s*\n+\s*")
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


def _clean(piece: str) -> str:
    return piece.strip().strip("*_").strip()


def units_of(messages: Sequence[ChatMessage]) -> list[Unit]:
    """Split messages into narration sentences and speech (quoted, or a player's unmarked line)."""
    out: list[Unit] = []
    for i, m in enumerate(messages):
        pieces: list[tuple[str, bool, int]] = []
        spans = find_speech(m.text)
        if not spans and m.role == "user" and "*" not in m.text:
            # A player's plain line is what they said (SillyTavern habit): keep it as speech.
            pieces = [(s, True, 0) for s in _sentences(m.text)]
        else:
            cursor = 0
            for k, span in enumerate(spans):
                pieces += [(s, False, -1) for s in _sentences(m.text[cursor:span.outer_start])]
                pieces.append((span.text.strip(), True, k))
                cursor = span.outer_end
            pieces += [(s, False, -1) for s in _sentences(m.text[cursor:])]
        speaker = m.speaker or m.role
        for j, (text, speech, group) in enumerate(x for x in pieces if x[0]):
            out.append(Unit(i, j, m.id, speaker, text, speech, group))
    return out


def _sentences(text: str) -> list[str]:
    parts = (_clean(s) for s in _SENTENCE_END.split(text))
    # A bare quotation mark or "said." left between two speeches is not a sentence.
    return [s for s in parts if sum(ch.isalnum() for ch in s) >= 2]


def _score(unit: Unit, names: set[str]) -> float:
    words = unit.text.split()
    score = 2.0 if unit.speech else 0.0
    score += 3.0 if _CUES.search(unit.text) else 0.0
    score += min(3, sum(1 for n in names if n and re.search(rf"\b{re.escape(n)}\b", unit.text)))
    caps = {w for w in _CAPITAL.findall(unit.text)[1:] if w not in _NOT_NAMES and w not in names}
    score += 0.5 * min(2, len(caps))
    score += 1.0 if _NUMBER.search(unit.text) else 0.0
    score += 0.5 if unit.pos == 0 else 0.0
    if len(words) < 4:
        score -= 2.0
    elif len(words) > 60:
        score -= 1.0
    return score


def _names(messages: Sequence[ChatMessage], characters: Sequence[CharacterRef] = ()) -> set[str]:
    names = {m.speaker for m in messages if m.speaker}
    for c in characters:
        names.add(c.name)
        names.update(c.aliases)
    return {n for n in names if n}


def _ranked(units: Sequence[Unit], names: set[str]) -> list[Unit]:
    """Best first; ties keep the original order (sorted is stable)."""
    return sorted(units, key=lambda u: -_score(u, names))


# --- rendering within a budget ------------------------------------------------------------------

def _render_lines(units: Iterable[Unit]) -> str:
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


def _select(candidates: Sequence[Unit], budget: int, counter: TokenCounter,
            render=_render_lines, fixed: str = "") -> list[Unit]:
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
    while chosen and counter.count(_join(render(chosen), fixed)) > budget:
        chosen.pop()
    return chosen


def _join(*parts: str) -> str:
    return "\n".join(x for x in parts if x)


def _fallback_text(units: Sequence[Unit], budget: int, counter: TokenCounter) -> str:
    """When not even one sentence fits: the best one, cut to the budget (its beginning kept)."""
    if not units:
        return ""
    return counter.truncate(_render_lines(units[:1]), max(1, budget))


def _quotes_of(units: Iterable[Unit], messages: Sequence[ChatMessage]) -> list[tuple[Quote, Unit]]:
    """Speech units as verified quotes (SW8), each with the unit it came from."""
    sources = {m.id: m.text for m in messages}
    out = []
    for u in units:
        if u.speech:
            check = verify_quotes([Quote(u.speaker, u.text, u.message_id)], sources)
            out += [(q, u) for q in check.kept]
    return out


def _fit_quotes(pairs: Sequence[tuple[Quote, Any]], budget: int,
                counter: TokenCounter) -> list[tuple[Quote, Any]]:
    """As many quotes as fit `budget` tokens, in the order given."""
    kept, used = [], 0
    for q, u in pairs:
        cost = counter.count(f"{q.speaker}: \u201c{q.text}\u201d") + 1
        if used + cost <= budget:
            kept.append((q, u))
            used += cost
    return kept


def _quotes_and_rest(ranked: Sequence[Unit], messages: Sequence[ChatMessage], max_quotes: int,
                     budget: int, counter: TokenCounter) -> tuple[list[Quote], list[Unit]]:
    """The best lines as quotes (within `budget`), and the units left for the text."""
    pairs = _fit_quotes(_quotes_of([u for u in ranked if u.speech][:max_quotes], messages),
                        budget, counter)
    used = {u for _, u in pairs}
    return [q for q, _ in pairs], [u for u in ranked if u not in used]


def _quote_lines(quotes: Sequence[Quote]) -> str:
    return "\n".join(f"{q.speaker}: \u201c{q.text}\u201d" for q in quotes)


# --- summaries (RV3, SW2) -----------------------------------------------------------------------

def summarize_chunk(messages: Sequence[ChatMessage], *, budget_tokens: int = p.SUMMARY_RECENT_TOKENS,
                    max_quotes: int = p.SUMMARY_MAX_QUOTES,
                    counter: TokenCounter | None = None) -> Summary:
    """A `recent` summary: the chunk's best sentences and lines, verbatim, within `budget_tokens`
    (counted on `Summary.render()`, quotes included)."""
    counter = counter or get_counter()
    units = units_of(messages)
    if not units:
        raise ValueError("the messages hold no text to summarise")
    ranked = _ranked(units, _names(messages))
    quotes, rest = _quotes_and_rest(ranked, messages, max_quotes, budget_tokens // 3, counter)
    chosen = _select(rest, budget_tokens, counter, fixed=_quote_lines(quotes))
    text = _render_lines(chosen) or _fallback_text(
        rest or ranked, budget_tokens - counter.count(_quote_lines(quotes)) - 1, counter)
    if not text:
        text, quotes = _quote_lines(quotes[:1]), []
    return Summary(text, tuple(quotes), tuple(m.id for m in messages))


_PREFIX = re.compile(r"^([^:\n]{1,40}):\s+")


def _summary_units(children: Sequence[str]) -> tuple[list[Unit], list[int]]:
    """Units of summary texts (each line read like a message; a `Name: …` line keeps its name),
    and for each line the index of the child it came from."""
    lines: list[ChatMessage] = []
    child_of: list[int] = []
    for i, text in enumerate(children):
        for line in text.splitlines():
            if not line.strip():
                continue
            m = _PREFIX.match(line)
            speaker, body = (m.group(1), line[m.end():]) if m else ("", line)
            lines.append(ChatMessage(f"{i}:{len(lines)}", speaker, body, role=""))
            child_of.append(i)
    return units_of(lines), child_of


def _select_spread(units: Sequence[Unit], child_of: Sequence[int], n_children: int, budget: int,
                   counter: TokenCounter, fixed: str, names: set[str]) -> list[Unit]:
    """Pick from every child (each gets an even share first), then fill with the best of the rest,
    so a merge covers the whole period rather than only its busiest part."""
    share = max(1, (budget - counter.count(fixed)) // max(1, n_children))
    chosen: list[Unit] = []
    for i in range(n_children):
        mine = _ranked([u for u in units if child_of[u.msg] == i], names)
        chosen += _select(mine, share, counter)
    for u in _ranked(units, names):
        if u not in chosen and counter.count(_join(_render_lines(chosen + [u]), fixed)) <= budget:
            chosen.append(u)
    while chosen and counter.count(_join(_render_lines(chosen), fixed)) > budget:
        chosen.remove(min(chosen, key=lambda u: (_score(u, names), -u.msg, -u.pos)))
    return chosen


def merge_summaries(children: Sequence[SummaryInput], *, tier: str = "consolidated",
                    budget_tokens: int | None = None, max_quotes: int = p.SUMMARY_MAX_QUOTES,
                    counter: TokenCounter | None = None) -> Summary:
    """A `consolidated` or `long_term` summary chosen from the children's own (maybe edited) text."""
    counter = counter or get_counter()
    if not children:
        raise ValueError("merge_summaries needs at least one summary")
    if budget_tokens is None:
        budget_tokens = p.SUMMARY_CONSOLIDATED_TOKENS if tier == "consolidated" else p.SUMMARY_LONG_TERM_TOKENS
    quotes = _fit_quotes_plain(_round_robin([c.quotes for c in children], max_quotes),
                               budget_tokens // 3, counter)
    units, child_of = _summary_units([c.text for c in children])
    names = {u.speaker for u in units if u.speaker} | {q.speaker for c in children for q in c.quotes}
    fixed = _quote_lines(quotes)
    chosen = _select_spread(units, child_of, len(children), budget_tokens, counter, fixed, names)
    text = _render_lines(chosen)
    if not text:
        text = counter.truncate(" ".join(" ".join(c.text.split()) for c in children),
                                max(1, budget_tokens - counter.count(fixed) - 1))
    return Summary(text, tuple(quotes), tuple(c.id for c in children))


def _fit_quotes_plain(quotes: Sequence[Quote], budget: int, counter: TokenCounter) -> list[Quote]:
    return [q for q, _ in _fit_quotes([(q, None) for q in quotes], budget, counter)]


def _round_robin(groups: Sequence[Sequence[Quote]], limit: int) -> list[Quote]:
    out: list[Quote] = []
    depth = 0
    while len(out) < limit and any(depth < len(g) for g in groups):
        out += [g[depth] for g in groups if depth < len(g)]
        depth += 1
    return out[:limit]


_PROMISE = re.compile(r"\b(I|we)\s+(promise|swear|vow|give you my word)\b", re.IGNORECASE)
_PLAN = re.compile(r"\b(we|I)\s+(need to|have to|must|will|'ll|’ll|are going to|am going to)\b|"
                   r"\b(tomorrow|next time|at dawn|tonight)\b", re.IGNORECASE)


def summarize_session(messages: Sequence[ChatMessage], *, earlier: Sequence[SummaryInput] = (),
                      open_notes: Sequence[NoteInput] = (), session: int | None = None,
                      full_tokens: int = p.SESSION_FULL_TOKENS,
                      short_tokens: int = p.SESSION_SHORT_TOKENS,
                      max_quotes: int = p.SUMMARY_MAX_QUOTES, max_threads: int = 5,
                      counter: TokenCounter | None = None) -> SessionSummary:
    """Full and short session summaries (SW2) and open threads from promises and plans (SW3).

    Open notes are never marked resolved here: telling that a thread ended needs understanding.
    """
    counter = counter or get_counter()
    if not messages and not earlier:
        raise ValueError("summarize_session needs messages or earlier summaries")
    parts = list(earlier)
    if messages:
        tail = summarize_chunk(messages, budget_tokens=full_tokens, max_quotes=max_quotes, counter=counter)
        parts.append(SummaryInput("messages", tail.text, tail.quotes))
    full = merge_summaries(parts, budget_tokens=full_tokens, max_quotes=max_quotes, counter=counter)
    units, _ = _summary_units([full.text])
    names = {u.speaker for u in units if u.speaker}
    one_paragraph = lambda us: " ".join(_render_lines(us).split("\n"))  # noqa: E731
    short = one_paragraph(_select(_ranked(units, names), short_tokens, counter, render=one_paragraph))
    if not short:
        short = counter.truncate(" ".join(full.text.split()), short_tokens)
    covers = tuple(e.id for e in earlier) + tuple(m.id for m in messages)
    return SessionSummary(full.text, short, full.quotes, tuple(_threads(messages, max_threads)), (), covers)


def _threads(messages: Sequence[ChatMessage], limit: int) -> list[NoteProposal]:
    found: list[NoteProposal] = []
    seen: set[str] = set()
    for u in units_of(messages):
        priority = 4 if _PROMISE.search(u.text) else 3 if _PLAN.search(u.text) else 0
        text = f"{u.speaker}: {u.text}"[: p.MEMORY_MAX_CHARS]
        if priority and text not in seen:
            seen.add(text)
            found.append(NoteProposal(text, priority))
    # Promises first, then plans; in the order they were made (sort is stable).
    found.sort(key=lambda n: -n.priority)
    return found[:limit]


# --- durable facts (RV13, RV18) -----------------------------------------------------------------

_NAME_WORD = r"([A-Z][\w'’-]+(?:\s+[A-Z][\w'’-]+)?)"
_PHRASE = r"([^.!?\n,;]{2,40}?)"
_END = r"(?=\s*(?:[.!?\n,;]|$|\s(?:and|but|so)\b))"
_PATTERNS: list[tuple[str, re.Pattern[str], str]] = [
    ("name", re.compile(r"\b(?i:my name is|my name's|my name’s)\s+" + _NAME_WORD), "{who}'s name is {0}."),
    ("name", re.compile(r"\b(?i:(?:please |you can |just )?call me|i go by)\s+" + _NAME_WORD),
     "{who} wants to be called {0}."),
    ("birthday", re.compile(r"\b(?i:my birthday is|my birthday's|my birthday’s)\s+(?i:on\s+)?" + _PHRASE + _END),
     "{who}'s birthday is {0}."),
    ("birthday", re.compile(r"\b(?i:i was born on)\s+" + _PHRASE + _END), "{who} was born on {0}."),
    ("allergy", re.compile(r"\b(?i:i'm|i’m|i am)\s+(?i:allergic to)\s+" + _PHRASE + _END),
     "{who} is allergic to {0}."),
    ("allergy", re.compile(r"\b(?i:i have an?)\s+([\w -]{2,30}?)\s+(?i:allergy)\b"), "{who} is allergic to {0}."),
    ("preference", re.compile(r"\b(?i:my favou?rite)\s+([\w -]{2,20}?)\s+(?i:is)\s+" + _PHRASE + _END),
     "{who}'s favourite {0} is {1}."),
    ("promise", re.compile(r"\b(?i:i|we)\s+(?i:promise|swear|vow|give you my word)\b"), "{who} promised: \u201c{s}\u201d"),
]


def _speaker_ref(m: ChatMessage, characters: Sequence[CharacterRef]) -> CharacterRef | None:
    by_id = {c.id: c for c in characters}
    if m.character_id in by_id:
        return by_id[m.character_id]
    name = (m.speaker or "").casefold()
    for c in characters:
        if name and name in {c.name.casefold(), *(a.casefold() for a in c.aliases)}:
            return c
    return None


def _file_under(m: ChatMessage, characters: Sequence[CharacterRef]) -> tuple[str, str | None]:
    """Whose memory a fact stated in `m` goes to: a character stating their own fact keeps it;
    what the player says goes to the one character they talk to, or is global in a group."""
    ref = _speaker_ref(m, characters)
    if ref is not None and not ref.is_player and m.role != "user":
        return "character", ref.id
    others = [c for c in characters if not c.is_player and (ref is None or c.id != ref.id)]
    if len(others) == 1:
        return "character", others[0].id
    return "global", None


def _facts(messages: Sequence[ChatMessage], characters: Sequence[CharacterRef], max_chars: int,
           target: tuple[str, str | None] | None = None) -> list[MemoryDraft]:
    """Every pattern match, in message order, as a memory draft citing its message."""
    drafts: list[MemoryDraft] = []
    for u in units_of(messages):
        m = messages[u.msg]
        for kind, pattern, template in _PATTERNS:
            match = pattern.search(u.text)
            if not match:
                continue
            groups = [g.strip() for g in match.groups()]
            text = template.format(*groups, who=u.speaker, s=u.text)
            if len(text) > max_chars:
                text = text[: max_chars - 2].rsplit(" ", 1)[0] + "\u2026\u201d"
            scope, cid = target or _file_under(m, characters)
            drafts.append(MemoryDraft(text, scope, cid, kind, (u.message_id,)))
            break  # one fact per sentence: the first pattern in the list wins
    return drafts


def _dedupe(drafts: Iterable[MemoryDraft], existing: Iterable[str]) -> tuple[list[MemoryDraft], list[str]]:
    seen = {_fold(t) for t in existing}
    kept, dropped = [], []
    for d in drafts:
        if _fold(d.text) in seen:
            dropped.append(f"already saved: {d.text[:80]}")
        else:
            seen.add(_fold(d.text))
            kept.append(d)
    return kept, dropped


def _fold(text: str) -> str:
    return " ".join(text.casefold().split())


def extract_durable(messages: Sequence[ChatMessage], characters: Sequence[CharacterRef], *,
                    existing: Sequence[str] = (), max_items: int = p.DEEP_MEMORY_MAX_ITEMS,
                    max_chars: int = p.MEMORY_MAX_CHARS) -> Extraction:
    """Deep memory by patterns: names, birthdays, allergies, favourites, promises (RV13, RV18)."""
    kept, dropped = _dedupe(_facts(messages, characters, max_chars), existing)
    dropped += [f"over the limit of {max_items}: {d.text[:80]}" for d in kept[max_items:]]
    return Extraction(tuple(kept[:max_items]), (), tuple(dropped))


# --- character memories, scenes, told events (SW4, SW5, SW9b) ----------------------------------

_FEELINGS: list[tuple[str, re.Pattern[str]]] = [
    ("sad", re.compile(r"\b(cr(y|ied|ies|ying)|tears?|sob\w*|weep\w*|wept|sad\w*|grief)\b", re.I)),
    ("afraid", re.compile(r"\b(afraid|scared|fear\w*|trembl\w*|terrif\w*|shak(ing|y))\b", re.I)),
    ("angry", re.compile(r"\b(angr\w*|furious|rage|glar\w*|snap(ped|s)?|shout\w*)\b", re.I)),
    ("happy", re.compile(r"\b(laugh\w*|smil\w*|grin\w*|happy|glad|joy\w*|delight\w*)\b", re.I)),
    ("embarrassed", re.compile(r"\b(blush\w*|flustered|embarrass\w*)\b", re.I)),
    ("surprised", re.compile(r"\b(gasp\w*|startl\w*|surpris\w*|stunned)\b", re.I)),
    ("relieved", re.compile(r"\b(relie(f|ved)|exhal\w*)\b", re.I)),
    ("affectionate", re.compile(r"\b(hug\w*|embrac\w*|tender\w*|gentl\w*|lov\w*)\b", re.I)),
]


def _feeling(units: Sequence[Unit]) -> str:
    counts = {label: sum(1 for u in units if rx.search(u.text)) for label, rx in _FEELINGS}
    best = max(counts.values(), default=0)
    if best == 0:
        return "not stated"
    return next(label for label, _ in _FEELINGS if counts[label] == best)


def _mentions(c: CharacterRef, text: str) -> bool:
    return any(re.search(rf"\b{re.escape(n)}\b", text, re.I) for n in (c.name, *c.aliases) if n)


def extract_character_memories(messages: Sequence[ChatMessage], characters: Sequence[CharacterRef], *,
                               for_ids: Sequence[str] | None = None, session: int | None = None,
                               per_character: int = p.CHARACTER_MEMORIES_PER_CHARACTER,
                               max_quotes: int = 3, budget_tokens: int = CHARACTER_MEMORY_TOKENS,
                               counter: TokenCounter | None = None) -> Extraction:
    """One memory per character who was involved (SW4): the sentences of the messages it spoke in
    or was named in, the lines said there, a feeling read from cue words ("not stated" if none).

    An extractive memory cannot take the character's point of view; it is the scene as it was
    written, filed under that character.
    """
    counter = counter or get_counter()
    targets = p.extraction_targets(characters, for_ids)
    solo = len([c for c in characters if not c.is_player]) == 1
    members = tuple(c.id for c in characters)
    items = []
    for t in targets:
        mine = [m for m in messages
                if solo or _speaker_ref(m, characters) == t or _mentions(t, m.text)]
        if not mine or per_character < 1:
            continue
        units = units_of(mine)
        if not units:
            continue
        names = _names(mine, characters)
        ranked = _ranked(units, names)
        quotes, rest = _quotes_and_rest(ranked, mine, max_quotes, budget_tokens // 2, counter)
        chosen = _select(rest, budget_tokens, counter, fixed=_quote_lines(quotes))
        summary = _render_lines(chosen) or _fallback_text(rest or ranked, budget_tokens, counter)
        spoke = {r.id for m in mine if (r := _speaker_ref(m, characters)) is not None}
        participants = tuple(c.id for c in characters if c.id in spoke or c.id == t.id
                             or any(_mentions(c, m.text) for m in mine))
        cues = sum(1 for u in units if _CUES.search(u.text))
        importance = min(5, 2 + (cues >= 3) + bool(quotes) + (len(mine) >= 10))
        items.append(CharacterMemory(t.id, summary, _feeling([u for u in units if _mentions(t, u.text)
                                                              or u.speaker == t.name] or units),
                                     tuple(quotes), participants, members, session, importance,
                                     tuple(m.id for m in mine)))
    return Extraction(tuple(items))


_SCENE_BREAK = re.compile(r"^\s*(?:(?:\*\s*){3,}|-{3,}|#{3,}|~{3,}|={3,})\s*$", re.M)


def _when(m: ChatMessage) -> datetime | None:
    if not m.sent_at:
        return None
    try:
        return datetime.fromisoformat(m.sent_at.replace("Z", "+00:00"))
    except ValueError:
        return None


def split_scenes(messages: Sequence[ChatMessage], *, max_scenes: int = p.SCENES_MAX,
                 gap_minutes: int = SCENE_GAP_MINUTES,
                 max_messages: int = SCENE_MAX_MESSAGES) -> list[list[ChatMessage]]:
    """Scenes: a new one after a scene-break line (***, ---), a long pause, or `max_messages`.
    Never more than `max_scenes`: the scene length grows instead."""
    cap = max(max_messages, -(-len(messages) // max(1, max_scenes)))
    scenes: list[list[ChatMessage]] = []
    for m in messages:
        prev = scenes[-1][-1] if scenes else None
        t0, t1 = (_when(prev), _when(m)) if prev else (None, None)
        gap = (t0 is not None and t1 is not None and (t1 - t0).total_seconds() >= gap_minutes * 60)
        if not scenes or len(scenes[-1]) >= cap or gap or _SCENE_BREAK.search(m.text):
            scenes.append([m])
        else:
            scenes[-1].append(m)
    while len(scenes) > max_scenes:  # gaps and breaks made too many: join the two shortest neighbours
        i = min(range(len(scenes) - 1), key=lambda k: len(scenes[k]) + len(scenes[k + 1]))
        scenes[i:i + 2] = [scenes[i] + scenes[i + 1]]
    return scenes


def extract_scenes(messages: Sequence[ChatMessage], characters: Sequence[CharacterRef], *,
                   session: int | None = None, max_scenes: int = p.SCENES_MAX, max_quotes: int = 4,
                   budget_tokens: int = SCENE_TOKENS, counter: TokenCounter | None = None) -> Extraction:
    """Scene summaries (SW5): each scene's best sentences and its lines, verbatim and attributed."""
    counter = counter or get_counter()
    members = tuple(c.id for c in characters)
    items = []
    for scene in split_scenes(messages, max_scenes=max_scenes):
        units = units_of(scene)
        if not units:
            continue
        s = summarize_chunk(scene, budget_tokens=budget_tokens, max_quotes=max_quotes, counter=counter)
        first = next((u.text for u in units if not u.speech), units[0].text)
        title = first if len(first) <= 80 else first[:77].rsplit(" ", 1)[0] + "\u2026"
        spoke = {r.id for m in scene if (r := _speaker_ref(m, characters)) is not None}
        participants = tuple(c.id for c in characters
                             if c.id in spoke or any(_mentions(c, m.text) for m in scene))
        items.append(SceneSummary(title, s.text, s.quotes, participants, members, session,
                                  tuple(m.id for m in scene)))
    return Extraction(tuple(items))


_STOP = set("""about above after again against also among because been before being below between
both could does doing down during each from further have having here herself himself into itself
just more most myself once only other ourselves over same should some such than that their theirs
them themselves then there these they this those through under until very what when where which
while whom will with would your yours yourself""".split())


def _content_words(text: str) -> set[str]:
    return {w for w in re.findall(r"[^\W\d_]{4,}", text.casefold()) if w not in _STOP}


def extract_told(messages: Sequence[ChatMessage], characters: Sequence[CharacterRef],
                 secrets: Sequence[SecretInput], *, max_events: int = 5,
                 min_overlap: float = 0.6) -> Extraction:
    """"X told Y about Z" by word overlap (SW9b): a character who knows a secret speaks a sentence
    holding most of the secret's content words (at least `min_overlap` of them, and at least 2),
    in front of chat members who did not know it. The sentence is the evidence, verified verbatim.

    Weak without a model: it sees only near-literal retellings, never hints or paraphrase.
    """
    events: list[ToldEvent] = []
    dropped: list[str] = []
    done: set[tuple[str, str]] = set()
    units = units_of(messages)
    for s in secrets:
        words = _content_words(s.text)
        if len(words) < 2:
            continue
        need = max(2, math.ceil(len(words) * min_overlap))
        for u in units:
            teller = _speaker_ref(messages[u.msg], characters)
            if teller is None or teller.id not in s.known_by:
                continue
            listeners = tuple(c.id for c in characters if c.id not in s.known_by and c.id != teller.id)
            if not listeners or len(words & _content_words(u.text)) < need:
                continue
            if (s.id, teller.id) in done:
                continue
            done.add((s.id, teller.id))
            check = verify_quotes([Quote(teller.name, u.text, u.message_id)],
                                  {m.id: m.text for m in messages})
            if check.kept:
                events.append(ToldEvent(teller.id, listeners, s.id, check.kept[0]))
    dropped += [f"over the limit of {max_events} events" for _ in events[max_events:]]
    return Extraction(tuple(events[:max_events]), (), tuple(dropped))


# --- memories a person asks for (RV9c, RV9d) -----------------------------------------------------

def _cut(text: str, max_chars: int) -> str:
    if len(text) <= max_chars:
        return text
    return text[: max_chars - 1].rsplit(" ", 1)[0] + "\u2026"


def _kind_of(sentence: str) -> str:
    for kind, pattern, _ in _PATTERNS:
        if pattern.search(sentence):
            return kind
    return "fact"


def memories_from_description(description: str, character: CharacterRef | None, *,
                              max_items: int = p.SAVE_FROM_CONVERSATION_MAX_DRAFTS,
                              max_chars: int = p.MEMORY_MAX_CHARS,
                              description_max_chars: int = p.DESCRIPTION_MAX_CHARS) -> Extraction:
    """RV9c without a model: one memory per sentence of the person's description (never the chat)."""
    text = description.strip()
    if not text:
        raise ValueError("the description is empty")
    if len(text) > description_max_chars:
        raise ValueError(f"the description has {len(text)} characters; at most "
                         f"{description_max_chars} are allowed (rule RV9c)")
    scope, cid = ("character", character.id) if character else ("global", None)
    drafts = [MemoryDraft(_cut(s, max_chars), scope, cid, _kind_of(s)) for s in _sentences(text)]
    if not drafts:
        drafts = [MemoryDraft(_cut(text, max_chars), scope, cid, "fact")]
    dropped = tuple(f"over the limit of {max_items}: {d.text[:80]}" for d in drafts[max_items:])
    return Extraction(tuple(drafts[:max_items]), (), dropped)


def save_from_conversation(messages: Sequence[ChatMessage], character: CharacterRef | None, *,
                           max_drafts: int = p.SAVE_FROM_CONVERSATION_MAX_DRAFTS,
                           max_messages: int = p.SAVE_FROM_CONVERSATION_MAX_MESSAGES,
                           max_chars: int = p.MEMORY_MAX_CHARS) -> Extraction:
    """RV9d without a model: the facts the patterns find, then the raw text of the other chosen
    messages (`Speaker: text`), up to `max_drafts` drafts for a person to review."""
    if not messages:
        raise ValueError("save_from_conversation needs at least one message")
    if len(messages) > max_messages:
        raise ValueError(f"{len(messages)} messages selected; at most {max_messages} are allowed (rule RV9d)")
    target = ("character", character.id) if character else ("global", None)
    drafts, _ = _dedupe(_facts(messages, [], max_chars, target), ())
    cited = {i for d in drafts for i in d.source_message_ids}
    for m in messages:
        if m.id not in cited and m.text.strip():
            raw = f"{m.speaker or m.role}: {' '.join(m.text.split())}"
            drafts.append(MemoryDraft(_cut(raw, max_chars), target[0], target[1], "fact", (m.id,)))
    dropped = tuple(f"over the limit of {max_drafts}: {d.text[:80]}" for d in drafts[max_drafts:])
    return Extraction(tuple(drafts[:max_drafts]), (), dropped)


# --- one entry point for the job runner ----------------------------------------------------------

def _summary_inputs(rows: Sequence[dict[str, Any]]) -> list[SummaryInput]:
    return [SummaryInput(r["id"], r["text"], tuple(Quote(q["speaker"], q["text"], q["message_id"])
                                                   for q in r.get("quotes", ())))
            for r in rows]


def _character(row: dict[str, Any] | None) -> CharacterRef | None:
    return CharacterRef(**{**row, "aliases": tuple(row.get("aliases", ()))}) if row else None


def run(prompt: Prompt, counter: TokenCounter | None = None) -> Any:
    """The extractive result of the task `prompt` describes, from the inputs it carries."""
    i = prompt.inputs
    messages, characters = p.messages_from(i), p.characters_from(i)
    task = prompt.task
    if task == "chunk_summary":
        return summarize_chunk(messages, budget_tokens=i["budget_tokens"], max_quotes=i["max_quotes"],
                               counter=counter)
    if task == "merge_summaries":
        return merge_summaries(_summary_inputs(i["children"]), tier=i["tier"],
                               budget_tokens=i["budget_tokens"], max_quotes=i["max_quotes"], counter=counter)
    if task == "session_summary":
        return summarize_session(messages, earlier=_summary_inputs(i["earlier"]),
                                 open_notes=[NoteInput(**n) for n in i["open_notes"]],
                                 session=i["session"], full_tokens=i["full_tokens"],
                                 short_tokens=i["short_tokens"], max_quotes=i["max_quotes"],
                                 max_threads=i["max_threads"], counter=counter)
    if task == "durable_memories":
        return extract_durable(messages, characters, existing=i["existing"], max_items=i["max_items"],
                               max_chars=i["max_chars"])
    if task == "character_memories":
        return extract_character_memories(messages, characters, for_ids=i["for_ids"], session=i["session"],
                                          per_character=i["per_character"], max_quotes=i["max_quotes"],
                                          counter=counter)
    if task == "scene_summaries":
        return extract_scenes(messages, characters, session=i["session"], max_scenes=i["max_scenes"],
                              max_quotes=i["max_quotes"], counter=counter)
    if task == "told_events":
        secrets = [SecretInput(s["id"], s["text"], tuple(s["known_by"])) for s in i["secrets"]]
        return extract_told(messages, characters, secrets, max_events=i["max_events"])
    if task == "sheet_updates":
        # Without a model nothing is inferred about a character: the minimal sheet (name, first
        # appearance, verbatim lines) is drafted by its own job in every mode.
        return p.SheetProposals((), (), ("no model: sheets are not inferred from the text",))
    if task == "memories_from_description":
        return memories_from_description(i["description"], _character(i["character"]),
                                         max_items=i["max_items"], max_chars=i["max_chars"])
    if task == "save_from_conversation":
        return save_from_conversation(messages, _character(i["character"]), max_drafts=i["max_drafts"],
                                      max_chars=i["max_chars"])
    raise ValueError(f"unknown task {task!r}")
