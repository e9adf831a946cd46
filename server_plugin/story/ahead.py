"""The next turn's context, assembled ahead (`POST /v1/context/prefetch`, then `POST /v1/context`).

When the player pauses typing, the extension sends the text it expects to become the next
action. Besides embedding it (retrieval/prefetch.py), the sidecar then assembles the turn that
text most likely starts: the chat's last `POST /v1/context` request with this text as a new
action (`guess`). The context call that follows takes that answer when, and only when, it is the
same answer it would assemble itself:
- its request is the guessed one, field for field (`Turn` equality), and
- nothing was committed to the store since the assembly began (`Database.generation`: every
  committed write moves it; the search index catches up with the database before every search,
  and the assembly reads nothing else that changes: it is a function of the request and the store).
Otherwise it assembles as before. A context call that arrives while its guessed turn is still
being assembled waits for that assembly instead of running a second one beside it (two cores).
What a turn writes (`context.record_turn`) is written by the context call in both cases, never
ahead. One guess per store is kept: a newer one replaces it.

A dry run (`POST /v1/context` with `dry_run`: the extension asks as a generation starts, before
SillyTavern saves the chat) answers the same way and records nothing; its answer is kept here
(`keep`) for the call that follows with the same request, under the same two conditions.
"""

from __future__ import annotations

import dataclasses
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from .. import priority
from ..core.assemble import Assembly, LastAction, Message
from ..services import Services

# Chats whose last request is remembered for a guess (a few are open at a time; one per store).
CHATS_KEPT = 16


@dataclass(frozen=True)
class Prepared:
    """One turn's answer and what the context call records for it (`record_turn`)."""

    generation: int  # the store's write generation when its reading began
    chat: dict[str, Any]
    last: Message | None
    out: Assembly
    result: dict[str, Any]


class Ahead:
    """One store's last request per chat, and the one turn guessed and assembled ahead."""

    def __init__(self) -> None:
        self._lock = priority.Lock()
        self._asked: OrderedDict[str, Any] = OrderedDict()  # chat id -> its last Turn
        self._turn: Any = None  # the guessed Turn
        self._done = threading.Event()
        self._prepared: Prepared | None = None

    def asked(self, turn: Any) -> None:
        """A context call was made: the next guess for its chat starts from it."""
        with self._lock:
            self._asked[turn.chat_id] = turn
            self._asked.move_to_end(turn.chat_id)
            while len(self._asked) > CHATS_KEPT:
                self._asked.popitem(last=False)

    def guess(self, chat_id: str, text: str) -> Any:
        """The turn `text` would start as the chat's next action: its last request with this
        text as a new player action (a normal generation); None before any request of the chat."""
        with self._lock:
            last = self._asked.get(chat_id)
        if last is None:
            return None
        return dataclasses.replace(last, last_action=LastAction(text, "action", None),
                                   generation_type="normal")

    def start(self, turn: Any, generation: int) -> threading.Event | None:
        """Claim the slot for `turn` (the previous guess is given up); None when this turn is
        already being assembled, or was at this generation."""
        with self._lock:
            if self._turn == turn and (not self._done.is_set() or (
                    self._prepared is not None and self._prepared.generation == generation)):
                return None
            return self._replace(turn, None)

    def finish(self, claim: threading.Event, prepared: Prepared | None) -> None:
        """The assembly claimed by `claim` ended (None: it failed); always called."""
        with self._lock:
            if self._done is claim:
                self._prepared = prepared
        claim.set()

    def keep(self, turn: Any, prepared: Prepared) -> None:
        """A dry run's answer (`dry_run`): the next call with this very request may take it."""
        with self._lock:
            self._replace(turn, prepared).set()

    def _replace(self, turn: Any, prepared: Prepared | None) -> threading.Event:
        # (lock held) The slot now holds `turn`; a call waiting for the previous one stops waiting.
        self._done.set()
        self._turn, self._done, self._prepared = turn, threading.Event(), prepared
        return self._done

    def take(self, turn: Any, generation: Any) -> Prepared | None:
        """The answer assembled ahead for exactly `turn`, if nothing was committed since its
        reading began (`generation()` is read after any wait); it is given out once. A call
        that comes while that turn is being assembled waits for it."""
        while True:
            with self._lock:
                if self._turn != turn:
                    return None
                claim = self._done
            claim.wait()
            with self._lock:
                if self._done is not claim:
                    continue  # a newer guess replaced it: it may be this very turn again
                prepared, self._turn, self._prepared = self._prepared, None, None
            if prepared is None:
                return None
            return prepared if prepared.generation == generation() else None


def of(svc: Services) -> Ahead:
    """The store's `Ahead` (an import that replaces the store starts a new one)."""
    return svc.cached("context_ahead", (), Ahead, size=1)
