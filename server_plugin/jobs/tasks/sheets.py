"""The sheet-updates task (SW1): a sheet drafted for each recurring newcomer, and what a session
changed or revealed in the sheets of the characters present. Its prompt, schema, parser, and its
fallback, which infers nothing (without a model the minimal sheet is drafted by its own job)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Sequence

from . import answers
from .base import (
    ANSWER_RULE,
    COMMON_RULES,
    STR,
    CharacterRef,
    ChatMessage,
    Labels,
    Prompt,
    Task,
    characters_from,
    character_labels,
    checked_text,
    dump,
    json_block,
    keep_valid,
    make_prompt,
    need,
    obj_schema,
    render_characters,
    render_messages,
)

if TYPE_CHECKING:
    from ...core.tokens import TokenCounter

SHEET_FIELD_PATTERN = "^[a-z][a-z0-9_]{0,39}$"  # the sheet's field names (shared_schema/character.json)


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


_SHEET_FIELDS = {"type": "object", "propertyNames": {"pattern": SHEET_FIELD_PATTERN},
                 "additionalProperties": {"type": "string"}}

SHEETS_SCHEMA = obj_schema({
    "new": {"type": "array", "items": obj_schema({"newcomer": STR, "fields": _SHEET_FIELDS},
                                                 ["newcomer", "fields"])},
    "updates": {"type": "array", "items": obj_schema({"character": STR, "fields": _SHEET_FIELDS},
                                                     ["character", "fields"])},
}, ["new", "updates"])


def sheet_updates(messages: Sequence[ChatMessage], characters: Sequence[CharacterRef],
                  sheets: Sequence[SheetInput], newcomers: Sequence[Newcomer], *,
                  max_fields: int, field_max_chars: int) -> Prompt:
    """Sheets grow with play (SW1): draft a sheet for each recurring newcomer, and propose what the
    session changed or revealed in the sheets of `sheets` (characters of `characters`).

    Fields in `SheetInput.kept` were written or locked by a person: shown, never to be changed.
    """
    need(messages, "sheet_updates needs at least one message")
    if not sheets and not newcomers:
        raise ValueError("sheet_updates needs sheets to update or newcomers to draft")
    labels = {c.id: f"c{i + 1}" for i, c in enumerate(characters)}
    names = {c.id: c.name for c in characters}
    missing = [x.id for x in sheets if x.id not in labels]
    if missing:
        raise ValueError(f"sheets of characters not among the characters given: {missing}")
    system = (
        "You keep the character sheets of a roleplay campaign up to date after a session.\n"
        f"- {COMMON_RULES}\n"
        "- \"new\": for each listed newcomer (labels n1, n2, …), a short sheet of what the messages "
        "show: e.g. role, appearance, personality, manner_of_speech, relationships.\n"
        "- \"updates\": for listed sheets (labels c1, c2, …), only fields whose content the session "
        "changed or newly revealed, each rewritten in full. Never change a field marked (kept). "
        "Do not write secrets. Leave out characters with nothing new.\n"
        f"- Field names: lower case letters, digits and _ (e.g. \"appearance\"); values plain text "
        f"of at most {field_max_chars} characters; at most {max_fields} fields per character.\n"
        f"{ANSWER_RULE}\n"
        + json_block({"new": [{"newcomer": "n1", "fields": {"role": "…", "appearance": "…"}}]
                      if newcomers else [],
                      "updates": [{"character": labels[sheets[0].id], "fields": {"relationships": "…"}}]
                      if sheets else []})
        + "\nUse [] for either list when there is nothing to add."
    )
    user = render_characters(characters) + "\n\n"
    blocks = [_sheet_block(sheet, labels, names) for sheet in sheets]
    if blocks:
        user += "Sheets:\n<sheets>\n" + "\n\n".join(blocks) + "\n</sheets>\n\n"
    if newcomers:
        user += "Newcomers:\n<newcomers>\n" + "\n".join(
            f"[n{i + 1}] {n.name} (speaks in {n.lines} messages over {n.sessions} sessions)"
            for i, n in enumerate(newcomers)) + "\n</newcomers>\n\n"
    user += "Messages of the session:\n" + render_messages(messages)
    per = max_fields * (field_max_chars // 3 + 20)
    return make_prompt("sheet_updates", system, user, 60 + (len(sheets) + len(newcomers)) * per,
                       {"messages": dump(messages), "characters": dump(characters),
                        "sheets": dump(sheets), "newcomers": dump(newcomers),
                        "max_fields": max_fields, "field_max_chars": field_max_chars}, SHEETS_SCHEMA)


def _sheet_block(sheet: SheetInput, labels: dict[str, str], names: dict[str, str]) -> str:
    lines = [f"[{labels[sheet.id]}] {names[sheet.id]}"]
    lines += [f"- {name}{' (kept)' if name in sheet.kept else ''}: {value.strip()}"
              for name, value in sheet.fields.items()] or ["- (empty sheet)"]
    return "\n".join(lines)


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
        elif not value.strip():
            dropped.append(f"{who}: {name} is blank")
        else:
            if len(value.strip()) > inputs["field_max_chars"]:
                answers.current().changed.append(f"{who}'s {name} was cut to {inputs['field_max_chars']} characters")
            fields[name] = checked_text(task, answer, value.strip()[:inputs["field_max_chars"]],
                                        f"{who}'s {name}", inputs["field_max_chars"])
    return fields


def _normalise_fields(data: dict[str, Any]) -> None:
    """Field names as the schema wants them (`manner of speech` → `manner_of_speech`), noted;
    a value that is not text (a list, a number) is written out as text."""
    for key in ("new", "updates"):
        for item in data.get(key) or []:
            fields = item.get("fields") if isinstance(item, dict) else None
            if not isinstance(fields, dict):
                continue
            fixed: dict[str, Any] = {}
            for name, value in fields.items():
                good = answers.snake_case(str(name))
                if good != name:
                    answers.current().changed.append(f"field name {name!r} written as {good!r}")
                if isinstance(value, list):
                    value = ", ".join(str(v) for v in value)
                elif not isinstance(value, str) and value is not None:
                    value = str(value)
                if good and isinstance(value, str):
                    fixed[good] = value
            item["fields"] = fixed


def _parse_sheet_updates(inputs: dict[str, Any], data: dict[str, Any], answer: str) -> SheetProposals:
    task = "sheet_updates"
    characters = characters_from(inputs)
    sheets = {s["id"]: s for s in inputs["sheets"]}
    names = {c.id: c.name for c in characters}
    cl = character_labels(task, answer, characters)
    nl = Labels(task, answer, "n", [n["name"] for n in inputs["newcomers"]], "newcomer",
                {f"n{i + 1}": (n["name"],) for i, n in enumerate(inputs["newcomers"])})
    dropped: list[str] = []
    drafts: dict[str, dict[str, str]] = {}
    updates: dict[str, dict[str, str]] = {}

    def draft(raw: dict[str, Any]) -> bool:
        name = nl.one(raw["newcomer"])
        drafts.setdefault(name, {}).update(_sheet_fields(task, answer, raw["fields"], (), name, inputs, dropped))
        return True

    def update(raw: dict[str, Any]) -> bool:
        cid = cl.one(raw["character"])
        if cid not in sheets:  # a real character, just not one whose sheet was offered
            dropped.append(f"not asked for: the sheet of {cid}")
            return True
        fields = _sheet_fields(task, answer, raw["fields"], sheets[cid]["kept"], names[cid], inputs, dropped)
        if fields:
            updates.setdefault(cid, {}).update(fields)
        return True

    keep_valid(task, answer, data["new"], draft, "a newcomer's sheet")
    keep_valid(task, answer, data["updates"], update, "a sheet update")
    return SheetProposals(tuple(SheetDraft(None, n, f) for n, f in drafts.items() if f),
                          tuple(SheetDraft(c, names[c], f) for c, f in updates.items()), tuple(dropped))


def _sheets_fallback(prompt: Prompt, counter: TokenCounter | None) -> SheetProposals:
    # Without a model nothing is inferred about a character: the minimal sheet (name, first
    # appearance, verbatim lines) is drafted by its own job in every mode.
    return SheetProposals((), (), ("no model: sheets are not inferred from the text",))


SHEET_UPDATES = Task("sheet_updates", sheet_updates, SHEETS_SCHEMA, _parse_sheet_updates, _sheets_fallback,
                     _normalise_fields)
