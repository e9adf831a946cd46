"""What every domain function needs, built once by the app factory and passed explicitly."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from .clock import Clock
from .db import Database
from .embeddings import Embedder
from .settings import Settings
from .tokens import TokenCounter


@dataclass
class Services:
    """Settings, the database, the embedder, the token counter, the clock and the job wake-up."""

    settings: Settings
    db: Database
    embedder: Embedder
    tokens: TokenCounter
    clock: Clock
    # Set when a job is enqueued, so the background worker wakes at once (jobs.py).
    jobs_wake: threading.Event = field(default_factory=threading.Event, repr=False, compare=False)

    def embed_wait(self) -> float:
        """Seconds a write may wait for the embedding model to finish loading."""
        return float(self.settings.embedder_wait_seconds)
