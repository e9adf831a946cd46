"""Per-table change counters, for caches of what is read every turn.

Migration m004's SQL triggers bump a counter on every insert, update or delete of its tables,
whoever writes (a route, a job, an import, a direct SQL fix): `lore`, `characters`, `memories`,
`chats` (with `chat_members`); m006's: `summaries` (the summaries and the sessions' own
summaries). A cache keyed by the counters of the tables it read is never
stale, and — unlike `db.generation`, which every write moves — it survives the writes every
turn makes to other tables (messages, statistics, jobs).

Owns: generations.
"""

from __future__ import annotations

from ..services import Services


def _all(svc: Services) -> dict[str, int]:
    # One small read per committed write anywhere (db.generation), shared by every caller.
    return svc.cached("change_counters", svc.db.generation, lambda: dict(
        svc.db.reader().execute("SELECT name, n FROM generations").fetchall()), size=4)


def counter(svc: Services, name: str) -> int:
    """The change counter of one table family ('lore', 'characters', 'memories', 'chats',
    'summaries')."""
    return _all(svc)[name]


def counters(svc: Services, *names: str) -> tuple[int, ...]:
    """Several counters at once, as a cache key."""
    values = _all(svc)
    return tuple(values[name] for name in names)
