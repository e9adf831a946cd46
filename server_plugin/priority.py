"""Requests first: background work steps aside while the API is answering.

The job worker and the search index's upkeep run in the sidecar's own process, beside the
requests, on machines with two cores. A job doing Python work beside a request takes half of the
interpreter's time from it: while a backlog of summary jobs drained, `POST /v1/context` took
115 ms at the median (257 ms p95) against 29 ms on an idle sidecar. So the API counts the requests in flight (`serving`), and background work
calls `step_aside` between its steps — before each job and between its own steps, before each
chunk of texts it embeds —
which waits while any request is in flight, at most `max_wait` seconds (a steady stream of
requests must not starve the jobs). A thread holding the write lock never waits here: a request
may be waiting for that lock.

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
def writing() -> Iterator[None]:
    """Mark this thread as holding the store's write lock (db.Database.write)."""
    _thread.writing = getattr(_thread, "writing", 0) + 1
    try:
        yield
    finally:
        _thread.writing -= 1


@contextmanager
def background(yield_calls: bool = False) -> Iterator[None]:
    """Mark this thread as background work (the job worker, the search index's upkeep): its
    embeddings go in chunks, after any request's (embeddings.Embedder).

    With `yield_calls`, while a request is in flight the thread also hands the interpreter over
    at every Python function call it makes (`_yield_call`): stepping aside between a job's steps
    still leaves the step itself sharing the interpreter with the request, about half of it each
    (a context call took 2x its idle time during a backlog)."""
    before = getattr(_thread, "background", False)
    _thread.background = True
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
    None traces no lines). While a request is in flight it gives the interpreter up with
    `time.sleep(0)`: the request's thread takes it at once, and this thread gets it back when that
    one next lets go (its next SQLite or torch call, or the switch interval). It never waits on
    anything, so a lock this thread holds is never held for long: a request blocked on that lock
    is not running Python, and this thread then runs at full speed."""
    if _in_flight:
        time.sleep(0)
    return None


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
    would compete with the context call. The bound keeps a steady stream from starving the jobs."""
    if max_wait <= 0 or not is_background() or getattr(_thread, "writing", 0):
        return 0.0  # a request (or a script) never waits for requests, itself among them
    started = time.monotonic()
    deadline = started + max_wait
    with _cond:
        while _in_flight:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            _cond.wait(left)
    return time.monotonic() - started
