"""Branches and checkpoints (rule CP2): a branch registered with `branch_of` shares what its parent
derived before the branch point, with no job and no model call; what follows is its own."""

from __future__ import annotations

import pytest

from tests.helpers.api import expect_ok
from tests.helpers.conversation import drain, job_rows, post, setup_chat, turn_messages

HOURS = 60


@pytest.fixture
def overrides():
    # Small windows so a short chat has summaries of every tier, and sessions 7 hours apart.
    return {"live_window_max_messages": 4, "summary_chunk_messages": 2, "summary_merge_count": 2,
            "session_gap_hours": 6, "deep_memory_min_new_messages": 10_000}


def parent_with_jobs_done(api, services, turns=10):
    setup_chat(api, "p")
    for n in range(turns):
        post(api, turn_messages(n, minutes=n * 7 * HOURS), "p")
    drain(services)
    assert all(r["state"] == "done" for r in job_rows(services))


def context(api, chat_id, text="What now?"):
    body = {"chat_id": chat_id, "speaker_id": "ayla.png", "context_tokens": 4000, "last_action": {"text": text}}
    out = expect_ok(api.post("/v1/context", json=body), 200, "context.response")
    return " ".join(b["text"] for b in out["blocks"] if b["section"] == "story_summary")


def branch(api, at="a6", chat_id="b"):
    return expect_ok(api.put(f"/v1/chats/{chat_id}", json={
        "member_ids": ["ayla.png"], "branch_of": {"chat_id": "p", "message_id": at}}), 201, "chat.response")


def upload_copies(api, upto_turn, chat_id="b", **changes):
    batch = [m for n in range(upto_turn + 1) for m in turn_messages(n, minutes=n * 7 * HOURS)]
    for m in batch:
        m.update(changes.get(m["id"], {}))
    return post(api, batch, chat_id)


def rows(services, sql, *args):
    return services.db.reader().execute(sql, args).fetchall()


def test_cp2_a_branch_queues_no_job_for_what_lies_before_m_and_holds_the_parents_summary(api, services):
    """rule CP2: registering a branch at a6 copies the parent's messages, vectors, summaries and
    sessions before it; uploading the copied messages changes nothing and queues no job; the
    branch's first context holds the parent's story summary of that stretch."""
    parent_with_jobs_done(api, services)
    before = len(job_rows(services))
    branch(api)
    out = upload_copies(api, 6)
    assert out["jobs_enqueued"] == 0 and len(job_rows(services)) == before
    assert len(job_rows(services, chat_id="b")) == 0
    parent_msgs = rows(services, "SELECT id, text, session_n, summary_id IS NOT NULL AS s FROM messages"
                                 " WHERE chat_id='p' AND position <= 13 ORDER BY position")
    branch_msgs = rows(services, "SELECT id, text, session_n, summary_id IS NOT NULL AS s FROM messages"
                                 " WHERE chat_id='b' ORDER BY position")
    assert [tuple(r) for r in branch_msgs] == [tuple(r) for r in parent_msgs]
    # The vectors are the parent's, copied.
    pairs = rows(services, "SELECT a.id, b.id FROM docs a JOIN messages ma ON CAST(ma.seq AS TEXT)=a.ref_id"
                           " JOIN messages mb ON mb.id=ma.id AND mb.chat_id='b' JOIN docs b ON b.kind='message'"
                           " AND b.ref_id=CAST(mb.seq AS TEXT) WHERE a.kind='message' AND ma.chat_id='p'")
    assert len(pairs) == 14
    for a, b in pairs:
        va = rows(services, "SELECT embedding FROM docs_vec WHERE rowid=?", a)[0][0]
        vb = rows(services, "SELECT embedding FROM docs_vec WHERE rowid=?", b)[0][0]
        assert va == vb
    m_session = rows(services, "SELECT session_n FROM messages WHERE chat_id='p' AND id='a6'")[0][0]
    parent_sessions = rows(services, "SELECT n, short FROM sessions WHERE chat_id='p' AND n <= ? ORDER BY n", m_session)
    branch_sessions = rows(services, "SELECT n, short, state FROM sessions WHERE chat_id='b' ORDER BY n")
    assert [r["n"] for r in branch_sessions] == [r["n"] for r in parent_sessions]
    # a6 ended its session (the parent's next message came hours later): all are copied whole.
    assert [r["short"] for r in branch_sessions] == [r["short"] for r in parent_sessions]
    assert {r["state"] for r in branch_sessions} == {"summarized"}
    summary = context(api, "b")
    copied = rows(services, "SELECT text FROM summaries WHERE chat_id='b' AND text IS NOT NULL")
    assert copied and all(r["text"] in rows(services, "SELECT group_concat(text, '|') FROM summaries"
                                                       " WHERE chat_id='p'")[0][0] for r in copied)
    full = rows(services, "SELECT full FROM sessions WHERE chat_id='b' AND full IS NOT NULL ORDER BY n DESC")
    assert full and full[0]["full"].split(".")[0] in summary


def test_cp2_an_edit_in_the_branch_leaves_the_parents_items(api, services):
    """rule CP2: a branch made from a swipe rewrites a6 under the same id: that is an edit of the
    branch's copy, re-derived in the branch only; the parent's message and summaries stay."""
    parent_with_jobs_done(api, services)
    branch(api)
    parent_summaries = [tuple(r) for r in rows(services, "SELECT id, text, stale FROM summaries WHERE chat_id='p'")]
    upload_copies(api, 6, a6={"text": "*Ayla shakes her head.* \"No lantern tonight, Kai.\""})
    assert rows(services, "SELECT text FROM messages WHERE chat_id='p' AND id='a6'")[0][0].startswith("*Ayla looks")
    assert rows(services, "SELECT text FROM messages WHERE chat_id='b' AND id='a6'")[0][0].startswith("*Ayla shakes")
    assert [tuple(r) for r in rows(services, "SELECT id, text, stale FROM summaries WHERE chat_id='p'")] == parent_summaries


def test_cp2_deleting_the_parent_keeps_the_branchs_memory_whole(api, services):
    """rule CP2: the branch's copies are its own: deleting the parent leaves its messages,
    summaries, sessions and search entries, and its story summary."""
    parent_with_jobs_done(api, services)
    branch(api)
    upload_copies(api, 6)
    summary = context(api, "b")
    counts = [rows(services, f"SELECT count(*) FROM {t} WHERE chat_id='b'")[0][0]
              for t in ("messages", "summaries", "sessions", "docs")]
    expect_ok(api.delete("/v1/chats/p"), 200)
    assert rows(services, "SELECT count(*) FROM messages WHERE chat_id='p'")[0][0] == 0
    assert [rows(services, f"SELECT count(*) FROM {t} WHERE chat_id='b'")[0][0]
            for t in ("messages", "summaries", "sessions", "docs")] == counts
    assert context(api, "b") == summary


def test_cp1e_a_group_converted_from_a_chat_is_a_branch_that_keeps_its_campaign(api, services):
    """rule CP1e, CP2a: registered with `branch_of` at the last message and the parent's
    `campaign_id` (as the extension registers SillyTavern's "Convert to group"), the new chat
    is in the parent's campaign and holds its copies, with no job queued."""
    parent_with_jobs_done(api, services)
    before = len(job_rows(services))
    out = expect_ok(api.put("/v1/chats/g", json={"member_ids": ["ayla.png"], "campaign_id": "p",
                                                 "branch_of": {"chat_id": "p", "message_id": "a9"}}),
                    201, "chat.response")
    assert out["chat"]["campaign_id"] == "p" and out["chat"]["branch_of"]["chat_id"] == "p"
    assert upload_copies(api, 9, chat_id="g")["jobs_enqueued"] == 0 and len(job_rows(services)) == before
    assert rows(services, "SELECT count(*) FROM messages WHERE chat_id='g'")[0][0] == \
        rows(services, "SELECT count(*) FROM messages WHERE chat_id='p'")[0][0]
    campaigns = expect_ok(api.get("/v1/campaigns"), 200, "campaigns.response")["campaigns"]
    assert [sorted(ch["id"] for ch in c["chats"]) for c in campaigns if c["id"] == "p"] == [["g", "p"]]


def test_cp2b_a_branch_without_message_id_finds_its_point_from_its_first_upload(api, services):
    """rule CP2b: registered with `branch_of: {chat_id}` only, the branch's first upload repeating
    the parent's first 14 messages makes a6 its point: the copies come with the parent's vectors
    (nothing embedded again), no job is queued, and the branch's context holds the parent's summary."""
    parent_with_jobs_done(api, services)
    before = len(job_rows(services))
    expect_ok(api.put("/v1/chats/b", json={"member_ids": ["ayla.png"], "branch_of": {"chat_id": "p"}}),
              201, "chat.response")
    encoded = services.embedder.encoded
    out = upload_copies(api, 6)
    assert out["jobs_enqueued"] == 0 and len(job_rows(services)) == before
    assert (out["inserted"], out["unchanged"]) == (0, 14)
    assert services.embedder.encoded == encoded
    chat = expect_ok(api.get("/v1/chats/b"), 200, "chat.response")["chat"]
    assert chat["branch_of"] == {"chat_id": "p", "message_id": "a6"}
    assert context(api, "b") and context(api, "b") == context(api, "b")


def test_cp2b_a_branch_made_from_a_swipe_ends_its_point_before_the_rewritten_message(api, services):
    """rule CP2b: a6 sent with other text (a swipe) is not the parent's a6: the point is u6, and a6
    is the branch's own message, embedded once."""
    parent_with_jobs_done(api, services)
    expect_ok(api.put("/v1/chats/b", json={"member_ids": ["ayla.png"], "branch_of": {"chat_id": "p"}}),
              201, "chat.response")
    encoded = services.embedder.encoded
    out = upload_copies(api, 6, a6={"text": "A different answer, swiped in."})
    assert (out["inserted"], out["unchanged"]) == (1, 13)
    assert services.embedder.encoded - encoded >= 1
    chat = expect_ok(api.get("/v1/chats/b"), 200, "chat.response")["chat"]
    assert chat["branch_of"]["message_id"] == "u6"
    texts = [r["text"] for r in rows(services, "SELECT text FROM messages WHERE chat_id='b' AND id='a6'")]
    assert texts == ["A different answer, swiped in."]


def test_cp2b_a_later_upload_never_copies(api, services):
    """rule CP2b: only an empty branch looks for its point; a branch that already holds messages
    (its first upload did not repeat the parent) copies nothing later."""
    parent_with_jobs_done(api, services)
    expect_ok(api.put("/v1/chats/b", json={"member_ids": ["ayla.png"], "branch_of": {"chat_id": "p"}}),
              201, "chat.response")
    post(api, [{"id": "x1", "role": "user", "name": "Player", "text": "Somewhere else entirely."}], "b")
    out = upload_copies(api, 2)
    assert out["inserted"] == 6
    assert expect_ok(api.get("/v1/chats/b"), 200, "chat.response")["chat"]["branch_of"]["message_id"] is None


def test_cp2c_a_chat_converted_to_a_group_is_told_once(api, services):
    """rule CP2c: after "Convert to group" (a branch at the last message, in the same campaign), the
    group's search, Story Summary and the campaign's recap meet each item once; the one-to-one chat
    comes back into view when it goes on past the branch point."""
    parent_with_jobs_done(api, services)
    expect_ok(api.put("/v1/chats/g", json={"member_ids": ["ayla.png"], "campaign_id": "p",
                                           "branch_of": {"chat_id": "p", "message_id": "a9"}}), 201, "chat.response")
    upload_copies(api, 9, chat_id="g")
    body = {"query": "lantern", "chat_id": "g", "k": 20, "kinds": ["message"]}
    found = expect_ok(api.post("/v1/search", json=body), 200, "search.response")["results"]
    assert found and {r["chat_id"] for r in found} == {"g"}
    assert len({r["id"] for r in found}) == len(found)
    parts = [b for b in expect_ok(api.post("/v1/context", json={
        "chat_id": "g", "speaker_id": "ayla.png", "context_tokens": 8000,
        "last_action": {"text": "What now?"}}), 200, "context.response")["blocks"]
        if b["section"] == "story_summary"]
    texts = " ".join(b["text"] for b in parts)
    parent_alone = context(api, "p")
    assert texts and len(texts) <= len(parent_alone) * 1.05
    recap = expect_ok(api.get("/v1/campaigns/p/recap"), 200, "campaign_recap.response")
    assert recap["parts"] and all(ref.startswith("g#") for ref in recap["parts"])
    # The one-to-one chat goes on past the branch point: a fork again, in view again.
    post(api, turn_messages(10, minutes=10 * 7 * HOURS), "p")
    found = expect_ok(api.post("/v1/search", json=body), 200, "search.response")["results"]
    assert "p" in {r["chat_id"] for r in found}
