"""The bearer token is compared in constant time (rules OP6, RV17)."""

from __future__ import annotations

from pathlib import Path

import pytest


def test_token_comparison_uses_hmac_compare_digest(monkeypatch: pytest.MonkeyPatch) -> None:
    """rule RV17: the bearer token is compared in constant time (hmac.compare_digest), so its
    characters cannot be guessed one by one from response times."""
    from server_plugin.api import security

    calls: list[tuple[bytes, bytes]] = []
    real = security.hmac.compare_digest

    def spy(a: bytes, b: bytes) -> bool:
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(security.hmac, "compare_digest", spy)
    assert security.token_matches("Bearer right-token", "right-token") is True
    assert security.token_matches("Bearer wrong-token", "right-token") is False
    assert calls == [(b"right-token", b"right-token"), (b"wrong-token", b"right-token")]
    source = Path(security.__file__).read_text()
    assert "==" not in source[source.index("def token_matches"):source.index("# --- Host")]
