"""One generation (a turn) as a unit: rolling back everything it wrote (rule RV10).

Each concept that stores something a turn wrote connects its own rollback to
`hooks.turn_rolled_back`; they all run inside one write transaction, in the order of
`app.CONCEPTS`, so a swipe or regenerate removes all of it or none of it.
"""

from __future__ import annotations

from typing import Any

from ..services import Services


def rollback(svc: Services, chat_id: str, turn_id: str) -> dict[str, Any]:
    """Remove what one generation wrote (never pinned items, RV11); returns counts by kind."""
    with svc.db.write() as conn:
        removed = svc.hooks.turn_rolled_back.tally(svc, conn, chat_id, turn_id)
    return {"chat_id": chat_id, "turn_id": turn_id, "removed": removed}
