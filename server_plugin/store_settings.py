"""A store's own settings: what a person may change at run time (GET/PATCH /v1/settings).

The sidecar's settings (settings.py: defaults < config.toml < environment < flags) are the base;
each store keeps its changes in `<store folder>/settings.json` (mode 0600: it may hold the model's
API key) and lays them over the base when it opens. Only the names in EDITABLE may change: the job
mode and the model endpoint, budgets, windows and the sizes of what jobs write. Network and
security settings (host, port, origins, allowed hosts, token, data folder) never change through the
API. A change is checked whole (types, minimums, choices, the checks across settings) before
anything is written: one bad value refuses the whole change, naming the field.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Mapping

from .settings import TABLE, Settings, _coerce, _together

SETTINGS_FILE = "settings.json"
SECRETS = ("llm_key", "embedder_key")  # written, never read back
EDITABLE = (
    # background jobs and the model they call
    "llm_mode", "llm_url", "llm_model", "llm_key", "llm_json_mode", "llm_temperature",
    "llm_connect_timeout", "llm_read_timeout", "llm_retries",
    # how much of the transcript one model call reads (MJ1: parts, sized to the model's context)
    "llm_context_tokens", "part_tokens", "part_reserve_tokens", "part_wait_seconds",
    # who embeds texts for search (a change re-embeds the store in the background)
    "embedder", "embedder_url", "embedder_model", "embedder_key", "embedder_timeout",
    # budgets of the per-turn context
    "context_required_percent", "context_cards_percent", "context_history_percent",
    "memory_bank_search_results", "default_context_tokens",
    # the live window
    "live_window_max_tokens", "live_window_percent", "live_window_max_messages",
    # sizes of what the jobs write
    "summary_recent_tokens", "summary_consolidated_tokens", "summary_long_term_tokens",
    "session_full_tokens", "session_short_tokens", "session_gap_hours",
    # lore grown from play: written at once or kept for a person's review (SW7)
    "lore_growth_review",
)
# Never through the API, whatever a client sends: where the sidecar listens and who may call it.
PROTECTED = ("host", "port", "origins", "allowed_hosts", "token", "data_dir", "db_file", "threads")


class FieldError(ValueError):
    """One field of a change is refused: `field` names it, `code` says why."""

    def __init__(self, field: str, code: str, message: str) -> None:
        super().__init__(message)
        self.field = field
        self.code = code
        self.message = message


_JSON_TYPES: dict[type, tuple[type, ...]] = {bool: (bool,), int: (int,), float: (int, float),
                                             str: (str,), list: (list,)}


def _value(name: str, raw: Any) -> Any:
    """A JSON value for setting `name` checked and typed (no strings for numbers: JSON has types)."""
    setting = TABLE[name]
    if isinstance(raw, bool) and setting.type is not bool or not isinstance(raw, _JSON_TYPES[setting.type]):
        raise FieldError(name, "invalid_setting", f"{name} must be a {setting.type.__name__}, got {raw!r}")
    try:
        value = _coerce(setting, raw, "settings API")
    except ValueError as exc:
        raise FieldError(name, "invalid_setting", str(exc).removeprefix("settings API: ")) from None
    if not setting.allows(value):
        raise FieldError(name, "invalid_setting", f"{name} must be one of {', '.join(setting.choices)}, "
                         f"got {value!r}")
    return value


def check_changes(base: Settings, current: Mapping[str, Any], changes: Mapping[str, Any]) -> dict[str, Any]:
    """`current` (a store's changes) with `changes` laid over it, every field checked; raises
    FieldError for the first field refused. Nothing is written here."""
    for name in changes:
        if name in PROTECTED:
            raise FieldError(name, "setting_not_changeable", f"{name} is a network or security setting; "
                             "it is set where the sidecar starts (config.toml, environment), never "
                             "through the API.")
        if name not in EDITABLE:
            raise FieldError(name, "unknown_setting", f"{name} is not a setting the API can change.")
    merged = dict(current)
    merged.update({name: _value(name, raw) for name, raw in changes.items()})
    values = base.as_dict(redact=False) | merged
    for wrong in _together(values):
        field = next((n for n in changes if wrong.startswith(n) or f"+ {n}" in wrong), next(iter(changes)))
        raise FieldError(field, "invalid_setting", wrong)
    return merged


def layered(base: Settings, changes: Mapping[str, Any], data_dir: Path) -> Settings:
    """The base settings with a store's changes over them and the store's own folder."""
    values = base.as_dict(redact=False) | dict(changes) | {"data_dir": str(data_dir)}
    sources = {name: ("store settings" if name in changes else base.source_of(name)) for name in values}
    return Settings(values, sources)


def read(data_dir: Path, base: Settings) -> dict[str, Any]:
    """A store's saved changes (none when it has no file); a value no longer valid is dropped."""
    path = data_dir / SETTINGS_FILE
    if not path.is_file():
        return {}
    try:
        saved = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    kept: dict[str, Any] = {}
    for name, raw in saved.items() if isinstance(saved, dict) else ():
        try:
            kept = check_changes(base, kept, {name: raw})
        except FieldError:
            continue  # a setting retired or tightened since: its default applies
    return kept


def write(data_dir: Path, changes: Mapping[str, Any]) -> None:
    """Save a store's changes atomically, readable by this user only."""
    data_dir.mkdir(parents=True, exist_ok=True)
    tmp = data_dir / (SETTINGS_FILE + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        json.dump(dict(changes), fh, indent=1, sort_keys=True)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, data_dir / SETTINGS_FILE)


def public_view(settings: Settings, changes: Mapping[str, Any]) -> dict[str, Any]:
    """What GET /v1/settings answers: every editable value but the secrets, which say only whether
    they are set, and which values the store changed."""
    values = settings.as_dict(redact=False)
    return {
        "settings": {name: values[name] for name in EDITABLE if name not in SECRETS},
        "secrets": {name: {"set": bool(values[name])} for name in SECRETS},
        "changed": sorted(changes),
        "editable": list(EDITABLE),
    }
