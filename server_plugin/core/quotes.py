"""Verified quotes (rule SW8): a quote is stored only if its words really are in the cited message.

Models invent details; a character quoting the player "word for word" must quote what was said.
`verify_quotes` keeps a quote only when it occurs verbatim in the text of the message it cites,
after the normalisation below, and returns what it kept and what it dropped (with a reason) so a
job can count the drops.

What is normalised (on both sides, before comparing), and nothing else:
- double quotation marks “ ” „ ‟ « » 〝 〞 ＂ ″ and the straight " are all one mark;
- single quotation marks and apostrophes ‘ ’ ‚ ‛ ‹ › ′ ＇ ` and the straight ' are all one mark;
- the ellipsis character … equals three dots ...;
- hyphens and dashes ‐ ‑ ‒ – — ― − and runs of them ("--") are all one "-";
- any run of whitespace (spaces, tabs, newlines, no-break and other Unicode spaces) is one space,
  and the spaces French typography puts inside « and » are dropped;
- zero-width characters (U+200B–U+200D, U+2060, U+FEFF) and the soft hyphen are ignored.
Letters, digits, case and other punctuation must match exactly. Before matching, the quote itself is
trimmed of surrounding whitespace, quotation marks and a leading/trailing "..." (models often wrap
or clip a quote); if it still does not match and ends in one of . , ; : ! ? that final mark is
dropped and the match tried once more (the source often has a comma where the quote has a period).
An elision inside a quote ("I ... peek") does not match: a quote must be one contiguous run.

A quote must also begin and end on word boundaries ("eek" is not a quote of "peek").

A kept quote's text is the exact slice of the source message (its own quotation marks, dashes and
spacing), so what is stored is verbatim by construction, whatever spelling the model used.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

DOUBLE_QUOTES = "\u201c\u201d\u201e\u201f\u00ab\u00bb\u301d\u301e\uff02\u2033\""
SINGLE_QUOTES = "\u2018\u2019\u201a\u201b\u2039\u203a\u2032\uff07`'"
DASHES = "\u2010\u2011\u2012\u2013\u2014\u2015\u2212-"
ZERO_WIDTH = "\u200b\u200c\u200d\u2060\ufeff\u00ad"
TRAILING_MARKS = ".,;:!?"

# Part of what a quote is (SW8), not a limit to tune, so not a setting: a "quote" longer than this
# is a passage, not a line someone said. Every verifier uses the same bound.
DEFAULT_MAX_QUOTE_CHARS = 500


@dataclass(frozen=True)
class Quote:
    """A line someone said, as cited: who said it, the words, and the message they are in."""

    speaker: str
    text: str
    message_id: str


@dataclass(frozen=True)
class DroppedQuote:
    """A quote that failed verification, and why (`unknown_message`, `not_verbatim`, `empty`, `too_long`)."""

    quote: Quote
    reason: str


def dropped_report(dropped: Sequence[DroppedQuote]) -> dict[str, object]:
    """What a job's result says of the quotes it dropped: how many, and how many for each reason."""
    return {"dropped_quotes": len(dropped), "dropped_quote_reasons": dict(Counter(d.reason for d in dropped))}


@dataclass(frozen=True)
class QuoteCheck:
    """The outcome of a verification: quotes kept (with verbatim source text) and quotes dropped."""

    kept: tuple[Quote, ...]
    dropped: tuple[DroppedQuote, ...]


@dataclass(frozen=True)
class _Normalised:
    text: str
    starts: tuple[int, ...]  # starts[i]: index in the original of the character behind text[i]
    ends: tuple[int, ...]  # ends[i]: index just after the original character(s) behind text[i]


def _canonical(ch: str) -> str:
    if ch in DOUBLE_QUOTES:
        return '"'
    if ch in SINGLE_QUOTES:
        return "'"
    if ch in DASHES:
        return "-"
    if ch == "\u2026":
        return "..."
    if ch.isspace():
        return " "
    return ch


def _normalise(text: str) -> _Normalised:
    """Normalise `text` (see the module docstring), remembering where each output char came from."""
    out: list[str] = []
    starts: list[int] = []
    ends: list[int] = []
    skip = _guillemet_spaces(text) if "\u00ab" in text or "\u00bb" in text else set()
    for i, ch in enumerate(text):
        if ch in ZERO_WIDTH or i in skip:
            continue
        canon = _canonical(ch)
        if canon in (" ", "-") and out and out[-1] == canon:
            ends[-1] = i + 1  # extend the run instead of repeating it
            continue
        for c in canon:
            out.append(c)
            starts.append(i)
            ends.append(i + 1)
    # Trim one leading and one trailing space (runs are already collapsed).
    lo, hi = 0, len(out)
    if lo < hi and out[lo] == " ":
        lo += 1
    if lo < hi and out[hi - 1] == " ":
        hi -= 1
    return _Normalised("".join(out[lo:hi]), tuple(starts[lo:hi]), tuple(ends[lo:hi]))


def _guillemet_spaces(text: str) -> set[int]:
    """Indices of the spaces French typography puts just inside « and » (dropped when comparing)."""
    skip: set[int] = set()
    for j, ch in enumerate(text):
        if ch == "\u00ab":
            k = j + 1
            while k < len(text) and text[k].isspace():
                skip.add(k)
                k += 1
        elif ch == "\u00bb":
            k = j - 1
            while k >= 0 and text[k].isspace():
                skip.add(k)
                k -= 1
    return skip


def normalise(text: str) -> str:
    """The comparison form of `text` (quotation marks, dashes, ellipses and whitespace unified)."""
    return _normalise(text).text


def _trim_quote(q: str) -> str:
    """Strip what models wrap around a quote: spaces, a leading/trailing '...', and quotation
    marks around the whole of it (or one unpaired mark at an end). Marks inside stay:
    'dit "Je reste"' keeps its pair."""
    prev = None
    while prev != q:
        prev = q
        q = q.strip(" ")
        if q.startswith("..."):
            q = q[3:]
        if q.endswith("..."):
            q = q[:-3]
        for mark in "\"'":
            if len(q) >= 2 and q[0] == mark and q[-1] == mark:
                q = q[1:-1]
            elif q.count(mark) % 2 == 1 and q.startswith(mark):
                q = q[1:]
            elif q.count(mark) % 2 == 1 and q.endswith(mark):
                q = q[:-1]
    return q


def find_verbatim(quote: str, source: str) -> str | None:
    """The exact slice of `source` that `quote` matches after normalisation, or None."""
    needle = _trim_quote(normalise(quote))
    if not needle:
        return None
    hay = _normalise(source)
    candidates = [needle]
    if needle[-1] in TRAILING_MARKS and len(needle) > 1:
        candidates.append(needle[:-1].rstrip())
    for cand in candidates:
        pos = _find_whole_words(hay.text, cand)
        if pos >= 0:
            return source[hay.starts[pos]: hay.ends[pos + len(cand) - 1]]
    return None


def _find_whole_words(hay: str, needle: str) -> int:
    """First index of `needle` in `hay` that neither starts nor ends inside a word, or -1.

    "eek" is not a quote of "peek": a quote that cuts a word in half was not said.
    """
    if not needle:
        return -1
    pos = hay.find(needle)
    while pos >= 0:
        end = pos + len(needle)
        cuts_left = needle[0].isalnum() and pos > 0 and hay[pos - 1].isalnum()
        cuts_right = needle[-1].isalnum() and end < len(hay) and hay[end].isalnum()
        if not (cuts_left or cuts_right):
            return pos
        pos = hay.find(needle, pos + 1)
    return -1


def verify_quotes(quotes: Iterable[Quote], sources: Mapping[str, str], *,
                  max_chars: int = DEFAULT_MAX_QUOTE_CHARS) -> QuoteCheck:
    """Keep each quote that occurs verbatim in `sources[quote.message_id]` (rule SW8).

    `sources` maps message id -> message text (only the messages the model was shown). A kept
    quote's text is replaced by the matching slice of the source. Duplicates are kept once.
    """
    kept: list[Quote] = []
    dropped: list[DroppedQuote] = []
    seen: set[tuple[str, str]] = set()
    for q in quotes:
        if not _trim_quote(normalise(q.text)):
            dropped.append(DroppedQuote(q, "empty"))
            continue
        if len(q.text) > max_chars:
            dropped.append(DroppedQuote(q, "too_long"))
            continue
        source = sources.get(q.message_id)
        if source is None:
            dropped.append(DroppedQuote(q, "unknown_message"))
            continue
        exact = find_verbatim(q.text, source)
        if exact is None:
            dropped.append(DroppedQuote(q, "not_verbatim"))
            continue
        key = (q.message_id, exact)
        if key not in seen:
            seen.add(key)
            kept.append(Quote(q.speaker.strip(), exact, q.message_id))
    return QuoteCheck(tuple(kept), tuple(dropped))


# --- finding speech in a message (used by the extractive fallback) ---------------------------

# Pairs of quotation marks that enclose speech. Single quotes are left out on purpose: the
# apostrophe in "don't" is the same character, so they cannot be paired reliably.
_SPEECH = re.compile(
    "\u201c([^\u201c\u201d]+)\u201d"      # “…”
    "|\u201e([^\u201e\u201c\u201d]+)[\u201c\u201d]"  # „…“ (German) or „…” (Polish)
    "|\u00ab\\s?([^\u00ab\u00bb]+?)\\s?\u00bb"  # « … » (French)
    "|\u00bb([^\u00bb\u00ab]+)\u00ab"     # »…« (German books)
    "|\u300c([^\u300c\u300d]+)\u300d"     # 「…」
    "|\u300e([^\u300e\u300f]+)\u300f"     # 『…』
    '|"([^"]+)"'                          # "…"
)


@dataclass(frozen=True)
class Span:
    """A piece of speech inside a message: the words between the marks, and where they are."""

    start: int  # the words, without the marks
    end: int
    text: str
    outer_start: int  # the marks included
    outer_end: int


def find_speech(text: str) -> list[Span]:
    """Every quoted stretch of speech in `text`, in order (the marks themselves excluded)."""
    spans = []
    for m in _SPEECH.finditer(text):
        group = next(i for i in range(1, 8) if m.group(i) is not None)
        inner = m.group(group)
        if inner.strip():
            spans.append(Span(m.start(group), m.end(group), inner, m.start(), m.end()))
    return spans


# --- who said it (SW8) ------------------------------------------------------------------------

def _fold(name: str) -> str:
    return " ".join(name.split()).casefold()


def _names_in(segment: str, cast: Sequence[Sequence[str]]) -> list[tuple[int, int]]:
    """(position, cast index) of each cast name in `segment`, whole words only."""
    found = []
    for i, names in enumerate(cast):
        for n in names:
            if n and n.strip():
                found += [(m.start(), i) for m in re.finditer(rf"(?<!\w){re.escape(n.strip())}(?!\w)",
                                                              segment, re.IGNORECASE)]
    return sorted(found)


def narrated_speaker(message: str, quote: str, cast: Sequence[Sequence[str]],
                     loose: bool = True) -> int | None:
    """The index in `cast` (each entry a character's names) of the character the narration of
    `message` names as saying `quote`, or None when it names none.

    Read as a person would: the name just after the closing mark when the line runs on
    (`"Stay," Mira said`, `"Stay!" said Mira`: the words up to the first comma or sentence end),
    else the last name in the narration leading up to the opening mark (`Mira whispered,
    "Stay."`); failing both and when `loose`, the only character named anywhere in the message's
    narration."""
    pos = message.find(quote)
    if pos < 0:
        return None
    spans = find_speech(message)
    inside = next((s for s in spans if s.start <= pos < s.end), None)
    start, end = (inside.outer_start, inside.outer_end) if inside else (pos, pos + len(quote))
    after = message[end:]
    runs_on = bool(re.match(r"\s*[a-z]", after)) or message[max(start, end - 3):end].rstrip("\"”»」』 ")[-1:] in (",", "—", "-")
    if runs_on:
        stop = re.search(r"[.!?,;\n]|[\"“„«「『]", after)
        hits = _names_in(after[: stop.start() if stop else len(after)], cast)
        if hits:
            return hits[0][1]
    before_end = start
    prev = max((s.outer_end for s in spans if s.outer_end <= start), default=0)
    lead = message[prev:before_end]
    cut = max(lead.rfind(". "), lead.rfind("\n"), lead.rfind("! "), lead.rfind("? "))
    hits = _names_in(lead[cut + 1:] if cut >= 0 else lead, cast)
    if hits:
        return hits[-1][1]
    if not loose:
        return None
    narration = message
    for s in reversed(spans):
        narration = narration[: s.outer_start] + " " + narration[s.outer_end:]
    named = {i for _, i in _names_in(narration, cast)}
    return next(iter(named)) if len(named) == 1 else None


def speaker_said(speaker: str, author: Sequence[str], message: str, quote: str,
                 speaker_names: Sequence[str] = (), cast: Sequence[Sequence[str]] = ()) -> str | None:
    """The name to store for a verified quote if `speaker` really said it, else None (SW8).

    `speaker` said it when they wrote the message (`author`: the names its author goes by) and
    the narration names nobody else as its speaker, or when the narration names them
    (`narrated_speaker`). `speaker_names` are all the speaker's names (aliases), `cast` every
    character's names (the speaker and author are added when missing)."""
    names = tuple(speaker_names) or (speaker,)
    folded = {_fold(n) for n in names if n}
    roster = [list(c) for c in cast]
    for who in (names, tuple(author)):
        if not any(folded_n in {_fold(x) for c in roster for x in c} for folded_n in {_fold(n) for n in who if n}):
            roster.append(list(who))
    is_author = bool(folded & {_fold(a) for a in author if a})
    # The author's own line stands unless the narration explicitly gives it to someone else.
    narrated = narrated_speaker(message, quote, roster, loose=not is_author)
    if narrated is not None:
        return names[0] if folded & {_fold(n) for n in roster[narrated]} else None
    return names[0] if is_author else None
