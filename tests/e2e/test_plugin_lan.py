"""A phone on the LAN: SillyTavern with the Chronicler plugin on one "machine", Chromium on another.

The test builds the LAN itself (tests/helpers/netns.py): two network namespaces joined by a veth pair,
10.213.7.1 (SillyTavern) and 10.213.7.2 (the phone), addresses only inside them, torn down after.
SillyTavern, installed with `chronicler install-extension`, listens on its LAN address with a
whitelist for the subnet; its plugin starts the sidecar on that namespace's loopback, and the fake
model listens there too. Chromium runs in the phone's namespace (Playwright starts it through a
wrapper that enters it), opens http://10.213.7.1:<port>/ and chats: the pinned memory reaches the
model's prompt. Every frame on the LAN is captured: no address but the two is ever contacted.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.fakellm import FakeLLM
from tests.helpers.netns import PHONE_ADDR, ST_ADDR, Capture, Lan, unavailable
from tests.helpers.plugin_st import PINNED, PluginST, keep, open_page
from tests.helpers.sillytavern import CHROMIUM, CHROMIUM_ARGS, configure_chronicler

# Chromium itself looks up accounts.google.com and android.clients.google.com at start (its Google
# services; none of our code): the phone resolves no names but the server's address, so those lookups
# are gone and the capture below still sees any address it tries.
PHONE_DNS = f"--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE {ST_ADDR}"


def test_a_phone_on_the_lan_chats_and_memory_reaches_the_model(st_package: Path, browser: Any, tmp_path: Path,
                                                                request: pytest.FixtureRequest) -> None:
    reason = unavailable()
    if reason:
        pytest.skip(reason)
    lan = Lan(os.getpid())
    capture: Capture | None = None
    fake: FakeLLM | None = None
    st: PluginST | None = None
    phone: Any = None
    try:
        lan.up()  # inside the try: a half-built LAN is torn down too
        capture = Capture(lan)
        # The model SillyTavern calls: on the server namespace's loopback (its socket is made there).
        fake = lan.call(lan.st, lambda: FakeLLM().start())
        st = PluginST(st_package, fake, tmp_path, lan=lan)
        assert st.url == f"http://{ST_ADDR}:{st.port}"
        assert "enableServerPlugins: false -> true" in st.install.stdout
        st.running()
        st.direct("POST", "/v1/memories", {"text": PINNED, "scope": "global", "pinned": True, "actor": "user"})
        wrapper = lan.wrapper(tmp_path / "bin", lan.phone, CHROMIUM)
        phone = browser.browser_type.launch(executable_path=str(wrapper), args=CHROMIUM_ARGS + [PHONE_DNS],
                                            headless=True)
        context, page, seen = open_page(phone, st, request.node.name)
        try:
            page.open()
            configure_chronicler(page, contextTimeoutMs=20000)  # the first query embedding on 2 busy cores
            page.select_character("Seraphina")
            reply = page.send("Where is my ship?")
            assert reply.startswith("Fake reply"), reply
            prompt = json.dumps(fake.completions()[-1]["messages"])
            assert PINNED in prompt, "the pinned memory did not reach the model from the phone"
            foreign = [u for u in seen if not u.startswith(st.url + "/") and not u.startswith("data:")]
            assert not foreign, f"the phone's page called another origin: {foreign[:5]}"
            assert any("/api/plugins/chronicler/v1/context" in u for u in seen)
            page.open_chronicler_settings()
            assert "through SillyTavern's Chronicler plugin" in page.page.locator("#chronicler_path").inner_text()
        finally:
            keep(page, seen)
            context.close()
        capture.close()
        frames = capture.frames
        assert ("ipv4", PHONE_ADDR, ST_ADDR) in frames, "the phone's traffic did not cross the LAN"
        assert not capture.foreign(), f"another address was contacted: {sorted(set(capture.foreign()))[:10]}"
    finally:
        if phone is not None:
            phone.close()
        if st is not None:
            st.close()
        if fake is not None:
            fake.stop()
        if capture is not None:
            capture.close()
        lan.down()
    assert not [ns for ns in (lan.st, lan.phone) if Path("/run/netns", ns).exists()], "a namespace was left"
