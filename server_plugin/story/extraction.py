"""What the extraction jobs of a session's end and of deep memory share (SW4, SW5, SW9b, SW1):
the parts of a transcript they read, the cast present, and the check of an answer against the
store as it is when the answer is applied.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterable, Sequence

from ..core.quotes import DroppedQuote, dropped_report
from ..jobs import queue
from ..jobs.tasks.base import CharacterRef
from ..services import Services
from ..store.db import Connection
from . import characters, chats, messages

if TYPE_CHECKING:
    from ..jobs.tasks.base import ChatMessage


def cast(conn: Connection, chat_id: str, rows: Sequence[Any]) -> list[CharacterRef]:
    """The chat's members and the messages' speakers that are registered characters."""
    ids = dict.fromkeys([*chats.members(conn, chat_id), *(r["speaker_id"] for r in rows if r["speaker_id"])])
    out = []
    for character_id in ids:
        found = characters.fetch(conn, character_id)
        if found is not None:
            out.append(CharacterRef(found["id"], found["name"], found["is_player"],
                                    tuple(found["aliases"])))
    return out


def learners(conn: Connection, cast: Sequence[CharacterRef]) -> list[str]:
    """Characters whose memories are extracted: not the player's, learning from chat on (RV14)."""
    return [c.id for c in cast if not c.is_player and characters.learning_enabled(conn, c.id)]


def parts(svc: Services, rows: Sequence[Any]) -> list[list[Any]]:
    """Consecutive parts of a transcript, each within `episodes_prompt_max_tokens`."""
    budget = svc.settings.episodes_prompt_max_tokens
    limit = svc.settings.prompt_message_max_tokens
    parts: list[list[Any]] = []
    used = 0
    for row in rows:
        cost = min(row["tokens"], limit)
        if not parts or (parts[-1] and used + cost > budget):
            parts.append([])
            used = 0
        parts[-1].append(row)
        used += cost
    return parts


def job_inputs(svc: Services, job: queue.Job) -> tuple[Any, list[Any], list[CharacterRef]] | None:
    """The job's messages as they are now and the cast, or None when nothing is left to do."""
    conn = svc.db.reader()
    if not chats.memory_enabled(conn, job.chat_id):
        return None
    rows = messages.by_ids(conn, job.chat_id, job.target["message_ids"])
    if not rows:
        return None
    return conn, rows, cast(conn, job.chat_id, rows)


def chat_messages(svc: Services, rows: Sequence[Any]) -> list[ChatMessage]:
    return [messages.chat_message(svc, r) for r in rows]


@dataclass
class Checked:
    """What a result becomes once checked against the store: rows to insert and what was dropped."""

    rows: list[dict[str, Any]] = field(default_factory=list)
    dropped_quotes: list[DroppedQuote] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)

    def report(self) -> dict[str, Any]:
        return {**dropped_report(self.dropped_quotes), "dropped": self.dropped}


def texts(conn: Connection, chat_id: str, ids: Iterable[str]) -> dict[str, Any]:
    return {r["id"]: r for r in messages.by_ids(conn, chat_id, ids)}
