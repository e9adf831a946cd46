"""The next turn's query vector, embedded ahead (`POST /v1/context/prefetch`).

The extension sends the player's action as soon as it knows it (the player paused typing, or sent
it) and does not wait for the answer. One thread per sidecar embeds the newest text it was given
the way the context call will (`bank.query_vector_soon`: the same text, the same cast), so the vector is
in the embedder's cache when `POST /v1/context` asks; a context call that comes while it is being
embedded waits for that one embedding instead of making a second (embeddings.Embedder). Nothing
depends on it: a text never prefetched, or one pushed out by a newer, is embedded by the context
call itself, as before. It runs as a request (priority.serving): background jobs step aside.
"""

from __future__ import annotations

import logging
import threading

from .. import priority
from ..services import Services
from . import bank, search

log = logging.getLogger(__name__)


class Prefetcher:
    """Newest wins: one pending (chat, text) slot and one thread that empties it."""

    def __init__(self, svc: Services) -> None:
        self.svc = svc
        self._lock = priority.Lock()
        self._pending: tuple[str, str] | None = None
        self._running = False

    def offer(self, chat_id: str, text: str) -> None:
        """Embed this text soon; a text offered meanwhile replaces it if it has not started."""
        with self._lock:
            self._pending = (chat_id, text)
            if self._running:
                return
            self._running = True
        threading.Thread(target=self._run, name="chronicler-prefetch", daemon=True).start()

    def _run(self) -> None:
        while True:
            with self._lock:
                job, self._pending = self._pending, None
                if job is None:
                    self._running = False
                    return
            try:
                with priority.serving():
                    pending = bank.query_vector_soon(self.svc, job[1], job[0])
                    if pending is not None:
                        search.vector_of(pending)  # embedded (and cached) while counted as serving
            except Exception:  # the context call embeds it itself; a prefetch may only save time
                log.warning("query prefetch failed", exc_info=True)


def prefetch(svc: Services, chat_id: str, text: str) -> bool:
    """Start embedding `text` as the context call will; False when the model is not ready."""
    if not svc.embedder.ready or not text.strip():
        return False
    svc.cached("query_prefetcher", (), lambda: Prefetcher(svc), size=1).offer(chat_id, text)
    return True
