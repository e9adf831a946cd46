"""Two browser tabs on the same chat, both sending, through the plugin route.

Each tab holds its own copy of the chat and SillyTavern saves whichever tab saved last (its integrity
check passes: both tabs loaded the same chat). Once both tabs settle, the sidecar's copy of the chat
must be the chat SillyTavern saved: the same messages, in the same order, with the same texts, and
no message twice (a message the other tab's save dropped must not linger in the sidecar's copy).
"""

from __future__ import annotations

import json
import time
import urllib.parse
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.plugin_st import PluginST, keep, open_page
from tests.helpers.sillytavern import STPage, configure_chronicler, wait_until


def _saved(path: Path) -> list[tuple[str, str]]:
    """(our id, text) of every message in SillyTavern's chat file, in order."""
    lines = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return [((m.get("extra") or {}).get("chronicler_id", ""), m["mes"]) for m in lines[1:]]


def _sidecar_copy(st: PluginST, chat_id: str) -> list[tuple[str, str]]:
    """(id, text) of every message the sidecar holds of the chat, in order."""
    body = st.direct("GET", f"/v1/chats/{urllib.parse.quote(chat_id, safe='')}/messages?limit=1000")
    return [(m["id"], m["text"]) for m in body["messages"]]


def _settled(pages: list[STPage]) -> None:
    """Both tabs idle, with no reply pending."""
    for page in pages:
        page.wait_idle(60_000)


def test_two_tabs_on_the_same_chat_both_sending_leave_the_sidecar_with_the_saved_chat(
        plugin_st: PluginST, browser: Any, request: pytest.FixtureRequest) -> None:
    st = plugin_st
    st.running()
    context, first, seen = open_page(browser, st, request.node.name)
    second = STPage(context.new_page(), st.url, first.artifacts)
    pages = [first, second]
    try:
        first.open()
        configure_chronicler(first, contextTimeoutMs=20000)
        first.select_character("Seraphina")
        first.flush_chat()
        chat_id = first.evaluate("() => SillyTavern.getContext().getCurrentChatId()")
        second.open()
        second.select_character("Seraphina")  # opens the character's latest chat: the same one
        assert second.evaluate("() => SillyTavern.getContext().getCurrentChatId()") == chat_id
        # Both send at once, then each once more: each tab's chat misses the other's messages.
        before = [page.submit(f"Tab {n} speaks first.") for n, page in enumerate(pages, 1)]
        for page, length in zip(pages, before):
            page.page.wait_for_function("n => SillyTavern.getContext().chat.length >= n + 2", arg=length,
                                        timeout=60_000)
        _settled(pages)
        for n, page in enumerate(pages, 1):
            page.send(f"Tab {n} speaks again.", timeout_ms=60_000)
        _settled(pages)
        path = first.chat_file(st.root)
        # SillyTavern's last save lands after the reply is on screen: wait until the file stops changing.
        wait_until(lambda: _stable(path), 30.0, "the chat file saved", 0.2)
        saved = _saved(path)
        assert [text for _, text in saved].count("Tab 2 speaks again.") == 1, saved
        assert all(ident for ident, _ in saved), f"a saved message without our id: {saved}"
        try:
            wait_until(lambda: _sidecar_copy(st, chat_id) == saved, 30.0, "the sidecar's copy = the saved chat", 0.5)
        except AssertionError:
            copy = _sidecar_copy(st, chat_id)
            raise AssertionError(f"the sidecar's copy differs from the saved chat:\nsaved:   {saved}\nsidecar: {copy}")
        copy = _sidecar_copy(st, chat_id)
        assert len({ident for ident, _ in copy}) == len(copy) and len({text for _, text in copy}) == len(copy), copy
    finally:
        keep(first, seen)
        context.close()


_sizes: dict[Path, tuple[tuple[int, float], float]] = {}


def _stable(path: Path) -> bool:
    """True once the file's size and mtime are unchanged for 2 s (SillyTavern's save is done)."""
    now = time.monotonic()
    stat = path.stat()
    key = (stat.st_size, stat.st_mtime)
    last = _sizes.get(path)
    if last is None or last[0] != key:
        _sizes[path] = (key, now)
        return False
    return now - last[1] >= 2.0
