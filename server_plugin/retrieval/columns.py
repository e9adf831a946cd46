"""Compact columns of the in-memory search index (live_index.py): codes for repeated values (rows'
days among them, `DayCodes`), the BM25 term postings, and the candidate masks kept between
searches (`Masks`).

A campaign of 100,000 messages holds about two million postings. Kept as Python lists of ints and
floats they cost about 70 bytes each (an object per number and a pointer to it); kept in typed
arrays (`array.array`: 4-byte rows, 4-byte counts) they cost 8, and turn into numpy arrays with
one copy when a query uses the term.
"""

from __future__ import annotations

from array import array
from collections import OrderedDict
from datetime import date, datetime
from typing import Any, Callable, Hashable, Iterator

import numpy as np


# The numpy pairs kept for the terms queries used: a common word of a campaign has tens of
# thousands of rows (16 bytes each), so they are bounded by bytes.
ARRAYS_BYTES = 32 * 2 ** 20
# Candidate masks kept (a byte a row each): a store's routes ask for few (viewer, chats, kinds).
MASKS_KEPT = 16


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


def day_of(created_at: str | None) -> float:
    """The date ordinal of a row's `created_at` (NaN where it is not an ISO date)."""
    try:
        moment = datetime.fromisoformat((created_at or "").replace("Z", "+00:00"))
    except ValueError:
        return np.nan
    return float(date(moment.year, moment.month, moment.day).toordinal())


class DayCodes(Codes):
    """Codes of rows' days (date ordinals); an undated row's NaN has none (-1)."""

    def __call__(self, value: Any) -> int:
        return super().__call__(None if value != value else value)


class Postings:
    """term -> (rows, counts). A fresh index's postings are loaded in bulk into two flat arrays,
    sorted by term (`load`); rows appended after go to small typed arrays per term (`add`). A
    query's term becomes one numpy pair, kept until a row holding the term is added."""

    def __init__(self) -> None:
        self.lists: dict[str, tuple[array, array]] = {}  # appended since the load
        self.arrays: dict[str, tuple[np.ndarray, np.ndarray]] = {}  # the terms queries used
        self._spans: dict[str, tuple[int, int]] = {}  # term -> its slice of the loaded arrays
        self._rows = np.zeros(0, dtype=np.int32)
        self._tfs = np.zeros(0, dtype=np.float32)
        self._held = 0  # bytes in `arrays` added since it was last cleared

    def terms(self) -> set[str]:
        """Every term some row holds."""
        return set(self._spans) | set(self.lists)

    def add(self, row: int, counts: dict[str, float]) -> None:
        """Row `row` holds these terms this many times."""
        for term, tf in counts.items():
            entry = self.lists.get(term)
            if entry is None:
                entry = self.lists[term] = (array("i"), array("f"))
            entry[0].append(row)
            entry[1].append(tf)
            self.arrays.pop(term, None)

    def load(self, counts: list[dict[str, float]]) -> None:
        """The terms of rows 0, 1, … of a fresh index at once: the same postings as `add` row by
        row, from one flat pass (a restart of a campaign of 100,000 messages reads about two
        million postings; appending them one by one took most of the start-up)."""
        loader = PostingsLoader()
        loader.add(0, counts)
        loader.into(self)

    def load_flat(self, names: list[str], tid: np.ndarray, rows: np.ndarray, tfs: np.ndarray) -> None:
        """Postings given flat (term number into `names`, row, count), rows ascending within each
        term's entries as they come: what `load` makes, for a loader that reads in batches."""
        if self._spans or self.lists:
            raise ValueError("load fills an empty index; add appends to one")
        order = np.argsort(tid, kind="stable")  # stable: each term's rows stay in row order
        self._rows, self._tfs = rows[order].astype(np.int32), tfs[order].astype(np.float32)
        bounds = np.searchsorted(tid[order], np.arange(len(names) + 1)).tolist()
        self._spans = {t: (bounds[i], bounds[i + 1]) for i, t in enumerate(names)}

    def get(self, term: str) -> tuple[np.ndarray, np.ndarray] | None:
        """The rows holding `term` and how often each holds it (None: no row does)."""
        found = self.arrays.get(term)
        if found is None:
            span, tail = self._spans.get(term), self.lists.get(term)
            if span is None and tail is None:
                return None
            rows, tfs = [], []
            if span is not None:
                rows.append(self._rows[span[0]:span[1]])
                tfs.append(self._tfs[span[0]:span[1]])
            if tail is not None:  # copies: a view would pin the array, and the next row could not grow it
                rows.append(np.array(tail[0], dtype=np.int32))
                tfs.append(np.array(tail[1], dtype=np.float32))
            found = (np.concatenate(rows).astype(np.int64), np.concatenate(tfs).astype(np.float64))
            if self._held > ARRAYS_BYTES:  # a bound, not an LRU: a query's terms are made again
                self.arrays.clear()
                self._held = 0
            self.arrays[term] = found
            self._held += found[0].nbytes + found[1].nbytes
        return found


class PostingsLoader:
    """The postings of a fresh index's rows, batch by batch, kept as compact arrays until they
    are loaded into a `Postings` at once (live_bulk.py reads a campaign 8,192 rows at a time)."""

    def __init__(self) -> None:
        self.ids: dict[str, int] = {}
        self.parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        self.rows = 0  # rows 0 … rows - 1 added

    def add(self, first: int, counts: list[dict[str, float]]) -> np.ndarray:
        """The term counts of rows first, first + 1, …; returns each row's length (its counts'
        sum, added in order as `sum` does)."""
        flat: list[str] = []
        tfs: list[float] = []
        for c in counts:
            flat.extend(c)
            tfs.extend(c.values())
        ids = self.ids
        # New terms numbered in the order they first come, then every term looked up in C: a
        # campaign of 100,000 messages has two million postings, and a Python step each cost ~1 s.
        new = [t for t in dict.fromkeys(flat) if t not in ids]
        ids.update(zip(new, range(len(ids), len(ids) + len(new))))
        tid = np.fromiter(map(ids.__getitem__, flat), np.int64, len(flat))
        local = np.repeat(np.arange(len(counts)), np.fromiter(map(len, counts), np.int64, len(counts)))
        weights = np.asarray(tfs, dtype=np.float64)
        self.parts.append((tid, (local + first).astype(np.int32), weights.astype(np.float32)))
        self.rows = max(self.rows, first + len(counts))
        return np.bincount(local, weights=weights, minlength=len(counts))

    def into(self, postings: Postings) -> RowTerms:
        """Load every batch added into the empty `postings`; returns the rows' terms."""
        if not self.parts:
            return RowTerms()
        tid, rows, tfs = (np.concatenate(p) for p in zip(*self.parts))
        names = list(self.ids)
        postings.load_flat(names, tid, rows, tfs)
        self.parts = []
        return RowTerms(names, tid.astype(np.int32), np.searchsorted(rows, np.arange(self.rows + 1)))


class RowTerms:
    """Each row's terms, in the order its counts hold them (what a changed row drops from the
    spread cache). A fresh index's rows are term numbers into the loaded names (4 bytes a term,
    against a tuple of interned words: tens of MB at 100,000 messages, and ~0.4 s of the build);
    rows appended after are tuples."""

    def __init__(self, names: list[str] | None = None, tid: np.ndarray | None = None,
                 starts: np.ndarray | None = None) -> None:
        self.names = names or []
        self.tid = np.zeros(0, np.int32) if tid is None else tid
        # row i's terms: tid[starts[i]:starts[i + 1]]
        self.starts = np.zeros(1, np.int64) if starts is None else starts
        self.loaded = len(self.starts) - 1
        self.tail: list[tuple[str, ...]] = []

    def append(self, terms: tuple[str, ...]) -> None:
        """The next row's terms."""
        self.tail.append(terms)

    def __len__(self) -> int:
        return self.loaded + len(self.tail)

    def __getitem__(self, row: int) -> tuple[str, ...]:
        if not 0 <= row < len(self):
            raise IndexError(row)
        if row >= self.loaded:
            return self.tail[row - self.loaded]
        names = self.names
        return tuple(names[t] for t in self.tid[self.starts[row]:self.starts[row + 1]].tolist())

    def __iter__(self) -> Iterator[tuple[str, ...]]:
        return (self[row] for row in range(len(self)))


class Masks:
    """The candidate masks of recent searches, by (viewer, scopes, chats, kinds), kept current.

    Who may know each row (visibility.row_mask: a test per distinct witness set, then a pass over
    every row) took about 4 ms of a context call at 100,000 messages, the same answer every turn.
    Rows are only ever appended or killed (live_index.LiveIndex), so a kept mask is extended by
    the rows appended since it was made and a killed row is cleared in every kept mask: never
    stale, and never made again in full.
    """

    def __init__(self) -> None:
        self._kept: OrderedDict[Hashable, np.ndarray] = OrderedDict()

    def get(self, key: Hashable, n: int, make: Callable[[int, int], np.ndarray]) -> np.ndarray:
        """The mask of rows 0…n-1 for `key` (a copy the caller may change); `make(lo, n)` gives
        the mask of rows lo…n-1."""
        mask = self._kept.pop(key, None)
        if mask is None or len(mask) > n:
            mask = make(0, n)
        elif len(mask) < n:
            mask = np.concatenate([mask, make(len(mask), n)])
        self._kept[key] = mask
        while len(self._kept) > MASKS_KEPT:
            self._kept.popitem(last=False)
        return mask.copy()

    def kill(self, row: int) -> None:
        """Row `row` died: no kept mask holds it any more."""
        for mask in self._kept.values():
            if row < len(mask):
                mask[row] = False
