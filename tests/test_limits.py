"""Operator limits on renders, and nothing published when one is hit (issue 4, item 3)."""

from __future__ import annotations

import json
import subprocess
import time

import invariants
import pytest
from conftest import minimal, renders_at_once, run_cli, state_files, wait_for, write_json

from spool.core import settings
from spool.disk.tree import HOST


def _config(tree, **limits):
    settings.write(tree.config_file, {"limits": limits})


def _submit(tree, assets, name, steps=None, **over):
    path = write_json(tree.root.parent / f"{name}.json", minimal(assets, name=name, steps=steps, **over))
    return run_cli("submit", str(path), spool=tree)


BIG = [{"op": "fit", "width": 1280, "height": 720}, {"op": "encode", "preset": "medium", "crf": 10}]


def _nothing_published(tree, jid):
    assert not tree.manifest_file(jid).exists()
    assert not [p for p in (tree.store / "sha256").rglob("*") if p.is_file()]


def _failure(tree, jid):
    info = json.loads(run_cli("show", jid, "--json", spool=tree, check=True).stdout)
    assert info["state"] == "failed"
    return info["failure"]


def test_output_size_cap_stops_the_render_and_fails_the_job(tree, assets, daemons):
    _config(tree, output_size="200KiB")
    assert _submit(tree, assets, "huge", steps=BIG).returncode == 0
    assert daemons(tree, "w1", drain=True).wait(timeout=120) == 0
    f = _failure(tree, "huge@1")
    assert f["stage"] == "render" and f["property"] == "output_size" and not f["retryable"]
    _nothing_published(tree, "huge@1")
    assert invariants.check(tree.root) == []


def test_memory_limit_applies_to_ffmpeg(tree, assets, daemons):
    _config(tree, memory="40MiB", max_attempts=1)
    assert _submit(tree, assets, "starved", steps=BIG).returncode == 0
    assert daemons(tree, "w1", drain=True).wait(timeout=120) == 0
    f = _failure(tree, "starved@1")
    assert f["stage"] == "render" and f["property"] in ("ffmpeg_exit_status", "ffmpeg_killed")
    _nothing_published(tree, "starved@1")


def test_job_timeout_stops_a_long_render(tree, assets, daemons):
    _config(tree, job_timeout=0.5)
    assert _submit(tree, assets, "slow", steps=BIG).returncode == 0
    assert daemons(tree, "w1", drain=True).wait(timeout=120) == 0
    f = _failure(tree, "slow@1")
    assert f["property"] == "job_timeout" and f["expected"] == "<= 0.5 s"
    _nothing_published(tree, "slow@1")


def test_ffmpeg_runs_nice_and_at_idle_io_priority(tree, assets, daemons):
    _config(tree, nice=13, ionice=6)
    assert _submit(tree, assets, "polite", steps=BIG).returncode == 0
    d = daemons(tree, "w1")

    def ffmpeg_pid():
        out = subprocess.run(["pgrep", "-P", str(d.proc.pid), "ffmpeg"], capture_output=True, text=True)
        return int(out.stdout.split()[0]) if out.stdout.strip() else None

    pid = wait_for(ffmpeg_pid, timeout=60, interval=0.01)
    with open(f"/proc/{pid}/stat") as fh:
        stat = fh.read()
    nice = int(stat[stat.rindex(")") + 2 :].split()[16])
    prio = subprocess.run(["ionice", "-p", str(pid)], capture_output=True, text=True).stdout
    assert nice == 13
    assert "best-effort: prio 6" in prio
    d.signal(15)
    d.wait()


def test_a_render_that_cannot_fit_the_temp_disk_allowance_is_rejected(tree, assets):
    _config(tree, temp_disk="1MiB")
    res = _submit(tree, assets, "too-big", steps=BIG)
    assert res.returncode == 2
    assert "recipe: this render may need" in res.stderr and "limits.temp_disk" in res.stderr


def test_claims_stay_within_the_temp_disk_allowance(tree, assets, daemons):
    # Each small render reserves about 1.05 MiB: 1.5 MiB admits one at a time despite two slots.
    _config(tree, temp_disk="1.5MiB")
    for i in range(3):
        assert _submit(tree, assets, f"small-{i}").returncode == 0
    d = daemons(tree, "w1")
    wf = tree.worker_file(f"{HOST}-w1")
    seen = wait_for(
        lambda: (
            wf.exists()
            and json.loads(wf.read_text())["temp_disk_reserved"] > 0
            and json.loads(wf.read_text())
        ),
        timeout=30,
        interval=0.01,
    )
    assert 1 << 20 < seen["temp_disk_reserved"] <= int(1.5 * (1 << 20))
    assert seen["temp_disk_limit"] == int(1.5 * (1 << 20))
    wait_for(lambda: len(state_files(tree)["complete"]) == 3, timeout=60)
    d.signal(15)
    d.wait()
    # One render at a time (a publish prepared and waiting for its batch holds no slot and
    # no temporary disk: its output is the store's now).
    assert renders_at_once(d.output()) == 1
    running = peak = 0
    events = sorted(
        (json.loads(x) for f in tree.events.glob("*.jsonl") for x in f.read_text().splitlines()),
        key=lambda e: e["ts"],
    )
    for e in events:
        running += e["to"] == "running"
        running -= e.get("from") == "running"
        peak = max(peak, running)
    assert 1 <= peak <= 2  # the render, and at most the one whose publish is being committed


@pytest.fixture()
def small_attempts(tree):
    """attempts/ on its own 24 MiB tmpfs, so a test can fill that disk up."""
    proc = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=24m", "tmpfs", str(tree.attempts)],
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.strip()}")
    yield tree
    for _ in range(20):
        if subprocess.run(["umount", str(tree.attempts)], capture_output=True).returncode == 0:
            break
        time.sleep(0.2)


def _fill(folder):
    """Write until the disk is full (another program eating the space)."""
    with open(folder / "filler", "wb") as f:
        chunk = b"\0" * (1 << 16)
        try:
            while True:
                f.write(chunk)
                f.flush()
        except OSError:
            pass


def test_disk_full_fails_cleanly_with_a_record_and_nothing_published(small_attempts, assets, daemons):
    tree = small_attempts
    _config(tree, max_attempts=1)
    long = [{"op": "fit", "width": 1280, "height": 720}, {"op": "encode", "preset": "veryslow", "crf": 4}]
    assert _submit(tree, assets, "full", steps=long).returncode == 0
    d = daemons(tree, "w1", drain=True)
    out = tree.attempt_dir("full@1", 1) / "work" / "full.mp4"
    wait_for(lambda: out.exists() and out.stat().st_size > 0, timeout=60, interval=0.01)
    _fill(tree.attempts)
    assert d.wait(timeout=120) == 0
    f = _failure(tree, "full@1")
    assert f["property"] == "disk_space" and f["actual"] == "ENOSPC" and f["retryable"]
    # It sits in failed/: the next action must not promise an automatic retry.
    assert (tree.failed / "full@1.json").exists()
    assert "retried automatically" not in f["next_action"] and "by itself" in f["next_action"]
    assert "All 1 attempts are used" in f["next_action"] and "spool retry full@1" in f["next_action"]
    assert not out.exists()  # the partial output was removed to make room for the record
    _nothing_published(tree, "full@1")
    (tree.attempts / "filler").unlink()
    assert invariants.check(tree.root) == []
