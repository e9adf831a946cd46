"""What the campaign and branch end-to-end tests share: reading a chat's state in the sidecar,
and a one-to-one chat with Seraphina whose first session is ended and summarised."""

from __future__ import annotations

from functools import partial

from tests.helpers.sidecar import Sidecar
from tests.helpers.sillytavern import STPage, configure_chronicler, quote_id, wait_until

wait_long = partial(wait_until, timeout=60.0, interval=0.25)


def chat_jobs(sidecar: Sidecar, chat_id: str) -> list[dict]:
    """The chat's jobs, as GET /v1/jobs lists them."""
    status, body = sidecar.request("GET", f"/v1/jobs?chat_id={quote_id(chat_id)}")
    assert status == 200, body
    return body["jobs"]


def stored_count(sidecar: Sidecar, chat_id: str) -> int:
    """How many messages the sidecar holds for the chat (-1: it does not know the chat)."""
    status, body = sidecar.request("GET", f"/v1/chats/{quote_id(chat_id)}/messages")
    return len(body["messages"]) if status == 200 else -1


def open_chat_id(st: STPage) -> str:
    return st.evaluate("() => SillyTavern.getContext().getCurrentChatId()")


def summarised_chat(st: STPage, sidecar: Sidecar) -> str:
    """Seraphina's chat, told where the silver bell is, its first session ended and its jobs done."""
    configure_chronicler(st, sidecarUrl=sidecar.url, token=sidecar.token)
    st.select_character("Seraphina")
    chat = open_chat_id(st)
    st.send("I tell Seraphina the smugglers hid the silver bell in the chapel crypt.")
    wait_long(lambda: stored_count(sidecar, chat) == len(st.messages()), what="the chat synced")
    status, _ = sidecar.request("POST", f"/v1/chats/{quote_id(chat)}/sessions/end", {})
    assert status == 200
    wait_long(lambda: chat_jobs(sidecar, chat) and all(j["state"] == "done" for j in chat_jobs(sidecar, chat)),
              what="the session's jobs done")
    return chat
