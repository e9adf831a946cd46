"""POST /v1/context end to end: the route gathers, assembles and remembers.

The pure budget rules are tested token for token in test_assemble.py; here each test checks what
only the route can get wrong: which candidates reach the assembler (presence, visibility, memory
switches), the per-chat card statistics across turns, the schema, and the budget invariant with
the real counter on random requests.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from server_plugin.core.tokens import get_counter
from server_plugin.core.triggers import WHOLE_WORDS, Match, ScanWindow, TriggerIndex
from tests.helpers import world
from tests.helpers.api import expect_error, expect_ok

C = get_counter()


def turn(api, chat="c1", speaker="ayla.png", text="Hello there.", ctx=4000, status=200, **extra):
    body = {"chat_id": chat, "speaker_id": speaker, "context_tokens": ctx,
            "last_action": {"text": text}, **extra}
    return expect_ok(api.post("/v1/context", json=body), status, "context.response")


def section(out, name):
    return out["report"]["sections"][name]


def ids(entries):
    return [e["id"] for e in entries]


def block(out, name):
    found = [b for b in out["blocks"] if b["section"] == name]
    return found[0]["text"] if found else ""


def character(api, cid, name, aliases=(), **sheet):
    """A new character; its sheet is the given fields, or one line of personality."""
    world.character(api, cid, name, aliases=list(aliases), sheet=sheet or {"personality": f"{name}'s way."},
                    status=201)


def chat(api, chat_id="c1", members=(), **extra):
    world.chat(api, chat_id, members, status=201, **extra)


def card(api, title, triggers, text=None, **extra):
    body = {"title": title, "text": text or f"All about {title}.", "triggers": list(triggers), **extra}
    return expect_ok(api.post("/v1/lore", json=body), 201)["entry"]["id"]


def memory(api, text, **extra):
    body = {"text": text, "scope": "global", "actor": "user", **extra}
    return expect_ok(api.post("/v1/memories", json=body), 201)["memory"]["id"]


# --- the contract ---------------------------------------------------------------------------------

def test_context_response_matches_its_schema_with_every_source(api):
    """API.md POST /v1/context: blocks, live_message_ids and the report, as the schema says."""
    character(api, "ayla.png", "Ayla", secrets=[{"text": "Ayla stole the crown."}])
    chat(api, members=["ayla.png"])
    card(api, "Crown", ["crown"])
    memory(api, "Greet the queen first.", pinned=True)
    memory(api, "The crown was seen in the tower.")
    out = turn(api, text="Where is the crown?", instructions="Be terse.", plot_essentials="A heist.",
               authors_note="Tense.", front_memory="[Storm]")
    sections = {b["section"] for b in out["blocks"]}
    assert sections == {"instructions", "plot_essentials", "authors_note", "front_memory",
                        "character_sheets", "story_cards", "pinned_memories", "memory_bank"}
    for b in out["blocks"]:
        assert b["tokens"] == C.count(b["text"]) == section(out, b["section"])["used"]
    assert out["report"]["present"] == {"ayla.png": "speaker"}
    assert out["live_message_ids"] == []
    assert section(out, "last_action")["used"] == C.count("Where is the crown?")


def test_context_errors(api):
    """An unknown chat is a 404; a request outside the schema is a 400 naming the field."""
    expect_error(api.post("/v1/context", json={"chat_id": "nope", "speaker_id": "a", "context_tokens": 100,
                                               "last_action": {"text": "x"}}), 404, "chat_not_found")
    body = expect_error(api.post("/v1/context", json={"chat_id": "c", "speaker_id": "a",
                                                      "context_tokens": 0, "last_action": {"text": "x"}}),
                        400, "invalid_request")
    assert body["error"]["details"][0]["path"] == "/context_tokens"


def test_qs2_a_long_user_message_is_not_a_400_and_never_breaks_the_budget(api):
    """A 100,000-character action is accepted; it is cut to the context (flagged), never beyond."""
    chat(api)
    long_text = ("The storm rolls over the hills and the river rises. " * 2000)[:100_000]
    out = turn(api, text=long_text, ctx=1000, authors_note="x" * 100_000)
    assert section(out, "last_action")["used"] == 1000
    assert "last_action_over_context" in out["report"]["flags"]
    assert out["report"]["used"] <= 1000 and out["blocks"] == []


# --- SW1: sheets of present characters only -------------------------------------------------------

def big_cast(api):
    """40 characters, each with a distinct one-word name and an alias."""
    names = [f"Name{i:02d}" for i in range(40)]
    for i, name in enumerate(names):
        character(api, f"c{i:02d}.png", name, aliases=[f"Alias{i:02d}"], personality=f"Trait {i}.")
    return names


def test_sw1_only_present_characters_sheets_in_a_40_character_cast(api):
    """rule SW1: speaker, members, present_ids and characters named (or aliased) in the scan window
    are present; the rest of a 40-character cast stays out."""
    big_cast(api)
    chat(api, members=["c00.png", "c01.png", "c39.png"])
    out = turn(api, speaker="c00.png", present_ids=["c05.png", "ghost.png"],
               text="Alias07 waves at name12, but not at Name130 or Alias2.")
    assert out["report"]["present"] == {"c00.png": "speaker", "c01.png": "member", "c39.png": "member",
                                        "c05.png": "present_ids", "ghost.png": "present_ids",
                                        "c07.png": "mentioned", "c12.png": "mentioned"}
    sheets = section(out, "character_sheets")
    assert ids(sheets["included"]) == ["c00.png", "c01.png", "c39.png", "c05.png", "c07.png", "c12.png"]
    text = block(out, "character_sheets")
    for i in (0, 1, 39, 5, 7, 12):
        assert f"Trait {i}." in text
    absent = [i for i in range(40) if i not in (0, 1, 39, 5, 7, 12)]
    assert not any(f"Trait {i}." in text for i in absent)


def test_sw1_an_alias_mention_brings_a_sheet_in_and_its_absence_leaves_it_out(api):
    """rule SW1: presence follows the scan window turn by turn."""
    character(api, "ayla.png", "Ayla")
    character(api, "bren.png", "Bren Varo", aliases=["the Fox"], personality="Sly.")
    chat(api, members=["ayla.png"])
    assert "Sly." in block(turn(api, text="Then THE  FOX steps in."), "character_sheets")
    assert "Sly." not in block(turn(api, text="The foxes and Brenda pass."), "character_sheets")
    out = turn(api, text="Nobody else is here.")
    assert out["report"]["present"] == {"ayla.png": "speaker"}
    assert "Sly." not in block(out, "character_sheets")


def test_sw1_presence_reads_the_4_latest_actions_of_the_chat(api):
    """rule SW1/QS6: a name in one of the 4 latest actions makes a character present; a name
    only 5 actions back does not."""
    character(api, "bren.png", "Bren", personality="Sly.")
    chat(api)
    texts = ["Bren waits by the door.", "Rain.", "More rain.", "Thunder.", "Silence."]
    post_messages(api, "c1", texts)
    out = turn(api, text=texts[-1], last_action={"text": texts[-1], "id": "m5"})
    assert "bren.png" not in out["report"]["present"]  # m1 is the 5th latest action
    post_messages(api, "c1", texts[:2] + ["Bren coughs."] + texts[3:])  # m3 edited: 3rd latest
    out = turn(api, text=texts[-1], last_action={"text": texts[-1], "id": "m5"})
    assert out["report"]["present"]["bren.png"] == "mentioned"


# --- SW9b: a secret of A never reaches B --------------------------------------------------------

def test_sw9b_a_secret_of_a_never_appears_in_bs_context(api):
    """rule SW9b (and SW1): A's sheet secret, a memory known only by A and a lore entry known only
    by A are in A's context and nowhere in B's (not even as an id in the report)."""
    character(api, "a.png", "Ayla", personality="Brave.",
              secrets=[{"text": "Ayla poisoned the king."}])
    character(api, "b.png", "Bren", personality="Sly.",
              secrets=[{"text": "Bren knows the vault code.", "known_by": ["a.png"]}])
    chat(api, members=["a.png", "b.png"])
    hidden_memory = memory(api, "The poison came from the royal garden.", known_by=["a.png"])
    pinned_secret = memory(api, "Ayla's real name is Lysa.", pinned=True, known_by=["a.png"])
    hidden_card = card(api, "Poison", ["poison", "king"], text="Nightshade grows in the garden.",
                       known_by=["a.png"])
    action = "Bren asks about the king and the poison."
    for_a = json.dumps(turn(api, speaker="a.png", text=action, ctx=3000))
    for_b = json.dumps(turn(api, speaker="b.png", text=action, ctx=3000))
    for secret in ("Ayla poisoned the king.", "Bren knows the vault code.", "royal garden",
                   "Lysa", "Nightshade", hidden_memory, pinned_secret, hidden_card):
        assert secret in for_a, secret
    for secret in ("Ayla poisoned the king.", "royal garden", "Lysa", "Nightshade",
                   hidden_memory, pinned_secret, hidden_card):
        assert secret not in for_b, secret
    assert "Bren knows the vault code." in for_b  # B's own secret: B always knows it
    assert "Brave." in for_b  # A's sheet is in B's context, only without A's secret


# --- RV14 / RV16: memory switches ---------------------------------------------------------------

def test_rv16_memory_off_for_the_chat_means_no_memory_sections(api):
    """rule RV16 (and QS4): memory off -> no pinned memories, no memory bank; history gets 75%."""
    chat(api, memory_enabled=False)
    memory(api, "Pinned fact.", pinned=True)
    memory(api, "Unpinned fact.")
    out = turn(api, ctx=1000)
    assert section(out, "pinned_memories")["included"] == []
    assert section(out, "memory_bank") == {"allocated": 0, "available": 0, "used": 0,
                                           "included": [], "truncated": [], "dropped": []}
    dynamic = out["report"]["dynamic_tokens"]
    assert section(out, "history")["allocated"] == dynamic - dynamic * 25 // 100


def test_rv14_learn_from_chat_off_means_no_saved_memories(api):
    """rule RV14: a speaker that does not learn from chat reads no saved memories."""
    expect_ok(api.put("/v1/characters/a.png", json={"name": "A", "learn_from_chat": False}), 201)
    chat(api, members=["a.png"])
    memory(api, "Pinned fact.", pinned=True)
    memory(api, "Unpinned fact.")
    out = turn(api, speaker="a.png")
    assert section(out, "pinned_memories")["included"] == section(out, "memory_bank")["included"] == []
    assert section(out, "memory_bank")["allocated"] > 0  # the bank is on, only empty


def test_qs4_memory_bank_switched_off_by_the_client(api):
    """rule QS4: `memory_bank: false` gives history 75%; pinned memories stay (RV11)."""
    chat(api)
    memory(api, "Pinned fact.", pinned=True)
    memory(api, "Unpinned fact.")
    out = turn(api, memory_bank=False, ctx=1000)
    assert ids(section(out, "pinned_memories")["included"])
    assert section(out, "memory_bank")["included"] == []
    assert [e["reason"] for e in section(out, "memory_bank")["dropped"]] == ["memory_bank_off"]
    dynamic = out["report"]["dynamic_tokens"]
    assert section(out, "history")["allocated"] == dynamic - dynamic * 25 // 100


# --- QS8 / RV7: the memory bank ---------------------------------------------------------------

def test_qs8_memory_bank_ranked_by_relevance_to_the_last_action(api):
    """rule QS8: per-turn unpinned memories are ranked by meaning, not by age."""
    chat(api)
    cats = memory(api, "Mira is allergic to cats and sneezes near them.")
    memory(api, "The harbour tax rose to three silver coins.")
    memory(api, "The blacksmith's daughter married in spring.")
    out = turn(api, text="A kitten jumps onto Mira's lap.")
    assert ids(section(out, "memory_bank")["included"])[0] == cats
    out = turn(api, text="How much do ships pay at the port now?")
    assert "harbour tax" in block(out, "memory_bank").split("\n")[1]


# --- QS5: card ranking from per-chat statistics ----------------------------------------------------

def one_card_budget(api, text, **extra):
    """A turn whose story-card share fits exactly one of the cards below."""
    return turn(api, text=text, ctx=120, memory_bank=False, **extra)


def test_qs5_cards_ranked_by_frequency_across_turns(api, services):
    """rule QS5: two cards triggered in the same action: the one used in more turns goes first."""
    chat(api)
    alpha = card(api, "Alpha", ["alpha"], text="Alpha lore. " * 6)
    beta = card(api, "Beta", ["beta"], text="Beta lore. " * 6)
    turn(api, text="alpha one")
    turn(api, text="alpha two")
    turn(api, text="beta three")
    out = one_card_budget(api, "alpha and beta")
    assert ids(section(out, "story_cards")["included"]) == [alpha]
    assert ids(section(out, "story_cards")["dropped"]) == [beta]
    stats = dict(services.db.reader().execute("SELECT lore_id, uses FROM lore_stats").fetchall())
    assert stats == {alpha: 3, beta: 2}


def test_qs5_cards_ranked_by_recency_across_turns(api):
    """rule QS5: equal use counts: the card used in the more recent turn goes first."""
    chat(api)
    alpha = card(api, "Alpha", ["alpha"], text="Alpha lore. " * 6)
    beta = card(api, "Beta", ["beta"], text="Beta lore. " * 6)
    turn(api, text="alpha first")
    turn(api, text="beta second")
    out = one_card_budget(api, "beta or alpha")
    assert ids(section(out, "story_cards")["included"]) == [beta]
    assert ids(section(out, "story_cards")["dropped"]) == [alpha]
    turn(api, text="alpha again")  # both fired in turn 3; alpha now in turn 4 too: more uses
    out = one_card_budget(api, "beta or alpha")
    assert ids(section(out, "story_cards")["included"]) == [alpha]
    assert section(out, "story_cards")["included"][0]["detail"] == (
        "action 0; uses 3; triggers: alpha")


def test_qs5_a_swipe_or_a_repeated_call_is_not_a_new_use(api, services):
    """rule QS5: statistics count turns: a swipe, a regenerate or the same action asked twice
    does not count again; a new action does."""
    chat(api)
    alpha = card(api, "Alpha", ["alpha"])
    uses = lambda: services.db.reader().execute(
        "SELECT uses, last_turn FROM lore_stats WHERE lore_id=?", (alpha,)).fetchone()[:]
    turn(api, text="alpha")
    assert uses() == (1, 1)
    turn(api, text="alpha")
    turn(api, text="alpha", generation_type="swipe")
    turn(api, text="alpha", generation_type="regenerate")
    assert uses() == (1, 1)
    turn(api, text="alpha!", generation_type="normal")
    assert uses() == (2, 2)


def test_qs5_statistics_listed_follow_a_rename_and_go_with_the_chat(api, services):
    """rule QS5: a chat's card statistics are listed for the panel; a renamed chat keeps them,
    a deleted chat takes them (and its turn counter) with it."""
    chat(api)
    alpha = card(api, "Alpha", ["alpha"])
    turn(api, text="alpha")
    turn(api, text="alpha again")
    stats = expect_ok(api.get("/v1/lore/stats?chat_id=c1"), 200, "lore_stats.response")["stats"]
    assert [(s["lore_id"], s["uses"], s["last_turn"]) for s in stats] == [(alpha, 2, 2)]
    expect_ok(api.post("/v1/chats/c1/rename", json={"new_id": "c2"}))
    assert expect_ok(api.get("/v1/lore/stats?chat_id=c1"))["stats"] == []
    assert expect_ok(api.get("/v1/lore/stats?chat_id=c2"))["stats"][0]["uses"] == 2
    out = turn(api, chat="c2", text="alpha once more")
    assert section(out, "story_cards")["included"][0]["detail"].startswith("action 0; uses 2")
    removed = expect_ok(api.delete("/v1/chats/c2"))["removed"]
    assert removed["lore_stats"] == 1 and removed["context_turns"] == 1
    assert services.db.reader().execute("SELECT count(*) FROM context_turns").fetchone()[0] == 0


def test_rv2_context_tokens_remembered_on_the_chat(api):
    """RV2: the chat remembers the context size it was last assembled for (its live window)."""
    chat(api)
    turn(api, ctx=4096)
    assert expect_ok(api.get("/v1/chats/c1"))["chat"]["context_tokens"] == 4096
    turn(api, ctx=16384, generation_type="swipe")
    assert expect_ok(api.get("/v1/chats/c1"), 200, "chat.response")["chat"]["context_tokens"] == 16384
    turn(api, ctx=200)  # assembled, but no model's window: the chat keeps its size
    assert expect_ok(api.get("/v1/chats/c1"), 200, "chat.response")["chat"]["context_tokens"] == 16384


def test_sw7_imported_world_info_triggers_through_the_route(api):
    """rule SW7/QS6: an imported World Info entry fires on its key; a disabled one never does."""
    chat(api)
    expect_ok(api.post("/v1/lore/import", json={"world_info": {"entries": {
        "0": {"key": ["glade"], "content": "The glade is warded.", "comment": "Glade"},
        "1": {"key": ["glade"], "content": "Old text.", "comment": "Old", "disable": True}}}}), 201)
    out = turn(api, text="We rest in the Glade.")
    assert block(out, "story_cards") == "[World]\nGlade: The glade is warded."


# --- the budget invariant -------------------------------------------------------------------------

TEXTS = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=400)


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(ctx=st.integers(1, 3000), action=TEXTS, note=TEXTS, instructions=TEXTS, front=TEXTS,
       bank=st.booleans(), kind=st.sampled_from(["action", "continue"]), as_text=st.booleans(),
       speaker=st.sampled_from(["a.png", "b.png", "stranger.png"]))
def test_budget_never_exceeded_for_random_requests(api_with_store, ctx, action, note, instructions,
                                                   front, bank, kind, as_text, speaker):
    """QS1-QS8: blocks + history + last action never exceed context_tokens (real counter)."""
    out = turn(api_with_store, speaker=speaker, ctx=ctx, authors_note=note, instructions=instructions,
               front_memory=front, memory_bank=bank, last_action={"text": action, "kind": kind},
               history_as_text=as_text)
    blocks = sum(C.count(b["text"]) for b in out["blocks"])
    assert all(C.count(b["text"]) == b["tokens"] for b in out["blocks"])
    # As text, history and the last action are blocks themselves; otherwise the client sends them.
    total = blocks if as_text else (
        blocks + section(out, "history")["used"] + section(out, "last_action")["used"])
    assert total <= ctx
    assert out["report"]["used"] == total


@pytest.fixture
def api_with_store(api):
    """A store with sheets, secrets, cards and memories for the property test."""
    character(api, "a.png", "Ayla", personality="Brave " * 50, secrets=[{"text": "Secret " * 30}])
    character(api, "b.png", "Bren", personality="Sly " * 80)
    chat(api, members=["a.png", "b.png"])
    for i in range(6):
        card(api, f"Card{i}", ["the", "a", f"k{i}"], text=f"Lore {i} " * (20 * i + 5))
    for i in range(4):
        memory(api, f"Pinned {i} " * 10, pinned=True)
        memory(api, f"Memory {i} " * 30)
    post_messages(api, "c1", [f"Line {i}: the k{i % 6} road " * (1 + i % 5) for i in range(30)])
    return api


# --- with the transcript: the scan window and history through the route ---------------------------

def post_messages(api, chat_id, texts):
    """Messages m1..mN, oldest first, alternating player and narrator."""
    body = {"messages": [{"id": f"m{i + 1}", "role": "user" if i % 2 == 0 else "assistant",
                          "name": "Player" if i % 2 == 0 else "Narrator", "text": text,
                          "sent_at": f"2026-03-01T12:{i:02d}:00Z"} for i, text in enumerate(texts)]}
    expect_ok(api.post(f"/v1/chats/{chat_id}/messages", json=body))


@pytest.mark.parametrize("card_tokens,actions", [(400, 4), (500, 4), (501, 5), (900, 9)])
def test_qs6_scan_window_through_the_route(api, card_tokens, actions):
    """rule QS6: with 400/500/501/900 tokens for story cards, the 4/4/5/9 latest actions are
    scanned: exactly the cards named in those actions fire, end to end."""
    chat(api)
    cards = {k: card(api, f"Card{k}", [f"key{k}"], text=f"Fact {k}.") for k in range(1, 13)}
    # Message m12 (the last action) names key1, m11 names key2, ... m1 names key12.
    texts = [f"We speak of key{13 - i} tonight." for i in range(1, 13)]
    post_messages(api, "c1", texts)
    last = texts[-1]
    dynamic = card_tokens * 100 // 25  # the cards' share is 25% of the dynamic budget (QS4)
    ctx = C.count(last) + dynamic
    out = turn(api, text=last, ctx=ctx, last_action={"text": last, "id": "m12"}, memory_bank=False)
    assert section(out, "story_cards")["allocated"] == card_tokens
    assert out["report"]["scan_actions"] == actions
    assert set(out["report"]["fired_triggers"]) == {cards[k] for k in range(1, actions + 1)}
    assert ids(section(out, "story_cards")["included"]) == [cards[k] for k in range(1, actions + 1)]
    assert out["live_message_ids"][-1] == "m12"


def test_qs7_history_is_the_live_window_newest_first(api):
    """rule QS7/RV2: history comes from the chat's live window; the last action is counted once
    and live_message_ids lists what the client should keep, oldest first."""
    chat(api)
    texts = [f"Line {i} of the tale." for i in range(1, 9)]
    post_messages(api, "c1", texts)
    out = turn(api, text=texts[-1], ctx=4000, last_action={"text": texts[-1], "id": "m8"})
    assert ids(section(out, "last_action")["included"]) == ["m8"]
    assert ids(section(out, "history")["included"]) == [f"m{i}" for i in range(7, 0, -1)]
    assert out["live_message_ids"] == [f"m{i}" for i in range(1, 9)]
    assert section(out, "history")["used"] == sum(C.count(t) for t in texts[:-1])


def test_sw2_sw3_story_summary_and_open_notes_reach_the_context(api, services):
    """rules SW2/SW3: after a session ends (extractive jobs run), its summary is the story summary;
    the chat's open notes are campaign notes, most pressing first; resolved ones stay out."""
    from tests.helpers.conversation import drain, setup_chat, turns

    setup_chat(api)
    turns(api, 0, 6)
    expect_ok(api.post("/v1/chats/c1/sessions/end", json={}))
    drain(services)
    urgent = expect_ok(api.post("/v1/chats/c1/notes", json={"text": "The lantern thief is loose.",
                                                             "priority": 5}), 201)["note"]["id"]
    later = expect_ok(api.post("/v1/chats/c1/notes", json={"text": "Repay the ferryman.",
                                                            "priority": 1}), 201)["note"]["id"]
    done = expect_ok(api.post("/v1/chats/c1/notes", json={"text": "Find the mill.",
                                                           "priority": 3}), 201)["note"]["id"]
    expect_ok(api.patch(f"/v1/notes/{done}", json={"status": "resolved"}))
    out = turn(api, speaker="ayla.png", text="Kai looks around.", ctx=8000)
    assert ids(section(out, "campaign_notes")["included"]) == [urgent, later]
    summary = section(out, "story_summary")["included"]
    assert ids(summary)[0] == "session:1:full"
    assert block(out, "story_summary").startswith("[Story so far]\n")
    assert "Find the mill." not in json.dumps(out)


def test_sw2_story_summary_is_read_again_whenever_a_summary_changes(api, services):
    """rule SW2: the Story Summary is kept between turns only while its tables are unchanged:
    any writer's change to a session's summary (here a direct SQL fix) or to the summaries reaches
    the next context; a session's last-message time (moved by every message) does not count."""
    from server_plugin.store import changes
    from tests.helpers.conversation import drain, setup_chat, turns

    setup_chat(api)
    turns(api, 0, 6)
    expect_ok(api.post("/v1/chats/c1/sessions/end", json={}))
    drain(services)
    first = block(turn(api, speaker="ayla.png", text="Kai looks around.", ctx=8000), "story_summary")
    assert "The ferry sank at dawn." not in first
    before = changes.counter(services, "summaries")
    with services.db.write() as conn:
        conn.execute("UPDATE sessions SET last_at=last_at WHERE chat_id='c1'")
    assert changes.counter(services, "summaries") == before
    with services.db.write() as conn:
        conn.execute("UPDATE sessions SET full='The ferry sank at dawn.' WHERE chat_id='c1' AND n=1")
    assert "The ferry sank at dawn." in block(turn(api, speaker="ayla.png", text="Kai waits.", ctx=8000),
                                              "story_summary")
    with services.db.write() as conn:
        conn.execute("DELETE FROM sessions WHERE chat_id='c1'")
        conn.execute("DELETE FROM summaries WHERE chat_id='c1'")
    out = turn(api, speaker="ayla.png", text="Kai sits.", ctx=8000)
    assert section(out, "story_summary")["included"] == []


# --- speed helpers must not change results --------------------------------------------------------

WORDY = st.text(alphabet=st.sampled_from(list("ab c-+!?\nA雪塔흑/")), max_size=12)
MATCHES = st.builds(Match, st.sampled_from(WHOLE_WORDS), st.booleans())


@settings(max_examples=300, deadline=None)
@given(cards=st.lists(st.tuples(st.lists(WORDY, max_size=3), MATCHES), max_size=8),
       texts=st.lists(WORDY, max_size=5))
def test_qs6_card_prefilter_is_a_superset_of_what_fires(cards, texts):
    """rule QS6: the trigger index may only spare cards that cannot fire; every card whose
    trigger occurs (ScanWindow, the exact rule, in any whole-words mode and case) is among the
    candidates."""
    index = TriggerIndex((f"k{i}", triggers, match) for i, (triggers, match) in enumerate(cards))
    window = ScanWindow(texts)
    fired = {f"k{i}" for i, (triggers, match) in enumerate(cards) if window.hits(triggers, match)}
    assert fired <= index.candidates(texts)


def test_soft_state_write_skips_the_disk_wait_and_restores_the_pragma(overrides, request):
    """db.write(durable=False) (used for card statistics) commits with synchronous=NORMAL, and the
    writer is back to the configured FULL afterwards, also after a failed transaction."""
    overrides["sqlite_synchronous"] = "FULL"
    services = request.getfixturevalue("services")
    pragma = lambda conn: conn.execute("PRAGMA synchronous").fetchone()[0]  # noqa: E731
    assert pragma(services.db._writer) == 2  # FULL
    with services.db.write(durable=False) as conn:
        assert pragma(conn) == 1  # NORMAL for this transaction
        conn.execute("UPDATE generations SET n = n + 1 WHERE name='lore'")
    assert pragma(services.db._writer) == 2
    with pytest.raises(ZeroDivisionError):
        with services.db.write(durable=False):
            1 / 0
    assert pragma(services.db._writer) == 2
    with services.db.write() as conn:
        assert pragma(conn) == 2
    assert services.db.reader().execute(
        "SELECT n FROM generations WHERE name='lore'").fetchone()[0] == 1


def test_rv7_per_turn_set_cached_until_its_own_tables_change(api, services, monkeypatch):
    """RV7 (speed): the per-turn memory selection is reused while only messages and statistics
    are written, and recomputed as soon as a memory, the chat or a character changes."""
    from server_plugin.story import memories

    calls = []
    original = memories._select_for_turn
    monkeypatch.setattr(memories, "_select_for_turn",
                        lambda *a: calls.append(1) or original(*a))
    character(api, "a.png", "Ayla")
    chat(api, members=["a.png"])
    first = memory(api, "Ayla keeps a red kite.")
    turn(api, speaker="a.png", text="one")  # the chat records its context size: a chat change
    turn(api, speaker="a.png", text="one and a half")
    calls.clear()
    post_messages(api, "c1", ["A message arrives.", "Another."])
    out = turn(api, speaker="a.png", text="two")
    assert calls == []  # messages and card statistics were written: same selection
    assert ids(section(out, "memory_bank")["included"]) == [first]
    second = memory(api, "Ayla fears deep water.")
    out = turn(api, speaker="a.png", text="three")
    assert len(calls) == 1 and set(ids(section(out, "memory_bank")["included"])) == {first, second}
    expect_ok(api.put("/v1/characters/a.png", json={"name": "Ayla", "learn_from_chat": False}))
    out = turn(api, speaker="a.png", text="four")
    assert len(calls) == 2 and section(out, "memory_bank")["included"] == []  # RV14
    expect_ok(api.put("/v1/characters/a.png", json={"name": "Ayla", "learn_from_chat": True}))
    expect_ok(api.put("/v1/chats/c1", json={"memory_enabled": False}))
    out = turn(api, speaker="a.png", text="five")
    assert section(out, "memory_bank")["included"] == []  # RV16


# --- QS8 with SW6: search results join the memory bank ------------------------------------------

OATH = "I swore on my mother's grave never to sail the Black Reach again."


def left_the_window(api, chat_id="c1"):
    """The oath, then 59 small lines: the live window (at most 50 messages, RV2) has lost it."""
    post_messages(api, chat_id, [OATH] + [f"Line {i} of the tale." for i in range(2, 61)])


def test_qs8_sw6_a_message_that_left_the_live_window_comes_back_through_search(api):
    """rules QS8/SW6/RV2: the memory bank holds search's results for the last action; a message
    outside the live window returns verbatim with its speaker, and no live message is repeated."""
    character(api, "a.png", "Ayla")
    chat(api, members=["a.png"])
    left_the_window(api)
    out = turn(api, speaker="a.png", text="Will you sail the Black Reach with us tomorrow?")
    assert "m1" not in out["live_message_ids"]
    bank = ids(section(out, "memory_bank")["included"])
    assert "message:m1" in bank
    assert f"Player: {OATH}" in block(out, "memory_bank")
    assert not {f"message:{m}" for m in out["live_message_ids"]} & set(bank)


def test_sw9b_search_in_the_bank_only_brings_what_the_speaker_witnessed(api):
    """rule SW9b: messages said before a character joined the chat are not its to recall."""
    character(api, "a.png", "Ayla")
    character(api, "b.png", "Brann")
    chat(api, members=["b.png"])
    left_the_window(api)
    expect_ok(api.put("/v1/chats/c1", json={"member_ids": ["b.png", "a.png"]}))  # Ayla joins later
    action = "Will you sail the Black Reach with us tomorrow?"
    assert "message:m1" in ids(section(turn(api, speaker="b.png", text=action), "memory_bank")["included"])
    out = turn(api, speaker="a.png", text=action)
    assert not [i for i in ids(section(out, "memory_bank")["included"]) if i.startswith("message:")]
    assert "Black Reach never" not in block(out, "memory_bank")


def test_rv5_rv16_search_in_the_bank_keeps_the_chats_scopes_and_switches(api):
    """rules RV5/RV16/QS4: a memory of a character outside this chat stays out of its bank;
    memory off for the chat or the bank off by the client means no search results either."""
    character(api, "a.png", "Ayla")
    character(api, "z.png", "Zed")
    chat(api, members=["a.png"])
    mine = memory(api, "Ayla keeps a silver compass from the Black Reach.", scope="character",
                  character_id="a.png")
    theirs = memory(api, "Zed sank a ship in the Black Reach.", scope="character", character_id="z.png")
    action = "Tell me about the Black Reach."
    bank = ids(section(turn(api, speaker="a.png", text=action), "memory_bank")["included"])
    assert mine in bank and theirs not in bank
    left_the_window(api)
    out = turn(api, speaker="a.png", text=action, memory_bank=False)
    assert section(out, "memory_bank")["included"] == []
    expect_ok(api.put("/v1/chats/c1", json={"memory_enabled": False}))
    assert section(turn(api, speaker="a.png", text=action), "memory_bank")["included"] == []


def test_qs8_fusion_puts_an_item_both_lists_rank_high_first(services):
    """rule QS8: the per-turn set and search's results are fused by reciprocal rank."""
    from server_plugin.core.assemble import Item
    from server_plugin.retrieval.bank import memory_bank
    unpinned = [{"id": "x", "text": "X", "version": 1}, {"id": "y", "text": "Y", "version": 1}]
    found = [Item("message:m1", "P: old line"), Item("y", "Y")]
    fused = memory_bank(services, None, unpinned, found)
    assert [i.id for i in fused] == ["y", "x", "message:m1"]
    assert [i.id for i in memory_bank(services, None, unpinned)] == ["x", "y"]


# --- chats in scripts without spaces ----------------------------------------------------------------

def test_qs5_sw1_a_chinese_chats_context_holds_its_triggered_card_and_named_characters_sheet(api):
    """rules LG1, QS5, SW1: a story card triggered by 黑塔 inside a Chinese sentence is in the context,
    and so is the sheet of a character named 林月 in it; a Korean name with a particle too."""
    character(api, "kai.png", "凯")
    character(api, "lin.png", "林月", personality="冷静的剑士。")
    character(api, "seo.png", "서연", personality="조용한 궁수.")
    chat(api, members=["kai.png"])
    tower = card(api, "黑塔", ["黑塔"], text="黑塔是古代法师的遗迹，塔顶藏着宝藏。")
    card(api, "白塔", ["白塔"], text="白塔在南方。")
    out = turn(api, speaker="kai.png", text="林月说：我们明天去黑塔看看吧。")
    assert "黑塔是古代法师的遗迹" in block(out, "story_cards")
    assert "白塔在南方" not in block(out, "story_cards")
    assert tower in ids(section(out, "story_cards")["included"])
    assert out["report"]["present"].get("lin.png") == "mentioned"
    assert "冷静的剑士" in block(out, "character_sheets")
    out = turn(api, speaker="kai.png", text="서연이가 흑탑으로 갔다.")
    assert out["report"]["present"].get("seo.png") == "mentioned"
