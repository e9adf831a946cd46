"""Secrets (rule SW9b): what is derived from a scene is known by its witnesses — the members of the
chat it happened in — and by whoever is later told in a scene they witness ("X told Y about Z",
extracted, evidence verified verbatim, SW8). A told event is undone with its turn or its evidence
message. One store serves many chats: what the player told Ayla in Ayla's chat is unknown to Bren
in Bren's chat until someone tells Bren."""

from __future__ import annotations

import pytest

from server_plugin.retrieval import visibility
from server_plugin.retrieval.visibility import ItemRef
from tests.helpers.api import expect_ok
from tests.helpers.conversation import drain
from tests.helpers.episodes import (
    QUIET,
    Answers,
    Labels,
    chat,
    end_session,
    episodes,
    index_entry,
    line,
    message_seq,
    no_orphans,
    post_lines,
    register_cast,
    told_answer,
)

KEY = "I buried the silver key under the chapel bell."
TOLD = "Kai buried the silver key under the chapel bell, Cora."


@pytest.fixture
def overrides(request, fake):
    values = dict(QUIET)
    if getattr(request, "param", "openai") == "openai":
        values.update(llm_mode="openai", llm_url=fake.url, llm_model="fake-model", llm_retries=0,
                      llm_read_timeout=5)
    return values


def key_memory(lb: Labels) -> dict:
    """Ayla's memory of the scene where Kai confides where the key is (and nothing elsewhere)."""
    if not any("I buried" in text for _, text in lb.messages):
        return {"memories": []}
    return {"memories": [{
        "character": lb.c("Ayla"), "summary": "Kai trusted me with where he hid the silver key.",
        "feeling": "trusted", "quotes": [{"speaker": "Kai", "text": KEY, "message": lb.m("I buried")}],
        "participants": [lb.c("Ayla"), lb.c("Kai")], "importance": 5, "messages": [lb.m("I buried")]}]}


def confide(api, services, answers: Answers) -> dict:
    """Kai confides in Ayla in Ayla's own chat; returns Ayla's character memory of it."""
    answers.builders["character_memories"] = key_memory
    register_cast(api)
    chat(api, "ayla-chat", "ayla.png")
    post_lines(api, "ayla-chat", [line("u1", "kai.png", f'*Kai leans close.* "{KEY}"', 0),
                                  line("a1", "ayla.png", '"Your secret is safe with me."', 1, turn_id="t1")])
    end_session(api, "ayla-chat")
    drain(services)
    [memory] = episodes(api, kind="character_memory", chat_id="ayla-chat")
    return memory


def road(api, services, answers: Answers, told_line: str = TOLD, turn_id: str = "r1") -> None:
    """Later, on the road, Ayla tells Cora (a scene Cora witnesses)."""
    answers.builders["told_events"] = told_answer("Ayla", ["Cora"], "silver key", "chapel bell",
                                                  "Kai buried the silver key under the chapel bell")
    chat(api, "road", "ayla.png", "cora.png")
    post_lines(api, "road", [line("r-a1", "ayla.png", f'*Ayla lowers her voice.* "{told_line}"', 600,
                                  turn_id=turn_id),
                             line("r-c1", "cora.png", '"Then we dig tonight."', 601, turn_id=turn_id + "c")])
    end_session(api, "road")
    drain(services)


def knowers(api, item_id: str) -> list[str]:
    return expect_ok(api.get(f"/v1/episodes/{item_id}"), 200, "episode.response")["episode"]["known_by"]


def test_sw9b_witnessed_by_a_and_b_is_known_to_them_and_not_to_c(api, services, fake):
    """rule SW9b: a scene in a chat of Ayla and Bren — what is derived from it is known by Ayla,
    Bren (and the player who spoke), found with their viewer id, not with Cora's."""
    fake.responder.builders["character_memories"] = lambda lb: {"memories": [{
        "character": lb.c("Bren"), "summary": "Ayla and I watched the ships leave.", "feeling": "calm",
        "quotes": [], "participants": [lb.c("Ayla"), lb.c("Bren")], "importance": 2,
        "messages": [lb.m("ships")]}] if "Bren" in lb.characters else []}
    register_cast(api)
    chat(api, "inn", "ayla.png", "bren.png")
    post_lines(api, "inn", [line("i1", "ayla.png", '"Look at the ships leaving, Bren."', 0, turn_id="i1"),
                            line("i2", "bren.png", '"They will be back by spring."', 1, turn_id="i2")])
    end_session(api, "inn")
    drain(services)
    [memory] = episodes(api, kind="character_memory", character_id="bren.png")
    assert memory["known_by"] == ["ayla.png", "bren.png"]
    for viewer, sees in (("ayla.png", True), ("bren.png", True), ("cora.png", False)):
        assert (memory["id"] in [e["id"] for e in episodes(api, viewer_id=viewer)]) is sees, viewer
        assert visibility.can_see(viewer, index_entry(services, "character_memory", memory["id"])["known_by"]) is sees
    assert len(episodes(api)) == len(episodes(api, viewer_id="ayla.png"))  # a person sees everything


def test_sw9b_one_store_many_chats_what_ayla_was_told_bren_does_not_know(api, services, fake):
    """rule SW9b: what the player told Ayla in Ayla's chat is unknown to Bren in Bren's chat."""
    memory = confide(api, services, fake.responder)
    chat(api, "bren-chat", "bren.png")
    post_lines(api, "bren-chat", [line("b1", "kai.png", '"Morning, Bren."', 5)])
    assert memory["known_by"] == ["ayla.png", "kai.png"]
    assert episodes(api, viewer_id="bren.png") == []
    seq = message_seq(services, "ayla-chat", "u1")
    assert not visibility.can_see("bren.png", index_entry(services, "message", seq)["known_by"])
    assert visibility.can_see("kai.png", index_entry(services, "message", seq)["known_by"])


def test_sw9b_after_a_told_b_b_knows_it(api, services, fake):
    """rule SW9b: Ayla tells Cora in a later scene Cora witnesses (a told event extracted from it,
    its evidence verbatim): Cora now knows Ayla's memory and the message it came from; the told
    event is listed."""
    memory = confide(api, services, fake.responder)
    assert "cora.png" not in memory["known_by"]
    road(api, services, fake.responder)
    assert knowers(api, memory["id"]) == ["ayla.png", "cora.png", "kai.png"]
    assert memory["id"] in [e["id"] for e in episodes(api, viewer_id="cora.png")]
    assert "cora.png" in index_entry(services, "character_memory", memory["id"])["known_by"]
    source = index_entry(services, "message", message_seq(services, "ayla-chat", "u1"))
    assert "cora.png" in source["known_by"]  # the original words are findable by Cora now
    [told] = expect_ok(api.get("/v1/told?character_id=cora.png"), 200, "told.response")["told"]
    assert (told["teller_id"], told["listener_ids"], told["item"]) == (
        "ayla.png", ["cora.png"], {"kind": "character_memory", "ref": memory["id"]})
    assert told["evidence"] == {"speaker": "Ayla", "text": "Kai buried the silver key under the chapel bell",
                                "message_id": "r-a1"}
    assert "bren.png" not in knowers(api, memory["id"])  # nobody told Bren


def test_sw8_sw9b_a_told_event_without_verbatim_evidence_is_dropped(api, services, fake):
    """rules SW8, SW9b: evidence that is not in the cited message is dropped and counted; nobody
    learns anything from it."""
    memory = confide(api, services, fake.responder)
    road(api, services, fake.responder, told_line="We should dig near the old chapel bell tonight.")
    assert knowers(api, memory["id"]) == ["ayla.png", "kai.png"]
    [job] = [j for j in expect_ok(api.get("/v1/jobs?kind=told_events"), 200)["jobs"] if j["chat_id"] == "road"]
    assert job["result"]["told"] == [] and job["result"]["dropped_quotes"] == 1


def test_sw9b_a_teller_must_know_what_they_tell(api, services, fake):
    """rule SW9b: a told event whose teller does not know the item grants nothing; once someone
    who knows tells it, the listener knows."""
    memory = confide(api, services, fake.responder)
    road(api, services, fake.responder)
    chat(api, "hall", "bren.png", "cora.png")
    fake.responder.builders["told_events"] = told_answer(
        "Bren", ["Cora"], "silver key", "chapel", "The silver key is under the chapel bell")
    post_lines(api, "hall", [line("h1", "bren.png", '"The silver key is under the chapel bell."', 900)])
    end_session(api, "hall")
    drain(services)
    assert "bren.png" not in knowers(api, memory["id"])
    fake.responder.builders["told_events"] = told_answer(
        "Cora", ["Bren"], "silver key", "chapel", "The silver key is under the chapel bell")
    post_lines(api, "hall", [line("h2", "cora.png", '"The silver key is under the chapel bell."', 2000)])
    end_session(api, "hall")
    assert "cora.png" in knowers(api, memory["id"]) and "bren.png" not in knowers(api, memory["id"])
    drain(services)  # now Cora (who knows) tells Bren (present)
    assert "bren.png" in knowers(api, memory["id"])


def test_sw9b_a_listener_who_joined_after_the_telling_learns_nothing(api, services, fake):
    """rule SW9b: the listeners are those who witnessed the telling message — a character who
    joined the chat afterwards is not told, even if the model says so."""
    memory = confide(api, services, fake.responder)
    chat(api, "road", "ayla.png", "cora.png")
    post_lines(api, "road", [line("r-a1", "ayla.png", f'"{TOLD}"', 600, turn_id="r1")])
    chat(api, "road", "ayla.png", "cora.png", "bren.png")  # Bren arrives later
    post_lines(api, "road", [line("r-b1", "bren.png", '"What did I miss?"', 605, turn_id="r2")])
    fake.responder.builders["told_events"] = told_answer(
        "Ayla", ["Cora", "Bren"], "silver key", "chapel bell", "Kai buried the silver key under the chapel bell")
    end_session(api, "road")
    drain(services)
    assert knowers(api, memory["id"]) == ["ayla.png", "cora.png", "kai.png"]
    [told] = expect_ok(api.get("/v1/told"), 200, "told.response")["told"]
    assert told["listener_ids"] == ["cora.png"]


def test_rv10_sw9b_rolling_back_the_telling_turn_undoes_it(api, services, fake):
    """rules RV10, SW9b: rolling back the turn whose message told the secret removes what the
    told event granted — Cora no longer knows the memory nor its source message."""
    memory = confide(api, services, fake.responder)
    road(api, services, fake.responder)
    assert "cora.png" in knowers(api, memory["id"])
    out = expect_ok(api.post("/v1/chats/road/turns/r1/rollback", json={}), 200, "turn_rollback.response")
    assert out["removed"]["told_events"] == 1
    assert knowers(api, memory["id"]) == ["ayla.png", "kai.png"]
    assert "cora.png" not in index_entry(services, "character_memory", memory["id"])["known_by"]
    assert "cora.png" not in index_entry(services, "message", message_seq(services, "ayla-chat", "u1"))["known_by"]
    assert expect_ok(api.get("/v1/told"), 200, "told.response")["told"] == []
    no_orphans(services)


def test_sw9b_deleting_the_evidence_message_undoes_the_telling(api, services, fake):
    """rule SW9b: a told event goes with its evidence message (what it granted is withdrawn)."""
    memory = confide(api, services, fake.responder)
    road(api, services, fake.responder)
    assert "cora.png" in knowers(api, memory["id"])
    out = expect_ok(api.delete("/v1/chats/road/messages/r-a1"), 200, "message_deleted.response")
    assert out["removed"]["told_events"] == 1
    assert knowers(api, memory["id"]) == ["ayla.png", "kai.png"]
    assert expect_ok(api.get("/v1/told"), 200, "told.response")["told"] == []
    no_orphans(services)


def test_sw8_sw9b_an_edit_that_removes_the_evidence_undoes_the_telling(api, services, fake):
    """rules SW8, SW9b: the telling message is edited and no longer holds the evidence: the told
    event is undone."""
    memory = confide(api, services, fake.responder)
    road(api, services, fake.responder)
    post_lines(api, "road", [line("r-a1", "ayla.png", '"Nothing to tell, Cora."', 600, turn_id="r1")])
    assert knowers(api, memory["id"]) == ["ayla.png", "kai.png"]
    assert expect_ok(api.get("/v1/told"), 200, "told.response")["told"] == []


@pytest.mark.parametrize("overrides", ["extractive"], indirect=True)
def test_sw9b_extractive_telling_a_sheet_secret_and_a_restricted_memory(api, services):
    """rule SW9b (extractive mode): Ayla speaks her sheet secret and a memory only she knew,
    almost word for word, in front of Bren; Bren now knows both — the secret in her sheet
    (known_by), the memory in Bren's per-turn set (RV5 with SW9b)."""
    register_cast(api)
    api.put("/v1/characters/ayla.png", json={"name": "Ayla", "sheet": {
        "personality": "Quiet.", "secrets": [{"text": "The silver key lies under the chapel bell."}]}})
    debt = expect_ok(api.post("/v1/memories", json={
        "text": "Ayla owes the smuggler Varro forty silver crowns.", "scope": "character",
        "character_id": "ayla.png", "actor": "user", "known_by": ["ayla.png"]}), 201)["memory"]
    chat(api, "road", "ayla.png", "bren.png")

    def bren_knows_debt() -> bool:
        got = expect_ok(api.get("/v1/memories/for-turn?chat_id=road&speaker_id=bren.png"), 200)
        return debt["id"] in [m["id"] for m in got["memories"]]

    assert not bren_knows_debt()
    post_lines(api, "road", [
        line("r1", "ayla.png", '*Ayla sighs.* "The silver key lies under the chapel bell, Bren. '
                               'And I still owe the smuggler Varro forty silver crowns."', 0, turn_id="r1"),
        line("r2", "bren.png", '"Then we had better hurry."', 1, turn_id="r2")])
    end_session(api, "road")
    drain(services)
    sheet = expect_ok(api.get("/v1/characters/ayla.png"), 200)["character"]["sheet"]
    assert sheet["secrets"] == [{"text": "The silver key lies under the chapel bell.", "known_by": ["bren.png"]}]
    assert sheet["personality"] == "Quiet."
    assert bren_knows_debt()
    assert expect_ok(api.get(f"/v1/memories/{debt['id']}"), 200)["memory"]["known_by"] == ["ayla.png", "bren.png"]
    kinds = sorted(t["item"]["kind"] for t in expect_ok(api.get("/v1/told"), 200, "told.response")["told"])
    assert kinds == ["memory", "sheet_secret"]
    # Undo: the telling turn is rolled back — Bren forgets both.
    expect_ok(api.post("/v1/chats/road/turns/r1/rollback", json={}), 200)
    sheet = expect_ok(api.get("/v1/characters/ayla.png"), 200)["character"]["sheet"]
    assert sheet["secrets"] == [{"text": "The silver key lies under the chapel bell.", "known_by": []}]
    assert not bren_knows_debt()


def test_visibility_tell_is_recorded_and_untell_is_exact(api, services, fake):
    """visibility.tell adds only those who did not know, records it per told event; untell removes
    only what that event added (a public item stays public)."""
    register_cast(api)
    public = expect_ok(api.post("/v1/memories", json={"text": "The sea is cold.", "scope": "global",
                                                      "actor": "user"}), 201)["memory"]
    private = expect_ok(api.post("/v1/memories", json={"text": "Ayla fears owls.", "scope": "global",
                                                       "actor": "user", "known_by": ["ayla.png"]}), 201)["memory"]
    items = [ItemRef("memory", public["id"]), ItemRef("memory", private["id"])]
    with services.db.write() as conn:
        for told_id, listener in (("k_a", "bren.png"), ("k_b", "bren.png"), ("k_c", "cora.png")):
            conn.execute("INSERT INTO told_events(id, chat_id, teller_id, listener_ids, item_kind, item_ref,"
                         " message_id, evidence, created_at) VALUES (?,?,?,?,?,?,?,?,?)",
                         (told_id, "x", "ayla.png", f'["{listener}"]', "memory", private["id"], "m", "{}", "t"))
        assert visibility.tell(services, conn, items, ["ayla.png", "bren.png"], "k_a") == {"memory": 1}
        assert visibility.tell(services, conn, items, ["bren.png"], "k_b") == {}  # knew already
        assert visibility.tell(services, conn, items, ["cora.png"], "k_c") == {"memory": 1}
        assert visibility.known_by(conn, items[0]) is None
        assert visibility.known_by(conn, items[1]) == ["ayla.png", "bren.png", "cora.png"]
        assert visibility.untell(services, conn, ["k_b"]) == 0  # it had added nobody
        assert visibility.untell(services, conn, ["k_a"]) == 1
        assert visibility.known_by(conn, items[1]) == ["ayla.png", "cora.png"]
    assert index_entry(services, "memory", private["id"])["known_by"] == ["ayla.png", "cora.png"]


def branch_of_road(api) -> None:
    """A branch of the road chat made at its last message (CP2), the telling copied into it."""
    expect_ok(api.put("/v1/chats/road-b", json={"member_ids": ["ayla.png", "cora.png"],
                                                 "branch_of": {"chat_id": "road", "message_id": "r-c1"}}), 201)


def test_cp2_sw9b_a_branch_keeps_what_was_told_before_m_when_the_parent_is_deleted(api, services, fake):
    """rules CP2, SW9b: the telling before the branch point is the branch's too (its own told
    event, its own grants): deleting the parent, which undoes the parent's telling, leaves Cora
    knowing Ayla's memory and its source message."""
    memory = confide(api, services, fake.responder)
    road(api, services, fake.responder)
    branch_of_road(api)
    [told] = expect_ok(api.get("/v1/told?chat_id=road-b"), 200, "told.response")["told"]
    assert (told["teller_id"], told["listener_ids"], told["item"], told["message_id"]) == (
        "ayla.png", ["cora.png"], {"kind": "character_memory", "ref": memory["id"]}, "r-a1")
    expect_ok(api.delete("/v1/chats/road"), 200)
    assert expect_ok(api.get("/v1/told?chat_id=road"), 200, "told.response")["told"] == []
    assert "cora.png" in knowers(api, memory["id"])
    assert "cora.png" in index_entry(services, "message", message_seq(services, "ayla-chat", "u1"))["known_by"]
    no_orphans(services)


def test_cp2_rv10_rolling_back_the_telling_in_the_branch_leaves_the_parents(api, services, fake):
    """rules CP2, RV10: rolling back the telling turn in the branch undoes the branch's told
    event only: the parent's stands, and Cora still knows (she was told there)."""
    memory = confide(api, services, fake.responder)
    road(api, services, fake.responder)
    branch_of_road(api)
    out = expect_ok(api.post("/v1/chats/road-b/turns/r1/rollback", json={}), 200, "turn_rollback.response")
    assert out["removed"]["told_events"] == 1
    assert expect_ok(api.get("/v1/told?chat_id=road-b"), 200, "told.response")["told"] == []
    assert len(expect_ok(api.get("/v1/told?chat_id=road"), 200, "told.response")["told"]) == 1
    assert "cora.png" in knowers(api, memory["id"])
    expect_ok(api.post("/v1/chats/road/turns/r1/rollback", json={}), 200)
    assert knowers(api, memory["id"]) == ["ayla.png", "kai.png"]
    no_orphans(services)
