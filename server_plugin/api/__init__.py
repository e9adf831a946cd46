"""The HTTP layer: one blueprint per resource family. Each view parses, validates, calls, serialises."""

from __future__ import annotations

from flask import Flask

from . import (
    characters,
    chats,
    context,
    conversation,
    drafts,
    episodes,
    health,
    jobs,
    lore,
    memories,
    notes,
    portable,
    search,
    settings,
    summaries,
)

BLUEPRINTS = [health.bp, characters.bp, chats.bp, memories.bp, conversation.bp, summaries.bp,
              notes.bp, jobs.bp, drafts.bp, lore.bp, context.bp, search.bp, episodes.bp, portable.bp,
              settings.bp]


def register(app: Flask) -> None:
    for blueprint in BLUEPRINTS:
        app.register_blueprint(blueprint, url_prefix="/v1")
