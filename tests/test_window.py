"""The live window (rule RV2): min(10,000 tokens, 25% of the context) and at most 50 messages,
at its boundaries; it never grows with a bigger model; the chat remembers its context size."""

from __future__ import annotations

import pytest

from server_plugin.core import window
from server_plugin.settings import defaults
from server_plugin.story import chats, summaries
from tests.helpers.conversation import post, setup_chat

SHIPPED = defaults()
LIMITS = {"max_tokens": SHIPPED.live_window_max_tokens, "percent": SHIPPED.live_window_percent}


def budget(context_tokens: int, **given: float) -> int:
    """window.budget with the shipped settings (the numbers RV2 names); `given` replaces some."""
    return window.budget(context_tokens, **{**LIMITS, **given})


def size(newest_first: list[int], context_tokens: int, **given: float) -> int:
    """window.size with the shipped settings; `given` replaces some."""
    return window.size(newest_first, context_tokens,
                       **{**LIMITS, "max_messages": SHIPPED.live_window_max_messages, **given})


@pytest.mark.parametrize("context,expected", [
    (8192, 2048),  # 25% of a small model
    (39_996, 9_999),  # 25% just under the cap
    (40_000, 10_000),  # 25% exactly the cap
    (40_004, 10_000),  # the cap wins from here on
    (128_000, 10_000),
    (2_000_000, 10_000),  # a huge model does not grow it
])
def test_rv2_budget_is_min_of_cap_and_quarter(context, expected):
    """rule RV2: the window's tokens are min(10,000, 25% of the model's context)."""
    assert budget(context) == expected


def test_rv2_message_cap_of_50():
    """rule RV2: at most 50 messages, however much room the tokens leave."""
    assert size([10] * 80, 128_000) == 50
    assert size([200] * 80, 128_000) == 50  # 50 x 200 = 10,000: exactly full, 50 messages
    assert size([201] * 80, 128_000) == 49  # the 50th would make 10,050


@pytest.mark.parametrize("tokens,context,expected", [
    ([1024, 1024, 1], 8192, 2),  # 2,048 exactly fits; one more token does not
    ([1024, 1025], 8192, 1),
    ([5000, 5000, 1], 128_000, 2),  # 10,000 exactly: the token cap is a boundary too
    ([5000, 5001], 128_000, 1),
    ([3000, 3000, 3000, 3000], 40_000, 3),  # 10,000 vs 25% of 40,000 = 10,000
])
def test_rv2_token_boundaries(tokens, context, expected):
    """rule RV2: messages are taken newest first while the total stays within the budget."""
    assert size(tokens, context) == expected


def test_rv2_window_never_grows_with_a_bigger_model():
    """rule RV2: beyond 40,000 tokens of context, the window is the same for every model."""
    counts = [150] * 200
    sizes = {size(counts, ctx) for ctx in (40_000, 64_000, 128_000, 1_000_000)}
    assert sizes == {50}
    assert size([400] * 200, 40_000) == size([400] * 200, 1_000_000) == 25


def test_rv2_newest_message_is_always_live():
    """A single message larger than the budget still stays live (it is the turn being answered)."""
    assert size([50_000, 10], 8192) == 1
    assert size([], 8192) == 0


def test_rv2_settings_change_the_three_numbers():
    assert budget(10_000, max_tokens=1_000, percent=50) == 1_000
    assert budget(1_000, max_tokens=1_000, percent=50) == 500
    assert size([10] * 10, 100_000, max_messages=3) == 3


@pytest.fixture
def overrides():
    return {"live_window_max_messages": 50, "default_context_tokens": 4096}


def test_rv2_live_window_uses_the_chats_remembered_context(api, services):
    """rule RV2: the window of a chat is computed for the context size it was last assembled for,
    else the default; an explicit size wins. Messages come oldest first."""
    setup_chat(api)
    text = "word " * 99  # about 100 tokens each
    post(api, [{"id": f"m{i}", "role": "user", "text": text.strip()} for i in range(60)])
    per = services.tokens.count(text.strip())
    default_live = summaries.live_window(services, "c1")
    assert len(default_live) == 1024 // per  # 25% of the default 4,096
    assert [m["id"] for m in default_live] == [f"m{i}" for i in range(60 - len(default_live), 60)]
    api.put("/v1/chats/c1", json={"context_tokens": 16_384})
    assert len(summaries.live_window(services, "c1")) == 4096 // per
    assert len(summaries.live_window(services, "c1", context_tokens=2048)) == 512 // per


def test_rv2_remembered_context_is_written_only_when_it_changes(api, services):
    """The assembler records each turn's context size; an unchanged size writes nothing."""
    setup_chat(api)
    assert chats.remember_context_tokens(services, "c1", 32_768) is True
    generation = services.db.generation
    assert chats.remember_context_tokens(services, "c1", 32_768) is False
    assert services.db.generation == generation
    assert api.get("/v1/chats/c1").get_json()["chat"]["context_tokens"] == 32_768
    assert chats.remember_context_tokens(services, "nope", 8192) is False
