"""`chronicler import-chat` (rule OP8): a SillyTavern chat file fed through the normal pipeline,
resumable after a kill, offline on the data folder or into a running sidecar."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

from server_plugin.store.db import sqlite3  # the store's own SQLite library (see test_architecture)
from server_plugin.cli import lock_data_dir, main
from server_plugin.sillytavern import chat_file as backfill
from tests.helpers import stchat
from tests.helpers.ledger import open_db, store_problems
from tests.helpers.process import SidecarProcess

CHAT_ID = "Ayla - 2026-11-29@16h52m03s"


# --- reading the file --------------------------------------------------------------------------
def test_send_date_in_its_three_forms():
    """ISO 8601, epoch milliseconds, and SillyTavern's human form (the local time it was read in)."""
    assert backfill.parse_send_date("2026-11-29T16:52:03.250Z") == "2026-11-29T16:52:03.250000Z"
    ms = int(datetime(2026, 12, 2, 16, 52, 3, 250000, tzinfo=timezone.utc).timestamp() * 1000)
    assert backfill.parse_send_date(ms) == "2026-12-02T16:52:03.250000Z"
    assert backfill.parse_send_date(str(ms)) == "2026-12-02T16:52:03.250000Z"
    local = datetime(2026, 11, 29, 16, 52).astimezone().astimezone(timezone.utc)
    assert backfill.parse_send_date("November 29, 2026 4:52pm") == local.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    assert backfill.parse_send_date("November 29, 2026 12:05am").startswith(
        datetime(2026, 11, 29, 0, 5).astimezone().astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M"))
    for unreadable in ("", None, "yesterday", True, "Smarch 40, 2026 4:52pm"):
        assert backfill.parse_send_date(unreadable) is None


def test_plan_keeps_what_the_extension_would_send(tmp_path):
    """Hidden messages skipped, only the chosen swipe, the extension's ids kept and the others
    derived stably, group speakers from original_avatar, a narrator line as a system message."""
    path = stchat.write(tmp_path / "chat.jsonl", 120)
    meta, lines = stchat.messages(120)
    chat = backfill.read_chat_file(path)
    plan = backfill.plan(chat, CHAT_ID)
    hidden = sum(1 for m in lines if m["is_system"])
    assert plan.skipped_hidden == hidden > 0
    assert len(plan.records) == 120 - hidden
    texts = {r["text"] for r in plan.records}
    assert all(m["mes"] in texts for m in lines if not m["is_system"])
    assert not any(s in texts for m in lines if len(m.get("swipes", [])) > 1 for s in m["swipes"][1:]
                   if s != m["mes"] and s not in {x["mes"] for x in lines})
    assert plan.records[0]["id"] == "m-0000-ext"
    derived = [r["id"] for r in plan.records if not r["id"].endswith("-ext")]
    assert derived and all(i.startswith("st") for i in derived) and len(set(derived)) == len(derived)
    assert [r["id"] for r in backfill.plan(backfill.read_chat_file(path), CHAT_ID).records] == \
        [r["id"] for r in plan.records]  # stable across runs
    speakers = {r["speaker_id"] for r in plan.records if r["role"] == "assistant"}
    assert speakers == {a for _, a in stchat.CAST} == set(plan.members)
    assert [r["role"] for r in plan.records if r["name"] == "System"] == ["system"]
    assert plan.guessed == {}
    assert [r["index"] for r in plan.records] == sorted(r["index"] for r in plan.records)


def test_a_solo_chat_takes_the_character_id_given(tmp_path):
    path = stchat.write(tmp_path / "solo.jsonl", 20, group=False)
    plan = backfill.plan(backfill.read_chat_file(path), "solo", ["seraphina_v2.png"], user_id="kai.png")
    assert {r["speaker_id"] for r in plan.records if r["role"] == "assistant"} == {"seraphina_v2.png"}
    assert {r["speaker_id"] for r in plan.records if r["role"] == "user"} == {"kai.png"}
    assert plan.characters["kai.png"]["is_player"] is True
    guessed = backfill.plan(backfill.read_chat_file(path), "solo")
    assert guessed.guessed == {"Ayla": "Ayla.png"}


def test_a_file_that_is_not_a_chat_is_refused_with_its_line(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"user_name": "Kai"}\n{"mes": "hi"\n', encoding="utf-8")
    with pytest.raises(backfill.ChatFileError, match=r"bad.jsonl:2"):
        backfill.read_chat_file(bad)
    assert main(["import-chat", str(bad), "--chat-id", "x", "--data-dir", str(tmp_path / "d"),
                 "--no-progress"]) == 1


# --- the final state ---------------------------------------------------------------------------
def state(db_path: Path, chat_id: str) -> dict[str, Any]:
    """What an import produced, without what depends on the wall clock or random ids."""
    conn = open_db(db_path)
    try:
        def rows(sql: str, *args: Any) -> list[tuple]:
            return [tuple(r) for r in conn.execute(sql, args)]

        summary_order = {sid: n for n, (sid,) in enumerate(rows(
            "SELECT id FROM summaries WHERE chat_id=? ORDER BY tier, pos_position, pos_seq", chat_id))}
        return {
            "messages": rows("SELECT id, role, name, text, sent_at, speaker_id, position, tokens, "
                             "session_n FROM messages WHERE chat_id=? ORDER BY position", chat_id),
            "summarised": rows("SELECT count(*) FROM messages WHERE chat_id=? AND summary_id IS NOT NULL", chat_id),
            # covers of a higher tier name child summaries (random ids): by their place instead
            "summaries": [(tier, text, quotes, [summary_order.get(c, c) for c in json.loads(covers)], stale)
                          for tier, text, quotes, covers, stale in rows(
                              "SELECT tier, text, quotes, covers, stale FROM summaries WHERE chat_id=?"
                              " ORDER BY tier, pos_position, pos_seq", chat_id)],
            "summary_parents": sorted(summary_order.get(p) or -1 for (p,) in rows(
                "SELECT parent_id FROM summaries WHERE chat_id=?", chat_id)),
            "sessions": rows("SELECT n, state, started_at, last_at, ended_at, end_reason, full, short,"
                             " quotes FROM sessions WHERE chat_id=? ORDER BY n", chat_id),
            "memories": sorted(rows("SELECT text, scope, character_id, pinned, archived, actor, "
                                    "source_message_ids FROM memories")),
            "notes": sorted(rows("SELECT text, status, priority, source, session_n FROM notes")),
            "characters": rows("SELECT id, name, is_player FROM characters ORDER BY id"),
            "members": rows("SELECT character_id, position FROM chat_members WHERE chat_id=? "
                            "ORDER BY position", chat_id),
            "jobs": sorted(rows("SELECT kind, state, count(*) FROM jobs GROUP BY kind, state")),
            "docs": rows("SELECT kind, count(*) FROM docs GROUP BY kind ORDER BY kind"),
        }
    finally:
        conn.close()


def _run_cli(data_dir: Path, path: Path, *extra: str) -> subprocess.Popen:
    env = {**os.environ, "CHRONICLER_TOKEN": "", "HF_HUB_OFFLINE": "1", "OPENBLAS_NUM_THREADS": "1",
           "CHRONICLER_SQLITE_SYNCHRONOUS": "NORMAL"}
    return subprocess.Popen([sys.executable, "-m", "server_plugin.cli", "import-chat", str(path),
                             "--chat-id", CHAT_ID, "--data-dir", str(data_dir), "--batch-size", "20",
                             "--no-progress", *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def _stored(db_path: Path) -> int:
    if not db_path.exists():
        return 0
    try:
        conn = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True, timeout=1)
        try:
            return conn.execute("SELECT count(*) FROM messages").fetchone()[0]
        finally:
            conn.close()
    except sqlite3.Error:
        return 0


COUNT = 260  # > 50 live + chunks of 8: compaction, summaries, deep memory; two sessions


@pytest.fixture(scope="module")
def chat_file(tmp_path_factory) -> Path:
    return stchat.write(tmp_path_factory.mktemp("st") / "chat.jsonl", COUNT, session_every=130)


@pytest.fixture(scope="module")
def uninterrupted(chat_file, tmp_path_factory) -> tuple[Path, dict[str, Any]]:
    data = tmp_path_factory.mktemp("whole")
    proc = _run_cli(data, chat_file)
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err
    return data, state(data / "chronicler.sqlite3", CHAT_ID)


def test_offline_import_runs_the_whole_pipeline(uninterrupted, chat_file):
    """Sessions by gap, summaries of every tier reached, deep memory, nothing left pending; the
    store passes every check; hidden messages are not there."""
    data, final = uninterrupted
    plan = backfill.plan(backfill.read_chat_file(chat_file), CHAT_ID)
    assert [m[0] for m in final["messages"]] == [r["id"] for r in plan.records]
    assert len(final["sessions"]) == 2 and final["sessions"][0][1] in ("ended", "summarized")
    assert {s[0] for s in final["summaries"]} >= {"recent", "consolidated"}
    assert final["summarised"][0][0] > 0
    assert not [j for j in final["jobs"] if j[1] in ("pending", "running")], final["jobs"]
    assert final["members"] == [(a, i) for i, a in enumerate(
        dict.fromkeys(r["speaker_id"] for r in plan.records if r["role"] == "assistant"))]
    assert store_problems(data / "chronicler.sqlite3") == []


def test_a_rerun_stores_nothing_new(uninterrupted, chat_file, capsys):
    data, final = uninterrupted
    assert main(["import-chat", str(chat_file), "--chat-id", CHAT_ID, "--data-dir", str(data),
                 "--batch-size", "20", "--no-progress"]) == 0
    assert "0 new messages" in capsys.readouterr().out
    assert state(data / "chronicler.sqlite3", CHAT_ID) == final


def test_killed_mid_way_and_resumed_ends_as_an_uninterrupted_run(uninterrupted, chat_file, tmp_path):
    """SIGKILL while importing (batches stored, jobs queued or running), then a rerun: the final
    state equals the uninterrupted run's."""
    _, expected = uninterrupted
    data = tmp_path / "killed"
    db_path = data / "chronicler.sqlite3"
    proc = _run_cli(data, chat_file)
    deadline = time.monotonic() + 300
    while _stored(db_path) < 100 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert proc.poll() is None, "the import finished before it could be killed"
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    stored = _stored(db_path)
    assert 100 <= stored < COUNT - 20
    assert store_problems(db_path) == []
    proc = _run_cli(data, chat_file)
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err
    assert f"{stored} were already stored" in out
    assert state(db_path, CHAT_ID) == expected


def test_offline_import_refuses_a_store_a_sidecar_holds(chat_file, tmp_path, capsys):
    lock = lock_data_dir(tmp_path)
    try:
        assert main(["import-chat", str(chat_file), "--chat-id", CHAT_ID, "--data-dir", str(tmp_path),
                     "--no-progress"]) == 3
        assert "--url" in capsys.readouterr().err
    finally:
        lock.close()


def test_online_import_into_a_running_sidecar(tmp_path, capsys):
    """--url/--token: the same records through the HTTP API; the sidecar's worker drains the jobs;
    a second run sends nothing."""
    path = stchat.write(tmp_path / "chat.jsonl", 90, seed=3)
    side = SidecarProcess.create(tmp_path / "data")
    side.start()
    try:
        side.wait_ready()
        argv = ["import-chat", str(path), "--chat-id", CHAT_ID, "--url", side.url, "--token", side.token,
                "--batch-size", "25", "--no-progress", "--wait", "120"]
        assert main(argv) == 0
        out = capsys.readouterr().out
        plan = backfill.plan(backfill.read_chat_file(path), CHAT_ID)
        assert f"{len(plan.records)} new messages" in out and "0 left" in out
        assert main(argv) == 0
        assert "0 new messages" in capsys.readouterr().out
        status, listed = side.request(
            "GET", f"/v1/chats/{backfill.HttpSink._q(CHAT_ID)}/messages?ids_only=true")
        assert status == 200 and listed["ids"] == [r["id"] for r in plan.records]
    finally:
        side.stop()
