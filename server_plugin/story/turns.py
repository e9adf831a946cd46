"""One generation (a turn) as a unit: rolling back everything it wrote (rule RV10).

Each module that stores something written by a turn contributes its own rollback here, inside
one write transaction, so a swipe or regenerate removes all of it or none of it.
"""

from __future__ import annotations

from typing import Any

from . import conversation, episodes, memories
from ..services import Services


def rollback(svc: Services, chat_id: str, turn_id: str) -> dict[str, Any]:
    """Remove what one generation wrote (never pinned items, RV11); returns counts by kind."""
    with svc.db.write() as conn:
        removed = {"memories": len(memories.rollback_turn(svc, conn, chat_id, turn_id))}
        # Before the turn's jobs go: episodes finds the messages its jobs had read (SW4, SW9b).
        removed.update(episodes.rollback_turn(svc, conn, chat_id, turn_id))
        # Summaries, notes and the queued jobs of that turn (RV10, RV13).
        removed.update(conversation.rollback_turn(svc, conn, chat_id, turn_id))
    return {"chat_id": chat_id, "turn_id": turn_id, "removed": removed}
