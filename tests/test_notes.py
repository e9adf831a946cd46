"""Campaign notes (rule SW3): a person's notes, open/resolved with a priority, most pressing first
for the context; the session-end job proposes new threads and resolves listed ones."""

from __future__ import annotations

import json

import pytest

from server_plugin.story import notes
from tests.helpers.api import expect_error, expect_ok
from tests.helpers.conversation import setup_chat, turns


def create(api, text, chat_id="c1", **extra):
    return expect_ok(api.post(f"/v1/chats/{chat_id}/notes", json={"text": text, **extra}), 201,
                     "note.response")["note"]


def test_sw3_notes_crud(api):
    """rule SW3: a person writes, edits, resolves and deletes notes."""
    setup_chat(api)
    note = create(api, "The harbour master wants his debt by the full moon.", priority=5)
    assert (note["status"], note["priority"], note["source"], note["resolved_at"]) == ("open", 5, "user", None)
    fetched = expect_ok(api.get(f"/v1/notes/{note['id']}"), 200, "note.response")["note"]
    assert fetched == note
    resolved = expect_ok(api.patch(f"/v1/notes/{note['id']}", json={"status": "resolved", "version": 1}),
                         200, "note.response")["note"]
    assert resolved["status"] == "resolved" and resolved["resolved_at"] and resolved["version"] == 2
    expect_error(api.patch(f"/v1/notes/{note['id']}", json={"text": "x", "version": 1}), 409, "version_conflict")
    reopened = expect_ok(api.patch(f"/v1/notes/{note['id']}", json={"status": "open", "priority": 2}), 200)["note"]
    assert (reopened["status"], reopened["resolved_at"], reopened["priority"]) == ("open", None, 2)
    expect_ok(api.delete(f"/v1/notes/{note['id']}"), 200, "deleted.response")
    expect_error(api.get(f"/v1/notes/{note['id']}"), 404, "note_not_found")


def test_sw3_notes_are_validated(api, services):
    setup_chat(api)
    expect_error(api.post("/v1/chats/c1/notes", json={"text": "x", "priority": 6}), 400, "invalid_request")
    expect_error(api.post("/v1/chats/c1/notes", json={"text": "   "}), 422, "text_empty")
    too_long = "x" * (services.settings.note_max_chars + 1)
    expect_error(api.post("/v1/chats/c1/notes", json={"text": too_long}), 422, "text_too_long")
    expect_error(api.post("/v1/chats/nope/notes", json={"text": "x"}), 404, "chat_not_found")
    expect_error(api.patch("/v1/notes/n_missing", json={"priority": 1}), 404, "note_not_found")


def test_sw3_open_notes_most_pressing_first(api, services):
    """rule SW3: the context reads the open notes, most pressing first; resolved ones are left out."""
    setup_chat(api)
    low = create(api, "Buy rope.", priority=1)
    high = create(api, "The cult attacks at dawn.", priority=5)
    mid = create(api, "Find the lighthouse keeper.")
    done = create(api, "Escape the prison.", priority=5, status="resolved")
    assert [n["id"] for n in notes.open_notes(services, "c1")] == [high["id"], mid["id"], low["id"]]
    listed = expect_ok(api.get("/v1/chats/c1/notes"), 200, "notes.response")["notes"]
    assert [n["id"] for n in listed] == [high["id"], mid["id"], low["id"], done["id"]]
    only = expect_ok(api.get("/v1/chats/c1/notes?status=resolved"), 200)["notes"]
    assert [n["id"] for n in only] == [done["id"]]


@pytest.fixture
def overrides():
    # One job per call: the session summary's prompt and answer alone (shared calls: test_part_calls.py).
    return {"llm_mode": "client", "live_window_max_messages": 50, "part_call_max_jobs": 1, "part_tokens": 0}


def test_sw3_session_end_proposes_and_resolves_notes(api, services):
    """rule SW3: the session-end job adds the open threads it proposes (source job, once per
    thread) and marks resolved the open notes it lists."""
    setup_chat(api)
    debt = create(api, "Pay the harbour master.", priority=4)
    create(api, "Who lit the lanterns?", priority=3)
    turns(api, 0, 3)
    api.post("/v1/chats/c1/sessions/end", json={})
    job = api.post("/v1/jobs/claim", json={}).get_json()["job"]
    assert job["kind"] == "session_summary"
    assert "[n1] (priority 4) Pay the harbour master." in job["request"]["prompt"]
    answer = {"full": "Kai paid the harbour master and met Ayla's brother.", "short": "Debt paid.",
              "quotes": [], "resolved": ["n1"],
              "open_threads": [{"text": "Meet Ayla's brother at the mill.", "priority": 5},
                               {"text": "who lit the  lanterns?", "priority": 2}]}
    expect_ok(api.post(f"/v1/jobs/{job['id']}/complete", json={"text": json.dumps(answer)}), 200)
    assert notes.get(services, debt["id"])["status"] == "resolved"
    open_now = notes.open_notes(services, "c1")
    assert [(n["text"], n["source"], n["session_n"]) for n in open_now] == [
        ("Meet Ayla's brother at the mill.", "job", 1), ("Who lit the lanterns?", "user", None)]
