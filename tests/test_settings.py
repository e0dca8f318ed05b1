"""spool.core.settings: typed overrides of spool.toml, checked against Config, read back exactly."""

from __future__ import annotations

import tomllib

import pytest

from spool.core import config, settings


def test_written_settings_read_back_to_the_same_config(tmp_path):
    path = tmp_path / "spool.toml"
    odd = 'a "quoted" \\ back\tslash\nline \x01\x7f £ ✓'
    cfg = settings.write(
        path,
        {
            "assets": {"roots": ["/media/a b", odd]},
            "daemon": {"poll_interval": 0.2, "watch": "poll"},
            "limits": {"max_attempts": 2, "temp_disk": "1.5GiB", "memory": 123, "job_timeout": 7},
            "acceptance": {"allow_noop": True, "required_tags": []},
            "render": {"font_file": odd},
            "recovery": {"backoff": 0.0},
        },
    )
    assert config.load(path) == cfg
    assert cfg.daemon.poll_interval == 0.2 and cfg.daemon.watch == "poll"
    assert cfg.limits.max_attempts == 2 and cfg.limits.temp_disk_bytes == int(1.5 * 2**30)
    assert cfg.limits.job_timeout == 7.0 and cfg.assets.roots[1] == odd == cfg.render.font_file
    assert cfg.acceptance.allow_noop is True and cfg.acceptance.required_tags == []
    assert cfg.validation == config.Validation()  # untouched sections keep their defaults


def test_defaults_round_trip_and_match_the_init_template():
    text = settings.dump(config.Config())
    assert config.parse(text.encode()) == config.Config() == config.parse(config.template([]).encode())


def test_a_second_write_keeps_what_the_file_already_says(tmp_path):
    path = tmp_path / "spool.toml"
    path.write_text(config.template(["/assets"]))
    settings.write(path, {"daemon": {"heartbeat_interval": 0.5}})
    cfg = settings.write(path, {"limits": {"max_active": 1}})
    assert cfg.assets.roots == ["/assets"] and cfg.daemon.heartbeat_interval == 0.5
    assert cfg.limits.max_active == 1 and config.load(path) == cfg


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        ({"limits": {"max_attemps": 2}}, "limits.max_attemps is not a setting"),
        ({"deamon": {"poll_interval": 1.0}}, r"\[deamon\] is not a section"),
        ({"daemon": 0.2}, r"\[daemon\] must be a table"),
    ],
)
def test_an_unknown_section_or_key_fails_loudly(tmp_path, overrides, named):
    path = tmp_path / "spool.toml"
    with pytest.raises(settings.SettingsError, match=named):
        settings.write(path, overrides)
    assert not path.exists()  # nothing half done


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"daemon": {"poll_interval": "fast"}}, "daemon.poll_interval"),
        ({"daemon": {"poll_interval": 0}}, "daemon.poll_interval"),
        ({"limits": {"temp_disk": "lots"}}, "limits.temp_disk"),
        ({"daemon": {"watch": "fanotify"}}, "daemon.watch"),
    ],
)
def test_a_value_the_loader_refuses_is_refused_with_the_key_named(tmp_path, overrides, field):
    with pytest.raises(config.ConfigError) as err:
        settings.write(tmp_path / "spool.toml", overrides)
    assert field in str(err.value)
    assert not (tmp_path / "spool.toml").exists()


def test_a_table_valued_setting_is_written_as_an_inline_table():
    """For settings that are tables themselves (none today): TOML that reads back the same."""
    value = {"fal": {"in_flight": 4, "base_url": 'https://x/"q"'}, "odd key": [1.5, True]}
    assert tomllib.loads("v = " + settings._value(value, "v"))["v"] == value
