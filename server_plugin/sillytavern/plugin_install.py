"""Install the SillyTavern server plugin (`st_plugin/`) and switch SillyTavern's plugins on.

The plugin goes to `<server folder>/plugins/chronicler/`, with `plugin.config.json` beside its code:
the command that starts this checkout's sidecar (its virtual environment's `chronicler serve`; on
Windows under `Scripts\\`), the sidecar's data folder and log file. `config.yaml` gets
`enableServerPlugins: true`, changed in place (one line; every other line and comment kept).
An npm install of SillyTavern (a server folder inside `node_modules`) is refused unless the person
says to go on: the next `npm install` or upgrade replaces that folder, plugin and all.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
from pathlib import Path

from .. import __version__

PLUGIN_SRC = Path(__file__).resolve().parents[2] / "st_plugin"
PLUGIN_FOLDER = "chronicler"
PLUGIN_CONFIG = "plugin.config.json"
PLUGIN_PACKAGE = "chronicler-sillytavern-plugin"
ROUTE = "/api/plugins/chronicler"
GLOBAL_EXTENSIONS = Path("public") / "scripts" / "extensions" / "third-party"
_ENABLE = re.compile(r"^enableServerPlugins[ \t]*:[ \t]*([^\s#]*)[ \t]*(#.*)?$", re.MULTILINE)


class PluginInstallError(Exception):
    """The plugin cannot be installed; the message says why and what to do."""


def check_server_folder(st_dir: Path, allow_node_modules: bool) -> None:
    """Refuse a server folder an upgrade would wipe (inside node_modules), unless allowed."""
    if "node_modules" in st_dir.parts and not allow_node_modules:
        raise PluginInstallError(
            f"{st_dir} is inside node_modules (an npm install of SillyTavern): the next npm install or "
            "upgrade replaces that folder and the plugin with it. Install SillyTavern from its git "
            "repository or release zip, or add --allow-node-modules to go on anyway.")


def sidecar_command() -> list[str]:
    """This checkout's `chronicler serve`: the venv's script beside the running Python, else the
    same Python with the module (an install without the console script)."""
    scripts = Path(sys.executable).parent  # bin/ on POSIX, Scripts\\ on Windows
    script = scripts / ("chronicler.exe" if os.name == "nt" else "chronicler")
    if script.is_file():
        return [str(script), "serve"]
    return [sys.executable, "-m", "server_plugin.cli", "serve"]


def _is_ours(folder: Path) -> bool:
    try:
        return json.loads((folder / "package.json").read_text(encoding="utf-8")).get("name") == PLUGIN_PACKAGE
    except (OSError, ValueError, AttributeError):
        return False


def place_plugin(st_dir: Path, data_dir: Path, source: Path = PLUGIN_SRC) -> Path:
    """Copy the plugin into SillyTavern and record how to start this sidecar; returns its folder."""
    destination = st_dir / "plugins" / PLUGIN_FOLDER
    if destination.is_symlink() or destination.exists():
        if not _is_ours(destination):
            raise PluginInstallError(f"{destination} exists and is not Chronicler's plugin; move it away first.")
        if destination.is_symlink():
            destination.unlink()
        else:
            shutil.rmtree(destination)
    shutil.copytree(source, destination, ignore=shutil.ignore_patterns("node_modules", ".*", PLUGIN_CONFIG))
    record = {"command": sidecar_command(), "dataDir": str(data_dir), "logFile": str(data_dir / "sidecar.log"),
              "version": __version__}
    (destination / PLUGIN_CONFIG).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    return destination


def enable_server_plugins(config_yaml: Path) -> str | None:
    """Set `enableServerPlugins: true` in config.yaml; returns what changed (None: already on)."""
    import yaml

    text = config_yaml.read_text(encoding="utf-8")
    match = _ENABLE.search(text)
    if match and match.group(1) == "true":
        return None
    if match:
        text = text[:match.start()] + "enableServerPlugins: true" + text[match.end():]
        change = f"enableServerPlugins: {match.group(1)} -> true"
    else:
        text = text + ("" if text.endswith("\n") or not text else "\n") + "enableServerPlugins: true\n"
        change = "enableServerPlugins: true (added)"
    if yaml.safe_load(text).get("enableServerPlugins") is not True:
        raise PluginInstallError(f"{config_yaml}: I cannot set enableServerPlugins safely; set it to true by hand.")
    config_yaml.write_text(text, encoding="utf-8")
    return change


def write_plugin_client_config(path: Path) -> None:
    """Beside the extension: use the plugin's route (no URL, no token: the page never holds one)."""
    path.write_text(json.dumps({"mode": "plugin", "route": ROUTE, "version": __version__}, indent=2) + "\n",
                    encoding="utf-8")
