"""The JSON Schemas of `shared_schema/`: loaded once, used to validate requests at the HTTP edge.

Schemas refer to each other by relative `$ref` ("common.json#/$defs/id"); every file's `$id` is
under one base URI, so the same files work for Ajv in the extension.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Any
from urllib.parse import urljoin

from jsonschema import Draft202012Validator
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

from ..errors import BadRequest

SCHEMA_DIR = Path(__file__).resolve().parents[2] / "shared_schema"
BASE_URI = "https://chronicler.invalid/schema/"
MAX_DETAILS = 20


class SchemaSet:
    """Every schema file of a folder, by name (file name without `.json`). Each is checked against
    the draft 2020-12 meta-schema by the tests (test_schemas.py), not here: that check took 1.3 s
    of a sidecar's first request, and the files are shipped with this code."""

    def __init__(self, folder: Path = SCHEMA_DIR) -> None:
        self.folder = folder
        self.schemas: dict[str, dict[str, Any]] = {}
        for path in sorted(folder.glob("*.json")):
            schema = json.loads(path.read_text(encoding="utf-8"))
            expected = BASE_URI + path.name
            if schema.get("$id") != expected:
                raise ValueError(f"{path}: $id must be {expected!r}")
            self.schemas[path.stem] = schema
        resources = [(s["$id"], Resource.from_contents(s, default_specification=DRAFT202012))
                     for s in self.schemas.values()]
        self.registry = Registry().with_resources(resources)
        self._validators: dict[str, Draft202012Validator] = {}

    def validator(self, name: str) -> Draft202012Validator:
        if name not in self._validators:
            if name not in self.schemas:
                raise KeyError(f"no schema named {name!r} in {self.folder}")
            schema = self.schemas[name]
            inlined = _inline(schema, self.registry.resolver(schema["$id"]), schema["$id"], frozenset())
            self._validators[name] = Draft202012Validator(inlined, registry=self.registry)
        return self._validators[name]

    def errors(self, name: str, instance: Any) -> list[dict[str, str]]:
        """Every violation as {path, message}, most specific first, at most MAX_DETAILS."""
        found = sorted(self.validator(name).iter_errors(instance),
                       key=lambda e: (list(map(str, e.absolute_path)), e.message))
        return [{"path": "/" + "/".join(map(str, e.absolute_path)), "message": _short(e.message)}
                for e in found[:MAX_DETAILS]]

    def validate(self, name: str, instance: Any, what: str = "request body") -> None:
        """Raise BadRequest('invalid_request') listing what is wrong, if anything."""
        problems = self.errors(name, instance)
        if problems:
            first = problems[0]
            raise BadRequest("invalid_request",
                             f"The {what} does not match {name}: {first['path']}: {first['message']}",
                             problems)


def _inline(node: Any, resolver: Any, base: str, seen: frozenset[str]) -> Any:
    """The schema with every `$ref` replaced by what it names, once, at load time.

    jsonschema resolves a `$ref` (URL joins, registry lookups) each time it meets one: for a batch
    of 200 messages that was most of the request's time (bench/branch.py's upload of a branch's
    copies). Inlined, the same rules are checked with the same messages and paths. A `$ref` met
    again inside what it names (a recursive schema) is left, made absolute, for the registry."""
    if isinstance(node, list):
        return [_inline(v, resolver, base, seen) for v in node]
    if not isinstance(node, dict):
        return node
    ref = node.get("$ref")
    rest = {k: _inline(v, resolver, base, seen) for k, v in node.items() if k != "$ref"}
    if not isinstance(ref, str):
        return rest
    target = urljoin(base, ref)
    if target in seen:
        return {**rest, "$ref": target}
    found = resolver.lookup(ref)
    body = _inline(found.contents, found.resolver, target.split("#")[0], seen | {target})
    if isinstance(body, dict):
        body = {k: v for k, v in body.items() if k not in ("$id", "$schema")}
    if not rest:
        return body
    return {**rest, "allOf": [*rest.get("allOf", []), body]}


def _short(message: str, limit: int = 300) -> str:
    """jsonschema quotes the whole offending value; a 1 MB string must not come back in the error."""
    return message if len(message) <= limit else message[:limit] + "…"


@lru_cache(maxsize=1)
def default_schemas() -> SchemaSet:
    return SchemaSet()
