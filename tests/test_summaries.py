"""Rolling summaries (rule RV3): compaction after a turn, 4→1 merges at each tier, a person's edits
carried through merges, rebuild, the unsummarised count, stale summaries after edits and deletes,
and rollback of a regenerated turn (RV10). Jobs run extractively here (no model)."""

from __future__ import annotations

import pytest

from tests.helpers.api import expect_error, expect_ok
from tests.helpers.conversation import drain, job_rows, post, setup_chat, summaries, turn_messages, turns

# A window of 4 messages and chunks of 2: each turn (2 messages) after the second makes one chunk.
SMALL = {"live_window_max_messages": 4, "summary_chunk_messages": 2,
         "deep_memory_min_new_messages": 10_000}


@pytest.fixture
def overrides():
    return dict(SMALL)


def ids(items):
    return [s["id"] for s in items]


def one(api, summary_id):
    return expect_ok(api.get(f"/v1/summaries/{summary_id}"), 200, "summary.response")["summary"]


def leaves(api, summary):
    """The message ids a summary covers, through its children."""
    if summary["tier"] == "recent":
        return summary["covers"]
    return [m for child in summary["covers"] for m in leaves(api, one(api, child))]


def test_rv3_messages_leaving_the_window_are_chunked_after_a_turn(api, services):
    """rule RV3: after a turn, what left the live window is summarised in chunks (whole chunks only)."""
    setup_chat(api)
    turns(api, 0, 2)
    assert job_rows(services) == []  # 4 messages: all live
    out = post(api, turn_messages(2))
    assert out["jobs_enqueued"] == 1
    post(api, [{"id": "u3", "role": "user", "text": "A user message alone is not a turn."}])
    assert len(job_rows(services, kind="chunk_summary")) == 1
    drain(services)
    listed = summaries(api)
    assert [s["covers"] for s in listed["recent"]] == [["u0", "a0"]]
    assert listed["recent"][0]["text"] and listed["recent"][0]["edited"] is False


def test_rv3_four_recent_merge_into_one_consolidated(api, services):
    """rule RV3: 4 recent summaries → 1 consolidated; the merged ones leave the recent tier."""
    setup_chat(api)
    turns(api, 0, 5)
    drain(services)
    first = summaries(api)
    assert (len(first["recent"]), len(first["consolidated"])) == (3, 0)
    turns(api, 5, 6)
    drain(services)
    listed = summaries(api)
    assert (len(listed["recent"]), len(listed["consolidated"]), len(listed["long_term"])) == (0, 1, 0)
    consolidated = listed["consolidated"][0]
    assert consolidated["covers"][:3] == ids(first["recent"])
    assert leaves(api, consolidated) == ["u0", "a0", "u1", "a1", "u2", "a2", "u3", "a3"]
    assert all(one(api, c)["parent_id"] == consolidated["id"] for c in consolidated["covers"])


def test_rv3_four_consolidated_merge_into_one_long_term(api, services):
    """rule RV3: 4 consolidated → 1 long-term, covering 16 chunks in order."""
    setup_chat(api)
    turns(api, 0, 17)
    drain(services)
    before = summaries(api)
    assert (len(before["recent"]), len(before["consolidated"]), len(before["long_term"])) == (3, 3, 0)
    turns(api, 17, 19)
    drain(services)
    listed = summaries(api)
    assert (len(listed["recent"]), len(listed["consolidated"]), len(listed["long_term"])) == (1, 0, 1)
    long_term = listed["long_term"][0]
    assert [one(api, c)["tier"] for c in long_term["covers"]] == ["consolidated"] * 4
    assert leaves(api, long_term) == [f"{r}{n}" for n in range(16) for r in "ua"]
    assert listed["recent"][0]["covers"] == ["u16", "a16"]


def test_rv3_unsummarized_count(api, services):
    """rule RV3: the panel's count of messages not yet in a finished summary."""
    setup_chat(api)
    turns(api, 0, 5)
    assert summaries(api)["unsummarized_count"] == 10  # chunks queued, not yet written
    assert summaries(api)["pending_count"] == 3
    drain(services)
    assert summaries(api)["unsummarized_count"] == 4  # the live window
    post(api, [{"id": "x1", "role": "user", "text": "Hello?"}])
    assert summaries(api)["unsummarized_count"] == 5


def test_rv3_an_edit_is_what_the_merge_reads_and_is_kept_through_later_merges(api, services):
    """rule RV3: a person's edit of a summary is carried into the merge above it, and the merged
    tiers above that (the merge reads the current, edited texts)."""
    setup_chat(api)
    turns(api, 0, 5)
    drain(services)
    first = summaries(api)["recent"][0]
    edited = expect_ok(api.patch(f"/v1/summaries/{first['id']}",
                                 json={"text": "Ayla swore an oath to the Silver Order at dawn.",
                                       "version": first["version"]}), 200, "summary.response")["summary"]
    assert edited["edited"] is True
    turns(api, 5, 6)
    drain(services)
    consolidated = summaries(api)["consolidated"][0]
    assert "Silver Order" in consolidated["text"]
    expect_ok(api.patch(f"/v1/summaries/{consolidated['id']}",
                        json={"text": "The council of Vessa fell in the spring storm."}), 200)
    turns(api, 6, 18)
    drain(services)
    long_term = summaries(api)["long_term"][0]
    assert "council of Vessa" in long_term["text"]
    # the person's texts stand: no job overwrote them
    assert one(api, first["id"])["text"] == "Ayla swore an oath to the Silver Order at dawn."


def test_rv3_edit_needs_the_current_version(api, services):
    setup_chat(api)
    turns(api, 0, 3)
    drain(services)
    summary = summaries(api)["recent"][0]
    expect_error(api.patch(f"/v1/summaries/{summary['id']}", json={"text": "x", "version": 99}),
                 409, "version_conflict")
    expect_error(api.patch("/v1/summaries/s_missing", json={"text": "x"}), 404, "summary_not_found")


def test_rv3_rebuild_drops_and_derives_again(api, services):
    """rule RV3: rebuild throws the summaries (edits included) away and re-derives them from the
    transcript, through jobs."""
    setup_chat(api)
    turns(api, 0, 8)
    drain(services)
    before = summaries(api)
    covered = leaves(api, before["consolidated"][0])
    victim = before["recent"][0]
    api.patch(f"/v1/summaries/{victim['id']}", json={"text": "A person's version of events."})
    out = expect_ok(api.post("/v1/chats/c1/summaries/rebuild", json={}), 200, "summaries_rebuild.response")
    assert out["dropped"] == 7 and out["jobs_enqueued"] == 6  # 6 chunks and their merge dropped
    assert summaries(api)["unsummarized_count"] == 16
    drain(services)
    after = summaries(api)
    assert (len(after["recent"]), len(after["consolidated"])) == (2, 1)
    assert leaves(api, after["consolidated"][0]) == covered
    assert all("A person's version" not in s["text"] for s in after["recent"] + after["consolidated"])
    assert not any(s["edited"] for s in after["recent"] + after["consolidated"])


def test_rv3_message_edit_marks_its_summaries_stale_and_resummarises(api, services):
    """An edited message makes the summary covering it stale; the chunk is summarised again and
    the merge above it redone."""
    setup_chat(api)
    turns(api, 0, 6)
    drain(services)
    consolidated = summaries(api)["consolidated"][0]
    chunk = one(api, consolidated["covers"][0])
    out = post(api, turn_messages(0, reply="*Ayla draws a map of the Drowned Quarter.* \"Here.\"")[1:])
    assert out["edited"] == 1 and out["jobs_enqueued"] == 1
    assert one(api, chunk["id"])["stale"] is True
    drain(services)
    refreshed = one(api, chunk["id"])
    assert refreshed["stale"] is False and "Drowned Quarter" in refreshed["text"]
    merged = one(api, consolidated["id"])
    assert merged["version"] > consolidated["version"] and merged["stale"] is False
    assert "Drowned Quarter" in merged["text"]


def test_rv3_an_edited_summary_is_only_flagged_stale(api, services):
    """A person's edited summary is never rewritten by a job: a message edit only flags it stale."""
    setup_chat(api)
    turns(api, 0, 3)
    drain(services)
    summary = summaries(api)["recent"][0]
    api.patch(f"/v1/summaries/{summary['id']}", json={"text": "Mine."})
    out = post(api, turn_messages(0, reply="Something else entirely.")[1:])
    assert out["jobs_enqueued"] == 0
    drain(services)
    assert (one(api, summary["id"])["text"], one(api, summary["id"])["stale"]) == ("Mine.", True)


def test_rv3_deleting_messages_shrinks_then_removes_their_summary(api, services):
    """A delete removes what was derived only from the message: a chunk losing all its messages goes,
    and the merge above it is redone without it."""
    setup_chat(api)
    turns(api, 0, 6)
    drain(services)
    consolidated = summaries(api)["consolidated"][0]
    chunk_id = consolidated["covers"][0]
    out = expect_ok(api.delete("/v1/chats/c1/messages/u0"), 200, "message_deleted.response")
    assert out["removed"]["summaries"] == 0
    assert one(api, chunk_id)["covers"] == ["a0"] and one(api, chunk_id)["stale"] is True
    out = expect_ok(api.delete("/v1/chats/c1/messages/a0"), 200)
    assert out["removed"]["summaries"] == 1
    expect_error(api.get(f"/v1/summaries/{chunk_id}"), 404, "summary_not_found")
    assert one(api, consolidated["id"])["covers"] == consolidated["covers"][1:]
    drain(services)
    assert one(api, consolidated["id"])["stale"] is False


def test_rv10_rollback_of_a_regenerated_turn_removes_its_jobs_before_they_run(api, services):
    """rule RV10: a swipe/regenerate rolls back the turn's queued jobs and the summaries its
    compaction created; the messages are summarised again after the new reply."""
    setup_chat(api)
    turns(api, 0, 5)
    drain(services)
    turns(api, 5, 6)  # t5 compacts chunk 4
    assert [r["turn_id"] for r in job_rows(services, state="pending")] == ["t5"]
    out = expect_ok(api.post("/v1/chats/c1/turns/t5/rollback", json={}), 200, "turn_rollback.response")
    assert out["removed"]["jobs"] == 1 and out["removed"]["summaries"] == 1
    assert job_rows(services, state="pending") == []
    assert summaries(api)["unsummarized_count"] == 6
    post(api, turn_messages(5, reply="*Ayla turns away.* \"Not tonight.\"", turn_id="t5b"))
    drain(services)
    listed = summaries(api)
    assert len(listed["consolidated"]) == 1 and leaves(api, listed["consolidated"][0])[-2:] == ["u3", "a3"]


def test_rv10_rollback_removes_what_the_turns_jobs_wrote(api, services):
    """rule RV10: after its jobs ran, rolling the turn back removes the chunk summary and the merge
    it set off; the earlier summaries are unmerged, then merged again after the next turn."""
    setup_chat(api)
    turns(api, 0, 5)
    drain(services)
    earlier = ids(summaries(api)["recent"])
    turns(api, 5, 6)
    drain(services)
    assert len(summaries(api)["consolidated"]) == 1
    out = expect_ok(api.post("/v1/chats/c1/turns/t5/rollback", json={}), 200)
    assert out["removed"]["summaries"] == 2 and out["removed"]["jobs"] == 2
    listed = summaries(api)
    assert ids(listed["recent"]) == earlier and listed["consolidated"] == []
    post(api, turn_messages(5, turn_id="t5b"))
    drain(services)
    assert len(summaries(api)["consolidated"]) == 1


def test_summaries_of_an_unknown_chat(api):
    expect_error(api.get("/v1/chats/nope/summaries"), 404, "chat_not_found")
    expect_error(api.post("/v1/chats/nope/summaries/rebuild", json={}), 404, "chat_not_found")
