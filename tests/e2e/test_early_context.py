"""A sent message's context asked for as its generation starts (extension/src/early.js, rule OP10):
in real SillyTavern the interceptor takes the early answer, the prompt holds what the store held
when the message was sent, and the sidecar still records the turn."""

from __future__ import annotations

from contextlib import closing
from functools import partial

from server_plugin.store.db import sqlite3  # the store's own library (see test_architecture)
from tests.helpers.fakellm import FakeLLM
from tests.helpers.sidecar import Sidecar
from tests.helpers.sillytavern import STPage, configure_chronicler, wait_until

_wait_until = partial(wait_until, timeout=20.0, interval=0.2)
PINNED = "The lantern key lies under the third stone of the mill."


def _turns(sidecar: Sidecar, chat_id: str) -> int:
    with closing(sqlite3.connect(str(sidecar.data_dir / "chronicler.sqlite3"))) as conn:
        row = conn.execute("SELECT turn FROM context_turns WHERE chat_id=?", (chat_id,)).fetchone()
    return row[0] if row else 0


def test_op10_the_second_turn_takes_its_early_context_and_is_still_recorded(
        st: STPage, sidecar: Sidecar, fake: FakeLLM) -> None:
    configure_chronicler(st, sidecarUrl=sidecar.url, token=sidecar.token)
    st.select_character("Seraphina")
    chat_id = st.evaluate("() => SillyTavern.getContext().getCurrentChatId()")
    st.send("A first turn: the prompt size is not known yet.")
    st.page.wait_for_function("() => window.chronicler.features.known.earlyContext === true", timeout=20_000)
    assert st.evaluate("() => window.chronicler.early.taken") == 0
    _wait_until(lambda: _turns(sidecar, chat_id) == 1, what="the first turn recorded")
    status, body = sidecar.request("POST", "/v1/memories", {"text": PINNED, "scope": "global",
                                                            "pinned": True, "actor": "user"})
    assert status == 201, body

    before = len(fake.completions())
    st.send("Where did we leave the lantern key?")
    early = st.evaluate("() => ({asked: window.chronicler.early.asked, taken: window.chronicler.early.taken,"
                        " part: window.chronicler.stats.parts.items.at(-1)})")
    assert early["asked"] == 1 and early["taken"] == 1
    assert early["part"]["early"] is True
    prompt = str(fake.completions()[before:])
    assert PINNED in prompt  # the memory saved before the send is in the early answer
    _wait_until(lambda: _turns(sidecar, chat_id) == 2, what="the second turn recorded by the call after it")
