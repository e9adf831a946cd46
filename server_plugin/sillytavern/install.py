"""Install the SillyTavern extension where SillyTavern loads it, and introduce it to this sidecar.

`chronicler install-extension` does three things so a new user has nothing to paste:
1. copies (or links) `extension/` to `<data root>/<user>/extensions/Chronicler`, where SillyTavern
   serves third-party extensions (enabled by default);
2. writes `chronicler.config.json` beside that folder with this sidecar's URL and token — the
   extension reads it at load when its own settings are empty (beside, not inside: a linked folder
   is the repository's own `extension/`, and a token must not land there);
3. where it can read SillyTavern's `config.yaml`, adds that server's origins to the sidecar's
   allowlist in `DATA_DIR/config.toml` (keeping the ones already there), so the browser may call us.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..settings import TABLE, Settings, ensure_token
from . import plugin_install
from .plugin_install import PluginInstallError

FOLDER = "Chronicler"
CONFIG_NAME = "chronicler.config.json"
ST_DEFAULT_PORT = 8000
EXTENSION_SRC = Path(__file__).resolve().parents[2] / "extension"


class InstallError(Exception):
    """The install cannot go on; the message says why and what to do."""


@dataclass
class InstallResult:
    """What was done, for the command's report."""

    destination: Path
    linked: bool
    config_path: Path
    sidecar_url: str
    st_config: Path | None = None
    origins_added: list[str] = field(default_factory=list)
    origins_file: Path | None = None
    notes: list[str] = field(default_factory=list)
    plugin: Path | None = None
    config_changes: list[str] = field(default_factory=list)


# --- SillyTavern's side ----------------------------------------------------------------------
def read_st_config(path: Path) -> dict[str, Any]:
    """SillyTavern's config.yaml as a dict ({} when absent or unreadable as a mapping)."""
    import yaml  # PyYAML: SillyTavern's config is YAML

    if not path.is_file():
        return {}
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise InstallError(f"{path} is not valid YAML: {exc}") from None
    return data if isinstance(data, dict) else {}


def st_origins(config: dict[str, Any]) -> list[str]:
    """The browser origins of a SillyTavern server with this config (loopback names, its port)."""
    port = config.get("port", ST_DEFAULT_PORT)
    if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
        raise InstallError(f"SillyTavern's config.yaml has a port I cannot use: {port!r}")
    ssl = config.get("ssl")
    scheme = "https" if isinstance(ssl, dict) and ssl.get("enabled") is True else "http"
    return [f"{scheme}://127.0.0.1:{port}", f"{scheme}://localhost:{port}"]


def locate(sillytavern: Path | None, data_root: Path | None) -> tuple[Path, Path | None]:
    """(data root, config.yaml or None) from the options given.

    With the install folder: its config.yaml (written by SillyTavern at first start) names the data
    root (`dataRoot`, default `./data`, relative to the install folder). With a data root alone, a
    config.yaml is looked for in it and beside it.
    """
    if sillytavern is not None:
        st_dir = sillytavern.expanduser().resolve()
        if not (st_dir / "server.js").is_file():
            raise InstallError(f"{st_dir} is not a SillyTavern install folder (no server.js in it).")
        config_path = st_dir / "config.yaml"
        config = read_st_config(config_path)
        root = config.get("dataRoot") or "./data"
        root_path = Path(str(root)).expanduser()
        data = root_path if root_path.is_absolute() else st_dir / root_path
        return data.resolve(), config_path if config_path.is_file() else None
    assert data_root is not None
    data = data_root.expanduser().resolve()
    for candidate in (data / "config.yaml", data.parent / "config.yaml"):
        if candidate.is_file():
            return data, candidate
    return data, None


def _ours(path: Path) -> bool:
    """Whether an existing folder (or link) is a Chronicler install we may replace."""
    try:
        manifest = json.loads((path / "manifest.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(manifest, dict) and manifest.get("display_name") == "Chronicler"


def place_extension(source: Path, destination: Path, link: bool) -> None:
    """Copy or link `source` to `destination`, replacing an earlier Chronicler install there."""
    if not (source / "manifest.json").is_file():
        raise InstallError(f"The extension's files are not at {source} (no manifest.json). Run this from a "
                           "Chronicler checkout, or pass --source.")
    if destination.is_symlink() or destination.exists():
        if not _ours(destination):
            raise InstallError(f"{destination} exists and is not a Chronicler install; move it away first.")
        if destination.is_symlink() or destination.is_file():
            destination.unlink()
        else:
            shutil.rmtree(destination)
    destination.parent.mkdir(parents=True, exist_ok=True)
    if link:
        destination.symlink_to(source.resolve(), target_is_directory=True)
    else:
        shutil.copytree(source, destination, ignore=shutil.ignore_patterns("node_modules", ".*", CONFIG_NAME))


def write_client_config(path: Path, url: str, token: str) -> None:
    """The file the extension reads at load when its own settings are empty (mode 0600: a token)."""
    data = json.dumps({"sidecarUrl": url, "token": token}, indent=2) + "\n"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(data)
    os.chmod(path, 0o600)


# --- the sidecar's side ----------------------------------------------------------------------
def sidecar_url(settings: Settings) -> str:
    """The URL a browser on this machine uses: a wildcard bind is reached on loopback."""
    host = settings.host
    if host in {"0.0.0.0", "", "::"}:
        host = "127.0.0.1"
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"http://{host}:{settings.port}"


_ORIGINS_LINE = re.compile(r"^[ \t]*origins[ \t]*=[ \t]*\[[^\]]*\][ \t]*(#[^\n]*)?$", re.MULTILINE)


def _toml_list(values: list[str]) -> str:
    return "[" + ", ".join(json.dumps(v) for v in values) + "]"


def add_origins(config_toml: Path, new: list[str]) -> list[str]:
    """Add origins to `origins` in the sidecar's config.toml, keeping what is there (or the defaults
    when the file sets none). Only that one key is rewritten: comments and other keys stay as they
    are. Returns the origins that were added."""
    text = config_toml.read_text(encoding="utf-8") if config_toml.is_file() else ""
    try:
        parsed = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise InstallError(f"{config_toml} is not valid TOML: {exc}") from None
    table = parsed.get("chronicler", parsed)
    current = table.get("origins")
    if current is None:
        current = list(TABLE["origins"].default)
    elif isinstance(current, str):
        current = [part.strip() for part in current.split(",") if part.strip()]
    elif not isinstance(current, list) or not all(isinstance(v, str) for v in current):
        raise InstallError(f"{config_toml}: origins must be a list of strings.")
    added = [o for o in new if o not in current]
    if not added:
        return []
    line = f"origins = {_toml_list(current + added)}"
    if "origins" in table:
        if not _ORIGINS_LINE.search(text):
            raise InstallError(f"{config_toml}: I cannot rewrite its origins safely; add {', '.join(added)} by hand.")
        text = _ORIGINS_LINE.sub(line, text, count=1)
    elif "chronicler" in parsed:
        text = re.sub(r"^\[chronicler\][ \t]*$", lambda m: m.group(0) + "\n" + line, text, count=1, flags=re.MULTILINE)
    else:
        text = line + "\n" + text  # top-level keys must come before any [table]
    check = tomllib.loads(text)
    if check.get("chronicler", check).get("origins") != current + added:
        raise InstallError(f"{config_toml}: rewriting origins did not give the expected list; nothing was written.")
    config_toml.parent.mkdir(parents=True, exist_ok=True)
    config_toml.write_text(text, encoding="utf-8")
    return added


# --- the whole install -----------------------------------------------------------------------
def _accounts_on(st_config: Path | None) -> bool:
    return st_config is not None and read_st_config(st_config).get("enableUserAccounts") is True


def install_extension(settings: Settings, *, sillytavern: Path | None = None, data_root: Path | None = None,
                      user: str = "default-user", link: bool = False, source: Path = EXTENSION_SRC,
                      plugin: bool = False, st_config: Path | None = None,
                      allow_node_modules: bool = False) -> InstallResult:
    """Install the extension (and with `plugin`, the server plugin) and connect it to this sidecar.

    With the plugin (needs the server folder, `sillytavern`), the extension reaches the sidecar
    through SillyTavern's own origin; without it, directly (URL and token beside the extension).
    With SillyTavern's user accounts on, the extension goes to the global third-party folder, where
    every user gets it.
    """
    if sillytavern is None and data_root is None:
        raise InstallError("Give --sillytavern ST_DIR (or --data-root DATA_DIR).")
    if not user or "/" in user or user in {".", ".."}:
        raise InstallError(f"Not a SillyTavern user handle: {user!r}")
    if plugin and sillytavern is None:
        raise InstallError("The server plugin goes into SillyTavern's server folder: give --sillytavern ST_DIR "
                           "(or --no-plugin).")
    root, found_config = locate(sillytavern, None) if sillytavern is not None else locate(None, data_root)
    if sillytavern is not None and data_root is not None:  # SillyTavern started with --dataRoot
        root = data_root.expanduser().resolve()
    st_config = st_config.expanduser().resolve() if st_config else found_config
    st_dir = sillytavern.expanduser().resolve() if sillytavern else None
    if plugin:
        try:
            plugin_install.check_server_folder(st_dir, allow_node_modules)
        except PluginInstallError as exc:
            raise InstallError(str(exc)) from None
    if _accounts_on(st_config) and st_dir is not None:
        extensions = st_dir / plugin_install.GLOBAL_EXTENSIONS
    else:
        user_dir = root / user
        if not user_dir.is_dir():
            hint = " (SillyTavern creates it at first start: start it once, then run this again)"
            raise InstallError(f"No SillyTavern user folder at {user_dir}{hint}.")
        extensions = user_dir / "extensions"
    destination = extensions / FOLDER
    place_extension(source, destination, link)
    config_path = extensions / CONFIG_NAME
    if plugin:
        return _with_plugin(settings, st_dir, st_config, destination, config_path, link)
    return _direct(settings, st_config, destination, config_path, link)


def _with_plugin(settings: Settings, st_dir: Path, st_config: Path | None, destination: Path,
                 config_path: Path, link: bool) -> InstallResult:
    if st_config is None or not st_config.is_file():
        raise InstallError(f"SillyTavern's config.yaml was not found in {st_dir} (SillyTavern writes it at first "
                           "start: start it once, then run this again; or give --st-config).")
    try:
        placed = plugin_install.place_plugin(st_dir, settings.data_path)
        change = plugin_install.enable_server_plugins(st_config)
    except PluginInstallError as exc:
        raise InstallError(str(exc)) from None
    plugin_install.write_plugin_client_config(config_path)
    result = InstallResult(destination=destination, linked=link, config_path=config_path,
                           sidecar_url=plugin_install.ROUTE, st_config=st_config, plugin=placed)
    result.config_changes = [f"{st_config}: {change}"] if change else []
    return result


def _direct(settings: Settings, st_config: Path | None, destination: Path, config_path: Path,
            link: bool) -> InstallResult:
    token, _ = ensure_token(settings)
    url = sidecar_url(settings)
    write_client_config(config_path, url, token)
    result = InstallResult(destination=destination, linked=link, config_path=config_path, sidecar_url=url,
                           st_config=st_config)
    if st_config is None:
        result.notes.append("SillyTavern's config.yaml was not found, so its address was not added to the "
                            "sidecar's allowed origins; if the page is not http://127.0.0.1:8000, add it to "
                            "origins in " + str(settings.data_path / "config.toml") + ".")
        return result
    origins = st_origins(read_st_config(st_config))
    result.origins_file = settings.data_path / "config.toml"
    result.origins_added = add_origins(result.origins_file, origins)
    if settings.source_of("origins") == "environment":
        result.notes.append("CHRONICLER_ORIGINS is set in this environment and wins over config.toml; "
                            f"add {', '.join(origins)} to it as well.")
    return result
