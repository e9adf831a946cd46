"""The registry of model tasks (jobs/tasks/registry.py): one Task per task a story module renders,
and the Task's parser and fallback are what a job runs — through `llm.run_prompt` (a model, or
no model) and through the extension's answers in client mode. The limits a prompt carries are
the settings' values."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

from server_plugin.jobs import llm, worker
from server_plugin.jobs.tasks import registry
from server_plugin.jobs.tasks.base import CharacterRef, ChatMessage, Prompt
from server_plugin.jobs.tasks.episodes import character_memories, scene_summaries
from server_plugin.jobs.tasks.memories import (
    durable_memories,
    memories_from_description,
    save_from_conversation,
)
from server_plugin.jobs.tasks.lore import LoreInput, lore_growth
from server_plugin.jobs.tasks.registry import TASKS
from server_plugin.jobs.tasks.sheets import Newcomer, SheetInput, sheet_updates
from server_plugin.jobs.tasks.parts import part_notes
from server_plugin.jobs.tasks.summaries import SummaryInput, chunk_summary, merge_summaries, session_summary
from server_plugin.jobs.tasks.told import SecretInput, told_events
from tests.helpers.api import expect_ok
from tests.helpers.conversation import drain, job_rows
from tests.helpers.episodes import EMPTY, chat, end_session, line, post_lines, register_cast
from tests.helpers.tasks import limits

SAM = CharacterRef("persona-sam", "Sam", is_player=True)
AYLA = CharacterRef("ayla.png", "Ayla")
CHAT = [ChatMessage("u1", "Sam", "Call me Red. I promise to come back.", "user", "persona-sam"),
        ChatMessage("a1", "Ayla", "\u201cThe key is under the third stone,\u201d Ayla says.", "assistant", "ayla.png")]

SAMPLES = {
    "chunk_summary": lambda: chunk_summary(CHAT, **limits("chunk_summary")),
    "merge_summaries": lambda: merge_summaries([SummaryInput("s-1", "A."), SummaryInput("s-2", "B.")],
                                               **limits("merge_summaries")),
    "session_summary": lambda: session_summary(CHAT, **limits("session_summary")),
    "durable_memories": lambda: durable_memories(CHAT, [SAM, AYLA], **limits("durable_memories")),
    "memories_from_description": lambda: memories_from_description("Sam likes tea.", AYLA,
                                                                   **limits("memories_from_description")),
    "save_from_conversation": lambda: save_from_conversation(CHAT, AYLA, **limits("save_from_conversation")),
    "character_memories": lambda: character_memories(CHAT, [SAM, AYLA], **limits("character_memories")),
    "scene_summaries": lambda: scene_summaries(CHAT, [SAM, AYLA], **limits("scene_summaries")),
    "told_events": lambda: told_events(CHAT, [SAM, AYLA], [SecretInput("k", "The key is under the third stone.",
                                                                       ("ayla.png",))], **limits("told_events")),
    "sheet_updates": lambda: sheet_updates(CHAT, [SAM, AYLA], [SheetInput("ayla.png", {"role": "Guide."})],
                                           [Newcomer("Old Tom", 6, 2)], **limits("sheet_updates")),
    "part_notes": lambda: part_notes(CHAT, [SAM, AYLA], {"summary": limits("chunk_summary"),
                                                         "memories": limits("character_memories")}),
    "lore_growth": lambda: lore_growth(CHAT, [LoreInput("l_1", "Third stone", "A stone.", ("stone",))],
                                       **limits("lore_growth")),
}


def test_tasks_has_one_task_per_name_each_rendering_its_own_prompt():
    """Each Task is registered under its own name, and its render builds a Prompt of that task
    carrying the Task's schema."""
    assert set(TASKS) == set(SAMPLES)
    for name, task in TASKS.items():
        prompt = SAMPLES[name]()
        if name == "part_notes":  # its answer's shape is its sections' shapes, by key
            assert prompt.json_schema["properties"]["summary"] is TASKS["chunk_summary"].schema
        else:
            assert prompt.json_schema is task.schema
        assert task.name == name and prompt.task == name
        assert task.render.__name__ == name  # the render story modules call by the task's name


class Canned:
    """A backend answering every prompt with the same text."""

    name = "canned"

    def __init__(self, text: str) -> None:
        self.text = text

    def complete(self, messages: list[dict[str, Any]], **kw: Any) -> str:
        return self.text


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_run_prompt_parses_and_falls_back_with_the_tasks_own(name, monkeypatch):
    """`llm.run_prompt` (and the registry's parse and fallback) use TASKS[prompt.task]'s parse
    and fallback, nothing else: replaced in the registry, the replacements answer."""
    prompt = SAMPLES[name]()
    stand_in = dataclasses.replace(TASKS[name], schema={},
                                   parse=lambda inputs, data, answer: ("parsed", name, data),
                                   fallback=lambda p, counter: ("fallback", name, p.task))
    monkeypatch.setitem(TASKS, name, stand_in)
    assert llm.run_prompt(prompt, Canned('{"any": 1}')) == ("parsed", name, {"any": 1})
    assert llm.run_prompt(prompt, None) == ("fallback", name, name)
    assert registry.parse(prompt, '{"any": 2}') == ("parsed", name, {"any": 2})
    assert registry.fallback(prompt) == ("fallback", name, name)


def test_an_unknown_task_is_refused():
    prompt = dataclasses.replace(SAMPLES["chunk_summary"](), task="poem")
    with pytest.raises(ValueError, match="unknown task 'poem'"):
        llm.run_prompt(prompt, None)


# --- every prompt the story modules render, through client mode ------------------------------

LIMITS = {"summary_max_quotes": 2, "memory_max_chars": 321, "character_memory_tokens": 77,
          "scene_summary_tokens": 111, "scene_gap_minutes": 45, "scene_max_messages": 9,
          "told_events_max": 4, "sheet_max_fields": 5, "deep_memory_max_items": 2,
          "lore_growth_max_entries": 3}
# Where each of those settings shows in the prompts' inputs (by task).
EXPECTED_INPUTS = {
    "chunk_summary": {"max_quotes": 2}, "merge_summaries": {"max_quotes": 2},
    "session_summary": {"max_quotes": 2, "thread_max_chars": 321},
    "durable_memories": {"max_chars": 321, "max_items": 2},
    "character_memories": {"memory_tokens": 77},
    "scene_summaries": {"scene_tokens": 111, "gap_minutes": 45, "max_messages": 9},
    "told_events": {"max_events": 4}, "sheet_updates": {"max_fields": 5}, "lore_growth": {"max_entries": 3},
    "memories_from_description": {"max_chars": 321}, "save_from_conversation": {"max_chars": 321},
}


@pytest.fixture
def overrides():
    return {"llm_mode": "client", "live_window_max_messages": 4, "summary_chunk_messages": 2,
            "summary_merge_count": 2, "deep_memory_min_new_messages": 2, **LIMITS}


def _session(api) -> None:
    """Kai, Ayla and Bren talk; Ayla nearly says her sheet's secret in front of Bren; the session ends."""
    register_cast(api)
    expect_ok(api.put("/v1/characters/ayla.png", json={"name": "Ayla", "sheet": {
        "personality": "Quiet.", "secrets": [{"text": "The silver key lies under the chapel bell."}]}}), 200)
    chat(api, "c1", "ayla.png", "bren.png")
    lines = []
    for n in range(6):
        lines += [line(f"u{n}", "kai.png", f"Call me Red. We need to reach the chapel before dawn {n}.", 2 * n),
                  line(f"a{n}", "ayla.png", f'"The silver key lies under the chapel bell, Bren," Ayla says ({n}).',
                       2 * n + 1, turn_id=f"t{n}"),
                  line(f"b{n}", "bren.png", f'"Then I promise to fetch it, Ayla," Bren answers ({n}).', 2 * n + 1.5)]
    for i in range(0, len(lines), 3):
        post_lines(api, "c1", lines[i:i + 3])
    end_session(api, "c1")


def _claim_and_answer_all(services) -> dict[str, list[dict[str, Any]]]:
    """Claim every LLM job as the extension does and answer it with an empty result; the inputs
    each job's prompt carried, by task."""
    seen: dict[str, list[dict[str, Any]]] = {}
    while True:
        drain(services)  # the kinds the worker runs itself in client mode
        job = worker.claim(services)
        if job is None:
            return seen
        [row] = job_rows(services, id=job["id"])
        prompt = json.loads(row["payload"])["prompt"]
        if job["task"] == "part_notes":  # the jobs of one part share the call (MJ1): answer each section
            sections = prompt["inputs"]["sections"]
            for section in sections.values():
                seen.setdefault(section["task"], []).append(section["inputs"])
            answer = {key: EMPTY[section["task"]] for key, section in sections.items()}
        else:
            seen.setdefault(job["task"], []).append(prompt["inputs"])
            answer = EMPTY[job["task"]]
        done = worker.complete(services, job["id"], json.dumps(answer), job["attempt"])
        assert done["state"] == "done", done


def test_every_prompt_a_story_module_renders_has_its_task(api, services, monkeypatch):
    """Every prompt the story modules render in a campaign's flow (compaction, merges, deep memory,
    a session's end, memory drafts) is of a task in TASKS, parsed by that Task in client mode and
    run extractively by it otherwise; and it carries the settings' values as its limits."""
    ran: list[Prompt] = []
    looked_up = llm.task_of
    monkeypatch.setattr(llm, "task_of", lambda prompt: ran.append(prompt) or looked_up(prompt))
    _session(api)
    seen = _claim_and_answer_all(services)
    for body in ({"mode": "description", "character_id": "ayla.png", "description": "Red hates thunder."},
                 {"mode": "conversation", "character_id": "ayla.png",
                  "messages": [{"id": "m1", "name": "Red", "role": "user", "text": "I hate thunder."}]}):
        expect_ok(api.post("/v1/memories/drafts", json=body), 200, "memory_drafts.response")
    # In client mode the sidecar runs no model: the drafts are its Tasks' fallbacks.
    assert [p.task for p in ran] == ["memories_from_description", "save_from_conversation"]
    for p in ran:
        seen.setdefault(p.task, []).append(p.inputs)
    # part_notes is no task of its own: the jobs that share a call are seen by their sections.
    assert set(seen) == set(TASKS) - {"part_notes"}
    for task, expected in EXPECTED_INPUTS.items():
        for inputs in seen.get(task, []):
            assert {k: inputs[k] for k in expected} == expected, task
