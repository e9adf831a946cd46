"""Run pytest; if the process is killed by a signal (a crash such as SIGBUS or SIGSEGV in native
code, not a failing test), say which test it was in, and run the same tests once more.

A failing test is never rerun here (tests/e2e reruns its own with --reruns); a second crash fails.
Why: one SIGBUS in a CI run, in a suite that passed on the same code before and after, ended the
run with no trace of the test it hit. Usage: python tests/run.py [--suite NAME] <pytest arguments>

`--suite NAME` names the suite in the one line it ends with (tests/helpers/progress.py) and keeps
that line in test-artifacts/suites/; `python tests/run.py --summary` prints every kept line (what
ran, what was skipped and why) and forgets them: the end of `make test`.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SUITES = Path(os.environ.get("CHRONICLER_SUITES_DIR") or ROOT / "test-artifacts" / "suites")


def _signal_name(returncode: int) -> str:
    try:
        return signal.Signals(-returncode).name
    except ValueError:
        return f"signal {-returncode}"


def run_once(args: list[str], progress: Path, suite: str | None = None) -> int:
    """One pytest run in a child process; its return code (negative: killed by that signal)."""
    env = {**os.environ, "CHRONICLER_TEST_PROGRESS": str(progress)}
    if suite:
        env.update(CHRONICLER_SUITE=suite, CHRONICLER_SUITE_REPORT=str(SUITES / f"{suite}.txt"))
    command = [sys.executable, "-m", "pytest", "-p", "tests.helpers.progress", *args]
    return subprocess.call(command, cwd=ROOT, env=env)


def summary(folder: Path = SUITES) -> int:
    """Print what each suite of this `make test` did (the lines kept by --suite), then forget them."""
    reports = sorted(folder.glob("*.txt")) if folder.is_dir() else []
    print("\nChronicler's test suites:")
    for line in [p.read_text(encoding="utf-8").strip() for p in reports] or [
            "(no suite reported: run them through tests/run.py --suite NAME)"]:
        print(f"  {line}")
    for p in reports:
        p.unlink()
    return 0


def main(args: list[str]) -> int:
    """Run the tests; once more after a crash; the last run's return code."""
    if args[:1] == ["--summary"]:
        return summary()
    suite = None
    if args[:1] == ["--suite"] and len(args) > 1:
        suite, args = args[1], args[2:]
    with tempfile.TemporaryDirectory(prefix="chronicler-tests-") as scratch:
        progress = Path(scratch) / "current-test"
        code = run_once(args, progress, suite)
        if code >= 0:
            return code
        where = progress.read_text(encoding="utf-8") if progress.exists() else "(before the first test)"
        print(f"\ntests/run.py: pytest was killed by {_signal_name(code)} while running {where}; "
              "running the same tests once more (a second crash fails the run).", flush=True)
        code = run_once(args, progress, suite)
        if code < 0:
            where = progress.read_text(encoding="utf-8") if progress.exists() else "(before the first test)"
            print(f"\ntests/run.py: killed again by {_signal_name(code)} while running {where}.", flush=True)
            return 128 - code
        print(f"\ntests/run.py: the second run ended with code {code} (the first was killed by a signal).")
        return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
