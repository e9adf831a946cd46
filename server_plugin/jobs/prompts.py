"""Every prompt the sidecar sends to a model, and the strict parser of each answer.

A job goes: render (a `Prompt`) -> complete (a model through `llm.py`, or the SillyTavern
extension through `generateRaw`) -> `parse(prompt, answer)` -> store. A `Prompt` is plain data and
round-trips through JSON (`to_payload` / `from_payload`), so a job row can carry it and the
extension can run it. It holds the task's inputs too, so the parser (and the extractive fallback,
`extractive.run`) need nothing else.

Messages, characters, summaries, notes and secrets are shown to the model under short labels we
assign (m1, c1, s1, q1, n1, k1): models copy "m3" faithfully where they would garble a UUID or an
avatar file name. The parser maps labels back to real ids and rejects labels we did not give.

Parsing is strict. The answer must be one JSON object (a single ```json fence, or prose before and
after one object, is tolerated because it is unambiguous); it must match the task's JSON Schema
(unknown keys are errors); labels must be ones we gave; texts must respect their limits. Anything
else raises `PromptParseError` with a sentence saying what was wrong: the job fails and is retried,
nothing is stored. Quotes are then verified against the cited messages (rule SW8, `quotes.py`);
a quote that is not verbatim is dropped and reported in the result, it does not fail the job.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Iterable, Sequence

from jsonschema import Draft202012Validator
from jsonschema.exceptions import best_match

from ..core.quotes import DEFAULT_MAX_QUOTE_CHARS, DroppedQuote, Quote, verify_quotes

PROMPT_VERSION = 1

# Defaults of the settings these prompts need (the lead's settings table takes them over).
MEMORY_MAX_CHARS = 500  # RV8: each saved memory at most 500 characters
DESCRIPTION_MAX_CHARS = 1000  # RV9c
SAVE_FROM_CONVERSATION_MAX_MESSAGES = 20  # RV9d
SAVE_FROM_CONVERSATION_MAX_DRAFTS = 5  # RV9d
DEEP_MEMORY_MAX_ITEMS = 3  # RV13: a few items per run
SUMMARY_RECENT_TOKENS = 300
SUMMARY_CONSOLIDATED_TOKENS = 450
SUMMARY_LONG_TERM_TOKENS = 600
SESSION_FULL_TOKENS = 900
SESSION_SHORT_TOKENS = 150
SUMMARY_MAX_QUOTES = 4
CHARACTER_MEMORIES_PER_CHARACTER = 3
SCENES_MAX = 6

KINDS = ("name", "birthday", "allergy", "promise", "preference", "fact")


class PromptParseError(ValueError):
    """A model answer that does not follow the format its prompt asked for. Nothing is stored."""

    def __init__(self, task: str, reason: str, answer: str = "") -> None:
        self.task = task
        self.reason = reason
        excerpt = answer.strip().replace("\n", " ")[:160]
        tail = f" The answer began: {excerpt!r}" if excerpt else " The answer was empty."
        super().__init__(f"{task}: the model's answer was rejected: {reason}.{tail}")


# --- inputs -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ChatMessage:
    """One transcript message as a prompt sees it."""

    id: str
    speaker: str
    text: str
    role: str = "user"  # user | assistant | system
    character_id: str | None = None
    sent_at: str | None = None


@dataclass(frozen=True)
class CharacterRef:
    """A character a task may name (chat members, the player included)."""

    id: str
    name: str
    is_player: bool = False
    aliases: tuple[str, ...] = ()


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
class SecretInput:
    """Something only some characters know (SW9b): a sheet secret, a restricted memory, a lore entry."""

    id: str
    text: str
    known_by: tuple[str, ...] = ()


@dataclass(frozen=True)
class SheetInput:
    """A character's sheet for the sheet-updates task (SW1): its text fields, and those a person
    wrote or locked (`kept`: shown, never to be changed). Secrets are never shown."""

    id: str
    fields: dict[str, str] = field(default_factory=dict)
    kept: tuple[str, ...] = ()


@dataclass(frozen=True)
class Newcomer:
    """A named speaker the cast does not know yet, who keeps coming back (SW1)."""

    name: str
    lines: int
    sessions: int


# --- outputs (the extractive fallback produces the same types) ---------------------------------

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


@dataclass(frozen=True)
class MemoryDraft:
    """A durable fact to save as a memory (RV9, RV13, RV18). `character_id` is None for global."""

    text: str
    scope: str  # character | global
    character_id: str | None
    kind: str  # one of KINDS
    source_message_ids: tuple[str, ...] = ()


@dataclass(frozen=True)
class CharacterMemory:
    """A character's own memory of what happened (SW4)."""

    character_id: str
    summary: str
    feeling: str
    quotes: tuple[Quote, ...]
    participants: tuple[str, ...]  # character ids
    witnesses: tuple[str, ...]  # character ids: the chat's members (SW9b), never the model's guess
    session: int | None
    importance: int  # 1-5
    source_message_ids: tuple[str, ...]


@dataclass(frozen=True)
class SceneSummary:
    """A scene in detail: dialogue and actions, with exact quotes (SW5)."""

    title: str
    summary: str
    quotes: tuple[Quote, ...]
    participants: tuple[str, ...]
    witnesses: tuple[str, ...]
    session: int | None
    source_message_ids: tuple[str, ...]


@dataclass(frozen=True)
class ToldEvent:
    """"X told Y about Z" (SW9b): listeners now know the secret; evidence is a verified quote."""

    teller_id: str
    listener_ids: tuple[str, ...]
    secret_id: str
    evidence: Quote


@dataclass(frozen=True)
class SheetDraft:
    """Proposed sheet fields (SW1): for an existing character (`character_id`) or a newcomer
    (`character_id` None, `name` set)."""

    character_id: str | None
    name: str
    fields: dict[str, str]


@dataclass(frozen=True)
class SheetProposals:
    """The sheet-updates task's result: drafts for newcomers, updates for the cast, and what was
    left out (kept fields, secrets, fields over the limit, characters not asked about)."""

    drafts: tuple[SheetDraft, ...]
    updates: tuple[SheetDraft, ...]
    dropped: tuple[str, ...] = ()


@dataclass(frozen=True)
class Extraction:
    """A list-producing task's result: items, quotes dropped by SW8, and items dropped (with why)."""

    items: tuple[Any, ...]
    dropped_quotes: tuple[DroppedQuote, ...] = ()
    dropped_items: tuple[str, ...] = ()


def to_dict(result: Any) -> Any:
    """A result as JSON-ready data (dataclasses become dicts, tuples lists)."""
    return json.loads(json.dumps(asdict(result)))


# --- the prompt object ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Prompt:
    """A rendered task: what to send, how long the answer may be, and the inputs to parse against."""

    task: str
    system: str
    user: str
    max_tokens: int
    inputs: dict[str, Any]
    json_schema: dict[str, Any] = field(default_factory=dict)
    version: int = PROMPT_VERSION

    @property
    def messages(self) -> list[dict[str, str]]:
        """OpenAI-style chat messages."""
        return [{"role": "system", "content": self.system}, {"role": "user", "content": self.user}]

    def response_format(self, mode: str = "off") -> dict[str, Any] | None:
        """The `response_format` to send: `off` (none; works everywhere), `json_object`, `json_schema`."""
        if mode == "off":
            return None
        if mode == "json_object":
            return {"type": "json_object"}
        if mode == "json_schema":
            # strict False: OpenAI's strict mode rejects schema keywords we use (minLength, …).
            return {"type": "json_schema",
                    "json_schema": {"name": self.task, "strict": False, "schema": self.json_schema}}
        raise ValueError(f"unknown JSON mode {mode!r}: use off, json_object or json_schema")

    def to_payload(self) -> dict[str, Any]:
        """JSON-ready form for a job row or the extension (`generateRaw({prompt, systemPrompt,
        responseLength, jsonSchema})` takes `user`, `system`, `max_tokens`, `json_schema`)."""
        return {"task": self.task, "version": self.version, "system": self.system,
                "user": self.user, "max_tokens": self.max_tokens,
                "json_schema": self.json_schema, "inputs": self.inputs}

    def for_client(self) -> dict[str, Any]:
        """The arguments of SillyTavern's `generateRaw` for client mode: no chat, card or World
        Info, just our prompt. (`jsonSchema` follows ST's {name, strict, value} shape; the extension
        may leave it out for backends without structured output.)"""
        return {"systemPrompt": self.system, "prompt": self.user, "responseLength": self.max_tokens,
                "jsonSchema": {"name": self.task, "strict": False, "value": self.json_schema}}

    @classmethod
    def from_payload(cls, payload: dict[str, Any]) -> "Prompt":
        return cls(task=payload["task"], system=payload["system"], user=payload["user"],
                   max_tokens=int(payload["max_tokens"]), inputs=payload["inputs"],
                   json_schema=payload.get("json_schema") or {},
                   version=int(payload.get("version", PROMPT_VERSION)))


# --- rendering helpers ---------------------------------------------------------------------------

def _words(tokens: int) -> int:
    """About how many English words fit in `tokens` (a budget a model can aim at)."""
    return max(20, int(tokens * 0.75) // 10 * 10)


def message_label(i: int) -> str:
    return f"m{i + 1}"


def _render_messages(messages: Sequence[ChatMessage]) -> str:
    parts = []
    for i, m in enumerate(messages):
        who = m.speaker or m.role
        tag = " (player)" if m.role == "user" else ""
        parts.append(f"[{message_label(i)}] {who}{tag}: {m.text.strip()}")
    return "<messages>\n" + "\n\n".join(parts) + "\n</messages>"


def _render_characters(characters: Sequence[CharacterRef]) -> str:
    lines = []
    for i, c in enumerate(characters):
        extra = " (the player's character)" if c.is_player else ""
        aka = f", also called {', '.join(c.aliases)}" if c.aliases else ""
        lines.append(f"c{i + 1} = {c.name}{extra}{aka}")
    return "<characters>\n" + "\n".join(lines) + "\n</characters>"


def _dump(items: Iterable[Any]) -> list[dict[str, Any]]:
    return [asdict(x) for x in items]


def _json_block(example: dict[str, Any]) -> str:
    return json.dumps(example, ensure_ascii=False, indent=1)


_COMMON_RULES = (
    "Use only what is in the text given. Never invent names, events or words. "
    "Write in the language of the conversation."
)

_QUOTE_RULE = (
    "A quote must be copied exactly, character for character, from ONE message, as one unbroken "
    "stretch of words (no \"...\" to skip words), with that message's label; quotes that are not "
    "found word for word in the cited message are thrown away."
)

_ANSWER_RULE = "Answer with one JSON object in exactly this format and nothing else:"


# --- JSON schemas of the answers -----------------------------------------------------------------

def _obj(props: dict[str, Any], required: Sequence[str]) -> dict[str, Any]:
    return {"type": "object", "properties": props, "required": list(required),
            "additionalProperties": False}


_STR = {"type": "string", "minLength": 1}
_LABELS = {"type": "array", "items": {"type": "string"}}
_QUOTE = _obj({"speaker": _STR, "text": _STR, "message": _STR}, ["speaker", "text", "message"])
_QUOTES = {"type": "array", "items": _QUOTE}
_KIND = {"type": "string", "enum": list(KINDS)}
_LEVEL = {"type": "integer", "minimum": 1, "maximum": 5}
SHEET_FIELD_PATTERN = "^[a-z][a-z0-9_]{0,39}$"  # the sheet's field names (shared_schema/character.json)
_SHEET_FIELDS = {"type": "object", "propertyNames": {"pattern": SHEET_FIELD_PATTERN},
                 "additionalProperties": {"type": "string"}}

SCHEMAS: dict[str, dict[str, Any]] = {
    "chunk_summary": _obj({"summary": _STR, "quotes": _QUOTES}, ["summary", "quotes"]),
    "merge_summaries": _obj({"summary": _STR, "keep_quotes": _LABELS}, ["summary", "keep_quotes"]),
    "session_summary": _obj({
        "full": _STR, "short": _STR, "quotes": _QUOTES,
        "open_threads": {"type": "array", "items": _obj({"text": _STR, "priority": _LEVEL},
                                                        ["text", "priority"])},
        "resolved": _LABELS,
    }, ["full", "short", "quotes", "open_threads", "resolved"]),
    "durable_memories": _obj({"memories": {"type": "array", "items": _obj({
        "character": {"type": ["string", "null"]},
        "scope": {"type": "string", "enum": ["character", "global"]},
        "kind": _KIND, "text": _STR, "messages": _LABELS,
    }, ["character", "scope", "kind", "text", "messages"])}}, ["memories"]),
    "character_memories": _obj({"memories": {"type": "array", "items": _obj({
        "character": _STR, "summary": _STR, "feeling": _STR, "quotes": _QUOTES,
        "participants": _LABELS, "importance": _LEVEL, "messages": _LABELS,
    }, ["character", "summary", "feeling", "quotes", "participants", "importance", "messages"])}},
        ["memories"]),
    "scene_summaries": _obj({"scenes": {"type": "array", "items": _obj({
        "title": _STR, "summary": _STR, "quotes": _QUOTES, "participants": _LABELS,
        "messages": _LABELS,
    }, ["title", "summary", "quotes", "participants", "messages"])}}, ["scenes"]),
    "told_events": _obj({"events": {"type": "array", "items": _obj({
        "teller": _STR, "listeners": _LABELS, "secret": _STR, "message": _STR, "evidence": _STR,
    }, ["teller", "listeners", "secret", "message", "evidence"])}}, ["events"]),
    "sheet_updates": _obj({
        "new": {"type": "array", "items": _obj({"newcomer": _STR, "fields": _SHEET_FIELDS},
                                               ["newcomer", "fields"])},
        "updates": {"type": "array", "items": _obj({"character": _STR, "fields": _SHEET_FIELDS},
                                                   ["character", "fields"])},
    }, ["new", "updates"]),
    "memories_from_description": _obj({"memories": {"type": "array", "items": _obj({
        "kind": _KIND, "text": _STR}, ["kind", "text"])}}, ["memories"]),
    "save_from_conversation": _obj({"memories": {"type": "array", "items": _obj({
        "kind": _KIND, "text": _STR, "messages": _LABELS}, ["kind", "text", "messages"])}},
        ["memories"]),
}


# --- the prompts ---------------------------------------------------------------------------------

def chunk_summary(messages: Sequence[ChatMessage], *, previous: str = "",
                  budget_tokens: int = SUMMARY_RECENT_TOKENS,
                  max_quotes: int = SUMMARY_MAX_QUOTES) -> Prompt:
    """Summarise messages that left the live window into a `recent` summary (RV3).

    `previous` is the latest earlier summary, shown for continuity only (not to be repeated).
    """
    _need(messages, "chunk_summary needs at least one message")
    system = (
        "You summarise a stretch of a roleplay chat that is about to leave the model's memory, "
        "so the story can go on consistently without it.\n"
        f"- {_COMMON_RULES}\n"
        "- Keep every name, decision, promise, plan, discovery, place and object that may matter "
        "later; leave out small talk and style. Past tense, third person.\n"
        f"- The summary is at most about {_words(budget_tokens)} words and holds no direct quotes.\n"
        f"- Put up to {max_quotes} memorable lines (a vow, a confession, a joke worth recalling) in "
        f"\"quotes\". {_QUOTE_RULE}\n"
        f"{_ANSWER_RULE}\n"
        + _json_block({"summary": "…", "quotes": [{"speaker": "Name", "text": "exact words",
                                                  "message": "m3"}]})
        + "\nUse \"quotes\": [] when no line is worth keeping."
    )
    user = ""
    if previous.strip():
        user += f"The story so far ended with (context only, do not repeat):\n{previous.strip()}\n\n"
    user += "Summarise these messages:\n" + _render_messages(messages)
    return _prompt("chunk_summary", system, user, _out_tokens(budget_tokens, max_quotes),
                  {"messages": _dump(messages), "previous": previous,
                   "budget_tokens": budget_tokens, "max_quotes": max_quotes})


def merge_summaries(children: Sequence[SummaryInput], *, tier: str = "consolidated",
                    budget_tokens: int | None = None,
                    max_quotes: int = SUMMARY_MAX_QUOTES) -> Prompt:
    """Merge consecutive summaries (4 recent -> 1 consolidated, 4 consolidated -> 1 long-term, RV3).

    The merge reads the texts as given: a person's edit of a child is carried into the merge.
    Quotes are chosen by label among the children's quotes, so a merge cannot invent one.
    """
    _need(children, "merge_summaries needs at least one summary")
    if tier not in ("consolidated", "long_term"):
        raise ValueError(f"tier must be consolidated or long_term, not {tier!r}")
    if budget_tokens is None:
        budget_tokens = SUMMARY_CONSOLIDATED_TOKENS if tier == "consolidated" else SUMMARY_LONG_TERM_TOKENS
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
        f"- {_COMMON_RULES} The texts may have been corrected by a person: they are the truth.\n"
        "- Keep names, decisions, promises, open threads and how things ended; drop what later "
        "parts made irrelevant. Past tense, third person, in the order things happened.\n"
        f"- At most about {_words(budget_tokens)} words, no direct quotes in the summary.\n"
        f"- Keep up to {max_quotes} of the listed quotes (labels q1, q2, …) that matter most "
        "for the rest of the story, by label.\n"
        f"{_ANSWER_RULE}\n" + _json_block({"summary": "…", "keep_quotes": ["q2"]})
    )
    user = "Merge these summaries:\n<summaries>\n" + "\n\n".join(blocks) + "\n</summaries>"
    return _prompt("merge_summaries", system, user, _out_tokens(budget_tokens, 0),
                  {"children": _dump(children), "tier": tier, "budget_tokens": budget_tokens,
                   "max_quotes": max_quotes})


def session_summary(messages: Sequence[ChatMessage], *, earlier: Sequence[SummaryInput] = (),
                    open_notes: Sequence[NoteInput] = (), session: int | None = None,
                    full_tokens: int = SESSION_FULL_TOKENS, short_tokens: int = SESSION_SHORT_TOKENS,
                    max_quotes: int = SUMMARY_MAX_QUOTES, max_threads: int = 5) -> Prompt:
    """Summarise a session (SW2): a full summary and a one-paragraph short one; propose open
    threads for the campaign notes and mark given open notes resolved (SW3).

    A long session does not fit a prompt: pass the summaries of its earlier part as `earlier`
    and only the messages not covered by them as `messages`.
    """
    if not messages and not earlier:
        raise ValueError("session_summary needs messages or earlier summaries")
    system = (
        "You write the record of one finished session of a roleplay campaign.\n"
        f"- {_COMMON_RULES}\n"
        f"- \"full\": what happened, in order, at most about {_words(full_tokens)} words: names, "
        "places, decisions, promises, discoveries, how the session ended. No direct quotes.\n"
        f"- \"short\": ONE paragraph (no line breaks) of at most about {_words(short_tokens)} words, "
        "the essentials someone needs to continue.\n"
        f"- \"quotes\": up to {max_quotes} memorable lines. {_QUOTE_RULE}\n"
        f"- \"open_threads\": up to {max_threads} unresolved narrative threads (a promise not yet kept, "
        "a mystery, a danger, a plan), each with priority 1-5 (5 = most pressing).\n"
        "- \"resolved\": labels (n1, n2, …) of the listed open notes this session resolved.\n"
        f"{_ANSWER_RULE}\n"
        + _json_block({"full": "…", "short": "…",
                       "quotes": [{"speaker": "Name", "text": "exact words", "message": "m3"}],
                       "open_threads": [{"text": "…", "priority": 4}], "resolved": ["n1"]})
    )
    user = f"Session {session}.\n" if session is not None else ""
    if open_notes:
        user += "Open campaign notes:\n<notes>\n" + "\n".join(
            f"[n{i + 1}] (priority {n.priority}) {n.text}" for i, n in enumerate(open_notes)
        ) + "\n</notes>\n\n"
    if earlier:
        user += "Summaries of the earlier part of the session:\n<summaries>\n" + "\n\n".join(
            f"[s{i + 1}] {s.text.strip()}" for i, s in enumerate(earlier)) + "\n</summaries>\n\n"
    if messages:
        user += "Messages of the session:\n" + _render_messages(messages)
    return _prompt("session_summary", system, user,
                  _out_tokens(full_tokens + short_tokens, max_quotes) + 40 * max_threads,
                  {"messages": _dump(messages), "earlier": _dump(earlier),
                   "open_notes": _dump(open_notes), "session": session,
                   "full_tokens": full_tokens, "short_tokens": short_tokens,
                   "max_quotes": max_quotes, "max_threads": max_threads})


_DURABLE_LINE = (
    "Memories are durable facts that stay true for weeks: a preferred name or nickname, a "
    "birthday, an allergy, an explicit promise, a lasting preference or a fixed fact about "
    "someone's life. NOT moods, NOT plot progress, NOT changing relationships: those belong in "
    "summaries."
)


def durable_memories(messages: Sequence[ChatMessage], characters: Sequence[CharacterRef], *,
                     existing: Sequence[str] = (), max_items: int = DEEP_MEMORY_MAX_ITEMS,
                     max_chars: int = MEMORY_MAX_CHARS) -> Prompt:
    """Deep memory (RV13, RV18): the durable facts of a chunk that just left the live window.

    `existing` are texts of memories already saved, so the model does not file them again.
    """
    _need(messages, "durable_memories needs at least one message")
    _need(characters, "durable_memories needs the chat's characters")
    system = (
        "You read a stretch of a roleplay chat and file the few facts the characters must "
        "remember for good.\n"
        f"- {_DURABLE_LINE}\n"
        f"- {_COMMON_RULES} At most {max_items} memories; usually there are none: then answer "
        "{\"memories\": []}.\n"
        "- \"character\" is the label (c1, c2, …) of the character who should remember it, with "
        "\"scope\": \"character\"; use \"character\": null with \"scope\": \"global\" only for a "
        "fact every character should know.\n"
        f"- \"text\": one self-contained sentence naming who it is about, at most {max_chars} "
        "characters. \"messages\": labels of the messages that state it.\n"
        "- Do not repeat a memory already saved.\n"
        f"{_ANSWER_RULE}\n"
        + _json_block({"memories": [{"character": "c1", "scope": "character", "kind": "allergy",
                                     "text": "Sam is allergic to peanuts.", "messages": ["m4"]}]})
        + f"\n\"kind\" is one of: {', '.join(KINDS)}."
    )
    user = _render_characters(characters) + "\n\n"
    if existing:
        user += "Already saved:\n" + "\n".join(f"- {t}" for t in existing) + "\n\n"
    user += "Messages:\n" + _render_messages(messages)
    return _prompt("durable_memories", system, user, 60 + max_items * (max_chars // 3 + 40),
                  {"messages": _dump(messages), "characters": _dump(characters),
                   "existing": list(existing), "max_items": max_items, "max_chars": max_chars})


def character_memories(messages: Sequence[ChatMessage], characters: Sequence[CharacterRef], *,
                       for_ids: Sequence[str] | None = None, session: int | None = None,
                       per_character: int = CHARACTER_MEMORIES_PER_CHARACTER,
                       max_quotes: int = 3) -> Prompt:
    """Character memories (SW4): each non-player character's own version of what happened.

    `characters` are the chat's members (they are the witnesses, SW9b); `for_ids` restricts whose
    memories are extracted (default: every non-player member).
    """
    _need(messages, "character_memories needs at least one message")
    targets = extraction_targets(characters, for_ids)
    labels = {c.id: f"c{i + 1}" for i, c in enumerate(characters)}
    names = ", ".join(f"{labels[c.id]} ({c.name})" for c in targets)
    system = (
        "You read a roleplay scene and write the memories that characters keep of it, each from "
        "that character's own point of view: what they noticed, felt and thought — their version "
        "of events, which may differ from a neutral account.\n"
        f"- {_COMMON_RULES}\n"
        f"- Only for these characters: {names}. Up to {per_character} memories each, only for "
        "moments that matter to them; none for a character who was not involved.\n"
        "- \"summary\": what happened, told from that character's point of view (third person, "
        "past tense). \"feeling\": a few words on what the character felt.\n"
        f"- \"quotes\": up to {max_quotes} lines said in the moment that this character would "
        f"remember word for word. {_QUOTE_RULE}\n"
        "- \"participants\": labels of the characters who took part. \"importance\": 1 (trivial) to "
        "5 (life-changing). \"messages\": labels of the messages the memory comes from.\n"
        f"{_ANSWER_RULE}\n"
        + _json_block({"memories": [{"character": "c2", "summary": "…", "feeling": "…",
                                     "quotes": [{"speaker": "Name", "text": "exact words",
                                                 "message": "m3"}],
                                     "participants": ["c1", "c2"], "importance": 3,
                                     "messages": ["m2", "m3"]}]})
    )
    user = _render_characters(characters) + "\n\nMessages:\n" + _render_messages(messages)
    return _prompt("character_memories", system, user,
                  100 + len(targets) * per_character * (160 + 50 * max_quotes),
                  {"messages": _dump(messages), "characters": _dump(characters),
                   "for_ids": [c.id for c in targets], "session": session,
                   "per_character": per_character, "max_quotes": max_quotes})


def scene_summaries(messages: Sequence[ChatMessage], characters: Sequence[CharacterRef], *,
                    session: int | None = None, max_scenes: int = SCENES_MAX,
                    max_quotes: int = 4) -> Prompt:
    """Scene summaries (SW5): specific dialogue and actions, in more detail than a session summary."""
    _need(messages, "scene_summaries needs at least one message")
    system = (
        "You split a stretch of a roleplay chat into scenes (a scene changes with place, time or "
        "who is present) and describe each one in detail.\n"
        f"- {_COMMON_RULES}\n"
        f"- At most {max_scenes} scenes, in order. \"summary\": the specific actions and exchanges, "
        "who did and said what, in the order they happened.\n"
        f"- \"quotes\": up to {max_quotes} exact lines of dialogue per scene. {_QUOTE_RULE}\n"
        "- \"participants\": labels (c1, c2, …) of the characters in the scene. \"messages\": labels "
        "of the scene's messages.\n"
        f"{_ANSWER_RULE}\n"
        + _json_block({"scenes": [{"title": "…", "summary": "…",
                                   "quotes": [{"speaker": "Name", "text": "exact words",
                                               "message": "m3"}],
                                   "participants": ["c1"], "messages": ["m1", "m2", "m3"]}]})
    )
    user = _render_characters(characters) + "\n\nMessages:\n" + _render_messages(messages)
    return _prompt("scene_summaries", system, user, 100 + max_scenes * (250 + 50 * max_quotes),
                  {"messages": _dump(messages), "characters": _dump(characters),
                   "session": session, "max_scenes": max_scenes, "max_quotes": max_quotes})


def told_events(messages: Sequence[ChatMessage], characters: Sequence[CharacterRef],
                secrets: Sequence[SecretInput], *, max_events: int = 5) -> Prompt:
    """Secrets passed on (SW9b): find where a character tells another one of the listed secrets."""
    _need(messages, "told_events needs at least one message")
    _need(secrets, "told_events needs the secrets to look for")
    labels = {c.id: f"c{i + 1}" for i, c in enumerate(characters)}
    system = (
        "You check whether, in these roleplay messages, a character reveals one of the listed "
        "secrets to other characters (says it, hints it unmistakably, or shows the proof).\n"
        f"- {_COMMON_RULES} Report only clear cases; usually there are none: then answer "
        "{\"events\": []}.\n"
        f"- At most {max_events} events. \"teller\" and \"listeners\": character labels (c1, c2, …); "
        "\"secret\": the secret's label (k1, k2, …); \"message\": the label of the message where it "
        "is told; \"evidence\": the words in that message that reveal it, copied exactly.\n"
        f"{_ANSWER_RULE}\n"
        + _json_block({"events": [{"teller": "c1", "listeners": ["c2"], "secret": "k1",
                                   "message": "m5", "evidence": "exact words"}]})
    )
    secret_lines = []
    for i, s in enumerate(secrets):
        who = ", ".join(labels.get(k, "someone not present") for k in s.known_by) or "nobody listed"
        secret_lines.append(f"[k{i + 1}] {s.text.strip()} (known by: {who})")
    user = (_render_characters(characters) + "\n\nSecrets:\n<secrets>\n" + "\n".join(secret_lines)
            + "\n</secrets>\n\nMessages:\n" + _render_messages(messages))
    return _prompt("told_events", system, user, 60 + max_events * 120,
                  {"messages": _dump(messages), "characters": _dump(characters),
                   "secrets": _dump(secrets), "max_events": max_events})


def memories_from_description(description: str, character: CharacterRef | None, *,
                              max_items: int = SAVE_FROM_CONVERSATION_MAX_DRAFTS,
                              max_chars: int = MEMORY_MAX_CHARS,
                              description_max_chars: int = DESCRIPTION_MAX_CHARS) -> Prompt:
    """"Generate memories" (RV9c) from a person's description — never from the chat.

    `character` None means the drafts are global memories.
    """
    text = description.strip()
    if not text:
        raise ValueError("the description is empty")
    if len(text) > description_max_chars:
        raise ValueError(f"the description has {len(text)} characters; at most "
                         f"{description_max_chars} are allowed (rule RV9c)")
    who = character.name if character else "every character"
    system = (
        f"A person describes what {who} should remember. Turn the description into separate "
        "memories.\n"
        f"- {_DURABLE_LINE}\n"
        f"- Use only the description. At most {max_items} memories, each one self-contained "
        f"sentence of at most {max_chars} characters, in the language of the description.\n"
        f"{_ANSWER_RULE}\n"
        + _json_block({"memories": [{"kind": "fact", "text": "…"}]})
        + f"\n\"kind\" is one of: {', '.join(KINDS)}."
    )
    user = f"What should {who} remember?\n<description>\n{text}\n</description>"
    return _prompt("memories_from_description", system, user, 60 + max_items * (max_chars // 3 + 20),
                  {"description": text, "character": asdict(character) if character else None,
                   "max_items": max_items, "max_chars": max_chars})


def save_from_conversation(messages: Sequence[ChatMessage], character: CharacterRef | None, *,
                           max_drafts: int = SAVE_FROM_CONVERSATION_MAX_DRAFTS,
                           max_messages: int = SAVE_FROM_CONVERSATION_MAX_MESSAGES,
                           max_chars: int = MEMORY_MAX_CHARS) -> Prompt:
    """"Save from conversation" (RV9d): up to 5 memory drafts from up to 20 chosen messages.

    The drafts are for a person to review; `character` None means global memories.
    """
    _need(messages, "save_from_conversation needs at least one message")
    if len(messages) > max_messages:
        raise ValueError(f"{len(messages)} messages selected; at most {max_messages} are allowed "
                         "(rule RV9d)")
    who = character.name if character else "every character"
    system = (
        f"A person picked these messages because {who} should remember something in them. Write "
        "memory drafts for the person to review.\n"
        f"- {_DURABLE_LINE} A promise and the answer to it belong in one memory.\n"
        f"- {_COMMON_RULES} At most {max_drafts} drafts, each one self-contained sentence of at "
        f"most {max_chars} characters, with the labels of the messages it comes from.\n"
        f"{_ANSWER_RULE}\n"
        + _json_block({"memories": [{"kind": "promise", "text": "…", "messages": ["m1", "m2"]}]})
        + f"\n\"kind\" is one of: {', '.join(KINDS)}."
    )
    user = "Messages:\n" + _render_messages(messages)
    return _prompt("save_from_conversation", system, user, 60 + max_drafts * (max_chars // 3 + 30),
                  {"messages": _dump(messages), "character": asdict(character) if character else None,
                   "max_drafts": max_drafts, "max_chars": max_chars})


SHEET_MAX_FIELDS = 6
SHEET_FIELD_MAX_CHARS = 600


def sheet_updates(messages: Sequence[ChatMessage], characters: Sequence[CharacterRef],
                  sheets: Sequence[SheetInput], newcomers: Sequence[Newcomer], *,
                  max_fields: int = SHEET_MAX_FIELDS,
                  field_max_chars: int = SHEET_FIELD_MAX_CHARS) -> Prompt:
    """Sheets grow with play (SW1): draft a sheet for each recurring newcomer, and propose what the
    session changed or revealed in the sheets of `sheets` (characters of `characters`).

    Fields in `SheetInput.kept` were written or locked by a person: shown, never to be changed.
    """
    _need(messages, "sheet_updates needs at least one message")
    if not sheets and not newcomers:
        raise ValueError("sheet_updates needs sheets to update or newcomers to draft")
    labels = {c.id: f"c{i + 1}" for i, c in enumerate(characters)}
    names = {c.id: c.name for c in characters}
    missing = [x.id for x in sheets if x.id not in labels]
    if missing:
        raise ValueError(f"sheets of characters not among the characters given: {missing}")
    system = (
        "You keep the character sheets of a roleplay campaign up to date after a session.\n"
        f"- {_COMMON_RULES}\n"
        "- \"new\": for each listed newcomer (labels n1, n2, …), a short sheet of what the messages "
        "show: e.g. role, appearance, personality, manner of speech, relationships.\n"
        "- \"updates\": for listed sheets (labels c1, c2, …), only fields whose content the session "
        "changed or newly revealed, each rewritten in full. Never change a field marked (kept). "
        "Do not write secrets. Leave out characters with nothing new.\n"
        f"- Field names: lower case letters, digits and _ (e.g. \"appearance\"); values plain text "
        f"of at most {field_max_chars} characters; at most {max_fields} fields per character.\n"
        f"{_ANSWER_RULE}\n"
        + _json_block({"new": [{"newcomer": "n1", "fields": {"role": "…", "appearance": "…"}}],
                       "updates": [{"character": "c2", "fields": {"relationships": "…"}}]})
        + "\nUse [] for either list when there is nothing to add."
    )
    blocks = []
    for sheet in sheets:
        lines = [f"[{labels[sheet.id]}] {names[sheet.id]}"]
        lines += [f"- {name}{' (kept)' if name in sheet.kept else ''}: {value.strip()}"
                  for name, value in sheet.fields.items()] or ["- (empty sheet)"]
        blocks.append("\n".join(lines))
    user = _render_characters(characters) + "\n\n"
    if blocks:
        user += "Sheets:\n<sheets>\n" + "\n\n".join(blocks) + "\n</sheets>\n\n"
    if newcomers:
        user += "Newcomers:\n<newcomers>\n" + "\n".join(
            f"[n{i + 1}] {n.name} (speaks in {n.lines} messages over {n.sessions} sessions)"
            for i, n in enumerate(newcomers)) + "\n</newcomers>\n\n"
    user += "Messages of the session:\n" + _render_messages(messages)
    per = max_fields * (field_max_chars // 3 + 20)
    return _prompt("sheet_updates", system, user, 60 + (len(sheets) + len(newcomers)) * per,
                  {"messages": _dump(messages), "characters": _dump(characters),
                   "sheets": _dump(sheets), "newcomers": _dump(newcomers),
                   "max_fields": max_fields, "field_max_chars": field_max_chars})


def _prompt(task: str, system: str, user: str, max_tokens: int, inputs: dict[str, Any]) -> Prompt:
    """A Prompt whose inputs are already in their JSON form (tuples as lists), so a prompt equals
    itself after the round trip through a job row or the extension."""
    return Prompt(task, system, user, max_tokens, json.loads(json.dumps(inputs)), SCHEMAS[task])


def _out_tokens(budget_tokens: int, max_quotes: int) -> int:
    """Room for the answer: the text, the JSON around it, and the quotes (non-English text and
    JSON escapes cost more tokens than the words suggest, so the margin is generous)."""
    return int(budget_tokens * 1.5) + 60 + max_quotes * 80


def _need(items: Sequence[Any], message: str) -> None:
    if not items:
        raise ValueError(message)


def extraction_targets(characters: Sequence[CharacterRef],
                       for_ids: Sequence[str] | None) -> list[CharacterRef]:
    """Whose memories to extract: `for_ids`, or every non-player character given."""
    _need(characters, "this task needs the chat's characters")
    if for_ids is None:
        targets = [c for c in characters if not c.is_player]
    else:
        known = {c.id: c for c in characters}
        missing = [i for i in for_ids if i not in known]
        if missing:
            raise ValueError(f"for_ids names characters not among the characters given: {missing}")
        targets = [known[i] for i in for_ids]
    _need(targets, "no character to extract memories for")
    return targets


# --- parsing -------------------------------------------------------------------------------------

_FENCE = re.compile(r"```[ \t]*([A-Za-z]*)[ \t]*\r?\n(.*?)```", re.DOTALL)


def extract_json(answer: str) -> dict[str, Any]:
    """The one JSON object in a model's answer. Raises ValueError with a reason otherwise.

    Accepted: the bare object; exactly one fenced code block holding it; prose before and after
    one object, as long as the prose holds no braces (so where the object is is not a guess).
    """
    text = answer.strip().lstrip("\ufeff")
    if not text:
        raise ValueError("the answer is empty")
    try:
        whole = json.loads(text)
    except ValueError:
        pass
    else:
        if not isinstance(whole, dict):
            raise ValueError("the answer is JSON but not an object")
        return whole
    fences = _FENCE.findall(text)
    if len(fences) > 1:
        raise ValueError(f"the answer holds {len(fences)} code blocks; expected one JSON object")
    if fences:
        lang, body = fences[0]
        if lang and lang.lower() not in ("json", "json5", "javascript", "js"):
            raise ValueError(f"the code block is marked {lang!r}, not JSON")
        return _loads_object(body.strip(), "the code block")
    first, last = text.find("{"), text.rfind("}")
    if first < 0:
        raise ValueError("no JSON object found in the answer")
    if last < first:
        raise ValueError("the JSON object in the answer is not closed (cut off?)")
    return _loads_object(text[first:last + 1], "the JSON object in the answer")


def _loads_object(text: str, where: str) -> dict[str, Any]:
    try:
        obj = json.loads(text)
    except ValueError as e:
        raise ValueError(f"{where} is not valid JSON ({e})") from None
    if not isinstance(obj, dict):
        raise ValueError(f"{where} is JSON but not an object")
    return obj


def _validate(task: str, data: dict[str, Any], answer: str) -> None:
    error = best_match(Draft202012Validator(SCHEMAS[task]).iter_errors(data))
    if error is not None:
        where = "/".join(str(p) for p in error.absolute_path) or "the top level"
        raise PromptParseError(task, f"at {where}: {error.message}", answer)


class _Labels:
    """Maps the labels a prompt showed (m1, c2, …) back to ids, rejecting any we did not show."""

    def __init__(self, task: str, answer: str, prefix: str, ids: Sequence[str], what: str) -> None:
        self.task, self.answer, self.what = task, answer, what
        self.map = {f"{prefix}{i + 1}": x for i, x in enumerate(ids)}

    def one(self, label: Any) -> str:
        key = str(label).strip().strip("[]")
        if key not in self.map:
            shown = ", ".join(list(self.map)[:3]) + ("…" if len(self.map) > 3 else "")
            raise PromptParseError(self.task, f"{label!r} is not one of the {self.what} labels "
                                              f"given ({shown})", self.answer)
        return self.map[key]

    def many(self, labels: Iterable[Any], *, nonempty: bool = False, field_name: str = "") -> tuple[str, ...]:
        out = tuple(dict.fromkeys(self.one(x) for x in labels))
        if nonempty and not out:
            raise PromptParseError(self.task, f"{field_name or self.what} must cite at least one "
                                              "label", self.answer)
        return out


def messages_from(inputs: dict[str, Any]) -> list[ChatMessage]:
    """The messages a rendered prompt carries, as ChatMessage objects."""
    return [ChatMessage(**m) for m in inputs.get("messages", [])]


def characters_from(inputs: dict[str, Any]) -> list[CharacterRef]:
    """The characters a rendered prompt carries, as CharacterRef objects."""
    return [CharacterRef(**{**c, "aliases": tuple(c.get("aliases", ()))})
            for c in inputs.get("characters", [])]


def _quote_in(q: dict[str, Any]) -> Quote:
    return Quote(q["speaker"], q["text"], q["message_id"])


def _text(task: str, answer: str, value: str, name: str, max_chars: int | None = None) -> str:
    text = value.strip()
    if not text:
        raise PromptParseError(task, f"{name} is blank", answer)
    if max_chars is not None and len(text) > max_chars:
        raise PromptParseError(task, f"{name} has {len(text)} characters, more than {max_chars}",
                               answer)
    return text


def _check_quotes(raw: list[dict[str, Any]], mlabels: _Labels, messages: Sequence[ChatMessage],
                  limit: int) -> tuple[tuple[Quote, ...], tuple[DroppedQuote, ...]]:
    """Map quote labels to ids (an unknown label fails the parse), then verify them (SW8)."""
    cited = [Quote(q["speaker"].strip(), q["text"], mlabels.one(q["message"])) for q in raw]
    check = verify_quotes(cited, {m.id: m.text for m in messages}, max_chars=DEFAULT_MAX_QUOTE_CHARS)
    kept = check.kept[:limit]
    over = tuple(DroppedQuote(q, "over_limit") for q in check.kept[limit:])
    return kept, check.dropped + over


def _parse_chunk_summary(inputs: dict[str, Any], data: dict[str, Any], answer: str) -> Summary:
    messages = messages_from(inputs)
    ml = _Labels("chunk_summary", answer, "m", [m.id for m in messages], "message")
    quotes, dropped = _check_quotes(data["quotes"], ml, messages, inputs["max_quotes"])
    text = _text("chunk_summary", answer, data["summary"], "summary")
    return Summary(text, quotes, tuple(m.id for m in messages), dropped)


def _parse_merge(inputs: dict[str, Any], data: dict[str, Any], answer: str) -> Summary:
    children = [SummaryInput(c["id"], c["text"], tuple(_quote_in(q) for q in c["quotes"]))
                for c in inputs["children"]]
    all_quotes = [q for c in children for q in c.quotes]
    ql = _Labels("merge_summaries", answer, "q", [str(i) for i in range(len(all_quotes))], "quote")
    picked = [all_quotes[int(i)] for i in ql.many(data["keep_quotes"])]
    dropped = tuple(DroppedQuote(q, "over_limit") for q in picked[inputs["max_quotes"]:])
    text = _text("merge_summaries", answer, data["summary"], "summary")
    return Summary(text, tuple(picked[:inputs["max_quotes"]]), tuple(c.id for c in children), dropped)


def _parse_session(inputs: dict[str, Any], data: dict[str, Any], answer: str) -> SessionSummary:
    task = "session_summary"
    messages = messages_from(inputs)
    ml = _Labels(task, answer, "m", [m.id for m in messages], "message")
    nl = _Labels(task, answer, "n", [n["id"] for n in inputs["open_notes"]], "note")
    quotes, dropped = _check_quotes(data["quotes"], ml, messages, inputs["max_quotes"])
    short = _text(task, answer, data["short"], "short")
    if re.search(r"\n\s*\n", short):
        raise PromptParseError(task, "short must be one paragraph, it has several", answer)
    short = re.sub(r"\s*\n\s*", " ", short)
    threads = [NoteProposal(_text(task, answer, t["text"], "an open thread"), t["priority"])
               for t in data["open_threads"]][:inputs["max_threads"]]
    covers = tuple(e["id"] for e in inputs["earlier"]) + tuple(m.id for m in messages)
    return SessionSummary(_text(task, answer, data["full"], "full"), short, quotes, tuple(threads),
                          nl.many(data["resolved"]), covers, dropped)


def _scope(task: str, answer: str, scope: str, character_id: str | None) -> None:
    if scope == "character" and character_id is None:
        raise PromptParseError(task, "a memory with scope 'character' needs a character", answer)
    if scope == "global" and character_id is not None:
        raise PromptParseError(task, "a memory with scope 'global' must have character null", answer)


def _parse_durable(inputs: dict[str, Any], data: dict[str, Any], answer: str) -> Extraction:
    task = "durable_memories"
    messages, characters = messages_from(inputs), characters_from(inputs)
    ml = _Labels(task, answer, "m", [m.id for m in messages], "message")
    cl = _Labels(task, answer, "c", [c.id for c in characters], "character")
    existing = {_fold(t) for t in inputs["existing"]}
    items, dropped = [], []
    for raw in data["memories"]:
        cid = cl.one(raw["character"]) if raw["character"] is not None else None
        _scope(task, answer, raw["scope"], cid)
        text = _text(task, answer, raw["text"], "a memory's text", inputs["max_chars"])
        draft = MemoryDraft(text, raw["scope"], cid, raw["kind"],
                            ml.many(raw["messages"], nonempty=True, field_name="a memory"))
        if _fold(text) in existing:
            dropped.append(f"already saved: {text[:80]}")
        else:
            existing.add(_fold(text))
            items.append(draft)
    dropped += [f"over the limit of {inputs['max_items']}: {d.text[:80]}"
                for d in items[inputs["max_items"]:]]
    return Extraction(tuple(items[:inputs["max_items"]]), (), tuple(dropped))


def _fold(text: str) -> str:
    return " ".join(text.casefold().split())


def _parse_character_memories(inputs: dict[str, Any], data: dict[str, Any], answer: str) -> Extraction:
    task = "character_memories"
    messages, characters = messages_from(inputs), characters_from(inputs)
    ml = _Labels(task, answer, "m", [m.id for m in messages], "message")
    cl = _Labels(task, answer, "c", [c.id for c in characters], "character")
    members = tuple(c.id for c in characters)
    per: dict[str, int] = {}
    items, dq, dropped = [], [], []
    for raw in data["memories"]:
        cid = cl.one(raw["character"])
        if cid not in inputs["for_ids"]:  # a real character, just not one we asked about
            dropped.append(f"not asked for: a memory of {cid}")
            continue
        quotes, qdrop = _check_quotes(raw["quotes"], ml, messages, inputs["max_quotes"])
        dq += qdrop
        mem = CharacterMemory(
            cid, _text(task, answer, raw["summary"], "summary"),
            _text(task, answer, raw["feeling"], "feeling", 200), quotes,
            cl.many(raw["participants"]), members, inputs["session"], raw["importance"],
            ml.many(raw["messages"], nonempty=True, field_name="a memory"))
        per[cid] = per.get(cid, 0) + 1
        if per[cid] > inputs["per_character"]:
            dropped.append(f"over {inputs['per_character']} memories for {cid}")
        else:
            items.append(mem)
    return Extraction(tuple(items), tuple(dq), tuple(dropped))


def _parse_scenes(inputs: dict[str, Any], data: dict[str, Any], answer: str) -> Extraction:
    task = "scene_summaries"
    messages, characters = messages_from(inputs), characters_from(inputs)
    ml = _Labels(task, answer, "m", [m.id for m in messages], "message")
    cl = _Labels(task, answer, "c", [c.id for c in characters], "character")
    members = tuple(c.id for c in characters)
    items, dq = [], []
    for raw in data["scenes"]:
        quotes, qdrop = _check_quotes(raw["quotes"], ml, messages, inputs["max_quotes"])
        dq += qdrop
        items.append(SceneSummary(
            _text(task, answer, raw["title"], "title", 200),
            _text(task, answer, raw["summary"], "summary"), quotes, cl.many(raw["participants"]),
            members, inputs["session"], ml.many(raw["messages"], nonempty=True, field_name="a scene")))
    dropped = tuple(f"over the limit of {inputs['max_scenes']} scenes: {s.title[:80]}"
                    for s in items[inputs["max_scenes"]:])
    return Extraction(tuple(items[:inputs["max_scenes"]]), tuple(dq), dropped)


def _parse_told(inputs: dict[str, Any], data: dict[str, Any], answer: str) -> Extraction:
    task = "told_events"
    messages, characters = messages_from(inputs), characters_from(inputs)
    ml = _Labels(task, answer, "m", [m.id for m in messages], "message")
    cl = _Labels(task, answer, "c", [c.id for c in characters], "character")
    kl = _Labels(task, answer, "k", [s["id"] for s in inputs["secrets"]], "secret")
    names = {c.id: c.name for c in characters}
    items, dq, dropped = [], [], []
    for raw in data["events"]:
        teller = cl.one(raw["teller"])
        listeners = tuple(x for x in cl.many(raw["listeners"], nonempty=True,
                                             field_name="listeners") if x != teller)
        secret = kl.one(raw["secret"])
        claim = Quote(names[teller], raw["evidence"], ml.one(raw["message"]))
        check = verify_quotes([claim], {m.id: m.text for m in messages})
        if not check.kept:
            dq += check.dropped
            dropped.append(f"evidence not found in the message: {raw['evidence'][:80]}")
        elif not listeners:
            dropped.append("a character cannot tell a secret only to themselves")
        else:
            items.append(ToldEvent(teller, listeners, secret, check.kept[0]))
    dropped += [f"over the limit of {inputs['max_events']} events" for _ in items[inputs["max_events"]:]]
    return Extraction(tuple(items[:inputs["max_events"]]), tuple(dq), tuple(dropped))


def _target(inputs: dict[str, Any]) -> tuple[str, str | None]:
    character = inputs.get("character")
    return ("character", character["id"]) if character else ("global", None)


def _parse_description(inputs: dict[str, Any], data: dict[str, Any], answer: str) -> Extraction:
    scope, cid = _target(inputs)
    items = [MemoryDraft(_text("memories_from_description", answer, raw["text"], "a memory's text",
                               inputs["max_chars"]), scope, cid, raw["kind"])
             for raw in data["memories"]]
    dropped = tuple(f"over the limit of {inputs['max_items']}" for _ in items[inputs["max_items"]:])
    return Extraction(tuple(items[:inputs["max_items"]]), (), dropped)


def _parse_save(inputs: dict[str, Any], data: dict[str, Any], answer: str) -> Extraction:
    task = "save_from_conversation"
    messages = messages_from(inputs)
    ml = _Labels(task, answer, "m", [m.id for m in messages], "message")
    scope, cid = _target(inputs)
    items = [MemoryDraft(_text(task, answer, raw["text"], "a draft's text", inputs["max_chars"]),
                         scope, cid, raw["kind"],
                         ml.many(raw["messages"], nonempty=True, field_name="a draft"))
             for raw in data["memories"]]
    dropped = tuple(f"over the limit of {inputs['max_drafts']}" for _ in items[inputs["max_drafts"]:])
    return Extraction(tuple(items[:inputs["max_drafts"]]), (), dropped)


def _sheet_fields(task: str, answer: str, raw: dict[str, str], kept: Sequence[str], who: str,
                  inputs: dict[str, Any], dropped: list[str]) -> dict[str, str]:
    """A proposal's fields: secrets and kept fields left out (noted), texts checked, at most
    `max_fields` (the rest noted)."""
    fields: dict[str, str] = {}
    for name, value in raw.items():
        if name == "secrets":
            dropped.append(f"{who}: secrets are not written by a model")
        elif name in kept:
            dropped.append(f"{who}: {name} is kept by a person")
        elif len(fields) >= inputs["max_fields"]:
            dropped.append(f"{who}: {name} is over the limit of {inputs['max_fields']} fields")
        else:
            fields[name] = _text(task, answer, value, f"{who}'s {name}", inputs["field_max_chars"])
    return fields


def _parse_sheet_updates(inputs: dict[str, Any], data: dict[str, Any], answer: str) -> SheetProposals:
    task = "sheet_updates"
    characters = characters_from(inputs)
    sheets = {s["id"]: s for s in inputs["sheets"]}
    names = {c.id: c.name for c in characters}
    cl = _Labels(task, answer, "c", [c.id for c in characters], "character")
    nl = _Labels(task, answer, "n", [n["name"] for n in inputs["newcomers"]], "newcomer")
    dropped: list[str] = []
    drafts: dict[str, dict[str, str]] = {}
    for raw in data["new"]:
        name = nl.one(raw["newcomer"])
        drafts.setdefault(name, {}).update(_sheet_fields(task, answer, raw["fields"], (), name, inputs, dropped))
    updates: dict[str, dict[str, str]] = {}
    for raw in data["updates"]:
        cid = cl.one(raw["character"])
        if cid not in sheets:  # a real character, just not one whose sheet was offered
            dropped.append(f"not asked for: the sheet of {cid}")
            continue
        fields = _sheet_fields(task, answer, raw["fields"], sheets[cid]["kept"], names[cid], inputs, dropped)
        if fields:
            updates.setdefault(cid, {}).update(fields)
    return SheetProposals(tuple(SheetDraft(None, n, f) for n, f in drafts.items() if f),
                          tuple(SheetDraft(c, names[c], f) for c, f in updates.items()), tuple(dropped))


PARSERS: dict[str, Callable[[dict[str, Any], dict[str, Any], str], Any]] = {
    "chunk_summary": _parse_chunk_summary,
    "merge_summaries": _parse_merge,
    "session_summary": _parse_session,
    "durable_memories": _parse_durable,
    "character_memories": _parse_character_memories,
    "scene_summaries": _parse_scenes,
    "told_events": _parse_told,
    "sheet_updates": _parse_sheet_updates,
    "memories_from_description": _parse_description,
    "save_from_conversation": _parse_save,
}


def parse(prompt: Prompt, answer: str) -> Any:
    """Parse a model's answer to `prompt` into the task's result type, or raise PromptParseError."""
    if prompt.task not in PARSERS:
        raise ValueError(f"unknown task {prompt.task!r}")
    try:
        data = extract_json(answer)
    except ValueError as e:
        raise PromptParseError(prompt.task, str(e), answer) from None
    _validate(prompt.task, data, answer)
    return PARSERS[prompt.task](prompt.inputs, data, answer)
