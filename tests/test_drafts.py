"""POST /v1/memories/drafts: drafts a person reviews before saving (RV9c generate memories,
RV9d save from conversation). Real model calls go to the fake OpenAI-compatible server."""

from __future__ import annotations

import json
from typing import Any, Iterator

import pytest

from tests.helpers.api import expect_error, expect_ok
from tests.helpers.fakellm import FakeLLM

AYLA = "ayla.png"


@pytest.fixture
def fake() -> Iterator[FakeLLM]:
    with FakeLLM() as llm:
        yield llm


def _api(request: pytest.FixtureRequest, overrides: dict, **values: Any):
    overrides.update(values)
    api = request.getfixturevalue("api")
    expect_ok(api.put(f"/v1/characters/{AYLA}", json={"name": "Ayla"}), 201)
    return api


@pytest.fixture
def extractive_api(request, overrides):
    return _api(request, overrides)


@pytest.fixture
def model_api(request, overrides, fake):
    return _api(request, overrides, llm_mode="openai", llm_url=fake.url, llm_model="fake-model",
                drafts_timeout_seconds=2.0)


def _messages(n: int) -> list[dict]:
    return [{"id": f"msg-{i}", "name": "Ann" if i % 2 else "Ayla", "role": "user" if i % 2 else "assistant",
             "text": f"Line {i}: Ann says she keeps bees behind the mill number {i}."} for i in range(1, n + 1)]


def _drafts(api, body: dict, status: int = 200) -> dict:
    return expect_ok(api.post("/v1/memories/drafts", json=body), status, "memory_drafts.response")


def test_rv9c_description_drafts_without_a_model(extractive_api):
    """rule RV9c: "generate memories" turns a person's description into drafts for the chosen
    character; with no model configured they come from the description itself, and say so."""
    out = _drafts(extractive_api, {"mode": "description", "character_id": AYLA,
                                   "description": "The traveller is called Ann. Ann is allergic to bee stings."})
    assert out["source"] == "extractive"
    assert "llm_mode extractive" in out["warning"]
    assert [d["text"] for d in out["drafts"]] == ["The traveller is called Ann.", "Ann is allergic to bee stings."]
    assert all(d["scope"] == "character" and d["character_id"] == AYLA for d in out["drafts"])


def test_rv9c_description_prompt_holds_only_the_description(model_api, fake):
    """rule RV9c: generate memories never reads the chat: the model sees the description and the
    character's name, nothing else; its answer becomes the drafts (global when no character)."""
    fake.script([json.dumps({"memories": [{"kind": "name", "text": "The traveller is called Ann."}]})])
    out = _drafts(model_api, {"mode": "description", "description": "Call the traveller Ann."})
    assert out == {"drafts": [{"text": "The traveller is called Ann.", "kind": "name", "scope": "global",
                               "character_id": None, "source_message_ids": []}],
                   "source": "model", "dropped": [], "warning": None}
    sent = fake.completions()[-1]["messages"]
    assert "Call the traveller Ann." in sent[-1]["content"]
    assert "<messages>" not in sent[-1]["content"]


def test_rv9c_description_over_1000_characters_is_refused(extractive_api):
    """rule RV9c: the description holds at most 1,000 characters."""
    expect_error(extractive_api.post("/v1/memories/drafts", json={"mode": "description", "description": "x" * 1001}),
                 400, "invalid_request")


def test_rv9d_model_drafts_cite_the_picked_messages(model_api, fake):
    """rule RV9d: "extract with the model" sends the picked messages and returns the model's
    drafts with the ids of the messages each came from (its m1/m2 labels mapped back)."""
    fake.script([json.dumps({"memories": [
        {"kind": "promise", "text": "Ayla promised Ann to wait at the old oak.", "messages": ["m1", "m2"]}]})])
    body = {"mode": "conversation", "character_id": AYLA, "messages": [
        {"id": "a-1", "name": "Ann", "role": "user", "text": "Promise me you will wait at the old oak."},
        {"id": "a-2", "name": "Ayla", "role": "assistant", "text": "I promise."}]}
    out = _drafts(model_api, body)
    assert out["source"] == "model" and out["warning"] is None
    assert out["drafts"] == [{"text": "Ayla promised Ann to wait at the old oak.", "kind": "promise",
                              "scope": "character", "character_id": AYLA, "source_message_ids": ["a-1", "a-2"]}]
    prompt = fake.completions()[-1]["messages"][-1]["content"]
    assert "[m1] Ann (player): Promise me you will wait at the old oak." in prompt


def test_rv9d_at_most_five_drafts_from_twenty_messages(extractive_api):
    """rule RV9d: up to 20 messages give at most 5 drafts; what was left out is listed."""
    out = _drafts(extractive_api, {"mode": "conversation", "character_id": AYLA, "messages": _messages(20)})
    assert len(out["drafts"]) == 5
    assert len(out["dropped"]) == 15 and all(d.startswith("over the limit of 5") for d in out["dropped"])
    assert all(len(d["text"]) <= 500 for d in out["drafts"])


def test_rv9d_twenty_one_messages_are_refused(extractive_api):
    """rule RV9d: a person may pick at most 20 messages; 21 is refused before any work."""
    expect_error(extractive_api.post("/v1/memories/drafts", json={"mode": "conversation", "messages": _messages(21)}),
                 400, "invalid_request")


def test_rv9d_the_setting_can_lower_the_message_limit(request, overrides):
    """rule RV9d: the limit is the setting save_from_conversation_max_messages (schema cap 20)."""
    api = _api(request, overrides, save_from_conversation_max_messages=3)
    body = expect_error(api.post("/v1/memories/drafts", json={"mode": "conversation", "messages": _messages(4)}),
                        422, "invalid_drafts_request")
    assert "at most 3" in body["error"]["message"]


@pytest.mark.parametrize("failure", ["http_500", "garbage", "slow"])
def test_rv9d_a_failing_model_still_gives_drafts_with_a_warning(model_api, fake, failure):
    """rule RV9d: a person waits on this dialog, so a model that fails, answers garbage or is
    slower than drafts_timeout_seconds (no retries) gives drafts from the text, with the reason."""
    if failure == "http_500":
        fake.fail_next(1, 500)
    elif failure == "garbage":
        fake.garbage_next(1)
    else:
        fake.delay = 4.0
    out = _drafts(model_api, {"mode": "conversation", "messages": _messages(2)})
    assert out["source"] == "extractive"
    assert out["warning"].startswith("The model could not be used")
    assert out["drafts"] and out["drafts"][0]["scope"] == "global"
    assert len(fake.completions()) <= 1, "no retries while a person waits"


def test_rv9d_unknown_character_is_refused(extractive_api):
    """rule RV9d: drafts are for a registered character (or global)."""
    expect_error(extractive_api.post("/v1/memories/drafts", json={
        "mode": "conversation", "character_id": "nobody.png", "messages": _messages(1)}), 422, "unknown_character")


def test_rv9d_drafts_save_nothing(extractive_api):
    """rule RV9d: drafts are only proposals; nothing is stored until the person saves them."""
    _drafts(extractive_api, {"mode": "conversation", "character_id": AYLA, "messages": _messages(3)})
    assert expect_ok(extractive_api.get("/v1/memories"))["memories"] == []
