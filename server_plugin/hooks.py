"""Cross-concept events: one `Signal` type, and the set of them a store's services carry.

A concept that must react to another's change (a deleted message takes the character memories
that quote it along; a session's end queues the jobs that read it) connects a listener in its
`register(jobs, hooks)`; the concept that makes the change sends the signal inside its own write
transaction, so the whole change is one transaction. Listeners run in the order they connected,
which is the order of `app.CONCEPTS`.

Imports nothing of ours: every room may hold a `Hooks`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

Listener = Callable[..., Any]


class Signal:
    """One named event with its listeners, called in the order they connected."""

    def __init__(self, name: str, doc: str) -> None:
        self.name = name
        self.__doc__ = doc
        self._listeners: list[Listener] = []

    def connect(self, listener: Listener) -> Listener:
        """Add a listener (once: connecting it again changes nothing); returns it."""
        if listener not in self._listeners:
            self._listeners.append(listener)
        return listener

    @property
    def listeners(self) -> tuple[Listener, ...]:
        return tuple(self._listeners)

    def send(self, *args: Any) -> list[Any]:
        """Call every listener with `args`; returns what each returned, in order."""
        return [listener(*args) for listener in self._listeners]

    def count(self, *args: Any) -> int:
        """`send`, for listeners that return how many things they did (None counts 0)."""
        return sum(int(n or 0) for n in self.send(*args))

    def tally(self, *args: Any) -> dict[str, int]:
        """`send`, for listeners that return counts by kind (`{"episodes": 2}`), summed."""
        total: dict[str, int] = {}
        for part in self.send(*args):
            for key, n in (part or {}).items():
                total[key] = total.get(key, 0) + int(n)
        return total

    def __repr__(self) -> str:
        return f"Signal({self.name!r}, {len(self._listeners)} listeners)"


def _signal(name: str, doc: str) -> Any:
    return field(default_factory=lambda: Signal(name, doc))


@dataclass
class Hooks:
    """Every cross-concept event of the product (one set per store's services)."""

    messages_edited: Signal = _signal(
        "messages_edited", "(svc, conn, chat_id, rows): stored messages' texts changed.")
    messages_deleted: Signal = _signal(
        "messages_deleted", "(svc, conn, chat_id, message_ids) -> counts: messages were deleted.")
    chat_deleted: Signal = _signal(
        "chat_deleted", "(svc, conn, chat_id) -> counts: a chat is being deleted with what it holds.")
    character_deleted: Signal = _signal(
        "character_deleted", "(svc, conn, character_id) -> counts: a character is being deleted; "
        "what it owned is let go (RV6: its memories become global).")
    turn_rolled_back: Signal = _signal(
        "turn_rolled_back", "(svc, conn, chat_id, turn_id) -> counts: a regenerated or swiped turn "
        "takes back what it wrote (RV10).")
    chat_moved: Signal = _signal(
        "chat_moved", "(svc, conn, chat_id, old_campaign, new_campaign, old_left) -> counts: a chat "
        "joined another campaign (CP1); what was derived from its play moves with it (`old_left`: "
        "chats still in the old campaign).")
    chat_branched: Signal = _signal(
        "chat_branched", "(svc, conn, chat_id, parent_id, message_id) -> counts: a chat was "
        "registered as a branch of another at one of its messages (CP2).")
    session_ended: Signal = _signal(
        "session_ended", "(svc, conn, chat_id, n) -> jobs queued: session n of a chat ended.")
    deep_memory_ran: Signal = _signal(
        "deep_memory_ran", "(svc, conn, chat_id, turn_id, message_ids) -> jobs queued: a deep-memory "
        "run was queued for a compacted chunk (RV13).")
    messages_due: Signal = _signal(
        "messages_due", "(svc, conn, chat_id, turn_id) -> jobs queued: messages left the live window "
        "or their session ended; with parts on (MJ1) they wait to be read in a part.")
    part_closed: Signal = _signal(
        "part_closed", "(svc, conn, chat_id, turn_id, message_ids) -> jobs queued: a part of the "
        "transcript is to be read (MJ1): each concept queues the job of its task over exactly "
        "these messages, so they share one model call.")
    store_importing: Signal = _signal(
        "store_importing", "(conn): an import wrote every row, inside its transaction; a listener "
        "raises to refuse the document.")
