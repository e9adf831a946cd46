"""The lore-growth task (SW7): new lore entries for what play introduced (places, factions, items,
creatures, customs, rules of the world) and updates of the entries the part touched, each with
the messages it rests on. Its prompt, schema, parser, and its fallback, which proposes only from
clear patterns (a named place or group introduced with a description) or nothing.

The prompt's section and the answer's section stand apart from the task around them, so a call
that serves several session-end tasks at once can carry this one too: `instructions(...)` is the
system text of the section, `entries_block(...)` the user text it adds beside the messages,
`ANSWER_KEY` / `ENTRIES_SCHEMA` the answer's part, `parse_entries(...)` reads that part alone.

Nothing invented (core/grounding): a proposal whose text states a name or a number that neither
its source messages nor the entry it updates hold is dropped and noted; so is a title that does
not rest on them. Triggers must occur in them; those that do not are dropped one by one. A new
entry whose title or triggers repeat an offered entry's becomes an update of it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

from ...core.grounding import ungrounded
from ...core.text import fold, roleplay_sentences
from . import answers
from .base import (
    ANSWER_RULE,
    COMMON_RULES,
    STR,
    ChatMessage,
    Labels,
    Prompt,
    PromptParseError,
    Task,
    checked_text,
    dump,
    json_block,
    make_prompt,
    messages_from,
    need,
    obj_schema,
    render_messages,
)

if TYPE_CHECKING:
    from ...core.tokens import TokenCounter

TASK = "lore_growth"
KINDS = ("place", "faction", "item", "creature", "custom", "rule")
TITLE_MAX_CHARS = 120
ANSWER_KEY = "entries"


@dataclass(frozen=True)
class LoreInput:
    """An existing entry the part touches, as the model sees it; `kept`: a person wrote,
    imported or locked it (a proposal for it waits for the person)."""

    id: str
    title: str
    text: str
    triggers: tuple[str, ...] = ()
    kept: bool = False


@dataclass(frozen=True)
class LoreProposal:
    """A proposed entry: new (`lore_id` None) or an update of `lore_id`, with its sources."""

    lore_id: str | None
    kind: str
    title: str
    text: str
    triggers: tuple[str, ...]
    sources: tuple[str, ...]


@dataclass(frozen=True)
class LoreProposals:
    """The task's result: the proposals kept, and what was dropped and why."""

    proposals: tuple[LoreProposal, ...]
    dropped: tuple[str, ...] = ()


ENTRIES_SCHEMA = {"type": "array", "items": obj_schema({
    "entry": {"type": ["string", "null"]},
    "kind": {"enum": list(KINDS)},
    "title": STR,
    "text": STR,
    "triggers": {"type": "array", "items": {"type": "string"}},
    "sources": {"type": "array", "items": {"type": "string"}, "minItems": 1},
}, ["kind", "title", "text", "triggers", "sources"])}

LORE_SCHEMA = obj_schema({ANSWER_KEY: ENTRIES_SCHEMA}, [ANSWER_KEY])


# --- the prompt section ------------------------------------------------------------------------

def instructions(*, max_entries: int, text_max_chars: int) -> str:
    """The section's system text: what to propose and how (its answer is under ANSWER_KEY)."""
    return (
        f"- \"{ANSWER_KEY}\": lore of the world that the messages introduce or change: places, "
        f"factions, items, creatures, customs and rules of the world ({', '.join(KINDS)}). Not "
        "people (they have sheets) and not events of the plot.\n"
        "- For a listed entry (labels e1, e2, …) that the messages change, give its label as "
        "\"entry\" and its whole new text; for a new one, \"entry\": null.\n"
        "- \"text\": what the messages say about it, as plain statements, at most "
        f"{text_max_chars} characters. Every name and number in it must appear in the messages "
        "it cites (\"sources\": message labels).\n"
        "- \"triggers\": the words that name it in the messages, never names of other things (a "
        "trigger that is another entry's makes this an update of that entry).\n"
        f"- At most {max_entries} entries; leave out what the messages only mention in passing."
    )


def entries_block(entries: Sequence[LoreInput]) -> str:
    """The section's user text: the entries the part touches, under labels, kept ones marked."""
    if not entries:
        return "Lore entries: none touch these messages.\n\n"
    lines = []
    for i, e in enumerate(entries):
        kept = " (kept by a person)" if e.kept else ""
        lines.append(f"[e{i + 1}] {e.title}{kept} — triggers: {', '.join(e.triggers) or '-'}\n"
                     f"{e.text.strip()}")
    return "Lore entries these messages touch:\n<lore>\n" + "\n\n".join(lines) + "\n</lore>\n\n"


def lore_growth(messages: Sequence[ChatMessage], entries: Sequence[LoreInput], *, max_entries: int,
                text_max_chars: int, max_triggers: int) -> Prompt:
    """Lore grows with play (SW7): propose new entries and updates of `entries` from `messages`."""
    need(messages, "lore_growth needs at least one message")
    system = (
        "You keep the lore of a roleplay campaign's world up to date after a part of the story.\n"
        f"- {COMMON_RULES}\n"
        + instructions(max_entries=max_entries, text_max_chars=text_max_chars) + "\n"
        f"{ANSWER_RULE}\n"
        + json_block({ANSWER_KEY: [{"entry": None, "kind": "place", "title": "…", "text": "…",
                                    "triggers": ["…"], "sources": ["m2"]}]})
        + "\nUse [] when there is nothing to add."
    )
    user = entries_block(entries) + "Messages:\n" + render_messages(messages)
    return make_prompt(TASK, system, user, 60 + max_entries * (text_max_chars // 3 + 60),
                       {"messages": dump(messages), "entries": dump(entries),
                        "max_entries": max_entries, "text_max_chars": text_max_chars,
                        "max_triggers": max_triggers}, LORE_SCHEMA)


# --- reading the answer ------------------------------------------------------------------------

def _entries_from(inputs: dict[str, Any]) -> list[LoreInput]:
    return [LoreInput(**{**e, "triggers": tuple(e.get("triggers", ()))}) for e in inputs.get("entries", [])]


def repeated(title: str, triggers: Sequence[str], entries: Sequence[LoreInput]) -> str | None:
    """The id of the entry whose title or a trigger the proposal repeats, if any."""
    mine = {fold(title)} | {fold(t) for t in triggers}
    for e in entries:
        if mine & ({fold(e.title)} | {fold(t) for t in e.triggers}):
            return e.id
    return None


def _occurs(trigger: str, sources: Sequence[str]) -> bool:
    needle = fold(trigger)
    pattern = re.compile(r"(?<!\w)" + re.escape(needle) + r"(?!\w)")
    return any(pattern.search(fold(s)) for s in sources)


def _grounded(raw: dict[str, Any], target: LoreInput | None, cited: list[str],
              inputs: dict[str, Any], dropped: list[str]) -> tuple[str, ...] | None:
    """The proposal's triggers that rest on its sources, or None when it must be dropped."""
    title = raw["title"].strip()
    sources = cited + ([target.title, target.text, *target.triggers] if target else [])
    for what, text, whole in (("text", raw["text"], False), ("title", title, True)):
        missing = ungrounded(text, sources, whole=whole)
        if missing:
            dropped.append(f"{title}: its {what} names {', '.join(missing[:3])}, not in its sources")
            return None
    triggers = []
    for trigger in dict.fromkeys(" ".join(t.split()) for t in raw["triggers"]):
        if not trigger:
            continue
        if _occurs(trigger, sources):
            triggers.append(trigger)
        else:
            dropped.append(f"{title}: trigger {trigger!r} is not in its sources")
    if not triggers and _occurs(title, sources):
        triggers = [title]
    if not triggers:
        dropped.append(f"{title}: no trigger rests on its sources")
        return None
    return tuple(triggers[: inputs["max_triggers"]])


def _cited(title: str, text: str, sources: tuple[str, ...], texts: dict[str, str],
           target: LoreInput | None) -> tuple[str, ...]:
    """The sources, with the part's other messages that hold the names and numbers of the text
    its cited ones (and the entry it updates) do not (a model cites one message and writes from
    three): what the entry rests on, noted as a change. Nothing is added for a name no message of
    the part holds (invented: the grounding check drops it)."""
    cited = [texts[s] for s in sources] + ([target.title, target.text, *target.triggers] if target else [])
    missing = list(dict.fromkeys(ungrounded(text, cited) + ungrounded(title, cited, whole=True)))
    added: list[str] = []
    for mid, body in texts.items():
        if not missing:
            break
        if mid in sources:
            continue
        still = [w for w in missing if ungrounded(w, [body], whole=True)]
        if len(still) < len(missing):
            added.append(mid)
            missing = still
    if missing or not added:
        return sources
    answers.current().changed.append(f"{title}: its sources gained the messages that hold what its text says")
    return sources + tuple(added)


def parse_entries(inputs: dict[str, Any], raw_entries: list[dict[str, Any]], answer: str) -> LoreProposals:
    """The answer's ANSWER_KEY part (already schema-valid) as proposals; see the module docstring."""
    messages = messages_from(inputs)
    entries = _entries_from(inputs)
    by_id = {e.id: e for e in entries}
    mlabels = Labels(TASK, answer, "m", [m.id for m in messages], "message")
    elabels = Labels(TASK, answer, "e", [e.id for e in entries], "lore entry",
                     names={f"e{i + 1}": (e.title,) for i, e in enumerate(entries)})
    texts = {m.id: m.text for m in messages}
    out: list[LoreProposal] = []
    dropped: list[str] = []
    for raw in raw_entries:
        try:  # one malformed entry is dropped alone (MJ2), the others are kept
            title = checked_text(TASK, answer, raw["title"], "an entry's title", TITLE_MAX_CHARS)
            text = checked_text(TASK, answer, raw["text"], f"{title}'s text", inputs["text_max_chars"])
            sources = mlabels.many(raw["sources"], nonempty=True, field_name=f"{title}'s sources")
            target_id = elabels.one(raw["entry"]) if raw.get("entry") else repeated(title, raw["triggers"], entries)
        except PromptParseError as e:
            dropped.append(f"{str(raw.get('title') or '?').strip()}: {e.reason}")
            continue
        if target_id and fold(text) == fold(by_id[target_id].text):
            dropped.append(f"{title}: its text is the entry's own (nothing changed)")
            continue
        target = by_id.get(target_id) if target_id else None
        sources = _cited(title, text, sources, texts, target)
        triggers = _grounded(raw, target, [texts[s] for s in sources], inputs, dropped)
        if triggers is None:
            continue
        if len(out) >= inputs["max_entries"]:
            dropped.append(f"{title}: over the limit of {inputs['max_entries']} entries")
            continue
        if target_id and any(p.lore_id == target_id for p in out):
            dropped.append(f"{title}: a second proposal for the same entry")
            continue
        out.append(LoreProposal(target_id, raw["kind"], title, text, triggers, sources))
    return LoreProposals(tuple(out), tuple(dropped))


def _parse(inputs: dict[str, Any], data: dict[str, Any], answer: str) -> LoreProposals:
    return parse_entries(inputs, data[ANSWER_KEY], answer)


# --- without a model: clear patterns only ------------------------------------------------------

_PLACES = ("city|town|village|port|harbou?r|fortress|castle|keep|citadel|kingdom|empire|realm|"
           "island|isle|valley|forest|wood|marsh|desert|mountains?|river|lake|temple|tower|inn|"
           "tavern|district|quarter|province|duchy")
_GROUPS = ("council|guild|order|brotherhood|sisterhood|clan|tribe|cult|league|company|circle|"
           "court|senate|legion|church|syndicate|covenant")
_NAME = r"[A-Z][\w'’-]+(?:\s+(?:of\s+(?:the\s+)?)?[A-Z][\w'’-]+)*"
_NOUN = rf"(?i:(?P<noun>{_PLACES}|{_GROUPS}))"
_PATTERNS = (
    re.compile(rf"\b(?i:the)\s+{_NOUN}\s+of\s+(?P<name>{_NAME})"),                      # the city of Veyra
    re.compile(rf"(?P<name>{_NAME}),\s+(?i:a|an|the)\s+(?:[\w'’-]+\s+){{0,3}}?{_NOUN}\b"),  # Veyra, a port city
    re.compile(rf"(?P<name>{_NAME})\s+(?i:is|was)\s+(?i:a|an|the)\s+(?:[\w'’-]+\s+){{0,3}}?{_NOUN}\b"),
)
_GROUP = re.compile(rf"^(?:{_GROUPS})$", re.I)
_NOT_NAMES = {"The", "A", "An", "I", "We", "You", "He", "She", "They", "It", "This", "That", "There"}
_DESCRIBED_WORDS = 8  # a sentence naming it must say this many words besides the name


def _found(sentence: str) -> list[tuple[str, str]]:
    """(title, kind) of each place or group the sentence introduces by a clear pattern."""
    out = []
    for pattern in _PATTERNS:
        for m in pattern.finditer(sentence):
            name, noun = m.group("name"), m.group("noun")
            if name.split()[0] in _NOT_NAMES:
                continue
            kind = "faction" if _GROUP.match(noun) else "place"
            if pattern is _PATTERNS[0] and noun[0].isupper():
                name = f"{noun} of {name}"  # "the Council of Nine" names the council itself
            out.append((name, kind))
    return out


def _fallback(prompt: Prompt, counter: TokenCounter | None) -> LoreProposals:
    inputs = prompt.inputs
    messages = messages_from(inputs)
    entries = _entries_from(inputs)
    speakers = {fold(m.speaker) for m in messages if m.speaker}
    found: dict[str, LoreProposal] = {}
    for m in messages:
        for sentence in roleplay_sentences(m.text):
            for name, kind in _found(sentence):
                if fold(name) in speakers or repeated(name, [name], entries) or fold(name) in found:
                    continue
                found[fold(name)] = _described(name, kind, messages, inputs["text_max_chars"])
    kept = [p for p in found.values() if p is not None][: inputs["max_entries"]]
    return LoreProposals(tuple(kept), () if kept else ("no model: no place or group was introduced "
                                                         "with a description",))


def _described(name: str, kind: str, messages: Sequence[ChatMessage], max_chars: int) -> LoreProposal | None:
    """The sentences of the part that name it, verbatim, when they describe it; else None."""
    pattern = re.compile(r"(?<!\w)" + re.escape(name) + r"(?!\w)")
    said: list[str] = []
    sources: list[str] = []
    for m in messages:
        for sentence in roleplay_sentences(m.text):
            if pattern.search(sentence) and sentence not in said:
                if len(" ".join(said + [sentence])) > max_chars:
                    break
                said.append(sentence)
                sources.append(m.id)
    others = [w for s in said for w in s.split() if w not in name.split()]
    if len(others) < _DESCRIBED_WORDS:
        return None
    return LoreProposal(None, kind, name, " ".join(said), (name,), tuple(dict.fromkeys(sources)))


LORE_GROWTH = Task(TASK, lore_growth, LORE_SCHEMA, _parse, _fallback)
