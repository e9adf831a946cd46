"""The pure assembler (server_plugin/core/assemble/): rules QS1-QS8, RV11, SW1-SW3, token for token.

Every expectation is computed with the real counter (`tokens.get_counter()`), on the exact texts
the assembler emits. Filler texts use words that are one token each ("apple apple ..."), so a cut
to n tokens keeps exactly n tokens and the arithmetic below is exact.
"""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from server_plugin.core.assemble import (
    DYNAMIC,
    REQUIRED,
    Assembly,
    Candidates,
    Card,
    CardStats,
    Item,
    LastAction,
    Message,
    Placement,
)
from server_plugin.core.assemble import assemble as assemble_with
from server_plugin.core.tokens import get_counter
from server_plugin.settings import defaults
from server_plugin.story.context import rules_from

C = get_counter()
RULES = rules_from(defaults())  # the shipped QS numbers: 70%, 25%, 50%, 4 / 100 / 500


def assemble(candidates: Candidates, context_tokens: int, counter, **options) -> Assembly:
    """The assembler with the shipped rules, unless a test gives its own."""
    return assemble_with(candidates, context_tokens, counter, **{"rules": RULES, **options})


BIG = 100_000
# QS3: the order in which Required items are kept when they pass the 70% cap
# (written out here, not imported, so a change of order in the code fails the tests).
REQUIRED_PRIORITY = ("authors_note", "plot_essentials", "instructions", "character_sheets",
                     "campaign_notes", "story_summary")


def words(n: int, word: str = "apple") -> str:
    """A text of exactly n tokens."""
    text = " ".join([word] * n)
    assert C.count(text) == n
    return text


def ctx_for_cap(cap: int) -> int:
    """The smallest context whose 70% cap (floored) is exactly `cap`."""
    ctx = cap * 100 // 70
    while ctx * 70 // 100 < cap:
        ctx += 1
    assert ctx * 70 // 100 == cap
    return ctx


def ids(entries) -> list[str]:
    return [e.id for e in entries]


def reasons(entries) -> list[str]:
    return [e.reason for e in entries]


def block(out, section):
    found = [b for b in out.blocks if b.section == section]
    return found[0] if found else None


LAST = words(10, "river")


def one_turn(**fields) -> Candidates:
    """Candidates with a user's last action (10 tokens) as the newest message."""
    fields.setdefault("messages", [Message("last", LAST)])
    fields.setdefault("last_action", LastAction(LAST))
    return Candidates(**fields)


def all_required() -> Candidates:
    """Every Required section filled, multi-item ones with several items."""
    return one_turn(
        front_memory=words(20, "stone"),
        pinned_memories=[Item("p1", words(10, "cloud")), Item("p2", words(10, "ember"))],
        authors_note=words(60, "cloud"),
        plot_essentials=words(60, "ember"),
        instructions=words(60, "apple"),
        character_sheets=[Item("s1", words(30, "river")), Item("s2", words(30, "stone"))],
        campaign_notes=[Item("n1", words(30, "cloud")), Item("n2", words(30, "ember"))],
        story_summary=[Item("full", words(40, "apple")), Item("short1", words(20, "river"))],
    )


# --- QS1/QS2: Required in full ------------------------------------------------------------------

def test_qs2_required_all_in_full_under_the_cap():
    """rule QS2: every Required item goes in in full when Required stays under 70%."""
    c = all_required()
    out = assemble(c, 2000, C)
    expected = {
        "front_memory": c.front_memory,
        "pinned_memories": "[Pinned memories]\n- " + words(10, "cloud") + "\n- " + words(10, "ember"),
        "authors_note": "[Author's note]\n" + c.authors_note,
        "plot_essentials": "[Plot essentials]\n" + c.plot_essentials,
        "instructions": c.instructions,
        "character_sheets": "[Characters present]\n" + words(30, "river") + "\n\n" + words(30, "stone"),
        "campaign_notes": "[Open threads]\n- " + words(30, "cloud") + "\n- " + words(30, "ember"),
        "story_summary": "[Story so far]\n" + words(40, "apple") + "\n\n" + words(20, "river"),
    }
    for section, text in expected.items():
        assert block(out, section).text == text, section
        assert block(out, section).tokens == C.count(text) == out.sections[section].used
        assert out.sections[section].truncated == out.sections[section].dropped == []
    total = C.count(LAST) + sum(C.count(t) for t in expected.values())
    assert out.required_used == total
    assert out.sections["last_action"].used == 10
    assert out.required_cap == 1400 and total <= 1400
    assert out.flags == []
    assert out.dynamic_tokens == 2000 - total


def test_qs2_continue_uses_the_last_model_output():
    """rule QS2: on a Continue, the last action is the model's latest output."""
    msgs = [Message("u1", words(5, "apple")), Message("a1", words(7, "stone"), role="assistant"),
            Message("u2", words(9, "cloud")), Message("a2", words(12, "ember"), role="assistant")]
    out = assemble(Candidates(messages=msgs, last_action=LastAction("", kind="continue")), 1000, C)
    assert ids(out.sections["last_action"].included) == ["a2"]
    assert out.sections["last_action"].used == 12
    assert ids(out.sections["history"].included) == ["u2", "a1", "u1"]  # a2 not counted twice
    assert out.sections["history"].used == 9 + 7 + 5
    assert out.live_message_ids == ["u1", "a1", "u2", "a2"]
    # An ordinary action with the same messages would be... the newest message's text.
    action = assemble(Candidates(messages=msgs[:3], last_action=LastAction(msgs[2].text)), 1000, C)
    assert ids(action.sections["last_action"].included) == ["u2"]
    assert action.sections["last_action"].used == 9


def test_qs2_continue_as_text_block_has_the_assistant_role():
    """rule QS2: as text, the continued output is the last block, in the assistant's role."""
    msgs = [Message("u1", "hello"), Message("a1", "The dragon", role="assistant", name="GM")]
    out = assemble(Candidates(messages=msgs, last_action=LastAction("x", kind="continue")),
                   1000, C, history_as_text=True)
    assert out.blocks[-1].section == "last_action"
    assert (out.blocks[-1].text, out.blocks[-1].role) == ("The dragon", "assistant")


def test_qs2_action_not_yet_in_the_chat_is_counted_once():
    """rule QS2/QS7: an action absent from the messages is the last action; all messages are history."""
    msgs = [Message("m1", words(5, "apple")), Message("m2", words(6, "stone"))]
    out = assemble(Candidates(messages=msgs, last_action=LastAction(words(8, "cloud"))), 1000, C)
    assert out.sections["last_action"].used == 8
    assert out.sections["history"].used == 11
    assert out.live_message_ids == ["m1", "m2"]
    assert out.used == 8 + 11


# --- QS3: over 70% --------------------------------------------------------------------------------

def full_sizes() -> dict[str, int]:
    out = assemble(all_required(), BIG, C)
    return {name: out.sections[name].allocated for name in REQUIRED}


@pytest.mark.parametrize("k", range(len(REQUIRED_PRIORITY)))
def test_qs3_cut_falls_on_each_priority_item(k):
    """rule QS3: items before the cut are in full, the first that does not fit is cut at its end
    to fit the 70% cap exactly (its beginning kept), every item after it is dropped."""
    sizes = full_sizes()
    fixed = sizes["last_action"] + sizes["front_memory"] + sizes["pinned_memories"]
    before = sum(sizes[name] for name in REQUIRED_PRIORITY[:k])
    cut_section = REQUIRED_PRIORITY[k]
    cap = fixed + before + sizes[cut_section] // 2
    full = assemble(all_required(), BIG, C)
    out = assemble(all_required(), ctx_for_cap(cap), C)

    assert out.required_cap == cap
    assert out.required_used == cap  # cut to fit exactly
    assert "required_over_cap" in out.flags
    for name in ("last_action", "front_memory", "pinned_memories"):
        assert out.sections[name].used == sizes[name]
    for name in REQUIRED_PRIORITY[:k]:
        assert out.sections[name].used == sizes[name]
        assert set(reasons(out.sections[name].included)) == {"in_full"}
    cut = out.sections[cut_section]
    assert cut.used == cap - fixed - before == block(out, cut_section).tokens
    assert C.count(block(out, cut_section).text) == cut.used
    assert block(full, cut_section).text.startswith(block(out, cut_section).text)
    assert reasons(cut.truncated) == ["over_required_cap"]
    for name in REQUIRED_PRIORITY[k + 1:]:
        report = out.sections[name]
        assert report.used == 0 and block(out, name) is None and report.included == []
        assert reasons(report.dropped) == ["after_cut"] * len(report.dropped) and report.dropped


def test_qs3_multi_item_section_is_cut_as_one_text():
    """rule QS3: a cut in the second character sheet keeps the first whole, cuts the second,
    drops the third."""
    sheets = [Item("s1", words(30, "river")), Item("s2", words(30, "stone")),
              Item("s3", words(30, "cloud"))]
    c = one_turn(character_sheets=sheets)
    header = C.count("[Characters present]\n")
    # room: the header, the first sheet, its separator and 12 tokens of the second one
    room = header + 30 + C.count("\n\n") + 12
    out = assemble(c, ctx_for_cap(10 + room), C)
    report = out.sections["character_sheets"]
    assert ids(report.included) == ["s1"]
    assert [(e.id, e.reason, e.tokens) for e in report.truncated] == [("s2", "over_required_cap", 12)]
    assert [(e.id, e.reason) for e in report.dropped] == [("s3", "after_cut")]
    assert block(out, "character_sheets").text == (
        "[Characters present]\n" + words(30, "river") + "\n\n" + words(12, "stone"))
    assert report.used == room


def test_qs3_everything_after_the_cut_is_dropped_even_what_would_fit():
    """rule QS3: once an item is cut, later items are left out even if they would fit the room left."""
    # Room after the fixed items: 3 tokens. The author's note header alone is 5: nothing of it
    # survives, so 3 tokens stay free; the 1-token instructions would fit, and must still go.
    c = one_turn(authors_note=words(50, "cloud"), instructions="Go")
    assert C.count("Go") == 1 and C.count("[Author's note]\n") == 5
    out = assemble(c, ctx_for_cap(10 + 3), C)
    assert [(e.id, e.reason) for e in out.sections["authors_note"].dropped] == [
        ("authors_note", "over_required_cap")]
    assert [(e.id, e.reason) for e in out.sections["instructions"].dropped] == [
        ("instructions", "after_cut")]
    assert out.required_used == 10
    assert block(out, "instructions") is None and block(out, "authors_note") is None


def test_qs3_front_memory_and_last_action_in_full_over_the_cap():
    """rule QS3: front memory and the last action are always in full, even beyond the cap."""
    c = one_turn(front_memory=words(80, "stone"), plot_essentials=words(20, "ember"))
    out = assemble(c, 100, C)  # cap 70 < 10 + 80
    assert out.sections["front_memory"].used == 80
    assert out.sections["last_action"].used == 10
    assert reasons(out.sections["plot_essentials"].dropped) == ["over_required_cap"]
    assert out.required_used == 90 and out.dynamic_tokens == 10


def test_qs3_pinned_in_full_with_the_fixed_items():
    """rule QS3/RV11: pinned memories stay in full when they fit the cap with front and last."""
    pinned = [Item(f"p{i}", words(10, "cloud")) for i in range(3)]
    c = one_turn(pinned_memories=pinned, authors_note=words(100, "ember"))
    pinned_tokens = C.count("[Pinned memories]\n" + "\n".join("- " + p.text for p in pinned))
    out = assemble(c, ctx_for_cap(10 + pinned_tokens + 7), C)
    assert out.sections["pinned_memories"].used == pinned_tokens
    assert reasons(out.sections["pinned_memories"].included) == ["in_full"] * 3
    assert out.sections["authors_note"].used == 7  # cut to what the cap leaves
    assert "pinned_over_cap" not in out.flags


def test_qs3_pinned_alone_over_the_cap_newest_first_flagged():
    """rule QS3/RV11: if pinned memories alone break the cap: newest first, as many as fit,
    and the report flags it. One that does not fit is skipped; an older, smaller one may fit."""
    pinned = [Item("p_newest", words(30, "cloud")), Item("p_big", words(30, "ember")),
              Item("p_small", words(5, "stone")), Item("p_oldest", words(30, "apple"))]
    c = one_turn(pinned_memories=pinned, authors_note=words(20, "river"))
    first = C.count("[Pinned memories]\n") + C.count("- " + pinned[0].text)
    small = C.count("\n- " + pinned[2].text)
    room = first + small + 2  # no room for a second 30-token memory
    out = assemble(c, ctx_for_cap(10 + room), C)
    report = out.sections["pinned_memories"]
    assert "pinned_over_cap" in out.flags
    assert [(e.id, e.reason) for e in report.included] == [("p_newest", "newest_first"),
                                                          ("p_small", "newest_first")]
    assert [(e.id, e.reason) for e in report.dropped] == [("p_big", "pinned_over_cap"),
                                                         ("p_oldest", "pinned_over_cap")]
    assert report.used == C.count(block(out, "pinned_memories").text) == first + small
    assert out.required_used <= out.required_cap


def test_qs3_fixed_items_never_exceed_the_context():
    """Hard invariant: a last action longer than the whole context is cut to it, and flagged."""
    c = one_turn(front_memory=words(50, "stone"))
    out = assemble(c, 8, C)
    assert out.sections["last_action"].used == 8
    assert reasons(out.sections["last_action"].truncated) == ["over_context"]
    assert out.sections["front_memory"].used == 0
    assert "last_action_over_context" in out.flags and "front_memory_over_context" in out.flags
    assert out.used == 8


# --- QS4: the dynamic split and flow-down ----------------------------------------------------------

def test_qs4_split_25_50_25():
    """rule QS4: cards 25%, history 50%, memory bank the rest of what Required left."""
    out = assemble(one_turn(), 10 + 1000, C)
    assert out.dynamic_tokens == 1000
    s = out.sections
    assert (s["story_cards"].allocated, s["history"].allocated, s["memory_bank"].allocated) == (250, 500, 250)
    # nothing to place: every unused share flows down
    assert (s["story_cards"].available, s["history"].available, s["memory_bank"].available) == (250, 750, 1000)


def test_qs4_split_25_75_with_the_memory_bank_off():
    """rule QS4: with the memory bank off, history gets 75% (all the rest)."""
    c = one_turn(memory_bank=[Item("m", "a memory")], memory_bank_enabled=False)
    out = assemble(c, 10 + 1003, C)
    s = out.sections
    assert (s["story_cards"].allocated, s["history"].allocated, s["memory_bank"].allocated) == (250, 753, 0)
    assert s["memory_bank"].available == 0
    assert [(e.id, e.reason) for e in s["memory_bank"].dropped] == [("m", "memory_bank_off")]
    assert block(out, "memory_bank") is None


def test_qs4_rounding_loses_no_token():
    """rule QS4: shares are floored and the memory bank takes the rest."""
    out = assemble(one_turn(), 10 + 1003, C)
    s = out.sections
    assert (s["story_cards"].allocated, s["history"].allocated, s["memory_bank"].allocated) == (250, 501, 252)


def test_qs4_unused_share_flows_down_cards_history_bank():
    """rule QS4: what cards leave goes to history; what history leaves goes to the memory bank."""
    card = Card("c1", words(40, "stone"), triggers=("river",))
    history = [Message(f"h{i}", words(100, "cloud")) for i in range(10)]
    bank = [Item(f"b{i}", words(100, "ember")) for i in range(8)]
    c = one_turn(messages=history + [Message("last", LAST)], story_cards=[card], memory_bank=bank)
    out = assemble(c, 10 + 1000, C)
    s = out.sections
    cards_used = C.count("[World]\n" + card.text)
    assert s["story_cards"].used == cards_used
    assert s["history"].available == 500 + 250 - cards_used
    hist_used = 100 * (s["history"].available // 100)  # 100-token messages, newest first
    assert hist_used == 700 and s["history"].used == hist_used
    assert ids(s["history"].included) == [f"h{i}" for i in range(9, 2, -1)]
    assert s["memory_bank"].available == 250 + s["history"].available - hist_used
    bank_piece = [C.count("[Memories]\n- " + bank[0].text)] + [C.count("\n- " + b.text) for b in bank[1:]]
    fit, total = 0, 0
    for cost in bank_piece:
        if total + cost > s["memory_bank"].available:
            break
        fit, total = fit + 1, total + cost
    assert len(s["memory_bank"].included) == fit and s["memory_bank"].used == total
    assert out.used == 10 + cards_used + hist_used + total <= 1010


# --- QS5/QS6: story cards ----------------------------------------------------------------------------

def chat(n: int, mention: dict[int, str]) -> list[Message]:
    """n messages, oldest first; message i (1-based) says `mention[i]` if given."""
    return [Message(f"m{i}", mention.get(i, f"quiet line {i}")) for i in range(1, n + 1)]


@pytest.mark.parametrize("card_tokens, actions", [(400, 4), (500, 4), (501, 5), (900, 9)])
def test_qs6_scan_window_in_the_assembly(card_tokens, actions):
    """rule QS6: the trigger scan covers max(4, floor(card tokens / 100)) latest actions above 500."""
    msgs = chat(12, {})
    last = msgs[-1]
    # card k is named only in the action k places back (0 = the last action)
    cards = [Card(f"k{k}", f"card {k}", triggers=(f"trigger{k}",)) for k in range(12)]
    msgs = [Message(m.id, f"{m.text} trigger{11 - i}") for i, m in enumerate(msgs)]
    dynamic = card_tokens * 4  # cards get exactly card_tokens
    c = Candidates(messages=msgs, last_action=LastAction(msgs[-1].text), story_cards=cards)
    last_tokens = C.count(msgs[-1].text)
    out = assemble(c, last_tokens + dynamic, C)
    assert out.sections["story_cards"].allocated == card_tokens
    assert out.scan_actions == actions
    assert sorted(out.fired_triggers) == sorted(f"k{k}" for k in range(actions))
    assert ids(out.sections["story_cards"].included) == [f"k{k}" for k in range(actions)]
    not_triggered = [e for e in out.sections["story_cards"].dropped if e.reason == "not_triggered"]
    assert sorted(ids(not_triggered)) == sorted(f"k{k}" for k in range(actions, 12))
    assert last.id == "m12"


def test_qs5_cards_ranked_by_recency():
    """rule QS5: the card named in a newer action ranks first, even if used less often."""
    msgs = chat(5, {3: "the dragon sleeps", 5: "I pick up the sword"})
    stats = {"dragon": CardStats(last_used=99, uses=50), "sword": CardStats(last_used=1, uses=1)}
    cards = [Card("dragon", words(30, "stone"), ("dragon",)), Card("sword", words(30, "cloud"), ("sword",))]
    c = Candidates(messages=msgs, last_action=LastAction(msgs[-1].text), story_cards=cards, card_stats=stats)
    last = C.count(msgs[-1].text)
    out = assemble(c, last + 4 * 40, C)  # 40 card tokens: room for one card
    assert ids(out.sections["story_cards"].included) == ["sword"]
    assert [(e.id, e.reason) for e in out.sections["story_cards"].dropped] == [("dragon", "no_room")]
    assert out.fired_triggers == {"sword": ["sword"], "dragon": ["dragon"]}


def test_qs5_cards_ranked_by_frequency():
    """rule QS5: named in the same action, the card whose triggers were used more often ranks first."""
    msgs = chat(5, {5: "the dragon guards the sword"})
    stats = {"dragon": CardStats(last_used=3, uses=9), "sword": CardStats(last_used=4, uses=2)}
    cards = [Card("sword", words(30, "cloud"), ("sword",)), Card("dragon", words(30, "stone"), ("dragon",))]
    c = Candidates(messages=msgs, last_action=LastAction(msgs[-1].text), story_cards=cards, card_stats=stats)
    out = assemble(c, C.count(msgs[-1].text) + 4 * 40, C)
    assert ids(out.sections["story_cards"].included) == ["dragon"]
    # equal use: the more recently used one (per-chat last_used) wins
    stats = {"dragon": CardStats(last_used=3, uses=2), "sword": CardStats(last_used=4, uses=2)}
    out = assemble(dataclasses.replace(c, card_stats=stats), C.count(msgs[-1].text) + 4 * 40, C)
    assert ids(out.sections["story_cards"].included) == ["sword"]


def test_qs5_a_card_that_does_not_fit_is_skipped_and_the_next_tried():
    """rule QS5 ("as many as fit"): a top card too big for the room does not block smaller ones."""
    msgs = chat(4, {4: "dragon and sword and shield"})
    cards = [Card("dragon", words(200, "stone"), ("dragon",)), Card("sword", words(20, "cloud"), ("sword",)),
             Card("shield", words(10, "ember"), ("shield",))]
    stats = {"dragon": CardStats(uses=3), "sword": CardStats(uses=2), "shield": CardStats(uses=1)}
    c = Candidates(messages=msgs, last_action=LastAction(msgs[-1].text), story_cards=cards, card_stats=stats)
    out = assemble(c, C.count(msgs[-1].text) + 4 * 40, C)
    assert ids(out.sections["story_cards"].included) == ["sword", "shield"]
    assert block(out, "story_cards").text == "[World]\n" + cards[1].text + "\n\n" + cards[2].text
    assert out.sections["story_cards"].used == C.count(block(out, "story_cards").text) <= 40


def test_qs5_always_cards_need_no_trigger_and_come_first():
    """rule QS5/SW7: an `always` card is a candidate without any trigger, ranked before triggered ones."""
    msgs = chat(4, {4: "the sword"})
    cards = [Card("sword", words(20, "cloud"), ("sword",)), Card("world", words(20, "stone"), always=True),
             Card("moon", "the moon", ("moon",))]
    c = Candidates(messages=msgs, last_action=LastAction(msgs[-1].text), story_cards=cards)
    out = assemble(c, C.count(msgs[-1].text) + 4 * 30, C)  # 30 tokens: one card
    report = out.sections["story_cards"]
    assert [(e.id, e.reason) for e in report.included] == [("world", "always")]
    assert [(e.id, e.reason) for e in report.dropped] == [("sword", "no_room"), ("moon", "not_triggered")]
    assert out.fired_triggers == {"sword": ["sword"]}


# --- QS7: history ------------------------------------------------------------------------------------

def test_qs7_history_newest_first_and_the_last_action_always_in():
    """rule QS7: the newest action is always in; older ones are added newest first until full."""
    msgs = [Message(f"m{i}", words(100, "cloud")) for i in range(1, 7)] + [Message("last", LAST)]
    c = Candidates(messages=msgs, last_action=LastAction(LAST), memory_bank_enabled=False)
    out = assemble(c, 10 + 400, C)  # history: 300 + the 100 unused by cards
    assert out.sections["history"].available == 400
    assert ids(out.sections["history"].included) == ["m6", "m5", "m4", "m3"]
    assert [(e.id, e.reason) for e in out.sections["history"].dropped] == [("m2", "no_room"), ("m1", "no_room")]
    assert out.live_message_ids == ["m3", "m4", "m5", "m6", "last"]
    assert out.sections["history"].used == 400
    # with no room at all, the last action is still live
    tiny = assemble(c, 10, C)
    assert tiny.live_message_ids == ["last"] and tiny.sections["history"].used == 0


def test_qs7_history_stops_at_the_first_message_that_does_not_fit():
    """rule QS7: history stays a contiguous tail: an older message never jumps a bigger newer one."""
    msgs = [Message("m1", words(5, "cloud")), Message("m2", words(300, "stone")),
            Message("m3", words(50, "ember")), Message("last", LAST)]
    c = Candidates(messages=msgs, last_action=LastAction(LAST), memory_bank_enabled=False)
    for as_text in (False, True):
        out = assemble(c, 10 + 200, C, history_as_text=as_text)
        assert ids(out.sections["history"].included) == ["m3"]
        assert ids(out.sections["history"].dropped) == ["m2", "m1"]
        assert out.live_message_ids == ["m3", "last"]


def test_qs7_history_as_text_on_request():
    """rule QS7: history is ids only by default; as a chronological text block when asked."""
    msgs = [Message("m1", "Hello there", role="assistant", name="Yuki"),
            Message("m2", "  Hi Yuki  ", name="Player"), Message("m3", LAST, name="Player")]
    c = Candidates(messages=msgs, last_action=LastAction(LAST))
    plain = assemble(c, 1000, C)
    assert block(plain, "history") is None and block(plain, "last_action") is None
    assert plain.sections["history"].used == C.count("Hello there") + C.count("  Hi Yuki  ")
    out = assemble(c, 1000, C, history_as_text=True)
    assert block(out, "history").text == "Yuki: Hello there\nPlayer: Hi Yuki"
    assert block(out, "history").tokens == C.count(block(out, "history").text) == out.sections["history"].used
    assert block(out, "last_action").text == LAST
    assert out.used == sum(b.tokens for b in out.blocks)


# --- QS8: memory bank ----------------------------------------------------------------------------------

def test_qs8_memory_bank_in_rank_order_as_many_as_fit():
    """rule QS8: ranked memories in rank order; one that does not fit is skipped; pinned ones not repeated."""
    bank = [Item("best", words(20, "cloud")), Item("huge", words(500, "stone")),
            Item("pinned", "already pinned"), Item("third", words(20, "ember")), Item("fourth", words(30, "apple"))]
    c = one_turn(memory_bank=bank, pinned_memories=[Item("pinned", "already pinned")])
    pinned_tokens = C.count("[Pinned memories]\n- already pinned")
    out = assemble(c, 10 + pinned_tokens + 200, C)  # bank: 50 + 150 flowed down
    report = out.sections["memory_bank"]
    assert report.available == 200
    assert ids(report.included) == ["best", "third", "fourth"]
    assert [(e.id, e.reason) for e in report.dropped] == [("huge", "no_room"), ("pinned", "duplicate")]
    assert block(out, "memory_bank").text == "[Memories]\n- " + "\n- ".join(
        [bank[0].text, bank[3].text, bank[4].text])
    assert report.used == C.count(block(out, "memory_bank").text)


# --- SW1/SW3/RV11 are Required; SW2 placement --------------------------------------------------------

def test_sw1_sw3_rv11_sheets_notes_pinned_are_required():
    """rules SW1, SW3, RV11: sheets, campaign notes and pinned memories are counted as Required."""
    c = one_turn(character_sheets=[Item("yuki", "Yuki: ice mage")], campaign_notes=[Item("t1", "Find the key")],
                 pinned_memories=[Item("p", "Yuki hates cats")])
    out = assemble(c, 1000, C)
    for name in ("character_sheets", "campaign_notes", "pinned_memories"):
        assert out.sections[name].used == block(out, name).tokens > 0
    assert out.required_used == 10 + sum(block(out, n).tokens for n in
                                         ("character_sheets", "campaign_notes", "pinned_memories"))
    assert out.dynamic_tokens == 1000 - out.required_used


def test_sw2_default_placement_start_and_end():
    """rule SW2: standing material early (before/in the prompt), pressing material late (in chat, low depth)."""
    c = all_required()
    c = dataclasses.replace(c, memory_bank=[Item("m", "a memory")],
                            story_cards=[Card("k", "a card", always=True)])
    out = assemble(c, 4000, C)
    place = {b.section: (b.position, b.depth, b.role) for b in out.blocks}
    assert place["instructions"] == ("before_prompt", 0, "system")
    for name in ("plot_essentials", "character_sheets", "story_summary", "story_cards"):
        assert place[name][0] == "in_prompt"
    for name in ("pinned_memories", "memory_bank", "campaign_notes", "authors_note", "front_memory"):
        assert place[name][0] == "in_chat" and place[name][1] <= 3
    order = [b.section for b in out.blocks]
    assert order[0] == "instructions" and order[-1] == "front_memory"
    depths = [b.depth for b in out.blocks if b.position == "in_chat"]
    assert depths == sorted(depths, reverse=True)


def test_sw2_placement_can_be_overridden():
    """rule SW2: the placement map is a parameter."""
    c = one_turn(authors_note="Keep it grim")
    out = assemble(c, 1000, C, placements={"authors_note": Placement("in_chat", 4, "user")})
    b = block(out, "authors_note")
    assert (b.position, b.depth, b.role) == ("in_chat", 4, "user")


def test_rules_are_parameters():
    """rules QS3/QS4: the percentages come from Rules (settings), not constants."""
    rules = dataclasses.replace(RULES, context_required_percent=50, context_cards_percent=10,
                                context_history_percent=60)
    out = assemble(one_turn(), 10 + 1000, C, rules=rules)
    assert out.required_cap == 505
    s = out.sections
    assert (s["story_cards"].allocated, s["history"].allocated, s["memory_bank"].allocated) == (100, 600, 300)


def test_report_serialises_to_the_api_shape():
    """API.md POST /v1/context: blocks, live_message_ids and report with every section."""
    out = assemble(all_required(), 2000, C).to_dict()
    assert set(out) == {"blocks", "live_message_ids", "report"}
    assert set(out["blocks"][0]) == {"section", "text", "tokens", "position", "depth", "role"}
    report = out["report"]
    assert report["context_tokens"] == 2000 and report["required_cap"] == 1400
    assert set(report["sections"]) == set(REQUIRED + DYNAMIC)
    for section in report["sections"].values():
        assert set(section) == {"allocated", "available", "used", "included", "truncated", "dropped"}
    assert report["sections"]["instructions"]["included"] == [
        {"id": "instructions", "reason": "in_full", "tokens": 60}]


# --- the hard invariant (property) -------------------------------------------------------------------

TEXT = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=60) | st.sampled_from(
    ["", " ", "cat", "the dark lord", "Yuki 雪 ❄️", "ünïcödé… text.", "a\n\nb", "word " * 30])
ITEMS = st.lists(st.builds(Item, id=st.sampled_from(["a", "b", "c", "d", "e"]), text=TEXT), max_size=5)


@st.composite
def candidates(draw):
    n = draw(st.integers(0, 8))
    messages = [Message(f"m{i}", draw(TEXT), role=draw(st.sampled_from(["user", "assistant", "system"])),
                        name=draw(st.sampled_from(["", "Yuki"]))) for i in range(n)]
    kind = draw(st.sampled_from(["action", "continue"]))
    last_text = draw(st.sampled_from([messages[-1].text if messages else "", "new action"]) | TEXT)
    cards = [Card(f"k{i}", draw(TEXT), triggers=tuple(draw(st.lists(TEXT, max_size=2))),
                  always=draw(st.booleans())) for i in range(draw(st.integers(0, 4)))]
    return Candidates(
        last_action=LastAction(last_text, kind),
        messages=messages,
        instructions=draw(TEXT), plot_essentials=draw(TEXT), authors_note=draw(TEXT),
        front_memory=draw(TEXT),
        story_summary=draw(ITEMS), pinned_memories=draw(ITEMS), character_sheets=draw(ITEMS),
        campaign_notes=draw(ITEMS), story_cards=cards, memory_bank=draw(ITEMS),
        card_stats={f"k{i}": CardStats(draw(st.integers(0, 9)), draw(st.integers(0, 9))) for i in range(4)},
        memory_bank_enabled=draw(st.booleans()),
    )


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(c=candidates(), ctx=st.integers(0, 400) | st.integers(0, 5), as_text=st.booleans())
def test_invariant_budget_never_exceeded(c, ctx, as_text):
    """Hard invariant (QS1-QS8): blocks + history + last action never exceed context_tokens,
    every count is the counter's count of the emitted text, no section passes its room."""
    out = assemble(c, ctx, C, history_as_text=as_text)
    s = out.sections
    assert out.used <= ctx
    for b in out.blocks:
        assert b.tokens == C.count(b.text) == s[b.section].used and b.text
    in_blocks = sum(b.tokens for b in out.blocks)
    outside = 0 if as_text else s["history"].used + s["last_action"].used
    assert in_blocks + outside == out.used
    assert out.required_used == sum(s[n].used for n in REQUIRED)
    assert out.required_used <= max(out.required_cap, s["last_action"].used + s["front_memory"].used)
    assert out.dynamic_tokens == ctx - out.required_used
    for name in DYNAMIC:
        assert s[name].used <= s[name].available
    assert s["story_cards"].available + s["history"].allocated + s["memory_bank"].allocated <= out.dynamic_tokens
    # QS3: at most one cut, and nothing included after it
    cut_at = [i for i, n in enumerate(REQUIRED_PRIORITY) if s[n].truncated or
              any(e.reason == "over_required_cap" for e in s[n].dropped)]
    assert len(cut_at) <= 1
    if cut_at:
        for name in REQUIRED_PRIORITY[cut_at[0] + 1:]:
            assert s[name].included == [] and s[name].used == 0
    # QS7: the live ids are messages, and the last action (when it is one) is always live
    message_ids = [m.id for m in c.messages]
    assert set(out.live_message_ids) <= set(message_ids)
    last_ids = [e.id for e in s["last_action"].included + s["last_action"].truncated]
    if last_ids and last_ids[0] in message_ids:
        assert last_ids[0] in out.live_message_ids


@pytest.mark.parametrize("context_tokens", [300, 1000, 4000])
def test_qs3_story_summary_items_out_of_reach_are_not_candidates(context_tokens):
    """rule QS3: the story summary's candidates stop at the first item whose tokens, with those
    before it, pass twice the context; what the prompt holds is the same as with every item (the
    older ones could never appear), and the report lists only the candidates."""
    from server_plugin.story.context import within_reach

    summary = [Item(f"s{i}", words(20 + 7 * (i % 5), ("apple", "river", "stone", "cloud")[i % 4]))
               for i in range(400)]
    kept = within_reach(summary, context_tokens, C)
    tokens = [C.count(i.text) for i in summary]
    assert sum(tokens[:len(kept) - 1]) <= 2 * context_tokens < sum(tokens[:len(kept)])
    assert kept == summary[:len(kept)] and len(kept) < len(summary)
    whole = assemble(one_turn(story_summary=summary), context_tokens, C)
    near = assemble(one_turn(story_summary=kept), context_tokens, C)
    assert [(b.section, b.text) for b in near.blocks] == [(b.section, b.text) for b in whole.blocks]
    assert ids(near.sections["story_summary"].included) == ids(whole.sections["story_summary"].included)
    listed = near.sections["story_summary"]
    assert len(listed.included) + len(listed.truncated) + len(listed.dropped) == len(kept)
    short = summary[:3]
    assert within_reach(short, context_tokens, C) == short
