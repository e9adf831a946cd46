"""`chronicler serve` as a real process under waitress: health at once, one sidecar per data dir."""

from __future__ import annotations

import os
import platform
import socket
import subprocess
import sys
import time

import pytest
import requests


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(data_dir, port: int, **env) -> subprocess.Popen:
    full_env = {**os.environ, "CHRONICLER_TOKEN": "", **env}
    return subprocess.Popen([sys.executable, "-m", "server_plugin.cli", "serve", "--port", str(port),
                             "--data-dir", str(data_dir)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=full_env)


def first_health(port: int, proc: subprocess.Popen, limit: float = 60.0) -> dict:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stderr.read()
        try:
            return requests.get(f"http://127.0.0.1:{port}/v1/health", timeout=1).json()
        except requests.ConnectionError:
            time.sleep(0.05)
    raise AssertionError("the sidecar never answered /v1/health")


@pytest.fixture
def sidecar(tmp_path):
    port = free_port()
    proc = start(tmp_path, port)
    yield proc, port, tmp_path
    proc.terminate()
    proc.wait(10)


def test_serve_answers_health_before_the_model_is_ready(sidecar):
    """Health does not wait for the embedding model: it loads in the background."""
    proc, port, data_dir = sidecar
    first = first_health(port, proc)
    assert first["ok"] is True and first["embedder"]["ready"] is False
    token = (data_dir / "token").read_text().strip()
    headers = {"Authorization": f"Bearer {token}"}
    # A write waits for the model instead of storing an item without its vector.
    created = requests.post(f"http://127.0.0.1:{port}/v1/memories", headers=headers, timeout=60,
                            json={"text": "Call me Captain.", "scope": "global", "pinned": True, "actor": "user"})
    assert created.status_code == 201
    assert requests.get(f"http://127.0.0.1:{port}/v1/health", timeout=5).json()["embedder"]["ready"] is True
    assert requests.get(f"http://127.0.0.1:{port}/v1/memories", headers=headers, timeout=5).json()["memories"][0][
        "text"] == "Call me Captain."
    assert requests.get(f"http://127.0.0.1:{port}/v1/memories", timeout=5).status_code == 401


def test_serve_prints_the_url_and_the_token_location(sidecar):
    proc, port, data_dir = sidecar
    first_health(port, proc)
    proc.terminate()
    out, _ = proc.communicate(timeout=10)
    assert f"http://127.0.0.1:{port}/v1" in out
    assert str(data_dir / "token") in out


def test_a_second_sidecar_on_the_same_data_dir_refuses_to_start(sidecar):
    proc, port, data_dir = sidecar
    first_health(port, proc)
    second = start(data_dir, free_port())
    out, err = second.communicate(timeout=30)
    assert second.returncode == 3
    assert "already using" in err and str(data_dir) in err


def test_bad_setting_exits_with_a_clear_message(tmp_path):
    proc = start(tmp_path, free_port(), CHRONICLER_LLM_MODE="magic")
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 2 and "llm_mode" in err


def test_every_command_imports_where_there_is_no_fcntl(tmp_path):
    """Windows has no fcntl: the CLI (serve, backup, import-chat...) must import and parse without it."""
    code = ("import sys; sys.modules['fcntl'] = None; import server_plugin.cli as cli; "
            "print(cli.build_parser().parse_args(['serve']).command)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))), timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "serve"


def test_the_windows_lock_refuses_a_second_holder(tmp_path, monkeypatch):
    """The data folder's lock through msvcrt (Windows): the first holder gets it, a second is refused
    with who holds it, and the lock file names the holder's pid."""
    import types

    from server_plugin import cli

    held: set[str] = set()
    where: list[int] = []

    def locking(fd: int, mode: int, nbytes: int) -> None:
        name = os.path.realpath(f"/proc/self/fd/{fd}")
        where.append(os.lseek(fd, 0, os.SEEK_CUR))  # msvcrt locks from the descriptor's position
        if name in held:
            raise OSError(36, "Resource deadlock avoided")
        held.add(name)

    monkeypatch.setitem(sys.modules, "msvcrt", types.SimpleNamespace(locking=locking, LK_NBLCK=2))
    original = cli._try_lock
    monkeypatch.setattr(cli, "_try_lock", lambda handle: original(handle, "nt"))
    first = cli.lock_data_dir(tmp_path)
    assert held == {os.path.realpath(tmp_path / cli.LOCK_FILE)}  # msvcrt took it, not fcntl
    try:
        with pytest.raises(cli.AlreadyRunning, match=f"pid {os.getpid()}"):
            cli.lock_data_dir(tmp_path)
        text = (tmp_path / cli.LOCK_FILE).read_text()
        assert text.strip() == f"pid {os.getpid()}"
        # Windows refuses to read a locked byte: the locked one lies far past the pid's text.
        assert where == [cli.WINDOWS_LOCK_OFFSET] * 2 and cli.WINDOWS_LOCK_OFFSET > len(text.encode())
    finally:
        first.close()


ARENAS = """
import ctypes, sys, threading
from server_plugin.cli import limit_malloc_arenas
print(limit_malloc_arenas(int(sys.argv[1])))
ready = threading.Barrier(9)
def allocate():
    kept = [bytearray(65536) for _ in range(8)]  # past pymalloc: each thread's malloc picks its arena
    ready.wait()
    ready.wait()
threads = [threading.Thread(target=allocate) for _ in range(8)]
for t in threads:
    t.start()
ready.wait()  # all eight hold their blocks: none has handed its arena back
sys.stdout.flush()
ctypes.CDLL(None).malloc_stats()  # one "Arena N:" block per arena, on stderr
ready.wait()
"""


# `serve` up to its first step past the settings: what it hands the arena limit.
SERVE_ARENAS = """
import sys
import server_plugin.cli as cli
def told(count):
    print("arenas", count)
    raise SystemExit(0)
cli.limit_malloc_arenas = told
cli.main(["serve", "--data-dir", sys.argv[1]])
"""


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's malloc only")
def test_op10_serve_keeps_its_malloc_arenas_to_the_setting(tmp_path):
    """`serve` limits malloc by the setting `malloc_arenas` before anything else starts. With 2,
    eight threads that allocate at once share two arenas; with 0 (glibc's own limit) they take
    more: the limit is what keeps a search's temporaries from being held once per request thread."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for env, said in (({}, "arenas 2"), ({"CHRONICLER_MALLOC_ARENAS": "3"}, "arenas 3")):
        done = subprocess.run([sys.executable, "-c", SERVE_ARENAS, str(tmp_path)], capture_output=True,
                              text=True, cwd=root, timeout=60, env={**os.environ, **env})
        assert done.returncode == 0 and done.stdout.strip() == said, (done.stdout, done.stderr[-2000:])
    arenas = {}
    for count in (2, 0):
        done = subprocess.run([sys.executable, "-c", ARENAS, str(count)], capture_output=True, text=True,
                              cwd=root, timeout=60)
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == str(count > 0)
        arenas[count] = done.stderr.count("Arena ")
    assert arenas[2] == 2 and arenas[0] > 2, arenas
