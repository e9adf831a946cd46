"""Characters and chats over HTTP (DC1, RV14, RV16)."""

from __future__ import annotations

from tests.helpers.api import expect_error, expect_ok

SHEET = {"personality": "Brave.", "secrets": [{"text": "Stole the crown.", "known_by": ["ayla.png"]}]}


def test_put_creates_then_replaces_a_character(api):
    created = expect_ok(api.put("/v1/characters/ayla.png", json={"name": "Ayla", "aliases": ["Cap"],
                                                                  "sheet": SHEET}), 201, "character.response")
    assert created["character"]["sheet"] == SHEET and created["character"]["learn_from_chat"] is True
    replaced = expect_ok(api.put("/v1/characters/ayla.png", json={"name": "Ayla", "sheet": {"personality": "Calm."}}),
                         200, "character.response")["character"]
    assert replaced["sheet"] == {"personality": "Calm."} and replaced["aliases"] == ["Cap"]
    assert replaced["created_at"] == created["character"]["created_at"]
    listed = expect_ok(api.get("/v1/characters"), 200, "characters.response")["characters"]
    assert [c["id"] for c in listed] == ["ayla.png"]


def test_unknown_character_is_404(api):
    expect_error(api.get("/v1/characters/nobody.png"), 404, "character_not_found")
    expect_error(api.delete("/v1/characters/nobody.png"), 404, "character_not_found")


def test_chat_members_and_switch(api):
    created = expect_ok(api.put("/v1/chats/c1", json={"member_ids": ["b.png", "a.png", "b.png"],
                                                     "title": "Tavern", "context_tokens": 8192}),
                        201, "chat.response")["chat"]
    assert created["member_ids"] == ["b.png", "a.png"] and created["memory_enabled"] is True
    updated = expect_ok(api.put("/v1/chats/c1", json={"memory_enabled": False}), 200, "chat.response")["chat"]
    # Fields left out keep their values: flipping the switch does not empty the members.
    assert updated["member_ids"] == ["b.png", "a.png"] and updated["title"] == "Tavern"
    assert updated["memory_enabled"] is False
    emptied = expect_ok(api.put("/v1/chats/c1", json={"member_ids": []}), 200, "chat.response")["chat"]
    assert emptied["member_ids"] == [] and emptied["memory_enabled"] is False
    assert updated["context_tokens"] == 8192
    expect_ok(api.get("/v1/chats"), 200, "chats.response")
    expect_error(api.get("/v1/chats/none"), 404, "chat_not_found")


def test_deleting_a_character_removes_it_from_chats(api):
    api.put("/v1/characters/a.png", json={"name": "A"})
    api.put("/v1/chats/c1", json={"member_ids": ["a.png", "b.png"]})
    api.delete("/v1/characters/a.png")
    assert expect_ok(api.get("/v1/chats/c1"))["chat"]["member_ids"] == ["b.png"]
