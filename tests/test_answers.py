"""Keeping what is right in a real model's answer (rule MJ2): every prompt's own example passes
its validator; a name given for a label is mapped; a quote is kept only when its speaker said it."""

from __future__ import annotations

import json
import re

import pytest

from server_plugin.core.quotes import speaker_said
from server_plugin.jobs.tasks.answers import Report
from server_plugin.jobs.tasks.base import CharacterRef, ChatMessage, PromptParseError
from server_plugin.jobs.tasks.episodes import character_memories, scene_summaries
from server_plugin.jobs.tasks.memories import durable_memories, memories_from_description, save_from_conversation
from server_plugin.jobs.tasks.registry import TASKS
from server_plugin.jobs.tasks.sheets import Newcomer, SheetInput, sheet_updates
from server_plugin.jobs.tasks.summaries import (
    NoteInput,
    SummaryInput,
    chunk_summary,
    merge_summaries,
    session_summary,
)
from server_plugin.jobs.tasks.told import SecretInput, told_events
from tests.helpers.tasks import limits

KAI = CharacterRef("kai.png", "Kai", is_player=True)
MIRA = CharacterRef("mira.png", "Mira", aliases=("Mi",))
TOMAS = CharacterRef("tomas.png", "Tomas")
CAST = [KAI, MIRA, TOMAS]
ONE = [ChatMessage("u1", "Mira", "\u201cThe bridge is out,\u201d Mira says.", "assistant", "mira.png")]
CHAT = [
    ChatMessage("u1", "Kai", "Where is the ferry?", "user", "kai.png"),
    ChatMessage("u2", "Mira", "\u201cThe ferry sank last winter,\u201d Mira says. Tomas nods.",
                "assistant", "mira.png"),
    ChatMessage("u3", "Tomas", "*He spits.* \u201cI sank it myself.\u201d", "assistant", "tomas.png"),
    ChatMessage("u4", "Narrator", "Mira turns away. \u201cThen we swim,\u201d she says.", "assistant"),
]


def prompts(messages, cast):
    """Every task rendered once, with a chat of `messages`."""
    secret = [SecretInput("k-1", "Tomas sank the ferry.", ("tomas.png",))]
    return [
        chunk_summary(messages, **limits("chunk_summary")),
        merge_summaries([SummaryInput("s1", "A.")], **limits("merge_summaries")),
        session_summary(messages, **limits("session_summary")),
        session_summary(messages, open_notes=[NoteInput("n-1", "Find the ferry.")], **limits("session_summary")),
        durable_memories(messages, cast, **limits("durable_memories")),
        character_memories(messages, cast, **limits("character_memories")),
        scene_summaries(messages, cast, **limits("scene_summaries")),
        told_events(messages, cast, secret, **limits("told_events")),
        memories_from_description("Mira fears water.", MIRA, **limits("memories_from_description")),
        save_from_conversation(messages, MIRA, **limits("save_from_conversation")),
        sheet_updates(messages, cast, [SheetInput("mira.png", {"role": "Guide."})], [],
                      **limits("sheet_updates")),
        sheet_updates(messages, cast, [], [Newcomer("Old Jon", 6, 2)], **limits("sheet_updates")),
    ]


def example_of(system: str) -> str:
    """The example answer a prompt shows (the JSON after its answer rule)."""
    tail = system.split("Answer with one JSON object in exactly this format and nothing else:\n", 1)[1]
    depth, end = 0, 0
    for i, ch in enumerate(tail):
        depth += {"{": 1, "}": -1}.get(ch, 0)
        if depth == 0 and ch == "}":
            end = i + 1
            break
    return tail[:end]


@pytest.mark.parametrize("messages, cast", [(CHAT, CAST), (ONE, [KAI, MIRA])], ids=["chat", "one message"])
def test_every_prompt_example_passes_its_validator(messages, cast):
    """rule MJ2: no prompt shows an example that its own validator refuses (nothing of it is
    dropped for a label or a field name, and it parses)."""
    for prompt in prompts(messages, cast):
        example = example_of(prompt.system)
        report = Report()
        TASKS[prompt.task].parse_answer(prompt, example, report)
        assert report.dropped == [] and report.changed == [], (prompt.task, example, report)


def test_a_name_given_for_a_label_is_mapped_when_unambiguous():
    """rule MJ2: `Tomas` for his label is read as it, and noted; the scene is kept."""
    prompt = scene_summaries(CHAT, CAST, **limits("scene_summaries"))
    report = Report()
    out = TASKS["scene_summaries"].parse_answer(prompt, json.dumps({"scenes": [{
        "title": "The ferry", "summary": "Tomas admits it.", "quotes": [],
        "participants": ["Tomas", "c2", "Mi", "Nobody"], "messages": ["m2", "m3"]}]}), report)
    assert out.items[0].participants == ("tomas.png", "mira.png")
    assert "the character name 'Tomas' was read as its label c3" in report.changed
    assert any("'Nobody'" in d for d in report.dropped)


def test_an_ambiguous_name_is_not_guessed():
    twins = [KAI, CharacterRef("a.png", "Ash"), CharacterRef("b.png", "Ash")]
    prompt = character_memories(CHAT, twins, **limits("character_memories"))
    with pytest.raises(PromptParseError, match="'Ash' is not one of the character labels"):
        TASKS["character_memories"].parse_answer(prompt, json.dumps({"memories": [{
            "character": "Ash", "summary": "s", "feeling": "f", "quotes": [], "participants": [],
            "importance": 2, "messages": ["m1"]}]}))


def test_one_bad_memory_does_not_cost_the_good_one():
    prompt = character_memories(CHAT, CAST, **limits("character_memories"))
    good = {"character": "c2", "summary": "Mira told Kai the ferry sank.", "feeling": "sad", "quotes": [],
            "participants": ["c1", "c2"], "importance": 3, "messages": ["m2"]}
    report = Report()
    out = TASKS["character_memories"].parse_answer(prompt, json.dumps({"memories": [
        good, {**good, "character": "c9"}, {**good, "importance": "high"}]}), report)
    assert [m.summary for m in out.items] == [good["summary"]]
    assert len(report.dropped) == 2


# --- who said it -----------------------------------------------------------------------------
@pytest.mark.parametrize("speaker, message, quote, said", [
    ("Mira", "\u201cStay,\u201d Tomas tells Mira.", "Stay,", False),
    ("Tomas", "\u201cStay,\u201d Tomas tells Mira.", "Stay,", True),
    ("Mira", "Mira whispers, \u201cStay.\u201d Tomas nods.", "Stay.", True),
    ("Tomas", "*He spits.* \u201cI sank it myself.\u201d", "I sank it myself.", True),
    ("Mira", "*He spits.* \u201cI sank it myself.\u201d", "I sank it myself.", False),
])
def test_speaker_said_reads_author_and_narration(speaker, message, quote, said):
    """rule MJ2: a quote's speaker wrote the message, or its narration names them as saying it."""
    author = ("Tomas",) if "He spits" in message else ("Narrator",)
    cast = [("Kai",), ("Mira", "Mi"), ("Tomas",)]
    assert (speaker_said(speaker, author, message, quote, cast=cast) is not None) is said


def test_a_quote_in_the_wrong_mouth_is_dropped_and_counted():
    """rule MJ2: Tomas's line given to Mira (the LoCoMo case: a line stored under the wrong
    speaker) is dropped as `wrong_speaker`; the right one is kept under the right name."""
    prompt = chunk_summary(CHAT, **limits("chunk_summary"))
    out = TASKS["chunk_summary"].parse_answer(prompt, json.dumps({"summary": "The ferry.", "quotes": [
        {"speaker": "Mira", "text": "I sank it myself.", "message": "m3"},
        {"speaker": "Mira", "text": "Then we swim,", "message": "m4"},
        {"speaker": "Tomas", "text": "The ferry sank last winter,", "message": "m2"}]}))
    assert [(q.speaker, q.text) for q in out.quotes] == [("Mira", "Then we swim,")]
    assert sorted(d.reason for d in out.dropped_quotes) == ["wrong_speaker", "wrong_speaker"]


def test_told_evidence_from_someone_else_is_not_a_telling():
    prompt = told_events(CHAT, CAST, [SecretInput("k-1", "Tomas sank the ferry.", ("tomas.png",))],
                         **limits("told_events"))
    out = TASKS["told_events"].parse_answer(prompt, json.dumps({"events": [
        {"teller": "c3", "listeners": ["c1", "c2"], "secret": "k1", "message": "m2",
         "evidence": "The ferry sank last winter"}]}))
    assert out.items == () and [d.reason for d in out.dropped_quotes] == ["wrong_speaker"]


def test_reasoning_and_prefaces_are_stripped_before_the_answer_is_read():
    prompt = chunk_summary(CHAT, **limits("chunk_summary"))
    answer = ("<think>Kai asks about the ferry {maybe}</think>\nSure! Here is the summary:\n"
              "```json\n{\"summary\": \"The ferry sank.\", \"quotes\": [], \"reasoning\": \"short\",}\n```")
    report = Report()
    out = TASKS["chunk_summary"].parse_answer(prompt, answer, report)
    assert out.text == "The ferry sank."
    assert any(re.search("reasoning", c) for c in report.changed)


# --- one call per part: sections of one answer -------------------------------------------------
def part_prompt():
    from server_plugin.jobs.tasks.parts import part_notes
    secret = [SecretInput("k-1", "Tomas sank the ferry.", ("tomas.png",))]
    return part_notes(CHAT, CAST, {"summary": limits("chunk_summary"), "memories": limits("character_memories"),
                                   "told": {**limits("told_events"), "secrets": secret}})


def test_a_part_is_shown_once_for_every_section():
    """rule MJ1: one prompt, the transcript once, every section's rules and inputs (here the secret)."""
    prompt = part_prompt()
    assert prompt.user.count("I sank it myself.") == 1 and "[k1] Tomas sank the ferry." in prompt.user
    for key in ("summary", "memories", "told"):
        assert f'- "{key}": ' in prompt.system and f"Its answer goes under \"{key}\"" in prompt.system


def test_each_section_is_read_by_its_own_task_and_a_bad_one_falls_back_alone():
    prompt = part_prompt()
    report = Report()
    out = TASKS["part_notes"].parse_answer(prompt, json.dumps({
        "summary": {"summary": "Tomas admits he sank the ferry.",
                    "quotes": [{"speaker": "Tomas", "text": "I sank it myself.", "message": "m3"}]},
        "memories": {"memories": "not a list"},
        "told": {"events": []}}), report)
    assert out.sections["summary"].text == "Tomas admits he sank the ferry."
    assert [q.speaker for q in out.sections["summary"].quotes] == ["Tomas"]
    assert out.fell_back == ("memories",) and out.sections["told"].items == ()
    assert any("section memories could not be used" in d for d in report.dropped)
    with pytest.raises(PromptParseError, match="no section of the answer could be used"):
        TASKS["part_notes"].parse_answer(prompt, json.dumps({"other": {}}))


# --- real answers as they come, for every task ---------------------------------------------------
FORMS = {
    "think block": lambda ex: "<think>The user wants JSON {like this}. Let me write it.</think>\n" + ex,
    "unclosed think": lambda ex: "<think>hmm, the format is " + ex[:12] + "\n" + ex,
    "preface and fence": lambda ex: "Sure! Here is the JSON you asked for:\n```json\n" + ex + "\n```\nHope this helps!",
    "trailing comma": lambda ex: ex[:ex.rindex("}")].rstrip() + ",}",
    "cut-off tail": lambda ex: ex.rstrip()[:-1],
    "single quotes": lambda ex: ex.replace('"', "'"),
    "reasoning field": lambda ex: '{"reasoning": "I read the messages first.", ' + ex.lstrip()[1:],
}


@pytest.mark.parametrize("form", list(FORMS))
def test_every_task_reads_every_common_answer_form(form):
    """rule MJ2: each task's own example, wrapped or broken the ways real models do it, reads as
    the clean example does."""
    from server_plugin.jobs.tasks.base import to_dict
    for prompt in prompts(CHAT, CAST):
        task = TASKS[prompt.task]
        example = example_of(prompt.system)
        clean = to_dict(task.parse_answer(prompt, example))
        assert to_dict(task.parse_answer(prompt, FORMS[form](example))) == clean, (prompt.task, form)
