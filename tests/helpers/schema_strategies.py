"""Hypothesis strategies generated from the JSON Schemas of shared_schema/.

Covers the part of draft 2020-12 our schemas use: $ref (into common.json or the same file), enum,
const, anyOf/oneOf, type (one or several), properties/required/additionalProperties/
patternProperties, items/minItems/maxItems/uniqueItems, minLength/maxLength/pattern,
minimum/maximum. The values are "valid-ish": valid in shape and type, though a cross-field rule
(dependentRequired, minProperties) may be missed, so the server's own validation is exercised
on both sides of the line. (hypothesis-jsonschema would do this, but its last release does not
work with current Hypothesis.)
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import strategies as st

from server_plugin.api.schemas import SchemaSet, default_schemas

MAX_ITEMS = 4          # keep generated arrays small: the interesting part is what is in them
MAX_TEXT = 40

JSON_SCALARS = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False, allow_infinity=False),
                         st.text(max_size=MAX_TEXT))
ANY_JSON = st.recursive(JSON_SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=10), inner, max_size=3)), max_leaves=8)


class Generator:
    """Strategies for the schemas of one SchemaSet, resolving refs between its files."""

    def __init__(self, schemas: SchemaSet | None = None) -> None:
        self.schemas = (schemas or default_schemas()).schemas

    def for_name(self, name: str) -> st.SearchStrategy[Any]:
        return self.build(self.schemas[name], self.schemas[name])

    def _resolve(self, ref: str, base: dict) -> tuple[dict, dict]:
        file, _, fragment = ref.partition("#")
        doc = self.schemas[file.removesuffix(".json")] if file else base
        node: Any = doc
        for part in fragment.strip("/").split("/"):
            if part:
                node = node[part]
        return node, doc

    def build(self, node: Any, base: dict) -> st.SearchStrategy[Any]:
        if node is True or node == {}:
            return ANY_JSON
        if "$ref" in node:
            target, doc = self._resolve(node["$ref"], base)
            return self.build(target, doc)
        if "const" in node:
            return st.just(node["const"])
        if "enum" in node:
            return st.sampled_from(node["enum"])
        for combinator in ("anyOf", "oneOf"):
            if combinator in node:
                return st.one_of([self.build(sub, base) for sub in node[combinator]])
        kinds = node.get("type")
        if kinds is None:
            return ANY_JSON
        if isinstance(kinds, list):
            return st.one_of([self.build({**node, "type": k}, base) for k in kinds])
        return getattr(self, "_" + kinds)(node, base)

    def _object(self, node: dict, base: dict) -> st.SearchStrategy[Any]:
        properties = node.get("properties", {})
        required = set(node.get("required", []))
        fixed = {k: self.build(v, base) for k, v in properties.items() if k in required}
        optional = {k: self.build(v, base) for k, v in properties.items() if k not in required}
        patterned = [st.tuples(st.from_regex(p, fullmatch=True), self.build(v, base))
                     for p, v in node.get("patternProperties", {}).items()]
        extra = st.lists(st.one_of(patterned), max_size=2) if patterned else st.just([])
        extra_map = extra.map(lambda pairs: {k: v for k, v in pairs if k not in properties})
        return st.fixed_dictionaries(fixed, optional=optional).flatmap(
            lambda d: extra_map.map(lambda e: {**e, **d}))

    def _array(self, node: dict, base: dict) -> st.SearchStrategy[Any]:
        items = self.build(node.get("items", {}), base)
        low = node.get("minItems", 0)
        high = min(node.get("maxItems", MAX_ITEMS), max(low, MAX_ITEMS))
        unique = (lambda v: json.dumps(v, sort_keys=True)) if node.get("uniqueItems") else None
        return st.lists(items, min_size=low, max_size=high, unique_by=unique)

    def _string(self, node: dict, base: dict) -> st.SearchStrategy[Any]:
        low = node.get("minLength", 0)
        high = node.get("maxLength", MAX_TEXT)
        if "pattern" in node:
            return st.from_regex(node["pattern"], fullmatch=True).filter(lambda s: low <= len(s) <= high)
        sized = st.text(min_size=low, max_size=min(high, max(low, MAX_TEXT)))
        return st.one_of(sized, st.text(min_size=high, max_size=high)) if high <= 4096 else sized

    def _integer(self, node: dict, base: dict) -> st.SearchStrategy[Any]:
        return st.integers(node.get("minimum"), node.get("maximum"))

    def _number(self, node: dict, base: dict) -> st.SearchStrategy[Any]:
        return st.floats(node.get("minimum"), node.get("maximum"), allow_nan=False, allow_infinity=False)

    def _boolean(self, node: dict, base: dict) -> st.SearchStrategy[Any]:
        return st.booleans()

    def _null(self, node: dict, base: dict) -> st.SearchStrategy[Any]:
        return st.none()
