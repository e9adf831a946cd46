"""A pytest plugin for tests/run.py: it writes the id of the test starting now to the file named by
CHRONICLER_TEST_PROGRESS, so that a run killed by a signal can say which test it was in."""

from __future__ import annotations

import os

_PATH = os.environ.get("CHRONICLER_TEST_PROGRESS")


def pytest_runtest_logstart(nodeid: str, location: tuple) -> None:
    """Record the test that is starting (the file is overwritten: only the last one matters)."""
    if _PATH:
        with open(_PATH, "w", encoding="utf-8") as fh:
            fh.write(nodeid)
