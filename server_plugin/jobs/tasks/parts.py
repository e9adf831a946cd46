"""One call per part of the transcript: several tasks answered from one reading (`part_notes`).

A part of the transcript (sized by tokens and the model's context, never split by task) is shown
to the model once, with every task that needs it as a *section* of one structured answer:
`{"summary": {...}, "memories": {...}, "scenes": {...}, …}`. Each section is an ordinary Task of
the registry: its own prompt's rules (its system text) and its own inputs (notes, secrets,
sheets…), rendered with the same messages and characters so the labels (m1…, c1…) agree; its
part of the answer is read by that Task's own schema and parser (`Task.parse_data`), inside the
same report. A section that cannot be used is dropped and noted; the others are kept.

Two ways in:
- `part_notes(messages, characters, {key: render_kwargs, …})` renders each section's task itself;
- `combine({key: prompt, …})` joins prompts already rendered by their own jobs (`jobs/batch.py`:
  the worker's jobs of one chat that read the same part share one call). `joins(prompts, p)` says
  whether a prompt can join others: the same messages, and where both show characters, the same
  characters (so every label means the same thing in every section).
A key is its section's name, or that name with a number (`memories_2`) when two jobs of one task
share a call. The rules every task repeats (COMMON_RULES, QUOTE_RULE) are said once.

How a task joins a per-part call: write it as any other Task (render, schema, parse, fallback),
add it to `registry.TASKS`, and add a `Section(key, THE_TASK)` to `SECTIONS` below (the key is
its name in the answer). Its job's own `build`, `prepare` and `apply` stay as they are.
The fallback of a per-part call is each section's own fallback.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Sequence

from . import answers, episodes, lore, memories, sheets, summaries, told
from .base import (
    COMMON_RULES,
    QUOTE_RULE,
    CharacterRef,
    ChatMessage,
    Prompt,
    PromptParseError,
    Task,
    dump,
    make_prompt,
    need,
    characters_from,
    messages_from,
    render_characters,
    render_messages,
)

if TYPE_CHECKING:
    from ...core.tokens import TokenCounter


@dataclass(frozen=True)
class Section:
    """A task's share of a per-part call: its key in the answer and the Task that reads it.
    `with_characters`: the task's render takes the characters after the messages."""

    key: str
    task: Task
    with_characters: bool = True


@dataclass(frozen=True)
class PartNotes:
    """What one part's call produced: each section's result (its task's own type), by key."""

    sections: dict[str, Any]
    fell_back: tuple[str, ...] = ()  # sections whose part of the answer could not be used
    reports: dict[str, answers.Report] = field(default_factory=dict)  # each section's own notes
    reasons: dict[str, str] = field(default_factory=dict)  # why each fell-back section could not be used
    copied: frozenset[str] = frozenset()  # those notes as the whole answer's report holds them


SECTIONS: dict[str, Section] = {s.key: s for s in (
    Section("summary", summaries.CHUNK_SUMMARY, with_characters=False),
    Section("facts", memories.DURABLE_MEMORIES),
    Section("memories", episodes.CHARACTER_MEMORIES),
    Section("scenes", episodes.SCENE_SUMMARIES),
    Section("told", told.TOLD_EVENTS),
    Section("session", summaries.SESSION_SUMMARY, with_characters=False),
    Section("sheets", sheets.SHEET_UPDATES),
    Section("lore", lore.LORE_GROWTH, with_characters=False),
)}
BY_TASK: dict[str, Section] = {s.task.name: s for s in SECTIONS.values()}

_ANSWER_LINE = "Answer with one JSON object in exactly this format and nothing else:"
_MARK = "\u0000messages\u0000"
_SLOT = "\u0000answer\u0000"


def _tasks() -> dict[str, Task]:
    return {s.task.name: s.task for s in SECTIONS.values()}


def _render(section: Section, messages: Sequence[ChatMessage], characters: Sequence[CharacterRef],
            kwargs: dict[str, Any]) -> Prompt:
    task = section.task
    if section.with_characters:
        return task.render(messages, characters, **kwargs)
    return task.render(messages, **kwargs)


def _extra(prompt: Prompt, messages: Sequence[ChatMessage], characters: Sequence[CharacterRef]) -> str:
    """What a section's user text adds to the shared part (its notes, secrets, sheets …)."""
    text = prompt.user.replace(render_messages(messages), _MARK)
    if characters:
        text = text.replace(render_characters(characters), "")
    text = text.split(_MARK)[0]
    return re.sub(r"(Messages( of the session)?|Summarise these messages):\s*$", "", text.strip()).strip()


def _section(prompt: Prompt) -> Section:
    if prompt.task not in BY_TASK:
        raise ValueError(f"task {prompt.task!r} has no section: known are {', '.join(BY_TASK)}")
    return BY_TASK[prompt.task]


def _shows_characters(prompt: Prompt) -> bool:
    return _section(prompt).with_characters and bool(prompt.inputs.get("characters"))


def joins(prompts: Sequence[Prompt], prompt: Prompt) -> bool:
    """Whether `prompt` can share one call with `prompts`: a task with a section, reading the same
    messages, and showing the same characters as those that show any (labels agree)."""
    if prompt.task not in BY_TASK or "messages" not in prompt.inputs:
        return False
    msgs = [m.inputs.get("messages") for m in prompts]
    if any(m != prompt.inputs["messages"] for m in msgs):
        return False
    if render_messages(messages_from(prompt.inputs)) not in prompt.user:
        return False  # a task that shows its messages another way cannot share them
    if _shows_characters(prompt):
        return all(p.inputs.get("characters") == prompt.inputs["characters"]
                   for p in prompts if _shows_characters(p))
    return True


def _characters_of(prompts: Sequence[Prompt]) -> list[CharacterRef]:
    shown = next((p for p in prompts if _shows_characters(p)), None)
    if shown is None:
        return []
    return characters_from(shown.inputs)


def _rules(prompt: Prompt) -> str:
    """A section's own rules: its system text without the rules said once for all (where its
    answer goes is `_SLOT`, said by `_rules_of`)."""
    rules = prompt.system.replace(f"- {COMMON_RULES}\n", "").replace(COMMON_RULES, "")
    rules = rules.replace(QUOTE_RULE, "(See the quote rule above.)")
    return rules.replace(_ANSWER_LINE, _SLOT)


def _rules_of(prompts: dict[str, Prompt]) -> list[str]:
    """Each section's rules, said once for the sections whose rules are the same (the summaries
    of several sessions ending in one part): their keys, then the rules."""
    same: dict[str, list[str]] = {}
    for key, prompt in prompts.items():
        same.setdefault(_rules(prompt), []).append(key)
    out = []
    for rules, keys in same.items():
        names = ", ".join(f'"{k}"' for k in keys)
        where = (f"Its answer goes under {names}, in this format:" if len(keys) == 1 else
                 "Each of these sections answers under its own key, in this format:")
        out.append(f"- {names}: {rules.replace(_SLOT, where)}")
    return out


def _player_shown(messages: Sequence[ChatMessage], characters: Sequence[CharacterRef]) -> bool:
    """Whether the characters shown say who speaks every player message (each is a player
    character's by name), so the messages need not tag them."""
    players = {c.name for c in characters if c.is_player}
    return bool(players) and all(m.speaker in players for m in messages if m.role == "user")


def combine(prompts: dict[str, Prompt]) -> Prompt:
    """One prompt for several tasks' prompts over the same messages (key -> prompt; see `joins`).
    Raises ValueError when they cannot share a call."""
    need(list(prompts), "combine needs at least one prompt")
    first = next(iter(prompts.values()))
    for key, prompt in prompts.items():
        if not joins([first], prompt):
            raise ValueError(f"section {key} ({prompt.task}) does not read the same part")
    messages = messages_from(first.inputs)
    characters = _characters_of(list(prompts.values()))
    extras = []
    for key, prompt in prompts.items():
        extra = _extra(prompt, messages, characters if _shows_characters(prompt) else ())
        if extra:
            extras.append(f"For \"{key}\":\n{extra}")
    system = ("You read one part of a roleplay chat once and do several tasks with it. Answer with ONE "
              "JSON object with a key for each section below, holding that section's answer, and "
              f"nothing else.\nFor every section: {COMMON_RULES}\nQuote rule: {QUOTE_RULE}\n\n"
              + "\n\n".join(_rules_of(prompts)))
    user = (render_characters(characters) + "\n\n" if characters else "") + \
        ("\n\n".join(extras) + "\n\n" if extras else "") + "Messages:\n" + \
        render_messages(messages, player_tag=not _player_shown(messages, characters))
    # Every section is required: a model held to this schema (llm_json_mode json_schema) then
    # writes each one, instead of nesting the next section inside the one before.
    schema = {"type": "object", "properties": {k: p.json_schema for k, p in prompts.items()},
              "required": list(prompts), "additionalProperties": True}
    return make_prompt("part_notes", system, user, sum(p.max_tokens for p in prompts.values()),
                       {"messages": dump(messages), "characters": dump(characters),
                        "sections": {k: p.to_payload() for k, p in prompts.items()}}, schema)


def part_notes(messages: Sequence[ChatMessage], characters: Sequence[CharacterRef],
               sections: dict[str, dict[str, Any]]) -> Prompt:
    """One prompt for a part of the transcript serving every section in `sections` (key -> the
    keyword arguments of that section's task render)."""
    need(messages, "part_notes needs at least one message")
    need(list(sections), "part_notes needs at least one section")
    unknown = [k for k in sections if k not in SECTIONS]
    if unknown:
        raise ValueError(f"unknown sections {unknown}: known are {', '.join(SECTIONS)}")
    return combine({k: _render(SECTIONS[k], messages, characters, kw) for k, kw in sections.items()})


def section_prompt(prompt: Prompt, key: str) -> Prompt:
    """The prompt one section of a combined prompt was made from."""
    return Prompt.from_payload(prompt.inputs["sections"][key])


def _parse(inputs: dict[str, Any], data: dict[str, Any], answer: str) -> PartNotes:
    report = answers.current()
    results, fell_back, reports, reasons, copied = {}, [], {}, {}, set()
    for key, payload in inputs["sections"].items():
        own_prompt = Prompt.from_payload(payload)
        task = _tasks()[own_prompt.task]
        part = data.get(key)
        # Each section notes into its own report, so each job's result says what its part lost.
        with answers.reporting(answers.Report()) as own:
            try:
                if not isinstance(part, dict):
                    raise PromptParseError(task.name, f"the answer has no \"{key}\" section", answer)
                results[key] = task.parse_data(own_prompt.inputs, part, answer)
            except PromptParseError as e:
                own.dropped.append(f"section {key} could not be used ({e.reason}): made from the text itself")
                results[key] = task.fallback(own_prompt, None)
                fell_back.append(key)
                reasons[key] = e.reason
        reports[key] = own
        changed = [f"{key}: {note}" for note in own.changed]
        dropped = own.dropped if key in fell_back else [f"{key}: {note}" for note in own.dropped]
        report.changed.extend(changed)
        report.dropped.extend(dropped)
        copied.update(changed, dropped)
    if len(fell_back) == len(results):
        raise PromptParseError("part_notes", "no section of the answer could be used: "
                               + "; ".join(report.dropped[-3:]), answer)
    return PartNotes(results, tuple(fell_back), reports, reasons, frozenset(copied))


def _fallback(prompt: Prompt, counter: TokenCounter | None) -> PartNotes:
    out = {}
    for key, payload in prompt.inputs["sections"].items():
        section_prompt = Prompt.from_payload(payload)
        out[key] = _tasks()[section_prompt.task].fallback(section_prompt, counter)
    return PartNotes(out, tuple(out))


PART_NOTES = Task("part_notes", part_notes, {"type": "object"}, _parse, _fallback)
