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
