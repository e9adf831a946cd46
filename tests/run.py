"""Run pytest; if the process is killed by a signal (a crash such as SIGBUS or SIGSEGV in native
code, not a failing test), say which test it was in, and run the same tests once more.

A failing test is never rerun here (tests/e2e reruns its own with --reruns); a second crash fails.
Why: one SIGBUS in a CI run, in a suite that passed on the same code before and after, ended the
run with no trace of the test it hit. Usage: python tests/run.py <pytest arguments>
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _signal_name(returncode: int) -> str:
    try:
        return signal.Signals(-returncode).name
    except ValueError:
        return f"signal {-returncode}"


def run_once(args: list[str], progress: Path) -> int:
    """One pytest run in a child process; its return code (negative: killed by that signal)."""
    env = {**os.environ, "CHRONICLER_TEST_PROGRESS": str(progress)}
    command = [sys.executable, "-m", "pytest", "-p", "tests.helpers.progress", *args]
    return subprocess.call(command, cwd=ROOT, env=env)


def main(args: list[str]) -> int:
    """Run the tests; once more after a crash; the last run's return code."""
    with tempfile.TemporaryDirectory(prefix="chronicler-tests-") as scratch:
        progress = Path(scratch) / "current-test"
        code = run_once(args, progress)
        if code >= 0:
            return code
        where = progress.read_text(encoding="utf-8") if progress.exists() else "(before the first test)"
        print(f"\ntests/run.py: pytest was killed by {_signal_name(code)} while running {where}; "
              "running the same tests once more (a second crash fails the run).", flush=True)
        code = run_once(args, progress)
        if code < 0:
            where = progress.read_text(encoding="utf-8") if progress.exists() else "(before the first test)"
            print(f"\ntests/run.py: killed again by {_signal_name(code)} while running {where}.", flush=True)
            return 128 - code
        print(f"\ntests/run.py: the second run ended with code {code} (the first was killed by a signal).")
        return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
