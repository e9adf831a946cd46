"""Compact columns of the in-memory search index (live_index.py): codes for repeated values and
the BM25 term postings.

A campaign of 100,000 messages holds about two million postings. Kept as Python lists of ints and
floats they cost about 70 bytes each (an object per number and a pointer to it); kept in typed
arrays (`array.array`: 4-byte rows, 4-byte counts) they cost 8, and turn into numpy arrays with
one copy when a query uses the term.
"""

from __future__ import annotations

from array import array
from typing import Any

import numpy as np


class Codes:
    """Small integer codes for repeated values (chats, speakers, sessions, known_by sets)."""

    def __init__(self) -> None:
        self.code: dict[Any, int] = {}
        self.values: list[Any] = []

    def __call__(self, value: Any) -> int:
        if value is None:
            return -1
        found = self.code.get(value)
        if found is None:
            found = self.code[value] = len(self.values)
            self.values.append(value)
        return found


class Postings:
    """term -> (rows, counts): appended as rows arrive, turned into numpy arrays only when a query
    uses the term (and again after it changed)."""

    def __init__(self) -> None:
        self.lists: dict[str, tuple[array, array]] = {}
        self.arrays: dict[str, tuple[np.ndarray, np.ndarray]] = {}

    def add(self, row: int, counts: dict[str, float]) -> None:
        """Row `row` holds these terms this many times."""
        for term, tf in counts.items():
            entry = self.lists.get(term)
            if entry is None:
                entry = self.lists[term] = (array("i"), array("f"))
            entry[0].append(row)
            entry[1].append(tf)
            self.arrays.pop(term, None)

    def get(self, term: str) -> tuple[np.ndarray, np.ndarray] | None:
        """The rows holding `term` and how often each holds it (None: no row does)."""
        found = self.arrays.get(term)
        if found is None:
            entry = self.lists.get(term)
            if entry is None:
                return None
            # A copy, not a view: a view would pin the array, and the next row could not grow it.
            found = self.arrays[term] = (np.array(entry[0], dtype=np.int64),
                                         np.array(entry[1], dtype=np.float64))
        return found
