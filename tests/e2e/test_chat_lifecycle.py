"""A chat renamed or deleted in SillyTavern follows in the sidecar (CHAT_RENAMED,
CHAT_DELETED), with SillyTavern's own slash commands /renamechat and /delchat."""

from __future__ import annotations

import time
from functools import partial

from tests.helpers.sidecar import Sidecar
from tests.helpers.sillytavern import STPage, configure_chronicler, quote_id, wait_until

_q = quote_id
_wait_until = partial(wait_until, timeout=20.0, interval=0.2)


def _ids(sidecar: Sidecar, chat_id: str) -> list[str] | None:
    status, body = sidecar.request("GET", f"/v1/chats/{_q(chat_id)}/messages?ids_only=true")
    return body["ids"] if status == 200 else None


def test_dc2_renamed_chat_keeps_its_transcript_and_memories_under_the_new_id(st: STPage, sidecar: Sidecar) -> None:
    """SillyTavern reopens a renamed chat under its new name before it announces the rename, so
    the extension replaces the fresh copy with the old chat: the transcript and what was derived
    from it (a memory's chat provenance, used by rollback) follow the new id."""
    configure_chronicler(st, sidecarUrl=sidecar.url, token=sidecar.token)
    st.select_character("Seraphina")
    old_id = st.evaluate("() => SillyTavern.getContext().getCurrentChatId()")
    st.send("A message before the rename.")
    ids = st.evaluate("() => SillyTavern.getContext().chat.map(m => m.extra.chronicler_id)")
    _wait_until(lambda: _ids(sidecar, old_id) == ids, what="chat synced")
    avatar = st.evaluate("() => SillyTavern.getContext().characters[SillyTavern.getContext().characterId].avatar")
    status, body = sidecar.request("POST", "/v1/memories", {
        "text": "Told in the renamed chat.", "scope": "character", "character_id": avatar, "actor": "model",
        "chat_id": old_id, "turn_id": "t-rename"})
    assert status == 201, body
    memory_id = body["memory"]["id"]

    new_id = f"Renamed {int(time.time())}"
    st.run_command(f"/renamechat {new_id}")
    st.page.wait_for_function("id => SillyTavern.getContext().getCurrentChatId() === id", arg=new_id)
    _wait_until(lambda: _ids(sidecar, new_id) == ids and _ids(sidecar, old_id) is None, what="rename followed")
    assert sidecar.request("GET", f"/v1/memories/{memory_id}")[1]["memory"]["chat_id"] == new_id
    st.shot("after-rename")

    st.run_command("/delchat")
    _wait_until(lambda: sidecar.request("GET", f"/v1/chats/{_q(new_id)}")[0] == 404, what="chat deleted")
    st.shot("after-delete")


def test_rv6_renamed_character_keeps_its_memories_under_the_new_avatar(st: STPage, sidecar: Sidecar) -> None:
    """A renamed card gets a new avatar file name (the sidecar's character id): the character and
    every memory naming it move to the new id, pinned ones included, and none turns global (RV6
    would make them global if the old id were simply deleted)."""
    configure_chronicler(st, sidecarUrl=sidecar.url, token=sidecar.token)
    st.select_character("Mira")
    _wait_until(lambda: sidecar.request("GET", "/v1/characters/Mira.png")[0] == 200, what="Mira registered")
    pinned = sidecar.request("POST", "/v1/memories", {"text": "Mira's mother was a healer.", "scope": "character",
                                                      "character_id": "Mira.png", "pinned": True, "actor": "user"})
    secret = sidecar.request("POST", "/v1/memories", {"text": "Only Mira knows where the moonwort grows.",
                                                      "scope": "global", "known_by": ["Mira.png"], "actor": "user"})
    assert pinned[0] == 201 and secret[0] == 201

    st.run_command("/rename-char chats=false Mirabel")
    st.page.wait_for_function("() => SillyTavern.getContext().name2 === 'Mirabel'", timeout=30_000)
    new = st.evaluate("() => SillyTavern.getContext().characters[SillyTavern.getContext().characterId].avatar")
    assert new != "Mira.png"
    _wait_until(lambda: sidecar.request("GET", "/v1/characters/Mira.png")[0] == 404, what="old id removed")
    # The new name arrives with the next sync that sees the reloaded card.
    body = _wait_until(lambda: (lambda r: r[1] if r[0] == 200 and r[1]["character"]["name"] == "Mirabel" else None)(
        sidecar.request("GET", f"/v1/characters/{_q(new)}")), what="new name")
    assert "Mira" in body["character"]["aliases"], body
    moved = sidecar.request("GET", f"/v1/memories/{pinned[1]['memory']['id']}")[1]["memory"]
    assert (moved["scope"], moved["character_id"], moved["pinned"]) == ("character", new, True)
    assert sidecar.request("GET", f"/v1/memories/{secret[1]['memory']['id']}")[1]["memory"]["known_by"] == [new]
    st.shot("after-character-rename")
