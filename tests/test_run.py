"""tests/run.py, the runner `make test` uses: a suite's one-line report (what passed, what was
skipped and why), the summary at the end, and one more run after a crash by a signal."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

DEMO = '''
import os, signal, pytest

def test_passes():
    assert True

def test_skipped():
    pytest.skip("Chromium is not installed here")

def test_crashes_once(tmp_path_factory):
    mark = os.environ["DEMO_MARK"]
    if not os.path.exists(mark):
        open(mark, "w").close()
        os.kill(os.getpid(), signal.SIGBUS)
'''


def run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    (tmp_path / "pytest.ini").write_text("[pytest]\n", encoding="utf-8")
    env = {**os.environ, "CHRONICLER_SUITES_DIR": str(tmp_path / "suites"), "DEMO_MARK": str(tmp_path / "mark")}
    return subprocess.run([sys.executable, str(ROOT / "tests" / "run.py"), *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)


def test_a_suite_says_what_it_ran_and_why_it_skipped_and_a_crash_is_run_once_more(tmp_path):
    demo = tmp_path / "test_demo.py"
    demo.write_text(DEMO, encoding="utf-8")
    out = run(tmp_path, "--suite", "demo", "-q", "-c", str(tmp_path / "pytest.ini"), "-p", "no:cacheprovider",
              "--rootdir", str(tmp_path), str(demo))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "pytest was killed by SIGBUS while running" in out.stdout and "test_crashes_once" in out.stdout
    line = "demo: 2 passed, 1 skipped (skipped: 1 x Chromium is not installed here)"
    assert line in out.stdout
    assert (tmp_path / "suites" / "demo.txt").read_text(encoding="utf-8").strip() == line
    summary = run(tmp_path, "--summary")
    assert summary.returncode == 0 and f"  {line}" in summary.stdout
    assert not list((tmp_path / "suites").glob("*.txt"))  # forgotten: the next `make test` starts afresh


def test_the_summary_says_when_no_suite_reported(tmp_path):
    out = run(tmp_path, "--summary")
    assert out.returncode == 0 and "no suite reported" in out.stdout
