"""Reading a real model's answer: what is kept of it, and a record of what was changed.

Real models wrap their JSON in reasoning (`<think>…</think>`), prefaces ("Sure! Here is…") and
fences, break it (trailing commas, single quotes, a cut-off tail), add keys nobody asked for, or get
one part of an otherwise good answer wrong. We keep what is right:
- reasoning blocks and prose around the object are stripped;
- broken JSON is repaired with `json_repair` (a well-kept library, not our own regexes), and the
  repair is noted;
- against the task's JSON Schema (`prune`): a key the schema does not know is ignored, a missing
  list is taken as empty, and an array item that breaks the schema is dropped — each noted —
  while the rest of the answer is kept. Only when the top level itself cannot be read is the
  answer refused (`PromptParseError`).

`Report` collects the notes of one parse; the job's result carries them (`model.changed`,
`model.dropped`), so a person sees what was dropped or changed and why.
"""

from __future__ import annotations

import contextvars
import json
import re
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator

import json_repair
from jsonschema import Draft202012Validator

_THINK = re.compile(r"<(think|thinking|reasoning)>.*?</\1>", re.DOTALL | re.IGNORECASE)
_OPEN_THINK = re.compile(r"^\s*<(think|thinking|reasoning)>.*?(?=\{)", re.DOTALL | re.IGNORECASE)
_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9]*)[ \t]*\r?\n(.*?)(?:```|$)", re.DOTALL)
_MAX_PRUNES = 200  # a bound on the repair loop (each step removes something)


@dataclass
class Report:
    """What one parse of an answer changed (`changed`) and left out (`dropped`)."""

    changed: list[str] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, list[str]]:
        return {"changed": list(self.changed), "dropped": list(self.dropped)}


_CURRENT: contextvars.ContextVar[Report | None] = contextvars.ContextVar("answer_report", default=None)


@contextmanager
def reporting(report: Report) -> Iterator[Report]:
    """Make `report` the one the parsers of this thread note into."""
    token = _CURRENT.set(report)
    try:
        yield report
    finally:
        _CURRENT.reset(token)


def current() -> Report:
    """The report of the parse in progress (a throwaway one outside any)."""
    return _CURRENT.get() or Report()


def strip_reasoning(answer: str) -> str:
    """The answer without reasoning blocks (`<think>…</think>`, also one left open before the JSON)."""
    text = _THINK.sub("", answer)
    text = _OPEN_THINK.sub("", text)
    return text.strip().lstrip("\ufeff")


def read_object(answer: str, report: Report | None = None, wanted: Iterable[str] = ()) -> dict[str, Any]:
    """The JSON object in a model's answer. Raises ValueError with a plain reason otherwise.

    Tried in order: the whole answer; the first fenced block holding a brace; each object that
    parses as it stands, from the first brace on (prose or reasoning may hold braces too); the
    text from the first brace, repaired. With `wanted` (the schema's top-level keys), the first
    of these holding one of them is taken."""
    report = report or current()
    text = strip_reasoning(answer)
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
    fences = [(lang, body) for lang, body in _FENCE.findall(text) if "{" in body]
    if fences:
        lang, body = fences[0]
        if lang and lang.lower() not in ("json", "json5", "javascript", "js"):
            raise ValueError(f"the code block is marked {lang!r}, not JSON")
        text = body
    first = text.find("{")
    if first < 0:
        raise ValueError("no JSON object found in the answer")
    keys = set(wanted)
    fits = (lambda obj: bool(keys & set(obj))) if keys else (lambda obj: True)
    decoder = json.JSONDecoder()
    for start in (i for i, ch in enumerate(text) if ch == "{"):
        try:
            obj, end = decoder.raw_decode(text, start)
        except ValueError:
            continue
        if isinstance(obj, dict) and fits(obj):
            if text[:start].strip():
                report.changed.append("prose before the JSON object was ignored")
            if text[end:].strip():
                report.changed.append("prose after the JSON object was ignored")
            return obj
    repaired = json_repair.repair_json(text[first:], return_objects=True)
    if isinstance(repaired, list):
        repaired = next((x for x in repaired if isinstance(x, dict) and fits(x)), None)
    if not isinstance(repaired, dict) or not repaired:
        raise ValueError("the JSON object in the answer is broken beyond repair")
    if text[:first].strip():
        report.changed.append("prose before the JSON object was ignored")
    report.changed.append("broken JSON was repaired (e.g. a trailing comma, quotes or a cut-off end)")
    return repaired


def prune(schema: dict[str, Any], data: dict[str, Any], report: Report | None = None) -> str | None:
    """Fix `data` in place until it fits `schema`, keeping every valid part (see the module
    docstring). Returns None when it fits, else the reason it cannot be made to."""
    report = report or current()
    known = set(schema.get("properties", {}))
    if known and not known & set(data):
        return "the answer has none of the fields asked for (" + ", ".join(sorted(known)) + ")"
    validator = Draft202012Validator(schema)
    for _ in range(_MAX_PRUNES):
        errors = sorted(validator.iter_errors(data), key=lambda e: -len(e.absolute_path))
        if not errors:
            return None
        if not _fix(errors[0], data, report):
            where = "/".join(str(p) for p in errors[0].absolute_path) or "the top level"
            return f"at {where}: {errors[0].message}"
    return "the answer breaks its format in too many places"


def _fix(error: Any, data: dict[str, Any], report: Report) -> bool:
    path = list(error.absolute_path)
    if error.validator == "additionalProperties" and isinstance(error.instance, dict):
        known = set(error.schema.get("properties", {}))
        for key in [k for k in error.instance if k not in known]:
            del error.instance[key]
            report.changed.append(f"ignored a field nobody asked for: {'/'.join(map(str, path + [key]))}")
        return True
    if error.validator == "required" and isinstance(error.instance, dict):
        props = error.schema.get("properties", {})
        missing = [k for k in error.schema.get("required", []) if k not in error.instance]
        lists = [k for k in missing if props.get(k, {}).get("type") == "array"]
        if lists and len(lists) == len(missing):
            for key in lists:
                error.instance[key] = []
                report.changed.append(f"a missing list was taken as empty: {'/'.join(map(str, path + [key]))}")
            return True
    # Drop the innermost array item that holds the error; the rest of the answer stays.
    for i in range(len(path) - 1, -1, -1):
        if isinstance(path[i], int):
            parent = _at(data, path[:i])
            if isinstance(parent, list) and path[i] < len(parent):
                parent.pop(path[i])
                where = "/".join(map(str, path[:i + 1]))
                report.dropped.append(f"{where} dropped: {error.message[:160]}")
                return True
    return False


def _at(data: Any, path: list[Any]) -> Any:
    for key in path:
        data = data[key]
    return data


def snake_case(name: str) -> str:
    """A field name as the schema wants it: `Manner of speech` → `manner_of_speech`."""
    out = re.sub(r"[^a-z0-9]+", "_", name.strip().lower()).strip("_")
    if out and not out[0].isalpha():
        out = "f_" + out
    return out[:40]
