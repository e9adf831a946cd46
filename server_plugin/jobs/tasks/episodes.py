"""The episode tasks (SW4, SW5): what each character remembers of a scene (`character_memories`)
and the scenes in detail (`scene_summaries`). Each with its prompt, schema, parser and extractive
fallback."""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from datetime import datetime
from typing import TYPE_CHECKING, Any, Sequence

from ...core.quotes import Quote
from ...core.tokens import get_counter
from . import extractive as ex
from .base import (
    ANSWER_RULE,
    COMMON_RULES,
    LABELS,
    LEVEL,
    QUOTE_RULE,
    QUOTES,
    STR,
    CharacterRef,
    ChatMessage,
    Extraction,
    Prompt,
    Task,
    cast_labels,
    characters_from,
    check_quotes,
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
from .summaries import summarize_chunk

if TYPE_CHECKING:
    from ...core.tokens import TokenCounter


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


def extraction_targets(characters: Sequence[CharacterRef],
                       for_ids: Sequence[str] | None) -> list[CharacterRef]:
    """Whose memories to extract: `for_ids`, or every non-player character given."""
    need(characters, "this task needs the chat's characters")
    if for_ids is None:
        targets = [c for c in characters if not c.is_player]
    else:
        known = {c.id: c for c in characters}
        missing = [i for i in for_ids if i not in known]
        if missing:
            raise ValueError(f"for_ids names characters not among the characters given: {missing}")
        targets = [known[i] for i in for_ids]
    need(targets, "no character to extract memories for")
    return targets


def _mentions(c: CharacterRef, text: str) -> bool:
    return any(re.search(rf"\b{re.escape(n)}\b", text, re.I) for n in (c.name, *c.aliases) if n)


def _present(characters: Sequence[CharacterRef], messages: Sequence[ChatMessage],
             also: str | None = None) -> tuple[str, ...]:
    """The characters who spoke in or were named in `messages` (and `also`), in cast order."""
    spoke = {r.id for m in messages if (r := ex.speaker_ref(m, characters)) is not None}
    return tuple(c.id for c in characters if c.id in spoke or c.id == also
                 or any(_mentions(c, m.text) for m in messages))


# --- character memories (SW4) --------------------------------------------------------------------

MEMORIES_SCHEMA = obj_schema({"memories": {"type": "array", "items": obj_schema({
    "character": STR, "summary": STR, "feeling": STR, "quotes": QUOTES,
    "participants": LABELS, "importance": LEVEL, "messages": LABELS,
}, ["character", "summary", "feeling", "quotes", "participants", "importance", "messages"])}},
    ["memories"])


def character_memories(messages: Sequence[ChatMessage], characters: Sequence[CharacterRef], *,
                       for_ids: Sequence[str] | None = None, session: int | None = None,
                       per_character: int, max_quotes: int, memory_tokens: int) -> Prompt:
    """Character memories (SW4): each non-player character's own version of what happened.

    `characters` are the chat's members (they are the witnesses, SW9b); `for_ids` restricts whose
    memories are extracted (default: every non-player member). `memory_tokens` is the length of
    a memory the extractive fallback writes (a model is not told one).
    """
    need(messages, "character_memories needs at least one message")
    targets = extraction_targets(characters, for_ids)
    labels = {c.id: f"c{i + 1}" for i, c in enumerate(characters)}
    names = ", ".join(f"{labels[c.id]} ({c.name})" for c in targets)
    system = (
        "You read a roleplay scene and write the memories that characters keep of it, each from "
        "that character's own point of view: what they noticed, felt and thought.\n"
        f"- {COMMON_RULES}\n"
        f"- Only for these characters: {names}. Up to {per_character} memories each, only for "
        "moments that matter to them; none for a character who was not involved.\n"
        "- \"summary\": what happened, told from that character's point of view (third person, "
        "past tense). \"feeling\": a few words on what the character felt.\n"
        f"- \"quotes\": up to {max_quotes} lines said in the moment that this character would "
        f"remember word for word. {QUOTE_RULE}\n"
        "- \"participants\": labels of the characters who took part. \"importance\": 1 (trivial) to "
        "5 (life-changing). \"messages\": labels of the messages the memory comes from.\n"
        f"{ANSWER_RULE}\n"
        + json_block({"memories": [{"character": labels[targets[0].id], "summary": "…", "feeling": "…",
                                    "quotes": [{"speaker": "Name", "text": "exact words",
                                                "message": "m1"}],
                                    "participants": [labels[targets[0].id]], "importance": 3,
                                    "messages": ["m1"]}]})
    )
    user = render_characters(characters) + "\n\nMessages:\n" + render_messages(messages)
    return make_prompt("character_memories", system, user,
                       100 + len(targets) * per_character * (160 + 50 * max_quotes),
                       {"messages": dump(messages), "characters": dump(characters),
                        "for_ids": [c.id for c in targets], "session": session,
                        "per_character": per_character, "max_quotes": max_quotes,
                        "memory_tokens": memory_tokens}, MEMORIES_SCHEMA)


def _parse_memories(inputs: dict[str, Any], data: dict[str, Any], answer: str) -> Extraction:
    task = "character_memories"
    messages, characters, ml, cl = cast_labels(task, inputs, answer)
    members = tuple(c.id for c in characters)
    per: dict[str, int] = {}
    items, dq, dropped = [], [], []

    def build(raw: dict[str, Any]) -> CharacterMemory | None:
        cid = cl.one(raw["character"])
        if cid not in inputs["for_ids"]:  # a real character, just not one we asked about
            dropped.append(f"not asked for: a memory of {cid}")
            return None
        mem = CharacterMemory(
            cid, checked_text(task, answer, raw["summary"], "summary"),
            checked_text(task, answer, raw["feeling"][:200], "feeling", 200), (),
            cl.many(raw["participants"]), members, inputs["session"], raw["importance"],
            ml.many(raw["messages"], nonempty=True, field_name="a memory"))
        quotes, qdrop = check_quotes(raw["quotes"], ml, messages, inputs["max_quotes"], characters)
        dq.extend(qdrop)
        per[cid] = per.get(cid, 0) + 1
        if per[cid] > inputs["per_character"]:
            dropped.append(f"over {inputs['per_character']} memories for {cid}")
            return None
        return replace(mem, quotes=quotes)

    items = keep_valid(task, answer, data["memories"], build, "a memory")
    return Extraction(tuple(items), tuple(dq), tuple(dropped))


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


def _feeling(units: Sequence[ex.Unit]) -> str:
    counts = {label: sum(1 for u in units if rx.search(u.text)) for label, rx in _FEELINGS}
    best = max(counts.values(), default=0)
    if best == 0:
        return "not stated"
    return next(label for label, _ in _FEELINGS if counts[label] == best)


def extract_character_memories(messages: Sequence[ChatMessage], characters: Sequence[CharacterRef], *,
                               for_ids: Sequence[str] | None = None, session: int | None = None,
                               per_character: int, max_quotes: int, memory_tokens: int,
                               counter: TokenCounter | None = None) -> Extraction:
    """One memory per character who was involved (SW4): the sentences of the messages it spoke in
    or was named in, the lines said there, a feeling read from cue words ("not stated" if none).

    An extractive memory cannot take the character's point of view; it is the scene as it was
    written, filed under that character. `memory_tokens` bounds each memory's summary.
    """
    counter = counter or get_counter()
    targets = extraction_targets(characters, for_ids)
    solo = len([c for c in characters if not c.is_player]) == 1
    members = tuple(c.id for c in characters)
    items = []
    for t in targets:
        mine = [m for m in messages
                if solo or ex.speaker_ref(m, characters) == t or _mentions(t, m.text)]
        if not mine or per_character < 1:
            continue
        units = ex.units_of(mine)
        if not units:
            continue
        ranked = ex.ranked(units, ex.names_in(mine, characters))
        quotes, rest = ex.quotes_and_rest(ranked, mine, max_quotes, memory_tokens // 2, counter)
        chosen = ex.select(rest, memory_tokens, counter, fixed=ex.quote_lines(quotes))
        summary = ex.render_lines(chosen) or ex.fallback_text(rest or ranked, memory_tokens, counter)
        cues = sum(1 for u in units if ex.CUES.search(u.text))
        importance = min(5, 2 + (cues >= 3) + bool(quotes) + (len(mine) >= 10))
        feeling = _feeling([u for u in units if _mentions(t, u.text) or u.speaker == t.name] or units)
        items.append(CharacterMemory(t.id, summary, feeling, tuple(quotes),
                                     _present(characters, mine, also=t.id), members, session,
                                     importance, tuple(m.id for m in mine)))
    return Extraction(tuple(items))


def _memories_fallback(prompt: Prompt, counter: TokenCounter | None) -> Extraction:
    i = prompt.inputs
    return extract_character_memories(messages_from(i), characters_from(i), for_ids=i["for_ids"],
                                      session=i["session"], per_character=i["per_character"],
                                      max_quotes=i["max_quotes"], memory_tokens=i["memory_tokens"],
                                      counter=counter)


# --- scene summaries (SW5) -----------------------------------------------------------------------

SCENES_SCHEMA = obj_schema({"scenes": {"type": "array", "items": obj_schema({
    "title": STR, "summary": STR, "quotes": QUOTES, "participants": LABELS, "messages": LABELS,
}, ["title", "summary", "quotes", "participants", "messages"])}}, ["scenes"])


def scene_summaries(messages: Sequence[ChatMessage], characters: Sequence[CharacterRef], *,
                    session: int | None = None, max_scenes: int, max_quotes: int, scene_tokens: int,
                    gap_minutes: int, max_messages: int) -> Prompt:
    """Scene summaries (SW5): specific dialogue and actions, in more detail than a session summary.

    `scene_tokens`, `gap_minutes` and `max_messages` are for the extractive fallback (the length
    of a scene summary, where it cuts scenes); a model finds the scenes itself.
    """
    need(messages, "scene_summaries needs at least one message")
    system = (
        "You split a stretch of a roleplay chat into scenes (a scene changes with place, time or "
        "who is present) and describe each one in detail.\n"
        f"- {COMMON_RULES}\n"
        f"- At most {max_scenes} scenes, in order. \"summary\": the specific actions and exchanges, "
        "who did and said what, in the order they happened.\n"
        f"- \"quotes\": up to {max_quotes} exact lines of dialogue per scene. {QUOTE_RULE}\n"
        "- \"participants\": labels (c1, c2, …) of the characters in the scene. \"messages\": labels "
        "of the scene's messages.\n"
        f"{ANSWER_RULE}\n"
        + json_block({"scenes": [{"title": "…", "summary": "…",
                                  "quotes": [{"speaker": "Name", "text": "exact words",
                                              "message": "m1"}],
                                  "participants": ["c1"], "messages": ["m1"]}]})
    )
    user = render_characters(characters) + "\n\nMessages:\n" + render_messages(messages)
    return make_prompt("scene_summaries", system, user, 100 + max_scenes * (250 + 50 * max_quotes),
                       {"messages": dump(messages), "characters": dump(characters),
                        "session": session, "max_scenes": max_scenes, "max_quotes": max_quotes,
                        "scene_tokens": scene_tokens, "gap_minutes": gap_minutes,
                        "max_messages": max_messages}, SCENES_SCHEMA)


def _parse_scenes(inputs: dict[str, Any], data: dict[str, Any], answer: str) -> Extraction:
    task = "scene_summaries"
    messages, characters, ml, cl = cast_labels(task, inputs, answer)
    members = tuple(c.id for c in characters)
    dq: list[Any] = []

    def build(raw: dict[str, Any]) -> SceneSummary:
        scene = SceneSummary(
            checked_text(task, answer, raw["title"][:200], "title", 200),
            checked_text(task, answer, raw["summary"], "summary"), (), cl.many(raw["participants"]),
            members, inputs["session"], ml.many(raw["messages"], nonempty=True, field_name="a scene"))
        quotes, qdrop = check_quotes(raw["quotes"], ml, messages, inputs["max_quotes"], characters)
        dq.extend(qdrop)
        return replace(scene, quotes=quotes)

    items = keep_valid(task, answer, data["scenes"], build, "a scene")
    dropped = tuple(f"over the limit of {inputs['max_scenes']} scenes: {s.title[:80]}"
                    for s in items[inputs["max_scenes"]:])
    return Extraction(tuple(items[:inputs["max_scenes"]]), tuple(dq), dropped)


_SCENE_BREAK = re.compile(r"^\s*(?:(?:\*\s*){3,}|-{3,}|#{3,}|~{3,}|={3,})\s*$", re.M)


def _when(m: ChatMessage) -> datetime | None:
    if not m.sent_at:
        return None
    try:
        return datetime.fromisoformat(m.sent_at.replace("Z", "+00:00"))
    except ValueError:
        return None


def split_scenes(messages: Sequence[ChatMessage], *, max_scenes: int, gap_minutes: int,
                 max_messages: int) -> list[list[ChatMessage]]:
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
                   session: int | None = None, max_scenes: int, max_quotes: int, scene_tokens: int,
                   gap_minutes: int, max_messages: int,
                   counter: TokenCounter | None = None) -> Extraction:
    """Scene summaries (SW5) without a model: each scene's best sentences and its lines, verbatim
    and attributed, within `scene_tokens`; scenes cut as `split_scenes` says."""
    counter = counter or get_counter()
    members = tuple(c.id for c in characters)
    items = []
    for scene in split_scenes(messages, max_scenes=max_scenes, gap_minutes=gap_minutes,
                              max_messages=max_messages):
        units = ex.units_of(scene)
        if not units:
            continue
        s = summarize_chunk(scene, budget_tokens=scene_tokens, max_quotes=max_quotes, counter=counter)
        first = next((u.text for u in units if not u.speech), units[0].text)
        title = first if len(first) <= 80 else first[:77].rsplit(" ", 1)[0] + "\u2026"
        items.append(SceneSummary(title, s.text, s.quotes, _present(characters, scene), members,
                                  session, tuple(m.id for m in scene)))
    return Extraction(tuple(items))


def _scenes_fallback(prompt: Prompt, counter: TokenCounter | None) -> Extraction:
    i = prompt.inputs
    return extract_scenes(messages_from(i), characters_from(i), session=i["session"],
                          max_scenes=i["max_scenes"], max_quotes=i["max_quotes"],
                          scene_tokens=i["scene_tokens"], gap_minutes=i["gap_minutes"],
                          max_messages=i["max_messages"], counter=counter)


CHARACTER_MEMORIES = Task("character_memories", character_memories, MEMORIES_SCHEMA, _parse_memories,
                          _memories_fallback)
SCENE_SUMMARIES = Task("scene_summaries", scene_summaries, SCENES_SCHEMA, _parse_scenes, _scenes_fallback)
