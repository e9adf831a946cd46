"""Helpers for the conversation tests: a registered chat, turns posted through the HTTP API, and
a plausible roleplay line for turn n (so extractive jobs have real sentences to work on)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

from server_plugin.jobs import worker
from tests.helpers.api import expect_ok
from tests.helpers.world import character, chat

CHAT = "c1"
T0 = datetime(2026, 3, 1, 12, 0, tzinfo=timezone.utc)

PLACES = ["the harbour", "the old mill", "the lighthouse", "the market", "the chapel", "the forest road"]


def iso(minutes: float) -> str:
    return (T0 + timedelta(minutes=minutes)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def setup_chat(api, chat_id: str = CHAT, members: tuple[str, ...] = ("ayla.png",), *,
               characters: bool = True, **extra: Any) -> None:
    """Register the characters (Ayla, the player Kai) and the chat."""
    if characters:
        character(api, "ayla.png", "Ayla")
        character(api, "kai.png", "Kai", is_player=True)
    chat(api, chat_id, members, **extra)


def user_line(n: int) -> str:
    return f"Kai walks to {PLACES[n % len(PLACES)]}. \"Ayla, did you see the lantern number {n}?\""


def reply_line(n: int) -> str:
    return (f"*Ayla looks toward {PLACES[(n + 1) % len(PLACES)]}.* \"I saw lantern {n} burning "
            f"near the water, Kai.\" She pulls her cloak tighter.")


def turn_messages(n: int, *, minutes: float | None = None, user: str | None = None,
                  reply: str | None = None, turn_id: str | None = None) -> list[dict[str, Any]]:
    at = n if minutes is None else minutes
    return [
        {"id": f"u{n}", "role": "user", "name": "Kai", "text": user or user_line(n),
         "sent_at": iso(at), "speaker_id": "kai.png"},
        {"id": f"a{n}", "role": "assistant", "name": "Ayla", "text": reply or reply_line(n),
         "sent_at": iso(at + 0.5), "turn_id": turn_id or f"t{n}", "speaker_id": "ayla.png"},
    ]


def post(api, messages: list[dict[str, Any]], chat_id: str = CHAT) -> dict[str, Any]:
    return expect_ok(api.post(f"/v1/chats/{chat_id}/messages", json={"messages": messages}), 200,
                     "messages_upsert.response")


def turns(api, start: int, stop: int, chat_id: str = CHAT, **kw: Any) -> None:
    """Post turns start..stop-1 (a user message and a reply each)."""
    for n in range(start, stop):
        post(api, turn_messages(n, **kw), chat_id)


def summaries(api, chat_id: str = CHAT) -> dict[str, Any]:
    return expect_ok(api.get(f"/v1/chats/{chat_id}/summaries"), 200, "summaries.response")


def drain(services) -> int:
    """Run every due job now (the worker is off in tests)."""
    return worker.run_pending(services)


def job_rows(services, **where: Any) -> list[Any]:
    clause = " AND ".join(f"{k}=?" for k in where) or "1"
    return services.db.reader().execute(f"SELECT * FROM jobs WHERE {clause} ORDER BY seq",
                                        tuple(where.values())).fetchall()
