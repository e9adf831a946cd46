"""Fixtures for end-to-end tests in real SillyTavern + Chromium (marker `e2e`).

One SillyTavern server, one fake model and one browser serve the whole session (a warm start is a
few seconds); every test gets a fresh page. Screenshots go to test-artifacts/e2e/<test name>/.

Without Chromium or Node the tests are skipped with the reason, except under CI (`CI` set), where
a missing piece is an error: CI must run them.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from typing import Iterator

import pytest

from tests.helpers.fakellm import FakeLLM
from tests.helpers.plugin_st import PluginST
from tests.helpers.sidecar import Sidecar, sidecar_available
from tests.helpers.sillytavern import (
    ARTIFACTS,
    CHROMIUM,
    CHROMIUM_ARGS,
    GROUP_NAME,
    REPO_ROOT,
    SillyTavernServer,
    STPage,
    add_character,
    add_group,
    configure_chronicler,
    ensure_sillytavern,
    free_port,
    prepare_data_root,
)

EXTENSION_SRC = REPO_ROOT / "extension"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test in this folder is an e2e test."""
    here = Path(__file__).parent
    for item in items:
        if Path(str(item.fspath)).is_relative_to(here):
            item.add_marker(pytest.mark.e2e)


def _missing_tools() -> list[str]:
    missing = [tool for tool in ("node", "npm") if shutil.which(tool) is None]
    if not Path(CHROMIUM).exists():
        missing.append(CHROMIUM)
    try:
        import playwright  # noqa: F401
    except ImportError:
        missing.append("playwright (pip)")
    return missing


@pytest.fixture(scope="session")
def e2e_tools() -> None:
    missing = _missing_tools()
    if missing:
        message = "e2e needs " + ", ".join(missing) + " (apt-get install -y chromium nodejs npm; pip install playwright)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)


@pytest.fixture(scope="session")
def st_package(e2e_tools: None) -> Path:
    """The sillytavern npm package folder (installed into the cache once)."""
    return ensure_sillytavern()


@pytest.fixture(scope="session")
def fake() -> Iterator[FakeLLM]:
    """The fake OpenAI-compatible model SillyTavern talks to."""
    with FakeLLM() as llm:
        yield llm


@pytest.fixture(scope="session")
def closed_port() -> int:
    """A loopback port with nobody listening: the extension's sidecar URL when no sidecar runs."""
    return free_port()


@pytest.fixture(scope="session")
def st_server(st_package: Path, fake: FakeLLM, closed_port: int,
              tmp_path_factory: pytest.TempPathFactory) -> Iterator[SillyTavernServer]:
    """SillyTavern running on loopback with a temporary data root and our extension installed."""
    root = tmp_path_factory.mktemp("st-data")
    prepare_data_root(root, st_package, fake.url, EXTENSION_SRC, extension_settings={
        "chronicler": {"sidecarUrl": f"http://127.0.0.1:{closed_port}", "token": ""},
    })
    # A second character and a group of both, for group-chat tests (RV5, SW9b).
    luke = add_character(root, "Luke", "LUKE-CARD: a quiet ranger of the northern woods.",
                         "*Luke nods from the shadows.* Evening.")
    add_group(root, GROUP_NAME, ["default_Seraphina.png", luke])
    # A character only the rename test touches (renaming changes its avatar file name).
    add_character(root, "Mira", "A herbalist of the valley.", "*Mira looks up from her herbs.* Yes?")
    server = SillyTavernServer(st_package, root)
    server.start()
    yield server
    server.stop()
    log = server.log_path
    if log and log.exists():
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        shutil.copy(log, ARTIFACTS / "sillytavern.log")


@pytest.fixture(scope="session")
def browser(e2e_tools: None) -> Iterator[object]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        yield chromium
        chromium.close()


def _artifact_dir(request: pytest.FixtureRequest) -> Path:
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", request.node.name)
    path = ARTIFACTS / name
    if path.exists():
        shutil.rmtree(path)
    return path


@pytest.fixture
def st(browser: object, st_server: SillyTavernServer, fake: FakeLLM, closed_port: int,
       request: pytest.FixtureRequest) -> Iterator[STPage]:
    """A fresh, ready SillyTavern page (desktop size); the fake model's log starts empty.

    SillyTavern saves its settings on its own, so whatever an earlier test configured may be stored:
    every test starts from the same state (no sidecar, no function calling) and changes it itself.
    """
    fake.reset()
    context = browser.new_context(viewport={"width": 1280, "height": 900})  # type: ignore[attr-defined]
    page = context.new_page()
    st_page = STPage(page, st_server.url, _artifact_dir(request))
    try:
        st_page.open()
        st_page.evaluate("() => { SillyTavern.getContext().chatCompletionSettings.function_calling = false; }")
        configure_chronicler(st_page, sidecarUrl=f"http://127.0.0.1:{closed_port}", token="", enabled=True,
                             tools=True, llmMode="sidecar")
        yield st_page
    finally:
        if st_page.console:
            st_page.artifacts.mkdir(parents=True, exist_ok=True)
            (st_page.artifacts / "console.log").write_text("\n".join(st_page.console))
        context.close()


@pytest.fixture(scope="session")
def sidecar(st_server: SillyTavernServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sidecar]:
    """The real sidecar process, allowing SillyTavern's origin (skipped until the CLI exists)."""
    if not sidecar_available():
        pytest.skip("server_plugin/cli.py is not there yet (the lead's foundation): no sidecar to start")
    side = Sidecar(tmp_path_factory.mktemp("sidecar") / "data", origins=[st_server.origin])
    side.start()
    yield side
    side.stop()


@pytest.fixture
def plugin_st(st_package: Path, fake: FakeLLM, tmp_path: Path) -> Iterator[PluginST]:
    """SillyTavern in a server folder of its own with the plugin installed by install-extension."""
    st = PluginST(st_package, fake, tmp_path)
    try:
        yield st
    finally:
        st.close()
