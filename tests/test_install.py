"""`chronicler install-extension`: the extension lands where SillyTavern loads it, the sidecar's URL
and token are written beside it, and SillyTavern's origins join the sidecar's allowlist (rule DC2:
the extension for a SillyTavern-style client; RV17: the token is what lets it in)."""

from __future__ import annotations

import json
import stat
import tomllib
from pathlib import Path

import pytest

from server_plugin import cli
from server_plugin.settings import load_settings
from server_plugin.sillytavern.install import (
    CONFIG_NAME,
    EXTENSION_SRC,
    InstallError,
    add_origins,
    install_extension,
    sidecar_url,
    st_origins,
)


def settings_for(data_dir: Path, **env: str):
    return load_settings({"data_dir": str(data_dir)}, environ=env)


def st_root(tmp_path: Path, port: int | None = 8123, where: str = "root") -> Path:
    """A SillyTavern data root as SillyTavern leaves it after its first start."""
    root = tmp_path / "st-data"
    (root / "default-user" / "extensions").mkdir(parents=True)
    if port is not None:
        target = root / "config.yaml" if where == "root" else tmp_path / "config.yaml"
        target.write_text(f"# SillyTavern\nlisten: false\nport: {port}\nssl:\n  enabled: false\n")
    return root


def test_dc2_copies_the_extension_and_writes_url_and_token_beside_it(tmp_path):
    """DC2: a new user has nothing to paste: the folder is copied and chronicler.config.json holds
    this sidecar's URL and token (0600, a secret), outside the extension folder."""
    root = st_root(tmp_path)
    side = tmp_path / "side"
    result = install_extension(settings_for(side, CHRONICLER_PORT="7712"), data_root=root)

    dest = root / "default-user" / "extensions" / "Chronicler"
    assert result.destination == dest and not dest.is_symlink()
    assert json.loads((dest / "manifest.json").read_text())["display_name"] == "Chronicler"
    assert (dest / "index.js").read_text() == (EXTENSION_SRC / "index.js").read_text()
    config = root / "default-user" / "extensions" / CONFIG_NAME
    token = (side / "token").read_text().strip()
    assert json.loads(config.read_text()) == {"sidecarUrl": "http://127.0.0.1:7712", "token": token}
    assert stat.S_IMODE(config.stat().st_mode) == 0o600
    assert not (dest / CONFIG_NAME).exists(), "never inside the folder (a linked folder is the repository)"


def test_dc2_adds_sillytaverns_origins_to_the_allowlist_keeping_the_existing_ones(tmp_path):
    """The browser page of SillyTavern on its configured port may call the sidecar afterwards; the
    default origins and anything else in config.toml stay."""
    root = st_root(tmp_path, port=8123, where="beside")
    side = tmp_path / "side"
    side.mkdir()
    (side / "config.toml").write_text("# my settings\nthreads = 4\n")
    result = install_extension(settings_for(side), data_root=root)
    assert result.origins_added == ["http://127.0.0.1:8123", "http://localhost:8123"]
    text = (side / "config.toml").read_text()
    assert "# my settings" in text
    parsed = tomllib.loads(text)
    assert parsed["threads"] == 4
    assert parsed["origins"] == ["http://127.0.0.1:8000", "http://localhost:8000",
                                 "http://127.0.0.1:8123", "http://localhost:8123"]
    assert load_settings({"data_dir": str(side)}, environ={}).origins == parsed["origins"]
    again = install_extension(settings_for(side), data_root=root)
    assert again.origins_added == [], "a second run adds nothing"


def test_dc2_origins_rewrite_keeps_a_custom_list_and_a_chronicler_table(tmp_path):
    path = tmp_path / "config.toml"
    path.write_text('threads = 2\norigins = [\n  "http://10.0.0.5:8000",  # tablet\n]\n')
    assert add_origins(path, ["http://127.0.0.1:9000"]) == ["http://127.0.0.1:9000"]
    assert tomllib.loads(path.read_text())["origins"] == ["http://10.0.0.5:8000", "http://127.0.0.1:9000"]
    table = tmp_path / "table.toml"
    table.write_text("[chronicler]\nport = 7799\n")
    add_origins(table, ["http://127.0.0.1:9000"])
    parsed = tomllib.loads(table.read_text())["chronicler"]
    assert parsed["port"] == 7799 and parsed["origins"][-1] == "http://127.0.0.1:9000"
    assert load_settings({"data_dir": str(tmp_path)}, environ={}).origins[-1] == "http://127.0.0.1:9000"


def test_dc2_install_folder_is_resolved_to_its_data_root(tmp_path):
    """--sillytavern ST_DIR: the data root is config.yaml's dataRoot (default ST_DIR/data)."""
    st_dir = tmp_path / "SillyTavern"
    (st_dir / "data" / "alice" / "extensions").mkdir(parents=True)
    (st_dir / "server.js").write_text("// SillyTavern\n")
    (st_dir / "config.yaml").write_text("port: 8010\nssl:\n  enabled: true\n")
    result = install_extension(settings_for(tmp_path / "side"), sillytavern=st_dir, user="alice")
    assert result.destination == st_dir / "data" / "alice" / "extensions" / "Chronicler"
    assert result.origins_added == ["https://127.0.0.1:8010", "https://localhost:8010"]

    custom = tmp_path / "elsewhere"
    (custom / "default-user").mkdir(parents=True)
    (st_dir / "config.yaml").write_text(f"dataRoot: {custom}\nport: 8000\n")
    result = install_extension(settings_for(tmp_path / "side"), sillytavern=st_dir)
    assert result.destination == custom / "default-user" / "extensions" / "Chronicler"


def test_dc2_link_mode_symlinks_and_a_rerun_replaces_an_earlier_install(tmp_path):
    root = st_root(tmp_path)
    side = settings_for(tmp_path / "side")
    install_extension(side, data_root=root)
    result = install_extension(side, data_root=root, link=True)
    assert result.destination.is_symlink()
    assert result.destination.resolve() == EXTENSION_SRC.resolve()
    install_extension(side, data_root=root)  # back to a copy
    assert not result.destination.is_symlink() and (result.destination / "index.js").is_file()


def test_dc2_refuses_to_replace_a_folder_that_is_not_ours(tmp_path):
    root = st_root(tmp_path)
    foreign = root / "default-user" / "extensions" / "Chronicler"
    foreign.mkdir()
    (foreign / "manifest.json").write_text('{"display_name": "Something else"}')
    with pytest.raises(InstallError, match="not a Chronicler install"):
        install_extension(settings_for(tmp_path / "side"), data_root=root)
    assert json.loads((foreign / "manifest.json").read_text())["display_name"] == "Something else"


def test_dc2_clear_errors_for_a_wrong_folder(tmp_path):
    with pytest.raises(InstallError, match="not a SillyTavern install folder"):
        install_extension(settings_for(tmp_path / "side"), sillytavern=tmp_path)
    with pytest.raises(InstallError, match="No SillyTavern user folder"):
        install_extension(settings_for(tmp_path / "side"), data_root=tmp_path / "empty")
    with pytest.raises(InstallError, match="port I cannot use"):
        st_origins({"port": "eighty"})


def test_dc2_without_config_yaml_the_install_still_works_and_says_what_to_add(tmp_path):
    root = st_root(tmp_path, port=None)
    result = install_extension(settings_for(tmp_path / "side"), data_root=root)
    assert result.destination.is_dir()
    assert result.origins_added == [] and "config.yaml was not found" in result.notes[0]


def test_dc2_sidecar_url_for_wildcard_binds_is_loopback(tmp_path):
    assert sidecar_url(settings_for(tmp_path, CHRONICLER_HOST="0.0.0.0")) == "http://127.0.0.1:7711"
    assert sidecar_url(settings_for(tmp_path, CHRONICLER_HOST="::1")) == "http://[::1]:7711"


def test_dc2_the_command_prints_what_it_did_and_what_to_do_next(tmp_path, capsys, monkeypatch):
    for name in ("CHRONICLER_TOKEN", "CHRONICLER_ORIGINS", "CHRONICLER_PORT", "CHRONICLER_HOST"):
        monkeypatch.delenv(name, raising=False)
    root = st_root(tmp_path)
    code = cli.main(["install-extension", "--data-root", str(root), "--data-dir", str(tmp_path / "side")])
    out = capsys.readouterr().out
    assert code == 0
    assert "Copied the extension to" in out and "reload SillyTavern's page" in out
    assert "http://127.0.0.1:8123" in out
    assert cli.main(["install-extension", "--data-root", str(tmp_path / "nope"),
                     "--data-dir", str(tmp_path / "side")]) == 1
    assert "No SillyTavern user folder" in capsys.readouterr().err
