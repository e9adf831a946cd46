"""`chronicler serve` as the server plugin starts it: per-user stores over real HTTP, and a sidecar
that leaves by itself when the process that started it dies without stopping it (SIGKILL)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import requests

from tests.test_cli import first_health, free_port

TOKEN = "plugin-only-token-0123456789"


def _serve(tmp_path, port: int, *extra: str) -> list[str]:
    return [sys.executable, "-m", "server_plugin.cli", "serve", "--port", str(port), "--data-dir",
            str(tmp_path), *extra]


def _env() -> dict[str, str]:
    return {**os.environ, "CHRONICLER_TOKEN": TOKEN, "CHRONICLER_WORKER_ENABLED": "false"}


def _gone(pid: int, limit: float) -> bool:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        try:  # a zombie of ours counts as gone once it is reaped
            if os.waitpid(pid, os.WNOHANG)[0] == pid:
                return True
        except ChildProcessError:
            pass
        time.sleep(0.1)
    return False


def test_per_user_stores_over_http_and_stdin_closing_stops_it(tmp_path):
    port = free_port()
    proc = subprocess.Popen(_serve(tmp_path, port, "--per-user", "--exit-with-stdin"), env=_env(),
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        first_health(port, proc)
        url = f"http://127.0.0.1:{port}/v1"
        for user in ("alice", "bob"):
            headers = {"Authorization": f"Bearer {TOKEN}", "X-Chronicler-User": user}
            made = requests.post(f"{url}/memories", headers=headers, timeout=120, json={
                "text": f"{user} keeps the lantern.", "scope": "global", "pinned": True, "actor": "user"})
            assert made.status_code == 201, made.text
        alice = requests.get(f"{url}/memories", timeout=10, headers={
            "Authorization": f"Bearer {TOKEN}", "X-Chronicler-User": "alice"}).json()["memories"]
        assert [m["text"] for m in alice] == ["alice keeps the lantern."]
        assert (tmp_path / "users" / "bob" / "chronicler.sqlite3").is_file()
        proc.stdin.close()  # what the OS does when the plugin's process dies
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def test_the_sidecar_leaves_when_its_parent_is_killed(tmp_path):
    """A parent (standing in for SillyTavern's node process) starts the sidecar with a stdin pipe
    and is SIGKILLed: nothing runs exit(), and the sidecar still goes."""
    port = free_port()
    parent_code = textwrap.dedent(f"""
        import subprocess, sys, time
        child = subprocess.Popen({_serve(tmp_path, port, "--per-user", "--exit-with-stdin")!r},
                                 stdin=subprocess.PIPE)
        print(child.pid, flush=True)
        time.sleep(600)
    """)
    parent = subprocess.Popen([sys.executable, "-c", parent_code], env=_env(), stdout=subprocess.PIPE,
                              text=True, start_new_session=True)
    child_pid = int(parent.stdout.readline())
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                if requests.get(f"http://127.0.0.1:{port}/v1/health", timeout=1).ok:
                    break
            except requests.ConnectionError:
                time.sleep(0.1)
        parent.send_signal(signal.SIGKILL)
        parent.wait(10)
        assert _gone(child_pid, 30), "the sidecar outlived the process that started it"
    finally:
        try:
            os.kill(child_pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_sigterm_stops_it_cleanly(tmp_path):
    port = free_port()
    proc = subprocess.Popen(_serve(tmp_path, port), env=_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        first_health(port, proc)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def test_the_commands_find_the_plugins_sidecar_and_a_users_store(tmp_path):
    """What the plugin writes (DATA_DIR/sidecar.json) is enough for `import-chat --url plugin`, and
    `backup --user` copies that user's store."""
    import json

    from tests.helpers import stchat

    port = free_port()
    data = tmp_path / "data"
    proc = subprocess.Popen(_serve(data, port, "--per-user"), env=_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        first_health(port, proc)
        (data / "sidecar.json").write_text(json.dumps({"url": f"http://127.0.0.1:{port}", "port": port,
                                                       "token": TOKEN, "pid": proc.pid}))
        chat = stchat.write(tmp_path / "chat.jsonl", 6, group=False)
        env = {k: v for k, v in _env().items() if k != "CHRONICLER_TOKEN"}
        done = subprocess.run([sys.executable, "-m", "server_plugin.cli", "import-chat", str(chat), "--chat-id",
                               "c1", "--url", "plugin", "--user", "alice", "--data-dir", str(data),
                               "--no-progress", "--wait", "0"], env=env, capture_output=True, text=True,
                              timeout=300)
        assert done.returncode == 0, done.stderr
        headers = {"Authorization": f"Bearer {TOKEN}"}
        alice = requests.get(f"http://127.0.0.1:{port}/v1/chats/c1/messages", timeout=10,
                             headers={**headers, "X-Chronicler-User": "alice"})
        import re
        inserted = int(re.search(r"(\d+) new messages", done.stdout).group(1))
        assert inserted >= 4 and alice.status_code == 200 and len(alice.json()["messages"]) == inserted
        bob = requests.get(f"http://127.0.0.1:{port}/v1/chats", timeout=10,
                           headers={**headers, "X-Chronicler-User": "bob"})
        assert bob.json()["chats"] == []
        out = tmp_path / "alice.sqlite3"
        backup = subprocess.run([sys.executable, "-m", "server_plugin.cli", "backup", "--data-dir", str(data),
                                 "--user", "alice", "--out", str(out)], env=env, capture_output=True,
                                text=True, timeout=120)
        assert backup.returncode == 0, backup.stderr
        assert "1 chats" in backup.stdout and out.is_file()  # alice's store: bob has no chat
    finally:
        proc.terminate()
        proc.wait(30)
