"""What every task shares: the `Prompt` and its payload round trip, the inputs and results more
than one family uses, the labels shown to a model, reading the JSON of an answer (its schema
check, `PromptParseError`), and `Task` itself (see the package docstring)."""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterable, Sequence

from jsonschema import Draft202012Validator
from jsonschema.exceptions import best_match

from ...core.quotes import DEFAULT_MAX_QUOTE_CHARS, DroppedQuote, Quote, verify_quotes

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

    def parse_answer(self, prompt: Prompt, answer: str) -> Any:
        """A model's answer to `prompt` as the task's result, or PromptParseError: one JSON object,
        valid against `schema`, then `parse`."""
        try:
            data = extract_json(answer)
        except ValueError as e:
            raise PromptParseError(self.name, str(e), answer) from None
        validate(self.name, self.schema, data, answer)
        return self.parse(prompt.inputs, data, answer)


# --- rendering -----------------------------------------------------------------------------------

COMMON_RULES = (
    "Use only what is in the text given. Never invent names, events or words. "
    "Write in the language of the conversation."
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


def render_messages(messages: Sequence[ChatMessage]) -> str:
    """The messages under their labels, the player's marked."""
    parts = []
    for i, m in enumerate(messages):
        who = m.speaker or m.role
        tag = " (player)" if m.role == "user" else ""
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
    return json.dumps(example, ensure_ascii=False, indent=1)


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


def validate(task: str, schema: dict[str, Any], data: dict[str, Any], answer: str) -> None:
    """Raise PromptParseError naming where `data` first breaks `schema`."""
    error = best_match(Draft202012Validator(schema).iter_errors(data))
    if error is not None:
        where = "/".join(str(p) for p in error.absolute_path) or "the top level"
        raise PromptParseError(task, f"at {where}: {error.message}", answer)


class Labels:
    """Maps the labels a prompt showed (m1, c2, …) back to ids, rejecting any we did not show."""

    def __init__(self, task: str, answer: str, prefix: str, ids: Sequence[str], what: str) -> None:
        self.task, self.answer, self.what = task, answer, what
        self.map = {f"{prefix}{i + 1}": x for i, x in enumerate(ids)}

    def one(self, label: Any) -> str:
        """The id behind one label."""
        key = str(label).strip().strip("[]")
        if key not in self.map:
            shown = ", ".join(list(self.map)[:3]) + ("…" if len(self.map) > 3 else "")
            raise PromptParseError(self.task, f"{label!r} is not one of the {self.what} labels "
                                              f"given ({shown})", self.answer)
        return self.map[key]

    def many(self, labels: Iterable[Any], *, nonempty: bool = False, field_name: str = "") -> tuple[str, ...]:
        """The ids behind labels, each once, in order."""
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


def cast_labels(task: str, inputs: dict[str, Any],
                answer: str) -> tuple[list[ChatMessage], list[CharacterRef], Labels, Labels]:
    """The messages and characters a prompt carries, and their labels (m1…, c1…)."""
    messages, characters = messages_from(inputs), characters_from(inputs)
    return (messages, characters, Labels(task, answer, "m", [m.id for m in messages], "message"),
            Labels(task, answer, "c", [c.id for c in characters], "character"))


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
                 limit: int) -> tuple[tuple[Quote, ...], tuple[DroppedQuote, ...]]:
    """Map quote labels to ids (an unknown label fails the parse), then verify them (SW8)."""
    cited = [Quote(q["speaker"].strip(), q["text"], mlabels.one(q["message"])) for q in raw]
    check = verify_quotes(cited, {m.id: m.text for m in messages}, max_chars=DEFAULT_MAX_QUOTE_CHARS)
    kept = check.kept[:limit]
    over = tuple(DroppedQuote(q, "over_limit") for q in check.kept[limit:])
    return kept, check.dropped + over
