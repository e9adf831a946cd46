"""Prompts and their strict parsers (rule OP2: a malformed answer fails the job with a clear error and stores
nothing; the extraction formats of SW4, SW5, SW8, SW9b; rules RV3, RV9c, RV9d,
RV13, RV18, SW2, SW3)."""

from __future__ import annotations

import json

import pytest

from server_plugin.core.quotes import Quote
from server_plugin.jobs.tasks.answers import Report
from server_plugin.jobs.tasks.base import (
    CharacterRef,
    ChatMessage,
    Extraction,
    Prompt,
    PromptParseError,
    extract_json,
    to_dict,
)
from server_plugin.jobs.tasks.episodes import (
    CharacterMemory,
    SceneSummary,
    character_memories,
    scene_summaries,
)
from server_plugin.jobs.tasks.memories import (
    MemoryDraft,
    durable_memories,
    memories_from_description,
    save_from_conversation,
)
from server_plugin.jobs.tasks.registry import TASKS, parse
from server_plugin.jobs.tasks.summaries import (
    NoteInput,
    NoteProposal,
    SessionSummary,
    Summary,
    CHUNK_SUMMARY,
    SummaryInput,
    chunk_summary,
    merge_summaries,
    session_summary,
)
from server_plugin.jobs.tasks.told import SecretInput, ToldEvent, told_events
from tests.helpers.fakellm import GARBAGE
from tests.helpers.tasks import DEFAULTS, limits

SAM = CharacterRef("persona-sam", "Sam", is_player=True)
AYLA = CharacterRef("ayla.png", "Ayla", aliases=("Ay",))
BREN = CharacterRef("bren.png", "Bren")
CAST = [SAM, AYLA, BREN]

CHAT = [
    ChatMessage("uuid-0001", "Sam", "Call me Red. I'm allergic to peanuts.", "user", "persona-sam"),
    ChatMessage("uuid-0002", "Ayla", "*Ayla smiles.* \u201cI\u2019ll remember that, Red. I promise.\u201d",
                "assistant", "ayla.png"),
    ChatMessage("uuid-0003", "Bren", "\u201cThe key is under the third stone,\u201d Bren whispers to Ayla.",
                "assistant", "bren.png"),
    ChatMessage("uuid-0004", "Sam", "I didn't hear that. Let's go to the harbour.", "user", "persona-sam"),
]


def answer(obj) -> str:
    return json.dumps(obj, ensure_ascii=False)


def q(speaker, text, label):
    return {"speaker": speaker, "text": text, "message": label}


# --- JSON extraction -------------------------------------------------------------------------

def test_parse_accepts_bare_fenced_and_prose_wrapped_json():
    """rule OP2: a ```json fence, or prose around one object, is unambiguous and accepted."""
    obj = {"summary": "x", "quotes": []}
    assert extract_json(json.dumps(obj)) == obj
    assert extract_json("```json\n" + json.dumps(obj) + "\n```") == obj
    assert extract_json("Here you go:\n```\n" + json.dumps(obj) + "\n```\nHope it helps.") == obj
    assert extract_json("Sure! " + json.dumps(obj) + " Done.") == obj
    assert extract_json(json.dumps(obj) + "\nI kept it short.") == obj


@pytest.mark.parametrize("bad, reason", [
    ("", "empty"),
    ("Sorry, I cannot help with that.", "no JSON object"),
    (GARBAGE, "beyond repair"),
    ('["a list"]', "not an object"),
    ("```python\n{}\n```", "not JSON"),
])
def test_parse_rejects_what_holds_no_json_object(bad, reason):
    """rule OP2: an answer that holds no JSON object is rejected with a reason."""
    with pytest.raises(ValueError, match=reason):
        extract_json(bad)


@pytest.mark.parametrize("broken, expected", [
    ('{"a": 1} and also {"b": 2}', {"a": 1}),
    ("```json\n{'single': 'quotes'}\n```", {"single": "quotes"}),
    ('{"summary": "cut off', {"summary": "cut off"}),
    ('{"a": [1, 2,],}', {"a": [1, 2]}),
    ("<think>Let me see {draft}</think>\n{\"a\": 1}", {"a": 1}),
    ("<think>never closed, then {\"a\": 1}", {"a": 1}),
    ("Sure! Here is the JSON:\n```json\n{\"a\": 1}\n```\n```json\n{}\n```", {"a": 1}),
])
def test_parse_repairs_the_common_breakages(broken, expected):
    """rule OP2: reasoning blocks and prefaces are stripped and broken JSON is repaired (json_repair)."""
    assert extract_json(broken) == expected


def test_parse_error_names_the_task_and_quotes_the_answer():
    """rule OP2: the error is a sentence a person can act on: task, reason, start of the answer."""
    with pytest.raises(PromptParseError) as info:
        parse(chunk_summary(CHAT, **limits("chunk_summary")), GARBAGE)
    message = str(info.value)
    assert message.startswith("chunk_summary: the model's answer was rejected")
    assert "garbage" in message
    assert info.value.task == "chunk_summary"


ALL_TASKS = [
    chunk_summary(CHAT, **limits("chunk_summary")),
    merge_summaries([SummaryInput("s-1", "A."), SummaryInput("s-2", "B.")], **limits("merge_summaries")),
    session_summary(CHAT, **limits("session_summary")),
    durable_memories(CHAT, CAST, **limits("durable_memories")),
    character_memories(CHAT, CAST, **limits("character_memories")),
    scene_summaries(CHAT, CAST, **limits("scene_summaries")),
    told_events(CHAT, CAST, [SecretInput("lore-9", "The key is under the third stone.", ("bren.png",))],
                **limits("told_events")),
    memories_from_description("Sam is afraid of the dark.", AYLA, **limits("memories_from_description")),
    save_from_conversation(CHAT[:2], AYLA, **limits("save_from_conversation")),
]


@pytest.mark.parametrize("prompt", ALL_TASKS, ids=lambda p: p.task)
def test_every_parser_rejects_garbage_and_empty_objects(prompt):
    """rule OP2: for every task, the fake model's garbage and an empty object are parse errors."""
    for bad in (GARBAGE, "{}", '{"unexpected": true}', "```python\n{}\n```"):
        with pytest.raises(PromptParseError):
            parse(prompt, bad)


@pytest.mark.parametrize("prompt", ALL_TASKS, ids=lambda p: p.task)
def test_every_prompt_states_its_format_and_round_trips(prompt):
    """rules OP1, OP2 (client mode): each prompt asks for JSON, carries its schema, and survives the
    JSON round trip a job row and the extension impose."""
    assert "JSON" in prompt.system
    assert prompt.json_schema == TASKS[prompt.task].schema
    again = Prompt.from_payload(json.loads(json.dumps(prompt.to_payload())))
    assert again == prompt
    assert prompt.messages[0]["role"] == "system" and prompt.messages[1]["role"] == "user"
    assert prompt.max_tokens > 0


def test_client_mode_generate_raw_arguments():
    """rules OP1, OP2 (client mode): the extension gets generateRaw's arguments, nothing of the chat."""
    prompt = ALL_TASKS[0]
    args = prompt.for_client()
    assert args["systemPrompt"] == prompt.system and args["prompt"] == prompt.user
    assert args["responseLength"] == prompt.max_tokens
    assert args["jsonSchema"]["value"] == TASKS["chunk_summary"].schema


def test_response_format_modes():
    prompt = ALL_TASKS[0]
    assert prompt.response_format("off") is None
    assert prompt.response_format("json_object") == {"type": "json_object"}
    assert prompt.response_format("json_schema")["json_schema"]["schema"] == TASKS["chunk_summary"].schema
    with pytest.raises(ValueError):
        prompt.response_format("yaml")


# --- chunk summary (RV3) ---------------------------------------------------------------------

def test_rv3_chunk_prompt_labels_messages_and_asks_for_names_decisions_promises_quotes():
    """rule RV3: the recent-tier prompt keeps names, decisions, promises and exact quotes; messages
    carry labels the model cites (never the raw ids)."""
    prompt = chunk_summary(CHAT, previous="Earlier: they met at the inn.", **limits("chunk_summary"))
    for needle in ("name", "decision", "promise", "quotes", "[m1] Sam (player):", "[m4]",
                   "Earlier: they met at the inn."):
        assert needle in prompt.system + prompt.user
    assert "uuid-0001" not in prompt.user


def test_rv3_chunk_summary_parses_and_maps_labels_to_ids():
    """rule RV3: a valid answer becomes a Summary covering the chunk's message ids."""
    prompt = chunk_summary(CHAT, **limits("chunk_summary"))
    result = parse(prompt, answer({"summary": "Sam asked to be called Red; Ayla promised to remember.",
                                   "quotes": [q("Ayla", "I'll remember that, Red. I promise.", "m2")]}))
    assert isinstance(result, Summary)
    assert result.covers == ("uuid-0001", "uuid-0002", "uuid-0003", "uuid-0004")
    assert result.quotes == (Quote("Ayla", "I\u2019ll remember that, Red. I promise.", "uuid-0002"),)
    assert result.render().endswith("Ayla: \u201cI\u2019ll remember that, Red. I promise.\u201d")


def test_sw8_chunk_summary_drops_a_fabricated_quote_and_counts_it():
    """rule SW8: a quote that is not in the cited message is dropped and reported, not stored."""
    prompt = chunk_summary(CHAT, **limits("chunk_summary"))
    result = parse(prompt, answer({"summary": "They talked.", "quotes": [
        q("Ayla", "I will love you forever", "m2"),
        q("Bren", "The key is under the third stone", "m3")]}))
    assert [x.text for x in result.quotes] == ["The key is under the third stone"]
    assert [(d.quote.text, d.reason) for d in result.dropped_quotes] == [
        ("I will love you forever", "not_verbatim")]


@pytest.mark.parametrize("bad, reason", [
    ({"summary": "   ", "quotes": []}, "summary is blank"),
    ({"summary": 5, "quotes": []}, "not of type 'string'"),
    ({"quotes": []}, "'summary' is a required property"),
])
def test_rv3_chunk_summary_unusable_answers_are_rejected(bad, reason):
    """rule OP2: an answer whose summary itself is missing, blank or not text fails the parse."""
    with pytest.raises(PromptParseError, match=reason):
        parse(chunk_summary(CHAT, **limits("chunk_summary")), answer(bad))


@pytest.mark.parametrize("part, note", [
    ({"summary": "x"}, "a missing list was taken as empty"),
    ({"summary": "x", "quotes": [], "mood": "sad"}, "ignored a field nobody asked for: mood"),
    ({"summary": "x", "quotes": [], "reasoning": "I thought hard"}, "ignored a field nobody asked for: reasoning"),
])
def test_rv3_chunk_summary_keeps_the_valid_parts(part, note):
    """rule OP2: a missing list is empty and an unknown key ignored; the change is noted."""
    report = Report()
    result = CHUNK_SUMMARY.parse_answer(chunk_summary(CHAT, **limits("chunk_summary")), answer(part), report)
    assert result.text == "x"
    assert any(note in c for c in report.changed)


@pytest.mark.parametrize("bad", [
    q("Ayla", "I promise", "m9"), q("Ayla", "I promise", "uuid-0002"),
    {"speaker": "Ayla", "text": "I promise"},
])
def test_rv3_chunk_summary_drops_a_quote_with_a_label_not_given(bad):
    """rule OP2: a quote citing a label we did not give (or none) is dropped; the summary stays."""
    result = parse(chunk_summary(CHAT, **limits("chunk_summary")), answer({"summary": "x", "quotes": [bad]}))
    assert result.text == "x" and result.quotes == ()


def test_rv3_chunk_summary_keeps_at_most_max_quotes():
    prompt = chunk_summary(CHAT, **limits("chunk_summary", max_quotes=1))
    result = parse(prompt, answer({"summary": "x", "quotes": [
        q("Sam", "Call me Red.", "m1"), q("Bren", "The key is under the third stone", "m3")]}))
    assert len(result.quotes) == 1
    assert [d.reason for d in result.dropped_quotes] == ["over_limit"]


# --- merges (RV3) ----------------------------------------------------------------------------

CHILDREN = [
    SummaryInput("sum-1", "Sam (edited by a person: really named Red) met Ayla.",
                 (Quote("Ayla", "I promise.", "uuid-0002"),)),
    SummaryInput("sum-2", "Bren told Ayla where the key is.",
                 (Quote("Bren", "The key is under the third stone", "uuid-0003"),)),
    SummaryInput("sum-3", "They left for the harbour."),
    SummaryInput("sum-4", "A storm began."),
]


def test_rv3_merge_reads_the_given_edited_texts_and_picks_quotes_by_label():
    """rule RV3: 4 summaries -> 1; the merge reads the (edited) texts; kept quotes keep their
    original message ids, so a merge can never invent a quote."""
    prompt = merge_summaries(CHILDREN, tier="consolidated", **limits("merge_summaries"))
    assert "edited by a person: really named Red" in prompt.user
    assert "[q2] Bren:" in prompt.user and "[s4]" in prompt.user
    result = parse(prompt, answer({"summary": "Red met Ayla; Bren revealed the key; a storm came.",
                                   "keep_quotes": ["q2"]}))
    assert result.covers == ("sum-1", "sum-2", "sum-3", "sum-4")
    assert result.quotes == (Quote("Bren", "The key is under the third stone", "uuid-0003"),)


def test_rv3_merge_long_term_tier_and_bad_labels():
    prompt = merge_summaries(CHILDREN, tier="long_term",
                             **limits("merge_summaries", budget_tokens=DEFAULTS.summary_long_term_tokens))
    assert prompt.inputs["budget_tokens"] == DEFAULTS.summary_long_term_tokens
    report = Report()
    kept = TASKS["merge_summaries"].parse_answer(prompt, answer({"summary": "x", "keep_quotes": ["q7"]}), report)
    assert kept.text == "x" and kept.quotes == ()  # a label not given is left out, the rest kept
    assert report.dropped == ["'q7' is not one of the quote labels given"]
    with pytest.raises(ValueError):
        merge_summaries(CHILDREN, tier="recent", **limits("merge_summaries"))


# --- sessions (SW2, SW3) -----------------------------------------------------------------------

def test_sw2_session_summary_full_short_threads_and_resolved_notes():
    """rules SW2, SW3: a full summary, a one-paragraph short one, open threads with priority,
    and given open notes marked resolved by label."""
    notes = [NoteInput("note-1", "Find the key.", 4), NoteInput("note-2", "Repay Bren.", 2)]
    earlier = [SummaryInput("sum-9", "Earlier that night they met.")]
    prompt = session_summary(CHAT, earlier=earlier, open_notes=notes, session=3, **limits("session_summary"))
    assert "[n1] (priority 4) Find the key." in prompt.user and "Session 3" in prompt.user
    result = parse(prompt, answer({
        "full": "Sam, now Red, met Ayla. Bren revealed where the key is.",
        "short": "Red met Ayla;\nBren revealed the key.",
        "quotes": [q("Bren", "The key is under the third stone", "m3")],
        "open_threads": [{"text": "Go to the harbour.", "priority": 3}],
        "resolved": ["n1"]}))
    assert isinstance(result, SessionSummary)
    assert result.short == "Red met Ayla; Bren revealed the key."  # one paragraph, one line
    assert result.notes == (NoteProposal("Go to the harbour.", 3),)
    assert result.resolved_note_ids == ("note-1",)
    assert result.covers[0] == "sum-9" and result.covers[-1] == "uuid-0004"


def test_sw2_session_summary_malformed():
    base = {"full": "f", "short": "s", "quotes": [], "open_threads": [], "resolved": []}
    prompt = session_summary(CHAT, open_notes=[NoteInput("note-1", "Find the key.")],
                             **limits("session_summary"))
    with pytest.raises(PromptParseError, match="should be non-empty|too short"):
        parse(prompt, answer({**base, "full": ""}))


@pytest.mark.parametrize("patch, check, note", [
    ({"short": "One.\n\nTwo."}, lambda r: r.short == "One. Two.", "joined into one"),
    ({"open_threads": [{"text": "x", "priority": 9}, {"text": "y", "priority": 2}]},
     lambda r: r.notes == (NoteProposal("y", 2),), "9 is greater than the maximum of 5"),
    ({"resolved": ["n3", "n1"]}, lambda r: r.resolved_note_ids == ("note-1",), "'n3' is not one of the note labels"),
])
def test_sw2_session_summary_keeps_what_is_right(patch, check, note):
    """A session summary with one bad part keeps the rest; the job's result notes what was left out."""
    base = {"full": "f", "short": "s", "quotes": [], "open_threads": [], "resolved": []}
    prompt = session_summary(CHAT, open_notes=[NoteInput("note-1", "Find the key.")],
                             **limits("session_summary"))
    report = Report()
    result = TASKS["session_summary"].parse_answer(prompt, answer({**base, **patch}), report)
    assert check(result) and result.full == "f"
    assert any(note in x for x in report.changed + report.dropped)


def test_sw2_no_listed_note_means_a_resolved_label_is_dropped_not_the_summary():
    """The session summary a real model wrote with `"resolved": ["n1"]` and no note listed is kept."""
    prompt = session_summary(CHAT, **limits("session_summary"))
    assert '"resolved": []' in prompt.system and '"n1"' not in prompt.system
    result = parse(prompt, answer({"full": "f", "short": "s", "quotes": [], "open_threads": [],
                                   "resolved": ["n1"]}))
    assert result.full == "f" and result.resolved_note_ids == ()


# --- durable memories (RV13, RV18) -------------------------------------------------------------

def test_rv18_durable_prompt_draws_the_line_between_facts_and_summaries():
    """rule RV18: the prompt asks for names, birthdays, allergies, promises — not mood, plot or
    relationships — a few at most (RV13)."""
    prompt = durable_memories(CHAT, CAST, existing=["Sam's birthday is in May."],
                              **limits("durable_memories", max_items=3))
    text = prompt.system + prompt.user
    for needle in ("preferred name", "birthday", "allergy", "promise", "NOT moods",
                   "NOT plot progress", "NOT changing relationships", "At most 3",
                   "c2 = Ayla", "Sam's birthday is in May."):
        assert needle in text


def test_rv13_durable_memories_parse_scope_character_and_sources():
    """rule RV13: each item has the character concerned, a scope, text and its source message ids."""
    prompt = durable_memories(CHAT, CAST, **limits("durable_memories"))
    result = parse(prompt, answer({"memories": [
        {"character": "c2", "scope": "character", "kind": "name",
         "text": "Sam wants to be called Red.", "messages": ["m1"]},
        {"character": None, "scope": "global", "kind": "allergy",
         "text": "Sam is allergic to peanuts.", "messages": ["m1"]}]}))
    assert isinstance(result, Extraction)
    assert result.items == (
        MemoryDraft("Sam wants to be called Red.", "character", "ayla.png", "name", ("uuid-0001",)),
        MemoryDraft("Sam is allergic to peanuts.", "global", None, "allergy", ("uuid-0001",)))


def test_rv13_durable_memories_are_bounded_and_not_repeated():
    """rule RV13: a few items per run (extra ones reported, not stored); already-saved texts skipped."""
    prompt = durable_memories(CHAT, CAST, existing=["sam wants to be called  RED."],
                              **limits("durable_memories", max_items=1))
    mem = lambda text: {"character": "c2", "scope": "character", "kind": "fact", "text": text,  # noqa: E731
                        "messages": ["m1"]}
    result = parse(prompt, answer({"memories": [mem("Sam wants to be called Red."),
                                                mem("Sam is allergic to peanuts."),
                                                mem("Ayla promised to remember.")]}))
    assert [m.text for m in result.items] == ["Sam is allergic to peanuts."]
    assert len(result.dropped_items) == 2


@pytest.mark.parametrize("patch, reason", [
    ({"text": "x" * 501}, "more than 500"),
    ({"scope": "global"}, "must have character null"),
    ({"character": None}, "needs a character"),
    ({"character": "c7"}, "not one of the character labels"),
    ({"kind": "mood"}, "is not one of"),
    ({"messages": []}, "must cite at least one"),
    ({"messages": ["m5"]}, "must cite at least one"),
])
def test_rv8_rv13_durable_memories_malformed(patch, reason):
    """rules RV8 (500 characters), RV4 (scope), RV13: an answer whose only item is malformed has
    nothing to keep: it fails (with the item's reason)."""
    item = {"character": "c2", "scope": "character", "kind": "fact", "text": "ok", "messages": ["m1"]}
    with pytest.raises(PromptParseError, match=reason):
        parse(durable_memories(CHAT, CAST, **limits("durable_memories")),
              answer({"memories": [{**item, **patch}]}))


# --- character memories (SW4) -----------------------------------------------------------------

def test_sw4_character_memory_standard_format():
    """rule SW4: character_id, summary (own point of view), feeling, quotes {speaker, text,
    message_id}, participants, witnesses, session, importance, source_message_ids."""
    prompt = character_memories(CHAT, CAST, session=5, **limits("character_memories"))
    assert "Ayla" in prompt.system and "c2 (Ayla)" in prompt.system and "c1 (Sam)" not in prompt.system
    result = parse(prompt, answer({"memories": [{
        "character": "c2", "summary": "Ayla learned that Sam wants to be called Red.",
        "feeling": "warm, protective",
        "quotes": [q("Sam", "Call me Red.", "m1"), q("Sam", "I love you", "m1")],
        "participants": ["c1", "c2"], "importance": 4, "messages": ["m1", "m2"]}]}))
    (mem,) = result.items
    assert mem == CharacterMemory(
        "ayla.png", "Ayla learned that Sam wants to be called Red.", "warm, protective",
        (Quote("Sam", "Call me Red.", "uuid-0001"),), ("persona-sam", "ayla.png"),
        ("persona-sam", "ayla.png", "bren.png"), 5, 4, ("uuid-0001", "uuid-0002"))
    assert [d.reason for d in result.dropped_quotes] == ["not_verbatim"]  # SW8


def test_sw9b_witnesses_are_the_chat_members_not_the_models_guess():
    """rule SW9b: witnesses of a scene are the chat's members; the model does not decide them."""
    result = parse(character_memories(CHAT, CAST, **limits("character_memories")), answer({"memories": [{
        "character": "c3", "summary": "Bren whispered the secret.", "feeling": "nervous", "quotes": [],
        "participants": ["c3"], "importance": 2, "messages": ["m3"]}]}))
    assert result.items[0].witnesses == ("persona-sam", "ayla.png", "bren.png")


def test_sw4_character_memories_limits_and_unrequested_characters():
    """rule SW4: memories for a character not asked for, or beyond the per-character limit, are
    reported and not kept; importance must be 1-5."""
    prompt = character_memories(CHAT, CAST, for_ids=["ayla.png"],
                                **limits("character_memories", per_character=1))
    mem = {"character": "c2", "summary": "s", "feeling": "f", "quotes": [], "participants": [],
           "importance": 3, "messages": ["m2"]}
    result = parse(prompt, answer({"memories": [mem, mem, {**mem, "character": "c3"}]}))
    assert len(result.items) == 1 and len(result.dropped_items) == 2
    with pytest.raises(PromptParseError, match="less than the minimum of 1"):
        parse(prompt, answer({"memories": [{**mem, "importance": 0}]}))
    with pytest.raises(ValueError, match="not among the characters"):
        character_memories(CHAT, CAST, for_ids=["nobody.png"], **limits("character_memories"))


# --- scenes (SW5) -------------------------------------------------------------------------------

def test_sw5_scene_summaries_parse_with_quotes():
    """rule SW5: scenes with dialogue and actions and verified exact quotes."""
    prompt = scene_summaries(CHAT, CAST, session=2, **limits("scene_summaries"))
    result = parse(prompt, answer({"scenes": [{
        "title": "Names and secrets", "summary": "Sam asks to be called Red; Bren whispers to Ayla.",
        "quotes": [q("Bren", "The key is under the third stone", "m3"),
                   q("Bren", "The key is under the fourth stone", "m3")],
        "participants": ["c1", "c2", "c3"], "messages": ["m1", "m2", "m3", "m4"]}]}))
    (scene,) = result.items
    assert isinstance(scene, SceneSummary)
    assert scene.quotes == (Quote("Bren", "The key is under the third stone", "uuid-0003"),)
    assert scene.session == 2 and scene.witnesses == ("persona-sam", "ayla.png", "bren.png")
    assert len(result.dropped_quotes) == 1
    with pytest.raises(PromptParseError, match="must cite at least one"):
        parse(prompt, answer({"scenes": [{"title": "t", "summary": "s", "quotes": [],
                                          "participants": [], "messages": []}]}))


# --- told events (SW9b) ---------------------------------------------------------------------------

SECRET = SecretInput("lore-9", "The key is hidden under the third stone.", ("bren.png",))


def test_sw9b_told_event_with_verified_evidence():
    """rule SW9b: "X told Y about Z" is kept with its evidence verified verbatim in the message."""
    prompt = told_events(CHAT, CAST, [SECRET], **limits("told_events"))
    assert "[k1] The key is hidden under the third stone. (known by: c3)" in prompt.user
    result = parse(prompt, answer({"events": [{"teller": "c3", "listeners": ["c2", "c3"],
                                               "secret": "k1", "message": "m3",
                                               "evidence": "The key is under the third stone"}]}))
    (event,) = result.items
    assert event == ToldEvent("bren.png", ("ayla.png",), "lore-9",
                              Quote("Bren", "The key is under the third stone", "uuid-0003"))


def test_sw9b_told_event_with_fabricated_evidence_is_dropped():
    """rules SW9b, SW8: an event whose evidence is not in the message is dropped and counted."""
    result = parse(told_events(CHAT, CAST, [SECRET], **limits("told_events")), answer({"events": [{
        "teller": "c3", "listeners": ["c2"], "secret": "k1", "message": "m3",
        "evidence": "I buried the key myself"}]}))
    assert result.items == ()
    assert len(result.dropped_quotes) == 1 and "evidence not found" in result.dropped_items[0]


def test_sw9b_told_event_bad_labels():
    with pytest.raises(PromptParseError, match="secret labels"):
        parse(told_events(CHAT, CAST, [SECRET], **limits("told_events")), answer({"events": [{
            "teller": "c3", "listeners": ["c2"], "secret": "k2", "message": "m3", "evidence": "x"}]}))


# --- memories a person asks for (RV9c, RV9d) --------------------------------------------------------

def test_rv9c_generate_from_description_never_reads_the_chat():
    """rule RV9c: from a person's text of at most 1,000 characters; no chat in the prompt."""
    prompt = memories_from_description("Sam hates thunder. Sam's sister is called Mira.", AYLA,
                                       **limits("memories_from_description"))
    assert "What should Ayla remember?" in prompt.user and "<messages>" not in prompt.user
    result = parse(prompt, answer({"memories": [{"kind": "preference", "text": "Sam hates thunder."},
                                                {"kind": "fact", "text": "Sam's sister is Mira."}]}))
    assert result.items[0] == MemoryDraft("Sam hates thunder.", "character", "ayla.png", "preference")
    glob = parse(memories_from_description("Magic is rare.", None, **limits("memories_from_description")),
                 answer({"memories": [{"kind": "fact", "text": "Magic is rare."}]}))
    assert glob.items[0].scope == "global" and glob.items[0].character_id is None
    with pytest.raises(ValueError, match="1000"):
        memories_from_description("x" * 1001, AYLA, **limits("memories_from_description"))
    with pytest.raises(ValueError, match="empty"):
        memories_from_description("  ", AYLA, **limits("memories_from_description"))


def test_rv9d_save_from_conversation_bounds():
    """rule RV9d: at most 20 selected messages, at most 5 drafts, each citing its messages."""
    many = [ChatMessage(f"id{i}", "Sam", f"line {i}", "user") for i in range(21)]
    with pytest.raises(ValueError, match="at most 20"):
        save_from_conversation(many, AYLA, **limits("save_from_conversation"))
    prompt = save_from_conversation(many[:20], AYLA, **limits("save_from_conversation"))
    draft = {"kind": "promise", "text": "Sam promised.", "messages": ["m1", "m2"]}
    result = parse(prompt, answer({"memories": [draft] * 6}))
    assert len(result.items) == 5 and len(result.dropped_items) == 1
    assert result.items[0].source_message_ids == ("id0", "id1")
    with pytest.raises(PromptParseError, match="must cite at least one"):
        parse(prompt, answer({"memories": [{**draft, "messages": ["m21"]}]}))


def test_to_dict_is_json_ready():
    result = parse(chunk_summary(CHAT, **limits("chunk_summary")),
                   answer({"summary": "x", "quotes": [q("Sam", "Call me Red.", "m1")]}))
    data = to_dict(result)
    assert json.loads(json.dumps(data)) == data
    assert data["quotes"][0] == {"speaker": "Sam", "text": "Call me Red.", "message_id": "uuid-0001"}
