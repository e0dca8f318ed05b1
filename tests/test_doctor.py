"""``spool doctor`` on the filesystems of one machine (local disk, tmpfs), its choices,
and how the daemon applies them.

The network mount's side of the same report is in tests/test_nas.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import msgspec
import pytest
from conftest import minimal, run_cli, write_json

from spool import doctor
from spool.core import config, settings
from spool.disk.tree import HOST, Tree
from spool.doctor import Finding, strategy

MOUNTINFO = r"""22 27 0:21 / /proc rw,relatime - proc proc rw
27 1 254:0 / / rw,relatime - ext4 /dev/vda rw
30 27 0:27 / /dev/shm rw,relatime - tmpfs tmpfs rw
40 27 0:40 / /studio/nas rw,relatime - nfs4 filer:/export rw
41 40 0:41 / /studio/nas/cloud rw,relatime - fuse.rclone gdrive: rw
42 27 0:42 / /mnt/my\040drive rw,relatime - fuse.sshfs me@host:/x rw
43 27 0:43 / /mnt/stack rw,relatime - ext4 /dev/sdb rw
44 27 0:44 / /mnt/stack rw,relatime - fuse.sshfs over@host:/y rw
"""


def _spool(root: Path, overrides: settings.Overrides | None = None) -> tuple[Tree, config.Config]:
    t = Tree.at(root)
    t.create()
    return t, settings.write(t.config_file, overrides or {})


def _snapshot(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


# -- the mount ----------------------------------------------------------------------------


def test_mountinfo_names_the_mount_that_holds_a_path():
    def at(p: str) -> doctor.Mount:
        return doctor.mount_of(Path(p), MOUNTINFO)

    assert at("/srv/spool").fstype == "ext4" and at("/srv/spool").kind == "local"
    assert at("/dev/shm/spool").kind == "memory"
    assert at("/studio/nas/spool").fstype == "nfs4" and at("/studio/nas/spool").kind == "network"
    assert at("/studio/nas/cloud/spool").kind == "sync-drive"
    assert at("/studio/nascar").fstype == "ext4"  # a prefix of a name is not a parent folder
    assert at("/mnt/my drive/spool").fstype == "fuse.sshfs"  # octal escapes in mount points
    assert at("/mnt/stack/spool").fstype == "fuse.sshfs"  # stacked mounts: the last one wins
    assert doctor.classify("fuse.mystery") == "fuse"


def test_a_sync_drive_mount_is_reported_unsafe(tmp_path):
    tree, cfg = _spool(tmp_path / "spool")
    fake = f"27 1 254:0 / / rw - ext4 /dev/vda rw\n50 27 0:50 / {tmp_path} rw - fuse.rclone gdrive: rw\n"
    report = doctor.run(tree, cfg, quick=True, mountinfo=fake)
    assert report.mount.fstype == "fuse.rclone" and not report.safe
    assert any(w.startswith("UNSAFE") and "fuse.rclone" in w for w in report.warnings)
    assert report.watch.value == "poll"  # a shared mount: inotify cannot see other clients


# -- local disk and tmpfs -----------------------------------------------------------------


def _local_kind(path: Path) -> str:
    return doctor.mount_of(path).kind


def test_doctor_on_local_disk_chooses_link_and_inotify(tmp_path):
    if _local_kind(tmp_path) not in ("local", "memory"):
        pytest.skip(f"{tmp_path} is not on a local filesystem here")
    tree, cfg = _spool(tmp_path / "spool")
    before = _snapshot(tree.root)
    killed = tree.root / ".doctor" / f"{HOST}.999999999.abc123"  # a doctor killed mid-probe
    (killed / "watch-3").mkdir(parents=True)
    report = doctor.run(tree, cfg)
    f = report.findings
    assert report.safe and report.warnings == []
    assert f["rename"].ok and f["rename"].facts["here"]["missing"] == 0
    assert f["links"].ok and f["links"].facts["existing_errno"] == "EEXIST"
    assert f["o_excl"].ok and f["o_excl"].facts["existing_errno"] == "EEXIST"
    assert f["inotify"].facts["this_mount"] is True
    assert f["mtime"].facts["granularity_ns"] < 10**9  # local filesystems keep sub-second times
    assert f["space"].facts["free_bytes"] > 0
    # what one mount cannot tell is said, not guessed
    for key in ("rename_race", "lag"):
        assert f[key].ok is None and "cannot tell from one mount" in f[key].summary
    assert "cannot tell from one mount" in f["locks"].summary and f["locks"].facts["local"] is True
    assert (report.publish.value, report.watch.value) == ("link", "inotify")
    assert not report.publish.pinned and not report.watch.pinned
    # probe files are gone afterwards; nothing else in the spool changed
    assert _snapshot(tree.root) == before


def _tmpfs_dir(tmp_path: Path) -> Path:
    shm = Path("/dev/shm")
    if shm.is_dir() and doctor.mount_of(shm).kind == "memory" and os.access(shm, os.W_OK):
        d = shm / f"spool-doctor-test-{os.getpid()}-{tmp_path.name}"
        d.mkdir()
        return d
    pytest.skip("no writable tmpfs at /dev/shm")


def test_doctor_on_tmpfs_reports_a_memory_filesystem(tmp_path):
    d = _tmpfs_dir(tmp_path)
    try:
        tree, cfg = _spool(d / "spool")
        report = doctor.run(tree, cfg, quick=True)
        assert report.mount.fstype == "tmpfs" and report.mount.kind == "memory"
        assert report.findings["mtime"].facts["granularity_ns"] == 1
        assert report.findings["links"].ok and report.findings["inotify"].facts["this_mount"]
        assert (report.publish.value, report.watch.value) == ("link", "inotify")
        assert "memory filesystem" in report.watch.why
    finally:
        subprocess.run(["rm", "-rf", str(d)], check=True)


def test_a_second_path_to_the_same_local_folder_sees_everything(tmp_path):
    """--peer through a symlink on one disk: locks, inotify and listings are shared,
    the opposite of two network mounts (tests/test_nas.py)."""
    tree, cfg = _spool(tmp_path / "spool")
    (tmp_path / "other-view").symlink_to(tree.root)
    report = doctor.run(tree, cfg, peer=tmp_path / "other-view", lag_timeout=5)
    f = report.findings
    assert f["rename_race"].ok and f["rename_race"].facts["not_exactly_one"] == 0
    assert f["locks"].facts["across_mounts"] is True
    assert f["inotify"].facts["other_mount"] is True
    assert f["lag"].facts["listing_seconds"] < 1 and f["lag"].facts["stale_stat_seconds"] < 1
    assert f["links"].facts["race_not_exactly_one"] == 0 and f["o_excl"].facts["race_not_exactly_one"] == 0
    assert report.watch.value == "inotify" and "other mounts too" in report.watch.why


def test_a_listed_mount_measured_safe_across_two_mounts_is_safe(tmp_path):
    """The verdict follows what was measured (issue 23): a name on the cloud and sync-drive
    list only decides what is said before anything was measured."""
    tree, cfg = _spool(tmp_path / "spool")
    (tmp_path / "other-view").symlink_to(tree.root)
    fake = f"27 1 254:0 / / rw - ext4 /dev/vda rw\n50 27 0:50 / {tmp_path} rw - fuse.juicefs JuiceFS:v rw\n"
    named = doctor.run(tree, cfg, quick=True, mountinfo=fake)  # one mount: nothing measured across
    assert not named.safe and named.verdict.basis == "name"
    assert "spool doctor --peer" in named.verdict.why and named.warnings[0].startswith("UNSAFE")
    report = doctor.run(tree, cfg, peer=tmp_path / "other-view", lag_timeout=5, mountinfo=fake)
    assert report.mount.fstype == "fuse.juicefs"
    assert report.safe and report.verdict.basis == "measured", report.verdict
    why = report.verdict.why
    assert "one winner in 30 of 30 rename races" in why and "O_EXCL exact (30 races)" in why
    assert "hard links that never replace (30 link races)" in why and "listed through the peer" in why
    assert not any(w.startswith("UNSAFE") for w in report.warnings)
    assert report.to_json()["verdict"] == {"safe": True, "basis": "measured", "why": why}
    assert "=> verdict    safe (by measured)" in doctor.render(report)


def test_a_mount_measured_unsafe_is_unsafe_whatever_its_name():
    ext4 = doctor.Mount("/", "ext4", "/dev/vda", "")
    ok = doctor.Finding(True, "fine", {})
    f = {k: ok for k in ("rename", "rename_race", "o_excl", "lag")}
    f["rename"] = doctor.Finding(True, "replaces", {"replaces": True, "peer": {"missing": 0}})
    f["links"] = doctor.Finding(
        False, "yes; BUT 3 of 30 link races had two winners", {"exclusive": False, "race_rounds": 30}
    )
    v = doctor.verdict(ext4, f)
    assert not v.safe and v.basis == "measured" and "two winners" in v.why
    f["links"] = doctor.Finding(True, "yes", {"exclusive": True, "race_rounds": 30})
    f["rename_race"] = doctor.Finding(False, "DOUBLE OR NO WINS in 2 of 30 rename races", {"rounds": 30})
    juicefs = doctor.Mount("/", "fuse.juicefs", "JuiceFS:v", "")
    v = doctor.verdict(juicefs, f)
    assert not v.safe and v.basis == "measured" and "DOUBLE OR NO WINS" in v.why


def test_quick_probe_takes_well_under_a_second_on_local_disk(tmp_path):
    tree, cfg = _spool(tmp_path / "spool")
    t0 = time.monotonic()
    report = doctor.run(tree, cfg, quick=True)
    assert time.monotonic() - t0 < 1.0, report.seconds


# -- choices ------------------------------------------------------------------------------


def test_pinned_strategies_win_over_the_probes(tmp_path):
    tree, cfg = _spool(tmp_path / "spool", {"filesystem": {"publish": "copy"}, "daemon": {"watch": "poll"}})
    assert cfg.filesystem.publish == "copy" and cfg.daemon.watch == "poll"
    report = doctor.run(tree, cfg, quick=True)
    assert report.publish == doctor.Choice("copy", "pinned in spool.toml ([filesystem] publish)", True)
    assert report.watch.value == "poll" and report.watch.pinned


def test_choices_follow_the_findings():
    cfg = config.Config()
    local = doctor.Mount("/", "ext4", "/dev/vda", "")
    nfs = doctor.Mount("/nas", "nfs4", "filer:/x", "")
    fires = doctor.Finding(True, "", {"this_mount": True})
    blind = doctor.Finding(True, "", {"this_mount": True, "other_mount": False})
    silent = doctor.Finding(False, "", {"this_mount": False})
    assert doctor.choose_watch(cfg, local, fires).value == "inotify"
    assert doctor.choose_watch(cfg, nfs, fires).value == "poll"
    assert doctor.choose_watch(cfg, local, blind).value == "poll"
    assert doctor.choose_watch(cfg, local, silent).value == "poll"
    assert doctor.choose_publish(cfg, doctor.Finding(True, "yes")).value == "link"
    no_links = doctor.Finding(False, "no hard links here (link fails with EIO)")
    assert doctor.choose_publish(cfg, no_links).value == "copy"
    pinned = msgspec.structs.replace(cfg, filesystem=config.Filesystem(publish="link"))
    assert doctor.choose_publish(pinned, no_links).value == "link"


def test_config_has_a_filesystem_section_with_auto_by_default():
    assert config.Config().filesystem.publish == "auto"
    parsed = config.parse(config.template([]).encode())
    assert parsed.filesystem.publish == "auto"
    assert "[filesystem]" in config.template([]) and "auto | link | copy" in config.template([])
    with pytest.raises(config.ConfigError, match=r"filesystem\.publish"):
        config.parse(b'[filesystem]\npublish = "symlink"\n')


# -- the command --------------------------------------------------------------------------


def test_cli_doctor_prints_findings_and_choices(tree):
    out = run_cli("doctor", spool=tree, check=True).stdout
    for word in ("rename", "hard links", "O_EXCL", "locks", "inotify", "listing lag", "mtime", "free space"):
        assert word in out
    assert "=> publish" in out and "=> watch" in out
    data = json.loads(run_cli("doctor", "--quick", "--json", spool=tree, check=True).stdout)
    assert set(data) >= {"spool", "mount", "probes", "choices", "warnings", "safe"}
    assert data["choices"]["publish"]["value"] in ("link", "copy")
    assert data["choices"]["watch"]["poll_interval"] == 0.2
    assert data["probes"]["links"]["ok"] is True


def test_cli_peer_must_show_the_same_spool(tree, tmp_path):
    other = Tree.at(tmp_path / "another")
    other.create()
    proc = run_cli("doctor", "--peer", str(other.root), "--lag-timeout", "0.5", "--json", spool=tree)
    assert proc.returncode == 2
    assert "not show this spool's files" in json.loads(proc.stdout)["error"]
    assert not (tree.root / ".doctor").exists()


def test_doctor_leaves_no_doctor_folder_behind(tree):
    before = _snapshot(tree.root)
    run_cli("doctor", "--quick", spool=tree, check=True)
    assert not (tree.root / ".doctor").exists()
    assert _snapshot(tree.root) == before


def test_a_lab_still_in_use_keeps_the_doctor_folder(tree):
    other = tree.root / ".doctor" / "elsewhere.4242.abcdef"  # another host's doctor, mid-probe
    other.mkdir(parents=True)
    doctor.run(tree, config.load(tree.config_file), quick=True)
    assert [p.name for p in (tree.root / ".doctor").iterdir()] == [other.name]


# -- the daemon applies the choices -------------------------------------------------------


def test_daemon_logs_the_probe_and_publishes_by_link_by_default(tree, assets, daemons):
    run_cli("submit", str(write_json(tree.root.parent / "j.json", minimal(assets))), spool=tree, check=True)
    d = daemons(tree, "w1", drain=True)
    assert d.wait() == 0, d.output()
    line = next(x for x in d.output().splitlines() if "filesystem:" in x and "probed in" in x)
    assert "publish by link" in line and "watch by inotify" in line, line
    assert float(line.split("probed in ")[1].split(" s")[0]) < 1.0
    assert "inotify + polling" in d.output()
    manifest = json.loads(tree.manifest_file("plain@1").read_text())
    assert manifest["output"]["method"] == "link"


def test_daemon_applies_pinned_copy_and_poll(tree, assets, daemons):
    settings.write(tree.config_file, {"filesystem": {"publish": "copy"}, "daemon": {"watch": "poll"}})
    run_cli("submit", str(write_json(tree.root.parent / "j.json", minimal(assets))), spool=tree, check=True)
    d = daemons(tree, "w1", drain=True)
    assert d.wait() == 0, d.output()
    assert "publish by copy (pinned" in d.output() and "watch by poll (pinned" in d.output()
    assert "(max_active 2, polling)" in d.output()  # no inotify observer was started
    manifest = json.loads(tree.manifest_file("plain@1").read_text())
    assert manifest["output"]["method"] == "copy"
    store_file = tree.root / manifest["output"]["store_path"]
    assert store_file.stat().st_nlink == 1  # a copy, not a second name of the candidate


def test_doctor_says_when_mount_lag_is_shorter_than_the_measured_lag(tmp_path):
    """Recovery through another mount waits [recovery] mount_lag for the dead worker's
    last writes to show; the doctor measured how late they show and says when that is longer."""
    tree, cfg = _spool(tmp_path / "spool")
    (tmp_path / "other-view").symlink_to(tree.root)
    fake = f"27 1 254:0 / / rw - ext4 /dev/vda rw\n50 27 0:50 / {tmp_path} rw - fuse.juicefs JuiceFS:v rw\n"
    report = doctor.run(tree, cfg, peer=tmp_path / "other-view", lag_timeout=5, mountinfo=fake)
    assert not any("mount_lag" in w for w in report.warnings)  # a symlink: no lag at all
    f = dict(report.findings)
    f["lag"] = Finding(True, "measured", {"listing_seconds": 5.0, "stale_stat_seconds": 7.5})
    args = (report.mount, f, report.publish, report.watch, report.verdict)
    cfg.recovery.mount_lag = 10.0
    [warned] = [w for w in strategy.warnings(cfg, *args) if "mount_lag" in w]
    assert "7.5 s late" in warned and "at least 15 s" in warned
    cfg.recovery.mount_lag = 15.0
    assert not any("mount_lag" in w for w in strategy.warnings(cfg, *args))
