"""The transcript store: idempotent upserts, edits, order, long messages, deletes, renames, the
search index of messages with their witnesses (RV1, RV16, SW9a, SW9b)."""

from __future__ import annotations

from typing import Any

import pytest

from server_plugin.retrieval import docs as index
from server_plugin.store.db import loads
from tests.helpers.api import expect_error, expect_ok
from tests.helpers.world import chat

CHAT = "Ayla - 2026-03-01@12h00m00s"
CHAT_PATH = "/v1/chats/Ayla%20-%202026-03-01@12h00m00s"


def msg(i: int, role: str = "user", text: str | None = None, **extra: Any) -> dict[str, Any]:
    speaker = "ayla.png" if role == "assistant" else "player"
    return {"id": f"m{i}", "role": role, "name": "Ayla" if role == "assistant" else "Kai",
            "text": text if text is not None else f"Message number {i}.", "speaker_id": speaker, **extra}


def register(api, chat_id: str = CHAT, members: list[str] | None = None, **extra: Any) -> None:
    chat(api, chat_id, members or ["ayla.png", "player"], **extra)


def post(api, messages: list[dict], path: str = CHAT_PATH, status: int = 200) -> dict:
    return expect_ok(api.post(f"{path}/messages", json={"messages": messages}), status,
                     "messages_upsert.response" if status == 200 else None)


def listing(api, path: str = CHAT_PATH, **params: Any) -> dict:
    qs = "&".join(f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in params.items())
    return expect_ok(api.get(f"{path}/messages" + (f"?{qs}" if qs else "")), 200, "messages.response")


def test_rv1_upsert_is_idempotent_by_id(api):
    """rule RV1 (live messages are the first layer): re-sending the same batch changes nothing."""
    register(api)
    first = post(api, [msg(1), msg(2, "assistant", turn_id="t1")])
    assert (first["inserted"], first["unchanged"]) == (2, 0)
    before = listing(api)["messages"]
    again = post(api, [msg(1), msg(2, "assistant", turn_id="t1")])
    assert (again["inserted"], again["edited"], again["updated"], again["unchanged"]) == (0, 0, 0, 2)
    assert listing(api)["messages"] == before


def test_rv1_edit_replaces_text_and_metadata_update_is_not_an_edit(api, services):
    """rule RV1: an edit replaces the text (and its search entry); a new turn id alone is an update."""
    register(api)
    post(api, [msg(1), msg(2, "assistant", turn_id="t1")])
    edited = post(api, [msg(2, "assistant", text="A different reply.", turn_id="t2")])
    assert (edited["edited"], edited["updated"]) == (1, 0)
    row = listing(api)["messages"][1]
    assert (row["text"], row["turn_id"], row["version"]) == ("A different reply.", "t2", 2)
    doc = services.db.reader().execute("SELECT text FROM docs WHERE kind='message' AND ref_id=?",
                                       (str(row["seq"]),)).fetchone()
    assert doc[0] == "A different reply."
    moved = post(api, [msg(2, "assistant", text="A different reply.", turn_id="t3")])
    assert (moved["edited"], moved["updated"]) == (0, 1)


def test_message_ids_are_unique_only_within_a_chat(api):
    """SillyTavern branches copy message ids: the same id in two chats is two messages."""
    register(api)
    register(api, "branch", ["ayla.png", "player"])
    post(api, [msg(1, text="In the main chat.")])
    post(api, [msg(1, text="In the branch.")], path="/v1/chats/branch")
    assert listing(api)["messages"][0]["text"] == "In the main chat."
    assert listing(api, "/v1/chats/branch")["messages"][0]["text"] == "In the branch."


def test_order_is_index_then_arrival(api):
    """A message inserted mid-chat (given its SillyTavern index) is listed where it belongs."""
    register(api)
    post(api, [msg(1, index=0), msg(2, "assistant", index=1), msg(3, index=3)])
    post(api, [msg(4, "assistant", index=2)])
    post(api, [msg(5)])  # no index: after the last
    ids = listing(api, ids_only=True)["ids"]
    assert ids == ["m1", "m2", "m4", "m3", "m5"]
    assert listing(api)["messages"][-1]["index"] == 4


def test_long_messages_are_kept_never_refused(api, services):
    """A 100,000-character message is stored whole; a longer one is cut there, not refused with 400."""
    register(api)
    exact = "é" * 100_000  # 200 KB of UTF-8: over the ordinary 1 MB body limit three times over
    longer = "word " * 30_000  # 150,000 characters
    out = post(api, [msg(1, text=exact), msg(2, text=exact), msg(3, text=exact),
                     msg(4, text=exact), msg(5, text=exact), msg(6, text=longer)])
    assert out["inserted"] == 6 and out["truncated_ids"] == ["m6"]
    rows = listing(api)["messages"]
    assert rows[0]["text"] == exact
    assert len(rows[5]["text"]) == services.settings.message_max_chars


def test_batches_are_bounded(api, overrides):
    """At most messages_per_batch (200) messages per call: more is 413, nothing stored."""
    register(api)
    expect_error(api.post(f"{CHAT_PATH}/messages", json={"messages": [msg(i) for i in range(201)]}),
                 413, "too_many_messages")
    assert listing(api)["total"] == 0


def test_chat_must_be_registered(api):
    expect_error(api.post("/v1/chats/nope/messages", json={"messages": [msg(1)]}), 404, "chat_not_found")
    expect_error(api.get("/v1/chats/nope/messages"), 404, "chat_not_found")


def test_rv16_memory_off_stores_nothing_and_says_so(api, services):
    """rule RV16: a chat with memory switched off keeps no message, and the answer says so."""
    register(api, memory_enabled=False)
    out = post(api, [msg(1), msg(2, "assistant")])
    assert out["stored"] is False and out["memory_enabled"] is False and out["inserted"] == 0
    assert listing(api)["total"] == 0
    assert services.db.reader().execute("SELECT count(*) FROM docs WHERE kind='message'").fetchone()[0] == 0


def test_invalid_messages_are_refused(api):
    register(api)
    expect_error(api.post(f"{CHAT_PATH}/messages", json={"messages": [{"id": "x", "role": "narrator",
                                                                       "text": "hi"}]}),
                 400, "invalid_request")
    expect_error(api.post(f"{CHAT_PATH}/messages", json={"messages": [msg(1, sent_at="the day after yesterday, at noon")]}),
                 422, "invalid_timestamp")


def test_listing_pages_and_ids_only(api):
    register(api)
    post(api, [msg(i) for i in range(10)])
    page = listing(api, offset=4, limit=3)
    assert [m["id"] for m in page["messages"]] == ["m4", "m5", "m6"] and page["total"] == 10
    assert listing(api, ids_only=True)["ids"] == [f"m{i}" for i in range(10)]


def test_sw9b_message_is_indexed_with_its_witnesses(api, services):
    """rule SW9b: a message is known by the chat's members at the time it was said and its speaker."""
    register(api, members=["ayla.png"])
    post(api, [msg(1, "assistant", text="Only Ayla and the player were here.")])
    register(api, members=["ayla.png", "bren.png"])  # Bren joins later
    post(api, [msg(2, "assistant", text="Bren hears this one.")])
    rows = services.db.reader().execute(
        "SELECT d.chat_id, d.character_id, d.known_by, m.id FROM docs d JOIN messages m"
        " ON d.ref_id = CAST(m.seq AS TEXT) WHERE d.kind='message' ORDER BY m.seq").fetchall()
    assert [loads(r["known_by"]) for r in rows] == [["ayla.png"], ["ayla.png", "bren.png"]]
    assert {r["chat_id"] for r in rows} == {CHAT} and rows[0]["character_id"] == "ayla.png"
    assert index.orphans(services.db.reader()) == dict.fromkeys(index.orphans(services.db.reader()), 0)


def test_one_upsert_embeds_its_batch_in_one_call(api, monkeypatch):
    """The embedding of a whole upsert is one batch (one prepare() call), not one per message."""
    register(api)
    calls: list[int] = []
    real = index.prepare

    def counting(embedder, texts, timeout=60.0):
        calls.append(len(texts))
        return real(embedder, texts, timeout)

    monkeypatch.setattr(index, "prepare", counting)
    post(api, [msg(i) for i in range(12)])
    assert calls == [12]


def test_delete_message_removes_it_and_its_index_entry(api, services):
    register(api)
    post(api, [msg(1), msg(2)])
    out = expect_ok(api.delete(f"{CHAT_PATH}/messages/m1"), 200, "message_deleted.response")
    assert out["removed"]["messages"] == 1
    assert listing(api, ids_only=True)["ids"] == ["m2"]
    assert services.db.reader().execute("SELECT count(*) FROM docs WHERE kind='message'").fetchone()[0] == 1
    expect_error(api.delete(f"{CHAT_PATH}/messages/m1"), 404, "message_not_found")


def test_delete_chat_keeps_saved_memories(api, services):
    """Deleting a chat removes its transcript; saved memories stay (they belong to characters, RV4)."""
    register(api)
    expect_ok(api.put("/v1/characters/ayla.png", json={"name": "Ayla"}), 201)
    post(api, [msg(1), msg(2, "assistant")])
    expect_ok(api.post("/v1/memories", json={"text": "Kai is allergic to bees.", "scope": "character",
                                             "character_id": "ayla.png", "actor": "user",
                                             "chat_id": CHAT}), 201)
    out = expect_ok(api.delete(CHAT_PATH), 200, "chat_deleted.response")
    assert out["removed"]["messages"] == 2
    expect_error(api.get(CHAT_PATH), 404, "chat_not_found")
    conn = services.db.reader()
    assert conn.execute("SELECT count(*) FROM messages").fetchone()[0] == 0
    assert conn.execute("SELECT count(*) FROM docs WHERE kind='message'").fetchone()[0] == 0
    assert conn.execute("SELECT count(*) FROM memories").fetchone()[0] == 1


def test_rename_moves_everything_to_the_new_id(api, services):
    """SillyTavern renames chat files: messages, members and memory provenance follow the new id."""
    register(api)
    post(api, [msg(1), msg(2, "assistant", turn_id="t1")])
    expect_ok(api.put("/v1/characters/ayla.png", json={"name": "Ayla"}), 201)
    expect_ok(api.post("/v1/memories", json={"text": "Kai likes tea.", "scope": "character",
                                             "character_id": "ayla.png", "actor": "model",
                                             "chat_id": CHAT, "turn_id": "t1"}), 201)
    out = expect_ok(api.post(f"{CHAT_PATH}/rename", json={"new_id": "Renamed chat"}), 200, "chat.response")
    assert out["chat"]["id"] == "Renamed chat" and out["chat"]["member_ids"] == ["ayla.png", "player"]
    assert listing(api, "/v1/chats/Renamed%20chat", ids_only=True)["ids"] == ["m1", "m2"]
    expect_error(api.get(CHAT_PATH), 404, "chat_not_found")
    assert services.db.reader().execute("SELECT DISTINCT chat_id FROM docs WHERE kind='message'"
                                        ).fetchall()[0][0] == "Renamed chat"
    # RV10 still finds the turn's memory under the new id
    rolled = expect_ok(api.post("/v1/chats/Renamed%20chat/turns/t1/rollback", json={}), 200)
    assert rolled["removed"]["memories"] == 1


def test_rename_to_an_existing_chat_is_a_conflict(api):
    register(api)
    register(api, "other")
    expect_error(api.post(f"{CHAT_PATH}/rename", json={"new_id": "other"}), 409, "chat_exists")
    expect_error(api.post("/v1/chats/missing/rename", json={"new_id": "x"}), 404, "chat_not_found")


@pytest.mark.parametrize("size", [1, 200])
def test_batch_sizes_up_to_the_limit(api, size):
    register(api)
    assert post(api, [msg(i) for i in range(size)])["inserted"] == size
