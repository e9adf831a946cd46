"""The summary tasks (RV3, SW2, SW3): a chunk that left the live window (`chunk_summary`), a merge
of consecutive summaries into the tier above (`merge_summaries`), and a finished session
(`session_summary`) with the open threads it proposes for the campaign notes. Each with its
prompt, schema, parser and extractive fallback."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

from ...core.quotes import DroppedQuote, Quote
from ...core.tokens import get_counter
from . import answers
from . import extractive as ex
from .base import (
    ANSWER_RULE,
    COMMON_RULES,
    LABELS,
    LEVEL,
    QUOTE_RULE,
    QUOTES,
    STR,
    ChatMessage,
    Labels,
    Prompt,
    Task,
    check_quotes,
    checked_text,
    dump,
    json_block,
    keep_valid,
    make_prompt,
    message_label,
    messages_from,
    need,
    obj_schema,
    out_tokens,
    quote_in,
    render_messages,
    words_for,
)

if TYPE_CHECKING:
    from ...core.tokens import TokenCounter


# --- inputs and results --------------------------------------------------------------------------

@dataclass(frozen=True)
class SummaryInput:
    """A summary to merge: its current text (a person may have edited it) and its kept quotes."""

    id: str
    text: str
    quotes: tuple[Quote, ...] = ()


@dataclass(frozen=True)
class NoteInput:
    """An open campaign note (SW3) the session summary may mark resolved."""

    id: str
    text: str
    priority: int = 3


@dataclass(frozen=True)
class Summary:
    """A chunk summary (tier `recent`) or a merge (`consolidated`, `long_term`), rule RV3."""

    text: str
    quotes: tuple[Quote, ...]
    covers: tuple[str, ...]  # message ids (chunk) or child summary ids (merge)
    dropped_quotes: tuple[DroppedQuote, ...] = ()

    def render(self) -> str:
        """The text a context shows: the summary, then its memorable lines verbatim."""
        lines = [self.text] + [f"{q.speaker}: \u201c{q.text}\u201d" for q in self.quotes]
        return "\n".join(lines)


@dataclass(frozen=True)
class NoteProposal:
    """An open narrative thread proposed for the campaign notes (SW3); priority 5 = most pressing."""

    text: str
    priority: int


@dataclass(frozen=True)
class SessionSummary:
    """A session's full summary and one-paragraph short version (SW2), and proposed notes (SW3)."""

    full: str
    short: str
    quotes: tuple[Quote, ...]
    notes: tuple[NoteProposal, ...]
    resolved_note_ids: tuple[str, ...]
    covers: tuple[str, ...]  # message ids and/or summary ids read
    dropped_quotes: tuple[DroppedQuote, ...] = ()

    def render(self) -> str:
        """The full summary as a context shows it: the text, then its memorable lines verbatim."""
        return "\n".join([self.full] + [f"{q.speaker}: \u201c{q.text}\u201d" for q in self.quotes])


def summary_inputs(rows: Sequence[dict[str, Any]]) -> list[SummaryInput]:
    """Summaries as a prompt's inputs hold them."""
    return [SummaryInput(r["id"], r["text"], tuple(quote_in(q) for q in r.get("quotes", ())))
            for r in rows]


# --- chunk summary -------------------------------------------------------------------------------

CHUNK_SCHEMA = obj_schema({"summary": STR, "quotes": QUOTES}, ["summary", "quotes"])


def chunk_summary(messages: Sequence[ChatMessage], *, previous: str = "", budget_tokens: int,
                  max_quotes: int) -> Prompt:
    """Summarise messages that left the live window into a `recent` summary (RV3).

    `previous` is the latest earlier summary, shown for continuity only (not to be repeated).
    """
    need(messages, "chunk_summary needs at least one message")
    system = (
        "You summarise a stretch of a roleplay chat that is leaving the model's memory, so the "
        "story can go on without it.\n"
        f"- {COMMON_RULES}\n"
        "- Keep every name, decision, promise, plan, discovery, place and object that may matter "
        "later; leave out small talk and style. Past tense, third person.\n"
        f"- The summary is at most about {words_for(budget_tokens)} words and holds no direct quotes.\n"
        f"- Put up to {max_quotes} memorable lines (a vow, a confession, a joke worth recalling) in "
        f"\"quotes\", or none. {QUOTE_RULE}\n"
        f"{ANSWER_RULE}\n"
        + json_block({"summary": "…", "quotes": [{"speaker": "Name", "text": "exact words",
                                                 "message": "m1"}]})
    )
    user = ""
    if previous.strip():
        user += f"The story so far ended with (context only, do not repeat):\n{previous.strip()}\n\n"
    user += "Summarise these messages:\n" + render_messages(messages)
    return make_prompt("chunk_summary", system, user, out_tokens(budget_tokens, max_quotes),
                       {"messages": dump(messages), "previous": previous,
                        "budget_tokens": budget_tokens, "max_quotes": max_quotes}, CHUNK_SCHEMA)


def _parse_chunk(inputs: dict[str, Any], data: dict[str, Any], answer: str) -> Summary:
    messages = messages_from(inputs)
    ml = Labels("chunk_summary", answer, "m", [m.id for m in messages], "message")
    quotes, dropped = check_quotes(data["quotes"], ml, messages, inputs["max_quotes"])
    text = checked_text("chunk_summary", answer, data["summary"], "summary")
    return Summary(text, quotes, tuple(m.id for m in messages), dropped)


def summarize_chunk(messages: Sequence[ChatMessage], *, budget_tokens: int, max_quotes: int,
                    counter: TokenCounter | None = None) -> Summary:
    """A `recent` summary without a model: the chunk's best sentences and lines, verbatim, within
    `budget_tokens` (counted on `Summary.render()`, quotes included)."""
    counter = counter or get_counter()
    units = ex.units_of(messages)
    if not units:
        raise ValueError("the messages hold no text to summarise")
    ranked = ex.ranked(units, ex.names_in(messages))
    quotes, rest = ex.quotes_and_rest(ranked, messages, max_quotes, budget_tokens // 3, counter)
    chosen = ex.select(rest, budget_tokens, counter, fixed=ex.quote_lines(quotes))
    text = ex.render_lines(chosen) or ex.fallback_text(
        rest or ranked, budget_tokens - counter.count(ex.quote_lines(quotes)) - 1, counter)
    if not text:
        text, quotes = ex.quote_lines(quotes[:1]), []
    return Summary(text, tuple(quotes), tuple(m.id for m in messages))


def _chunk_fallback(prompt: Prompt, counter: TokenCounter | None) -> Summary:
    i = prompt.inputs
    return summarize_chunk(messages_from(i), budget_tokens=i["budget_tokens"],
                           max_quotes=i["max_quotes"], counter=counter)


# --- merge ---------------------------------------------------------------------------------------

MERGE_SCHEMA = obj_schema({"summary": STR, "keep_quotes": LABELS}, ["summary", "keep_quotes"])


def merge_summaries(children: Sequence[SummaryInput], *, tier: str = "consolidated",
                    budget_tokens: int, max_quotes: int) -> Prompt:
    """Merge consecutive summaries (4 recent -> 1 consolidated, 4 consolidated -> 1 long-term, RV3).

    The merge reads the texts as given: a person's edit of a child is carried into the merge.
    Quotes are chosen by label among the children's quotes, so a merge cannot invent one.
    """
    need(children, "merge_summaries needs at least one summary")
    if tier not in ("consolidated", "long_term"):
        raise ValueError(f"tier must be consolidated or long_term, not {tier!r}")
    blocks, qn = [], 0
    for i, child in enumerate(children):
        lines = [f"[s{i + 1}]", child.text.strip()]
        for q in child.quotes:
            qn += 1
            lines.append(f"  [q{qn}] {q.speaker}: \u201c{q.text}\u201d")
        blocks.append("\n".join(lines))
    system = (
        "You merge consecutive summaries of a roleplay chat, oldest first, into one shorter summary "
        "of the whole period.\n"
        f"- {COMMON_RULES} The texts may have been corrected by a person: they are the truth.\n"
        "- Keep names, decisions, promises, open threads and how things ended; drop what later "
        "parts made irrelevant. Past tense, third person, in the order things happened.\n"
        f"- At most about {words_for(budget_tokens)} words, no direct quotes in the summary.\n"
        f"- Keep up to {max_quotes} of the listed quotes (labels q1, q2, …) that matter most "
        "for the rest of the story, by label.\n"
        f"{ANSWER_RULE}\n" + json_block({"summary": "…", "keep_quotes": ["q1"] if qn else []})
    )
    user = "Merge these summaries:\n<summaries>\n" + "\n\n".join(blocks) + "\n</summaries>"
    return make_prompt("merge_summaries", system, user, out_tokens(budget_tokens, 0),
                       {"children": dump(children), "tier": tier, "budget_tokens": budget_tokens,
                        "max_quotes": max_quotes}, MERGE_SCHEMA)


def _parse_merge(inputs: dict[str, Any], data: dict[str, Any], answer: str) -> Summary:
    children = summary_inputs(inputs["children"])
    all_quotes = [q for c in children for q in c.quotes]
    ql = Labels("merge_summaries", answer, "q", [str(i) for i in range(len(all_quotes))], "quote")
    picked = [all_quotes[int(i)] for i in ql.many(data["keep_quotes"])]
    dropped = tuple(DroppedQuote(q, "over_limit") for q in picked[inputs["max_quotes"]:])
    text = checked_text("merge_summaries", answer, data["summary"], "summary")
    return Summary(text, tuple(picked[:inputs["max_quotes"]]), tuple(c.id for c in children), dropped)


_PREFIX = re.compile(r"^([^:\n]{1,40}):\s+")


def _summary_units(children: Sequence[str]) -> tuple[list[ex.Unit], list[int]]:
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
    return ex.units_of(lines), child_of


def _select_spread(units: Sequence[ex.Unit], child_of: Sequence[int], n_children: int, budget: int,
                   counter: TokenCounter, fixed: str, names: set[str]) -> list[ex.Unit]:
    """Pick from every child (each gets an even share first), then fill with the best of the rest,
    so a merge covers the whole period rather than only its busiest part."""
    share = max(1, (budget - counter.count(fixed)) // max(1, n_children))
    chosen: list[ex.Unit] = []
    for i in range(n_children):
        mine = ex.ranked([u for u in units if child_of[u.msg] == i], names)
        chosen += ex.select(mine, share, counter)
    for u in ex.ranked(units, names):
        if u not in chosen and counter.count(ex.join_lines(ex.render_lines(chosen + [u]), fixed)) <= budget:
            chosen.append(u)
    while chosen and counter.count(ex.join_lines(ex.render_lines(chosen), fixed)) > budget:
        chosen.remove(min(chosen, key=lambda u: (ex.score(u, names), -u.msg, -u.pos)))
    return chosen


def summarize_merge(children: Sequence[SummaryInput], *, budget_tokens: int, max_quotes: int,
                    counter: TokenCounter | None = None) -> Summary:
    """A `consolidated` or `long_term` summary without a model, chosen from the children's own
    (maybe edited) text."""
    counter = counter or get_counter()
    if not children:
        raise ValueError("merge_summaries needs at least one summary")
    quotes = _fit_quotes_plain(_round_robin([c.quotes for c in children], max_quotes),
                               budget_tokens // 3, counter)
    units, child_of = _summary_units([c.text for c in children])
    names = {u.speaker for u in units if u.speaker} | {q.speaker for c in children for q in c.quotes}
    fixed = ex.quote_lines(quotes)
    chosen = _select_spread(units, child_of, len(children), budget_tokens, counter, fixed, names)
    text = ex.render_lines(chosen)
    if not text:
        text = counter.truncate(" ".join(" ".join(c.text.split()) for c in children),
                                max(1, budget_tokens - counter.count(fixed) - 1))
    return Summary(text, tuple(quotes), tuple(c.id for c in children))


def _fit_quotes_plain(quotes: Sequence[Quote], budget: int, counter: TokenCounter) -> list[Quote]:
    return [q for q, _ in ex.fit_quotes([(q, None) for q in quotes], budget, counter)]


def _round_robin(groups: Sequence[Sequence[Quote]], limit: int) -> list[Quote]:
    out: list[Quote] = []
    depth = 0
    while len(out) < limit and any(depth < len(g) for g in groups):
        out += [g[depth] for g in groups if depth < len(g)]
        depth += 1
    return out[:limit]


def _merge_fallback(prompt: Prompt, counter: TokenCounter | None) -> Summary:
    i = prompt.inputs
    return summarize_merge(summary_inputs(i["children"]), budget_tokens=i["budget_tokens"],
                           max_quotes=i["max_quotes"], counter=counter)


# --- session summary -----------------------------------------------------------------------------

SESSION_SCHEMA = obj_schema({
    "full": STR, "short": STR, "quotes": QUOTES,
    "open_threads": {"type": "array", "items": obj_schema({"text": STR, "priority": LEVEL},
                                                          ["text", "priority"])},
    "resolved": LABELS,
}, ["full", "short", "quotes", "open_threads", "resolved"])


def session_summary(messages: Sequence[ChatMessage], *, earlier: Sequence[SummaryInput] = (),
                    open_notes: Sequence[NoteInput] = (), session: int | None = None,
                    full_tokens: int, short_tokens: int, max_quotes: int, max_threads: int,
                    thread_max_chars: int, only: Sequence[str] | None = None) -> Prompt:
    """Summarise a session (SW2): a full summary and a one-paragraph short one; propose open
    threads for the campaign notes and mark given open notes resolved (SW3).

    A long session does not fit a prompt: pass the summaries of its earlier part as `earlier`
    and only the messages not covered by them as `messages`. `thread_max_chars` bounds an open
    thread the extractive fallback proposes (a model's threads are not cut). `only`: the ids of
    the session's messages when `messages` is a part of the transcript that holds others too
    (MJ1: a part read once for every task); they are a run of it.
    """
    if not messages and not earlier:
        raise ValueError("session_summary needs messages or earlier summaries")
    system = (
        "You write the record of one finished session of a roleplay campaign.\n"
        f"- {COMMON_RULES}\n"
        + ("- Other messages may be shown around the session's own (named below): summarise only "
           "its own.\n" if only is not None else "")
        + f"- \"full\": what happened, in order, at most about {words_for(full_tokens)} words: names, "
        "places, decisions, promises, discoveries, how the session ended. No direct quotes.\n"
        f"- \"short\": ONE paragraph (no line breaks) of at most about {words_for(short_tokens)} words, "
        "the essentials someone needs to continue.\n"
        f"- \"quotes\": up to {max_quotes} memorable lines. {QUOTE_RULE}\n"
        f"- \"open_threads\": up to {max_threads} unresolved narrative threads (a promise not yet kept, "
        "a mystery, a danger, a plan), each with priority 1-5 (5 = most pressing).\n"
        + ("- \"resolved\": labels (n1, n2, …) of the listed open notes this session resolved.\n"
           if open_notes else "- \"resolved\": [] (no open notes are listed).\n")
        + f"{ANSWER_RULE}\n"
        + json_block({"full": "…", "short": "…",
                      "quotes": [{"speaker": "Name", "text": "exact words", "message": "m1"}],
                      "open_threads": [{"text": "…", "priority": 4}],
                      "resolved": ["n1"] if open_notes else []})
    )
    user = f"Session {session}.\n" if session is not None else ""
    mine = [i for i, m in enumerate(messages) if m.id in set(only)] if only is not None else []
    if mine:
        user += f"Its messages: {message_label(mine[0])}-{message_label(mine[-1])}.\n"
    if open_notes:
        user += "Open campaign notes:\n<notes>\n" + "\n".join(
            f"[n{i + 1}] (priority {n.priority}) {n.text}" for i, n in enumerate(open_notes)
        ) + "\n</notes>\n\n"
    if earlier:
        user += "Summaries of the earlier part of the session:\n<summaries>\n" + "\n\n".join(
            f"[s{i + 1}] {s.text.strip()}" for i, s in enumerate(earlier)) + "\n</summaries>\n\n"
    if messages:
        user += "Messages of the session:\n" + render_messages(messages)
    return make_prompt("session_summary", system, user,
                       out_tokens(full_tokens + short_tokens, max_quotes) + 40 * max_threads,
                       {"messages": dump(messages), "earlier": dump(earlier),
                        "open_notes": dump(open_notes), "session": session,
                        "full_tokens": full_tokens, "short_tokens": short_tokens,
                        "max_quotes": max_quotes, "max_threads": max_threads,
                        "thread_max_chars": thread_max_chars,
                        "only": list(only) if only is not None else None}, SESSION_SCHEMA)


def _parse_session(inputs: dict[str, Any], data: dict[str, Any], answer: str) -> SessionSummary:
    task = "session_summary"
    messages = messages_from(inputs)
    ml = Labels(task, answer, "m", [m.id for m in messages], "message")
    nl = Labels(task, answer, "n", [n["id"] for n in inputs["open_notes"]], "note")
    quotes, dropped = check_quotes(data["quotes"], ml, messages, inputs["max_quotes"])
    short = checked_text(task, answer, data["short"], "short")
    if re.search(r"\n\s*\n", short):
        answers.current().changed.append("short had several paragraphs: joined into one")
    short = re.sub(r"\s*\n\s*", " ", short)
    threads = keep_valid(task, answer, data["open_threads"], lambda t: NoteProposal(
        checked_text(task, answer, t["text"], "an open thread"), t["priority"]), "an open thread")
    threads = threads[:inputs["max_threads"]]
    covers = tuple(e["id"] for e in inputs["earlier"]) + tuple(m.id for m in _own(inputs, messages))
    return SessionSummary(checked_text(task, answer, data["full"], "full"), short, quotes,
                          tuple(threads), nl.many(data["resolved"]), covers, dropped)


_PROMISE = re.compile(r"\b(I|we)\s+(promise|swear|vow|give you my word)\b", re.IGNORECASE)
_PLAN = re.compile(r"\b(we|I)\s+(need to|have to|must|will|'ll|’ll|are going to|am going to)\b|"
                   r"\b(tomorrow|next time|at dawn|tonight)\b", re.IGNORECASE)


def summarize_session(messages: Sequence[ChatMessage], *, earlier: Sequence[SummaryInput] = (),
                      open_notes: Sequence[NoteInput] = (), session: int | None = None,
                      full_tokens: int, short_tokens: int, max_quotes: int, max_threads: int,
                      thread_max_chars: int, counter: TokenCounter | None = None) -> SessionSummary:
    """Full and short session summaries (SW2) and open threads from promises and plans (SW3),
    without a model.

    Open notes are never marked resolved here: telling that a thread ended needs understanding.
    """
    counter = counter or get_counter()
    if not messages and not earlier:
        raise ValueError("summarize_session needs messages or earlier summaries")
    parts = list(earlier)
    if messages:
        tail = summarize_chunk(messages, budget_tokens=full_tokens, max_quotes=max_quotes, counter=counter)
        parts.append(SummaryInput("messages", tail.text, tail.quotes))
    full = summarize_merge(parts, budget_tokens=full_tokens, max_quotes=max_quotes, counter=counter)
    units, _ = _summary_units([full.text])
    names = {u.speaker for u in units if u.speaker}
    one_paragraph = lambda us: " ".join(ex.render_lines(us).split("\n"))  # noqa: E731
    short = one_paragraph(ex.select(ex.ranked(units, names), short_tokens, counter, render=one_paragraph))
    if not short:
        short = counter.truncate(" ".join(full.text.split()), short_tokens)
    covers = tuple(e.id for e in earlier) + tuple(m.id for m in messages)
    threads = _threads(messages, max_threads, thread_max_chars)
    return SessionSummary(full.text, short, full.quotes, tuple(threads), (), covers)


def _threads(messages: Sequence[ChatMessage], limit: int, max_chars: int) -> list[NoteProposal]:
    found: list[NoteProposal] = []
    seen: set[str] = set()
    for u in ex.units_of(messages):
        priority = 4 if _PROMISE.search(u.text) else 3 if _PLAN.search(u.text) else 0
        text = f"{u.speaker}: {u.text}"[:max_chars]
        if priority and text not in seen:
            seen.add(text)
            found.append(NoteProposal(text, priority))
    # Promises first, then plans; in the order they were made (sort is stable).
    found.sort(key=lambda n: -n.priority)
    return found[:limit]


def _own(inputs: dict[str, Any], messages: Sequence[ChatMessage]) -> list[ChatMessage]:
    """The session's own messages among those shown (`only`: a part that holds others too)."""
    only = inputs.get("only")
    return list(messages) if only is None else [m for m in messages if m.id in set(only)]


def _session_fallback(prompt: Prompt, counter: TokenCounter | None) -> SessionSummary:
    i = prompt.inputs
    return summarize_session(_own(i, messages_from(i)), earlier=summary_inputs(i["earlier"]),
                             open_notes=[NoteInput(**n) for n in i["open_notes"]],
                             session=i["session"], full_tokens=i["full_tokens"],
                             short_tokens=i["short_tokens"], max_quotes=i["max_quotes"],
                             max_threads=i["max_threads"], thread_max_chars=i["thread_max_chars"],
                             counter=counter)


CHUNK_SUMMARY = Task("chunk_summary", chunk_summary, CHUNK_SCHEMA, _parse_chunk, _chunk_fallback)
MERGE_SUMMARIES = Task("merge_summaries", merge_summaries, MERGE_SCHEMA, _parse_merge, _merge_fallback)
SESSION_SUMMARY = Task("session_summary", session_summary, SESSION_SCHEMA, _parse_session,
                       _session_fallback)
