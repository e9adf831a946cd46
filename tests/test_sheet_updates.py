"""Sheets grow with play (rule SW1): the sheet-updates task's prompt and its strict parser — a
newcomer's draft, updates to offered sheets, and never a field a person wrote or locked, nor a
secret."""

from __future__ import annotations

import json
import re

import pytest

from server_plugin.jobs import queue as jobs
from server_plugin.jobs.tasks import registry
from server_plugin.jobs.tasks.answers import Report
from server_plugin.jobs.tasks.base import CharacterRef, ChatMessage, Prompt, PromptParseError
from server_plugin.jobs.tasks.sheets import Newcomer, SheetDraft, SheetInput, SheetProposals, sheet_updates
from tests.helpers.api import expect_ok
from tests.helpers.conversation import drain, iso, job_rows
from tests.helpers.episodes import QUIET, Labels, chat, end_session, line, post_lines, register_cast
from tests.helpers.tasks import limits

MESSAGES = [ChatMessage("a1", "Old Tom", "*The old boatman spits.* \"Forty years I've mended nets here.\"",
                        role="assistant"),
            ChatMessage("u1", "Kai", "\"Ayla, your hair is cut short now.\"", character_id="kai.png")]
CAST = [CharacterRef("ayla.png", "Ayla"), CharacterRef("kai.png", "Kai", is_player=True)]


def task(**kw) -> Prompt:
    sheets = kw.pop("sheets", [SheetInput("ayla.png", {"personality": "Quiet.", "appearance": "Long hair."},
                                          ("personality",))])
    made = sheet_updates(MESSAGES, CAST, sheets, [Newcomer("Old Tom", 6, 2)], **limits("sheet_updates", **kw))
    return Prompt.from_payload(json.loads(json.dumps(made.to_payload())))  # as a job stores it


def parse(prompt: Prompt, answer: dict) -> SheetProposals:
    return registry.parse(prompt, json.dumps(answer))


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
    assert out.drafts == (SheetDraft(None, "Old Tom", {"role": "Boatman of the harbour"}),)
    assert out.updates == (SheetDraft("ayla.png", "Ayla", {"appearance": "Short hair."}),)
    assert out.dropped == ("Old Tom: secrets are not written by a model",
                           "Ayla: personality is kept by a person", "not asked for: the sheet of kai.png")


def test_sw1_parser_caps_fields_per_character():
    """rule SW1: at most max_fields fields per character; the rest are noted, not stored."""
    out = parse(task(max_fields=1), {"new": [{"newcomer": "n1", "fields": {"role": "Boatman", "age": "Old"}}],
                                     "updates": []})
    assert out.drafts[0].fields == {"role": "Boatman"} and out.dropped == ("Old Tom: age is over the limit of 1 fields",)


def test_sw1_an_answer_with_nothing_to_keep_fails_the_parse():
    """A sheet answer whose only part names a newcomer label we did not give has nothing to keep."""
    with pytest.raises(PromptParseError) as caught:
        parse(task(), {"new": [{"newcomer": "n7", "fields": {"role": "x"}}], "updates": []})
    assert "'n7' is not one of the newcomer" in str(caught.value)


@pytest.mark.parametrize("answer,fields,note", [
    ({"new": [], "updates": [{"character": "c1", "fields": {"Manner of speech": "Curt."}}]},
     {"manner_of_speech": "Curt."}, "field name 'Manner of speech' written as 'manner_of_speech'"),
    ({"new": [], "updates": [{"character": "c1", "fields": {"appearance": "x" * 601}}]},
     {"appearance": "x" * 600}, "cut to 600 characters"),
    ({"updates": [{"character": "Ayla", "fields": {"appearance": "Tall."}}]},
     {"appearance": "Tall."}, "a missing list was taken as empty"),
])
def test_sw1_keeps_what_is_right(answer, fields, note):
    """A field name is normalised, an overlong value cut, a missing list empty, a character's name
    read as its label; each change is noted."""
    report = Report()
    out = registry.TASKS["sheet_updates"].parse_answer(task(), json.dumps(answer), report)
    assert out.updates[0].fields == fields
    assert any(note in c for c in report.changed)


def test_sw1_extractive_infers_nothing():
    """rule SW1 without a model: nothing is inferred about a character (the minimal sheet is
    drafted elsewhere); the result says so."""
    out = registry.fallback(task())
    assert out.drafts == () and out.updates == () and out.dropped


# --- the session-end job, end to end (SW1, RV14, RV16) ----------------------------------------
# The job runs through the real queue and a real OpenAI-compatible server on loopback (FakeLLM),
# answering every other task with an empty result; `Answers.builders["sheet_updates"]` scripts ours.

SECRET = "She sold the harbour lantern to the smugglers."
TOM = "Old Tom"


def tom(message_id: str, text: str, minutes: float) -> dict:
    """A line of a named speaker no character card stands for (no speaker_id)."""
    return {"id": message_id, "role": "assistant", "name": TOM, "text": text, "sent_at": iso(minutes)}


def harbour_session(api, chat_id: str = "c1", *, start: float = 0, extra: list | None = None,
                    prefix: str = "") -> None:
    """Kai remarks on Ayla's cut hair; she answers; then the session is ended."""
    post_lines(api, chat_id, [
        line(f"{prefix}u1", "kai.png", '"Ayla, your hair is cut short now."', start),
        line(f"{prefix}a1", "ayla.png", '*Ayla runs a hand through her cropped hair.* "The sea wind '
                                        'tangled it every day, so I cut it."', start + 1),
        *(extra or [])])
    end_session(api, chat_id)


def cast_with_sheets(api, members=("ayla.png", "bren.png")) -> None:
    """The cast of four and chat c1 (Ayla and Bren); Ayla's sheet as a background job wrote it."""
    register_cast(api)
    expect_ok(api.put("/v1/characters/ayla.png", json={
        "name": "Ayla", "actor": "background",
        "sheet": {"appearance": "Long dark hair.", "backstory": "Grew up at the harbour."}}), 200)
    chat(api, "c1", *members)


def fetch_character(api, character_id: str) -> dict:
    return expect_ok(api.get(f"/v1/characters/{character_id}"), 200, "character.response")["character"]


def sheet_prompts(fake) -> list[str]:
    """The system + user text of every sheet-updates request the model received."""
    texts = [" ".join(m["content"] for m in body["messages"]) for body in fake.completions()]
    return [t for t in texts if "keep the character sheets" in t]


def the_job(services) -> dict:
    [row] = job_rows(services, kind="sheet_updates")
    return jobs.get(services, row["id"])


def update(character_name: str, **fields: str):
    return lambda lb: {"new": [], "updates": [{"character": lb.c(character_name), "fields": fields}]}


@pytest.fixture
def overrides(request):
    return dict(QUIET, **getattr(request, "param", {}))


@pytest.fixture
def with_model(overrides, fake):
    overrides.update(QUIET, llm_mode="openai", llm_url=fake.url, llm_model="fake-model", llm_retries=0,
                     llm_read_timeout=5)
    return fake.responder


def test_sw1_session_end_with_a_model_updates_a_learning_characters_sheet(with_model, fake, api, services):
    """rule SW1: ending a session queues a sheet-updates job; the model's proposal rewrites an
    unprotected field of a character present who learns from chat, recorded as a background
    job's field, and the job's result names it."""
    with_model.builders["sheet_updates"] = update("Ayla", appearance="Short, cropped dark hair.")
    cast_with_sheets(api)
    harbour_session(api)
    [row] = job_rows(services, kind="sheet_updates")
    assert row["state"] == "pending" and json.loads(row["payload"])["target"] == {"n": 1}
    drain(services)
    ayla = fetch_character(api, "ayla.png")
    assert ayla["sheet"] == {"appearance": "Short, cropped dark hair.", "backstory": "Grew up at the harbour."}
    assert ayla["field_sources"]["appearance"] == "background"
    job = the_job(services)
    assert job["state"] == "done" and job["result"]["updated"] == {"ayla.png": ["appearance"]}
    [prompt] = sheet_prompts(fake)
    assert "- appearance: Long dark hair." in prompt and "your hair is cut short now" in prompt


def test_sw1_fields_a_person_wrote_or_locked_are_never_overwritten(with_model, fake, api, services):
    """rule SW1: a field a person wrote (personality) and one a person locked (backstory) are
    shown to the model as kept; when the model proposes them anyway they stay as they were and
    the job's result lists them, while the unprotected field it proposes is written."""
    with_model.builders["sheet_updates"] = update(
        "Ayla", personality="Cheerful and loud.", backstory="Born in the capital.", appearance="Short hair.")
    cast_with_sheets(api)
    # A person writes the personality and locks the backstory (a background job wrote it).
    sheet = fetch_character(api, "ayla.png")["sheet"]
    expect_ok(api.put("/v1/characters/ayla.png", json={
        "name": "Ayla", "sheet": {**sheet, "personality": "Quiet, watchful."}, "locked_fields": ["backstory"]}), 200)
    ayla = fetch_character(api, "ayla.png")
    assert ayla["field_sources"]["backstory"] == "background" and ayla["locked_fields"] == ["backstory"]
    harbour_session(api)
    drain(services)
    [prompt] = sheet_prompts(fake)
    assert "- personality (kept): Quiet, watchful." in prompt and "- backstory (kept): Grew up" in prompt
    after = fetch_character(api, "ayla.png")
    assert after["sheet"] == {"appearance": "Short hair.", "backstory": "Grew up at the harbour.",
                              "personality": "Quiet, watchful."}
    result = the_job(services)["result"]
    assert result["updated"] == {"ayla.png": ["appearance"]}
    assert "Ayla: personality is kept by a person" in result["skipped"]
    assert "Ayla: backstory is kept by a person" in result["skipped"]


@pytest.fixture
def client_mode(overrides):
    overrides.update(llm_mode="client")
    return overrides


def claim_sheet_job(api) -> tuple[dict, Labels]:
    job = expect_ok(api.post("/v1/jobs/claim", json={"kinds": ["sheet_updates"]}), 200,
                    "job_claim.response")["job"]
    assert job is not None and job["kind"] == "sheet_updates" and job["task"] == "sheet_updates"
    request = job["request"]
    return job, Labels({"messages": [{"content": request["systemPrompt"]}, {"content": request["prompt"]}]})


def test_sw1_client_mode_a_field_locked_after_the_prompt_is_refused(client_mode, api, services):
    """rule SW1 through claim/complete (the extension runs the model): a person locks a field
    while the model is answering; the answer's value for it is refused by `update_sheet`, listed
    as refused in the job's result, and the field keeps the value the person saw."""
    cast_with_sheets(api)
    harbour_session(api)
    job, lb = claim_sheet_job(api)
    assert "- appearance: Long dark hair." in job["request"]["prompt"]  # not kept when claimed
    sheet = fetch_character(api, "ayla.png")["sheet"]
    expect_ok(api.put("/v1/characters/ayla.png", json={"name": "Ayla", "sheet": sheet,
                                                       "locked_fields": ["appearance"]}), 200)
    answer = {"new": [], "updates": [{"character": lb.c("Ayla"), "fields": {
        "appearance": "Short hair.", "manner": "Runs a hand through her hair when unsure."}}]}
    done = expect_ok(api.post(f"/v1/jobs/{job['id']}/complete", json={"text": json.dumps(answer)}),
                     200, "job.response")["job"]
    assert done["state"] == "done"
    assert done["result"]["refused"] == {"ayla.png": ["appearance"]}
    assert done["result"]["updated"] == {"ayla.png": ["manner"]}
    after = fetch_character(api, "ayla.png")
    assert after["sheet"]["appearance"] == "Long dark hair."
    assert after["sheet"]["manner"] == "Runs a hand through her hair when unsure."


def test_sw1_sw9b_secrets_are_never_shown_to_the_model_nor_written(with_model, fake, api, services):
    """rules SW1, SW9b: a sheet's secrets never reach the model's prompt (read from what the model
    server received), and a secret the model proposes is not written; the secrets stay as a
    person wrote them."""
    secrets = [{"text": SECRET, "known_by": []}]
    with_model.builders["sheet_updates"] = update("Ayla", secrets="She is a smuggler herself.",
                                                  appearance="Short hair.")
    cast_with_sheets(api)
    sheet = fetch_character(api, "ayla.png")["sheet"]
    expect_ok(api.put("/v1/characters/ayla.png", json={"name": "Ayla", "sheet": {**sheet, "secrets": secrets}}), 200)
    harbour_session(api)
    drain(services)
    [prompt] = sheet_prompts(fake)
    assert "- appearance: Long dark hair." in prompt  # the sheet was shown…
    assert "smugglers" not in prompt and "secrets" not in prompt.split("<sheets>")[1]  # …its secret not
    after = fetch_character(api, "ayla.png")
    assert after["sheet"]["secrets"] == secrets and after["sheet"]["appearance"] == "Short hair."
    assert "smuggler herself" not in json.dumps(after)
    assert "Ayla: secrets are not written by a model" in the_job(services)["result"]["skipped"]


def test_rv14_a_character_with_learning_off_is_not_updated(with_model, fake, api, services):
    """rule RV14: Bren, present but with learn-from-chat off, has no sheet in the prompt, and the
    model's proposal for him is not written; Ayla, who learns, is updated in the same job."""
    with_model.builders["sheet_updates"] = lambda lb: {"new": [], "updates": [
        {"character": lb.c("Bren"), "fields": {"appearance": "A scar over one eye."}},
        {"character": lb.c("Ayla"), "fields": {"appearance": "Short hair."}}]}
    cast_with_sheets(api)
    expect_ok(api.put("/v1/characters/bren.png", json={"name": "Bren", "actor": "background",
                                                       "sheet": {"appearance": "Bearded."},
                                                       "learn_from_chat": False}), 200)
    harbour_session(api)
    drain(services)
    [prompt] = sheet_prompts(fake)
    assert "Bren" in prompt and "Bearded." not in prompt  # present, but his sheet is not offered
    assert fetch_character(api, "bren.png")["sheet"] == {"appearance": "Bearded."}
    assert fetch_character(api, "ayla.png")["sheet"]["appearance"] == "Short hair."
    result = the_job(services)["result"]
    assert "bren.png" not in result["updated"] and "not asked for: the sheet of bren.png" in result["skipped"]


def test_rv14_learning_switched_off_before_the_answer_is_stored(client_mode, api, services):
    """rule RV14 when the switch changes while the model answers: the proposal for that
    character is skipped at store time, not written."""
    cast_with_sheets(api)
    harbour_session(api)
    job, lb = claim_sheet_job(api)
    expect_ok(api.put("/v1/characters/ayla.png", json={"name": "Ayla", "learn_from_chat": False}), 200)
    answer = {"new": [], "updates": [{"character": lb.c("Ayla"), "fields": {"appearance": "Short hair."}}]}
    done = expect_ok(api.post(f"/v1/jobs/{job['id']}/complete", json={"text": json.dumps(answer)}), 200)["job"]
    assert done["result"]["updated"] == {} and "learning off (RV14): ayla.png" in done["result"]["skipped"]
    assert fetch_character(api, "ayla.png")["sheet"]["appearance"] == "Long dark hair."


def test_rv16_memory_off_queues_no_sheet_updates(with_model, fake, api, services):
    """rule RV16: memory switched off for a chat whose session is still open — its end queues no
    sheet-updates job (chat c1, with memory on and ended alongside, does)."""
    with_model.builders["sheet_updates"] = update("Ayla", appearance="Short hair.")
    cast_with_sheets(api)
    chat(api, "off", "ayla.png")
    post_lines(api, "off", [line("u1", "kai.png", '"Ayla, your hair is cut short now."', 0)])
    expect_ok(api.put("/v1/chats/off", json={"memory_enabled": False}), 200)
    assert end_session(api, "off")["n"] == 1  # the session existed and ended
    assert job_rows(services, kind="sheet_updates") == []
    harbour_session(api, "c1")
    assert [r["chat_id"] for r in job_rows(services, kind="sheet_updates")] == ["c1"]


def test_rv16_memory_switched_off_after_queueing_writes_nothing(with_model, fake, api, services):
    """rule RV16: a queued job of a chat whose memory is then switched off asks no model and
    writes nothing."""
    with_model.builders["sheet_updates"] = update("Ayla", appearance="Short hair.")
    cast_with_sheets(api)
    harbour_session(api)
    expect_ok(api.put("/v1/chats/c1", json={"memory_enabled": False}), 200)
    drain(services)
    job = the_job(services)
    assert job["state"] == "done" and job["result"] == {"skipped": "nothing left to do"}
    assert sheet_prompts(fake) == [] and fetch_character(api, "ayla.png")["sheet"]["appearance"] == "Long dark hair."


@pytest.mark.parametrize("overrides", [{"llm_mode": "extractive"}], indirect=True)
def test_sw1_extractive_mode_queues_no_sheet_updates_but_drafts_a_minimal_sheet(overrides, api, services):
    """rule SW1 without a model: no sheet-updates job is queued (nothing is inferred), while a new
    named speaker still gets its minimal sheet (first appearance, verbatim lines) from sheet_drafts."""
    cast_with_sheets(api)
    harbour_session(api, extra=[tom("t1", '"Forty years I have mended nets here."', 2),
                                tom("t2", '"The tide turns at midnight."', 3)])
    assert job_rows(services, kind="sheet_updates") == []
    assert [r["kind"] for r in job_rows(services, kind="sheet_drafts")] == ["sheet_drafts"]
    drain(services)
    drafted = fetch_character(api, "old-tom")
    assert drafted["name"] == TOM and drafted["sheet"]["first_appearance"].startswith("Session 1 of ")
    assert '"Forty years I have mended nets here."' in drafted["sheet"]["quotes"]
    assert fetch_character(api, "ayla.png")["sheet"]["appearance"] == "Long dark hair."


def newcomer_draft(**fields: str):
    def build(lb: Labels) -> dict:
        label = re.search(r"^\[(n\d+)\] Old Tom ", lb.user, re.M)
        return {"new": [{"newcomer": label.group(1), "fields": fields}] if label else [], "updates": []}
    return build


def test_sw1_a_recurring_newcomer_gets_a_drafted_sheet(with_model, fake, api, services):
    """rule SW1: a named speaker no character is, seen in `sheet_newcomer_min_sessions` (2)
    sessions, is listed as a newcomer at the second session's end (not at the first) and the
    model's draft creates the character, its fields a background job's."""
    with_model.builders["sheet_updates"] = newcomer_draft(role="Boatman of the harbour",
                                                          appearance="Weathered, missing a tooth.")
    cast_with_sheets(api)
    harbour_session(api, extra=[tom("t1", '"Forty years I have mended nets here."', 2)])
    drain(services)
    first = sheet_prompts(fake)
    assert len(first) == 1 and "<newcomers>" not in first[0]
    assert fetch_character(api, "ayla.png") and api.get("/v1/characters/old-tom").status_code == 404
    harbour_session(api, start=600, prefix="s2-", extra=[tom("t2", '"The tide turns at midnight."', 602)])
    drain(services)
    second = sheet_prompts(fake)[1]
    assert "[n1] Old Tom (speaks in 2 messages over 2 sessions)" in second
    drafted = fetch_character(api, "old-tom")
    assert drafted["name"] == TOM
    assert drafted["sheet"] == {"role": "Boatman of the harbour", "appearance": "Weathered, missing a tooth."}
    assert set(drafted["field_sources"].values()) == {"background"} and drafted["learn_from_chat"]
    jobs_done = [jobs.get(services, r["id"]) for r in job_rows(services, kind="sheet_updates")]
    assert [j["result"]["drafted"] for j in jobs_done] == [[], ["old-tom"]]


def test_sw1_a_minimal_sheet_is_filled_in_by_the_model(with_model, fake, api, services):
    """rule SW1: a speaker who got a minimal sheet from sheet_drafts (known by name only: its lines
    carry no speaker_id) is offered to the model at the same session end, and the model's fields
    are added to the drafted ones."""
    with_model.builders["sheet_updates"] = update(TOM, role="Boatman of the harbour")
    cast_with_sheets(api)
    harbour_session(api, extra=[tom("t1", '"Forty years I have mended nets here."', 2),
                                tom("t2", '"The tide turns at midnight."', 3)])
    drain(services)
    [prompt] = sheet_prompts(fake)
    assert re.search(r"^\[c\d\] Old Tom\n- first_appearance: Session 1 ", prompt, re.M)
    drafted = fetch_character(api, "old-tom")
    assert drafted["sheet"]["role"] == "Boatman of the harbour"
    assert drafted["sheet"]["first_appearance"].startswith("Session 1 of ") and drafted["sheet"]["quotes"]


def test_sw1_an_answer_missing_a_list_is_kept_and_the_job_says_so(with_model, fake, api, services):
    """MJ2 (the real-model case): an answer without the "new" list, with a field name in words,
    is kept: the list is taken as empty, the name normalised, and the job's result notes both."""
    with_model.builders["sheet_updates"] = lambda lb: {"updates": [
        {"character": lb.c("Ayla"), "fields": {"Manner of speech": "Short, dry answers."}}]}
    cast_with_sheets(api)
    harbour_session(api)
    drain(services)
    job = jobs.get(services, the_job(services)["id"])
    assert job["state"] == "done" and job["result"]["model"]["answer"] == "first_try"
    changed = " | ".join(job["result"]["model"]["changed"])
    assert "a missing list was taken as empty: new" in changed and "'manner_of_speech'" in changed
    assert len(sheet_prompts(fake)) == 1
