"""A really full spool disk (a small tmpfs mounted for the test): one line, backoff, a visible state."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import Daemon, minimal, run_cli, wait_for

from spool.core import settings
from spool.disk.tree import Tree
from spool.queue import status


@pytest.fixture()
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """A 4 MiB tmpfs; skipped where this process may not mount one."""
    mnt = tmp_path / "fs"
    mnt.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mnt)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs to fill ({done.stderr.decode().strip()})")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def _spool(fs: Path, assets: Path) -> Tree:
    t = Tree.at(fs / "spool")
    t.create()
    settings.write(
        t.config_file,
        {"assets": {"roots": [str(assets)]}, "daemon": {"poll_interval": 0.2, "heartbeat_interval": 0.5}},
    )
    return t


def _said(log: str) -> list[str]:
    """The log's lines above debug level (what an operator sees by default)."""
    return [line for line in log.splitlines() if " DEBUG " not in line]


def _fill(fs: Path) -> Path:
    filler = fs / "filler"
    with open(filler, "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 65536)
        except OSError:
            pass
    return filler


@pytest.mark.system
def test_a_full_disk_while_running_is_one_line_a_visible_state_and_goes_on_after(small_fs, assets, tmp_path):
    tree = _spool(small_fs, assets)
    d = Daemon(tree, "w1", log=tmp_path / "daemon.log")
    try:
        wait_for(lambda: "started on" in d.output(), timeout=30)
        hidden = tree.incoming / ".late.json"
        hidden.write_text(json.dumps(minimal(assets, name="late")))
        filler = _fill(small_fs)
        hidden.rename(tree.incoming / "late.json")  # a rename needs no space
        wait_for(lambda: "disk is full" in d.output(), timeout=30)
        wait_for(lambda: d.output().count("disk is still full") >= 3, timeout=30)  # retried
        out = d.output()
        assert out.count("disk is full") == 1 and "Traceback" not in out, out[-3000:]
        assert len(_said(out)) < 15, out  # the retries only at debug level
        view = json.loads(run_cli("status", "--json", spool=tree, check=True).stdout)
        assert view["counts"]["incoming"] == 1  # the drop the worker holds is counted, not hidden
        (disk,) = [a for a in view["attention"] if a["kind"] == "disk"]
        assert disk["problem"].startswith("disk full: the spool's filesystem has")
        assert "disk full" in run_cli("status", spool=tree, check=True).stdout

        filler.unlink()
        wait_for(lambda: status.locate(tree, "late@1") is not None, timeout=60)
        wait_for(lambda: "has space again" in d.output(), timeout=30)
        assert not [n for n in os.listdir(tree.incoming)], os.listdir(tree.incoming)
        assert d.alive()
        record = json.loads(tree.worker_file(f"{os.uname().nodename}-w1").read_text())
        wait_for(lambda: json.loads(tree.worker_file(record["worker"]).read_text())["state"] == "running")
    finally:
        d.kill()


@pytest.mark.system
def test_a_full_disk_at_start_is_one_line_without_the_config_and_a_stop_still_works(
    small_fs, assets, tmp_path
):
    tree = _spool(small_fs, assets)
    _fill(small_fs)
    d = Daemon(tree, "w1", log=tmp_path / "daemon.log")
    try:
        wait_for(lambda: "disk is full" in d.output(), timeout=30)
        wait_for(lambda: d.output().count("disk is still full") >= 3, timeout=30)  # retried
        out = d.output()
        assert "Traceback" not in out and "Config(" not in out and "╭" not in out, out[-3000:]
        assert out.count("disk is full") == 1 and len(_said(out)) <= 3, out
        d.signal(signal.SIGTERM)
        assert d.wait(timeout=30) == 0
    finally:
        if d.alive():
            d.kill()
