"""The memory tasks (RV8, RV9c, RV9d, RV13, RV18): durable facts of a chunk for deep memory
(`durable_memories`), memories from a person's description (`memories_from_description`) and
drafts from messages a person picked (`save_from_conversation`). Each with its prompt, schema,
parser and extractive fallback (facts found by fixed patterns: "my name is", "call me", "my
birthday is", "I'm allergic to", "I promise"…)."""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Iterable, Sequence

from ...core.text import fold, roleplay_sentences
from . import extractive as ex
from .base import (
    ANSWER_RULE,
    COMMON_RULES,
    LABELS,
    STR,
    CharacterRef,
    ChatMessage,
    Extraction,
    Labels,
    Prompt,
    PromptParseError,
    Task,
    cast_labels,
    characters_from,
    checked_text,
    dump,
    json_block,
    keep_valid,
    make_prompt,
    messages_from,
    need,
    obj_schema,
    render_characters,
    render_messages,
)

if TYPE_CHECKING:
    from ...core.tokens import TokenCounter

KINDS = ("name", "birthday", "allergy", "promise", "preference", "fact")


@dataclass(frozen=True)
class MemoryDraft:
    """A durable fact to save as a memory (RV9, RV13, RV18). `character_id` is None for global."""

    text: str
    scope: str  # character | global
    character_id: str | None
    kind: str  # one of KINDS
    source_message_ids: tuple[str, ...] = ()


_KIND = {"type": "string", "enum": list(KINDS)}

_DURABLE_LINE = (
    "Memories are durable facts that stay true for weeks: a preferred name or nickname, a "
    "birthday, an allergy, an explicit promise, a lasting preference or a fixed fact about "
    "someone's life. NOT moods, NOT plot progress, NOT changing relationships: those belong in "
    "summaries."
)


def _character(row: dict[str, Any] | None) -> CharacterRef | None:
    return CharacterRef(**{**row, "aliases": tuple(row.get("aliases", ()))}) if row else None


def _target(inputs: dict[str, Any]) -> tuple[str, str | None]:
    character = inputs.get("character")
    return ("character", character["id"]) if character else ("global", None)


# --- durable memories (deep memory) --------------------------------------------------------------

DURABLE_SCHEMA = obj_schema({"memories": {"type": "array", "items": obj_schema({
    "character": {"type": ["string", "null"]},
    "scope": {"type": "string", "enum": ["character", "global"]},
    "kind": _KIND, "text": STR, "messages": LABELS,
}, ["character", "scope", "kind", "text", "messages"])}}, ["memories"])


def durable_memories(messages: Sequence[ChatMessage], characters: Sequence[CharacterRef], *,
                     existing: Sequence[str] = (), max_items: int, max_chars: int) -> Prompt:
    """Deep memory (RV13, RV18): the durable facts of a chunk that just left the live window.

    `existing` are texts of memories already saved, so the model does not file them again.
    """
    need(messages, "durable_memories needs at least one message")
    need(characters, "durable_memories needs the chat's characters")
    system = (
        "You read a stretch of a roleplay chat and file the few facts the characters must "
        "remember for good.\n"
        f"- {_DURABLE_LINE}\n"
        f"- {COMMON_RULES} At most {max_items} memories; usually there are none: then answer "
        "{\"memories\": []}.\n"
        "- \"character\": the label of who should remember it, \"scope\": \"character\"; "
        "\"character\": null, \"scope\": \"global\" only for what every character should know.\n"
        f"- \"text\": one self-contained sentence naming who it is about, at most {max_chars} "
        "characters. \"messages\": labels of the messages that state it.\n"
        "- Do not repeat a memory already saved.\n"
        f"{ANSWER_RULE}\n"
        + json_block({"memories": [{"character": "c1", "scope": "character", "kind": "allergy",
                                    "text": "Sam is allergic to peanuts.", "messages": ["m1"]}]})
        + f"\n\"kind\" is one of: {', '.join(KINDS)}."
    )
    user = render_characters(characters) + "\n\n"
    if existing:
        user += "Already saved:\n" + "\n".join(f"- {t}" for t in existing) + "\n\n"
    user += "Messages:\n" + render_messages(messages)
    return make_prompt("durable_memories", system, user, 60 + max_items * (max_chars // 3 + 40),
                       {"messages": dump(messages), "characters": dump(characters),
                        "existing": list(existing), "max_items": max_items, "max_chars": max_chars},
                       DURABLE_SCHEMA)


def _scope(task: str, answer: str, scope: str, character_id: str | None) -> None:
    if scope == "character" and character_id is None:
        raise PromptParseError(task, "a memory with scope 'character' needs a character", answer)
    if scope == "global" and character_id is not None:
        raise PromptParseError(task, "a memory with scope 'global' must have character null", answer)


def _parse_durable(inputs: dict[str, Any], data: dict[str, Any], answer: str) -> Extraction:
    task = "durable_memories"
    messages, characters, ml, cl = cast_labels(task, inputs, answer)
    existing = {fold(t) for t in inputs["existing"]}
    dropped: list[str] = []

    def build(raw: dict[str, Any]) -> MemoryDraft | None:
        cid = cl.one(raw["character"]) if raw["character"] is not None else None
        _scope(task, answer, raw["scope"], cid)
        text = checked_text(task, answer, raw["text"], "a memory's text", inputs["max_chars"])
        draft = MemoryDraft(text, raw["scope"], cid, raw["kind"],
                            ml.many(raw["messages"], nonempty=True, field_name="a memory"))
        if fold(text) in existing:
            dropped.append(f"already saved: {text[:80]}")
            return None
        existing.add(fold(text))
        return draft

    items = keep_valid(task, answer, data["memories"], build, "a memory")
    dropped += [f"over the limit of {inputs['max_items']}: {d.text[:80]}"
                for d in items[inputs["max_items"]:]]
    return Extraction(tuple(items[:inputs["max_items"]]), (), tuple(dropped))


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


def _file_under(m: ChatMessage, characters: Sequence[CharacterRef]) -> tuple[str, str | None]:
    """Whose memory a fact stated in `m` goes to: a character stating their own fact keeps it;
    what the player says goes to the one character they talk to, or is global in a group."""
    ref = ex.speaker_ref(m, characters)
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
    for u in ex.units_of(messages):
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
    seen = {fold(t) for t in existing}
    kept, dropped = [], []
    for d in drafts:
        if fold(d.text) in seen:
            dropped.append(f"already saved: {d.text[:80]}")
        else:
            seen.add(fold(d.text))
            kept.append(d)
    return kept, dropped


def extract_durable(messages: Sequence[ChatMessage], characters: Sequence[CharacterRef], *,
                    existing: Sequence[str] = (), max_items: int, max_chars: int) -> Extraction:
    """Deep memory by patterns: names, birthdays, allergies, favourites, promises (RV13, RV18)."""
    kept, dropped = _dedupe(_facts(messages, characters, max_chars), existing)
    dropped += [f"over the limit of {max_items}: {d.text[:80]}" for d in kept[max_items:]]
    return Extraction(tuple(kept[:max_items]), (), tuple(dropped))


def _durable_fallback(prompt: Prompt, counter: TokenCounter | None) -> Extraction:
    i = prompt.inputs
    return extract_durable(messages_from(i), characters_from(i), existing=i["existing"],
                           max_items=i["max_items"], max_chars=i["max_chars"])


# --- memories from a person's description (RV9c) -------------------------------------------------

DESCRIPTION_SCHEMA = obj_schema({"memories": {"type": "array", "items": obj_schema({
    "kind": _KIND, "text": STR}, ["kind", "text"])}}, ["memories"])


def _check_description(description: str, description_max_chars: int) -> str:
    text = description.strip()
    if not text:
        raise ValueError("the description is empty")
    if len(text) > description_max_chars:
        raise ValueError(f"the description has {len(text)} characters; at most "
                         f"{description_max_chars} are allowed (rule RV9c)")
    return text


def memories_from_description(description: str, character: CharacterRef | None, *, max_items: int,
                              max_chars: int, description_max_chars: int) -> Prompt:
    """"Generate memories" (RV9c) from a person's description — never from the chat.

    `character` None means the drafts are global memories.
    """
    text = _check_description(description, description_max_chars)
    who = character.name if character else "every character"
    system = (
        f"A person describes what {who} should remember. Turn the description into separate "
        "memories.\n"
        f"- {_DURABLE_LINE}\n"
        f"- Use only the description. At most {max_items} memories, each one self-contained "
        f"sentence of at most {max_chars} characters, in the language of the description.\n"
        f"{ANSWER_RULE}\n"
        + json_block({"memories": [{"kind": "fact", "text": "…"}]})
        + f"\n\"kind\" is one of: {', '.join(KINDS)}."
    )
    user = f"What should {who} remember?\n<description>\n{text}\n</description>"
    return make_prompt("memories_from_description", system, user, 60 + max_items * (max_chars // 3 + 20),
                       {"description": text, "character": asdict(character) if character else None,
                        "max_items": max_items, "max_chars": max_chars,
                        "description_max_chars": description_max_chars}, DESCRIPTION_SCHEMA)


def _parse_description(inputs: dict[str, Any], data: dict[str, Any], answer: str) -> Extraction:
    scope, cid = _target(inputs)
    items = [MemoryDraft(checked_text("memories_from_description", answer, raw["text"], "a memory's text",
                                      inputs["max_chars"]), scope, cid, raw["kind"])
             for raw in data["memories"]]
    dropped = tuple(f"over the limit of {inputs['max_items']}" for _ in items[inputs["max_items"]:])
    return Extraction(tuple(items[:inputs["max_items"]]), (), dropped)


def _cut(text: str, max_chars: int) -> str:
    if len(text) <= max_chars:
        return text
    return text[: max_chars - 1].rsplit(" ", 1)[0] + "\u2026"


def _kind_of(sentence: str) -> str:
    for kind, pattern, _ in _PATTERNS:
        if pattern.search(sentence):
            return kind
    return "fact"


def extract_from_description(description: str, character: CharacterRef | None, *, max_items: int,
                             max_chars: int, description_max_chars: int) -> Extraction:
    """RV9c without a model: one memory per sentence of the person's description (never the chat)."""
    text = _check_description(description, description_max_chars)
    scope, cid = ("character", character.id) if character else ("global", None)
    drafts = [MemoryDraft(_cut(s, max_chars), scope, cid, _kind_of(s))
              for s in roleplay_sentences(text)]
    if not drafts:
        drafts = [MemoryDraft(_cut(text, max_chars), scope, cid, "fact")]
    dropped = tuple(f"over the limit of {max_items}: {d.text[:80]}" for d in drafts[max_items:])
    return Extraction(tuple(drafts[:max_items]), (), dropped)


def _description_fallback(prompt: Prompt, counter: TokenCounter | None) -> Extraction:
    i = prompt.inputs
    return extract_from_description(i["description"], _character(i["character"]),
                                    max_items=i["max_items"], max_chars=i["max_chars"],
                                    description_max_chars=i["description_max_chars"])


# --- save from conversation (RV9d) ---------------------------------------------------------------

SAVE_SCHEMA = obj_schema({"memories": {"type": "array", "items": obj_schema({
    "kind": _KIND, "text": STR, "messages": LABELS}, ["kind", "text", "messages"])}}, ["memories"])


def _check_selection(messages: Sequence[ChatMessage], max_messages: int) -> None:
    need(messages, "save_from_conversation needs at least one message")
    if len(messages) > max_messages:
        raise ValueError(f"{len(messages)} messages selected; at most {max_messages} are allowed "
                         "(rule RV9d)")


def save_from_conversation(messages: Sequence[ChatMessage], character: CharacterRef | None, *,
                           max_drafts: int, max_messages: int, max_chars: int) -> Prompt:
    """"Save from conversation" (RV9d): up to `max_drafts` memory drafts from up to
    `max_messages` chosen messages.

    The drafts are for a person to review; `character` None means global memories.
    """
    _check_selection(messages, max_messages)
    who = character.name if character else "every character"
    system = (
        f"A person picked these messages because {who} should remember something in them. Write "
        "memory drafts for the person to review.\n"
        f"- {_DURABLE_LINE} A promise and the answer to it belong in one memory.\n"
        f"- {COMMON_RULES} At most {max_drafts} drafts, each one self-contained sentence of at "
        f"most {max_chars} characters, with the labels of the messages it comes from.\n"
        f"{ANSWER_RULE}\n"
        + json_block({"memories": [{"kind": "promise", "text": "…", "messages": ["m1"]}]})
        + f"\n\"kind\" is one of: {', '.join(KINDS)}."
    )
    user = "Messages:\n" + render_messages(messages)
    return make_prompt("save_from_conversation", system, user, 60 + max_drafts * (max_chars // 3 + 30),
                       {"messages": dump(messages), "character": asdict(character) if character else None,
                        "max_drafts": max_drafts, "max_chars": max_chars, "max_messages": max_messages},
                       SAVE_SCHEMA)


def _parse_save(inputs: dict[str, Any], data: dict[str, Any], answer: str) -> Extraction:
    task = "save_from_conversation"
    messages = messages_from(inputs)
    ml = Labels(task, answer, "m", [m.id for m in messages], "message")
    scope, cid = _target(inputs)
    items = keep_valid(task, answer, data["memories"], lambda raw: MemoryDraft(
        checked_text(task, answer, raw["text"], "a draft's text", inputs["max_chars"]), scope, cid,
        raw["kind"], ml.many(raw["messages"], nonempty=True, field_name="a draft")), "a draft")
    dropped = tuple(f"over the limit of {inputs['max_drafts']}" for _ in items[inputs["max_drafts"]:])
    return Extraction(tuple(items[:inputs["max_drafts"]]), (), dropped)


def extract_from_conversation(messages: Sequence[ChatMessage], character: CharacterRef | None, *,
                              max_drafts: int, max_messages: int, max_chars: int) -> Extraction:
    """RV9d without a model: the facts the patterns find, then the raw text of the other chosen
    messages (`Speaker: text`), up to `max_drafts` drafts for a person to review."""
    _check_selection(messages, max_messages)
    target = ("character", character.id) if character else ("global", None)
    drafts, _ = _dedupe(_facts(messages, [], max_chars, target), ())
    cited = {i for d in drafts for i in d.source_message_ids}
    for m in messages:
        if m.id not in cited and m.text.strip():
            raw = f"{m.speaker or m.role}: {' '.join(m.text.split())}"
            drafts.append(MemoryDraft(_cut(raw, max_chars), target[0], target[1], "fact", (m.id,)))
    dropped = tuple(f"over the limit of {max_drafts}: {d.text[:80]}" for d in drafts[max_drafts:])
    return Extraction(tuple(drafts[:max_drafts]), (), dropped)


def _save_fallback(prompt: Prompt, counter: TokenCounter | None) -> Extraction:
    i = prompt.inputs
    return extract_from_conversation(messages_from(i), _character(i["character"]),
                                     max_drafts=i["max_drafts"], max_messages=i["max_messages"],
                                     max_chars=i["max_chars"])


DURABLE_MEMORIES = Task("durable_memories", durable_memories, DURABLE_SCHEMA, _parse_durable,
                        _durable_fallback)
MEMORIES_FROM_DESCRIPTION = Task("memories_from_description", memories_from_description,
                                 DESCRIPTION_SCHEMA, _parse_description, _description_fallback)
SAVE_FROM_CONVERSATION = Task("save_from_conversation", save_from_conversation, SAVE_SCHEMA,
                              _parse_save, _save_fallback)
