"""The memory panel (DC4, RV3, RV8, RV9b–d, RV14, RV16, RV19) in real SillyTavern with the real sidecar.

Every test clears the sidecar's memories first (the sidecar process lives for the whole session).
Screenshots of each tab at desktop (1280×800) and phone (390×844) width go to test-artifacts/panel/.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import TimeoutError as PlaywrightTimeoutError

from tests.helpers.episodes import EMPTY, sections_of, task_of
from tests.helpers.sidecar import Sidecar
from tests.helpers.sillytavern import (
    REPO_ROOT,
    STPage,
    configure_chronicler,
    quote_id,
    save_settings,
    wait_until,
)

q = quote_id


PANEL_SHOTS = REPO_ROOT / "test-artifacts" / "panel"
DESKTOP = {"width": 1280, "height": 800}
PHONE = {"width": 390, "height": 844}
XSS = '<img src=x onerror="window.__chroniclerXss = 1">'


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


def rows(st: STPage) -> int:
    return st.evaluate("() => document.querySelectorAll('.chronicler-memories .chronicler-list .chronicler-memory').length")


def click_until(locator: Any, done: Any, timeout: float = 30.0) -> None:
    """Click until `done()`: a list still settling after it opened may replace the button under a
    click (Playwright then waits on the detached one)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            locator.click(timeout=3_000)
        except PlaywrightTimeoutError:
            pass
        if done():
            return
        time.sleep(0.2)
    raise AssertionError("the click never took effect")


def confirm_popup(st: STPage, expect: str) -> Any:
    """The top confirmation popup; asserts its wording contains `expect`."""
    popup = st.page.locator("dialog.popup[open]:not([closing])").filter(
        has=st.page.locator(".chronicler-confirm")).filter(has_text=expect).last
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
    remember(sidecar, "Ann owes the ferryman two silver coins.", avatar)
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
    from server_plugin.core.assemble import Candidates, Card, Item, LastAction, Message, assemble
    from server_plugin.core.tokens import get_counter
    from server_plugin.settings import defaults
    from server_plugin.story.context import rules_from

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
        story_cards=[Card("lore:lise", "Lise, Ann's younger sister, vanished in the spring flood.", ("Lise",)),
                     Card("lore:mill", "The old mill by the river has been empty for years.", ("mill",))],
    )
    return assemble(candidates, context_tokens, get_counter(), rules=rules_from(defaults())).to_dict()["report"]


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
    wait_rows(st, 5)
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
    if size == "desktop":  # the README's two pictures: the panel and the context inspector, small
        st.page.set_viewport_size({"width": 1060, "height": 640})
        for tab in ("memories", "context"):
            st.page.locator(f"#chronicler_tab_{tab}").click()
            st.page.wait_for_load_state("networkidle")
            st.page.wait_for_timeout(250)
            st.page.locator("dialog.chronicler-popup").screenshot(path=str(PANEL_SHOTS / f"readme-{tab}.png"))


# --- the shell -------------------------------------------------------------------------------
def active_id(st: STPage) -> str:
    return st.evaluate("() => document.activeElement?.id ?? ''")


def test_dc4_panel_opens_from_the_menu_and_the_command_and_works_by_keyboard(st: STPage, seraphina: dict) -> None:
    """rule DC4: the panel opens from the extensions menu and from /memories <tab>; its tabs are
    an ARIA tablist moved through with the arrow keys, Home and End; Escape closes it."""
    page = st.page
    page.locator("#extensionsMenuButton").click()
    page.locator("#chronicler_menu_item").click()
    page.locator(".chronicler-panel").wait_for(state="visible")
    page.wait_for_function("() => document.activeElement?.id === 'chronicler_tab_memories'")
    tablist = page.get_by_role("tablist", name="Memory panel sections")
    assert tablist.get_attribute("aria-label")
    tabs = tablist.locator("[role=tab]")
    assert tabs.count() == 5
    for i in range(5):
        tab = tabs.nth(i)
        panel_id = tab.get_attribute("aria-controls")
        assert page.locator(f"#{panel_id}").get_attribute("aria-labelledby") == tab.get_attribute("id")
    page.keyboard.press("ArrowRight")
    page.wait_for_function("() => document.activeElement?.id === 'chronicler_tab_characters'")
    assert page.locator("#chronicler_tab_characters").get_attribute("aria-selected") == "true"
    assert page.locator("#chronicler_tabpanel_characters").is_visible()
    assert not page.locator("#chronicler_tabpanel_memories").is_visible()
    page.keyboard.press("End")
    page.wait_for_function("() => document.activeElement?.id === 'chronicler_tab_context'")
    page.keyboard.press("ArrowRight")  # wraps around
    page.wait_for_function("() => document.activeElement?.id === 'chronicler_tab_memories'")
    page.keyboard.press("Tab")  # into the tab's content: the scope picker comes first
    assert page.evaluate("() => document.activeElement?.getAttribute('aria-label')") == "Whose memories"
    page.keyboard.press("Escape")
    page.locator(".chronicler-panel").wait_for(state="detached")

    open_panel(st, "context")
    assert page.locator("#chronicler_tab_context").get_attribute("aria-selected") == "true"
    close_panel(st)


# --- the Memories tab ------------------------------------------------------------------------
def row(st: STPage, text: str):
    return st.page.locator(".chronicler-memories .chronicler-memory").filter(has_text=text)


def test_rv9b_rv8_add_edit_pin_and_delete_a_memory(st: STPage, sidecar: Sidecar, seraphina: dict) -> None:
    """rules RV9b, RV8, RV11: a person adds a memory (at most 500 characters, with a live counter)
    for a scope they pick and may pin it; edits it in place (Escape cancels without closing the
    panel, Ctrl+Enter saves), unpins it and deletes it after a confirmation."""
    avatar = seraphina["avatar"]
    page = st.page
    open_panel(st)
    page.get_by_role("button", name="Add", exact=True).click()
    box = page.get_by_label("Text of the new memory")
    box.fill("x" * 501)
    counter = page.locator(".chronicler-add .chronicler-counter")
    assert counter.inner_text() == "501 / 500" and "over" in counter.get_attribute("class")
    assert "disabled" in page.locator(".chronicler-add .menu_button", has_text="Save memory").get_attribute("class")
    box.fill("Ann keeps her mother's silver ring on a cord around her neck.")
    assert counter.inner_text() == "61 / 500"
    page.get_by_label("Who remembers it").select_option(f"character:{avatar}")
    page.locator(".chronicler-add label", has_text="Pin it").click()
    page.locator(".chronicler-add .menu_button", has_text="Save memory").click()
    row(st, "silver ring").wait_for()
    assert "pinned" in row(st, "silver ring").get_attribute("class")
    saved = memories(sidecar, scope="character", character_id=avatar)
    assert [(m["text"], m["pinned"], m["actor"]) for m in saved] == [
        ("Ann keeps her mother's silver ring on a cord around her neck.", True, "user")]
    assert page.locator(".chronicler-quota").inner_text().startswith("Pinned 1 / 20 · Unpinned 0 / 100")
    remember(sidecar, "The forest spirits do not cross running water.")
    page.get_by_label("Whose memories").select_option("all")
    page.locator(".chronicler-group", has_text="Seraphina · Pinned 1 / 20 · Unpinned 0 / 100").wait_for()
    assert "disabled" in page.get_by_role("button", name="Delete all…").get_attribute("class"), \
        "delete all works on one scope at a time"
    assert row(st, "spirits").count() == 0, "global memories are not in the character view"
    page.get_by_label("Whose memories").select_option("global")
    row(st, "spirits").wait_for()
    page.get_by_label("Whose memories").select_option(f"character:{avatar}")
    row(st, "silver ring").wait_for()

    row(st, "silver ring").get_by_role("button", name="Edit memory").click()
    editor = page.get_by_label("Edit memory text")
    editor.fill("Changed my mind")
    editor.press("Escape")
    assert page.locator(".chronicler-panel").is_visible(), "Escape in the editor closes only the editor"
    assert row(st, "silver ring").count() == 1
    row(st, "silver ring").get_by_role("button", name="Edit memory").click()
    editor.fill("Ann keeps her mother's silver ring on a cord; she never takes it off.")
    editor.press("Control+Enter")
    row(st, "never takes it off").wait_for()
    assert memories(sidecar, scope="character", character_id=avatar)[0]["text"].endswith("never takes it off.")

    # Someone else (the model, another window) changes it while the editor is open: the save is
    # refused (version), the person's text stays in the editor, and saving again wins.
    row(st, "never takes it off").get_by_role("button", name="Edit memory").click()
    editor.fill("Ann's silver ring was her mother's; she never takes it off.")
    memory_id = memories(sidecar, scope="character", character_id=avatar)[0]["id"]
    assert sidecar.request("PATCH", f"/v1/memories/{memory_id}", {"text": "Changed elsewhere.", "actor": "user"})[0] == 200
    editor.press("Control+Enter")
    page.wait_for_function("() => /changed meanwhile/.test(document.querySelector('.chronicler-memories .chronicler-status').textContent)")
    assert page.get_by_label("Edit memory text").input_value() == "Ann's silver ring was her mother's; she never takes it off."
    assert memories(sidecar, scope="character", character_id=avatar)[0]["text"] == "Changed elsewhere."
    page.get_by_label("Edit memory text").press("Control+Enter")
    row(st, "her mother's; she never").wait_for()
    wait_until(lambda: memories(sidecar, scope="character", character_id=avatar)[0]["text"].startswith("Ann's silver ring was"),
               what="the second save")
    row(st, "never takes it off").get_by_role("button", name="Unpin memory").click()
    wait_until(lambda: not memories(sidecar, scope="character", character_id=avatar)[0]["pinned"], what="unpinned")
    row(st, "never takes it off").get_by_role("button", name="Delete memory").click()
    confirm_popup(st, "Delete this memory?").get_by_text("Delete", exact=True).click()
    wait_rows(st, 0)
    assert memories(sidecar, scope="character", character_id=avatar) == []
    panel_shot(st, "memories-after-delete")


def test_rv8_hundreds_of_memories_page_filter_and_restore_archived(st: STPage, sidecar: Sidecar, seraphina: dict) -> None:
    """rules RV8, DC4: with 130 unpinned memories the scope shows 100 / 100 and 30 archived; the
    list renders in pages (60 rows, then more on demand), the filter narrows it as you type, and an
    archived memory can be restored (the least recently updated one is archived instead)."""
    avatar = seraphina["avatar"]
    for i in range(130):
        remember(sidecar, f"Fact number {i:03d}: the {['oak', 'river', 'mill', 'tower', 'bridge'][i % 5]} keeps a secret.", avatar)
    page = st.page
    started = time.monotonic()
    open_panel(st)
    wait_rows(st, 60)
    opened_ms = round((time.monotonic() - started) * 1000)
    assert page.locator(".chronicler-quota").inner_text().startswith("Pinned 0 / 20 · Unpinned 100 / 100")
    more = page.locator(".chronicler-more")
    assert more.inner_text().strip() == "Show more (40 left)"
    click_until(more, lambda: rows(st) >= 100)
    wait_rows(st, 100)
    # Typing a filter, measured in the page: the input event until the list shows the one match
    # (includes the 120 ms the filter waits for typing to stop).
    timings = {"filter_to_one_row_ms": round(st.evaluate("""async () => {
        const input = document.querySelector('[aria-label="Filter memories by text"]');
        const t0 = performance.now();
        input.value = 'number 129';
        input.dispatchEvent(new Event('input'));
        await new Promise(done => { const look = () => document.querySelectorAll(
            '.chronicler-list .chronicler-memory').length === 1 ? done() : requestAnimationFrame(look); look(); });
        return performance.now() - t0;
    }"""))}
    wait_rows(st, 1)
    page.get_by_label("Filter memories by text").fill("MILL keeps")
    wait_rows(st, 20)
    page.get_by_label("Filter memories by text").fill("")
    toggle = page.locator(".chronicler-memories label", has_text="Show archived")
    assert toggle.inner_text().strip() == "Show archived (30)"
    toggle.click()
    page.wait_for_function("() => document.querySelectorAll('.chronicler-memory.archived').length === 30")
    assert "Archived (30)" in page.locator(".chronicler-memories").inner_text()
    panel_shot(st, "memories-archived")
    page.get_by_label("Filter memories by text").fill("number 000")
    oldest = page.locator(".chronicler-memory.archived", has_text="number 000")
    oldest.get_by_role("button", name="Restore").click()
    page.wait_for_function("() => /Restored/.test(document.querySelector('.chronicler-memories .chronicler-status').textContent)")
    toggle.click()
    wait_rows(st, 1)
    active = {m["text"][:15] for m in memories(sidecar, scope="character", character_id=avatar)}
    assert "Fact number 000" in active and len(active) == 100
    assert "Fact number 030" not in active, "the least recently updated active one was archived"
    panel_shot(st, "memories-archived-restored")
    # Not a speed assertion (those live in bench/): numbers for a person to read, taken through Playwright.
    timings["open_to_60_rows_ms"] = opened_ms
    (PANEL_SHOTS / "timings.json").write_text(json.dumps(timings, indent=2))


def test_rv19_delete_all_asks_twice_and_spares_pinned_first(st: STPage, sidecar: Sidecar, seraphina: dict) -> None:
    """rule RV19: "Delete all" first removes every unpinned memory of the scope and says how many
    pinned remain; deleting those needs a second, separately worded confirmation."""
    avatar = seraphina["avatar"]
    for i in range(3):
        remember(sidecar, f"Pinned fact {i}", avatar, pinned=True)
    for i in range(5):
        remember(sidecar, f"Loose fact {i}", avatar)
    remember(sidecar, "A global fact that stays.")
    page = st.page
    open_panel(st)
    wait_rows(st, 8)
    page.get_by_role("button", name="Delete all…").click()
    first = confirm_popup(st, "Delete all unpinned memories of Seraphina?")
    assert "Pinned memories are kept" in first.inner_text()
    panel_shot(st, "delete-all-first-step")
    first.get_by_text("Delete unpinned", exact=True).click()
    second = confirm_popup(st, "Also delete the 3 pinned memories of Seraphina?")
    assert "These are moments you marked yourself and protected from the AI." in second.inner_text()
    left = memories(sidecar, scope="character", character_id=avatar)
    assert sorted(m["text"] for m in left) == ["Pinned fact 0", "Pinned fact 1", "Pinned fact 2"]
    panel_shot(st, "delete-all-second-step")
    second.get_by_text("Keep them", exact=True).click()
    page.wait_for_function("() => /kept 3 pinned memories/.test(document.querySelector('.chronicler-memories .chronicler-status').textContent)")
    wait_rows(st, 3)

    page.get_by_role("button", name="Delete all…").click()
    confirm_popup(st, "Delete all unpinned memories of Seraphina?").get_by_text("Delete unpinned", exact=True).click()
    confirm_popup(st, "Also delete the 3 pinned memories").get_by_text("Delete 3 pinned memories", exact=True).click()
    page.wait_for_function("() => /This scope is empty/.test(document.querySelector('.chronicler-memories .chronicler-status').textContent)")
    assert memories(sidecar, scope="character", character_id=avatar) == []
    assert [m["text"] for m in memories(sidecar, scope="global")] == ["A global fact that stays."]


def test_dc4_memory_text_is_shown_as_text_never_as_html(st: STPage, sidecar: Sidecar, seraphina: dict) -> None:
    """rule DC4 (security): memory text is untrusted; an `<img onerror>` memory shows as the
    literal text in the list and in the delete confirmation, and no script runs."""
    remember(sidecar, XSS, seraphina["avatar"])
    page = st.page
    open_panel(st)
    wait_rows(st, 1)
    shown = page.locator(".chronicler-memory-text").first.inner_text()
    assert shown == XSS
    assert page.locator(".chronicler-panel img").count() == 0
    row(st, "onerror").get_by_role("button", name="Delete memory").click()
    popup = confirm_popup(st, "onerror")
    assert popup.locator(".chronicler-confirm img").count() == 0
    panel_shot(st, "xss-as-text")
    popup.get_by_text("Cancel", exact=True).click()
    page.wait_for_timeout(300)
    assert page.evaluate("() => window.__chroniclerXss") is None


# --- save from conversation (RV9d) and generate memories (RV9c) ------------------------------
def pick_boxes(st: STPage):
    return st.page.locator("#chat .mes .chronicler-pick input")


def review_popup(st: STPage) -> Any:
    popup = st.page.locator("dialog.popup[open]:not([closing])").filter(has_text="Review memory drafts").last
    popup.wait_for(timeout=30_000)
    return popup


def test_rv9d_save_from_conversation_refuses_the_21st_message_and_saves_20_pinned(
        st: STPage, sidecar: Sidecar, seraphina: dict) -> None:
    """rule RV9d: checkboxes appear on the chat's messages; 20 may be picked and the 21st is
    refused with a message; "keep raw text" turns the 20 into at most 5 drafts (every picked
    message in one of them, each at most 500 characters), reviewed, then saved pinned."""
    avatar = seraphina["avatar"]
    add_chat_messages(st, 24)
    page = st.page
    open_panel(st)
    page.get_by_role("button", name="Save from conversation").click()
    page.locator(".chronicler-panel").wait_for(state="detached")
    bar = page.locator(".chronicler-pick-bar")
    bar.wait_for()
    boxes = pick_boxes(st)
    assert boxes.count() >= 24
    # The 24 messages just added are the last 24 boxes: whatever the chat held before (an earlier
    # test's turns) is not picked, so the first draft starts with line 0.
    first = boxes.count() - 24
    for i in range(20):
        boxes.nth(first + i).check()
    assert bar.locator(".chronicler-pick-count").inner_text() == "20 / 20 messages picked"
    boxes.nth(first + 20).click()
    assert not boxes.nth(first + 20).is_checked()
    assert "You can pick at most 20 messages" in bar.locator("[role=alert]").inner_text()
    assert bar.locator(".chronicler-pick-count").inner_text() == "20 / 20 messages picked"
    panel_shot(st, "pick-21st-refused-desktop")
    picked_ids = st.evaluate("""n => { const c = SillyTavern.getContext();
        return [...document.querySelectorAll('#chat .mes')].filter(m => m.querySelector('.chronicler-pick input')?.checked)
            .map(m => c.chat[Number(m.getAttribute('mesid'))].extra.chronicler_id); }""", 20)
    assert len(picked_ids) == 20

    bar.get_by_role("button", name="Keep raw text").click()
    popup = review_popup(st)
    drafts = popup.locator(".chronicler-draft textarea")
    assert drafts.count() == 5
    texts = [drafts.nth(i).input_value() for i in range(5)]
    assert all(0 < len(t) <= 500 for t in texts)
    assert "Remember this, line 0" in texts[0]
    assert "has 0 of 20 pinned memories: room for 20" in popup.inner_text()
    assert page.locator("#chat .chronicler-pick").count() == 0, "the checkboxes are gone once the pick ends"
    panel_shot(st, "review-drafts-desktop")
    popup.get_by_text("Save as pinned memories", exact=True).click()
    page.locator(".chronicler-panel").wait_for(state="visible")  # the panel opens on what was saved
    wait_rows(st, 5)
    saved = memories(sidecar, scope="character", character_id=avatar)
    assert len(saved) == 5 and all(m["pinned"] and m["actor"] == "user" for m in saved)
    assert sorted(i for m in saved for i in m["source_message_ids"]) == sorted(picked_ids)
    assert sorted(m["text"] for m in saved) == sorted(texts)


def test_rv9d_extract_with_the_model_asks_the_sidecar_for_drafts(st: STPage, sidecar: Sidecar, seraphina: dict) -> None:
    """rule RV9d: "extract with the model" sends the picked messages to POST /v1/memories/drafts
    and shows its drafts for review (here the sidecar has no model, and the dialog says so);
    an edited draft is saved pinned with the ids of its messages."""
    avatar = seraphina["avatar"]
    add_chat_messages(st, 2)
    page = st.page
    sent: list[dict] = []
    page.on("request", lambda r: sent.append(json.loads(r.post_data)) if r.url.endswith("/v1/memories/drafts") and r.method == "POST" else None)
    open_panel(st)
    page.get_by_role("button", name="Save from conversation").click()
    boxes = pick_boxes(st)
    boxes.nth(boxes.count() - 2).check()
    boxes.nth(boxes.count() - 1).check()
    page.get_by_role("button", name="Extract with the model").click()
    popup = review_popup(st)
    assert "No model is configured for the sidecar" in popup.inner_text()
    assert sent and sent[0]["mode"] == "conversation" and len(sent[0]["messages"]) == 2
    assert sent[0]["character_id"] == avatar
    first = popup.locator(".chronicler-draft textarea").first
    first.fill("Ann's sister Lise was born on the 1st of May.")
    for extra in range(1, popup.locator(".chronicler-draft").count()):
        popup.get_by_label(f"Keep draft {extra + 1}").uncheck()
    popup.get_by_text("Save as pinned memories", exact=True).click()
    wait_until(lambda: memories(sidecar, scope="character", character_id=avatar), what="saved")
    saved = memories(sidecar, scope="character", character_id=avatar)
    assert [(m["text"], m["pinned"]) for m in saved] == [("Ann's sister Lise was born on the 1st of May.", True)]
    assert saved[0]["source_message_ids"] and set(saved[0]["source_message_ids"]) <= {m["id"] for m in sent[0]["messages"]}


def test_rv9c_generate_memories_reads_only_the_description(st: STPage, sidecar: Sidecar, seraphina: dict) -> None:
    """rule RV9c: "generate memories" asks "What should the character remember?" (at most 1,000
    characters, counted live), sends only that description (never the chat), and the reviewed
    drafts are saved pinned for the chosen character."""
    avatar = seraphina["avatar"]
    page = st.page
    sent: list[dict] = []
    page.on("request", lambda r: sent.append(json.loads(r.post_data)) if r.url.endswith("/v1/memories/drafts") and r.method == "POST" else None)
    open_panel(st)
    page.get_by_role("button", name="Generate memories").click()
    dialog = page.locator("dialog.popup[open]").filter(has_text="What should the character remember?").last
    dialog.wait_for()
    box = dialog.get_by_label("What should the character remember?")
    box.fill("y" * 1001)
    assert dialog.locator(".chronicler-counter").inner_text() == "1001 / 1000"
    dialog.get_by_text("Draft memories", exact=True).click()
    assert "at most 1000 characters" in dialog.locator("[role=alert]").inner_text()
    box.fill("The traveller is called Ann. Ann is allergic to bee stings. Ann's sister Lise is missing.")
    panel_shot(st, "generate-memories-desktop")
    dialog.get_by_text("Draft memories", exact=True).click()
    popup = review_popup(st)
    assert sent == [{"mode": "description", "description": "The traveller is called Ann. Ann is allergic to bee stings. Ann's sister Lise is missing.",
                     "character_id": avatar}]
    drafts = popup.locator(".chronicler-draft textarea")
    assert [drafts.nth(i).input_value() for i in range(drafts.count())] == [
        "The traveller is called Ann.", "Ann is allergic to bee stings.", "Ann's sister Lise is missing."]
    popup.get_by_label("Keep draft 3").uncheck()
    drafts.nth(1).fill("Ann is badly allergic to bee stings.")
    popup.get_by_text("Save memories", exact=True).click()
    wait_until(lambda: len(memories(sidecar, scope="character", character_id=avatar)) == 2, what="two saved")
    saved = memories(sidecar, scope="character", character_id=avatar)
    assert sorted((m["text"], m["pinned"]) for m in saved) == [
        ("Ann is badly allergic to bee stings.", True), ("The traveller is called Ann.", True)]


# --- the Characters tab ----------------------------------------------------------------------
def test_rv14_rv16_sheet_secrets_and_switches_in_the_characters_tab(st: STPage, sidecar: Sidecar, seraphina: dict) -> None:
    """rules RV14, RV16, SW1, SW9b: the chat's memory switch and the character's learn-from-chat
    switch reach the sidecar at once (the chat keeps its members, the sheet its fields); a field
    and a secret known by another character are added and saved."""
    avatar, chat_id = seraphina["avatar"], seraphina["chat_id"]
    status, body = sidecar.request("PUT", "/v1/characters/ann.png", {"name": "Ann"})
    assert status in (200, 201), body
    status, body = sidecar.request("PUT", f"/v1/characters/{q(avatar)}", {
        "name": "Seraphina", "sheet": {"personality": "Gentle guardian of the forest."}})
    assert status in (200, 201), body
    page = st.page
    open_panel(st, "characters")
    chat_switch = page.locator(".chronicler-chat-switch input[type=checkbox]")
    chat_switch.wait_for()
    assert chat_switch.is_checked()
    chat_switch.uncheck()
    wait_until(lambda: sidecar.request("GET", f"/v1/chats/{q(chat_id)}")[1]["chat"]["memory_enabled"] is False, what="memory off")
    assert sidecar.request("GET", f"/v1/chats/{q(chat_id)}")[1]["chat"]["member_ids"] == [avatar]
    chat_switch.check()
    wait_until(lambda: sidecar.request("GET", f"/v1/chats/{q(chat_id)}")[1]["chat"]["memory_enabled"] is True, what="memory on")

    learn = page.locator(".chronicler-sheet label", has_text="Learn from chat").locator("input")
    learn.uncheck()
    wait_until(lambda: sidecar.request("GET", f"/v1/characters/{q(avatar)}")[1]["character"]["learn_from_chat"] is False, what="learning off")
    assert sidecar.request("GET", f"/v1/characters/{q(avatar)}")[1]["character"]["sheet"] == {"personality": "Gentle guardian of the forest."}

    page.get_by_label("Name of a new sheet field").fill("Eye colour")
    page.get_by_role("button", name="Add field").click()
    page.get_by_role("textbox", name="Eye colour").fill("Amber, with flecks of green.")
    page.get_by_role("button", name="Add secret").click()
    page.get_by_role("textbox", name="Secret 1").fill("She was once human.")
    page.get_by_label("Add a character who knows this secret").select_option("ann.png")
    page.locator(".chronicler-chip", has_text="Ann").wait_for()
    panel_shot(st, "characters-editing-desktop")
    page.get_by_role("button", name="Save sheet").click()
    page.wait_for_function("() => /Sheet saved/.test(document.querySelector('.chronicler-characters .chronicler-message').textContent)")
    character = sidecar.request("GET", f"/v1/characters/{q(avatar)}")[1]["character"]
    assert character["sheet"] == {"personality": "Gentle guardian of the forest.", "eye_colour": "Amber, with flecks of green.",
                                  "secrets": [{"text": "She was once human.", "known_by": ["ann.png"]}]}
    assert character["learn_from_chat"] is False, "saving the sheet leaves the switch as it was"
    learn.check()
    wait_until(lambda: sidecar.request("GET", f"/v1/characters/{q(avatar)}")[1]["character"]["learn_from_chat"] is True, what="learning on")


# --- the Context tab -------------------------------------------------------------------------
def test_qs_context_tab_explains_the_last_generation(st: STPage, sidecar: Sidecar, seraphina: dict) -> None:
    """rules QS1–QS8 (explained): the Context tab draws the last generation's budget as a bar
    (required / story cards / history / memory bank / free, widths proportional to tokens) and
    lists what was included, truncated and left out with the reason, naming memories by text."""
    avatar = seraphina["avatar"]
    seed_story(sidecar, avatar)
    add_chat_messages(st, 12)
    if has_route(sidecar, "POST", "/v1/context"):
        # A small model context (1,700 tokens for the prompt, of which Seraphina's card and the main
        # prompt take about 800 before ours), so the budget has to leave things out.
        st.evaluate("() => { const s = SillyTavern.getContext().chatCompletionSettings;"
                    " window.__ctx = [s.openai_max_context, s.openai_max_tokens];"
                    " s.openai_max_context = 2000; s.openai_max_tokens = 300; }")
        try:
            st.send("Seraphina, what do you remember about my sister?")
        finally:
            st.evaluate("() => { const s = SillyTavern.getContext().chatCompletionSettings;"
                        " [s.openai_max_context, s.openai_max_tokens] = window.__ctx; }")
            # SillyTavern may have saved the small context meanwhile (its debounced autosave): save
            # the restored one, or later tests (a page reload reads the saved settings) inherit it.
            save_settings(st)
        report = st.evaluate("() => window.chronicler.stats.lastReport")
    else:  # a sidecar without POST /v1/context: the same report, from the real assembler
        report = context_report(st, sidecar, avatar, context_tokens=900)
        show_report(st, report)
    assert report and report["sections"]
    page = st.page
    open_panel(st, "context")
    bar = page.locator(".chronicler-bar")
    bar.wait_for()
    total = max(report["context_tokens"], sum(s["used"] for s in report["sections"].values()))
    required = sum(report["sections"][s]["used"] for s in (
        "front_memory", "last_action", "pinned_memories", "authors_note", "plot_essentials",
        "instructions", "character_sheets", "campaign_notes", "story_summary") if s in report["sections"])
    widths = st.evaluate("() => Object.fromEntries([...document.querySelectorAll('.chronicler-bar-part')]"
                         ".map(p => [p.className.match(/part-(\\w+)/)[1], p.getBoundingClientRect().width]))")
    bar_width = bar.bounding_box()["width"] - 2  # its border
    assert abs(widths["required"] / bar_width - required / total) < 0.01
    assert set(widths) <= {"required", "cards", "history", "memory_bank", "free"}
    assert f"Required {required:,}" in page.locator(".chronicler-legend").inner_text()
    text = page.locator(".chronicler-context-body").inner_text()
    assert "null" not in text and "undefined" not in text
    assert "Pinned memories" in text and "“Ann is allergic to bee stings.” — in full" in text
    assert "History" in text and " — fitted" in text
    loud = [e for s in report["sections"].values() for e in s["dropped"] + s["truncated"]
            if e["reason"] not in ("not_triggered", "empty")]
    if loud:  # what was cut or left out is listed with its reason
        assert "Left out (" in text or "Truncated (" in text
        assert any(f"{e['tokens']:,} tokens" in text for e in loud if e["tokens"]) or "left out" in text
    else:
        assert "Left out (" not in text and "Truncated (" not in text
    panel_shot(st, "context-report-desktop")


def test_dc4_dialogs_and_picking_at_phone_width(st: STPage, sidecar: Sidecar, seraphina: dict) -> None:
    """rule DC4: at phone width the pick bar, the review of drafts and "generate memories" fit the
    screen and stay usable (screenshots in test-artifacts/panel/)."""
    add_chat_messages(st, 4)
    page = st.page
    page.set_viewport_size(PHONE)
    open_panel(st)
    page.get_by_role("button", name="Save from conversation").click()
    bar = page.locator(".chronicler-pick-bar")
    bar.wait_for()
    boxes = pick_boxes(st)
    boxes.nth(boxes.count() - 1).check()
    boxes.nth(boxes.count() - 2).check()
    page.locator("#chat").evaluate("c => c.scrollTop = c.scrollHeight")
    panel_shot(st, "pick-phone")
    box = bar.bounding_box()
    assert box["x"] >= 0 and box["x"] + box["width"] <= PHONE["width"] + 1
    bar.get_by_role("button", name="Keep raw text").click()
    popup = review_popup(st)
    panel_shot(st, "review-drafts-phone")
    dialog = popup.bounding_box()
    assert dialog["x"] >= 0 and dialog["x"] + dialog["width"] <= PHONE["width"] + 1
    popup.get_by_text("Cancel", exact=True).click()
    page.wait_for_function("() => !document.querySelector('dialog.popup[open]')")
    open_panel(st)
    page.get_by_role("button", name="Generate memories").click()
    generate = page.locator("dialog.popup[open]").filter(has_text="What should the character remember?").last
    generate.wait_for()
    generate.get_by_label("What should the character remember?").fill("I am Ann, a beekeeper from the valley.")
    panel_shot(st, "generate-memories-phone")
    box = generate.bounding_box()
    assert box["x"] >= 0 and box["x"] + box["width"] <= PHONE["width"] + 1
    generate.get_by_text("Cancel", exact=True).click()
    page.get_by_role("button", name="Save from conversation").click()
    bar.wait_for()
    assert pick_boxes(st).count() > 0
    page.locator(".chronicler-panel").wait_for(state="detached")
    page.keyboard.press("Escape")  # leaves picking: no bar, no checkboxes
    bar.wait_for(state="detached")
    assert pick_boxes(st).count() == 0


# --- the Summaries tab and the jobs line (RV3) -----------------------------------------------
def summaries_of(sidecar: Sidecar, chat_id: str) -> dict:
    status, body = sidecar.request("GET", f"/v1/chats/{q(chat_id)}/summaries")
    assert status == 200, body
    return body


def idle_jobs(sidecar: Sidecar, chat_id: str) -> bool:
    status, body = sidecar.request("GET", f"/v1/jobs?chat_id={q(chat_id)}")
    assert status == 200, body
    return body["counts"]["pending"] == 0 and body["counts"]["running"] == 0


def settled(sidecar: Sidecar, chat_id: str) -> bool:
    before = summaries_of(sidecar, chat_id)
    if not idle_jobs(sidecar, chat_id):
        return False
    time.sleep(1.0)
    return idle_jobs(sidecar, chat_id) and summaries_of(sidecar, chat_id) == before


def written(body: dict) -> list[dict]:
    return [s for tier in ("recent", "consolidated", "long_term") for s in body[tier] if s.get("text")]


def test_rv3_summaries_tab_shows_covered_messages_edits_and_rebuilds(st: STPage, sidecar: Sidecar, seraphina: dict) -> None:
    """rule RV3: messages that left the live window are summarised; the tab shows each summary
    with the messages it covers and how many are not summarised yet; a person edits one in place
    (kept, marked edited) and rebuilds them all (the edit is replaced), after a confirmation."""
    chat_id = seraphina["chat_id"]
    if not has_route(sidecar, "GET", f"/v1/chats/{q(chat_id)}/summaries"):
        pytest.skip("GET /v1/chats/{id}/summaries is not in this sidecar yet")
    add_chat_messages(st, 64)
    wait_until(lambda: written(summaries_of(sidecar, chat_id)), timeout=90, what="a summary written")
    # Chunks and 4->1 merges go on in the background (the extension's syncs queue more): compare
    # the tab with a listing that stayed the same for a second with no job pending or running.
    wait_until(lambda: settled(sidecar, chat_id), timeout=90, what="the chat's summaries settled")
    page = st.page
    open_panel(st, "summaries")
    card = page.locator(".chronicler-tier .chronicler-summary").first
    card.wait_for()
    listing = summaries_of(sidecar, chat_id)
    for tier, label in (("recent", "Recent"), ("consolidated", "Consolidated"), ("long_term", "Long-term")):
        metas = page.locator(f".chronicler-tier[aria-label='{label} summaries'] .chronicler-meta").all_inner_texts()
        assert len(metas) == len(listing[tier])
        assert all(m.startswith("Message" if tier == "recent" else "Merges 4 ") for m in metas), metas
    assert "not summarised yet" in page.locator(".chronicler-summaries .chronicler-quota").inner_text() \
        or "Every message" in page.locator(".chronicler-summaries .chronicler-quota").inner_text()
    assert page.locator(".chronicler-session").count() >= 1
    summary_id = card.get_attribute("data-id")
    card.get_by_role("button", name="Edit").click()
    box = page.get_by_label("Summary text")
    box.fill("Ann told Seraphina about her sister Lise, born in May; Seraphina promised to keep it safe.")
    page.locator(".chronicler-summaries .menu_button", has_text="Save").first.click()
    page.locator(f".chronicler-summary[data-id='{summary_id}'] .chronicler-badge", has_text="edited by you").wait_for()
    status, body = sidecar.request("GET", f"/v1/summaries/{q(summary_id)}")
    assert status == 200 and body["summary"]["edited"] is True
    assert body["summary"]["text"].startswith("Ann told Seraphina about her sister Lise")
    panel_shot(st, "summaries-edited-desktop")

    page.get_by_role("button", name="Rebuild").click()
    confirm_popup(st, "Rebuild the summaries of this chat?").get_by_text("Rebuild", exact=True).click()
    wait_until(lambda: written(summaries_of(sidecar, chat_id)) and not any(
        s["edited"] for s in written(summaries_of(sidecar, chat_id))), timeout=90, what="rebuilt summaries")
    page.get_by_role("tab", name="Summaries").click()
    page.locator(".chronicler-summary:not(.chronicler-session)").first.wait_for()
    assert page.locator(".chronicler-badge", has_text="edited by you").count() == 0


LISE = "Ann told Seraphina about her sister Lise."


def _summarising(body: dict[str, Any]) -> str:
    """A model whose chunk summary (alone, or the "summary" section of a part's call, MJ1) says LISE."""
    if task_of(body) != "part_notes":
        return json.dumps({"summary": LISE, "quotes": []})
    sections = sections_of(body["messages"][0]["content"])
    return json.dumps({key: {"summary": LISE, "quotes": []} if task == "chunk_summary" else EMPTY[task]
                       for key, task in sections.items()})


def test_rv3_jobs_line_shows_a_failure_and_retries_it(st: STPage, fake, st_server, tmp_path: Path) -> None:
    """rule RV3 (background jobs): when the sidecar's model fails, the panel's status line shows the
    failed jobs and the last error; "Retry failed" sends them back to the queue, and once the model
    answers the summaries are written."""
    data = tmp_path / "data"
    data.mkdir()
    (data / "config.toml").write_text(
        f'llm_mode = "openai"\nllm_url = "{fake.url}"\nllm_model = "fake-model"\n'
        "llm_retries = 0\njob_max_attempts = 1\n"
        "part_wait_seconds = 0\n")  # parts (MJ1) read as soon as messages leave the live window
    side = Sidecar(data, origins=[st_server.origin])
    side.start()
    try:
        if not has_route(side, "GET", "/v1/jobs"):
            pytest.skip("GET /v1/jobs is not in this sidecar yet")
        fake.fail_next(1000, 500)
        st.flush_chat()
        st.reload()  # a fresh page: its sync has never seen this sidecar, so it sends the whole chat
        configure_chronicler(st, sidecarUrl=side.url, token=side.token)
        st.select_character("Seraphina")
        add_chat_messages(st, 64)  # more than the live window (50), whatever ran before
        chat_id = st.evaluate("() => SillyTavern.getContext().getCurrentChatId()")

        def failed() -> list[dict]:
            status, body = side.request("GET", "/v1/jobs?state=failed")
            assert status == 200, body
            return body["jobs"]

        wait_until(failed, timeout=90, what="a failed job")
        page = st.page
        open_panel(st)
        line = page.locator(".chronicler-jobs")
        page.wait_for_function("() => /[1-9]\\d* failed/.test(document.querySelector('.chronicler-jobs').textContent)")
        assert "Last error:" in line.inner_text() and "500" in line.inner_text()
        panel_shot(st, "jobs-failed-desktop")

        fake.reset()
        fake.responder = _summarising
        line.get_by_role("button", name="Retry failed").click()
        wait_until(lambda: written(summaries_of(side, chat_id)), timeout=90, what="summaries after the retry")
        assert any(s["text"] == LISE for s in written(summaries_of(side, chat_id)))
    finally:
        fake.reset()
        side.stop()


# --- the Lore tab ----------------------------------------------------------------------------
WORLD_INFO = {
    "name": "Eldoria",
    "entries": {
        "0": {"uid": 0, "key": ["eldoria", "forest"], "keysecondary": [], "comment": "Eldoria",
              "content": "Eldoria is the forest Seraphina guards.", "constant": False, "disable": False,
              "position": 0, "selective": True, "depth": 4},
        "1": {"uid": 1, "key": ["ferry"], "keysecondary": [], "comment": XSS,
              "content": "The ferryman takes silver, never gold.", "constant": True, "disable": False,
              "position": 0},
    },
}


def lore_entries(sidecar: Sidecar) -> list[dict]:
    status, body = sidecar.request("GET", "/v1/lore")
    assert status == 200, body
    return body["lore"]


def test_sw7_lore_tab_adds_edits_imports_and_deletes(st: STPage, sidecar: Sidecar, seraphina: dict, tmp_path: Path) -> None:
    """rule SW7 (and SW9b): the Lore tab adds an entry with triggers and who knows it, edits it,
    imports a SillyTavern World Info file (titles shown as text, never HTML), filters, and deletes."""
    if not has_route(sidecar, "GET", "/v1/lore"):
        pytest.skip("the lore routes are not in this sidecar yet")
    for entry in lore_entries(sidecar):
        assert sidecar.request("DELETE", f"/v1/lore/{q(entry['id'])}")[0] == 200
    avatar = seraphina["avatar"]
    page = st.page
    open_panel(st, "lore")
    page.get_by_text("No lore yet").wait_for()
    page.get_by_role("button", name="Add entry").click()
    form = page.locator(".chronicler-lore .chronicler-form")
    form.get_by_label("Title").fill("The old mill")
    form.get_by_label("Triggers").fill("mill, miller, Mill")
    form.get_by_label("Text", exact=True).fill("The old mill by the river has stood empty since the flood.")
    form.get_by_label("Add a character who knows this entry").select_option(avatar)
    page.locator(".chronicler-lore .chronicler-form .menu_button", has_text="Add entry").click()
    page.locator(".chronicler-lore-entry", has_text="The old mill").wait_for()
    [entry] = lore_entries(sidecar)
    assert (entry["title"], entry["triggers"], entry["known_by"], entry["source"]) == (
        "The old mill", ["mill", "miller"], [avatar], "user")

    page.get_by_role("button", name="Edit lore entry The old mill").click()
    form.get_by_label("Title").fill("The drowned mill")
    page.locator(".chronicler-lore .chronicler-form .menu_button", has_text="Save entry").click()
    page.locator(".chronicler-lore-entry", has_text="The drowned mill").wait_for()
    assert lore_entries(sidecar)[0]["title"] == "The drowned mill"

    world = tmp_path / "eldoria.json"
    world.write_text(json.dumps(WORLD_INFO))
    page.locator(".chronicler-lore input[type=file]").set_input_files(str(world))
    page.wait_for_function("() => /Imported 2 entries from eldoria.json/.test(document.querySelector('.chronicler-lore .chronicler-message').textContent)")
    assert len(lore_entries(sidecar)) == 3
    titles = page.locator(".chronicler-lore-title").all_inner_texts()
    assert XSS in titles
    assert page.locator(".chronicler-lore img").count() == 0
    assert page.evaluate("() => window.__chroniclerXss") is None
    panel_shot(st, "lore-desktop-imported")
    page.get_by_label("Filter lore by text or trigger").fill("ELDORIA")
    page.wait_for_function("() => document.querySelectorAll('.chronicler-lore-entry').length === 1")
    page.get_by_label("Filter lore by text or trigger").fill("")
    page.get_by_role("button", name="Delete lore entry The drowned mill").click()
    confirm_popup(st, "Delete this lore entry?").get_by_text("Delete", exact=True).click()
    page.wait_for_function("() => document.querySelectorAll('.chronicler-lore-entry').length === 2")
    assert "The drowned mill" not in [e["title"] for e in lore_entries(sidecar)]


def test_sw7d_the_lore_tab_switches_review_of_lore_grown_from_play(st: STPage, sidecar: Sidecar, seraphina: dict) -> None:
    """rule SW7d: the Lore tab's "Lore grown from play" choice shows the store's setting and changes
    it through PATCH /v1/settings, saying what it means; the setting is put back after."""
    status, before = sidecar.request("GET", "/v1/settings")
    assert status == 200 and before["settings"]["lore_growth_review"] == "apply", before
    page = st.page
    try:
        open_panel(st, "lore")
        picker = page.get_by_label("Lore grown from play")
        picker.wait_for()
        assert picker.input_value() == "apply"
        picker.select_option("review")
        page.get_by_text("nothing reaches the prompt until you accept it").wait_for()
        assert sidecar.request("GET", "/v1/settings")[1]["settings"]["lore_growth_review"] == "review"
        close_panel(st)
        open_panel(st, "lore")
        assert page.get_by_label("Lore grown from play").input_value() == "review"
    finally:
        assert sidecar.request("PATCH", "/v1/settings", {"lore_growth_review": "apply"})[0] == 200
