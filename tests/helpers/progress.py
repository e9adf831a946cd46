"""A pytest plugin for tests/run.py.

- It writes the id of the test starting now to the file named by CHRONICLER_TEST_PROGRESS, so
  that a run killed by a signal can say which test it was in.
- At the end it says in one line what the suite did (CHRONICLER_SUITE names it): how many tests
  passed, failed, were rerun or skipped, and why they were skipped; with CHRONICLER_SUITE_REPORT
  it also writes that line there, for `tests/run.py --summary` at the end of `make test`.
"""

from __future__ import annotations

import os
from collections import Counter
from typing import Any

_PATH = os.environ.get("CHRONICLER_TEST_PROGRESS")
_SUITE = os.environ.get("CHRONICLER_SUITE", "pytest")
_REPORT = os.environ.get("CHRONICLER_SUITE_REPORT")
_ORDER = ("passed", "failed", "error", "rerun", "skipped", "xfailed", "xpassed")


def pytest_runtest_logstart(nodeid: str, location: tuple) -> None:
    """Record the test that is starting (the file is overwritten: only the last one matters)."""
    if _PATH:
        with open(_PATH, "w", encoding="utf-8") as fh:
            fh.write(nodeid)


def skip_reason(report: Any) -> str:
    """A skipped test's reason, without pytest's "Skipped: " prefix."""
    longrepr = getattr(report, "longrepr", None)
    reason = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr or "")
    return reason.removeprefix("Skipped: ").strip() or "no reason given"


def suite_line(suite: str, stats: dict[str, list]) -> str:
    """'python: 1178 passed, 1 skipped (2 x SillyTavern's npm package is absent)'."""
    counts = [f"{len(stats[k])} {k}" for k in _ORDER if stats.get(k)]
    line = f"{suite}: " + (", ".join(counts) if counts else "no tests ran")
    reasons = Counter(skip_reason(r) for r in stats.get("skipped", []))
    if reasons:
        line += " (skipped: " + "; ".join(f"{n} x {why}" for why, n in reasons.most_common(3)) + ")"
    return line


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: Any) -> None:
    """Say what the suite did, in one line (and write it where tests/run.py --summary reads it)."""
    stats = {k: [r for r in v if getattr(r, "when", "call") in ("call", "setup", "teardown")]
             for k, v in terminalreporter.stats.items() if k in _ORDER}
    line = suite_line(_SUITE, stats)
    terminalreporter.write_line(line, bold=True)
    if _REPORT:
        os.makedirs(os.path.dirname(_REPORT) or ".", exist_ok=True)
        with open(_REPORT, "w", encoding="utf-8") as fh:
            fh.write(line + "\n")
