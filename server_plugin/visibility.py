"""Who knows what (rule SW9b), decided in one place for search, per-turn memories and context.

An item is public (`known_by` is None: everyone who reads its scope) or known by a list of
characters. A person (the panel: viewer None) sees everything.
"""

from __future__ import annotations

from typing import Any, Collection, Iterable, Sequence

import numpy as np


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


# --- search rows (SW6): the same rules, for a whole index at once ------------------------------
# A kind whose owner (`character_id` of its row) is a memory scope (RV4): an unrestricted item of
# such a kind is known to the characters that read that scope (RV5), not to everyone.
SCOPED_KINDS = frozenset({"memory"})


def readable_scopes(conn: Any, viewer_id: str) -> frozenset[str]:
    """The character scopes a viewer reads (RV5): its own and those of everyone it shares a chat with."""
    rows = conn.execute("SELECT DISTINCT b.character_id FROM chat_members a JOIN chat_members b"
                        " ON a.chat_id = b.chat_id WHERE a.character_id = ?", (viewer_id,)).fetchall()
    return frozenset([viewer_id, *(r[0] for r in rows)])


def reads_scope(viewer_id: str | None, owner_id: str | None, scopes: Collection[str]) -> bool:
    """True when an unrestricted item owned by `owner_id` (None: global) is known to the viewer."""
    return viewer_id is None or owner_id is None or owner_id in scopes


def row_mask(viewer_id: str | None, *, known_sets: Sequence[Collection[str]], known_codes: np.ndarray,
             scoped: np.ndarray, owners: Sequence[str | None], owner_codes: np.ndarray,
             scopes: Collection[str] = ()) -> np.ndarray:
    """Which rows of a search index the viewer may know (SW9b), as a boolean array.

    Row i is known by `known_sets[known_codes[i]]` (code -1: unrestricted); an unrestricted row of
    a scoped kind (`scoped[i]`) is owned by `owners[owner_codes[i]]` (code -1: nobody). A listed
    `known_by` decides on its own (a character told a secret knows it whoever's scope it is in);
    otherwise `reads_scope` does. A person (viewer None) sees everything.
    """
    n = len(known_codes)
    if viewer_id is None:
        return np.ones(n, dtype=bool)
    listed = np.array([can_see(viewer_id, s) for s in known_sets] + [True], dtype=bool)
    readable = np.array([reads_scope(viewer_id, o, scopes) for o in owners] + [True], dtype=bool)
    # Code -1 picks the trailing True of each table.
    by_list = listed[known_codes]
    by_scope = np.where(scoped, readable[owner_codes], True)
    return np.where(known_codes >= 0, by_list, by_scope)
