"""Memory drafts for a person to review: "generate memories" (RV9c) and "save from conversation" (RV9d).

Unlike background jobs, a person is waiting on a dialog here: the prompt runs synchronously, with
the model's read timeout capped by `drafts_timeout_seconds` and `drafts_retries` retries. When no
model is configured (`extractive`, or `client` mode where SillyTavern runs the background jobs) or
the model fails, the drafts come from the text itself and `warning` says why. Nothing is saved
here: the person edits the drafts and saves them through `POST /v1/memories`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..errors import Unprocessable
from ..jobs import llm
from ..jobs.tasks.base import CharacterRef, ChatMessage, PromptParseError
from ..jobs.tasks.memories import memories_from_description, save_from_conversation
from ..services import Services
from . import characters

if TYPE_CHECKING:
    from ..jobs.tasks.base import Prompt
    from ..jobs.tasks.memories import MemoryDraft

EXTRACTIVE_NOTE = "No model is configured for the sidecar (llm_mode {mode}), so these drafts come from the text itself."


def make_drafts(svc: Services, data: dict[str, Any]) -> dict[str, Any]:
    """Drafts for the request `data` (schema memory_drafts.request); see the module docstring."""
    character = _character(svc, data.get("character_id"))
    prompt = _prompt(svc, data, character)
    backend, warning = _backend(svc)
    source = "model" if backend is not None else "extractive"
    try:
        result = llm.run_prompt(prompt, backend, json_mode=svc.settings.llm_json_mode,
                                temperature=svc.settings.llm_temperature)
    except (llm.LLMError, PromptParseError) as error:
        warning = f"The model could not be used ({error}); these drafts come from the text itself."
        source = "extractive"
        result = llm.run_prompt(prompt, None)
    return {
        "drafts": [_draft(d) for d in result.items],
        "source": source,
        "dropped": list(result.dropped_items),
        "warning": warning,
    }


def _character(svc: Services, character_id: str | None) -> CharacterRef | None:
    if character_id is None:
        return None
    found = characters.fetch(svc.db.reader(), character_id)
    if found is None:
        raise Unprocessable("unknown_character", f"No character with id {character_id!r}; "
                            "register it with PUT /v1/characters/{id} first.")
    return CharacterRef(found["id"], found["name"], found["is_player"], tuple(found["aliases"]))


def _prompt(svc: Services, data: dict[str, Any], character: CharacterRef | None) -> Prompt:
    s = svc.settings
    try:
        if data["mode"] == "description":
            return memories_from_description(
                data["description"], character, max_items=s.save_from_conversation_max_drafts,
                max_chars=s.memory_max_chars, description_max_chars=s.description_max_chars)
        messages = [ChatMessage(m["id"], m["name"], m["text"], m.get("role", "user"))
                    for m in data["messages"] if m["text"].strip()]
        return save_from_conversation(
            messages, character, max_drafts=s.save_from_conversation_max_drafts,
            max_messages=s.save_from_conversation_max_messages, max_chars=s.memory_max_chars)
    except ValueError as error:
        raise Unprocessable("invalid_drafts_request", str(error)) from None


def _backend(svc: Services) -> tuple[llm.Backend | None, str | None]:
    """The model to ask, with a timeout fit for a waiting person; or None and why not."""
    s = svc.settings
    if s.llm_mode != "openai":
        return None, EXTRACTIVE_NOTE.format(mode=s.llm_mode)
    try:
        backend = llm.make_backend(
            s, timeout=(s.llm_connect_timeout, min(s.llm_read_timeout, s.drafts_timeout_seconds)),
            retries=s.drafts_retries, retry_after_max=0.0)
    except llm.LLMConfigError as error:
        return None, f"The sidecar's model is not usable ({error}); these drafts come from the text itself."
    return backend, None


def _draft(d: MemoryDraft) -> dict[str, Any]:
    return {"text": d.text, "kind": d.kind, "scope": d.scope, "character_id": d.character_id,
            "source_message_ids": list(d.source_message_ids)}
