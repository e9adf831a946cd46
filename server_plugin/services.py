"""What every domain function needs, built once by the app factory and passed explicitly."""

from __future__ import annotations

from dataclasses import dataclass

from .clock import Clock
from .db import Database
from .embeddings import Embedder
from .settings import Settings
from .tokens import TokenCounter


@dataclass
class Services:
    """Settings, the database, the embedder, the token counter and the clock."""

    settings: Settings
    db: Database
    embedder: Embedder
    tokens: TokenCounter
    clock: Clock

    def embed_wait(self) -> float:
        """Seconds a write may wait for the embedding model to finish loading."""
        return float(self.settings.embedder_wait_seconds)
