"""What every domain function needs, built once by the app factory and passed explicitly.

Every room imports this module for the type; so it imports nothing of ours at run time (the types
it names are imported for type checkers only), and sits under every room.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Hashable

from .hooks import Hooks

if TYPE_CHECKING:
    from .clock import Clock
    from .core.tokens import TokenCounter
    from .jobs.queue import JobKinds
    from .retrieval.embeddings import Embedder
    from .settings import Settings
    from .store.db import Database


@dataclass
class Services:
    """Settings, the database, the embedder, the token counter, the clock, the registry of job
    kinds, the cross-concept hooks and the job wake-up."""

    settings: Settings
    db: Database
    embedder: Embedder
    tokens: TokenCounter
    clock: Clock
    jobs: JobKinds
    hooks: Hooks = field(default_factory=Hooks)
    # Set when a job is enqueued, so the background worker wakes at once (jobs/worker.py).
    jobs_wake: threading.Event = field(default_factory=threading.Event, repr=False, compare=False)
    _caches: dict[str, OrderedDict] = field(default_factory=dict, repr=False)

    def cached(self, name: str, key: Hashable, compute: Callable[[], Any], size: int = 256) -> Any:
        """A small per-app LRU cache; put `self.db.generation` in the key of anything read from the store."""
        cache = self._caches.setdefault(name, OrderedDict())
        if key in cache:
            cache.move_to_end(key)
            return cache[key]
        value = compute()
        cache[key] = value
        while len(cache) > size:
            cache.popitem(last=False)
        return value

    def clear_caches(self) -> None:
        """Forget every cached value (after the store was replaced underneath them: an import)."""
        self._caches.clear()

    def embed_wait(self) -> float:
        """Seconds a write may wait for the embedding model to finish loading."""
        return self.settings.embedder_wait_seconds
