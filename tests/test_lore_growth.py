"""Lore that grows with play (rules SW7, SW7a-SW7d): the lore-growth task's prompt, its strict
parser and its grounding check, its pattern-only fallback, and the session-end job through the
real queue, a real OpenAI-compatible server on loopback (FakeLLM, scripted per task) and a real
store: entries whose triggers fire in a later turn, protected entries, secrets, review mode,
edits, deletions, rollbacks, export and import."""

from __future__ import annotations

import json

import pytest

from server_plugin.jobs.tasks import registry
from server_plugin.jobs.tasks.base import ChatMessage, Prompt, PromptParseError
from server_plugin.jobs.tasks.lore import LoreInput, LoreProposal, lore_growth
from server_plugin.store import portable
from tests.helpers.api import expect_error, expect_ok
from tests.helpers.conversation import drain, job_rows
from tests.helpers.episodes import QUIET, chat, end_session, line, post_lines, register_cast
from tests.helpers.tasks import limits

VEYRA = ('*The ferry docks at Veyra, a walled port city of white stone.* "Veyra is ruled by the '
         'Council of Nine, nine magistrates who meet in the Glass Hall each new moon."')
MESSAGES = [ChatMessage("u1", "Kai", "Where does this ferry go?", role="user", character_id="kai.png"),
            ChatMessage("a1", "Ayla", VEYRA, role="assistant", character_id="ayla.png")]
HARBOUR = LoreInput("l_h", "The Harbour", "The harbour of Veyra has 3 piers.", ("harbour",), kept=True)


def task(entries=(HARBOUR,), **kw) -> Prompt:
    made = lore_growth(MESSAGES, list(entries), **limits("lore_growth", **kw))
    return Prompt.from_payload(json.loads(json.dumps(made.to_payload())))  # as a job stores it


def parse(prompt: Prompt, entries: list) -> object:
    return registry.parse(prompt, json.dumps({"entries": entries}))


def entry(title, text, triggers, sources=("m2",), kind="place", label=None) -> dict:
    return {"entry": label, "kind": kind, "title": title, "text": text, "triggers": list(triggers),
            "sources": list(sources)}


# --- the task ---------------------------------------------------------------------------------

def test_sw7a_prompt_shows_touched_entries_marked_kept_and_its_section_stands_apart():
    """rule SW7a: the prompt lists the entries it was given under labels, a person's marked kept;
    its section's instructions and answer key are the task's own parts (for a shared call)."""
    from server_plugin.jobs.tasks import lore as lore_task
    prompt = task()
    assert "[e1] The Harbour (kept by a person) — triggers: harbour\nThe harbour of Veyra has 3 piers." in prompt.user
    assert lore_task.instructions(max_entries=6, text_max_chars=1200) in prompt.system
    assert prompt.json_schema["properties"] == {lore_task.ANSWER_KEY: lore_task.ENTRIES_SCHEMA}


def test_sw7a_parser_keeps_new_entries_and_maps_a_repeated_title_or_trigger_to_an_update():
    """rule SW7a: a new place and a faction come back with their sources; a proposal repeating an
    offered entry's trigger ("harbour") becomes an update of it."""
    out = parse(task(), [
        entry("Veyra", "Veyra is a walled port city of white stone.", ["Veyra"]),
        entry("Council of Nine", "Nine magistrates who rule Veyra and meet in the Glass Hall.",
              ["Council of Nine", "Glass Hall"], kind="faction"),
        entry("Harbour of Veyra", "The harbour of Veyra has 3 piers; the ferry docks there.", ["harbour"])])
    assert [p.title for p in out.proposals] == ["Veyra", "Council of Nine", "Harbour of Veyra"]
    assert out.proposals[0] == LoreProposal(None, "place", "Veyra", "Veyra is a walled port city of white stone.",
                                            ("Veyra",), ("a1",))
    assert out.proposals[1].triggers == ("Council of Nine", "Glass Hall")
    assert out.proposals[2].lore_id == "l_h" and out.dropped == ()


def test_sw7a_an_update_that_repeats_the_entry_unchanged_is_dropped():
    """rule SW7a: an "update" whose text is the entry's own changes nothing: it is dropped and
    noted, not proposed (a small model repeats the listed entries back)."""
    out = parse(task(), [entry(HARBOUR.title, " the harbour of Veyra has 3 piers. ", ["harbour"], label="e1"),
                         entry("Veyra", "Veyra is a walled port city of white stone.", ["Veyra"])])
    assert [p.title for p in out.proposals] == ["Veyra"]
    assert out.dropped == ("The Harbour: its text is the entry's own (nothing changed)",)


def test_mj2_sw7a_an_entry_named_for_its_label_is_read_and_a_bad_entry_drops_alone():
    """rules MJ2, SW7a: an entry given by its title instead of its label (as small models do) is
    read as that label; an entry citing a label never shown is dropped alone, the others kept."""
    out = parse(task(), [
        entry("Harbour of Veyra", "The harbour of Veyra has 3 piers; the ferry docks there.", ["harbour"],
              label="The Harbour"),
        entry("Glass Hall", "Where the Council of Nine meets.", ["Glass Hall"], label="e4"),
        entry("Veyra", "Veyra is a walled port city of white stone.", ["Veyra"])])
    assert [(p.title, p.lore_id) for p in out.proposals] == [("Harbour of Veyra", "l_h"), ("Veyra", None)]
    assert len(out.dropped) == 1 and out.dropped[0].startswith("Glass Hall: 'e4' is not one of the lore entry labels")


def test_sw7b_an_entry_citing_too_few_messages_rests_on_those_that_hold_its_names():
    """rules SW7b, MJ2: a model that cites one message and writes from two: the message of the part
    that holds the missing name joins the sources (noted), so the entry rests on them; a name no
    message holds is still dropped."""
    msgs = MESSAGES + [ChatMessage("a2", "Ayla", "Without a salt token the Harbour Watch turns you back.",
                                   role="assistant", character_id="ayla.png")]
    made = lore_growth(msgs, [], **limits("lore_growth"))
    prompt = Prompt.from_payload(json.loads(json.dumps(made.to_payload())))
    out = parse(prompt, [entry("Veyra", "Veyra is ruled by the Council of Nine; the Harbour Watch guards its gate.",
                               ["Veyra", "Harbour Watch"], sources=("m2",)),
                         entry("Stormkeep", "Stormkeep guards Veyra.", ["Stormkeep"], sources=("m2",))])
    assert [(p.title, p.sources, p.triggers) for p in out.proposals] == [
        ("Veyra", ("a1", "a2"), ("Veyra", "Harbour Watch"))]
    assert "Stormkeep: its title names Stormkeep, not in its sources" in out.dropped


def test_sw7b_an_update_gains_no_source_for_what_its_entry_already_holds():
    """rule SW7b: the names and numbers an updated entry already holds need no message: an update
    citing m2 whose "3" is the entry's own keeps its one source."""
    msgs = MESSAGES + [ChatMessage("a2", "Ayla", "The harbour has 3 piers, as ever.", role="assistant",
                                   character_id="ayla.png")]
    made = lore_growth(msgs, [HARBOUR], **limits("lore_growth"))
    prompt = Prompt.from_payload(json.loads(json.dumps(made.to_payload())))
    out = parse(prompt, [entry("The Harbour", "The harbour of Veyra has 3 piers; the ferry docks there.",
                               ["harbour"], sources=("m2",), label="e1")])
    assert [(p.lore_id, p.sources) for p in out.proposals] == [("l_h", ("a1",))]


def test_sw7b_invented_names_and_numbers_are_dropped():
    """rule SW7b: a text naming someone the sources never name, or a number they never state, is
    dropped and noted; a trigger not in the sources is dropped alone; the rest is kept."""
    out = parse(task(), [
        entry("Veyra", "Veyra was founded by Queen Ysolde.", ["Veyra"]),
        entry("Council of Nine", "The council has 12 seats.", ["Council of Nine"], kind="faction"),
        entry("Glass Hall", "Where the Council of Nine meets each new moon.", ["Glass Hall", "crystal dome"]),
        entry("Stormkeep", "A fortress far away.", ["Stormkeep"])])
    assert [p.title for p in out.proposals] == ["Glass Hall"]
    assert out.proposals[0].triggers == ("Glass Hall",)
    assert "Veyra: its text names Queen, Ysolde, not in its sources" in out.dropped
    assert "Council of Nine: its text names 12, not in its sources" in out.dropped
    assert "Glass Hall: trigger 'crystal dome' is not in its sources" in out.dropped
    assert "Stormkeep: its title names Stormkeep, not in its sources" in out.dropped


@pytest.mark.parametrize("answer", [
    [entry("Veyra", "A city.", ["Veyra"], sources=("m9",))],
    [entry("Veyra", "A city.", ["Veyra"], label="e4")],
    [entry("Veyra", "A city.", ["Veyra"], sources=())],
    [entry("Veyra", "x" * 1201, ["Veyra"])],
    [{**entry("Veyra", "A city.", ["Veyra"]), "kind": "person"}],
])
def test_sw7a_malformed_entries_are_never_proposed(answer):
    """rule OP2: unknown labels, no sources, an overlong text, a kind that is not lore: the entry is
    not proposed (the bad part is dropped; with nothing left, the answer is rejected)."""
    try:
        out = parse(task(), answer)
    except PromptParseError:
        return
    assert out.proposals == ()


def test_sw7b_fallback_proposes_only_a_named_place_or_group_introduced_with_a_description():
    """rule SW7b without a model: Veyra (a named port city, described) and the Council of Nine (a
    named group) come from their patterns, in the messages' own words; a bare mention gives nothing."""
    out = registry.fallback(task(entries=()))
    assert [(p.title, p.kind, p.triggers, p.sources) for p in out.proposals] == [
        ("Veyra", "place", ("Veyra",), ("a1",)), ("Council of Nine", "faction", ("Council of Nine",), ("a1",))]
    said = '"Veyra is ruled by the Council of Nine, nine magistrates who meet in the Glass Hall each new moon."'
    assert [p.text for p in out.proposals] == ["The ferry docks at Veyra, a walled port city of white stone. " + said, said]
    bare = lore_growth([ChatMessage("a1", "Ayla", "We sail to the city of Arden.", role="assistant")], [],
                       **limits("lore_growth"))
    assert registry.fallback(bare).proposals == ()


# --- the session-end job ------------------------------------------------------------------------

@pytest.fixture
def overrides(request):
    return dict(QUIET, **getattr(request, "param", {}))


@pytest.fixture
def with_model(overrides, fake):
    overrides.update(llm_mode="openai", llm_url=fake.url, llm_model="fake-model", llm_retries=0,
                     llm_read_timeout=5, part_tokens=0)  # lore growth's own job (parts: test_parts.py)
    return fake.responder


def veyra_answer(lb) -> dict:
    """The model's proposals for the Veyra session: the city and its ruling council."""
    source = lb.m("walled port city")
    return {"entries": [
        entry("Veyra", "Veyra is a walled port city of white stone, ruled by the Council of Nine.",
              ["Veyra"], [source]),
        entry("Council of Nine", "The Council of Nine: nine magistrates who rule Veyra and meet in "
              "the Glass Hall each new moon.", ["Council of Nine", "magistrates"], [source], kind="faction")]}


def veyra_session(api, chat_id="c1", prefix="") -> None:
    post_lines(api, chat_id, [
        line(f"{prefix}u1", "kai.png", "Where does this ferry go?", 0),
        line(f"{prefix}a1", "ayla.png", VEYRA, 1, turn_id=f"{prefix}t1")])
    end_session(api, chat_id)


def turn(api, text, speaker="ayla.png", chat_id="c1") -> dict:
    body = {"chat_id": chat_id, "speaker_id": speaker, "context_tokens": 4000, "last_action": {"text": text}}
    return expect_ok(api.post("/v1/context", json=body), 200, "context.response")


def cards_block(out) -> str:
    found = [b["text"] for b in out["blocks"] if b["section"] == "story_cards"]
    return found[0] if found else ""


def lore_list(api, **params) -> list[dict]:
    qs = "&".join(f"{k}={v}" for k, v in params.items())
    return expect_ok(api.get(f"/v1/lore?{qs}"), 200, "lore_list.response")["lore"]


def proposals(api, **params) -> list[dict]:
    qs = "&".join(f"{k}={v}" for k, v in params.items())
    return expect_ok(api.get(f"/v1/lore/proposals?{qs}"), 200, "lore_proposals.response")["proposals"]


def by_title(api) -> dict[str, dict]:
    return {e["title"]: e for e in lore_list(api)}


def setup(api) -> None:
    register_cast(api)
    chat(api, "c1", "ayla.png", "kai.png")


def test_sw7a_a_city_and_its_council_grow_and_their_triggers_fire_in_a_later_turn(with_model, fake, api, services):
    """rule SW7a: a session introduces Veyra and its ruling council; at its end the job writes two
    entries of the chat, resting on the message that introduced them; a later turn that names the
    council brings its entry into the prompt."""
    with_model.builders["lore_growth"] = veyra_answer
    setup(api)
    veyra_session(api)
    [row] = job_rows(services, kind="lore_growth")
    assert json.loads(row["payload"])["target"] == {"n": 1}
    drain(services)
    grown = by_title(api)
    assert set(grown) == {"Veyra", "Council of Nine"}
    council = grown["Council of Nine"]
    assert council["source"] == "job" and council["chat_id"] == "c1" and council["sources"] == ["a1"]
    assert council["known_by"] == ["ayla.png", "kai.png"] and council["triggers"] == ["Council of Nine", "magistrates"]
    out = turn(api, "Kai asks who the magistrates answer to.")
    assert "The Council of Nine: nine magistrates who rule Veyra" in cards_block(out)
    chat(api, "c2", "ayla.png", "kai.png")
    post_lines(api, "c2", [line("x1", "kai.png", "Hello.", 30)])
    assert cards_block(turn(api, "The magistrates again.", chat_id="c2")) == ""  # grown in c1 only


@pytest.mark.parametrize("overrides", [{"lore_growth_entries_shown": 2}], indirect=True)
def test_sw7a_a_second_session_updates_the_entry_it_touches(with_model, fake, api, services):
    """rule SW7a: the next session's prompt shows the grown entries its words trigger first, at
    most `lore_growth_entries_shown` (an unrelated entry is left out); a proposal repeating an
    entry's title updates it in place."""
    with_model.builders["lore_growth"] = veyra_answer
    setup(api)
    expect_ok(api.post("/v1/lore", json={"title": "Moonwell", "text": "A well far north.", "triggers": ["moonwell"]}), 201)
    veyra_session(api)
    drain(services)
    council_id = by_title(api)["Council of Nine"]["id"]
    with_model.builders["lore_growth"] = lambda lb: {"entries": [entry(
        "Council of Nine", "The Council of Nine was dissolved; Veyra has no rulers now.",
        ["Council of Nine"], [lb.m("dissolved")], kind="faction")]}
    post_lines(api, "c1", [line("b1", "ayla.png", '"The Council of Nine was dissolved last night; '
                                                  'Veyra has no rulers now," Ayla says.', 300)])
    end_session(api, "c1")
    drain(services)
    prompts = [b["messages"][1]["content"] for b in fake.completions()
               if "keep the lore" in b["messages"][0]["content"]]
    assert "Council of Nine — triggers: Council of Nine, magistrates" in prompts[-1]
    assert "] Veyra — triggers: Veyra" in prompts[-1] and "Moonwell" not in prompts[-1]
    after = by_title(api)["Council of Nine"]
    assert after["id"] == council_id and after["text"].startswith("The Council of Nine was dissolved")
    assert after["sources"] == ["a1", "b1"]


@pytest.mark.parametrize("protect", ["locked", "imported", "written"])
def test_sw7c_a_protected_entry_is_not_changed_and_the_proposal_waits(protect, with_model, fake, api, services):
    """rule SW7c: an entry a person locked, imported from World Info, or wrote is left as it was;
    the model's proposal for it waits, pending, until the person accepts it."""
    setup(api)
    text = "Veyra: a quiet fishing town."
    if protect == "imported":
        expect_ok(api.post("/v1/lore/import", json={"world_info": {"entries": {
            "0": {"uid": 0, "key": ["Veyra"], "comment": "Veyra", "content": text}}}}), 201)
        lore_id = by_title(api)["Veyra"]["id"]
    elif protect == "written":
        lore_id = expect_ok(api.post("/v1/lore", json={"title": "Veyra", "text": text, "triggers": ["Veyra"]}),
                            201)["entry"]["id"]
    else:  # an entry grown at an earlier session end, then locked by a person
        with_model.builders["lore_growth"] = lambda lb: {"entries": [entry(
            "Veyra", text, ["Veyra"], [lb.m("fishing town")])]}
        post_lines(api, "c1", [line("f1", "ayla.png", '"Veyra? A quiet fishing town, they say."', -300)])
        end_session(api, "c1")
        drain(services)
        grown = by_title(api)["Veyra"]
        assert grown["source"] == "job"
        lore_id = expect_ok(api.patch(f"/v1/lore/{grown['id']}", json={"locked": True}), 200)["entry"]["id"]
    with_model.builders["lore_growth"] = veyra_answer
    veyra_session(api)
    drain(services)
    assert expect_ok(api.get(f"/v1/lore/{lore_id}"))["entry"]["text"] == text
    [waiting] = [p for p in proposals(api) if p["title"] == "Veyra"]
    assert waiting["reason"] == "protected" and waiting["lore_id"] == lore_id and waiting["sources"] == ["a1"]
    assert "Council of Nine" in by_title(api)  # the unprotected proposal was written
    accepted = expect_ok(api.post(f"/v1/lore/proposals/{waiting['id']}/accept", json={}), 200,
                         "lore_proposal_accept.response")
    assert accepted["entry"]["id"] == lore_id and accepted["entry"]["text"].startswith("Veyra is a walled")
    assert accepted["proposal"]["state"] == "applied" and proposals(api) == []


def test_sw7c_sw9b_a_secret_place_seen_by_one_character_is_not_in_anothers_context(with_model, fake, api, services):
    """rules SW7c, SW9b: Ayla alone (with the player) finds the smugglers' cave; its entry is known
    by those witnesses; Bren, who joins the chat later, never gets it in his context, Ayla does."""
    setup(api)
    with_model.builders["lore_growth"] = lambda lb: {"entries": [entry(
        "Gullmouth Cave", "Gullmouth Cave: a hidden sea cave where smugglers keep their boats.",
        ["Gullmouth Cave", "Gullmouth"], [lb.m("Gullmouth")])]}
    post_lines(api, "c1", [line("a1", "ayla.png", '*Ayla lifts the lantern.* "Gullmouth Cave. The smugglers '
                                                  'hide their boats here; nobody else knows."', 0)])
    end_session(api, "c1")
    drain(services)
    cave = by_title(api)["Gullmouth Cave"]
    assert cave["known_by"] == ["ayla.png", "kai.png"]
    chat(api, "c1", "ayla.png", "kai.png", "bren.png")
    post_lines(api, "c1", [line("b1", "bren.png", '"What is there to see at Gullmouth?"', 400)])
    assert "hidden sea cave" not in cards_block(turn(api, "Bren asks about Gullmouth.", speaker="bren.png"))
    assert "hidden sea cave" in cards_block(turn(api, "Bren asks about Gullmouth.", speaker="ayla.png"))


@pytest.mark.parametrize("overrides", [{"lore_growth_review": "review"}], indirect=True)
def test_sw7d_review_mode_keeps_proposals_out_of_the_context_until_accepted(with_model, fake, api, services):
    """rule SW7d: with review on, the proposals wait and no card fires; rejecting one writes
    nothing; accepting the other, edited, writes it as the person's, and it fires."""
    with_model.builders["lore_growth"] = veyra_answer
    setup(api)
    veyra_session(api)
    drain(services)
    assert lore_list(api) == []
    waiting = {p["title"]: p for p in proposals(api, chat_id="c1")}
    assert set(waiting) == {"Veyra", "Council of Nine"} and {p["reason"] for p in waiting.values()} == {"review"}
    assert cards_block(turn(api, "The magistrates of Veyra.")) == ""
    rejected = expect_ok(api.post(f"/v1/lore/proposals/{waiting['Veyra']['id']}/reject", json={}), 200,
                         "lore_proposal.response")["proposal"]
    assert rejected["state"] == "rejected"
    expect_error(api.post(f"/v1/lore/proposals/{waiting['Veyra']['id']}/accept", json={}), 409, "proposal_not_pending")
    edited = expect_ok(api.patch(f"/v1/lore/proposals/{waiting['Council of Nine']['id']}",
                                 json={"triggers": ["Council of Nine", "magistrates", "the Nine"]}), 200,
                       "lore_proposal.response")["proposal"]
    assert edited["triggers"][-1] == "the Nine"
    accepted = expect_ok(api.post(f"/v1/lore/proposals/{edited['id']}/accept", json={"text": "Nine magistrates rule Veyra."}),
                         200, "lore_proposal_accept.response")["entry"]
    assert accepted["source"] == "user" and accepted["sources"] == ["a1"]
    assert "Nine magistrates rule Veyra." in cards_block(turn(api, "The magistrates of Veyra."))
    assert [p["state"] for p in proposals(api, state="all")] == ["rejected", "applied"]
    # Two waiting proposals of the same new entry: accepting the second updates what the first wrote.
    with_model.builders["lore_growth"] = lambda lb: {"entries": [
        entry("Salt token", "A salt token lets a traveller into Veyra.", ["salt token"], [lb.m("salt token")], kind="item"),
        entry("Salt token", "Every traveller must carry a salt token.", ["salt token"], [lb.m("salt token")], kind="item")]}
    post_lines(api, "c1", [line("b1", "ayla.png", '"Every traveller must carry a salt token to enter Veyra."', 300)])
    end_session(api, "c1")
    drain(services)
    first, second = proposals(api)
    one = expect_ok(api.post(f"/v1/lore/proposals/{first['id']}/accept", json={}), 200)["entry"]
    two = expect_ok(api.post(f"/v1/lore/proposals/{second['id']}/accept", json={}), 200)["entry"]
    assert one["id"] == two["id"] and two["text"] == "Every traveller must carry a salt token."
    assert sorted(e["title"] for e in lore_list(api)) == ["Council of Nine", "Salt token"]


def test_sw7d_editing_or_deleting_a_source_marks_the_entry_for_review(with_model, fake, api, services):
    """rule SW7d: editing the message an entry rests on marks it "source_edited"; a person's save
    with review null clears it; deleting the message marks it "source_deleted"."""
    with_model.builders["lore_growth"] = veyra_answer
    setup(api)
    veyra_session(api)
    drain(services)
    post_lines(api, "c1", [line("a1", "ayla.png", VEYRA.replace("Nine", "Seven"), 1, turn_id="t1")])
    council = by_title(api)["Council of Nine"]
    assert council["review"] == "source_edited"
    cleared = expect_ok(api.patch(f"/v1/lore/{council['id']}", json={"review": None}), 200)["entry"]
    assert cleared["review"] is None and cleared["source"] == "job"  # nothing of it was rewritten
    expect_ok(api.delete("/v1/chats/c1/messages/a1"), 200)
    assert by_title(api)["Council of Nine"]["review"] == "source_deleted"
    expect_ok(api.delete(f"/v1/lore/{council['id']}"), 200)
    assert services.db.reader().execute("SELECT count(*) FROM lore_sources WHERE owner_id=?",
                                        (council["id"],)).fetchone()[0] == 0


@pytest.mark.parametrize("overrides", [{"lore_growth_review": "review"}], indirect=True)
def test_sw7d_rolling_back_a_turn_removes_the_proposals_resting_on_it(with_model, fake, api, services):
    """rule SW7d (RV10): rolling back the turn of the message the proposals rest on removes them."""
    with_model.builders["lore_growth"] = veyra_answer
    setup(api)
    veyra_session(api)
    drain(services)
    assert len(proposals(api)) == 2
    removed = expect_ok(api.post("/v1/chats/c1/turns/t1/rollback", json={}), 200)["removed"]
    assert removed["lore_proposals"] == 2 and proposals(api, state="all") == []


def test_sw7d_rollback_takes_back_an_applied_entry_and_an_update(with_model, fake, api, services):
    """rule SW7d (RV10): an entry the rolled-back turn's proposal created goes; an entry it
    updated is put back as it was."""
    with_model.builders["lore_growth"] = veyra_answer
    setup(api)
    veyra_session(api)
    drain(services)
    with_model.builders["lore_growth"] = lambda lb: {"entries": [entry(
        "Council of Nine", "The Council of Nine was dissolved.", ["Council of Nine"], [lb.m("dissolved")],
        kind="faction")]}
    post_lines(api, "c1", [line("b1", "ayla.png", '"The Council of Nine was dissolved," Ayla says.', 300, turn_id="t2")])
    end_session(api, "c1")
    drain(services)
    assert by_title(api)["Council of Nine"]["text"] == "The Council of Nine was dissolved."
    expect_ok(api.post("/v1/chats/c1/turns/t2/rollback", json={}), 200)
    assert by_title(api)["Council of Nine"]["text"].startswith("The Council of Nine: nine magistrates")
    expect_ok(api.post("/v1/chats/c1/turns/t1/rollback", json={}), 200)
    assert lore_list(api) == []


@pytest.mark.parametrize("overrides", [{"lore_growth_review": "review"}], indirect=True)
def test_sw7_export_and_import_carry_proposals_and_sources(with_model, fake, api, services, tmp_path):
    """rule OP8 for grown lore: an export holds the proposals and their sources, and an import into
    an empty store brings them back."""
    with_model.builders["lore_growth"] = veyra_answer
    setup(api)
    veyra_session(api)
    drain(services)
    document = portable.export_store(services.db)
    assert len(document["tables"]["lore_proposals"]["rows"]) == 2
    assert len(document["tables"]["lore_sources"]["rows"]) == 2
    from server_plugin.app import open_store
    fresh = open_store(tmp_path / "fresh.db", services.settings)
    portable.import_store(fresh, document)
    rows = fresh.reader().execute("SELECT title, state FROM lore_proposals ORDER BY title").fetchall()
    assert [tuple(r) for r in rows] == [("Council of Nine", "pending"), ("Veyra", "pending")]


def test_sw7b_extractive_mode_grows_a_described_place(overrides, api, services):
    """rule SW7b, OP1: without a model the session end still grows Veyra, in its own words."""
    overrides.update(llm_mode="extractive")
    setup(api)
    veyra_session(api)
    drain(services)
    grown = by_title(api)
    assert set(grown) == {"Veyra", "Council of Nine"}
    assert grown["Veyra"]["text"].startswith("The ferry docks at Veyra, a walled port city of white stone.")
    assert grown["Council of Nine"]["sources"] == ["a1"] and grown["Council of Nine"]["source"] == "job"


def test_sw7d_review_mode_is_switched_at_run_time_through_the_settings_api(with_model, fake, api, services):
    """rule SW7d: the Lore tab's choice is PATCH /v1/settings `lore_growth_review`; switched to
    review at run time, the next session's proposals wait; a value outside the two is refused,
    naming the field, and changes nothing."""
    got = expect_ok(api.patch("/v1/settings", json={"lore_growth_review": "review"}), 200, "settings.response")
    assert got["settings"]["lore_growth_review"] == "review"
    bad = api.patch("/v1/settings", json={"lore_growth_review": "later"})
    assert bad.status_code == 400 and "lore_growth_review" in bad.get_data(as_text=True)
    assert expect_ok(api.get("/v1/settings"), 200, "settings.response")["settings"]["lore_growth_review"] == "review"
    with_model.builders["lore_growth"] = veyra_answer
    setup(api)
    veyra_session(api)
    drain(services)
    assert lore_list(api) == []
    assert {p["reason"] for p in proposals(api, chat_id="c1")} == {"review"}
