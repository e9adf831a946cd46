"""Where the query's embedding runs: on CPUs of its own, apart from the thread that waits for it.

A context call hands the player's action to search's pool of embedding threads and reads the
rest of the turn on its own thread meanwhile (the story, BM25, the priors). Linux may wake the
pool's thread on the CPU of the thread that woke it rather than on an idle one; on the virtual
machines measured here it did, and the two shared that CPU until the scheduler's next balancing,
a tick later (~4 ms at 250 Hz), in a turn of 20-30 ms. At campaign size the waiting thread has
that much work of its own, and the turn pays. Over HTTP, placed against not in one session
(bench/README.md): the context call p50 / p95 at 100,000 messages 30-31 / 33-37 ms against
33-34 / 37, at 10,000 (assemble_latency.py) 23-24 / 27-29 against 27 / 30-32.

So, with the setting `cpu_placement` "auto":
- the pool's threads keep to the upper half of the process's CPUs (`embedding`);
- the thread that hands the pool a text first leaves those CPUs (`leave`) and takes its own
  back once it has the vector or its request ends (`rejoin`): the wake-up goes to an idle CPU;
- so does a scan's second thread at campaign size (ranking/vectors.py, `in_halves`: the first
  pass and the exact pass over every row), which reads half the rows on the CPU the embedding
  has just left idle.

Nothing is placed with one CPU, where threads cannot be placed (macOS, Windows), where the CPUs
are not all of one kind (a phone's big and little cores, a laptop's performance and efficiency
cores: the half given to the pool could be the slow one), or on an ARM machine that does not say.
"""

from __future__ import annotations

import functools
import os
import platform
import threading
from pathlib import Path
from typing import AbstractSet, Hashable, Sequence

_thread = threading.local()  # saved: the CPUs before `leave`; embedding: placed as the pool's


def split(cpus: Sequence[int], kinds: Sequence[Hashable]) -> tuple[frozenset[int], frozenset[int]] | None:
    """(the CPUs a waiting thread keeps to, the embedding's CPUs) of `cpus`, each of the kind in
    `kinds` (None: unknown); None where nothing is to be placed: one CPU, or kinds that differ."""
    known = {kind for kind in kinds if kind is not None}
    if len(cpus) < 2 or len(known) > 1:
        return None
    ordered = sorted(cpus)
    waiting = (len(ordered) + 1) // 2
    return frozenset(ordered[:waiting]), frozenset(ordered[waiting:])


@functools.lru_cache(maxsize=1)
def halves() -> tuple[frozenset[int], frozenset[int]] | None:
    """`split` of the CPUs this process may use, taken at the first call (before any placing)."""
    if not hasattr(os, "sched_setaffinity"):
        return None
    cpus = sorted(os.sched_getaffinity(0))
    kinds = [_kind(cpu) for cpu in cpus]
    if all(kind is None for kind in kinds) and platform.machine().lower().startswith(("arm", "aarch")):
        return None  # an ARM machine that hides its cores' kinds may well have big and little ones
    return split(cpus, kinds)


def _kind(cpu: int) -> tuple[str | None, str | None] | None:
    """A CPU's capacity (ARM's big and little cores) and maximum frequency (Intel's performance
    and efficiency cores), as the kernel shows them; None where it shows neither (a virtual
    machine: its CPUs are taken as alike)."""
    base = Path(f"/sys/devices/system/cpu/cpu{cpu}")
    found = tuple(_read(base / name) for name in ("cpu_capacity", "cpufreq/cpuinfo_max_freq"))
    return None if found == (None, None) else found  # type: ignore[return-value]


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def embedding(setting: str) -> None:
    """On a thread of the embedding pool: keep to the embedding's CPUs (once a thread)."""
    if setting != "auto" or getattr(_thread, "embedding", False):
        return
    _thread.embedding = True
    split_cpus = halves()
    if split_cpus is not None:
        _place(split_cpus[1])


def leave(setting: str) -> bool:
    """On a thread about to hand the pool a text: off the embedding's CPUs until `rejoin`.
    Whether this call moved it (False: not placed, or off them already)."""
    if setting != "auto" or getattr(_thread, "saved", None) is not None \
            or getattr(_thread, "embedding", False):
        return False
    split_cpus = halves()
    if split_cpus is None:
        return False
    saved = os.sched_getaffinity(0)
    if _place(saved - split_cpus[1] or split_cpus[0]):
        _thread.saved = saved
        return True
    return False


def rejoin() -> None:
    """The calling thread's CPUs as they were before `leave` (nothing if it did not leave)."""
    saved = getattr(_thread, "saved", None)
    if saved is not None:
        _thread.saved = None
        _place(saved)


def _place(cpus: AbstractSet[int]) -> bool:
    try:
        os.sched_setaffinity(0, cpus)
        return True
    except OSError:  # a container may forbid it: the thread runs where the system puts it
        return False
