"""Saved memories over HTTP: scopes, quotas, actors, per-turn selection, delete-all (RV4–RV19, SW9b)."""

from __future__ import annotations

from datetime import timedelta
from functools import partial

import pytest

from server_plugin.clock import to_iso
from server_plugin.story.memories import spread_evenly
from tests.helpers import world
from tests.helpers.api import T0, TOKEN, expect_error, expect_ok
from tests.helpers.world import chat

# --- helpers ---------------------------------------------------------------------------------
character = partial(world.character, status=201)  # every character here is a new one


def remember(api, text: str, scope: str = "global", character_id: str | None = None,
             actor: str = "user", **extra) -> dict:
    body = {"text": text, "scope": scope, "actor": actor, **extra}
    if character_id is not None:
        body["character_id"] = character_id
    return expect_ok(api.post("/v1/memories", json=body), 201, "memory.response")["memory"]


def texts(items: list[dict]) -> list[str]:
    return [m["text"] for m in items]


def for_turn(api, chat_id: str, speaker: str) -> dict:
    return expect_ok(api.get(f"/v1/memories/for-turn?chat_id={chat_id}&speaker_id={speaker}"),
                     200, "memories_for_turn.response")


@pytest.fixture
def cast(api):
    """Ayla and Bren, a solo chat with each and a group chat of both."""
    character(api, "ayla.png", "Ayla")
    character(api, "bren.png", "Bren")
    chat(api, "solo-ayla", ["ayla.png"])
    chat(api, "solo-bren", ["bren.png"])
    chat(api, "group", ["ayla.png", "bren.png"])
    return api


# --- RV4 scopes ------------------------------------------------------------------------------
def test_rv4_memory_has_one_of_two_scopes(cast):
    """rule RV4: a memory belongs to one character or is global; chosen when added."""
    own = remember(cast, "Ayla hates thunder.", "character", "ayla.png")
    glob = remember(cast, "The kingdom is called Veloria.")
    assert (own["scope"], own["character_id"]) == ("character", "ayla.png")
    assert (glob["scope"], glob["character_id"]) == ("global", None)
    ayla = texts(for_turn(cast, "solo-ayla", "ayla.png")["memories"])
    bren = texts(for_turn(cast, "solo-bren", "bren.png")["memories"])
    assert set(ayla) == {"Ayla hates thunder.", "The kingdom is called Veloria."}
    assert bren == ["The kingdom is called Veloria."]


def test_rv4_scope_and_character_must_agree(cast):
    """rule RV4: a character memory names its character; a global one names none."""
    expect_error(cast.post("/v1/memories", json={"text": "x", "scope": "character", "actor": "user"}),
                 422, "scope_mismatch")
    expect_error(cast.post("/v1/memories", json={"text": "x", "scope": "global", "character_id": "ayla.png",
                                                 "actor": "user"}), 422, "scope_mismatch")
    expect_error(cast.post("/v1/memories", json={"text": "x", "scope": "character",
                                                 "character_id": "nobody.png", "actor": "user"}),
                 422, "unknown_character")


# --- RV5 group union -------------------------------------------------------------------------
def test_rv5_group_reads_union_of_members_plus_global(cast):
    """rule RV5: in a group chat a character reads every member's memories plus global ones."""
    remember(cast, "Ayla fact", "character", "ayla.png")
    remember(cast, "Bren fact", "character", "bren.png")
    remember(cast, "World fact")
    character(cast, "cyra.png", "Cyra")
    remember(cast, "Cyra fact (not in the group)", "character", "cyra.png")
    for speaker in ("ayla.png", "bren.png"):
        got = set(texts(for_turn(cast, "group", speaker)["memories"]))
        assert got == {"Ayla fact", "Bren fact", "World fact"}
    assert set(texts(for_turn(cast, "solo-ayla", "ayla.png")["memories"])) == {"Ayla fact", "World fact"}


# --- RV6 deleting a character ----------------------------------------------------------------
def test_rv6_deleting_a_character_makes_its_memories_global(cast):
    """rule RV6: a deleted character's memories become global instead of being deleted."""
    pinned = remember(cast, "Ayla's pinned promise", "character", "ayla.png", pinned=True)
    plain = remember(cast, "Ayla's plain fact", "character", "ayla.png")
    body = expect_ok(cast.delete("/v1/characters/ayla.png"), 200, "deleted.response")
    assert body["memories_made_global"] == 2
    for memory in (pinned, plain):
        got = expect_ok(cast.get(f"/v1/memories/{memory['id']}"))["memory"]
        assert (got["scope"], got["character_id"]) == ("global", None)
        assert got["pinned"] == memory["pinned"]
    assert set(texts(for_turn(cast, "solo-bren", "bren.png")["memories"])) == {
        "Ayla's pinned promise", "Ayla's plain fact"}
    expect_error(cast.get("/v1/characters/ayla.png"), 404, "character_not_found")


def test_rv6_merge_into_full_global_scope_archives_overflow_never_deletes(cast, overrides):
    """rules RV6 + RV8: moving into a full global scope archives the least recently updated, deletes nothing."""
    for i in range(100):
        remember(cast, f"global {i}")
    remember(cast, "Ayla's fact", "character", "ayla.png")
    cast.delete("/v1/characters/ayla.png")
    active = expect_ok(cast.get("/v1/memories?scope=global"))["memories"]
    archived = expect_ok(cast.get("/v1/memories?scope=global&archived=true"))["memories"]
    assert len(active) == 100 and len(archived) == 1
    assert archived[0]["text"] == "global 0"


# --- RV7 per-turn selection ------------------------------------------------------------------
def test_rv7_all_pinned_plus_at_most_100_unpinned_newest_first(cast):
    """rule RV7: every pinned item plus up to 100 unpinned, newest first."""
    for i in range(5):
        remember(cast, f"pinned {i}", "character", "ayla.png", pinned=True)
    for i in range(100):
        remember(cast, f"ayla {i}", "character", "ayla.png")
    for i in range(100):
        remember(cast, f"world {i}")
    got = for_turn(cast, "solo-ayla", "ayla.png")
    items = got["memories"]
    assert got["pinned_count"] == 5 and got["unpinned_count"] == 100
    assert [m["pinned"] for m in items] == [True] * 5 + [False] * 100
    assert texts(items[:5]) == [f"pinned {i}" for i in range(4, -1, -1)]
    stamps = [m["updated_at"] for m in items[5:]]
    assert stamps == sorted(stamps, reverse=True)
    # Spread evenly over the two scopes: the newest 50 of each.
    assert set(texts(items[5:])) == {f"ayla {i}" for i in range(50, 100)} | {f"world {i}" for i in range(50, 100)}


def test_rv7_spread_evenly_over_three_scopes(cast):
    """rule RV7: with three scopes and plenty in each, each gets about a third."""
    for i in range(60):
        remember(cast, f"ayla {i}", "character", "ayla.png")
        remember(cast, f"bren {i}", "character", "bren.png")
        remember(cast, f"world {i}")
    got = for_turn(cast, "group", "ayla.png")
    counts = {s["character_id"]: s["unpinned_taken"] for s in got["scopes"]}
    assert got["unpinned_count"] == 100
    assert sorted(counts.values()) == [33, 33, 34]
    taken_ayla = [t for t in texts(got["memories"]) if t.startswith("ayla ")]
    assert set(taken_ayla) == {f"ayla {i}" for i in range(60 - counts["ayla.png"], 60)}


def test_rv7_small_scope_passes_its_share_to_the_others(cast):
    """rule RV7: a scope with fewer items than its share leaves the rest to the other scopes."""
    for i in range(3):
        remember(cast, f"ayla {i}", "character", "ayla.png")
    for i in range(120):
        remember(cast, f"world {i}")
    got = for_turn(cast, "solo-ayla", "ayla.png")
    counts = {s["scope"]: s["unpinned_taken"] for s in got["scopes"]}
    assert counts == {"global": 97, "character": 3}


def test_rv7_spread_evenly_arithmetic():
    """rule RV7: the spreading function itself, including empty and tiny inputs."""
    assert spread_evenly([200, 200, 200], 100) == [34, 33, 33]
    assert spread_evenly([3, 500], 100) == [3, 97]
    assert spread_evenly([0, 0], 100) == [0, 0]
    assert spread_evenly([10, 10], 0) == [0, 0]
    assert spread_evenly([], 100) == []


def test_rv7_recent_marks_updates_within_7_days_edge(cast, clock):
    """rule RV7: `recent` is true for items updated within the last 7 days (inclusive edge)."""
    clock.tick = timedelta(0)
    clock.set(T0)
    memory = remember(cast, "Born on the first of spring.")
    assert memory["updated_at"] == to_iso(T0) and memory["recent"] is True
    clock.set(T0 + timedelta(days=7))
    assert expect_ok(cast.get(f"/v1/memories/{memory['id']}"))["memory"]["recent"] is True
    clock.set(T0 + timedelta(days=7, microseconds=1))
    assert expect_ok(cast.get(f"/v1/memories/{memory['id']}"))["memory"]["recent"] is False
    clock.set(T0 + timedelta(days=6, hours=23, minutes=59, seconds=59))
    assert expect_ok(cast.get(f"/v1/memories/{memory['id']}"))["memory"]["recent"] is True


def test_rv7_an_edit_makes_an_old_memory_recent_again(cast, clock):
    """rule RV7: recency follows the last update, not creation."""
    memory = remember(cast, "Old fact.")
    clock.advance(days=30)
    assert expect_ok(cast.get(f"/v1/memories/{memory['id']}"))["memory"]["recent"] is False
    edited = expect_ok(cast.patch(f"/v1/memories/{memory['id']}", json={"text": "Old fact, restated.",
                                                                         "actor": "user"}))["memory"]
    assert edited["recent"] is True


# --- RV8 quotas ------------------------------------------------------------------------------
def test_rv8_twenty_pinned_per_scope_and_the_21st_is_refused(cast):
    """rule RV8: at most 20 pinned per scope; the 21st pin is 409 quota_exceeded."""
    for i in range(20):
        remember(cast, f"pin {i}", "character", "ayla.png", pinned=True)
    body = expect_error(cast.post("/v1/memories", json={"text": "pin 20", "scope": "character",
                                                        "character_id": "ayla.png", "pinned": True,
                                                        "actor": "user"}), 409, "quota_exceeded")
    assert body["error"]["details"][0]["limit"] == 20
    remember(cast, "pin in another scope", "character", "bren.png", pinned=True)  # own quota per scope
    unpinned = remember(cast, "not pinned yet", "character", "ayla.png")
    expect_error(cast.patch(f"/v1/memories/{unpinned['id']}", json={"pinned": True, "actor": "user"}),
                 409, "quota_exceeded")
    pinned = expect_ok(cast.get("/v1/memories?scope=character&character_id=ayla.png&pinned=true"))
    assert len(pinned["memories"]) == 20


def test_rv8_unpinned_quota_101st_archives_least_recently_updated(cast):
    """rule RV8: the 101st active unpinned item archives the least recently updated one (kept, restorable)."""
    first = [remember(cast, f"fact {i}") for i in range(100)]
    # Touch the oldest so that the second-oldest becomes the least recently updated.
    cast.patch(f"/v1/memories/{first[0]['id']}", json={"text": "fact 0 (edited)", "actor": "user"})
    response = expect_ok(cast.post("/v1/memories", json={"text": "fact 100", "scope": "global",
                                                         "actor": "user"}), 201, "memory.response")
    assert response["archived_ids"] == [first[1]["id"]]
    active = expect_ok(cast.get("/v1/memories?scope=global"))["memories"]
    archived = expect_ok(cast.get("/v1/memories?scope=global&archived=true"), 200, "memories.response")["memories"]
    assert len(active) == 100
    assert [m["id"] for m in archived] == [first[1]["id"]] and archived[0]["archived"] is True
    # Restoring it archives the now least recently updated one instead: nothing is ever deleted.
    restored = expect_ok(cast.patch(f"/v1/memories/{first[1]['id']}", json={"archived": False, "actor": "user"}))
    assert restored["memory"]["archived"] is False
    assert restored["archived_ids"] == [first[2]["id"]]
    total = len(expect_ok(cast.get("/v1/memories?scope=global"))["memories"]) + \
        len(expect_ok(cast.get("/v1/memories?scope=global&archived=true"))["memories"])
    assert total == 101


def test_rv8_archived_items_are_not_in_the_per_turn_set(cast):
    """rule RV8: archived items are kept but no longer in the per-turn set."""
    items = [remember(cast, f"fact {i}") for i in range(101)]
    got = texts(for_turn(cast, "solo-ayla", "ayla.png")["memories"])
    assert items[0]["text"] not in got and len(got) == 100


def test_rv8_pinned_items_do_not_count_against_the_unpinned_quota(cast):
    """rule RV8: 20 pinned sit on top of the 100 unpinned."""
    for i in range(20):
        remember(cast, f"pin {i}", pinned=True)
    for i in range(100):
        remember(cast, f"fact {i}")
    assert expect_ok(cast.get("/v1/memories?scope=global&archived=true"))["memories"] == []
    assert len(expect_ok(cast.get("/v1/memories?scope=global"))["memories"]) == 120


def test_rv8_text_of_500_chars_is_accepted_and_501_is_422(cast):
    """rule RV8: each item at most 500 characters (422 text_too_long above)."""
    assert len(remember(cast, "x" * 500)["text"]) == 500
    body = expect_error(cast.post("/v1/memories", json={"text": "y" * 501, "scope": "global", "actor": "user"}),
                        422, "text_too_long")
    assert body["error"]["details"][0] == {"max": 500, "length": 501}
    memory = remember(cast, "short")
    expect_error(cast.patch(f"/v1/memories/{memory['id']}", json={"text": "z" * 501, "actor": "user"}),
                 422, "text_too_long")
    assert expect_ok(cast.get(f"/v1/memories/{memory['id']}"))["memory"]["text"] == "short"


def test_rv8_length_counts_characters_not_bytes(cast):
    """rule RV8: 500 characters of multi-byte text are accepted."""
    assert len(remember(cast, "é" * 250 + "猫" * 250)["text"]) == 500


# --- RV10–RV12 actors and rollback -----------------------------------------------------------
def test_rv11_model_and_background_cannot_pin(cast):
    """rule RV11: only a person may pin."""
    for actor in ("model", "background"):
        expect_error(cast.post("/v1/memories", json={"text": "sneaky pin", "scope": "global",
                                                     "pinned": True, "actor": actor}), 403, "pinned_protected")
    memory = remember(cast, "unpinned", actor="model")
    expect_error(cast.patch(f"/v1/memories/{memory['id']}", json={"pinned": True, "actor": "model"}),
                 403, "pinned_protected")


def test_rv11_pinned_items_only_a_person_may_edit_or_delete(cast):
    """rule RV11: a model or background job may not edit or delete a pinned item (403)."""
    pinned = remember(cast, "Call me Captain.", pinned=True)
    for actor in ("model", "background"):
        expect_error(cast.patch(f"/v1/memories/{pinned['id']}", json={"text": "Call me Bob.", "actor": actor}),
                     403, "pinned_protected")
        expect_error(cast.delete(f"/v1/memories/{pinned['id']}?actor={actor}"), 403, "pinned_protected")
    assert expect_ok(cast.get(f"/v1/memories/{pinned['id']}"))["memory"]["text"] == "Call me Captain."
    edited = expect_ok(cast.patch(f"/v1/memories/{pinned['id']}", json={"text": "Call me Admiral.",
                                                                         "actor": "user"}))["memory"]
    assert edited["text"] == "Call me Admiral." and edited["version"] == 2
    expect_ok(cast.delete(f"/v1/memories/{pinned['id']}?actor=user"))
    expect_error(cast.get(f"/v1/memories/{pinned['id']}"), 404, "memory_not_found")


def test_rv12_model_and_background_may_rewrite_or_delete_unpinned(cast):
    """rule RV12: unpinned items may be rewritten or deleted by the model and by background jobs."""
    memory = remember(cast, "Likes tea.", "character", "ayla.png", actor="user")
    edited = expect_ok(cast.patch(f"/v1/memories/{memory['id']}", json={"text": "Likes green tea.",
                                                                         "actor": "model"}))["memory"]
    assert edited["text"] == "Likes green tea."
    expect_ok(cast.delete(f"/v1/memories/{memory['id']}?actor=background"))
    expect_error(cast.get(f"/v1/memories/{memory['id']}"), 404, "memory_not_found")


def test_rv10_rollback_removes_exactly_that_turns_unpinned_memories(cast):
    """rule RV10: regenerating a turn rolls back the memories that turn wrote; pinned untouched."""
    keep_other_turn = remember(cast, "from turn 1", actor="model", chat_id="solo-ayla", turn_id="t1")
    doomed = remember(cast, "from turn 2", actor="model", chat_id="solo-ayla", turn_id="t2")
    other_chat = remember(cast, "same turn id, other chat", actor="model", chat_id="solo-bren", turn_id="t2")
    later_pinned = remember(cast, "also turn 2, then pinned", actor="model", chat_id="solo-ayla", turn_id="t2")
    expect_ok(cast.patch(f"/v1/memories/{later_pinned['id']}", json={"pinned": True, "actor": "user"}))
    body = expect_ok(cast.post("/v1/chats/solo-ayla/turns/t2/rollback"), 200, "turn_rollback.response")
    assert body["removed"]["memories"] == 1
    expect_error(cast.get(f"/v1/memories/{doomed['id']}"), 404, "memory_not_found")
    for survivor in (keep_other_turn, other_chat, later_pinned):
        expect_ok(cast.get(f"/v1/memories/{survivor['id']}"))
    # Idempotent: a second rollback of the same turn removes nothing more.
    assert expect_ok(cast.post("/v1/chats/solo-ayla/turns/t2/rollback"))["removed"]["memories"] == 0


def test_rv10_rollback_removes_the_vectors_too(cast, services):
    """rule RV10: nothing of a rolled-back memory stays in the search index."""
    doomed = remember(cast, "from turn 9", actor="model", chat_id="solo-ayla", turn_id="t9")
    conn = services.db.reader()
    assert conn.execute("SELECT count(*) FROM docs WHERE ref_id=?", (doomed["id"],)).fetchone()[0] == 1
    cast.post("/v1/chats/solo-ayla/turns/t9/rollback")
    assert conn.execute("SELECT count(*) FROM docs WHERE ref_id=?", (doomed["id"],)).fetchone()[0] == 0
    assert conn.execute("SELECT count(*) FROM docs_vec").fetchone()[0] == 0
    assert conn.execute("SELECT count(*) FROM docs_fts").fetchone()[0] == 0


def test_memory_carries_the_turn_id_that_wrote_it(cast):
    """rule RV10: memories carry the turn_id (and chat) that wrote them."""
    memory = remember(cast, "tool save", "character", "ayla.png", actor="model", chat_id="solo-ayla",
                      turn_id="turn-42")
    assert (memory["turn_id"], memory["chat_id"], memory["actor"]) == ("turn-42", "solo-ayla", "model")


# --- RV14 learn from chat --------------------------------------------------------------------
def test_rv14_learn_from_chat_off_stops_saving_and_reading(cast):
    """rule RV14: off stops both the model saving and the character reading memories."""
    remember(cast, "Ayla's old fact", "character", "ayla.png")
    remember(cast, "World fact")
    expect_ok(cast.put("/v1/characters/ayla.png", json={"name": "Ayla", "learn_from_chat": False}))
    for actor in ("model", "background"):
        expect_error(cast.post("/v1/memories", json={"text": "new", "scope": "character",
                                                     "character_id": "ayla.png", "actor": actor}),
                     403, "learning_disabled")
    got = for_turn(cast, "solo-ayla", "ayla.png")
    assert got["memories"] == [] and got["reason"] == "learning_disabled"
    # Others still read what is in the store.
    assert "World fact" in texts(for_turn(cast, "solo-bren", "bren.png")["memories"])
    # Switching back on restores reading.
    expect_ok(cast.put("/v1/characters/ayla.png", json={"name": "Ayla", "learn_from_chat": True}))
    assert set(texts(for_turn(cast, "solo-ayla", "ayla.png")["memories"])) == {"Ayla's old fact", "World fact"}


def test_rv14_re_registering_a_card_keeps_the_switch(cast):
    """rule RV14: a client re-sending a character without the switch does not turn learning back on."""
    expect_ok(cast.put("/v1/characters/ayla.png", json={"name": "Ayla", "learn_from_chat": False}))
    got = expect_ok(cast.put("/v1/characters/ayla.png", json={"name": "Ayla the Bold"}), 200,
                    "character.response")["character"]
    assert got["learn_from_chat"] is False and got["name"] == "Ayla the Bold"


# --- RV16 memory off for a chat --------------------------------------------------------------
def test_rv16_memory_disabled_chat_saves_and_returns_nothing(cast):
    """rule RV16: a chat with memory off: nothing is saved or returned for it."""
    remember(cast, "World fact")
    chat(cast, "bounty", ["ayla.png"], memory_enabled=False)
    for actor in ("user", "model", "background"):
        expect_error(cast.post("/v1/memories", json={"text": "x", "scope": "global", "actor": actor,
                                                     "chat_id": "bounty"}), 403, "memory_disabled")
    got = for_turn(cast, "bounty", "ayla.png")
    assert got["memories"] == [] and got["reason"] == "memory_disabled"
    # Re-registering members without the switch keeps memory off.
    chat(cast, "bounty", ["ayla.png", "bren.png"])
    assert for_turn(cast, "bounty", "ayla.png")["reason"] == "memory_disabled"
    assert len(expect_ok(cast.get("/v1/memories?scope=global"))["memories"]) == 1


# --- RV17 authentication ---------------------------------------------------------------------
@pytest.mark.parametrize("header", [None, "Bearer wrong-token", "Basic dGVzdA==", f"bearer {TOKEN}", "Bearer "])
def test_rv17_nothing_is_saved_without_a_valid_token(cast, header):
    """rule RV17: a caller that is not authenticated gets 401 and nothing is stored."""
    headers = {"Authorization": header} if header else {}
    response = cast.post("/v1/memories", json={"text": "intruder", "scope": "global", "actor": "user"},
                         headers=headers, token=None)
    expect_error(response, 401, "unauthorized")
    assert expect_ok(cast.get("/v1/memories?scope=global"))["memories"] == []


# --- RV19 delete all -------------------------------------------------------------------------
def test_rv19_delete_all_in_two_steps(cast):
    """rule RV19: the first delete-all removes unpinned only (archived too); pinned need include_pinned."""
    for i in range(3):
        remember(cast, f"pin {i}", "character", "ayla.png", pinned=True)
    for i in range(101):  # one of them ends archived
        remember(cast, f"fact {i}", "character", "ayla.png")
    remember(cast, "Bren keeps this", "character", "bren.png")
    first = expect_ok(cast.post("/v1/memories/delete-all", json={"scope": "character", "character_id": "ayla.png"}),
                      200, "memories_delete_all.response")
    assert first == {"deleted": 101, "pinned_remaining": 3, "include_pinned": False}
    left = expect_ok(cast.get("/v1/memories?scope=character&character_id=ayla.png"))["memories"]
    assert texts(left) == ["pin 2", "pin 1", "pin 0"]
    assert expect_ok(cast.get("/v1/memories?scope=character&character_id=ayla.png&archived=true"))["memories"] == []
    second = expect_ok(cast.post("/v1/memories/delete-all", json={"scope": "character", "character_id": "ayla.png",
                                                                  "include_pinned": True}))
    assert second == {"deleted": 3, "pinned_remaining": 0, "include_pinned": True}
    assert texts(expect_ok(cast.get("/v1/memories?scope=character&character_id=bren.png"))["memories"]) == [
        "Bren keeps this"]


def test_rv19_only_a_person_may_delete_all(cast):
    """rules RV19 + RV12: delete-all is a person's decision."""
    remember(cast, "fact")
    expect_error(cast.post("/v1/memories/delete-all", json={"scope": "global", "actor": "model"}),
                 403, "person_only")
    assert len(expect_ok(cast.get("/v1/memories?scope=global"))["memories"]) == 1


# --- SW9b known_by ---------------------------------------------------------------------------
def test_sw9b_known_by_restricts_the_per_turn_set(cast):
    """rule SW9b (with RV5): a memory known only by Ayla reaches Ayla's turn in the group, not Bren's."""
    remember(cast, "Ayla's secret: she stole the crown.", "character", "ayla.png", known_by=["ayla.png"])
    remember(cast, "Public: the crown is missing.", "character", "ayla.png")
    ayla = texts(for_turn(cast, "group", "ayla.png")["memories"])
    bren = texts(for_turn(cast, "group", "bren.png")["memories"])
    assert "Ayla's secret: she stole the crown." in ayla
    assert "Ayla's secret: she stole the crown." not in bren
    assert "Public: the crown is missing." in bren


# --- editing details -------------------------------------------------------------------------
def test_version_check_refuses_a_stale_edit(cast):
    """Concurrent edits: with `version`, the second writer of the same version gets 409."""
    memory = remember(cast, "v1 text")
    expect_ok(cast.patch(f"/v1/memories/{memory['id']}", json={"text": "edit A", "version": 1, "actor": "user"}))
    body = expect_error(cast.patch(f"/v1/memories/{memory['id']}", json={"text": "edit B", "version": 1,
                                                                         "actor": "user"}), 409, "version_conflict")
    assert body["error"]["details"][0]["current_version"] == 2
    assert expect_ok(cast.get(f"/v1/memories/{memory['id']}"))["memory"]["text"] == "edit A"


def test_patch_moves_a_memory_between_scopes(cast):
    """rule RV4: a person may move a memory to another scope; quotas apply in the new scope."""
    memory = remember(cast, "movable", "character", "ayla.png")
    moved = expect_ok(cast.patch(f"/v1/memories/{memory['id']}", json={"scope": "global", "actor": "user"}))
    assert (moved["memory"]["scope"], moved["memory"]["character_id"]) == ("global", None)
    back = expect_ok(cast.patch(f"/v1/memories/{memory['id']}", json={"scope": "character",
                                                                      "character_id": "bren.png", "actor": "user"}))
    assert back["memory"]["character_id"] == "bren.png"


def test_list_filters_by_text(cast):
    """The panel filters by text (case-insensitive substring)."""
    remember(cast, "Ayla loves the SEA.")
    remember(cast, "Bren fears heights.")
    assert texts(expect_ok(cast.get("/v1/memories?q=sea"))["memories"]) == ["Ayla loves the SEA."]


def test_memory_write_stores_row_text_entry_and_vector_together(cast, services):
    """A stored memory always has its full-text entry and its vector (same transaction)."""
    memory = remember(cast, "Yuki cried in the hallway.")
    conn = services.db.reader()
    doc = conn.execute("SELECT id, text FROM docs WHERE kind='memory' AND ref_id=?", (memory["id"],)).fetchone()
    assert doc["text"] == "Yuki cried in the hallway."
    assert conn.execute("SELECT count(*) FROM docs_fts WHERE docs_fts MATCH 'hallway'").fetchone()[0] == 1
    vector = conn.execute("SELECT embedding FROM docs_vec WHERE rowid=?", (doc["id"],)).fetchone()[0]
    assert len(vector) == 384 * 4


def test_unknown_memory_is_404_in_the_envelope(cast):
    expect_error(cast.get("/v1/memories/m_nope"), 404, "memory_not_found")
    expect_error(cast.patch("/v1/memories/m_nope", json={"text": "x", "actor": "user"}), 404, "memory_not_found")
    expect_error(cast.delete("/v1/memories/m_nope?actor=user"), 404, "memory_not_found")


def test_delete_requires_an_actor(cast):
    """The actor decides what may be deleted (RV11), so it is required."""
    memory = remember(cast, "fact")
    expect_error(cast.delete(f"/v1/memories/{memory['id']}"), 400, "invalid_request")


def test_for_turn_of_unknown_chat_is_404(cast):
    expect_error(cast.get("/v1/memories/for-turn?chat_id=nope&speaker_id=ayla.png"), 404, "chat_not_found")
