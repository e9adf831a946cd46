"""Who knows what (rule SW9b), decided in one place for search, per-turn memories and context.

An item is public (`known_by` is None: everyone who reads its scope) or known by a list of
characters. A person (the panel: viewer None) sees everything.
"""

from __future__ import annotations

from typing import Iterable


def can_see(viewer_id: str | None, known_by: Iterable[str] | None) -> bool:
    """True when the viewer may know an item with this `known_by` list."""
    if viewer_id is None or known_by is None:
        return True
    return viewer_id in known_by


def knows_secret(viewer_id: str | None, owner_id: str, known_by: Iterable[str] | None) -> bool:
    """A sheet secret (SW1, SW9b): its owner always knows it, `known_by` names who else does.

    Unlike a memory, a secret with no `known_by` is not public: only its owner knows it.
    """
    if viewer_id is None or viewer_id == owner_id:
        return True
    return known_by is not None and viewer_id in known_by


def known_by_sql(viewer_id: str | None, column: str) -> tuple[str, list[str]]:
    """The same rule as `can_see`, as an SQL condition on a JSON `known_by` column, and its args."""
    if viewer_id is None:
        return "1", []
    return (f"({column} IS NULL OR EXISTS (SELECT 1 FROM json_each({column}) WHERE value=?))",
            [viewer_id])
