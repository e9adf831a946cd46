"""Every model task by name, from one explicit list: what `llm.run_prompt` and the worker's
client mode use to parse an answer and to fall back without a model."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from . import episodes, lore, memories, parts, sheets, summaries, told
from .base import Prompt, Task

if TYPE_CHECKING:
    from ...core.tokens import TokenCounter

TASKS: dict[str, Task] = {task.name: task for task in (
    summaries.CHUNK_SUMMARY,
    summaries.MERGE_SUMMARIES,
    summaries.SESSION_SUMMARY,
    memories.DURABLE_MEMORIES,
    memories.MEMORIES_FROM_DESCRIPTION,
    memories.SAVE_FROM_CONVERSATION,
    episodes.CHARACTER_MEMORIES,
    episodes.SCENE_SUMMARIES,
    told.TOLD_EVENTS,
    sheets.SHEET_UPDATES,
    parts.PART_NOTES,
    lore.LORE_GROWTH,
)}


def task_of(prompt: Prompt) -> Task:
    """The Task that renders `prompt` (ValueError for a task we do not know)."""
    if prompt.task not in TASKS:
        raise ValueError(f"unknown task {prompt.task!r}")
    return TASKS[prompt.task]


def parse(prompt: Prompt, answer: str) -> Any:
    """Parse a model's answer to `prompt` into the task's result type, or raise PromptParseError."""
    return task_of(prompt).parse_answer(prompt, answer)


def fallback(prompt: Prompt, counter: TokenCounter | None = None) -> Any:
    """The extractive result of the task `prompt` describes, from the inputs it carries."""
    return task_of(prompt).fallback(prompt, counter)
