"""Time, in one place, so tests can move it (the 7-day `recent` edge, session gaps, job leases)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone


def to_iso(moment: datetime) -> str:
    """ISO 8601 UTC with microseconds and a Z: fixed width, so text order is time order."""
    return moment.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_iso(text: str) -> datetime:
    """Parse what to_iso wrote (and other ISO 8601 forms with an offset or Z)."""
    moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return moment.astimezone(timezone.utc)


class Clock:
    """The real clock."""

    def now(self) -> datetime:
        return datetime.now(timezone.utc)

    def iso(self) -> str:
        return to_iso(self.now())


class FakeClock(Clock):
    """A clock for tests: starts at a fixed moment, moves only by `tick` per reading and when told.

    The tick (default 1 ms) keeps "newest first" orderings strict and deterministic.
    """

    def __init__(self, start: datetime | None = None, tick: timedelta = timedelta(milliseconds=1)) -> None:
        self._now = start or datetime(2026, 1, 1, tzinfo=timezone.utc)
        self.tick = tick

    def now(self) -> datetime:
        current = self._now
        self._now += self.tick
        return current

    def advance(self, **delta: float) -> None:
        self._now += timedelta(**delta)

    def set(self, moment: datetime) -> None:
        self._now = moment
