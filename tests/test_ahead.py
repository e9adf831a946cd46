"""The next turn's context assembled ahead at a prefetch (story/ahead.py, rule OP10): the context
call takes it only when it is the answer it would assemble itself, and still records its turn."""

from __future__ import annotations

import threading
import time

from server_plugin.retrieval import live_index
from server_plugin.retrieval import prefetch as prefetcher
from server_plugin.story import ahead, context
from tests.helpers.api import expect_ok
from tests.test_prefetch import ACTION, setup_chat


def context_body(text: str, tokens: int = 4096) -> dict:
    return {"chat_id": "solo", "speaker_id": "mira.png", "context_tokens": tokens,
            "last_action": {"text": text, "kind": "action"}}


def ask(api, body: dict) -> tuple[dict, bool]:
    """One context call: its answer, and whether it was assembled ahead (Server-Timing)."""
    response = api.post("/v1/context", json=body)
    out = expect_ok(response, 200, "context.response")
    return out, "ahead" in response.headers["Server-Timing"]


def index_settled(services) -> None:
    state = live_index.state_of(services)
    deadline = time.monotonic() + 30
    while not state.analysed and time.monotonic() < deadline:
        time.sleep(0.01)


def prefetched(api, services, text: str) -> None:
    """Prefetch `text` and wait until its turn is assembled ahead. First, the search index's
    thread must be done with its one write after start-up (a new store's BM25 terms checked,
    `SearchState.reanalyse`): a write after the assembly began rightly voids it."""
    index_settled(services)
    expect_ok(api.post("/v1/context/prefetch", json={"chat_id": "solo", "text": text}), 202)
    box, deadline = ahead.of(services), time.monotonic() + 30
    while box._prepared is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert box._prepared is not None


def turn_number(services) -> int:
    row = services.db.reader().execute("SELECT turn FROM context_turns WHERE chat_id='solo'").fetchone()
    return row["turn"] if row else 0


def test_a_turn_assembled_ahead_is_the_answer_the_call_would_assemble_and_is_still_recorded(api, services):
    setup_chat(api)
    _, made_ahead = ask(api, context_body(ACTION + " (first)"))
    assert not made_ahead  # nothing to guess from before the chat's first call
    counted = turn_number(services)
    text = ACTION + " (typed, then sent)"
    prefetched(api, services, text)
    fresh = context.prepare(services, context.Turn.from_request(context_body(text))).result  # writes nothing
    out, made_ahead = ask(api, context_body(text))
    assert made_ahead
    assert out == fresh
    assert turn_number(services) == counted + 1  # the turn was counted by the call itself


def test_a_write_after_the_assembly_makes_the_call_assemble_afresh(api, services):
    """A memory saved between the prefetch and the call is in the answer: nothing stale is taken."""
    setup_chat(api)
    ask(api, context_body(ACTION + " (first)"))
    text = ACTION + " (a memory saved meanwhile)"
    prefetched(api, services, text)
    expect_ok(api.post("/v1/memories", json={"text": "Kelmar's ledger is hidden under the mill.",
                                             "scope": "global", "actor": "user", "pinned": True}), 201)
    out, made_ahead = ask(api, context_body(text))
    assert not made_ahead
    assert "hidden under the mill" in str(out["blocks"])


def test_a_request_other_than_the_guess_is_assembled_afresh(api, services):
    setup_chat(api)
    ask(api, context_body(ACTION + " (first)"))
    text = ACTION + " (sent with another budget)"
    prefetched(api, services, text)
    out, made_ahead = ask(api, context_body(text, tokens=2048))
    assert not made_ahead
    assert out["report"]["context_tokens"] == 2048
    prefetched(api, services, ACTION + " (typed)")
    _, made_ahead = ask(api, context_body(ACTION + " (typed, then changed)"))
    assert not made_ahead


def test_an_answer_assembled_ahead_is_given_once(api, services):
    setup_chat(api)
    ask(api, context_body(ACTION + " (first)"))
    text = ACTION + " (asked twice)"
    prefetched(api, services, text)
    first, made_ahead = ask(api, context_body(text))
    assert made_ahead
    second, made_ahead = ask(api, context_body(text))
    assert not made_ahead and second == first  # the same action asked again: the same answer


def test_a_call_during_the_assembly_waits_for_it_instead_of_assembling_beside_it(api, services, monkeypatch):
    setup_chat(api)
    ask(api, context_body(ACTION + " (first)"))
    real = context.prepare
    calls: list[str] = []

    def slow(svc, turn):
        calls.append(turn.last_action.text)
        time.sleep(0.3)
        return real(svc, turn)

    monkeypatch.setattr(context, "prepare", slow)
    index_settled(services)
    text = ACTION + " (sent at once)"
    expect_ok(api.post("/v1/context/prefetch", json={"chat_id": "solo", "text": text}), 202)
    deadline = time.monotonic() + 30
    while not calls and time.monotonic() < deadline:
        time.sleep(0.005)
    _, made_ahead = ask(api, context_body(text))
    assert made_ahead and calls == [text]


def test_a_replaced_offer_is_told_and_the_same_text_keeps_its_follow_up(services, monkeypatch):
    """Every follow-up is called once: False when a newer text replaced it before it ran."""
    gate = threading.Event()
    real = prefetcher.bank.query_vector_soon

    def held(*args, **kwargs):
        gate.wait(30)
        return real(*args, **kwargs)

    monkeypatch.setattr(prefetcher.bank, "query_vector_soon", held)
    told: list[tuple[str, bool]] = []
    done = threading.Event()
    one = prefetcher.Prefetcher(services)
    one.offer("solo", "running first", lambda ran: told.append(("first", ran)))
    time.sleep(0.05)  # the thread took the first text and waits at the gate
    one.offer("solo", "second", lambda ran: told.append(("second", ran)))
    one.offer("solo", "second")  # the same text again, without a follow-up: the pending one stays
    assert told == []
    one.offer("solo", "third", lambda ran: told.append(("third", ran)))
    assert told == [("second", False)]
    one.offer("solo", "fourth", lambda ran: (told.append(("fourth", ran)), done.set()))
    assert told == [("second", False), ("third", False)]
    gate.set()
    assert done.wait(30)
    assert told == [("second", False), ("third", False), ("first", True), ("fourth", True)]


def test_a_dry_run_records_nothing_and_the_same_request_then_takes_its_answer(api, services):
    """`dry_run`: asked as a generation starts; the call that follows records the turn."""
    setup_chat(api)
    ask(api, context_body(ACTION + " (first)"))
    counted = turn_number(services)
    text = ACTION + " (asked early)"
    index_settled(services)
    dry, _ = ask(api, {**context_body(text, tokens=3000), "dry_run": True})
    assert turn_number(services) == counted  # nothing recorded
    chat_row = expect_ok(api.get("/v1/chats/solo"), 200)["chat"]
    assert chat_row["context_tokens"] != 3000  # not even the context size
    out, made_ahead = ask(api, context_body(text, tokens=3000))
    assert made_ahead and out == dry
    assert turn_number(services) == counted + 1
    assert expect_ok(api.get("/v1/chats/solo"), 200)["chat"]["context_tokens"] == 3000


def test_a_dry_run_followed_by_a_write_is_not_taken(api, services):
    setup_chat(api)
    ask(api, context_body(ACTION + " (first)"))
    text = ACTION + " (asked early, then a memory saved)"
    index_settled(services)
    ask(api, {**context_body(text), "dry_run": True})
    expect_ok(api.post("/v1/memories", json={"text": "Kelmar's ledger is hidden under the mill.",
                                             "scope": "global", "actor": "user", "pinned": True}), 201)
    out, made_ahead = ask(api, context_body(text))
    assert not made_ahead
    assert "hidden under the mill" in str(out["blocks"])


def test_health_lists_dry_runs_so_the_extension_asks_early(api):
    health = expect_ok(api.get("/v1/health"), 200, "health.response")
    assert "context_dry_run" in health["capabilities"]
