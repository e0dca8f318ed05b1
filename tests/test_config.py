"""``spool.toml``: defaults, the template ``spool init`` writes, and one clear error per bad key."""

from __future__ import annotations

import json
import os
import tomllib
from pathlib import Path

import pytest
from conftest import run_cli

from spool.core import config, units
from spool.core.errors import EXIT_INVALID, ConfigError, InvalidInput

#: Every folder of SPEC section 1.
SPEC_FOLDERS = (
    "incoming",
    "pending",
    "running",
    "complete",
    "failed",
    "rejected",
    "attempts",
    "store",
    "manifests",
    "workers",
    "events",
)


def test_missing_file_means_all_defaults(tmp_path: Path):
    cfg = config.load(tmp_path / "no-such" / "spool.toml")
    assert cfg == config.Config()
    assert cfg.assets.roots == []
    assert cfg.limits.max_active == 2
    assert cfg.limits.temp_disk_bytes == 20 * 2**30
    assert cfg.limits.job_timeout == 3600
    assert cfg.limits.max_attempts == 3
    assert cfg.acceptance.required_tags == ["campaign", "locale", "asset_type", "visibility"]
    assert cfg.acceptance.max_submission_bytes == 1 << 20
    assert cfg.validation.decode_check == "sampled"
    assert cfg.daemon.poll_interval == 2.0


def test_empty_file_means_all_defaults():
    assert config.parse(b"") == config.Config()


def test_the_template_parses_to_the_defaults_plus_its_roots():
    roots = ["/media/library", 'C:\\odd "quoted" folder', "relative/assets"]
    text = config.template(roots)
    cfg = config.parse(text.encode())
    assert cfg.assets.roots == roots
    assert cfg == config.Config(assets=config.Assets(roots=roots))
    # it is commented: a human can read what each key does
    comments = [line for line in text.splitlines() if line.lstrip().startswith("#")]
    assert len(comments) >= 5
    assert "max_active" in text and "decode_check" in text
    assert config.parse(config.template([]).encode()).assets.roots == []


def test_values_are_read():
    cfg = config.parse(
        b"""
[assets]
roots = ["/a", "b"]
[limits]
max_active = 4
temp_disk = "500 MB"
memory = "8GiB"
output_size = 1000
job_timeout = 90.5
[acceptance]
required_tags = ["campaign"]
[validation]
decode_check = "full"
[daemon]
watch = "poll"
"""
    )
    assert cfg.assets.roots == ["/a", "b"]
    assert cfg.limits.max_active == 4
    assert cfg.limits.temp_disk_bytes == 500_000_000
    assert cfg.limits.memory_bytes == 8 * 2**30
    assert cfg.limits.output_size_bytes == 1000
    assert cfg.limits.job_timeout == 90.5
    assert cfg.acceptance.required_tags == ["campaign"]
    assert cfg.validation.decode_check == "full"
    assert cfg.daemon.watch == "poll"


def test_relative_asset_roots_are_relative_to_the_spool(tmp_path: Path):
    (tmp_path / "media").mkdir()
    cfg = config.parse(b'[assets]\nroots = ["media", "/abs/lib"]\n')
    assert cfg.asset_roots(tmp_path) == [(tmp_path / "media").resolve(), Path("/abs/lib")]


BAD = [
    pytest.param(b"[limits]\nmax_active = 0\n", "limits.max_active", id="max_active_zero"),
    pytest.param(b'[limits]\nmax_active = "two"\n', "limits.max_active", id="max_active_string"),
    pytest.param(b"[limits]\nmax_active = 2.5\n", "limits.max_active", id="max_active_float"),
    pytest.param(b"[limits]\nmax_active = true\n", "limits.max_active", id="max_active_bool"),
    pytest.param(b"[limits]\njob_timeout = -5\n", "limits.job_timeout", id="negative_timeout"),
    pytest.param(b"[limits]\njob_timeout = 0\n", "limits.job_timeout", id="zero_timeout"),
    pytest.param(b"[limits]\nnice = 25\n", "limits.nice", id="nice_too_high"),
    pytest.param(b"[limits]\nnice = -1\n", "limits.nice", id="nice_negative"),
    pytest.param(b"[limits]\nmax_attempts = -1\n", "limits.max_attempts", id="negative_attempts"),
    pytest.param(b'[limits]\ntemp_disk = "lots"\n', "limits.temp_disk", id="temp_disk_lots"),
    pytest.param(b"[limits]\ntemp_disk = -1\n", "limits.temp_disk", id="temp_disk_negative"),
    pytest.param(b'[limits]\nmemory = "8 parsecs"\n', "limits.memory", id="memory_bad_unit"),
    pytest.param(b"[limits]\noutput_size = [1]\n", "limits.output_size", id="output_size_list"),
    pytest.param(b"[limits]\nbogus = 1\n", "limits.bogus", id="unknown_key"),
    pytest.param(b"[bogus]\nx = 1\n", "bogus", id="unknown_section"),
    pytest.param(b"max_active = 3\n", "max_active", id="key_outside_its_section"),
    pytest.param(b"limits = 3\n", "limits", id="section_not_a_table"),
    pytest.param(b'[validation]\ndecode_check = "some"\n', "validation.decode_check", id="decode_check"),
    pytest.param(
        b"[validation]\nduration_tolerance = -0.1\n", "validation.duration_tolerance", id="negative_tolerance"
    ),
    pytest.param(b"[validation]\nsample_windows = 0\n", "validation.sample_windows", id="no_windows"),
    pytest.param(b'[daemon]\nwatch = "fsevents"\n', "daemon.watch", id="watch"),
    pytest.param(b"[daemon]\npoll_interval = 0\n", "daemon.poll_interval", id="poll_interval_zero"),
    pytest.param(b"[daemon]\nstop_grace = -1\n", "daemon.stop_grace", id="stop_grace_negative"),
    pytest.param(b'[assets]\nroots = "/media"\n', "assets.roots", id="roots_not_a_list"),
    pytest.param(b"[assets]\nroots = [1]\n", "assets.roots", id="roots_not_strings"),
    pytest.param(
        b'[acceptance]\nrequired_tags = "campaign"\n', "acceptance.required_tags", id="required_tags_string"
    ),
    pytest.param(
        b"[acceptance]\nmax_submission_bytes = 0\n",
        "acceptance.max_submission_bytes",
        id="max_submission_zero",
    ),
    pytest.param(b"[render]\nthreads = -2\n", "render.threads", id="threads_negative"),
]


@pytest.mark.parametrize(("raw", "key"), BAD)
def test_a_bad_key_or_value_is_one_error_naming_the_key(raw: bytes, key: str):
    with pytest.raises(ConfigError) as info:
        config.parse(raw)
    err = info.value
    msg = str(err)
    assert isinstance(err, InvalidInput) and err.exit_code == EXIT_INVALID
    assert key in msg, msg
    assert msg.startswith("spool.toml"), msg  # it names the file too
    assert "\n" not in msg and len(msg) < 600, msg
    assert err.problem


@pytest.mark.parametrize(
    ("raw", "words"),
    [
        pytest.param(b"[limits\nmax_active = 2\n", "TOML", id="bad_toml"),
        pytest.param(b"[limits]\nmax_active = \n", "TOML", id="missing_value"),
        pytest.param(b"[limits]\nmax_active = 2\nmax_active = 3\n", "TOML", id="duplicate_key"),
        pytest.param(b"# caf\xe9\n[limits]\n", "UTF-8", id="not_utf8"),
        pytest.param(b"\xff\xfe[\x00l\x00", "UTF-8", id="utf16"),
    ],
)
def test_an_unreadable_file_is_a_config_error(raw: bytes, words: str):
    with pytest.raises(ConfigError) as info:
        config.parse(raw, "/srv/spool/spool.toml")
    msg = str(info.value)
    assert msg.startswith("/srv/spool/spool.toml"), msg
    assert words in msg
    assert "\n" not in msg.strip()


def test_load_names_the_file_it_read(tmp_path: Path):
    p = tmp_path / "spool.toml"
    p.write_bytes(b"[limits]\nmax_active = 0\n")
    with pytest.raises(ConfigError) as info:
        config.load(p)
    assert str(p) in str(info.value) and "limits.max_active" in str(info.value)


def test_load_of_a_folder_is_a_config_error(tmp_path: Path):
    (tmp_path / "spool.toml").mkdir()
    with pytest.raises(ConfigError) as info:
        config.load(tmp_path / "spool.toml")
    assert str(tmp_path / "spool.toml") in str(info.value)


@pytest.mark.parametrize(
    ("text", "size"),
    [("20GiB", 20 * 2**30), ("500 MB", 500_000_000), ("1.5KiB", 1536), ("7", 7), ("3b", 3), (12, 12)],
)
def test_sizes(text: str | int, size: int):
    assert units.parse_size(text) == size


@pytest.mark.parametrize("text", ["lots", "-1GB", "1 XB", "", "GB", -1])
def test_bad_sizes(text: str | int):
    with pytest.raises(ValueError):
        units.parse_size(text)


# -- spool init (the real CLI) -----------------------------------------------------------------


def test_init_creates_the_tree_and_a_commented_config(tmp_path: Path):
    lib = tmp_path / "library"
    lib.mkdir()
    root = tmp_path / "farm" / "spool"  # parents are created too
    proc = run_cli("init", str(root), "--asset-root", str(lib))
    assert proc.returncode == 0, proc.stderr
    for name in SPEC_FOLDERS:
        assert (root / name).is_dir(), name
    assert (root / "store" / "sha256").is_dir()
    text = (root / "spool.toml").read_text()
    assert text.lstrip().startswith("#")
    assert sum(1 for line in text.splitlines() if line.lstrip().startswith("#")) >= 5
    cfg = config.load(root / "spool.toml")
    assert cfg.assets.roots == [str(lib)]
    assert tomllib.loads(text)["limits"]["max_active"] == cfg.limits.max_active
    # a spool the other commands accept
    status = run_cli("status", "--json", spool=None, env={"SPOOL_DIR": str(root)})
    assert status.returncode == 0, status.stderr
    counts = json.loads(status.stdout)["counts"]
    assert {k: counts[k] for k in ("pending", "running", "complete", "failed", "rejected")} == dict.fromkeys(
        ("pending", "running", "complete", "failed", "rejected"), 0
    )


def test_init_twice_keeps_an_edited_config_and_the_queue(tmp_path: Path):
    root = tmp_path / "spool"
    assert run_cli("init", str(root)).returncode == 0
    cfg_file = root / "spool.toml"
    edited = cfg_file.read_text().replace("max_active = 2 ", "max_active = 7 ") + "\n# edited by ops\n"
    assert "max_active = 7" in edited
    cfg_file.write_text(edited)
    (root / "pending" / "keep@1.json").write_text("{}")
    os.rmdir(root / "events")  # a folder lost since: init puts it back

    proc = run_cli("init", str(root), "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["config_written"] is False
    assert cfg_file.read_text() == edited
    assert config.load(cfg_file).limits.max_active == 7
    assert (root / "pending" / "keep@1.json").read_text() == "{}"
    assert all((root / name).is_dir() for name in SPEC_FOLDERS)


def test_init_over_a_bad_config_reports_the_key_and_keeps_the_file(tmp_path: Path):
    root = tmp_path / "spool"
    root.mkdir()
    (root / "spool.toml").write_text('[validation]\ndecode_check = "sometimes"\n')
    proc = run_cli("init", str(root))
    assert proc.returncode == EXIT_INVALID
    assert "validation.decode_check" in proc.stderr
    assert (root / "spool.toml").read_text() == '[validation]\ndecode_check = "sometimes"\n'


def test_commands_refuse_a_bad_config_naming_the_key(tmp_path: Path):
    root = tmp_path / "spool"
    assert run_cli("init", str(root)).returncode == 0
    (root / "spool.toml").write_text('[limits]\ntemp_disk = "lots"\n')
    sub = tmp_path / "job.json"
    sub.write_text("{}")
    proc = run_cli("submit", str(sub), "--spool", str(root))
    assert proc.returncode == EXIT_INVALID
    assert "limits.temp_disk" in proc.stderr
    assert os.listdir(root / "pending") == [] and os.listdir(root / "rejected") == []


def test_reloader_applies_a_change_refuses_a_bad_file_once_and_notices_a_deleted_one(tmp_path: Path):
    path = tmp_path / "spool.toml"
    path.write_text("[limits]\nmax_active = 2\n")
    r = config.Reloader(path, config.load(path), settle=0.0)
    assert r.check() == (None, None)
    path.write_text("[limits]\nmax_active = 4\n")
    new, line = r.check()
    assert new is not None and new.limits.max_active == 4 and line and "changed limits.max_active" in line
    path.write_text("[limits]\nmax_active = -1\n")
    new, line = r.check()
    assert new is None and line and "limits.max_active" in line and "keeping" in line
    assert r.check() == (None, None) and r.cfg.limits.max_active == 4  # said once; old config kept
    path.unlink()
    new, line = r.check()
    assert new is None and line and "is gone" in line
    assert r.check() == (None, None)


def test_the_unit_reloads_with_sighup():
    unit = (Path(__file__).parent.parent / "systemd" / "spoold@.service").read_text()
    assert "\nExecReload=/bin/kill -HUP $MAINPID\n" in unit


def test_a_refused_file_is_said_once_even_when_a_reload_is_asked_right_after(tmp_path):
    """The loop notices an edit that breaks spool.toml, then `systemctl reload` (SIGHUP)
    forces a re-read of the same file: the refusal is said once; a new edit is news."""
    path = tmp_path / "spool.toml"
    path.write_text(config.template([str(tmp_path)]))
    r = config.Reloader(path, config.load(path), settle=0.0)
    path.write_text(path.read_text() + '\n[limits]\nmax_active = "zero"\n')
    new, line = r.check()
    assert new is None and line is not None and "keeping the configuration loaded before" in line
    assert r.check(force=True) == (None, None)
    path.write_text(path.read_text() + "\n# still broken, but edited again\n")
    new, line = r.check(force=True)
    assert new is None and line is not None and "keeping the configuration loaded before" in line


def test_an_edit_seen_between_truncate_and_write_is_applied_only_once_it_has_settled(tmp_path):
    """An editor saving in place truncates, then writes: a loop looking in between must
    not run on the empty file's defaults (no asset roots: every drop rejected)."""
    path = tmp_path / "spool.toml"
    good = config.template([str(tmp_path)])
    assert "\nmax_active = 2 " in good
    path.write_text(good)
    now, settle = [0.0], 0.5  # exact in binary floats
    r = config.Reloader(path, config.load(path), settle=settle, clock=lambda: now[0])
    path.write_text("")  # the editor has truncated the file...
    assert r.check() == (None, None) and r.cfg.assets.roots == [str(tmp_path)]
    assert r.settling() == pytest.approx(settle)  # ...so the loop looks again then
    now[0] += settle / 2
    path.write_text(good.replace("\nmax_active = 2 ", "\nmax_active = 3 "))  # ...and written it
    assert r.check() == (None, None)  # a new state: its own settle time starts
    now[0] += settle / 2
    assert r.check() == (None, None) and r.settling() == pytest.approx(settle / 2)
    now[0] += settle / 2
    new, line = r.check()
    assert new is not None and new.limits.max_active == 3 and new.assets.roots == [str(tmp_path)]
    assert line is not None and line.endswith(": changed limits.max_active")
    assert r.settling() is None and r.check() == (None, None)
    # An empty file that stays is the operator's: all defaults, once settled.
    path.write_text("")
    assert r.check() == (None, None)
    now[0] += settle
    new, line = r.check()
    assert new is not None and new.assets.roots == [] and line is not None and "assets.roots" in line
    # A SIGHUP says the edit is done: read at once.
    path.write_text(good)
    new, _ = r.check(force=True)
    assert new is not None and new.assets.roots == [str(tmp_path)]
