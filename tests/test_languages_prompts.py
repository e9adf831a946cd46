"""Summaries and memories in the conversation's language (rule LG2): a German and a Japanese chat
run through the sidecar in `openai` mode; the fake model's record of what it was asked shows that
every background prompt carries the chat's own words and tells the model to write in that
language, and the answers it gave (in that language) are what is stored."""

from __future__ import annotations

import json

import pytest

from tests.helpers.conversation import drain, iso, post, summaries
from tests.helpers.episodes import Answers, task_of
from tests.helpers.fakellm import FakeLLM
from tests.helpers.world import character, chat

RULE = "in the language the conversation is written in, never translated into English"

CHATS = {
    "de": ["Kai geht zum Hafen. \u201eAyla, hast du die Laterne gesehen?\u201c",
           "*Ayla nickt.* \u201eIch habe sie am Wasser brennen sehen, Kai. Morgen gehen wir zusammen hin.\u201c"],
    "ja": ["\u30ab\u30a4\u306f\u6e2f\u3078\u6b69\u304f\u3002\u300c\u30a2\u30a4\u30e9\u3001\u706f\u7c60\u3092\u898b\u305f\uff1f\u300d",
           "*\u30a2\u30a4\u30e9\u306f\u3046\u306a\u305a\u304f\u3002*\u300c\u6c34\u8fba\u3067\u71c3\u3048\u3066\u3044\u308b\u306e\u3092\u898b\u305f\u308f\u3001\u30ab\u30a4\u3002\u300d"],
}
SUMMARY = {"de": "Kai und Ayla suchten am Hafen nach der Laterne.",
           "ja": "\u30ab\u30a4\u3068\u30a2\u30a4\u30e9\u306f\u6e2f\u3067\u706f\u7c60\u3092\u63a2\u3057\u305f\u3002"}


@pytest.fixture
def fake():
    server = FakeLLM().start()
    server.responder = Answers()
    yield server
    server.stop()


@pytest.fixture
def overrides(fake):
    return {"llm_mode": "openai", "llm_url": fake.url, "llm_model": "fake", "live_window_max_messages": 4,
            "summary_chunk_messages": 2, "deep_memory_min_new_messages": 10_000}


@pytest.mark.parametrize("lang", ["de", "ja"])
def test_lg2_every_prompt_asks_for_the_conversations_language(lang, api, services, fake):
    answers: Answers = fake.responder
    said = SUMMARY[lang]
    answers.builders["chunk_summary"] = lambda lb: {"summary": said, "quotes": []}
    answers.builders["session_summary"] = lambda lb: {"full": said, "short": said, "quotes": [],
                                                      "open_threads": [], "resolved": []}
    character(api, "ayla.png", "Ayla")
    character(api, "kai.png", "Kai", is_player=True)
    chat(api, "c1", ("ayla.png",))
    for n in range(4):
        user, reply = CHATS[lang]
        post(api, [{"id": f"u{n}", "role": "user", "name": "Kai", "text": user, "sent_at": iso(n),
                    "speaker_id": "kai.png"},
                   {"id": f"a{n}", "role": "assistant", "name": "Ayla", "text": reply, "sent_at": iso(n + 0.5),
                    "turn_id": f"t{n}", "speaker_id": "ayla.png"}])
    api.post("/v1/chats/c1/sessions/end", json={})
    drain(services)
    asked = fake.completions()
    kinds = set(answers.seen)  # a shared call answers several tasks (MJ1)
    assert {"chunk_summary", "session_summary", "character_memories", "scene_summaries"} <= kinds
    for body in asked:
        system, user = body["messages"][0]["content"], body["messages"][1]["content"]
        assert RULE in system, task_of(body)
        assert CHATS[lang][1][-12:] in user  # the chat's own words, not a translation
    assert summaries(api)["recent"][0]["text"] == said
    session = api.get("/v1/chats/c1/sessions/1").get_json()
    assert said in json.dumps(session, ensure_ascii=False)
