"""Settings: every limit named with a default; file < environment < overrides; bad values refused."""

from __future__ import annotations

import pytest

from server_plugin.settings import ALL_SETTINGS, SettingsError, load_settings


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
