"""The settings' defaults as the limits each model task takes (jobs/tasks/): a test renders a
prompt, or runs a fallback, with the values a story module passes from `svc.settings`."""

from __future__ import annotations

from typing import Any

from server_plugin.settings import load_settings

DEFAULTS = load_settings(environ={}, read_file=lambda path: {})

_D = DEFAULTS
LIMITS: dict[str, dict[str, Any]] = {
    "chunk_summary": {"budget_tokens": _D.summary_recent_tokens, "max_quotes": _D.summary_max_quotes},
    "merge_summaries": {"budget_tokens": _D.summary_consolidated_tokens, "max_quotes": _D.summary_max_quotes},
    "session_summary": {"full_tokens": _D.session_full_tokens, "short_tokens": _D.session_short_tokens,
                        "max_quotes": _D.summary_max_quotes, "max_threads": _D.session_max_threads,
                        "thread_max_chars": _D.memory_max_chars},
    "durable_memories": {"max_items": _D.deep_memory_max_items, "max_chars": _D.memory_max_chars},
    "character_memories": {"per_character": _D.character_memories_per_character,
                           "max_quotes": _D.character_memory_max_quotes,
                           "memory_tokens": _D.character_memory_tokens},
    "scene_summaries": {"max_scenes": _D.scenes_max, "max_quotes": _D.scene_max_quotes,
                        "scene_tokens": _D.scene_summary_tokens, "gap_minutes": _D.scene_gap_minutes,
                        "max_messages": _D.scene_max_messages},
    "told_events": {"max_events": _D.told_events_max},
    "memories_from_description": {"max_items": _D.save_from_conversation_max_drafts,
                                  "max_chars": _D.memory_max_chars,
                                  "description_max_chars": _D.description_max_chars},
    "save_from_conversation": {"max_drafts": _D.save_from_conversation_max_drafts,
                               "max_messages": _D.save_from_conversation_max_messages,
                               "max_chars": _D.memory_max_chars},
    "sheet_updates": {"max_fields": _D.sheet_max_fields, "field_max_chars": _D.sheet_field_max_chars},
    "lore_growth": {"max_entries": _D.lore_growth_max_entries, "text_max_chars": _D.lore_growth_text_max_chars,
                    "max_triggers": _D.lore_growth_max_triggers},
}


def limits(task: str, **changes: Any) -> dict[str, Any]:
    """The keyword arguments of `task`'s render (and of its fallback), with `changes` applied."""
    return {**LIMITS[task], **changes}
