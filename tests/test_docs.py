"""docs/rules.md and docs/api.md stay true, and the repository says things instead of numbering them.

- Every rule id cited anywhere (code, tests, benchmarks, extension, docs, schemas, README) is
  defined in docs/rules.md; so is the id in every test named `test_<id>_...`.
- docs/api.md lists exactly the routes the app serves (method + Flask rule), each with the request
  schemas its view validates, a response schema its answer matches, and the auth the app asks for.
- No text refers to a work item by its number ("issue" and a number): say what it is about.

Nothing here depends on where modules live inside server_plugin/: files are found by walking
folders, routes and views come from the app the conftest fixtures build.
"""

from __future__ import annotations

import inspect
import json
import re
from pathlib import Path
from typing import Any, Iterator
from urllib.parse import quote

import pytest

from tests.helpers.api import TOKEN, assert_schema

ROOT = Path(__file__).resolve().parent.parent
RULES_MD = ROOT / "docs" / "rules.md"
API_MD = ROOT / "docs" / "api.md"
SCHEMA_DIR = ROOT / "shared_schema"

# What is scanned: these folders and files of the repository, text files only.
SCANNED = ("server_plugin", "tests", "extension", "bench", "docs", "shared_schema", "README.md")
SKIPPED_DIRS = {"node_modules", ".venv", "venv", "__pycache__", ".pytest_cache", ".hypothesis",
                "test-artifacts", ".git", ".cache"}

# A rule id: two capitals, a number, maybe one lower-case letter (RV8, SW9b).
RULE_ID = re.compile(r"\b[A-Z]{2}[0-9]+[a-z]?\b")
# Words of the same shape that are not rules (docs/rules.md says so at its top). Keep it short.
NOT_RULES = {
    "BM25": "the ranking function",
    "RM3": "a query-expansion technique (relevance model 3)",
}
# A rule defined in docs/rules.md: a list item that starts with the id in bold.
DEFINITION = re.compile(r"^- \*\*([A-Z]{2}[0-9]+[a-z]?)\*\* \S")
FAMILY = re.compile(r"^## ([A-Z]{2}) — \S")
# A test named after a rule: test_rv9d_... (or test_rv9d() alone).
TEST_NAME = re.compile(r"\bdef (test_([a-z]{2}[0-9]+[a-z]?)(?:_\w*)?)\s*\(")
# A work item named by its number: the word, maybe plural, maybe a "#", then digits (any case).
ISSUE_MENTION = re.compile(r"\bissues?\s*#?\s*[0-9]+", re.IGNORECASE)

METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")
# A route row of docs/api.md: | `METHOD /v1/path` | request | response | auth | what it does |
ROUTE_ROW = re.compile(r"^\|\s*`(" + "|".join(METHODS) + r") (/\S*)`\s*\|(.*)\|\s*$")
PARAM = re.compile(r"<(?:[^:>]+:)?([^>]+)>")
SCHEMA_NAME = re.compile(r"`([a-z_]+\.[a-z]+|[a-z_]+)`")


# --- reading the repository ---------------------------------------------------------------------
def text_files() -> Iterator[tuple[Path, str]]:
    """(path, text) of every scanned text file; binary files (NUL bytes, not UTF-8) are skipped."""
    for name in SCANNED:
        top = ROOT / name
        paths = [top] if top.is_file() else sorted(top.rglob("*")) if top.is_dir() else []
        for path in paths:
            if not path.is_file():
                continue
            parts = path.relative_to(ROOT).parts
            if any(p in SKIPPED_DIRS or (p.startswith(".") and p not in (".", "..")) for p in parts[:-1]):
                continue
            data = path.read_bytes()
            if b"\0" in data:
                continue
            try:
                yield path, data.decode("utf-8")
            except UnicodeDecodeError:
                continue


def where(path: Path, text: str, pos: int) -> str:
    line = text.count("\n", 0, pos) + 1
    return f"{path.relative_to(ROOT)}:{line}"


def defined_rules() -> dict[str, str]:
    """id -> its line, from docs/rules.md."""
    rules: dict[str, str] = {}
    for line in RULES_MD.read_text(encoding="utf-8").splitlines():
        m = DEFINITION.match(line)
        if m:
            assert m.group(1) not in rules, f"docs/rules.md defines {m.group(1)} twice"
            rules[m.group(1)] = line
    return rules


def cited_ids() -> dict[str, list[str]]:
    """Every word shaped like a rule id in the scanned files -> where it occurs."""
    found: dict[str, list[str]] = {}
    for path, text in text_files():
        for m in RULE_ID.finditer(text):
            found.setdefault(m.group(0), []).append(where(path, text, m.start()))
    return found


def rule_of_test_name(short: str) -> str:
    """rv9d -> RV9d: the family in capitals, the number and its letter as they are."""
    return short[:2].upper() + short[2:]


# --- docs/rules.md ------------------------------------------------------------------------------
def test_rules_md_defines_ids_in_families_once():
    """Each definition sits under its family's heading; a lettered id has its numbered rule."""
    family = None
    seen: set[str] = set()
    families: set[str] = set()
    for line in RULES_MD.read_text(encoding="utf-8").splitlines():
        heading = FAMILY.match(line)
        if heading:
            family = heading.group(1)
            assert family not in families, f"family {family} has two headings"
            families.add(family)
            continue
        m = DEFINITION.match(line)
        if m:
            rule = m.group(1)
            assert rule[:2] == family, f"{rule} is defined under the heading of family {family}"
            assert rule not in seen, f"{rule} is defined twice"
            seen.add(rule)
    assert {"DC", "SW", "QS", "RV"} <= families
    for rule in seen:
        if rule[-1].islower():
            assert rule[:-1] in seen, f"{rule} is defined but its rule {rule[:-1]} is not"
    assert not set(NOT_RULES) & seen, "a word listed as not a rule is also defined as one"


def test_every_cited_rule_id_is_defined():
    """A citation of a rule docs/rules.md does not define (a typo, a rule never written down) fails;
    so does a new word of the same shape until it is added to NOT_RULES."""
    rules = defined_rules()
    unknown = {word: places for word, places in cited_ids().items()
               if word not in rules and word not in NOT_RULES}
    assert not unknown, "cited but not defined in docs/rules.md (define it, or if it is not a rule " \
        "add it to NOT_RULES): " + "; ".join(f"{w} at {', '.join(p[:5])}" for w, p in sorted(unknown.items()))


def test_every_test_named_after_a_rule_names_a_defined_one():
    rules = defined_rules()
    wrong = []
    for path, text in text_files():
        if path.suffix != ".py" or ROOT / "tests" not in path.parents:
            continue
        for m in TEST_NAME.finditer(text):
            rule = rule_of_test_name(m.group(2))
            if rule not in rules and rule not in NOT_RULES:
                wrong.append(f"{m.group(1)} ({rule}) at {where(path, text, m.start())}")
    assert not wrong, "tests named after rules docs/rules.md does not define: " + "; ".join(wrong)


# --- no work-item numbers -----------------------------------------------------------------------
def test_no_text_names_a_work_item_by_its_number():
    """Say the thing itself ("the context latency target"), not which work item asked for it."""
    hits = []
    for path, text in text_files():
        for m in ISSUE_MENTION.finditer(text):
            hits.append(f"{where(path, text, m.start())}: {m.group(0)!r}")
    assert not hits, f"{len(hits)} mentions of a work item by number:\n" + "\n".join(hits)


# --- docs/api.md --------------------------------------------------------------------------------
def documented_routes() -> dict[tuple[str, str], dict[str, Any]]:
    """(method, rule) -> {request: [names], response: [names], auth, line} from the route tables."""
    routes: dict[tuple[str, str], dict[str, Any]] = {}
    for n, line in enumerate(API_MD.read_text(encoding="utf-8").splitlines(), 1):
        if not line.startswith("| `"):
            continue
        m = ROUTE_ROW.match(line)
        assert m, f"docs/api.md:{n}: a table row starting with a code span must be a route row " \
            f"(| `METHOD /v1/path` | request | response | auth | what it does |): {line[:120]}"
        cells = [c.strip() for c in m.group(3).split("|")]
        assert len(cells) == 4, f"docs/api.md:{n}: a route row has 5 columns: {line[:120]}"
        key = (m.group(1), m.group(2))
        assert key not in routes, f"docs/api.md:{n}: {key[0]} {key[1]} is listed twice"
        routes[key] = {"request": SCHEMA_NAME.findall(cells[0]), "response": SCHEMA_NAME.findall(cells[1]),
                       "auth": cells[2], "what": cells[3], "line": n}
    return routes


def served_routes(app) -> dict[tuple[str, str], str]:
    """(method, rule) -> endpoint, for every route of the app (not Flask's static, HEAD, OPTIONS)."""
    served = {}
    for rule in app.url_map.iter_rules():
        if rule.endpoint == "static":
            continue
        for method in rule.methods - {"HEAD", "OPTIONS"}:
            served[(method, rule.rule)] = rule.endpoint
    return served


def validated_schemas(app, endpoint: str) -> list[str]:
    """The schemas a view validates its body and query string against, from its source."""
    source = inspect.getsource(app.view_functions[endpoint])
    return re.findall(r'\b(?:body|query)\("([^"]+)"\)', source)


def test_api_md_lists_every_route_the_app_serves(app):
    served, documented = served_routes(app), documented_routes()
    missing = sorted(set(served) - set(documented))
    assert not missing, "served but not in docs/api.md: " + ", ".join(f"{m} {p}" for m, p in missing)


def test_api_md_lists_no_route_the_app_does_not_serve(app):
    served, documented = served_routes(app), documented_routes()
    extra = sorted(set(documented) - set(served))
    assert not extra, "in docs/api.md but not served: " + ", ".join(
        f"{m} {p} (line {documented[(m, p)]['line']})" for m, p in extra)
    assert len(documented) >= 10  # the parse found the tables at all


def test_api_md_request_schemas_are_what_the_views_validate(app):
    served, wrong = served_routes(app), []
    for key, row in documented_routes().items():
        if key not in served:
            continue  # reported by the test above
        actual = sorted(validated_schemas(app, served[key]))
        if sorted(row["request"]) != actual:
            wrong.append(f"{key[0]} {key[1]}: docs say {row['request'] or '—'}, "
                         f"the view validates {actual or '—'}")
    assert not wrong, "request schemas in docs/api.md differ from the views':\n" + "\n".join(wrong)


def test_api_md_names_real_schemas_and_every_schema():
    schemas = {p.stem for p in SCHEMA_DIR.glob("*.json")}
    text = API_MD.read_text(encoding="utf-8")
    problems = []
    for (method, path), row in documented_routes().items():
        for name in row["request"]:
            if name not in schemas or not name.endswith((".request", ".query")):
                problems.append(f"{method} {path}: request schema {name!r} is not a request or query "
                                "schema of shared_schema/")
        if len(row["response"]) != 1 or row["response"][0] not in schemas:
            problems.append(f"{method} {path}: response {row['response']} is not one shared_schema/ file")
        if row["auth"] not in ("bearer", "none"):
            problems.append(f"{method} {path}: auth must be 'bearer' or 'none', not {row['auth']!r}")
        if not row["what"]:
            problems.append(f"{method} {path}: says nothing about what it does")
    named = set(re.findall(r"`([a-z_]+(?:\.[a-z]+)?)`", text))
    problems += [f"shared_schema/{s}.json is not named in docs/api.md" for s in sorted(schemas - named)]
    assert not problems, "\n".join(problems)


def _concrete(path: str) -> str:
    """A request path for a Flask rule: every parameter filled in (a session number is a number)."""
    return PARAM.sub(lambda m: "1" if m.group(1) == "n" else "x", path)


def test_api_md_auth_column_is_what_the_app_asks(app):
    """A request without a token: 401 on every route marked bearer, answered on those marked none.
    Refused before its view runs, it changes nothing (RV17)."""
    client = app.test_client()
    wrong = []
    for (method, path), row in documented_routes().items():
        status = client.open(_concrete(path), method=method).status_code
        if (status == 401) != (row["auth"] == "bearer"):
            wrong.append(f"{method} {path}: docs say {row['auth']}, without a token the app answers {status}")
    assert not wrong, "\n".join(wrong)


# --- the response column, checked on real answers ------------------------------------------------
# Routes this walk does not reach with a 2xx answer: they need what only a model writes.
NOT_REACHED = {
    ("PATCH", "/v1/lore/proposals/<proposal_id>"): "a lore proposal is written by a model job (test_lore_growth)",
    ("POST", "/v1/lore/proposals/<proposal_id>/accept"): "a lore proposal is written by a model job (test_lore_growth)",
    ("POST", "/v1/lore/proposals/<proposal_id>/reject"): "a lore proposal is written by a model job (test_lore_growth)",
    ("GET", "/v1/summaries/<summary_id>"): "a rolling summary is written by a model job",
    ("PATCH", "/v1/summaries/<summary_id>"): "a rolling summary is written by a model job",
    ("GET", "/v1/episodes/<episode_id>"): "character memories and scenes are written by model jobs",
    ("DELETE", "/v1/episodes/<episode_id>"): "character memories and scenes are written by model jobs",
    ("POST", "/v1/jobs/<job_id>/complete"): "needs a valid model answer for the job's prompt",
}


@pytest.fixture
def overrides() -> dict[str, Any]:
    """Client mode: the jobs this walk causes wait to be claimed (no worker runs in tests)."""
    return {"llm_mode": "client"}


class Walk:
    """Calls routes with the token and checks every 2xx answer against docs/api.md's response
    schema for the route it reached (found through the app's own URL map)."""

    def __init__(self, app) -> None:
        self.client = app.test_client()
        self.adapter = app.url_map.bind("localhost")
        self.documented = documented_routes()
        self.reached: set[tuple[str, str]] = set()

    def __call__(self, method: str, path: str, json_body: Any = None, status: int = 200) -> Any:
        url = quote(path, safe="/?=&")
        response = self.client.open(url, method=method, json=json_body,
                                    headers={"Authorization": f"Bearer {TOKEN}"})
        assert response.status_code == status, (method, path, response.status_code,
                                                response.get_data(as_text=True)[:300])
        rule, _ = self.adapter.match(url.split("?")[0], method, return_rule=True)
        key = (method, rule.rule)
        body = json.loads(response.get_data(as_text=True))
        row = self.documented.get(key)
        assert row, f"{method} {rule.rule} is served but not in docs/api.md"
        try:
            assert_schema(row["response"][0], body)
        except AssertionError as problem:
            raise AssertionError(f"{method} {path}: not docs/api.md's response: {problem}") from None
        self.reached.add(key)
        return body


def test_api_md_response_schemas_match_real_answers(app):
    """A walk through the API: each answer matches the response schema docs/api.md gives its route."""
    call = Walk(app)
    examples = SCHEMA_DIR / "examples" / "valid"
    call("GET", "/v1/health")
    call("GET", "/v1/settings")
    call("PATCH", "/v1/settings", {"live_window_max_messages": 40})
    call("PUT", "/v1/characters/ayla.png", {"name": "Ayla", "sheet": {"personality": "brave"}}, 201)
    call("PUT", "/v1/characters/player", {"name": "Player", "is_player": True}, 201)
    call("PUT", "/v1/characters/bren.png", {"name": "Bren"}, 201)
    call("GET", "/v1/characters")
    call("GET", "/v1/characters/ayla.png")
    card = json.loads((examples / "character_import.request" / "v2_card.json").read_text())
    call("POST", "/v1/characters/import", card, 201)
    call("PUT", "/v1/chats/c1", {"member_ids": ["ayla.png", "player", "bren.png"]}, 201)
    call("GET", "/v1/chats")
    call("GET", "/v1/chats/c1")
    call("GET", "/v1/campaigns")
    lines = [("u1", "user", "Player", "player", "I promise I will come back for you, Ayla.", None),
             ("a1", "assistant", "Ayla", "ayla.png", '"Then I will wait by the old oak."', "t1"),
             ("u2", "user", "Player", "player", "Bren, keep the lantern lit.", None),
             ("a2", "assistant", "Bren", "bren.png", "*nods* \"Every night.\"", "t2")]
    call("POST", "/v1/chats/c1/messages", {"messages": [
        {"id": i, "role": role, "name": name, "speaker_id": who, "text": text,
         "sent_at": f"2026-03-01T12:00:0{n}Z", **({"turn_id": turn} if turn else {})}
        for n, (i, role, name, who, text, turn) in enumerate(lines)]})
    call("GET", "/v1/chats/c1/messages")
    # Saved memories.
    memory = call("POST", "/v1/memories", {"text": "The player promised to come back.", "scope": "character",
                                           "character_id": "ayla.png", "actor": "user"}, 201)["memory"]
    call("GET", f"/v1/memories/{memory['id']}")
    call("PATCH", f"/v1/memories/{memory['id']}", {"text": "The player promised to return.", "actor": "user"})
    call("GET", "/v1/memories?scope=character&character_id=ayla.png")
    call("GET", "/v1/memories/for-turn?chat_id=c1&speaker_id=ayla.png")
    call("POST", "/v1/memories/drafts",
         json.loads((examples / "memory_drafts.request" / "description.json").read_text()))
    call("DELETE", f"/v1/memories/{memory['id']}?actor=user")
    call("POST", "/v1/memories", {"text": "Bren keeps the lantern lit.", "scope": "global", "actor": "model",
                                  "chat_id": "c1", "turn_id": "t2"}, 201)
    call("POST", "/v1/memories/delete-all", {"scope": "global"})
    # Notes, lore, context, search, episodes, told events.
    note = call("POST", "/v1/chats/c1/notes", {"text": "Who stole the lantern?", "priority": 2}, 201)["note"]
    call("GET", "/v1/chats/c1/notes")
    call("GET", f"/v1/notes/{note['id']}")
    call("PATCH", f"/v1/notes/{note['id']}", {"status": "resolved"})
    call("DELETE", f"/v1/notes/{note['id']}")
    entry = call("POST", "/v1/lore", {"title": "The old oak", "text": "A tree older than the town.",
                                      "triggers": ["oak"]}, 201)["entry"]
    call("GET", "/v1/lore")
    call("GET", f"/v1/lore/{entry['id']}")
    call("PATCH", f"/v1/lore/{entry['id']}", {"text": "The oldest tree of the valley."})
    call("POST", "/v1/lore/import",
         json.loads((examples / "lore_import.request" / "book_array_dry_run.json").read_text()))
    call("POST", "/v1/context", {"chat_id": "c1", "speaker_id": "ayla.png", "context_tokens": 8192,
                                 "last_action": {"text": "Where is the old oak?", "kind": "action"}})
    call("GET", "/v1/lore/stats?chat_id=c1")
    call("GET", "/v1/lore/proposals?chat_id=c1&state=all")
    call("DELETE", f"/v1/lore/{entry['id']}")
    call("POST", "/v1/context/prefetch", {"chat_id": "c1", "text": "I ask Ayla about the promise."}, status=202)
    call("POST", "/v1/search", {"query": "a promise to come back", "viewer_id": "ayla.png"})
    call("GET", "/v1/episodes?chat_id=c1")
    call("GET", "/v1/told?chat_id=c1")
    # Summaries, sessions, jobs (client mode: the session end queues jobs for the extension).
    call("GET", "/v1/chats/c1/summaries")
    call("POST", "/v1/chats/c1/summaries/rebuild", {})
    call("POST", "/v1/chats/c1/sessions/end", {})
    call("GET", "/v1/chats/c1/sessions")
    call("GET", "/v1/campaigns/c1/sessions")
    call("GET", "/v1/campaigns/c1/recap")
    call("GET", "/v1/chats/c1/sessions/1")
    call("POST", "/v1/chats/c1/sessions/1/rebuild", {})
    listed = call("GET", "/v1/jobs?chat_id=c1")
    assert listed["jobs"], "the session end queued no job"
    call("GET", f"/v1/jobs/{listed['jobs'][0]['id']}")
    call("GET", "/v1/jobs/stats?chat_id=c1")
    claimed = call("POST", "/v1/jobs/claim", {})
    assert claimed["job"], "no job to claim in client mode"
    call("POST", f"/v1/jobs/{claimed['job']['id']}/fail",
         {"error": "the model is not available", "retryable": False})
    call("POST", f"/v1/jobs/{claimed['job']['id']}/retry", {})
    # The transcript's edges, the chat's rename and deletion, the store's export and import.
    call("POST", "/v1/chats/c1/turns/t2/rollback", {})
    call("DELETE", "/v1/chats/c1/messages/u2")
    call("POST", "/v1/chats/c1/rename", {"new_id": "c2"})
    call("DELETE", "/v1/chats/c2")
    call("DELETE", "/v1/characters/bren.png")
    document = call("GET", "/v1/export")
    call("POST", "/v1/import", {"document": document, "mode": "replace", "confirm_replace": True})

    unreached = set(served_routes(app)) - call.reached - set(NOT_REACHED)
    assert not unreached, "routes this walk does not reach (walk them here, or say in NOT_REACHED " \
        "why it cannot): " + ", ".join(f"{m} {p}" for m, p in sorted(unreached))
    assert not call.reached & set(NOT_REACHED), "reached now; drop from NOT_REACHED: " + ", ".join(
        f"{m} {p}" for m, p in sorted(call.reached & set(NOT_REACHED)))
