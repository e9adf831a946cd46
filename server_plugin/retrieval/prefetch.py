"""The next turn's query vector, embedded ahead (`POST /v1/context/prefetch`).

The extension sends the player's action as soon as it knows it (the player paused typing, or sent
it) and does not wait for the answer. One thread per sidecar embeds the newest text it was given
the way the context call will (`bank.query_vector_soon`: the same text, the same cast), so the vector is
in the embedder's cache when `POST /v1/context` asks; a context call that comes while it is being
embedded waits for that one embedding instead of making a second (embeddings.Embedder). Nothing
depends on it: a text never prefetched, or one pushed out by a newer, is embedded by the context
call itself, as before. It runs as a request (priority.serving): background jobs step aside.
An offer may carry a follow-up (`then`), run on the same thread once the vector is made: the
story's context assembled ahead (story/ahead.py). Each follow-up is called exactly once: with
True after its embedding, or with False when a newer offer replaced it before it ran.
"""

from __future__ import annotations

import logging
import threading
from typing import Callable

from .. import priority
from ..services import Services
from . import bank, search

log = logging.getLogger(__name__)


Then = Callable[[bool], None]


class Prefetcher:
    """Newest wins: one pending (chat, text, follow-up) slot and one thread that empties it."""

    def __init__(self, svc: Services) -> None:
        self.svc = svc
        self._lock = priority.Lock()
        self._pending: tuple[str, str, Then | None] | None = None
        self._running = False

    def offer(self, chat_id: str, text: str, then: Then | None = None) -> None:
        """Embed this text soon, then call `then(True)`; a text offered meanwhile replaces it if
        it has not started (its `then(False)` is called). The same text offered again without a
        follow-up keeps the pending one's."""
        with self._lock:
            replaced = self._pending
            if replaced is not None and replaced[:2] == (chat_id, text) and then is None:
                return
            self._pending = (chat_id, text, then)
            start = not self._running
            self._running = True
        if replaced is not None and replaced[2] is not None:
            _call(replaced[2], False)
        if start:
            threading.Thread(target=self._run, name="chronicler-prefetch", daemon=True).start()

    def _run(self) -> None:
        while True:
            with self._lock:
                job, self._pending = self._pending, None
                if job is None:
                    self._running = False
                    return
            with priority.serving():  # counted as a request: background jobs step aside
                try:
                    pending = bank.query_vector_soon(self.svc, job[1], job[0])
                    if pending is not None:
                        search.vector_of(pending)  # embedded (and cached)
                except Exception:  # the context call embeds it itself; a prefetch may only save time
                    log.warning("query prefetch failed", exc_info=True)
                if job[2] is not None:
                    _call(job[2], True)


def _call(then: Then, ran: bool) -> None:
    try:
        then(ran)
    except Exception:  # a follow-up may only save time, like the prefetch itself
        log.warning("query prefetch follow-up failed", exc_info=True)


def can_prefetch(svc: Services, text: str) -> bool:
    """Whether `prefetch` would start: the model is ready and the text is not blank."""
    return svc.embedder.ready and bool(text.strip())


def prefetch(svc: Services, chat_id: str, text: str, then: Then | None = None) -> bool:
    """Start embedding `text` as the context call will, then run `then` (see `Prefetcher.offer`);
    False when the model is not ready or the text is blank (`then` is not called)."""
    if not can_prefetch(svc, text):
        return False
    svc.cached("query_prefetcher", (), lambda: Prefetcher(svc), size=1).offer(chat_id, text, then)
    return True
