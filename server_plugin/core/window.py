"""The live window (rule RV2), as pure arithmetic: no database, no clock.

The window is the newest messages within min(`max_tokens`, `percent`% of the model's context) and
at most `max_messages` messages. A bigger model does not grow it past `max_tokens`: a larger
context grows what fits around it (summaries, memories, lore), not the raw transcript. The three
limits are the settings live_window_max_tokens, live_window_percent and live_window_max_messages;
callers pass them.
"""

from __future__ import annotations

from typing import Sequence


def budget(context_tokens: int, *, max_tokens: int, percent: float) -> int:
    """Tokens the live window may hold: min(max_tokens, floor(percent% of context_tokens))."""
    return max(0, min(int(max_tokens), int(context_tokens * percent // 100)))


def size(newest_first: Sequence[int], context_tokens: int, *, max_tokens: int, percent: float,
         max_messages: int) -> int:
    """How many of the newest messages are live, given their token counts newest first.

    Messages are taken newest first while the total stays within `budget()` and the count within
    `max_messages`. The newest message is always live, even when it alone exceeds the budget: it is
    what the conversation is answering, and summarising it away would lose the turn itself.
    """
    limit = budget(context_tokens, max_tokens=max_tokens, percent=percent)
    used = taken = 0
    for tokens in newest_first:
        if taken >= max_messages or (taken and used + tokens > limit):
            break
        used += tokens
        taken += 1
    return taken
