"""What every task shares: the `Prompt` and its payload round trip, the inputs and results more
than one family uses, the labels shown to a model, reading the JSON of an answer (its schema
check, `PromptParseError`), and `Task` itself (see the package docstring)."""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterable, Sequence

from ...core.quotes import DEFAULT_MAX_QUOTE_CHARS, DroppedQuote, Quote, speaker_said, verify_quotes
from . import answers

if TYPE_CHECKING:
    from ...core.tokens import TokenCounter

PROMPT_VERSION = 1


class PromptParseError(ValueError):
    """A model answer that does not follow the format its prompt asked for. Nothing is stored."""

    def __init__(self, task: str, reason: str, answer: str = "") -> None:
        self.task = task
        self.reason = reason
        excerpt = answer.strip().replace("\n", " ")[:160]
        tail = f" The answer began: {excerpt!r}" if excerpt else " The answer was empty."
        super().__init__(f"{task}: the model's answer was rejected: {reason}.{tail}")


# --- inputs and results more than one family uses ------------------------------------------------

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
        """The Prompt `to_payload` wrote (from a job row, or as the extension got it)."""
        return cls(task=payload["task"], system=payload["system"], user=payload["user"],
                   max_tokens=int(payload["max_tokens"]), inputs=payload["inputs"],
                   json_schema=payload.get("json_schema") or {},
                   version=int(payload.get("version", PROMPT_VERSION)))


def make_prompt(task: str, system: str, user: str, max_tokens: int, inputs: dict[str, Any],
                schema: dict[str, Any]) -> Prompt:
    """A Prompt whose inputs are already in their JSON form (tuples as lists), so a prompt equals
    itself after the round trip through a job row or the extension."""
    return Prompt(task, system, user, max_tokens, json.loads(json.dumps(inputs)), schema)


# --- the task ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Task:
    """One model task, whole: `render(...)` builds its Prompt; `schema` is the JSON Schema of the
    answer; `parse(inputs, data, answer)` turns a schema-valid answer into the result (or raises
    PromptParseError); `fallback(prompt, counter)` is the extractive result of the same prompt,
    of the same type, without a model."""

    name: str
    render: Callable[..., Prompt]
    schema: dict[str, Any]
    parse: Callable[[dict[str, Any], dict[str, Any], str], Any]
    fallback: Callable[[Prompt, "TokenCounter | None"], Any]
    normalise: Callable[[dict[str, Any]], None] | None = None  # fixes before the schema check

    def parse_answer(self, prompt: Prompt, answer: str, report: answers.Report | None = None) -> Any:
        """A model's answer to `prompt` as the task's result, or PromptParseError: one JSON object
        (`answers.read_object`), fitted to `schema` keeping its valid parts, then `parse`. What
        was changed or dropped on the way is noted in `report`."""
        with answers.reporting(report or answers.Report()):
            try:
                data = answers.read_object(answer, wanted=self.schema.get("properties", {}))
            except ValueError as e:
                raise PromptParseError(self.name, str(e), answer) from None
            return self.parse_data(prompt.inputs, data, answer)

    def parse_data(self, inputs: dict[str, Any], data: dict[str, Any], answer: str) -> Any:
        """An answer already read as JSON (e.g. one section of a per-part answer): normalised,
        fitted to `schema`, then `parse` (inside the caller's report)."""
        report = answers.current()
        before = len(report.dropped)
        if self.normalise is not None:
            self.normalise(data)
        validate(self.name, self.schema, data, answer)
        result = self.parse(inputs, data, answer)
        if len(report.dropped) > before and _nothing_kept(result):
            raise PromptParseError(self.name, "nothing of the answer could be kept: "
                                   + "; ".join(report.dropped[before:before + 3]), answer)
        return result


def _nothing_kept(result: Any) -> bool:
    """Whether a list-producing result kept nothing (an answer that had parts, all of them bad)."""
    if isinstance(result, Extraction):
        return not result.items
    parts = [getattr(result, name) for name in ("drafts", "updates") if hasattr(result, name)]
    return bool(parts) and not any(parts)


# --- rendering -----------------------------------------------------------------------------------

COMMON_RULES = (
    "Use only what is in the text given. Never invent names, events or words. "
    "Write every text you write (summaries, memories, titles, feelings, sheet fields) in the "
    "language the conversation is written in, never translated into English; quotes stay as "
    "they were said."
)

QUOTE_RULE = (
    "A quote must be copied exactly, character for character, from ONE message, as one unbroken "
    "stretch of words (no \"...\" to skip words), with that message's label; quotes that are not "
    "found word for word in the cited message are thrown away."
)

ANSWER_RULE = "Answer with one JSON object in exactly this format and nothing else:"


def words_for(tokens: int) -> int:
    """About how many English words fit in `tokens` (a budget a model can aim at)."""
    return max(20, int(tokens * 0.75) // 10 * 10)


def message_label(i: int) -> str:
    """The label of the `i`-th message shown (m1, m2, …)."""
    return f"m{i + 1}"


def render_messages(messages: Sequence[ChatMessage], player_tag: bool = True) -> str:
    """The messages under their labels, the player's marked (unless `player_tag` is False: a
    prompt whose characters say who the player is)."""
    parts = []
    for i, m in enumerate(messages):
        who = m.speaker or m.role
        tag = " (player)" if m.role == "user" and player_tag else ""
        parts.append(f"[{message_label(i)}] {who}{tag}: {m.text.strip()}")
    return "<messages>\n" + "\n\n".join(parts) + "\n</messages>"


def render_characters(characters: Sequence[CharacterRef]) -> str:
    """The characters under their labels (c1, c2, …), with the player's and aliases marked."""
    lines = []
    for i, c in enumerate(characters):
        extra = " (the player's character)" if c.is_player else ""
        aka = f", also called {', '.join(c.aliases)}" if c.aliases else ""
        lines.append(f"c{i + 1} = {c.name}{extra}{aka}")
    return "<characters>\n" + "\n".join(lines) + "\n</characters>"


def dump(items: Iterable[Any]) -> list[dict[str, Any]]:
    """Dataclass inputs as dicts, for a Prompt's inputs."""
    return [asdict(x) for x in items]


def json_block(example: dict[str, Any]) -> str:
    """An example answer as a prompt shows it."""
    # One line: the example costs every call its tokens, and a model reads it as well unindented.
    return json.dumps(example, ensure_ascii=False)


def out_tokens(budget_tokens: int, max_quotes: int) -> int:
    """Room for the answer: the text, the JSON around it, and the quotes (non-English text and
    JSON escapes cost more tokens than the words suggest, so the margin is generous)."""
    return int(budget_tokens * 1.5) + 60 + max_quotes * 80


def need(items: Sequence[Any], message: str) -> None:
    """Refuse to render a task without the items it is about (ValueError `message`)."""
    if not items:
        raise ValueError(message)


# --- JSON schemas of the answers -----------------------------------------------------------------

def obj_schema(props: dict[str, Any], required: Sequence[str]) -> dict[str, Any]:
    """An object with exactly these properties (unknown keys are errors)."""
    return {"type": "object", "properties": props, "required": list(required),
            "additionalProperties": False}


STR = {"type": "string", "minLength": 1}
LABELS = {"type": "array", "items": {"type": "string"}}
QUOTES = {"type": "array", "items": obj_schema({"speaker": STR, "text": STR, "message": STR},
                                               ["speaker", "text", "message"])}
LEVEL = {"type": "integer", "minimum": 1, "maximum": 5}


# --- parsing -------------------------------------------------------------------------------------

def extract_json(answer: str) -> dict[str, Any]:
    """The one JSON object in a model's answer (reasoning, prose and fences around it stripped,
    broken JSON repaired: `answers.read_object`). Raises ValueError with a reason otherwise."""
    return answers.read_object(answer)


def validate(task: str, schema: dict[str, Any], data: dict[str, Any], answer: str) -> None:
    """Make `data` fit `schema`, keeping its valid parts (`answers.prune`, noted in the current
    report); PromptParseError naming where it breaks when nothing can be kept."""
    reason = answers.prune(schema, data)
    if reason is not None:
        raise PromptParseError(task, reason, answer)


class Labels:
    """Maps the labels a prompt showed (m1, c2, …) back to ids. A label we did not show is refused
    by `one` (the caller drops that item) and left out by `many` (noted); a name given for a label
    (`names`: label -> the names it stands for) is mapped to it when only one label has it."""

    def __init__(self, task: str, answer: str, prefix: str, ids: Sequence[str], what: str,
                 names: dict[str, Sequence[str]] | None = None) -> None:
        self.task, self.answer, self.what = task, answer, what
        self.map = {f"{prefix}{i + 1}": x for i, x in enumerate(ids)}
        by_name: dict[str, set[str]] = {}
        for label, known in (names or {}).items():
            for n in known:
                if n and n.strip():
                    by_name.setdefault(n.strip().casefold(), set()).add(label)
        self._by_name = {n: next(iter(ls)) for n, ls in by_name.items() if len(ls) == 1}

    def find(self, label: Any) -> str | None:
        """The id behind a label (or an unambiguous name, noted as a change), or None."""
        raw = str(label).strip()
        key = raw.strip("[]")
        if key in self.map:
            return self.map[key]
        named = self._by_name.get(re.sub(r"\s*\(.*\)\s*$", "", key).casefold())
        if named is not None:
            answers.current().changed.append(f"the {self.what} name {raw!r} was read as its label {named}")
            return self.map[named]
        return None

    def one(self, label: Any) -> str:
        """The id behind one label; PromptParseError (this item is dropped) for a label not given."""
        found = self.find(label)
        if found is None:
            shown = ", ".join(list(self.map)[:3]) + ("…" if len(self.map) > 3 else "") or "none"
            raise PromptParseError(self.task, f"{label!r} is not one of the {self.what} labels "
                                              f"given ({shown})", self.answer)
        return found

    def many(self, labels: Iterable[Any], *, nonempty: bool = False, field_name: str = "") -> tuple[str, ...]:
        """The ids behind labels, each once, in order; labels not given are left out (noted)."""
        found = []
        for x in labels:
            got = self.find(x)
            if got is None:
                answers.current().dropped.append(f"{x!r} is not one of the {self.what} labels given")
            else:
                found.append(got)
        out = tuple(dict.fromkeys(found))
        if nonempty and not out:
            given = ", ".join(repr(x) for x in labels) or "none"
            raise PromptParseError(self.task, f"{field_name or self.what} must cite at least one "
                                              f"label given (it cited {given})", self.answer)
        return out


def keep_valid(task: str, answer: str, raw_items: Sequence[Any], build: Callable[[Any], Any],
               what: str) -> list[Any]:
    """`build(raw)` of each item; an item whose build raises PromptParseError is dropped (noted).
    When items were given and none could be kept, the answer is refused with their reasons."""
    kept, reasons = [], []
    for raw in raw_items:
        try:
            item = build(raw)
        except PromptParseError as e:
            reasons.append(e.reason)
            answers.current().dropped.append(f"{what} dropped: {e.reason}")
            continue
        if item is not None:
            kept.append(item)
    if raw_items and not kept and reasons:
        raise PromptParseError(task, f"nothing could be kept ({what}: " + "; ".join(reasons[:3]) + ")", answer)
    return kept


def character_labels(task: str, answer: str, characters: Sequence["CharacterRef"]) -> Labels:
    """The c1, c2, … labels of `characters`, their names and aliases mapped too."""
    return Labels(task, answer, "c", [c.id for c in characters], "character",
                  {f"c{i + 1}": (c.name, *c.aliases) for i, c in enumerate(characters)})


def messages_from(inputs: dict[str, Any]) -> list[ChatMessage]:
    """The messages a rendered prompt carries, as ChatMessage objects."""
    return [ChatMessage(**m) for m in inputs.get("messages", [])]


def characters_from(inputs: dict[str, Any]) -> list[CharacterRef]:
    """The characters a rendered prompt carries, as CharacterRef objects."""
    return [CharacterRef(**{**c, "aliases": tuple(c.get("aliases", ()))})
            for c in inputs.get("characters", [])]


def cast_labels(task: str, inputs: dict[str, Any],
                answer: str) -> tuple[list[ChatMessage], list[CharacterRef], Labels, Labels]:
    """The messages and characters a prompt carries, and their labels (m1…, c1…)."""
    messages, characters = messages_from(inputs), characters_from(inputs)
    return (messages, characters, Labels(task, answer, "m", [m.id for m in messages], "message"),
            character_labels(task, answer, characters))


def quote_in(q: dict[str, Any]) -> Quote:
    """A quote as a prompt's inputs hold it."""
    return Quote(q["speaker"], q["text"], q["message_id"])


def checked_text(task: str, answer: str, value: str, name: str, max_chars: int | None = None) -> str:
    """`value` stripped; PromptParseError when blank or over `max_chars`."""
    text = value.strip()
    if not text:
        raise PromptParseError(task, f"{name} is blank", answer)
    if max_chars is not None and len(text) > max_chars:
        raise PromptParseError(task, f"{name} has {len(text)} characters, more than {max_chars}",
                               answer)
    return text


def check_quotes(raw: list[dict[str, Any]], mlabels: Labels, messages: Sequence[ChatMessage],
                 limit: int, characters: Sequence["CharacterRef"] = ()) -> tuple[tuple[Quote, ...], tuple[DroppedQuote, ...]]:
    """Map quote labels to ids, verify the words (SW8), then the speaker: a quote is kept only
    when its speaker wrote the cited message or its narration names them as speaking it
    (`core.quotes.speaker_said`). Every quote left out is returned with its reason."""
    cited, dropped = [], []
    for q in raw:
        mid = mlabels.find(q["message"])
        quote = Quote(q["speaker"].strip(), q["text"], mid or str(q["message"]))
        (cited if mid is not None else dropped).append(quote if mid else DroppedQuote(quote, "unknown_message"))
    check = verify_quotes(cited, {m.id: m.text for m in messages}, max_chars=DEFAULT_MAX_QUOTE_CHARS)
    by_id = {m.id: m for m in messages}
    cast = [(c.name, *c.aliases) for c in characters]
    cast += [(n,) for n in dict.fromkeys(m.speaker for m in messages)
             if n and all(n.casefold() not in {x.casefold() for x in c} for c in cast)]
    kept = []
    for q in check.kept:
        speaker = _speaker_named(q.speaker, mlabels, characters)
        author = _author_names(by_id[q.message_id], characters)
        said = speaker_said(speaker, author, by_id[q.message_id].text, q.text,
                            _names_of(speaker, characters), cast)
        if said is None:
            dropped.append(DroppedQuote(q, "wrong_speaker"))
        else:
            kept.append(Quote(said, q.text, q.message_id))
    over = tuple(DroppedQuote(q, "over_limit") for q in kept[limit:])
    return tuple(kept[:limit]), tuple(dropped) + check.dropped + over


def _speaker_named(speaker: str, mlabels: Labels, characters: Sequence["CharacterRef"]) -> str:
    """A quote's speaker as a name (a model may give a character label such as c2)."""
    m = re.fullmatch(r"\[?c(\d+)\]?", speaker.strip())
    if m and 0 < int(m.group(1)) <= len(characters):
        return characters[int(m.group(1)) - 1].name
    return re.sub(r"\s*\((the )?player('s character)?\)\s*$", "", speaker.strip())


def _author_names(message: ChatMessage, characters: Sequence["CharacterRef"]) -> tuple[str, ...]:
    """The names a message's author goes by (its speaker name, and its character's name and aliases)."""
    names = [message.speaker]
    for c in characters:
        if c.id == message.character_id or c.name.casefold() == (message.speaker or "").casefold():
            names += [c.name, *c.aliases]
    return tuple(n for n in names if n)


def _names_of(speaker: str, characters: Sequence["CharacterRef"]) -> tuple[str, ...]:
    """Every name of the character called `speaker` (name or alias), or just `speaker`."""
    for c in characters:
        if speaker.casefold() in {c.name.casefold(), *(a.casefold() for a in c.aliases)}:
            return (c.name, *c.aliases)
    return (speaker,)
