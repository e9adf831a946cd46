"""The no-model fallback (rule OP1, `extractive` mode): deterministic, verbatim, within budget, and
the same result types as the model parsers (rules RV3, RV13, RV18, RV9c, RV9d, SW2–SW5, SW8, SW9b)."""

from __future__ import annotations

import pytest

from server_plugin.core.quotes import find_verbatim
from server_plugin.core.tokens import get_counter
from server_plugin.jobs.tasks.base import CharacterRef, ChatMessage, Extraction, Prompt
from server_plugin.jobs.tasks.episodes import (
    CharacterMemory,
    SceneSummary,
    character_memories,
    extract_character_memories,
    extract_scenes,
    scene_summaries,
    split_scenes,
)
from server_plugin.jobs.tasks.memories import (
    KINDS,
    MemoryDraft,
    durable_memories,
    extract_durable,
    extract_from_conversation,
    extract_from_description,
    memories_from_description,
    save_from_conversation,
)
from server_plugin.jobs.tasks.registry import fallback
from server_plugin.jobs.tasks.summaries import (
    SessionSummary,
    Summary,
    SummaryInput,
    chunk_summary,
    merge_summaries,
    session_summary,
    summarize_chunk,
    summarize_merge,
    summarize_session,
)
from server_plugin.jobs.tasks.told import SecretInput, ToldEvent, extract_told, told_events
from tests.helpers.tasks import DEFAULTS, limits

SAM = CharacterRef("persona-sam", "Sam", is_player=True)
YUKI = CharacterRef("yuki.png", "Yuki")
BREN = CharacterRef("bren.png", "Bren")

NIGHT = [
    ChatMessage("m-01", "Sam", "I'm glad I was hungry and decided to open the door at 2 a.m.", "user",
                "persona-sam", "2026-03-01T02:00:00Z"),
    ChatMessage("m-02", "Yuki", "*She sets the mug down. Slowly. Carefully.* \u201cYou opened the door at 2 a.m. "
                "because you were hungry.\u201d *She turns toward you on the sofa.*", "assistant", "yuki.png",
                "2026-03-01T02:01:00Z"),
    ChatMessage("m-03", "Sam", "Yes. And please call me Red, everyone does. I'm allergic to peanuts, by the way.",
                "user", "persona-sam", "2026-03-01T02:02:00Z"),
    ChatMessage("m-04", "Yuki", "\u201cAnd I was crying in the hallway because I\u2026 wasn\u2019t okay. And you saw me. "
                "And you said: \u2018I\u2019m not peeking.\u2019\u201d She laughs softly. \u201cI promise I will never "
                "forget that, Red.\u201d", "assistant", "yuki.png", "2026-03-01T02:03:00Z"),
    ChatMessage("m-05", "Sam", "My birthday is on the ninth of May. We need to find the captain tomorrow.",
                "user", "persona-sam", "2026-03-01T02:04:00Z"),
    ChatMessage("m-06", "Yuki", "*Yuki nods, still smiling.* \u201cThen we go at dawn. Together.\u201d", "assistant",
                "yuki.png", "2026-03-01T02:05:00Z"),
]


def long_chat(n: int = 60) -> list[ChatMessage]:
    """A longer deterministic chat (for budgets): narration, speech, names, numbers."""
    places = ["the harbour", "the engine room", "the bridge", "the cargo hold", "the galley"]
    out = []
    for i in range(n):
        place = places[i % len(places)]
        if i % 2 == 0:
            out.append(ChatMessage(f"x-{i:03d}", "Sam", f"Let's check {place} before shift {i}. "
                                   f"I think Bren hid something there.", "user", "persona-sam"))
        else:
            out.append(ChatMessage(f"x-{i:03d}", "Yuki",
                                   f"*Yuki walks to {place} and looks around for a long while.* "
                                   f"\u201cThere is nothing here, Red, except dust number {i}.\u201d "
                                   "*She frowns and taps the wall twice.*", "assistant", "yuki.png"))
    return out


# --- chunk summaries (RV3) --------------------------------------------------------------------

def test_rv3_extractive_chunk_summary_is_deterministic():
    """rule OP1 (extractive mode): the same chunk gives the same summary, every time."""
    a = summarize_chunk(NIGHT, **limits("chunk_summary", budget_tokens=120))
    b = summarize_chunk(list(NIGHT), **limits("chunk_summary", budget_tokens=120))
    assert a == b
    assert fallback(chunk_summary(NIGHT, **limits("chunk_summary", budget_tokens=120))) == a


def test_sw8_extractive_quotes_are_verbatim_and_attributed():
    """rules SW8, RV3: every quote is in its cited message word for word, attributed to its speaker,
    and speech in the text appears as `Speaker: “…”` with the words from that speaker's message."""
    s = summarize_chunk(NIGHT, **limits("chunk_summary", budget_tokens=200))
    assert s.quotes
    by_id = {m.id: m for m in NIGHT}
    for q in s.quotes:
        assert q.text in by_id[q.message_id].text
        assert q.speaker == by_id[q.message_id].speaker
    speech_lines = [line for line in s.text.splitlines() if "\u201c" in line]
    assert speech_lines
    for line in speech_lines:
        speaker, _, rest = line.partition(": ")
        said = rest[rest.index("\u201c") + 1: rest.index("\u201d")]
        assert any(find_verbatim(said, m.text) for m in NIGHT if m.speaker == speaker), line


@pytest.mark.parametrize("budget", [25, 40, 80, 150, 300, 600])
def test_rv3_extractive_chunk_summary_respects_the_token_budget(budget):
    """rule OP1: the rendered summary (text and quotes) never exceeds its token budget."""
    counter = get_counter()
    s = summarize_chunk(long_chat(), **limits("chunk_summary", budget_tokens=budget))
    assert s.text.strip()
    assert counter.count(s.render()) <= budget
    assert s.covers == tuple(m.id for m in long_chat())


def test_rv3_extractive_summary_keeps_names_promises_and_memorable_lines():
    """rule RV3: with room for a few lines, the promise, the name and the allergy are chosen."""
    s = summarize_chunk(NIGHT, **limits("chunk_summary", budget_tokens=110)).render()
    assert "I promise I will never forget that, Red." in s
    assert "call me Red" in s
    assert "allergic to peanuts" in s


def test_rv3_extractive_sentences_keep_their_order():
    """rule RV3: chosen sentences appear in the order they were written."""
    s = summarize_chunk(long_chat(20), **limits("chunk_summary", budget_tokens=400))
    shifts = [int(line.split("shift ")[1].split(".")[0]) for line in s.text.splitlines() if "shift " in line]
    assert shifts == sorted(shifts) and len(shifts) > 2


# --- merges (RV3) ------------------------------------------------------------------------------

def _children() -> list[SummaryInput]:
    chat = long_chat(80)
    parts = [summarize_chunk(chat[i:i + 20], **limits("chunk_summary", budget_tokens=150))
             for i in range(0, 80, 20)]
    return [SummaryInput(f"sum-{i}", s.text, s.quotes) for i, s in enumerate(parts)]


def test_rv3_extractive_merge_spreads_over_all_children_within_budget():
    """rule RV3: 4 -> 1 by selection; each child contributes; the budget holds."""
    children = _children()
    merged = summarize_merge(children, **limits("merge_summaries", budget_tokens=200))
    assert get_counter().count(merged.render()) <= 200
    assert merged.covers == ("sum-0", "sum-1", "sum-2", "sum-3")
    for child in children:
        sentences = [line.split(": ", 1)[-1] for line in child.text.splitlines()]
        assert any(sent[:30] in merged.text for sent in sentences), child.id
    for q in merged.quotes:
        assert any(q in c.quotes for c in children)  # chosen among the children's, never new


def test_rv3_extractive_merge_reads_a_persons_edit():
    """rule RV3: a summary a person edited is merged from its edited text."""
    children = _children()
    children[2] = SummaryInput("sum-2", "Red swore an oath to the captain named Ilse at midnight.")
    merged = summarize_merge(children, **limits("merge_summaries", budget_tokens=300))
    assert "Red swore an oath to the captain named Ilse at midnight." in merged.text


def test_rv3_extractive_merge_is_deterministic():
    merge = limits("merge_summaries")
    assert summarize_merge(_children(), **merge) == summarize_merge(_children(), **merge)


# --- sessions (SW2, SW3) --------------------------------------------------------------------------

def test_sw2_extractive_session_full_and_short():
    """rule SW2: a full summary within its budget and a one-paragraph short one within its own;
    rule SW3: the promise and the plan become open threads, the promise first."""
    counter = get_counter()
    s = summarize_session(NIGHT, session=1, **limits("session_summary", full_tokens=300, short_tokens=60))
    assert isinstance(s, SessionSummary)
    assert counter.count(s.full) <= 300
    assert "\n" not in s.short and 0 < counter.count(s.short) <= 60
    assert s.notes[0].priority == 4 and "I promise" in s.notes[0].text
    assert any("find the captain tomorrow" in n.text for n in s.notes)
    assert s.resolved_note_ids == ()
    assert s.covers == tuple(m.id for m in NIGHT)


def test_sw2_extractive_session_from_earlier_summaries_and_tail():
    """rule SW2: a long session is summarised from its earlier summaries plus the remaining messages."""
    earlier = [SummaryInput("sum-a", "Red and Yuki boarded the night train to Kessel.")]
    s = summarize_session(NIGHT[:2], earlier=earlier, **limits("session_summary", full_tokens=400))
    assert "night train to Kessel" in s.full
    assert s.covers == ("sum-a", "m-01", "m-02")


# --- durable facts (RV13, RV18) -------------------------------------------------------------------

def test_rv18_extractive_durable_facts_by_pattern_with_sources():
    """rules RV13, RV18: a preferred name, an allergy, a birthday and a promise, each citing its
    message; the player's facts are filed under the one character they talk to."""
    result = extract_durable(NIGHT, [SAM, YUKI], **limits("durable_memories", max_items=10))
    assert isinstance(result, Extraction)
    got = {(d.kind, d.text, d.source_message_ids) for d in result.items}
    assert ("name", "Sam wants to be called Red.", ("m-03",)) in got
    assert ("allergy", "Sam is allergic to peanuts.", ("m-03",)) in got
    assert ("birthday", "Sam's birthday is the ninth of May.", ("m-05",)) in got
    assert ("promise", "Yuki promised: \u201cI promise I will never forget that, Red.\u201d", ("m-04",)) in got
    assert all(d.scope == "character" and d.character_id == "yuki.png" for d in result.items)


def test_rv18_extractive_mood_plot_and_relationships_are_not_memories():
    """rule RV18: moods, plot progress and relationships do not become memories."""
    chat = [ChatMessage("a", "Sam", "I'm so sad today. We finally reached the castle.", "user"),
            ChatMessage("b", "Yuki", "\u201cI think I'm falling for you.\u201d She blushes.", "assistant", "yuki.png")]
    assert extract_durable(chat, [SAM, YUKI], **limits("durable_memories")).items == ()


def test_rv13_extractive_durable_is_bounded_and_skips_saved_facts():
    """rule RV13: a few items per run; what is already saved is not filed again."""
    result = extract_durable(NIGHT, [SAM, YUKI], existing=["Sam wants to be called Red."],
                             **limits("durable_memories", max_items=2))
    assert len(result.items) == 2
    assert all(d.text != "Sam wants to be called Red." for d in result.items)
    assert any("already saved" in d for d in result.dropped_items)
    assert any("over the limit" in d for d in result.dropped_items)


def test_rv4_extractive_filing_in_a_group_and_for_a_characters_own_fact():
    """rule RV4: in a group the player's fact is global; a character's own fact is its own."""
    chat = [ChatMessage("a", "Sam", "Call me Red.", "user", "persona-sam"),
            ChatMessage("b", "Bren", "\u201cMy name is Bren Halloway, and I'm allergic to cats.\u201d",
                        "assistant", "bren.png")]
    result = extract_durable(chat, [SAM, YUKI, BREN], **limits("durable_memories", max_items=5))
    assert [(d.scope, d.character_id, d.text) for d in result.items] == [
        ("global", None, "Sam wants to be called Red."),
        ("character", "bren.png", "Bren's name is Bren Halloway.")]


# --- character memories, scenes, told (SW4, SW5, SW9b) --------------------------------------------

def test_sw4_extractive_character_memory_format():
    """rule SW4: one memory per involved character in the standard format, verified quotes (SW8),
    witnesses = the chat's members (SW9b)."""
    result = extract_character_memories(NIGHT, [SAM, YUKI], session=7, **limits("character_memories"))
    (mem,) = result.items
    assert isinstance(mem, CharacterMemory)
    assert mem.character_id == "yuki.png" and mem.session == 7
    assert mem.witnesses == ("persona-sam", "yuki.png")
    assert set(mem.participants) == {"persona-sam", "yuki.png"}
    assert 1 <= mem.importance <= 5
    assert mem.feeling in {"sad", "happy", "afraid", "angry", "embarrassed", "surprised", "relieved",
                           "affectionate", "not stated"}
    assert mem.source_message_ids == tuple(m.id for m in NIGHT)
    by_id = {m.id: m.text for m in NIGHT}
    assert mem.quotes and all(q.text in by_id[q.message_id] for q in mem.quotes)
    assert get_counter().count(mem.summary) <= DEFAULTS.character_memory_tokens


def test_sw4_extractive_no_memory_for_an_uninvolved_character():
    """rule SW4: in a group, a character neither speaking nor named gets no memory of the scene."""
    chat = [ChatMessage("a", "Sam", "Yuki, look at this map.", "user", "persona-sam"),
            ChatMessage("b", "Yuki", "\u201cIt shows the old mine.\u201d", "assistant", "yuki.png")]
    result = extract_character_memories(chat, [SAM, YUKI, BREN], **limits("character_memories"))
    assert [m.character_id for m in result.items] == ["yuki.png"]


def test_sw5_extractive_scenes_split_at_breaks_and_pauses():
    """rule SW5: scene summaries with quotes; a *** line or a long pause starts a new scene."""
    chat = NIGHT[:3] + [ChatMessage("m-07", "Yuki", "***\nThe next morning, Yuki packs the bags. "
                                    "\u201cReady, Red?\u201d", "assistant", "yuki.png", "2026-03-01T02:06:00Z"),
                        ChatMessage("m-08", "Sam", "Ready.", "user", "persona-sam", "2026-03-01T09:00:00Z")]
    result = extract_scenes(chat, [SAM, YUKI], session=1, **limits("scene_summaries"))
    scenes = result.items
    assert [s.source_message_ids for s in scenes] == [("m-01", "m-02", "m-03"), ("m-07",), ("m-08",)]
    assert all(isinstance(s, SceneSummary) and s.witnesses == ("persona-sam", "yuki.png") for s in scenes)
    assert scenes[1].quotes[0].text == "Ready, Red?"
    capped = split_scenes(long_chat(60), max_scenes=3, gap_minutes=DEFAULTS.scene_gap_minutes,
                          max_messages=DEFAULTS.scene_max_messages)
    assert len(capped) == 3 and sum(len(s) for s in capped) == 60


def test_sw9b_extractive_told_event_when_a_knower_retells_the_secret():
    """rule SW9b: Bren, who knows the secret, says it in front of Yuki: Yuki is told; the evidence
    is the verbatim sentence."""
    secret = SecretInput("sec-1", "The captain stole the emerald from the museum.", ("bren.png",))
    chat = [ChatMessage("a", "Bren", "*Bren leans in.* \u201cListen. The captain stole that emerald from the "
                        "museum last winter.\u201d", "assistant", "bren.png"),
            ChatMessage("b", "Yuki", "\u201cNo way.\u201d", "assistant", "yuki.png")]
    result = extract_told(chat, [SAM, YUKI, BREN], [secret], **limits("told_events"))
    (event,) = result.items
    assert isinstance(event, ToldEvent)
    assert (event.teller_id, event.listener_ids, event.secret_id) == ("bren.png", ("persona-sam", "yuki.png"), "sec-1")
    assert event.evidence.message_id == "a" and event.evidence.text in chat[0].text


def test_sw9b_extractive_no_told_event_from_someone_who_does_not_know():
    """rule SW9b: a character who does not know the secret cannot tell it; a vague hint is not telling."""
    secret = SecretInput("sec-1", "The captain stole the emerald from the museum.", ("bren.png",))
    chat = [ChatMessage("a", "Yuki", "\u201cThe captain stole the emerald from the museum!\u201d", "assistant", "yuki.png"),
            ChatMessage("b", "Bren", "\u201cThe captain has secrets.\u201d", "assistant", "bren.png")]
    assert extract_told(chat, [SAM, YUKI, BREN], [secret], **limits("told_events")).items == ()


# --- memories a person asks for (RV9c, RV9d) -------------------------------------------------------

def test_rv9c_extractive_memories_from_description():
    """rule RV9c: drafts come from the person's text only, one per sentence, kinds by pattern."""
    result = extract_from_description("Sam's favourite colour is green. He swore he'd never lie to Yuki. "
                                      "He grew up in Oslo.", YUKI,
                                      **limits("memories_from_description", max_items=2))
    assert [(d.text, d.kind) for d in result.items] == [("Sam's favourite colour is green.", "fact"),
                                                        ("He swore he'd never lie to Yuki.", "fact")]
    assert all(d.character_id == "yuki.png" and d.source_message_ids == () for d in result.items)
    assert len(result.dropped_items) == 1
    with pytest.raises(ValueError, match="1000"):
        extract_from_description("y" * 1001, YUKI, **limits("memories_from_description"))


def test_rv9d_extractive_save_from_conversation():
    """rule RV9d: facts found by pattern first, then the raw text of the other messages; at most 5."""
    result = extract_from_conversation(NIGHT, YUKI, **limits("save_from_conversation"))
    assert len(result.items) == 5
    first = result.items[0]
    assert first.kind in KINDS and first.source_message_ids
    raw = [d for d in result.items if d.kind == "fact"]
    assert raw and raw[0].text.startswith(("Sam: ", "Yuki: "))
    assert all(len(d.text) <= DEFAULTS.memory_max_chars for d in result.items)
    with pytest.raises(ValueError, match="at most 20"):
        extract_from_conversation(long_chat(21), YUKI, **limits("save_from_conversation"))


# --- same types as the parsers -------------------------------------------------------------------

@pytest.mark.parametrize("prompt, kind", [
    (chunk_summary(NIGHT, **limits("chunk_summary")), Summary),
    (merge_summaries([SummaryInput("a", "One. Two."), SummaryInput("b", "Three.")],
                     **limits("merge_summaries")), Summary),
    (session_summary(NIGHT, **limits("session_summary")), SessionSummary),
    (durable_memories(NIGHT, [SAM, YUKI], **limits("durable_memories")), MemoryDraft),
    (character_memories(NIGHT, [SAM, YUKI], **limits("character_memories")), CharacterMemory),
    (scene_summaries(NIGHT, [SAM, YUKI], **limits("scene_summaries")), SceneSummary),
    (told_events(NIGHT, [SAM, YUKI], [SecretInput("s", "Red is allergic to peanuts", ("persona-sam",))],
                 **limits("told_events")),
     ToldEvent),
    (memories_from_description("Sam likes tea.", YUKI, **limits("memories_from_description")), MemoryDraft),
    (save_from_conversation(NIGHT, YUKI, **limits("save_from_conversation")), MemoryDraft),
], ids=lambda x: getattr(x, "task", ""))
def test_extractive_run_gives_the_parsers_types_and_is_deterministic(prompt, kind):
    """rule OP1: callers don't care who produced a result: a Task's fallback returns the parser's types,
    and the same prompt gives the same result."""
    result = fallback(prompt)
    assert result == fallback(Prompt.from_payload(prompt.to_payload()))
    items = result.items if isinstance(result, Extraction) else (result,)
    assert items and all(isinstance(x, kind) for x in items)
