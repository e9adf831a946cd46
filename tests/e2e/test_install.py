"""`chronicler install-extension` for real: a fresh SillyTavern data root, the command run as a user
runs it, a sidecar started with no environment (it reads the token and the allowed origins the
command left in its data dir), and the page connects with nothing pasted (rule DC2, RV17)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest

from tests.helpers.fakellm import FakeLLM
from tests.helpers.sidecar import Sidecar
from tests.helpers.sillytavern import REPO_ROOT, SillyTavernServer, STPage, free_port, prepare_data_root


@pytest.fixture
def installed(st_package: Path, fake: FakeLLM, tmp_path: Path) -> Iterator[tuple[SillyTavernServer, Sidecar, str]]:
    root = tmp_path / "st-data"
    prepare_data_root(root, st_package, fake.url, extension_src=None)
    st_port = free_port()
    (root / "config.yaml").write_text(f"port: {st_port}\nlisten: false\n")
    side_dir = tmp_path / "sidecar"
    side_dir.mkdir()
    side_port = free_port()
    (side_dir / "config.toml").write_text(f"port = {side_port}\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHRONICLER_")}
    done = subprocess.run([sys.executable, "-m", "server_plugin.cli", "install-extension", "--data-root", str(root),
                           "--data-dir", str(side_dir)], cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    server = SillyTavernServer(st_package, root, port=st_port).start()
    side = Sidecar(side_dir, origins=[], port=side_port, configure_by_env=False).start()
    try:
        yield server, side, done.stdout
    finally:
        side.stop()
        server.stop()


def test_dc2_install_extension_then_reload_and_it_connects_with_nothing_pasted(
        installed: tuple[SillyTavernServer, Sidecar, str], browser: object, request: pytest.FixtureRequest) -> None:
    server, side, output = installed
    assert "reload SillyTavern's page" in output
    assert f"http://127.0.0.1:{server.port}" in output, output
    context = browser.new_context(viewport={"width": 1280, "height": 900})  # type: ignore[attr-defined]
    st = STPage(context.new_page(), server.url, REPO_ROOT / "test-artifacts" / "e2e" / request.node.name)
    try:
        st.open()
        stored = st.evaluate("() => SillyTavern.getContext().extensionSettings.chronicler")
        token = (side.data_dir / "token").read_text().strip()
        assert stored["sidecarUrl"] == side.url and stored["token"] == token
        st.open_chronicler_settings()
        st.page.locator("#chronicler_test").click()
        st.page.wait_for_function("() => /Connected|not|refused|No answer/.test("
                                  "document.querySelector('#chronicler_test_result').textContent)")
        result = st.page.locator("#chronicler_test_result").inner_text()
        st.shot("connected-after-install")
        assert "Connected to Chronicler" in result, result
    finally:
        context.close()
