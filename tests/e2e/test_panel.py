"""The memory panel (DC4, RV3, RV8, RV9b–d, RV14, RV16, RV19) in real SillyTavern with the real sidecar.

Every test clears the sidecar's memories first (the sidecar process lives for the whole session).
Screenshots of each tab at desktop (1280×800) and phone (390×844) width go to test-artifacts/panel/.
"""

from __future__ import annotations

import json
import time
import urllib.parse
from pathlib import Path
from typing import Any, Iterator

import pytest

from tests.e2e.sidecar import Sidecar
from tests.e2e.st import REPO_ROOT, STPage, configure_chronicler

PANEL_SHOTS = REPO_ROOT / "test-artifacts" / "panel"
DESKTOP = {"width": 1280, "height": 800}
PHONE = {"width": 390, "height": 844}
XSS = '<img src=x onerror="window.__chroniclerXss = 1">'


def q(value: str) -> str:
    return urllib.parse.quote(value, safe="")


def wait_until(predicate, timeout: float = 15.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


# --- the sidecar's side ----------------------------------------------------------------------
def memories(sidecar: Sidecar, **filters: Any) -> list[dict]:
    query = "&".join(f"{k}={q(str(v).lower() if isinstance(v, bool) else str(v))}" for k, v in filters.items())
    status, body = sidecar.request("GET", f"/v1/memories?{query}")
    assert status == 200, body
    return body["memories"]


def remember(sidecar: Sidecar, text: str, character_id: str | None = None, pinned: bool = False,
             actor: str = "user") -> dict:
    body: dict[str, Any] = {"text": text, "scope": "character" if character_id else "global",
                            "pinned": pinned, "actor": actor}
    if character_id:
        body["character_id"] = character_id
    status, answer = sidecar.request("POST", "/v1/memories", body)
    assert status == 201, answer
    return answer["memory"]


def wipe(sidecar: Sidecar) -> None:
    """Delete every memory of every scope, pinned included (the test starts from nothing)."""
    status, body = sidecar.request("GET", "/v1/characters")
    assert status == 200, body
    scopes = [{"scope": "global"}] + [{"scope": "character", "character_id": c["id"]} for c in body["characters"]]
    for scope in scopes:
        status, answer = sidecar.request("POST", "/v1/memories/delete-all", {**scope, "include_pinned": True})
        assert status == 200, answer


def has_route(sidecar: Sidecar, method: str, path: str) -> bool:
    status, body = sidecar.request(method, path)
    return not (status in (404, 405) and body and body.get("error", {}).get("code") in ("not_found", "method_not_allowed"))


# --- the page's side -------------------------------------------------------------------------
@pytest.fixture
def seraphina(st: STPage, sidecar: Sidecar) -> dict:
    """SillyTavern talking to the sidecar, Seraphina's chat open and registered, memories wiped."""
    st.page.set_viewport_size(DESKTOP)
    configure_chronicler(st, sidecarUrl=sidecar.url, token=sidecar.token)
    st.select_character("Seraphina")
    avatar, chat_id = st.evaluate("() => { const c = SillyTavern.getContext();"
                                  " return [c.characters[c.characterId].avatar, c.getCurrentChatId()]; }")
    wait_until(lambda: sidecar.request("GET", f"/v1/chats/{q(chat_id)}")[0] == 200, what="chat registered")
    wipe(sidecar)
    return {"avatar": avatar, "chat_id": chat_id}


def open_panel(st: STPage, tab: str = "memories") -> Any:
    """Open the panel with the slash command and wait for the tab to be shown."""
    st.page.locator("#send_textarea").fill(f"/memories {tab}")
    st.page.locator("#send_but").click()
    panel = st.page.locator(".chronicler-panel")
    panel.wait_for(state="visible", timeout=10_000)
    st.page.locator(f"#chronicler_tab_{tab}[aria-selected='true']").wait_for(timeout=10_000)
    return panel


def close_panel(st: STPage) -> None:
    st.page.keyboard.press("Escape")
    st.page.locator(".chronicler-panel").wait_for(state="detached", timeout=10_000)


def memory_rows(st: STPage):
    return st.page.locator(".chronicler-memories .chronicler-memory")


def wait_rows(st: STPage, n: int) -> None:
    st.page.wait_for_function(
        "n => document.querySelectorAll('.chronicler-memories .chronicler-list .chronicler-memory').length === n",
        arg=n, timeout=10_000)


def confirm_popup(st: STPage, expect: str) -> Any:
    """The top confirmation popup; asserts its wording contains `expect`."""
    popup = st.page.locator("dialog.popup[open]").filter(has=st.page.locator(".chronicler-confirm")).last
    popup.wait_for(timeout=10_000)
    text = popup.inner_text()
    assert expect in text, text
    return popup


def panel_shot(st: STPage, name: str) -> Path:
    PANEL_SHOTS.mkdir(parents=True, exist_ok=True)
    st.evaluate("() => { toastr.clear(); document.querySelectorAll('#toast-container .toast').forEach(t => t.remove()); }")
    st.page.wait_for_timeout(250)  # let the popup's opening animation end
    path = PANEL_SHOTS / f"{name}.png"
    st.page.screenshot(path=str(path))
    return path


def add_chat_messages(st: STPage, n: int) -> None:
    """Append `n` messages to the open chat the way SillyTavern shows them, then sync and save."""
    st.evaluate("""n => {
        const c = SillyTavern.getContext();
        for (let i = 0; i < n; i++) {
            const user = i % 2 === 0;
            const message = {
                name: user ? c.name1 : c.name2, is_user: user, is_system: false,
                send_date: new Date().toISOString(), extra: {},
                mes: user ? `Remember this, line ${i}: my sister Lise was born on the ${i + 1}th of May.`
                          : `Seraphina nods at line ${i}. "I will keep it safe."`,
            };
            c.chat.push(message);
            c.addOneMessage(message);
        }
        window.chronicler.sync.syncCurrentChat('test');
    }""", n)
    st.flush_chat()


# --- screens ---------------------------------------------------------------------------------
def seed_story(sidecar: Sidecar, avatar: str) -> None:
    """A small campaign: pinned, recent, model-saved and global memories, and a sheet with a secret."""
    remember(sidecar, "The traveller's name is Ann; she hates being called Annie.", avatar, pinned=True)
    remember(sidecar, "Ann is allergic to bee stings.", avatar, pinned=True)
    remember(sidecar, "Seraphina promised to guide Ann to the edge of the forest at dawn.", avatar, actor="model")
    remember(sidecar, "Ann's sister Lise has been missing since the spring flood.", avatar)
    remember(sidecar, "The forest spirits do not cross running water.")
    status, body = sidecar.request("PUT", f"/v1/characters/{q(avatar)}", {
        "name": "Seraphina",
        "sheet": {
            "personality": "Gentle, patient guardian of the forest; fierce when her glade is threatened.",
            "appearance": "Long pink hair, amber eyes, a dress of woven leaves.",
            "secrets": [{"text": "She was once human and remembers the village she came from.", "known_by": []}],
        },
    })
    assert status in (200, 201), body


def context_report(st: STPage, sidecar: Sidecar, avatar: str, context_tokens: int = 1100) -> dict:
    """A real report from the real assembler (server_plugin.assemble) over this chat's messages and
    Seraphina's memories, as POST /v1/context returns it; used while that route is being built."""
    from server_plugin.assemble import Candidates, Item, LastAction, Message, assemble
    from server_plugin.tokens import get_counter

    chat = st.evaluate("() => SillyTavern.getContext().chat.map(m => ({id: m.extra?.chronicler_id, text: m.mes,"
                       " role: m.is_user ? 'user' : 'assistant', name: m.name}))")
    messages = [Message(m["id"], m["text"], m["role"], m["name"]) for m in chat if m["id"]]
    own = memories(sidecar, scope="character", character_id=avatar)
    pinned = [Item(m["id"], m["text"]) for m in own if m["pinned"]]
    bank = [Item(m["id"], m["text"]) for m in own if not m["pinned"]] + [
        Item(m["id"], m["text"]) for m in memories(sidecar, scope="global")]
    candidates = Candidates(
        last_action=LastAction(messages[-1].text if messages else "", "action", messages[-1].id if messages else None),
        messages=messages, pinned_memories=pinned, memory_bank=bank,
        authors_note="Keep the forest's mood calm and wary.",
        character_sheets=[Item("sheet:" + avatar, "Seraphina: gentle guardian of the forest. " * 12)],
        story_summary=[Item("summary:1", "Ann woke in Seraphina's glade after the wolves attacked. " * 30)],
    )
    return assemble(candidates, context_tokens, get_counter()).to_dict()["report"]


def show_report(st: STPage, report: dict) -> None:
    st.evaluate("report => { window.chronicler.stats.lastReport = report; window.chronicler.stats.lastError = null; }", report)


@pytest.mark.parametrize("size", ["desktop", "phone"])
def test_dc4_screens_of_every_tab(st: STPage, sidecar: Sidecar, seraphina: dict, size: str) -> None:
    """rule DC4: every tab renders with real data at desktop and phone width (screenshots in
    test-artifacts/panel/ for a person to look at); nothing overflows the screen sideways."""
    avatar = seraphina["avatar"]
    seed_story(sidecar, avatar)
    add_chat_messages(st, 6)
    show_report(st, context_report(st, sidecar, avatar))
    st.page.set_viewport_size(DESKTOP if size == "desktop" else PHONE)
    open_panel(st, "memories")
    wait_rows(st, 4)
    for tab in ("memories", "characters", "summaries", "lore", "context"):
        st.page.locator(f"#chronicler_tab_{tab}").click()
        st.page.locator(f"#chronicler_tabpanel_{tab}").wait_for(state="visible")
        st.page.wait_for_load_state("networkidle")
        overflow = st.evaluate("""tab => {
            const panel = document.querySelector(`#chronicler_tabpanel_${tab}`);
            const box = document.querySelector('dialog.chronicler-popup').getBoundingClientRect();
            return Math.max(panel.scrollWidth - panel.clientWidth, box.right - window.innerWidth, -box.left);
        }""", tab)
        assert overflow <= 1, f"{tab} overflows sideways by {overflow}px at {size} width"
        panel_shot(st, f"{tab}-{size}")
