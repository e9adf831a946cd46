"""Campaigns (rules CP1, CP1a-CP1d): chats grouped into one story. Within a campaign, search, the
memory bank and the story summary cover every chat, with the witness rules (SW9b); between
campaigns nothing derived from play crosses, only what a person saved (RV4)."""

from __future__ import annotations

import pytest

from tests.helpers.api import expect_error, expect_ok
from tests.helpers.conversation import drain, job_rows, post, turn_messages
from tests.helpers.episodes import QUIET, chat, end_session, line, post_lines, register_cast

SISTER = "My sister Wren keeps the lighthouse on Gull Rock."


def put_chat(api, chat_id, status=200, **body):
    return expect_ok(api.put(f"/v1/chats/{chat_id}", json=body), status, "chat.response")["chat"]


def campaigns(api):
    return expect_ok(api.get("/v1/campaigns"), 200, "campaigns.response")["campaigns"]


def context(api, chat_id, speaker, text, ctx=4000):
    body = {"chat_id": chat_id, "speaker_id": speaker, "context_tokens": ctx, "last_action": {"text": text}}
    return expect_ok(api.post("/v1/context", json=body), 200, "context.response")


def block(out, name):
    return " ".join(b["text"] for b in out["blocks"] if b["section"] == name)


def search(api, query, viewer, chat_id):
    body = {"query": query, "viewer_id": viewer, "chat_id": chat_id, "k": 10}
    return expect_ok(api.post("/v1/search", json=body), 200, "search.response")["results"]


def for_turn(api, chat_id, speaker):
    got = expect_ok(api.get(f"/v1/memories/for-turn?chat_id={chat_id}&speaker_id={speaker}"), 200,
                    "memories_for_turn.response")
    return {m["text"] for m in got["memories"]}


@pytest.fixture
def overrides():
    return dict(QUIET)


# --- the data model ---------------------------------------------------------------------------

def test_cp1_a_lone_chat_is_its_own_campaign_and_chats_join_and_split(api):
    """rule CP1: campaign_id defaults to the chat's own id; a chat joins another's campaign and
    splits off again; GET /v1/campaigns lists each campaign with its chats, oldest first."""
    register_cast(api)
    lone = put_chat(api, "g", 201, member_ids=["ayla.png", "bren.png"])
    assert lone["campaign_id"] == "g" and lone["branch_of"] is None
    put_chat(api, "s", 201, member_ids=["ayla.png"], campaign_id="g")
    put_chat(api, "x", 201, member_ids=["cora.png"])
    listed = {c["id"]: [ch["id"] for ch in c["chats"]] for c in campaigns(api)}
    assert listed == {"g": ["g", "s"], "x": ["x"]}
    # Resending members leaves the campaign as it was; a split is a move to its own id.
    assert put_chat(api, "s", member_ids=["ayla.png"])["campaign_id"] == "g"
    assert put_chat(api, "s", campaign_id="s")["campaign_id"] == "s"
    assert {c["id"] for c in campaigns(api)} == {"g", "s", "x"}


def test_cp2_branch_of_is_stored_and_a_chat_is_no_branch_of_itself(api):
    """rule CP2: branch_of {chat_id, message_id?} is stored and shown; null clears it; a chat
    cannot be its own branch (400, nothing stored)."""
    put_chat(api, "p", 201)
    made = put_chat(api, "b", 201, branch_of={"chat_id": "p", "message_id": "a3"})
    assert made["branch_of"] == {"chat_id": "p", "message_id": "a3"} and made["campaign_id"] == "b"
    expect_error(api.put("/v1/chats/b", json={"branch_of": {"chat_id": "b"}}), 400, "invalid_branch")
    assert put_chat(api, "b", title="Branch")["branch_of"] == {"chat_id": "p", "message_id": "a3"}
    assert put_chat(api, "b", branch_of=None)["branch_of"] is None
    expect_error(api.put("/v1/chats/b", json={"branch_of": {"message_id": "a3"}}), 400, "invalid_request")


def test_cp1_a_rename_carries_the_campaign_and_the_branch_links(api):
    """rule CP1, CP2: SillyTavern renaming a chat keeps its campaign's chats together and its
    branches pointing at it."""
    put_chat(api, "old", 201)
    put_chat(api, "side", 201, campaign_id="old")
    put_chat(api, "br", 201, branch_of={"chat_id": "old"})
    expect_ok(api.post("/v1/chats/old/rename", json={"new_id": "new"}), 200)
    assert {c["id"]: [ch["id"] for ch in c["chats"]] for c in campaigns(api)}["new"] == ["new", "side"]
    assert expect_ok(api.get("/v1/chats/br"))["chat"]["branch_of"]["chat_id"] == "new"


# --- within a campaign: the witness rules hold across its chats (CP1, SW9b) -----------------

def group_and_side_chats(api):
    """A group chat g (Ayla, Bren, Kai) where Kai tells of his sister, Ayla's side chat s and
    Cora's chat c, both in g's campaign."""
    register_cast(api)
    chat(api, "g", "ayla.png", "bren.png", "kai.png")
    post_lines(api, "g", [line("g1", "kai.png", f'"{SISTER}"', 0),
                          line("g2", "ayla.png", '"I will remember that, Kai."', 1)])
    chat(api, "s", "ayla.png", "kai.png")
    chat(api, "c", "cora.png", "kai.png")
    post_lines(api, "s", [line("s1", "kai.png", '"Good morning, Ayla."', 60)])
    post_lines(api, "c", [line("c1", "kai.png", '"Good morning, Cora."', 61)])


def test_cp1_a_fact_told_in_the_group_is_recalled_by_that_character_in_its_side_chat(api):
    """rule CP1, SW9b: in Ayla's side chat of the same campaign, the memory bank and search find
    what Kai told the group; Cora, in the campaign but in neither chat, finds nothing of it; and
    before the side chat joined the campaign, Ayla found nothing there either."""
    group_and_side_chats(api)
    question = "Who keeps the lighthouse on Gull Rock? What is my sister called?"
    assert not any(r["id"] == "g1" for r in search(api, question, "ayla.png", "s"))
    assert "Wren" not in block(context(api, "s", "ayla.png", question), "memory_bank")

    put_chat(api, "s", campaign_id="g")
    put_chat(api, "c", campaign_id="g")
    found = search(api, question, "ayla.png", "s")
    assert any(r["id"] == "g1" and r["chat_id"] == "g" for r in found)
    assert "Wren" in block(context(api, "s", "ayla.png", question), "memory_bank")
    assert not any("Wren" in r["text"] for r in search(api, question, "cora.png", "c"))
    assert "Wren" not in block(context(api, "c", "cora.png", question), "memory_bank")


def test_cp1_a_rollback_in_one_chat_touches_no_other_chat_of_its_campaign(api, services):
    """rule CP1, RV10: two chats of one campaign with the same message and turn ids (as a
    branch copies them): rolling back t1 in one takes its memory, and the other keeps its own
    memory, messages and jobs."""
    register_cast(api)
    chat(api, "one", "ayla.png")
    chat(api, "two", "ayla.png")
    put_chat(api, "two", campaign_id="one")
    for chat_id in ("one", "two"):
        post(api, turn_messages(1), chat_id)
        expect_ok(api.post("/v1/memories", json={
            "text": f"Ayla keeps a lantern ({chat_id}).", "scope": "character", "character_id": "ayla.png",
            "actor": "model", "chat_id": chat_id, "turn_id": "t1"}), 201)
    jobs_before = len(job_rows(services, chat_id="two"))
    expect_ok(api.post("/v1/chats/one/turns/t1/rollback", json={}), 200)
    # The campaign shares the memory two filed; the one chat one filed is gone.
    assert for_turn(api, "two", "ayla.png") == for_turn(api, "one", "ayla.png") == {"Ayla keeps a lantern (two)."}
    page = expect_ok(api.get("/v1/chats/two/messages"))["messages"]
    assert [m["id"] for m in page] == ["u1", "a1"] and len(job_rows(services, chat_id="two")) == jobs_before


# --- between campaigns: only what a person saved crosses (CP1a, CP1b, CP1c) -----------------

def test_cp1a_a_memory_a_job_filed_stays_in_its_campaign_until_a_person_moves_it(api):
    """rule CP1a, CP1b: a background job's memory (deep memory's way in) filed in chat one is read
    in one, not in two (same character, another campaign), neither per turn nor by search; a
    person's memory is read in both; a person giving the job's memory a scope moves it out."""
    register_cast(api)
    chat(api, "one", "ayla.png")
    chat(api, "two", "ayla.png")
    filed = expect_ok(api.post("/v1/memories", json={
        "text": "Kai is allergic to bees.", "scope": "character", "character_id": "ayla.png",
        "actor": "background", "chat_id": "one"}), 201, "memory.response")["memory"]
    assert filed["campaign_id"] == "one"
    mine = expect_ok(api.post("/v1/memories", json={
        "text": "Kai's birthday is March 3.", "scope": "character", "character_id": "ayla.png",
        "actor": "user", "chat_id": "one"}), 201, "memory.response")["memory"]
    assert mine["campaign_id"] is None
    assert for_turn(api, "one", "ayla.png") == {filed["text"], mine["text"]}
    assert for_turn(api, "two", "ayla.png") == {mine["text"]}
    assert not any(r["id"] == filed["id"] for r in search(api, "bees allergy", "ayla.png", "two"))
    assert any(r["id"] == filed["id"] for r in search(api, "bees allergy", "ayla.png", "one"))

    moved = expect_ok(api.patch(f"/v1/memories/{filed['id']}", json={
        "actor": "user", "scope": "character", "character_id": "ayla.png"}), 200, "memory.response")["memory"]
    assert moved["campaign_id"] is None
    assert for_turn(api, "two", "ayla.png") == {filed["text"], mine["text"]}
    assert any(r["id"] == filed["id"] for r in search(api, "bees allergy", "ayla.png", "two"))


def test_cp1c_moving_a_chat_moves_its_memories(api):
    """rule CP1c: a chat that joins another campaign takes the memories its play filed along."""
    register_cast(api)
    chat(api, "one", "ayla.png")
    chat(api, "two", "ayla.png")
    chat(api, "three", "ayla.png")
    filed = expect_ok(api.post("/v1/memories", json={
        "text": "Kai lost his compass at the mill.", "scope": "character", "character_id": "ayla.png",
        "actor": "background", "chat_id": "two"}), 201)["memory"]
    assert filed["text"] not in for_turn(api, "one", "ayla.png")
    put_chat(api, "two", campaign_id="one")
    assert expect_ok(api.get(f"/v1/memories/{filed['id']}"))["memory"]["campaign_id"] == "one"
    assert filed["text"] in for_turn(api, "one", "ayla.png")
    assert filed["text"] not in for_turn(api, "three", "ayla.png")


# --- the story summary is the campaign's (CP1d, SW2) -----------------------------------------

def test_cp1d_the_story_summary_holds_the_earlier_chats_then_its_own(api, services):
    """rule CP1d, SW2: a new chat of the campaign opens with the earlier chat's session summary;
    a character who was not in the earlier chat does not get it; the campaign's sessions list
    both chats' sessions in time order, each with its own number."""
    register_cast(api)
    chat(api, "first", "ayla.png", "kai.png")
    post_lines(api, "first", [
        line("f1", "kai.png", '"Ayla, the smugglers hid the bell in the chapel crypt."', 0),
        line("f2", "ayla.png", '"Then we go to the chapel crypt tonight, Kai."', 1)])
    end_session(api, "first")
    drain(services)
    chat(api, "second", "ayla.png", "kai.png", "cora.png")
    put_chat(api, "second", campaign_id="first")
    post_lines(api, "second", [line("n1", "kai.png", '"A new day at the harbour."', 600)])
    end_session(api, "second")
    drain(services)

    ayla = block(context(api, "second", "ayla.png", "What now?"), "story_summary")
    assert "chapel crypt" in ayla and "harbour" in ayla
    cora = block(context(api, "second", "cora.png", "What now?"), "story_summary")
    assert "chapel crypt" not in cora and "harbour" in cora
    listed = expect_ok(api.get("/v1/campaigns/first/sessions"), 200, "sessions.response")["sessions"]
    assert [(s["chat_id"], s["n"]) for s in listed] == [("first", 1), ("second", 1)]
    expect_error(api.get("/v1/campaigns/nowhere/sessions"), 404, "campaign_not_found")


@pytest.fixture
def with_model(overrides, fake):
    overrides.update(llm_mode="openai", llm_url=fake.url, llm_model="fake-model", llm_retries=0,
                     llm_read_timeout=5)
    return fake.responder


def test_cp1a_a_sheet_field_learned_in_one_campaign_is_not_in_another(with_model, fake, api, services):
    """rule CP1a, SW1: a session-end sheet update learned in chat one shows in one's context and
    in the next update's prompt there; chat two (same character, another campaign) keeps the
    sheet as it was; a field a person wrote shows in both."""
    with_model.builders["sheet_updates"] = lambda lb: {"new": [], "updates": [
        {"character": lb.c("Ayla"), "fields": {"appearance": "Short, cropped dark hair."}}]}
    register_cast(api)
    expect_ok(api.put("/v1/characters/ayla.png", json={
        "name": "Ayla", "sheet": {"personality": "Quiet and watchful."}}), 200)
    expect_ok(api.put("/v1/characters/ayla.png", json={
        "name": "Ayla", "actor": "background",
        "sheet": {"personality": "Quiet and watchful.", "appearance": "Long dark hair."}}), 200)
    chat(api, "one", "ayla.png", "kai.png")
    chat(api, "two", "ayla.png", "kai.png")
    post_lines(api, "one", [line("u1", "kai.png", '"Ayla, your hair is cut short now."', 0),
                            line("a1", "ayla.png", '"The sea wind tangled it, so I cut it."', 1)])
    end_session(api, "one")
    drain(services)
    assert [r["state"] for r in job_rows(services, kind="sheet_updates")] == ["done"]
    one = block(context(api, "one", "ayla.png", "Hello."), "character_sheets")
    two = block(context(api, "two", "ayla.png", "Hello."), "character_sheets")
    assert "Short, cropped dark hair." in one and "Quiet and watchful." in one
    assert "Short, cropped dark hair." not in two and "Quiet and watchful." in two
    # Campaign two learns its own value; each campaign keeps its own.
    with_model.builders["sheet_updates"] = lambda lb: {"new": [], "updates": [
        {"character": lb.c("Ayla"), "fields": {"appearance": "A braid down her back."}}]}
    post_lines(api, "two", [line("v1", "kai.png", '"That braid suits you."', 5)])
    end_session(api, "two")
    drain(services)
    assert "A braid down her back." in block(context(api, "two", "ayla.png", "Hi."), "character_sheets")
    one = block(context(api, "one", "ayla.png", "Hi."), "character_sheets")
    assert "Short, cropped dark hair." in one and "braid" not in one


def test_cp1_cp2_export_and_import_carry_campaigns_branch_links_and_learned_fields(api, services, tmp_path, embedder):
    """rule CP1, CP2, OP8: an export holds each chat's campaign and branch link, the memories'
    campaigns and the learned sheet fields; imported into a fresh store, the campaigns, the
    branch and what each campaign reads are as they were."""
    from server_plugin.app import build_services, create_app
    from server_plugin.clock import FakeClock
    from server_plugin.settings import load_settings
    from tests.helpers.api import T0, TOKEN, Api

    register_cast(api)
    chat(api, "one", "ayla.png")
    chat(api, "two", "ayla.png")
    put_chat(api, "two", campaign_id="one")
    put_chat(api, "br", 201, member_ids=["ayla.png"], branch_of={"chat_id": "one", "message_id": "x"})
    expect_ok(api.post("/v1/memories", json={
        "text": "Kai is allergic to bees.", "scope": "character", "character_id": "ayla.png",
        "actor": "background", "chat_id": "two"}), 201)
    with services.db.write() as conn:
        conn.execute("INSERT INTO sheet_learned VALUES ('ayla.png', 'one', 'appearance', 'Short hair.', 'now')")
    document = expect_ok(api.get("/v1/export"), 200, "export.document")
    assert "campaign_id" in document["tables"]["chats"]["columns"]
    assert document["tables"]["sheet_learned"]["rows"]
    settings = load_settings({"data_dir": str(tmp_path / "b"), "token": TOKEN, "worker_enabled": False}, environ={})
    svc_b = build_services(settings, embedder=embedder, clock=FakeClock(T0))
    try:
        api_b = Api(create_app(settings, services=svc_b).test_client())
        expect_ok(api_b.post("/v1/import", json={"document": document}), 200, "import.response")
        assert campaigns(api_b) == campaigns(api)
        assert expect_ok(api_b.get("/v1/chats/br"))["chat"]["branch_of"] == {"chat_id": "one", "message_id": "x"}
        assert for_turn(api_b, "one", "ayla.png") == {"Kai is allergic to bees."}
        assert for_turn(api_b, "br", "ayla.png") == set()
    finally:
        svc_b.db.close()


# --- continuing the campaign in a new chat (CP1f) ----------------------------------------------

def recap(api, campaign_id):
    return expect_ok(api.get(f"/v1/campaigns/{campaign_id}/recap"), 200, "campaign_recap.response")


def test_cp1f_the_recap_tells_the_latest_sessions_of_every_chat_of_the_campaign(api, services):
    """rule CP1f: a new chat of the campaign opens with "previously": the short summaries of the
    latest sessions across its chats, oldest first; nothing before any summary; an unknown
    campaign is a 404."""
    register_cast(api)
    chat(api, "g", "ayla.png")
    chat(api, "s", "ayla.png")
    assert recap(api, "g") == {"campaign_id": "g", "text": "", "parts": []}
    post(api, turn_messages(1, minutes=0), "g")
    end_session(api, "g")
    put_chat(api, "s", campaign_id="g")
    post(api, turn_messages(2, minutes=600), "s")
    end_session(api, "s")
    drain(services)
    got = recap(api, "g")
    assert got["parts"] == ["g#1", "s#1"]
    shorts = [expect_ok(api.get(f"/v1/chats/{c}/sessions"), 200)["sessions"][0]["short"] for c in ("g", "s")]
    assert all(shorts) and got["text"].startswith("Previously: ")
    assert got["text"].index(shorts[0][:30]) < got["text"].index(shorts[1][:30])
    for unknown in ("s", "nowhere"):  # s is in g's campaign now: "s" names no campaign
        expect_error(api.get(f"/v1/campaigns/{unknown}/recap"), 404, "campaign_not_found")


def test_cp1_export_and_import_carry_campaigns_and_branch_links(api, services, tmp_path, embedder):
    """rule CP1, OP8: a store with two chats in one campaign and a branch exports and imports into a
    fresh store with the same campaigns, the same branch link, and the campaign's learned memory
    still scoped to it."""
    from tests.test_portable import export, open_store

    register_cast(api)
    put_chat(api, "g", 201, member_ids=["ayla.png", "bren.png"])
    put_chat(api, "s", 201, member_ids=["ayla.png"], campaign_id="g")
    post(api, turn_messages(0), "s")
    put_chat(api, "b", 201, member_ids=["ayla.png"], branch_of={"chat_id": "s", "message_id": "a0"})
    before = campaigns(api)
    document = export(api)
    svc2, api2 = open_store(tmp_path, embedder, "restored")
    try:
        expect_ok(api2.post("/v1/import", json={"document": document}), 200)
        assert campaigns(api2) == before
        got = expect_ok(api2.get("/v1/chats/b"), 200, "chat.response")["chat"]
        assert got["branch_of"] == {"chat_id": "s", "message_id": "a0"}
        assert got["campaign_id"] == "b"
        assert expect_ok(api2.get("/v1/chats/s"), 200, "chat.response")["chat"]["campaign_id"] == "g"
        assert export(api2) == document
    finally:
        svc2.db.close()
