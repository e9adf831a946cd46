"""One call per part of the transcript: several tasks answered from one reading (`part_notes`).

A part of the transcript (sized by tokens and the model's context, never split by task) is shown
to the model once, with every task that needs it as a *section* of one structured answer:
`{"summary": {...}, "memories": {...}, "scenes": {...}, …}`. Each section is an ordinary Task of
the registry: its own prompt's rules (its system text) and its own inputs (notes, secrets,
sheets…), rendered with the same messages and characters so the labels (m1…, c1…) agree; its
part of the answer is read by that Task's own schema and parser (`Task.parse_data`), inside the
same report. A section that cannot be used is dropped and noted; the others are kept.

How a task joins a per-part call (e.g. a lore-growth task proposing lore entries at session end):
1. write it as any other Task (render, schema, parse, fallback) and add it to `registry.TASKS`;
2. add a `Section(key, THE_TASK)` to `SECTIONS` below (the key is its name in the answer);
3. the story module that owns what it writes passes `{key: render_kwargs}` when it asks for the
   part's prompt (`part_notes(messages, characters, {key: kwargs, …})`) and applies
   `result.sections[key]` (the task's own result type) in its job's `apply`.
The fallback of a per-part call is each section's own fallback.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

from . import answers, episodes, memories, summaries, told
from .base import (
    CharacterRef,
    ChatMessage,
    Prompt,
    PromptParseError,
    Task,
    dump,
    make_prompt,
    need,
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


SECTIONS: dict[str, Section] = {s.key: s for s in (
    Section("summary", summaries.CHUNK_SUMMARY, with_characters=False),
    Section("facts", memories.DURABLE_MEMORIES),
    Section("memories", episodes.CHARACTER_MEMORIES),
    Section("scenes", episodes.SCENE_SUMMARIES),
    Section("told", told.TOLD_EVENTS),
)}

_ANSWER_LINE = "Answer with one JSON object in exactly this format and nothing else:"
_MARK = "\u0000messages\u0000"


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


def part_notes(messages: Sequence[ChatMessage], characters: Sequence[CharacterRef],
               sections: dict[str, dict[str, Any]]) -> Prompt:
    """One prompt for a part of the transcript serving every section in `sections` (key -> the
    keyword arguments of that section's task render)."""
    need(messages, "part_notes needs at least one message")
    need(list(sections), "part_notes needs at least one section")
    unknown = [k for k in sections if k not in SECTIONS]
    if unknown:
        raise ValueError(f"unknown sections {unknown}: known are {', '.join(SECTIONS)}")
    rendered = {k: _render(SECTIONS[k], messages, characters, kw) for k, kw in sections.items()}
    parts, extras = [], []
    for key, prompt in rendered.items():
        rules = prompt.system.replace(_ANSWER_LINE, f"Its answer goes under \"{key}\", in this format:")
        parts.append(f"- \"{key}\": {rules}")
        extra = _extra(prompt, messages, characters)
        if extra:
            extras.append(f"For \"{key}\":\n{extra}")
    system = ("You read one part of a roleplay chat once and do several tasks with it. Answer every "
              "section below in ONE JSON object whose keys are the section names ("
              + ", ".join(f'"{k}"' for k in rendered) + "), each holding that section's answer, "
              "and nothing else.\n\n" + "\n\n".join(parts))
    user = (render_characters(characters) + "\n\n" if characters else "") + \
        ("\n\n".join(extras) + "\n\n" if extras else "") + "Messages:\n" + render_messages(messages)
    schema = {"type": "object", "properties": {k: p.json_schema for k, p in rendered.items()},
              "additionalProperties": True}
    return make_prompt("part_notes", system, user, sum(p.max_tokens for p in rendered.values()),
                       {"messages": dump(messages), "characters": dump(characters),
                        "sections": {k: p.to_payload() for k, p in rendered.items()}}, schema)


def _parse(inputs: dict[str, Any], data: dict[str, Any], answer: str) -> PartNotes:
    report = answers.current()
    results, fell_back = {}, []
    for key, payload in inputs["sections"].items():
        section_prompt = Prompt.from_payload(payload)
        task = _tasks()[section_prompt.task]
        part = data.get(key)
        try:
            if not isinstance(part, dict):
                raise PromptParseError(task.name, f"the answer has no \"{key}\" section", answer)
            results[key] = task.parse_data(section_prompt.inputs, part, answer)
        except PromptParseError as e:
            report.dropped.append(f"section {key} could not be used ({e.reason}): made from the text itself")
            results[key] = task.fallback(section_prompt, None)
            fell_back.append(key)
    if len(fell_back) == len(results):
        raise PromptParseError("part_notes", "no section of the answer could be used: "
                               + "; ".join(report.dropped[-3:]), answer)
    return PartNotes(results, tuple(fell_back))


def _fallback(prompt: Prompt, counter: TokenCounter | None) -> PartNotes:
    out = {}
    for key, payload in prompt.inputs["sections"].items():
        section_prompt = Prompt.from_payload(payload)
        out[key] = _tasks()[section_prompt.task].fallback(section_prompt, counter)
    return PartNotes(out, tuple(out))


PART_NOTES = Task("part_notes", part_notes, {"type": "object"}, _parse, _fallback)
