"""Requests first: background work steps aside while the API is answering.

The job worker and the search index's upkeep run in the sidecar's own process, beside the
requests, on machines with two cores. A job doing Python work beside a request takes half of the
interpreter's time from it: while a backlog of summary jobs drained, `POST /v1/context` took
115 ms at the median (257 ms p95) against 29 ms on an idle sidecar. So the API counts the requests in flight (`serving`), and background work
calls `step_aside` between its steps — before each job and between its own steps, before each
chunk of texts it embeds —
which waits while any request is in flight, at most `max_wait` seconds (a steady stream of
requests must not starve the jobs). Within a step, with `yield_calls`, it also pauses at each call
into the sidecar's own code while a request is in flight (`_yield_call`), at most as long again
per step. A thread holding something a request may wait for — the write lock, one of the locks
made here (`Lock`), the embedder's turn (`holding`) — never waits.

Process-wide on purpose: what is shared is the machine's CPU, whichever app a request is for.
"""

from __future__ import annotations

import sys
import threading
import time
from contextlib import contextmanager
from typing import Any, Iterator

_cond = threading.Condition()
_in_flight = 0
_thread = threading.local()
OWN_CODE = "server_plugin."  # a background thread pauses only at a call into one of these modules


@contextmanager
def serving() -> Iterator[None]:
    """Count one request in flight for as long as it is being answered."""
    global _in_flight
    with _cond:
        _in_flight += 1
    try:
        yield
    finally:
        with _cond:
            _in_flight -= 1
            if not _in_flight:
                _cond.notify_all()


@contextmanager
def holding() -> Iterator[None]:
    """Mark this thread as holding something a request may wait for (the store's write lock in
    db.Database.write, the embedder's turn): it never waits for requests meanwhile."""
    _thread.holding = getattr(_thread, "holding", 0) + 1
    try:
        yield
    finally:
        _thread.holding -= 1


writing = holding  # the store's write lock (db.Database.write)


def is_holding() -> bool:
    """Whether this thread holds something a request may wait for."""
    return getattr(_thread, "holding", 0) > 0


class Lock:
    """A lock (re-entrant with `reentrant`) whose holder counts as `holding`: a background thread
    paused while it held a lock a request then waited for would hold up that request. The
    sidecar's locks are these (tests/test_architecture.py); those of core/ guard built-in
    operations only, during which no Python call is made and so no pause."""

    def __init__(self, reentrant: bool = False) -> None:
        self._lock = threading.RLock() if reentrant else threading.Lock()

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        got = self._lock.acquire(blocking, timeout)
        if got:
            _thread.holding = getattr(_thread, "holding", 0) + 1
        return got

    def release(self) -> None:
        _thread.holding -= 1
        self._lock.release()

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc: Any) -> None:
        self.release()


@contextmanager
def background(yield_calls: bool = False) -> Iterator[None]:
    """Mark this thread as background work (the job worker, the search index's upkeep): its
    embeddings go in chunks, after any request's (embeddings.Embedder).

    With `yield_calls`, while a request is in flight the thread also pauses at its calls into the
    sidecar's own code (`_yield_call`) until no request is in flight: stepping aside between a
    job's steps still left the step itself sharing the interpreter (and the two cores) with the
    request (a context call took 1.6-2x its idle time during a backlog). Those pauses are bounded
    per step: `step_aside` gives each step its `max_wait` to pause for (none before the first)."""
    before = getattr(_thread, "background", False)
    _thread.background = True
    _thread.pause_left = 0.0
    tracing = yield_calls and sys.gettrace() is None  # never displace a debugger's or coverage's tracer
    if tracing:
        sys.settrace(_yield_call)
    try:
        yield
    finally:
        if tracing:
            sys.settrace(None)
        _thread.background = before


def _yield_call(frame: Any, event: str, arg: Any) -> None:
    """sys.settrace's hook on a background thread: called at each Python function call (returning
    None traces no lines). While a request is in flight, at a call into the sidecar's own code
    (not priority's), holding nothing a request may wait for, the thread waits until no request
    is in flight, within what is left of its step's pause budget. `time.sleep(0)` alone (before)
    handed the interpreter over for a moment only: this thread took it back at once, and ran on
    the other core in its SQLite and tokenizer calls. Third-party code is never paused in (it
    may hold its own locks: logging's, an import's); a lock this thread holds is released at
    full speed, so a request waiting for it waits least."""
    if _in_flight and not getattr(_thread, "holding", 0) and getattr(_thread, "pause_left", 0.0) > 0:
        module = frame.f_globals.get("__name__", "")
        if module.startswith(OWN_CODE) and module != __name__:
            _pause()
    return None


def _wait_while_serving(most: float) -> float:
    """Wait while any request is in flight, at most `most` seconds; returns the seconds waited."""
    started = time.monotonic()
    deadline = started + most
    with _cond:
        while _in_flight:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            _cond.wait(left)
    return time.monotonic() - started


def _pause() -> None:
    """Wait while requests are in flight, at most the step's pause budget (`pause_left`)."""
    _thread.pause_left = max(0.0, _thread.pause_left - _wait_while_serving(_thread.pause_left))


def is_background() -> bool:
    """Whether this thread is background work."""
    return getattr(_thread, "background", False)


def in_flight() -> int:
    """Requests being answered now."""
    return _in_flight


def step_aside(max_wait: float) -> float:
    """Wait while requests are in flight, at most `max_wait` s; returns the seconds waited.

    It goes on when it finds no request in flight, not on every moment between two: a turn is a
    burst (the messages' sync, then the context call right after it), and a job started in the gap
    would compete with the context call. The bound keeps a steady stream from starving the jobs.
    The step that follows may pause at its own calls for up to `max_wait` more (`_yield_call`)."""
    if max_wait <= 0 or not is_background() or is_holding():
        return 0.0  # a request (or a script) never waits for requests, itself among them
    _thread.pause_left = max_wait
    return _wait_while_serving(max_wait)
