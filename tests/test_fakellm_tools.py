"""The fake model can ask for tool calls like an OpenAI model with function calling (used by the
E2E test of the extension's memory tools, RV9a)."""

from __future__ import annotations

import json

import requests

from tests.helpers.fakellm import FakeLLM

TOOLS = [{"type": "function", "function": {"name": "remember", "parameters": {"type": "object"}}}]


def test_rv9a_a_scripted_tool_call_waits_for_a_request_that_offers_tools():
    """A background job's request (no tools) between the script and the generation gets text."""
    with FakeLLM() as fake:
        fake.script_tool_calls([{"name": "remember", "arguments": {"text": "Mara fears bees."}}])
        plain = {"model": "fake-model", "messages": [{"role": "user", "content": "summarise"}]}
        answer = requests.post(fake.url + "/chat/completions", json=plain, timeout=5).json()
        assert "tool_calls" not in answer["choices"][0]["message"]
        offered = requests.post(fake.url + "/chat/completions", json={**plain, "tools": TOOLS}, timeout=5).json()
        assert offered["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "remember"


def test_rv9a_fake_model_answers_a_scripted_tool_call_then_text_again():
    with FakeLLM() as fake:
        fake.script_tool_calls([{"name": "remember", "arguments": {"text": "Mara fears bees."}}])
        body = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}], "tools": TOOLS}
        first = requests.post(fake.url + "/chat/completions", json=body, timeout=5).json()
        choice = first["choices"][0]
        assert choice["finish_reason"] == "tool_calls"
        call = choice["message"]["tool_calls"][0]
        assert call["function"]["name"] == "remember"
        assert json.loads(call["function"]["arguments"]) == {"text": "Mara fears bees."}
        second = requests.post(fake.url + "/chat/completions", json=body, timeout=5).json()
        assert "tool_calls" not in second["choices"][0]["message"]
        assert second["choices"][0]["message"]["content"].startswith("Fake reply")


def test_rv9a_fake_model_streams_a_tool_call_as_one_delta():
    with FakeLLM() as fake:
        fake.script_tool_calls([{"name": "recall", "arguments": {"query": "bees"}}])
        body = {"model": "fake-model", "stream": True, "messages": [{"role": "user", "content": "hi"}],
                "tools": TOOLS}
        raw = requests.post(fake.url + "/chat/completions", json=body, timeout=5).text
        chunks = [json.loads(line[6:]) for line in raw.splitlines() if line.startswith("data: {")]
        deltas = [c["choices"][0]["delta"] for c in chunks]
        calls = [d["tool_calls"] for d in deltas if "tool_calls" in d]
        assert calls == [[{"index": 0, "id": "call_0", "type": "function",
                           "function": {"name": "recall", "arguments": '{"query": "bees"}'}}]]
        assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"
        assert raw.rstrip().endswith("data: [DONE]")
