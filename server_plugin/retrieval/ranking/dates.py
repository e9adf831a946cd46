"""Calendar dates a query names, and the prior of items dated in or just after them (SW6). Pure."""

from __future__ import annotations

import re
from datetime import date as _date
from typing import Sequence

import numpy as np

from ...core.text import MONTHS

# ---------------------------------------------------------------------------------------------
# Dates named in a query (a prior for items dated near them)

_MONTHS = {m.lower(): i for i, m in enumerate(MONTHS, start=1)}  # in calendar order: _MONTH_RE's order
_MONTH_RE = "(" + "|".join(_MONTHS) + "|" + "|".join(m[:3] for m in _MONTHS) + r")\.?"
_DAY_MONTH_YEAR = re.compile(rf"\b(\d{{1,2}})(?:st|nd|rd|th)?\s+(?:of\s+)?{_MONTH_RE},?\s+(\d{{4}})\b", re.I)
_MONTH_DAY_YEAR = re.compile(rf"\b{_MONTH_RE}\s+(\d{{1,2}})(?:st|nd|rd|th)?,?\s+(\d{{4}})\b", re.I)
_MONTH_YEAR = re.compile(rf"\b{_MONTH_RE},?\s+(\d{{4}})\b", re.I)
_YEAR = re.compile(r"\b(19\d\d|20\d\d)\b")
_ISO = re.compile(r"\b(\d{4})-(\d{2})-(\d{2})\b")


def _month(name: str) -> int:
    name = name.lower().rstrip(".")
    return _MONTHS.get(name) or next(i for m, i in _MONTHS.items() if m.startswith(name))


def _days(y: int, m: int, d: int) -> int | None:
    try:
        return _date(y, m, d).toordinal()
    except ValueError:
        return None


def query_dates(text: str) -> list[tuple[int, int]]:
    """Calendar spans a query names, as (first day, last day) ordinals.

    "March 16, 2022" and "16 March 2022" give that day, "October 2023" that month, a bare
    "2023" that year. Each span of text is read once, the most precise reading first.
    """
    spans: list[tuple[int, int]] = []
    taken: list[tuple[int, int]] = []

    def free(m: re.Match) -> bool:
        return all(m.end() <= a or m.start() >= b for a, b in taken)

    def add(m: re.Match, lo: int | None, hi: int | None) -> None:
        if lo is not None and hi is not None:
            spans.append((lo, hi))
            taken.append((m.start(), m.end()))

    for m in _ISO.finditer(text):
        d = _days(int(m.group(1)), int(m.group(2)), int(m.group(3)))
        add(m, d, d)
    for m in _DAY_MONTH_YEAR.finditer(text):
        if free(m):
            d = _days(int(m.group(3)), _month(m.group(2)), int(m.group(1)))
            add(m, d, d)
    for m in _MONTH_DAY_YEAR.finditer(text):
        if free(m):
            d = _days(int(m.group(3)), _month(m.group(1)), int(m.group(2)))
            add(m, d, d)
    for m in _MONTH_YEAR.finditer(text):
        if free(m):
            y, mo = int(m.group(2)), _month(m.group(1))
            last = _days(y + (mo == 12), mo % 12 + 1, 1)
            add(m, _days(y, mo, 1), None if last is None else last - 1)
    for m in _YEAR.finditer(text):
        if free(m):
            y = int(m.group(1))
            add(m, _days(y, 1, 1), _days(y, 12, 31))
    return spans


def date_prior(
    item_days: np.ndarray, spans: Sequence[tuple[int, int]], after: float, tau: float
) -> np.ndarray:
    """How well each item's date fits the spans a query names, in [0, 1] (NaN days give 0).

    People talk about an event in the days after it ("yesterday I went bowling"), so an item
    dated up to `after` days past a span counts as inside it; beyond, the fit decays with
    scale `tau` days (the settings search_date_after_days and search_date_tau_days). Wide spans
    (a year) are discounted by their width.
    """
    best = np.zeros(len(item_days), dtype=np.float64)
    known = np.isfinite(item_days)
    for lo, hi in spans:
        dist = np.maximum(lo - item_days, 0.0) + np.maximum(item_days - (hi + after), 0.0)
        fit = np.exp(-dist / tau) * min(1.0, 31.0 / (hi - lo + 1.0)) ** 0.5
        best = np.where(known, np.maximum(best, np.nan_to_num(fit)), best)
    return best


def coded_date_prior(codes: np.ndarray, table: np.ndarray, spans: Sequence[tuple[int, int]],
                     after: float, tau: float) -> np.ndarray:
    """`date_prior` of items whose days are given as codes into `table`, the distinct days (-1:
    undated). Items share few days (those the story was played on), so the fit is computed once
    a day and then read by every item: at 100,000 messages ~0.2 ms instead of ~2 ms."""
    fit = np.append(date_prior(table, spans, after, tau), 0.0)  # code -1 reads the 0 at the end
    return fit[codes]
