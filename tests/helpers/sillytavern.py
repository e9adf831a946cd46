"""Real SillyTavern for end-to-end tests: install it, prepare a data root, run it, drive its page.

Nothing here is a stand-in: the `sillytavern` package comes from npm (cached outside the repository),
runs as its own Node process on loopback, and is driven by Debian's Chromium through Playwright.
The only fake is the paid model (`tests/helpers/fakellm.py`), which SillyTavern reaches as a "Custom"
OpenAI-compatible Chat Completion source.

Facts used here are in `shared/SILLYTAVERN.md` (checked against the 1.19.0 package source).
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import json
import os
import shutil
import socket
import struct
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

ST_VERSION = "1.19.0"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",  # we run as root
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
EXTENSION_FOLDER = "Chronicler"
REPO_ROOT = Path(__file__).resolve().parents[2]
GROUP_NAME = "Forest Party"  # the group chat the e2e fixtures add to SillyTavern
ARTIFACTS = REPO_ROOT / "test-artifacts" / "e2e"


def cache_dir() -> Path:
    """Where the npm install and the compiled front end live between runs (outside the repo)."""
    return Path(os.environ.get("CHRONICLER_E2E_CACHE") or Path.home() / ".cache" / "chronicler-e2e")


def free_port() -> int:
    """A loopback port nobody listens on right now (the OS picks it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    """Serialise installs between test processes that share the cache."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def ensure_sillytavern(version: str = ST_VERSION, cache: Path | None = None) -> Path:
    """Install `sillytavern@version` from npm into the cache once; return the package folder.

    A marker file is written only after a complete install, so an interrupted install is redone.
    """
    root = (cache or cache_dir()) / f"st-{version}"
    package = root / "node_modules" / "sillytavern"
    marker = root / ".installed"
    with _file_lock(root.parent / f"st-{version}.lock"):
        if marker.exists() and (package / "server.js").exists():
            return package
        root.mkdir(parents=True, exist_ok=True)
        cmd = ["npm", "install", "--no-audit", "--no-fund", "--loglevel=error",
               "--prefix", str(root), f"sillytavern@{version}"]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        if proc.returncode != 0 or not (package / "server.js").exists():
            raise RuntimeError(f"npm install sillytavern@{version} failed:\n{proc.stdout}\n{proc.stderr}")
        marker.write_text(version)
    return package


def st_settings(package: Path, llm_url: str, extension_settings: dict[str, Any] | None = None,
                stream: bool = True) -> dict[str, Any]:
    """The package's default settings.json, pointed at our model as a Custom Chat Completion source."""
    settings = json.loads((package / "default" / "content" / "settings.json").read_text())
    settings["firstRun"] = False  # else a name popup blocks the page
    settings["main_api"] = "openai"
    settings.setdefault("power_user", {})["auto_connect"] = True
    oai = settings.setdefault("oai_settings", {})
    oai.update({
        "chat_completion_source": "custom",
        "custom_url": llm_url,  # ends with /v1, no trailing slash
        "custom_model": "fake-model",
        "stream_openai": stream,
    })
    ext = settings.setdefault("extension_settings", {})
    for key, value in (extension_settings or {}).items():
        ext[key] = value
    return settings


def prepare_data_root(root: Path, package: Path, llm_url: str, extension_src: Path | None,
                      extension_settings: dict[str, Any] | None = None, stream: bool = True) -> None:
    """Lay out a fresh SillyTavern data root: settings, our extension, a shared front-end build cache.

    SillyTavern compiles its front-end bundle into `<dataRoot>/_webpack` (about 25 s the first time);
    linking that folder to the cache makes later runs start in a few seconds. With `extension_src`
    None the extension is not copied (a test installs it with `chronicler install-extension`).
    """
    user = root / "default-user"
    user.mkdir(parents=True, exist_ok=True)
    settings = st_settings(package, llm_url, extension_settings, stream)
    (user / "settings.json").write_text(json.dumps(settings, indent=2))
    if extension_src is not None:
        install_extension(root, extension_src)
    webpack = package.parent.parent / "webpack-cache"
    webpack.mkdir(exist_ok=True)
    link = root / "_webpack"
    if not link.exists():
        link.symlink_to(webpack, target_is_directory=True)


def _png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def card_png(card: dict[str, Any]) -> bytes:
    """A 1x1 PNG character card: SillyTavern reads the card from its `chara` tEXt chunk (base64 JSON)."""
    header = struct.pack(">IIBBBBB", 1, 1, 8, 2, 0, 0, 0)  # 1x1, 8-bit RGB
    pixels = zlib.compress(b"\x00\x80\x80\x80")
    text = b"chara\x00" + base64.b64encode(json.dumps(card).encode())
    return (b"\x89PNG\r\n\x1a\n" + _png_chunk(b"IHDR", header) + _png_chunk(b"tEXt", text)
            + _png_chunk(b"IDAT", pixels) + _png_chunk(b"IEND", b""))


def add_character(root: Path, name: str, description: str, first_mes: str, user: str = "default-user") -> str:
    """Put a character card into a data root (before SillyTavern starts); returns its avatar file name."""
    fields = {"name": name, "description": description, "personality": "", "scenario": "",
              "first_mes": first_mes, "mes_example": ""}
    card = {**fields, "spec": "chara_card_v2", "spec_version": "2.0",
            "data": {**fields, "creator_notes": "", "system_prompt": "", "post_history_instructions": "",
                     "alternate_greetings": [], "tags": [], "creator": "", "character_version": "",
                     "extensions": {}}}
    folder = root / user / "characters"
    folder.mkdir(parents=True, exist_ok=True)
    avatar = f"{name}.png"
    (folder / avatar).write_bytes(card_png(card))
    (root / user / "chats" / name).mkdir(parents=True, exist_ok=True)
    return avatar


def add_group(root: Path, name: str, members: list[str], activation_strategy: int = 1,
              user: str = "default-user") -> str:
    """Put a group into a data root (activation 1 = LIST: every member answers, in order); returns its id."""
    group_id = str(zlib.crc32(name.encode()))
    group = {"id": group_id, "name": name, "members": members, "avatar_url": "", "allow_self_responses": False,
             "activation_strategy": activation_strategy, "generation_mode": 0, "disabled_members": [],
             "fav": False, "chat_id": f"{name} chat", "chats": [f"{name} chat"], "auto_mode_delay": 5,
             "generation_mode_join_prefix": "", "generation_mode_join_suffix": ""}
    folder = root / user / "groups"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{group_id}.json").write_text(json.dumps(group, indent=2))
    return group_id


def install_extension(root: Path, extension_src: Path, user: str = "default-user",
                      folder: str = EXTENSION_FOLDER) -> Path:
    """Copy the extension where SillyTavern serves third-party extensions from (enabled by default)."""
    dest = root / user / "extensions" / folder
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(extension_src, dest)
    return dest


def _get(url: str, timeout: float = 2.0) -> int:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status
    except urllib.error.HTTPError as err:
        return err.code


def quote_id(value: str) -> str:
    """An id (chat ids hold spaces and @) percent-encoded for a path."""
    return urllib.parse.quote(value, safe="")


def wait_until(predicate: Any, timeout: float = 15.0, what: str = "condition", interval: float = 0.1) -> Any:
    """Poll `predicate` until it returns something truthy (returned) or `timeout` seconds pass."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out waiting for {what}")


def terminate(proc: subprocess.Popen | None) -> None:
    """Stop a process we started: politely, then for good."""
    if proc and proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def wait_http(url: str, timeout: float, proc: subprocess.Popen | None = None, log: Path | None = None) -> None:
    """Wait until `url` answers 200; fail early (with the log's tail) if the process died."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            tail = log.read_text()[-3000:] if log and log.exists() else ""
            raise RuntimeError(f"process exited with {proc.returncode} before {url} answered:\n{tail}")
        try:
            if _get(url) == 200:
                return
        except (OSError, urllib.error.URLError):
            pass
        time.sleep(0.25)
    tail = log.read_text()[-3000:] if log and log.exists() else ""
    raise TimeoutError(f"{url} did not answer within {timeout}s:\n{tail}")


@dataclass
class SillyTavernServer:
    """One SillyTavern Node process on loopback with its own data root."""

    package: Path
    data_root: Path
    port: int = field(default_factory=free_port)
    log_path: Path | None = None
    proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def origin(self) -> str:
        return self.url

    def start(self, timeout: float = 180.0, ready: str | None = None) -> "SillyTavernServer":
        """Start it and wait until `ready` (default: its page) answers 200."""
        root = str(self.data_root.resolve())
        cmd = ["node", "server.js", "--port", str(self.port), "--listen", "false",
               "--browserLaunchEnabled", "false", "--dataRoot", root,
               "--configPath", str(Path(root) / "config.yaml")]
        self.log_path = self.log_path or (self.data_root / "sillytavern.log")
        log = open(self.log_path, "w")
        self.proc = subprocess.Popen(cmd, cwd=self.package, stdout=log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True)
        log.close()
        wait_http(ready or self.url + "/", timeout, self.proc, self.log_path)
        return self

    def stop(self) -> None:
        terminate(self.proc)


class STPage:
    """A SillyTavern browser page with the few moves our tests need.

    Every move waits on a real condition of the page (never a blind sleep) and can leave a
    screenshot under test-artifacts/e2e/<test>/.
    """

    def __init__(self, page: Any, base_url: str, artifacts: Path) -> None:
        self.page = page
        self.base_url = base_url
        self.artifacts = artifacts
        self.console: list[str] = []
        self._shots = 0
        page.on("console", lambda msg: self.console.append(f"{msg.type}: {msg.text}"))
        page.on("pageerror", lambda err: self.console.append(f"pageerror: {err}"))

    # --- loading -------------------------------------------------------------------------------
    def open(self, timeout_ms: int = 60_000) -> "STPage":
        """Load the app and wait until it is ready to chat (context, APP_READY, send button)."""
        self.page.goto(self.base_url + "/", wait_until="domcontentloaded", timeout=timeout_ms)
        self.page.wait_for_function("() => !!window.SillyTavern?.getContext?.()?.eventSource",
                                    timeout=timeout_ms)
        # APP_READY re-fires for late listeners, so once() resolves even when it already happened.
        self.page.evaluate("""() => new Promise(resolve => {
            const ctx = SillyTavern.getContext();
            ctx.eventSource.once(ctx.eventTypes.APP_READY, resolve);
        })""")
        self.page.locator("#send_but").wait_for(state="visible", timeout=timeout_ms)
        return self

    def reload(self) -> "STPage":
        """Save the chat, then load the page again."""
        self.flush_chat()
        return self.open()

    def flush_chat(self) -> None:
        """Wait until the chat is saved. SillyTavern's last save after a reply may still be in
        flight when the page looks idle; its own saveChat waits for a running save, then saves."""
        self.evaluate("async () => { const c = SillyTavern.getContext(); if (c.getCurrentChatId()) await c.saveChat(); }")

    def shot(self, name: str) -> Path:
        """Save a full-window screenshot, numbered in the order taken."""
        self._shots += 1
        self.artifacts.mkdir(parents=True, exist_ok=True)
        path = self.artifacts / f"{self._shots:02d}-{name}.png"
        self.page.screenshot(path=str(path))
        return path

    def evaluate(self, script: str, arg: Any = None) -> Any:
        return self.page.evaluate(script, arg)

    # --- characters and chats ------------------------------------------------------------------
    def select_character(self, name: str) -> None:
        """Open the character list, click the card named `name`, close the drawer again."""
        page = self.page
        page.locator("#rightNavDrawerIcon").click()
        card = page.locator("#rm_print_characters_block .character_select").filter(
            has=page.locator(".ch_name", has_text=name)).first
        # The list may be redrawn just after load (a click on the old element is lost): click again
        # until the character is open.
        deadline = time.monotonic() + 30
        while True:
            card.wait_for(state="visible", timeout=30_000)
            card.click()
            try:
                page.wait_for_function("name => SillyTavern.getContext().name2 === name", arg=name, timeout=3_000)
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise
        page.locator("#chat .mes").first.wait_for(state="visible", timeout=30_000)
        if page.locator("#right-nav-panel").is_visible():
            page.locator("#rightNavDrawerIcon").click()
        self.wait_idle()

    def select_group(self, name: str) -> None:
        """Open the character list, click the group named `name`, close the drawer again."""
        page = self.page
        page.locator("#rightNavDrawerIcon").click()
        card = page.locator("#rm_print_characters_block .group_select").filter(
            has=page.locator(".ch_name", has_text=name)).first
        card.wait_for(state="visible", timeout=30_000)
        card.click()
        page.wait_for_function("name => { const c = SillyTavern.getContext();"
                               " return c.groupId && c.groups.find(g => g.id == c.groupId)?.name === name; }",
                               arg=name, timeout=30_000)
        if page.locator("#right-nav-panel").is_visible():
            page.locator("#rightNavDrawerIcon").click()
        self.wait_idle()

    def chat_file(self, data_root: Path) -> Path:
        """The .jsonl file SillyTavern saves the current (one-character) chat to."""
        folder, chat_id = self.evaluate("""() => { const c = SillyTavern.getContext();
            return [c.characters[c.characterId].avatar.replace(/\\.[^.]+$/, ''), c.getCurrentChatId()]; }""")
        return data_root / "default-user" / "chats" / folder / f"{chat_id}.jsonl"

    def chat_length(self) -> int:
        return self.evaluate("() => SillyTavern.getContext().chat.length")

    def messages(self) -> list[dict[str, Any]]:
        """The live chat as SillyTavern holds it (name, is_user, mes, extra...)."""
        return self.evaluate("() => structuredClone(SillyTavern.getContext().chat)")

    # --- generation ----------------------------------------------------------------------------
    def is_generating(self) -> bool:
        return self.evaluate("() => document.body.dataset.generating === 'true'")

    def wait_idle(self, timeout_ms: int = 30_000) -> None:
        """Wait until no generation runs and the send button is back."""
        self.page.wait_for_function("() => document.body.dataset.generating !== 'true'", timeout=timeout_ms)
        self.page.locator("#send_but").wait_for(state="visible", timeout=timeout_ms)

    def run_command(self, text: str) -> None:
        """Type a slash command and send it; commands add no chat message, so wait for the box to empty."""
        self.wait_idle()
        self.page.locator("#send_textarea").fill(text)
        self.page.locator("#send_but").click()
        self.page.wait_for_function("() => document.querySelector('#send_textarea').value === ''", timeout=15_000)

    def send(self, text: str, timeout_ms: int = 30_000) -> str:
        """Send a user message and wait for the reply; return the reply's text."""
        before = self.submit(text, timeout_ms)
        # The user's message, then the reply (two new messages), then idle.
        self.page.wait_for_function("n => SillyTavern.getContext().chat.length >= n + 2", arg=before,
                                    timeout=timeout_ms)
        self.wait_idle(timeout_ms)
        return self.last_message_text()

    def submit(self, text: str, timeout_ms: int = 30_000) -> int:
        """Type and send a message without waiting for a reply; return the chat length before.

        For a few hundred ms after a reply the send button ignores clicks silently, so: click,
        wait for the textarea to empty, and click again only while it still holds our text
        (it never sends twice: a taken message empties the textarea).
        """
        page = self.page
        self.wait_idle(timeout_ms)
        before = self.chat_length()
        box = page.locator("#send_textarea")
        box.fill(text)
        deadline = time.monotonic() + timeout_ms / 1000
        while box.input_value() == text:
            if time.monotonic() > deadline:
                raise TimeoutError(f"SillyTavern never took the message {text!r}")
            page.locator("#send_but").click()
            with contextlib.suppress(Exception):
                page.wait_for_function("() => document.querySelector('#send_textarea').value === ''",
                                       timeout=1500)
        page.wait_for_function("n => SillyTavern.getContext().chat.length >= n + 1", arg=before,
                               timeout=timeout_ms)
        return before

    def last_message_text(self) -> str:
        return self.page.locator("#chat .mes.last_mes .mes_text").inner_text()

    def swipe_right(self, timeout_ms: int = 30_000) -> str:
        """Swipe the last message to the right (a new generation); return the new text."""
        page = self.page
        self.wait_idle(timeout_ms)
        last = page.locator("#chat .mes.last_mes")
        swipes = self.evaluate("() => SillyTavern.getContext().chat.at(-1).swipes?.length ?? 1")
        last.hover()
        last.locator(".swipe_right").click()
        page.wait_for_function(
            "n => (SillyTavern.getContext().chat.at(-1).swipes?.length ?? 1) > n", arg=swipes,
            timeout=timeout_ms)
        self.wait_idle(timeout_ms)
        return self.last_message_text()

    def regenerate(self, timeout_ms: int = 30_000) -> str:
        """Regenerate the last reply through the options menu; return the new reply's text."""
        page = self.page
        self.wait_idle(timeout_ms)
        old = self.evaluate("() => SillyTavern.getContext().chat.at(-1).extra?.chronicler_id ?? null")
        page.locator("#options_button").click()
        page.locator("#option_regenerate").click()
        # The old reply is cut and a new one (a new message) takes its place.
        page.wait_for_function("""old => {
            const last = SillyTavern.getContext().chat.at(-1);
            return !last.is_user && (last.extra?.chronicler_id ?? null) !== old;
        }""", arg=old, timeout=timeout_ms)
        self.wait_idle(timeout_ms)
        return self.last_message_text()

    def swipe_counter(self) -> str:
        raw = self.page.locator("#chat .mes.last_mes .swipes-counter").first.inner_text()
        return raw.replace("\u200b", "").strip()

    # --- extensions ----------------------------------------------------------------------------
    def open_extensions(self) -> None:
        """Open the Extensions drawer (the puzzle-piece icon) if it is closed."""
        page = self.page
        panel = page.locator("#extensions_settings")
        if not panel.is_visible():
            page.locator("#extensions-settings-button .drawer-toggle").click()
        panel.wait_for(state="visible", timeout=10_000)
        self._wait_stable("#extensions-settings-button .drawer-content")

    def _wait_stable(self, selector: str) -> None:
        """Wait until an element's size stops changing (drawers slide open)."""
        self.page.wait_for_function("""sel => new Promise(resolve => {
            const el = document.querySelector(sel);
            let last = -1, same = 0;
            const tick = () => {
                const h = el ? el.getBoundingClientRect().height : 0;
                same = (h === last && h > 0) ? same + 1 : 0;
                last = h;
                if (same >= 5) resolve(true); else requestAnimationFrame(tick);
            };
            tick();
        })""", arg=selector, timeout=10_000)

    def open_chronicler_settings(self) -> Any:
        """Open the Extensions drawer and our own settings drawer in it; return its locator."""
        self.open_extensions()
        root = self.page.locator("#chronicler_settings")
        content = root.locator(".inline-drawer-content").first
        if not content.is_visible():
            root.locator(".inline-drawer-toggle").first.click()
        content.wait_for(state="visible", timeout=10_000)
        self._wait_stable("#chronicler_settings .inline-drawer-content")
        root.scroll_into_view_if_needed()
        return root

    def close_extensions(self) -> None:
        if self.page.locator("#extensions_settings").is_visible():
            self.page.locator("#extensions-settings-button .drawer-toggle").click()

    def toasts(self) -> list[str]:
        """Texts of the toasts on screen now."""
        return self.page.locator("#toast-container .toast").all_inner_texts()

    def record_toasts(self) -> None:
        """From now on, remember every toast that appears (they fade after a few seconds)."""
        self.evaluate("""() => {
            window.__toastLog = [];
            const seen = new WeakSet();
            const note = node => {
                if (node.nodeType === 1 && node.classList.contains('toast') && !seen.has(node)) {
                    seen.add(node);
                    window.__toastLog.push(node.innerText);
                }
            };
            new MutationObserver(records => {
                for (const r of records) r.addedNodes.forEach(n => {
                    note(n);
                    if (n.nodeType === 1) n.querySelectorAll('.toast').forEach(note);
                });
            }).observe(document.body, { childList: true, subtree: true });
        }""")

    def recorded_toasts(self) -> list[str]:
        """Toasts seen since record_toasts()."""
        return self.evaluate("() => window.__toastLog ?? []")


def save_settings(st: STPage) -> None:
    """Save SillyTavern's settings now and wait until the server has them (SETTINGS_UPDATED)."""
    st.evaluate("""() => new Promise(resolve => {
        const ctx = SillyTavern.getContext();
        ctx.eventSource.once(ctx.eventTypes.SETTINGS_UPDATED, resolve);
        ctx.saveSettingsDebounced();
    })""")


def configure_chronicler(st: STPage, **values: Any) -> None:
    """Change the extension's stored settings in the running page (it reads them on every use)."""
    st.evaluate("""values => {
        const ctx = SillyTavern.getContext();
        Object.assign(ctx.extensionSettings.chronicler ??= {}, values);
        ctx.saveSettingsDebounced();
    }""", values)
