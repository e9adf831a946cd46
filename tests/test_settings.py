"""Settings: every limit named with a default; file < environment < overrides; bad values refused."""

from __future__ import annotations

import logging
from dataclasses import MISSING, fields

import pytest

from server_plugin.core.assemble import Rules
from server_plugin.retrieval.ranking import RankingParams
from server_plugin.retrieval.search import params_of
from server_plugin.settings import (
    ALL_SETTINGS,
    ENV_PREFIX,
    RETIRED,
    RETIRED_TABLE,
    TABLE,
    Settings,
    SettingsError,
    defaults,
    load_settings,
)
from server_plugin.story.context import rules_from


def test_every_setting_has_a_default_and_a_sentence():
    names = [s.name for s in ALL_SETTINGS]
    assert len(names) == len(set(names))
    for setting in ALL_SETTINGS:
        assert setting.help.strip(), setting.name
        assert setting.default is not None, setting.name


def test_defaults(tmp_path):
    s = load_settings({"data_dir": str(tmp_path)}, environ={})
    assert (s.host, s.port, s.memory_max_chars, s.pinned_per_scope, s.unpinned_per_scope) == (
        "127.0.0.1", 7711, 500, 20, 100)
    assert s.origins == ["http://127.0.0.1:8000", "http://localhost:8000"]
    assert s.llm_mode == "extractive" and s.source_of("port") == "default"


def test_precedence_file_then_environment_then_overrides(tmp_path):
    (tmp_path / "config.toml").write_text('port = 8001\npinned_per_scope = 5\nllm_mode = "openai"\n')
    env = {"CHRONICLER_PORT": "8002", "CHRONICLER_ORIGINS": "http://a:1, http://b:2"}
    s = load_settings({"data_dir": str(tmp_path), "pinned_per_scope": 7}, environ=env)
    assert s.port == 8002 and s.source_of("port") == "environment"
    assert s.pinned_per_scope == 7 and s.source_of("pinned_per_scope") == "override"
    assert s.llm_mode == "openai" and s.source_of("llm_mode").endswith("config.toml")
    assert s.origins == ["http://a:1", "http://b:2"]


def test_data_dir_from_environment_finds_its_config_file(tmp_path):
    (tmp_path / "config.toml").write_text("[chronicler]\nmemory_max_chars = 300\n")
    s = load_settings(environ={"CHRONICLER_DATA_DIR": str(tmp_path)})
    assert s.memory_max_chars == 300 and s.data_path == tmp_path.resolve()


@pytest.mark.parametrize("bad", [{"port": "abc"}, {"pinned_per_scope": -1}, {"max_body_bytes": 10},
                                 {"llm_mode": "magic"}, {"no_such_setting": 1}, {"recent_days": float("nan")}])
def test_bad_values_are_refused_with_the_name(tmp_path, bad):
    with pytest.raises(SettingsError) as err:
        load_settings({"data_dir": str(tmp_path), **bad}, environ={})
    assert any(name in str(err.value) for name in [*bad, "llm_mode"])


def test_unknown_key_in_the_file_is_an_error(tmp_path):
    (tmp_path / "config.toml").write_text("pinned_per_scoop = 5\n")
    with pytest.raises(SettingsError, match="pinned_per_scoop"):
        load_settings({"data_dir": str(tmp_path)}, environ={})


def test_secrets_are_redacted(tmp_path):
    s = load_settings({"data_dir": str(tmp_path), "token": "t", "llm_key": "k"}, environ={})
    shown = s.as_dict()
    assert shown["token"] == "***" and shown["llm_key"] == "***"
    with pytest.raises(AttributeError):
        s.port = 1


# --- one default per setting, typed values, choices, retired names -------------------------------
def test_every_default_has_its_settings_type_and_passes_its_own_checks():
    for setting in ALL_SETTINGS + RETIRED:
        assert type(setting.default) is setting.type, setting.name
        if setting.type is list:
            assert all(isinstance(v, str) for v in setting.default), setting.name
        if setting.minimum is not None:
            assert setting.default >= setting.minimum, setting.name
        assert setting.allows(setting.default), setting.name
    assert not set(TABLE) & set(RETIRED_TABLE)


def _types(settings) -> dict[str, type]:
    return {name: type(value) for name, value in settings.as_dict(redact=False).items()}


def test_every_value_has_its_settings_type_from_every_source(tmp_path):
    """Values are coerced once, when loaded: an int written for a float setting is a float, an
    environment string is an int or a bool, so call sites never wrap them in int() or float()."""
    expected = {s.name: s.type for s in ALL_SETTINGS}
    assert _types(defaults()) == expected
    (tmp_path / "config.toml").write_text("llm_read_timeout = 7\nrecent_days = 3\nport = 8001\n")
    env = {"CHRONICLER_SEARCH_B": "1", "CHRONICLER_THREADS": "3", "CHRONICLER_WORKER_ENABLED": "no",
           "CHRONICLER_ALLOWED_HOSTS": "a.test, b.test"}
    s = load_settings({"data_dir": str(tmp_path), "live_window_percent": 30, "search_max_k": 50.0},
                      environ=env)
    assert _types(s) == expected
    assert (s.llm_read_timeout, s.recent_days, s.search_b, s.live_window_percent) == (7.0, 3.0, 1.0, 30.0)
    assert (s.threads, s.search_max_k, s.worker_enabled) == (3, 50, False)
    assert s.allowed_hosts == ["a.test", "b.test"]


def test_settings_refuse_a_value_of_another_type():
    values = defaults().as_dict(redact=False)
    with pytest.raises(SettingsError, match="port"):
        Settings({**values, "port": "7711"}, {})
    with pytest.raises(SettingsError, match="recent_days"):
        Settings({**values, "recent_days": 7}, {})


CHOICES = [s for s in ALL_SETTINGS if s.choices]


def test_the_settings_with_allowed_values_declare_them():
    assert {s.name for s in CHOICES} >= {"llm_mode", "llm_json_mode", "search_query_person",
                                         "sqlite_synchronous"}


@pytest.mark.parametrize("setting", CHOICES, ids=lambda s: s.name)
def test_choices_are_enforced_naming_the_field_and_the_allowed_values(tmp_path, setting):
    for allowed in setting.choices:
        assert getattr(load_settings({"data_dir": str(tmp_path), setting.name: allowed}, environ={}),
                       setting.name) == allowed
    with pytest.raises(SettingsError) as err:
        load_settings({"data_dir": str(tmp_path), setting.name: "not-a-choice"}, environ={})
    message = str(err.value)
    assert setting.name in message and "not-a-choice" in message
    assert all(allowed in message for allowed in setting.choices), message


def test_choices_from_the_file_name_the_file(tmp_path):
    (tmp_path / "config.toml").write_text('llm_json_mode = "yaml"\n')
    with pytest.raises(SettingsError, match=r"config\.toml: llm_json_mode must be one of off, json_object"):
        load_settings({"data_dir": str(tmp_path)}, environ={})


def test_sqlite_synchronous_ignores_case_other_choices_do_not(tmp_path):
    """SQLite reads its pragma in any case; a mode name is matched exactly, as before."""
    assert load_settings({"data_dir": str(tmp_path), "sqlite_synchronous": "normal"},
                         environ={}).sqlite_synchronous == "normal"
    with pytest.raises(SettingsError, match="llm_mode"):
        load_settings({"data_dir": str(tmp_path), "llm_mode": "OpenAI"}, environ={})


def test_percentages_are_checked_together(tmp_path):
    with pytest.raises(SettingsError, match="at most 100"):
        load_settings({"data_dir": str(tmp_path), "context_cards_percent": 60,
                       "context_history_percent": 50}, environ={})
    with pytest.raises(SettingsError, match="context_required_percent"):
        load_settings({"data_dir": str(tmp_path), "context_required_percent": 101}, environ={})


@pytest.mark.parametrize("name", sorted(RETIRED_TABLE))
def test_a_retired_name_is_accepted_ignored_and_warned_about(tmp_path, caplog, name):
    """An old config.toml still starts: the retired name is checked like a setting, then ignored;
    a value other than its default is logged, so a person knows it does nothing."""
    (tmp_path / "config.toml").write_text(f"{name} = 0.5\n")
    with caplog.at_level(logging.WARNING, logger="server_plugin.settings"):
        s = load_settings({"data_dir": str(tmp_path)}, environ={})
    assert name not in s.as_dict() and not hasattr(s, name)
    assert any(name in r.getMessage() and "ignored" in r.getMessage() for r in caplog.records)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="server_plugin.settings"):
        load_settings({"data_dir": str(tmp_path / "none"), name: 0.0}, environ={})
        load_settings({"data_dir": str(tmp_path / "none")}, environ={ENV_PREFIX + name.upper(): "0"})
    assert not caplog.records
    assert "Retired" in RETIRED_TABLE[name].help
    with pytest.raises(SettingsError, match=name):
        load_settings({"data_dir": str(tmp_path / "none"), name: "high"}, environ={})


def test_the_tuned_numbers_have_no_second_copy_in_the_modules():
    """The ranker's weights and the assembler's QS numbers are built from the table only."""
    for cls in (RankingParams, Rules):
        with_default = {f.name for f in fields(cls) if f.default is not MISSING}
        assert with_default <= {"bigrams", "bigram_weight"}, (cls.__name__, with_default)
    shipped = defaults()
    assert params_of(shipped).w_bm25 == shipped.search_w_bm25
    assert rules_from(shipped).context_required_percent == shipped.context_required_percent
