"""Sheets grow with play (rule SW1): the sheet-updates task's prompt and its strict parser — a
newcomer's draft, updates to offered sheets, and never a field a person wrote or locked, nor a
secret."""

from __future__ import annotations

import json

import pytest

from server_plugin import extractive, prompts
from server_plugin.prompts import CharacterRef, ChatMessage, Newcomer, PromptParseError, SheetInput

MESSAGES = [ChatMessage("a1", "Old Tom", "*The old boatman spits.* \"Forty years I've mended nets here.\"",
                        role="assistant"),
            ChatMessage("u1", "Kai", "\"Ayla, your hair is cut short now.\"", character_id="kai.png")]
CAST = [CharacterRef("ayla.png", "Ayla"), CharacterRef("kai.png", "Kai", is_player=True)]


def task(**kw) -> prompts.Prompt:
    sheets = kw.pop("sheets", [SheetInput("ayla.png", {"personality": "Quiet.", "appearance": "Long hair."},
                                          ("personality",))])
    made = prompts.sheet_updates(MESSAGES, CAST, sheets, [Newcomer("Old Tom", 6, 2)], **kw)
    return prompts.Prompt.from_payload(json.loads(json.dumps(made.to_payload())))  # as a job stores it


def parse(prompt: prompts.Prompt, answer: dict) -> prompts.SheetProposals:
    return prompts.parse(prompt, json.dumps(answer))


def test_sw1_prompt_marks_kept_fields_and_lists_newcomers():
    """rule SW1: the prompt shows the sheets with a person's fields marked kept, never secrets,
    and the recurring newcomers by label."""
    prompt = task()
    assert "[c1] Ayla\n- personality (kept): Quiet.\n- appearance: Long hair." in prompt.user
    assert "[n1] Old Tom (speaks in 6 messages over 2 sessions)" in prompt.user
    assert "Never change a field marked (kept)" in prompt.system


def test_sw1_parser_keeps_drafts_and_updates_and_leaves_out_kept_fields_and_secrets():
    """rule SW1: a newcomer's fields become a draft; an offered sheet's new fields an update; a
    kept field, a secret and a sheet not offered (the player's here) are left out, each noted."""
    out = parse(task(), {
        "new": [{"newcomer": "n1", "fields": {"role": "Boatman of the harbour", "secrets": "Smuggles."}}],
        "updates": [{"character": "c1", "fields": {"personality": "Loud.", "appearance": "Short hair."}},
                    {"character": "c2", "fields": {"appearance": "Tall."}}]})
    assert out.drafts == (prompts.SheetDraft(None, "Old Tom", {"role": "Boatman of the harbour"}),)
    assert out.updates == (prompts.SheetDraft("ayla.png", "Ayla", {"appearance": "Short hair."}),)
    assert out.dropped == ("Old Tom: secrets are not written by a model",
                           "Ayla: personality is kept by a person", "not asked for: the sheet of kai.png")


def test_sw1_parser_caps_fields_per_character():
    """rule SW1: at most max_fields fields per character; the rest are noted, not stored."""
    out = parse(task(max_fields=1), {"new": [{"newcomer": "n1", "fields": {"role": "Boatman", "age": "Old"}}],
                                     "updates": []})
    assert out.drafts[0].fields == {"role": "Boatman"} and out.dropped == ("Old Tom: age is over the limit of 1 fields",)


@pytest.mark.parametrize("answer,reason", [
    ({"new": [{"newcomer": "n7", "fields": {"role": "x"}}], "updates": []}, "'n7' is not one of the newcomer"),
    ({"new": [], "updates": [{"character": "c1", "fields": {"Appearance": "x"}}]}, "does not match"),
    ({"new": [], "updates": [{"character": "c1", "fields": {"appearance": "x" * 601}}]}, "more than 600"),
    ({"new": [], "updates": [{"character": "c1", "fields": {"appearance": "  "}}]}, "is blank"),
    ({"updates": []}, "'new' is a required property"),
])
def test_sw1_malformed_answers_fail_the_parse(answer, reason):
    """Strict parsing: unknown labels, bad field names, overlong or blank values, a missing list —
    the answer is rejected (the job fails, nothing is written)."""
    with pytest.raises(PromptParseError) as caught:
        parse(task(), answer)
    assert reason in str(caught.value)


def test_sw1_extractive_infers_nothing():
    """rule SW1 without a model: nothing is inferred about a character (the minimal sheet is
    drafted elsewhere); the result says so."""
    out = extractive.run(task())
    assert out.drafts == () and out.updates == () and out.dropped
