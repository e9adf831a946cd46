"""The cast and the chats of a test: `character()` and `chat()`, each one PUT through the API, the
answer's status checked, the stored item returned."""

from __future__ import annotations

from typing import Any, Iterable
from urllib.parse import quote

Status = int | tuple[int, ...]

# Short unrelated lines of a town, for search tests.
TOWN = ["The blacksmith's hammer broke yesterday; he needs a new oak handle.",
        "The princess planted a cherry tree in the castle garden.",
        "The caravan came back from the desert with spices and silk.",
        "The guards change at the gate at midnight, when it closes for a while.",
        "Wolves have been seen on the mountain road, the innkeeper warned.",
        "The black tower hides a treasure at its top, they say.",
        "The ferryman wants two silver coins to cross the river.",
        "Our lantern ran out of oil near the old mill.",
        "The healer's garden grows mint, sage and bitter willow."]


def _checked(response: Any, status: Status) -> dict[str, Any]:
    wanted = (status,) if isinstance(status, int) else status
    assert response.status_code in wanted, (response.status_code, response.get_data(as_text=True)[:500])
    return response.get_json()


def character(api: Any, character_id: str, name: str | None = None, *, status: Status = (200, 201),
              **fields: Any) -> dict[str, Any]:
    """Create or replace a character (`name` defaults to its id; `fields` as the API takes them:
    aliases, sheet, is_player, learn_from_chat, …)."""
    body = {"name": name or character_id, **fields}
    return _checked(api.put(f"/v1/characters/{quote(character_id, safe='')}", json=body), status)["character"]


def chat(api: Any, chat_id: str, members: Iterable[str] = (), *, status: Status = (200, 201),
         **fields: Any) -> dict[str, Any]:
    """Register a chat with these members (`fields`: memory_enabled, title, …)."""
    body = {"member_ids": list(members), **fields}
    return _checked(api.put(f"/v1/chats/{quote(chat_id, safe='')}", json=body), status)["chat"]
