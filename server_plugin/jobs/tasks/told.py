"""The told-events task (SW9b): where, in a scene, a character reveals one of the listed secrets
to others present. Its prompt, schema, parser and extractive fallback (a near-literal retelling
found by word overlap)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

from ...core.quotes import DroppedQuote, Quote, speaker_said, verify_quotes
from ...core.text import RETOLD_STOP_WORDS, content_words
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
    Task,
    cast_labels,
    characters_from,
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


@dataclass(frozen=True)
class SecretInput:
    """Something only some characters know (SW9b): a sheet secret, a restricted memory, a lore entry."""

    id: str
    text: str
    known_by: tuple[str, ...] = ()


@dataclass(frozen=True)
class ToldEvent:
    """"X told Y about Z" (SW9b): listeners now know the secret; evidence is a verified quote."""

    teller_id: str
    listener_ids: tuple[str, ...]
    secret_id: str
    evidence: Quote


TOLD_SCHEMA = obj_schema({"events": {"type": "array", "items": obj_schema({
    "teller": STR, "listeners": LABELS, "secret": STR, "message": STR, "evidence": STR,
}, ["teller", "listeners", "secret", "message", "evidence"])}}, ["events"])


def told_events(messages: Sequence[ChatMessage], characters: Sequence[CharacterRef],
                secrets: Sequence[SecretInput], *, max_events: int) -> Prompt:
    """Secrets passed on (SW9b): find where a character tells another one of the listed secrets."""
    need(messages, "told_events needs at least one message")
    need(secrets, "told_events needs the secrets to look for")
    labels = {c.id: f"c{i + 1}" for i, c in enumerate(characters)}
    system = (
        "You check whether, in these roleplay messages, a character reveals one of the listed "
        "secrets to other characters (says it, hints it unmistakably, or shows the proof).\n"
        f"- {COMMON_RULES} Report only clear cases; usually there are none: then answer "
        "{\"events\": []}.\n"
        f"- At most {max_events} events. \"teller\" and \"listeners\": character labels (c1, c2, …); "
        "\"secret\": the secret's label (k1, k2, …); \"message\": the label of the message where it "
        "is told; \"evidence\": the words in that message that reveal it, copied exactly.\n"
        f"{ANSWER_RULE}\n"
        + json_block({"events": [{"teller": "c1", "listeners": ["c2" if len(characters) > 1 else "c1"],
                                  "secret": "k1", "message": "m1", "evidence": "exact words"}]})
    )
    secret_lines = []
    for i, s in enumerate(secrets):
        who = ", ".join(labels.get(k, "someone not present") for k in s.known_by) or "nobody listed"
        secret_lines.append(f"[k{i + 1}] {s.text.strip()} (known by: {who})")
    user = (render_characters(characters) + "\n\nSecrets:\n<secrets>\n" + "\n".join(secret_lines)
            + "\n</secrets>\n\nMessages:\n" + render_messages(messages))
    return make_prompt("told_events", system, user, 60 + max_events * 120,
                       {"messages": dump(messages), "characters": dump(characters),
                        "secrets": dump(secrets), "max_events": max_events}, TOLD_SCHEMA)


def _parse_told(inputs: dict[str, Any], data: dict[str, Any], answer: str) -> Extraction:
    task = "told_events"
    messages, characters, ml, cl = cast_labels(task, inputs, answer)
    kl = Labels(task, answer, "k", [s["id"] for s in inputs["secrets"]], "secret")
    names = {c.id: c.name for c in characters}
    dq: list[Any] = []
    dropped: list[str] = []
    by_id = {m.id: m for m in messages}
    who = {c.id: c for c in characters}

    def build(raw: dict[str, Any]) -> ToldEvent | None:
        teller = cl.one(raw["teller"])
        listeners = tuple(x for x in cl.many(raw["listeners"], nonempty=True,
                                             field_name="listeners") if x != teller)
        secret = kl.one(raw["secret"])
        claim = Quote(names[teller], raw["evidence"], ml.one(raw["message"]))
        check = verify_quotes([claim], {m.id: m.text for m in messages})
        if not check.kept:
            dq.extend(check.dropped)
            dropped.append(f"evidence not found in the message: {raw['evidence'][:80]}")
            return None
        if not listeners:
            dropped.append("a character cannot tell a secret only to themselves")
            return None
        kept, m, t = check.kept[0], by_id[check.kept[0].message_id], who[teller]
        if speaker_said(t.name, (m.speaker, *((t.name, *t.aliases) if m.character_id == teller else ())),
                        m.text, kept.text, (t.name, *t.aliases)) is None:
            dq.append(DroppedQuote(kept, "wrong_speaker"))
            dropped.append(f"{t.name} did not say the evidence: {kept.text[:80]}")
            return None
        return ToldEvent(teller, listeners, secret, kept)

    items = keep_valid(task, answer, data["events"], build, "an event")
    dropped += [f"over the limit of {inputs['max_events']} events" for _ in items[inputs["max_events"]:]]
    return Extraction(tuple(items[:inputs["max_events"]]), tuple(dq), tuple(dropped))


def extract_told(messages: Sequence[ChatMessage], characters: Sequence[CharacterRef],
                 secrets: Sequence[SecretInput], *, max_events: int,
                 min_overlap: float = 0.6) -> Extraction:
    """"X told Y about Z" by word overlap (SW9b): a character who knows a secret speaks a sentence
    holding most of the secret's content words (`core.text.content_words` with the retelling stop
    words; at least `min_overlap` of them, and at least 2), in front of chat members who did not
    know it. The sentence is the evidence, verified verbatim.

    Weak without a model: it sees only near-literal retellings, never hints or paraphrase.
    """
    events: list[ToldEvent] = []
    done: set[tuple[str, str]] = set()
    units = ex.units_of(messages)
    for s in secrets:
        words = content_words(s.text, RETOLD_STOP_WORDS)
        if len(words) < 2:
            continue
        need_words = max(2, math.ceil(len(words) * min_overlap))
        for u in units:
            teller = ex.speaker_ref(messages[u.msg], characters)
            if teller is None or teller.id not in s.known_by:
                continue
            listeners = tuple(c.id for c in characters if c.id not in s.known_by and c.id != teller.id)
            if not listeners or len(words & content_words(u.text, RETOLD_STOP_WORDS)) < need_words:
                continue
            if (s.id, teller.id) in done:
                continue
            done.add((s.id, teller.id))
            check = verify_quotes([Quote(teller.name, u.text, u.message_id)],
                                  {m.id: m.text for m in messages})
            if check.kept:
                events.append(ToldEvent(teller.id, listeners, s.id, check.kept[0]))
    dropped = tuple(f"over the limit of {max_events} events" for _ in events[max_events:])
    return Extraction(tuple(events[:max_events]), (), dropped)


def _told_fallback(prompt: Prompt, counter: TokenCounter | None) -> Extraction:
    i = prompt.inputs
    secrets = [SecretInput(s["id"], s["text"], tuple(s["known_by"])) for s in i["secrets"]]
    return extract_told(messages_from(i), characters_from(i), secrets, max_events=i["max_events"])


TOLD_EVENTS = Task("told_events", told_events, TOLD_SCHEMA, _parse_told, _told_fallback)
