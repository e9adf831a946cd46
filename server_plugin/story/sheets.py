"""A character sheet as text for one viewer (SW1): the fields as written, and only the secrets
that viewer knows (decided by visibility.py)."""

from __future__ import annotations

from typing import Any

from ..retrieval.visibility import knows_secret

SECRETS = "secrets"


def label(field: str) -> str:
    """A sheet field's name as a person reads it: "first_appearance" -> "First appearance"."""
    return field.replace("_", " ").capitalize()


def visible_secrets(character: dict[str, Any], viewer_id: str | None) -> list[str]:
    """The texts of the character's secrets the viewer knows."""
    return [s["text"] for s in character["sheet"].get(SECRETS, [])
            if knows_secret(viewer_id, character["id"], s.get("known_by"))]


def render(character: dict[str, Any], viewer_id: str | None) -> str:
    """The sheet as the viewer may read it: a name line, one line per field, then secrets.

    `viewer_id` None is a person (the panel): every secret shows.
    """
    head = character["name"]
    notes = []
    if character.get("aliases"):
        notes.append("also called " + ", ".join(character["aliases"]))
    if character.get("is_player"):
        notes.append("the player's character")
    lines = [f"{head} ({'; '.join(notes)})" if notes else head]
    for field, value in character["sheet"].items():
        if field != SECRETS and isinstance(value, str) and value.strip():
            lines.append(f"{label(field)}: {value.strip()}")
    secrets = visible_secrets(character, viewer_id)
    if secrets:
        lines.append("Secrets:")
        lines += [f"- {text.strip()}" for text in secrets]
    return "\n".join(lines)
