"""Requests first (rule OP4: the context call must stay fast while background jobs run): the API
counts the requests in flight and background work steps aside between its steps."""

from __future__ import annotations

import contextlib
import sys
import threading
import time

from server_plugin import priority
from server_plugin.app import _counted
from server_plugin.jobs import queue, worker


def test_background_work_waits_for_the_request_in_flight():
    """A background step waits until the request in flight is answered, then goes on."""
    done: list[str] = []
    entered, release = threading.Event(), threading.Event()

    def request() -> None:
        with priority.serving():
            entered.set()
            release.wait(10)
            done.append("request")

    def background_step() -> None:
        with priority.background():
            priority.step_aside(30)
        done.append("job step")

    answering = threading.Thread(target=request)
    answering.start()
    assert entered.wait(10)
    stepping = threading.Thread(target=background_step)
    stepping.start()
    stepping.join(0.3)
    assert done == [] and priority.in_flight() == 1  # still waiting for the request
    release.set()
    answering.join(10)
    stepping.join(10)
    assert done == ["request", "job step"] and priority.in_flight() == 0


def test_step_aside_is_bounded_and_never_waits_holding_the_write_lock(services):
    """A steady stream of requests cannot starve the jobs (the wait has a bound), and a thread
    holding the write lock never waits (a request may be waiting for that lock)."""
    with priority.serving(), priority.background():
        started = time.monotonic()
        waited = priority.step_aside(0.2)
        assert 0.15 <= waited and time.monotonic() - started < 5
        with services.db.write():
            assert priority.step_aside(30) == 0.0
        assert priority.step_aside(0) == 0.0


def test_a_request_or_a_script_never_steps_aside():
    """Only background work waits: a request running a job itself (or a script's run_pending)
    would otherwise wait for the request in flight that is its own."""
    with priority.serving():
        assert priority.step_aside(30) == 0.0


def test_the_app_counts_each_request_while_it_is_answered(app):
    """Every request through the app counts as in flight until its answer is ready."""
    seen: list[int] = []

    def inner(environ, start_response):
        seen.append(priority.in_flight())
        return [b"ok"]

    assert _counted(inner)({}, lambda *a: None) == [b"ok"]
    assert seen == [1] and priority.in_flight() == 0
    assert app.wsgi_app.__name__ == "counted"


def test_the_worker_and_background_embedding_step_aside_before_each_step(services, embedder, monkeypatch):
    """The job worker steps aside before each job, and background embedding before each chunk."""
    calls: list[float] = []
    monkeypatch.setattr(priority, "step_aside", lambda max_wait: calls.append(max_wait) or 0.0)
    with priority.background():
        embedder.embed([f"step aside text {i}" for i in range(2 * embedder.background_chunk)],
                       services.embed_wait())
    assert len(calls) == 2
    embedder.embed(["a request's own text is embedded at once"], services.embed_wait())
    assert len(calls) == 2
    thread = worker.Worker(services)
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while len(calls) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        thread.stop()
    assert calls[2] == float(services.settings.background_step_aside_seconds)


def test_a_model_job_steps_aside_around_its_model_run(api, services, monkeypatch):
    """Between a job's prompt, its model (or extractive) run and the storing of its result, the
    worker lets the requests in flight go first."""
    from tests.helpers.conversation import setup_chat, turns

    setup_chat(api)
    turns(api, 0, 4)
    assert api.post("/v1/chats/c1/sessions/end", json={}).status_code == 200
    calls: list[float] = []
    here = threading.current_thread()  # the search index's own thread may re-embed meanwhile

    def step_aside(max_wait: float) -> float:
        if threading.current_thread() is here:
            calls.append(max_wait)
        return 0.0

    monkeypatch.setattr(priority, "step_aside", step_aside)
    ran = []
    while (job_id := worker.run_one(services)) is not None:
        ran.append(queue.get(services, job_id))
    model_jobs = [j for j in ran if j["kind"] == "session_summary"]
    assert model_jobs and all(j["state"] == "done" for j in model_jobs)
    assert len(calls) == 2 * sum(bool(services.jobs.handler(j["kind"]).llm) for j in ran)


class _Calls:
    """A background thread that, after one step_aside, keeps calling a function of the sidecar's
    own code (or `call`) and counts its calls, until told to stop."""

    def __init__(self, budget: float = 30.0, call=None, around=None) -> None:
        from server_plugin.core import tokens

        self.count, self.budget = 0, budget
        self.call = call or (lambda: tokens._segments("a b\nc d"))
        self.around = around  # a context manager held around the calls (a lock)
        self.ready, self.stop, self.seen = threading.Event(), threading.Event(), {}
        self.thread = threading.Thread(target=self._work)

    def _work(self) -> None:
        with priority.background(yield_calls=True):
            self.seen["tracer"] = sys.gettrace()
            priority.step_aside(self.budget)  # no request yet: it returns at once, with a budget
            self.ready.set()
            with self.around or contextlib.nullcontext():
                while not self.stop.is_set():
                    self.call()
                    self.count += 1
        self.seen["after"] = sys.gettrace()

    def __enter__(self) -> "_Calls":
        self.thread.start()
        if not self.ready.wait(30):
            self.__exit__()
            raise AssertionError("the background thread did not start its calls")
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join(30)

    def moves(self, seconds: float = 0.3) -> bool:
        """Whether its count went on over the next `seconds` (by more than the one call it
        may have been in when a request came)."""
        before = self.count
        time.sleep(seconds)
        return self.count > before + 1


def test_background_work_pauses_at_its_own_calls_while_a_request_is_answered():
    """rule OP4: with yield_calls, a background thread pauses at its calls into the sidecar's own
    code while a request is in flight, and goes on once it is answered; its tracer is removed
    when it leaves, and a thread that is not background work is never traced."""
    with _Calls() as calls:
        assert calls.moves()  # no request: it runs
        with priority.serving():
            time.sleep(0.05)
            assert not calls.moves()  # a request in flight (any thread's counts): it waits
        assert calls.moves()
    assert calls.seen["tracer"] is priority._yield_call and calls.seen["after"] is None
    assert sys.gettrace() is not priority._yield_call  # this thread was never traced


def test_the_pauses_within_a_step_are_bounded_by_its_budget():
    """rule OP4: a steady stream of requests cannot starve a job's step: its pauses stop once
    they took the budget step_aside gave it (then it runs beside the requests)."""
    with priority.serving():
        with _Calls(budget=0.2) as calls:
            assert calls.moves(1.0)


def test_background_work_never_pauses_holding_a_lock_or_in_third_party_code(services):
    """rule OP4: a background thread holding the write lock, a sidecar lock (priority.Lock, which
    a request may be waiting for) or the embedder's turn runs on while a request is in flight, and
    so does one calling only third-party code (it may hold that code's own locks)."""
    import json

    for around, call in ((services.db.write(), None), (priority.Lock(), None), (priority.holding(), None),
                         (None, lambda: json.dumps({"a": [1]}))):
        with _Calls(around=around, call=call) as calls, priority.serving():
            assert calls.moves()


def test_a_priority_lock_marks_its_holder_as_holding():
    """While a thread holds a priority.Lock (re-entrant or not) it counts as holding: step_aside
    never waits then, and neither do the pauses at its calls."""
    for lock in (priority.Lock(), priority.Lock(reentrant=True)):
        assert not priority.is_holding()
        with lock:
            assert priority.is_holding()
            if lock._lock.__class__ is not threading.Lock().__class__:
                with lock:
                    assert priority.is_holding()
                assert priority.is_holding()
        assert not priority.is_holding()
    cond = threading.Condition(priority.Lock())  # the embedder's turns wait on one
    with cond:
        assert priority.is_holding() and not cond.wait(0.01)
    assert not priority.is_holding()
    with priority.serving(), priority.background(), priority.Lock():
        assert priority.step_aside(30) == 0.0


def test_the_worker_thread_yields_its_calls_unless_the_setting_says_not(services, monkeypatch):
    """The job worker runs under priority.background(yield_calls=background_yield_calls)."""
    asked: list[bool] = []
    real = priority.background
    monkeypatch.setattr(priority, "background", lambda yield_calls=False: (asked.append(yield_calls), real(yield_calls))[1])
    w = worker.Worker(services)
    w.start()
    try:
        for _ in range(100):
            if asked:
                break
            time.sleep(0.05)
    finally:
        w.stop()
    assert asked == [services.settings.background_yield_calls] == [True]
