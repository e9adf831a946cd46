"""shared_schema/: every file is a valid draft 2020-12 schema, and the example fixtures (shared with
the extension's test suite) are classified as their folder says."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from jsonschema import Draft202012Validator

from server_plugin.api.schemas import BASE_URI, SCHEMA_DIR, default_schemas

EXAMPLES = SCHEMA_DIR / "examples"


def _cases(kind: str) -> list[tuple[str, Path]]:
    return [(p.parent.name, p) for p in sorted((EXAMPLES / kind).glob("*/*.json"))]


def test_every_schema_loads_and_has_its_id():
    schemas = default_schemas().schemas
    assert len(schemas) == len(list(SCHEMA_DIR.glob("*.json")))
    for name, schema in schemas.items():
        Draft202012Validator.check_schema(schema)  # raises SchemaError naming what is wrong
        assert schema["$id"] == f"{BASE_URI}{name}.json"
        assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"


def test_request_schemas_forbid_unknown_fields():
    """API.md: every payload schema has additionalProperties false."""
    for name, schema in default_schemas().schemas.items():
        if name.endswith((".request", ".query")):
            assert schema.get("additionalProperties") is False, name


def test_every_request_schema_has_valid_and_invalid_examples():
    names = [n for n in default_schemas().schemas if n.endswith(".request")]
    valid = {s for s, _ in _cases("valid")}
    invalid = {s for s, _ in _cases("invalid")}
    missing = [n for n in names if n not in valid or n not in invalid]
    assert not missing, f"request schemas without examples: {missing}"


@pytest.mark.parametrize("schema,path", _cases("valid"), ids=lambda v: getattr(v, "stem", v))
def test_valid_examples_pass(schema, path):
    assert default_schemas().errors(schema, json.loads(path.read_text())) == []


@pytest.mark.parametrize("schema,path", _cases("invalid"), ids=lambda v: getattr(v, "stem", v))
def test_invalid_examples_fail(schema, path):
    assert default_schemas().errors(schema, json.loads(path.read_text())) != []
