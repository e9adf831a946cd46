"""`chronicler install-extension --sillytavern ST_DIR`: the extension and the server plugin in one
command; enableServerPlugins switched on in config.yaml (and said); the global extensions folder
with user accounts; a server folder inside node_modules refused unless told."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml

from server_plugin import __version__, cli
from server_plugin.sillytavern import plugin_install

CONFIG = "# SillyTavern's config\nlisten: false\nport: 8123\n# plugins\nenableServerPlugins: false # off by default\nenableUserAccounts: {accounts}\n"


def st_dir(tmp_path: Path, accounts: bool = False, name: str = "SillyTavern") -> Path:
    st = tmp_path / name
    (st / "data" / "default-user" / "extensions").mkdir(parents=True)
    (st / "server.js").write_text("// SillyTavern\n")
    (st / "config.yaml").write_text(CONFIG.format(accounts=str(accounts).lower()))
    return st


def run(capsys, *args: str) -> tuple[int, str, str]:
    code = cli.main(["install-extension", *args])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_one_command_installs_extension_and_plugin_and_turns_plugins_on(tmp_path, capsys):
    st = st_dir(tmp_path)
    side = tmp_path / "side"
    code, out, err = run(capsys, "--sillytavern", str(st), "--data-dir", str(side))
    assert code == 0, err
    plugin = st / "plugins" / "chronicler"
    assert (plugin / "index.js").read_text() == (plugin_install.PLUGIN_SRC / "index.js").read_text()
    record = json.loads((plugin / "plugin.config.json").read_text())
    assert record["dataDir"] == str(side.resolve()) and record["version"] == __version__
    assert record["command"][-1] == "serve" and Path(record["command"][0]).parent == Path(sys.executable).parent
    text = (st / "config.yaml").read_text()
    assert yaml.safe_load(text)["enableServerPlugins"] is True
    assert "# SillyTavern's config" in text and "# plugins" in text and "port: 8123" in text  # the rest kept
    assert "enableServerPlugins: false -> true" in out and "restart SillyTavern" in out
    beside = st / "data" / "default-user" / "extensions" / "chronicler.config.json"
    assert json.loads(beside.read_text()) == {"mode": "plugin", "route": "/api/plugins/chronicler",
                                              "version": __version__}
    assert "token" not in beside.read_text()
    # Again: nothing left to change, said so; the plugin replaced in place.
    code, out, _ = run(capsys, "--sillytavern", str(st), "--data-dir", str(side))
    assert code == 0 and "already had enableServerPlugins: true" in out


def test_a_missing_key_is_added(tmp_path, capsys):
    st = st_dir(tmp_path)
    (st / "config.yaml").write_text("port: 8000")
    code, out, _ = run(capsys, "--sillytavern", str(st), "--data-dir", str(tmp_path / "side"))
    assert code == 0 and "enableServerPlugins: true (added)" in out
    assert yaml.safe_load((st / "config.yaml").read_text()) == {"port": 8000, "enableServerPlugins": True}


def test_with_user_accounts_the_extension_goes_to_the_global_folder(tmp_path, capsys):
    st = st_dir(tmp_path, accounts=True)
    code, out, err = run(capsys, "--sillytavern", str(st), "--data-dir", str(tmp_path / "side"))
    assert code == 0, err
    third_party = st / "public" / "scripts" / "extensions" / "third-party"
    assert (third_party / "Chronicler" / "manifest.json").is_file()
    assert json.loads((third_party / "chronicler.config.json").read_text())["mode"] == "plugin"
    assert not (st / "data" / "default-user" / "extensions" / "Chronicler").exists()


def test_no_plugin_keeps_the_direct_mode(tmp_path, capsys):
    st = st_dir(tmp_path)
    code, out, err = run(capsys, "--sillytavern", str(st), "--data-dir", str(tmp_path / "side"), "--no-plugin")
    assert code == 0, err
    assert not (st / "plugins").exists()
    assert yaml.safe_load((st / "config.yaml").read_text())["enableServerPlugins"] is False
    beside = json.loads((st / "data" / "default-user" / "extensions" / "chronicler.config.json").read_text())
    assert set(beside) == {"sidecarUrl", "token"}


def test_a_server_folder_inside_node_modules_is_refused_unless_told(tmp_path, capsys):
    st = st_dir(tmp_path / "node_modules", name="sillytavern")
    code, _, err = run(capsys, "--sillytavern", str(st), "--data-dir", str(tmp_path / "side"))
    assert code == 1 and "node_modules" in err and "--allow-node-modules" in err
    assert not (st / "plugins").exists() and "enableServerPlugins: false" in (st / "config.yaml").read_text()
    code, _, err = run(capsys, "--sillytavern", str(st), "--data-dir", str(tmp_path / "side"), "--allow-node-modules")
    assert code == 0, err
    assert (st / "plugins" / "chronicler" / "index.js").is_file()


def test_a_config_yaml_elsewhere_and_a_foreign_plugin_folder(tmp_path, capsys):
    st = st_dir(tmp_path)
    elsewhere = tmp_path / "conf" / "config.yaml"
    elsewhere.parent.mkdir()
    elsewhere.write_text("enableServerPlugins: false\n")
    (st / "config.yaml").unlink()
    code, out, err = run(capsys, "--sillytavern", str(st), "--st-config", str(elsewhere),
                         "--data-dir", str(tmp_path / "side"))
    assert code == 0, err
    assert yaml.safe_load(elsewhere.read_text())["enableServerPlugins"] is True
    foreign = st / "plugins" / "chronicler"
    (foreign / "package.json").write_text('{"name": "someone-else"}')
    code, _, err = run(capsys, "--sillytavern", str(st), "--st-config", str(elsewhere),
                       "--data-dir", str(tmp_path / "side"))
    assert code == 1 and "not Chronicler's plugin" in err


def test_the_plugin_needs_the_server_folder(tmp_path):
    from server_plugin.settings import load_settings
    from server_plugin.sillytavern.install import InstallError, install_extension

    with pytest.raises(InstallError, match="--sillytavern"):
        install_extension(load_settings({"data_dir": str(tmp_path / "s")}, environ={}),
                          data_root=tmp_path, plugin=True)
