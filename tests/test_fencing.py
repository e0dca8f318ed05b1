"""Fencing: a worker that lost its job while paused must not publish, manifest or move it."""

from __future__ import annotations

import json
import os
import signal

import invariants
from conftest import minimal, run_cli, state_files, wait_for, write_json

from spool.disk.tree import HOST
from spool.queue.attempt import staged_result


def test_paused_worker_resumes_after_its_job_was_recovered(tree, assets, daemons):
    job = minimal(assets, name="fenced", steps=[
        {"op": "fit", "width": 1280, "height": 720},
        {"op": "encode", "preset": "medium"},
    ])  # fmt: skip
    run_cli("submit", str(write_json(tree.root.parent / "f.json", job)), spool=tree, check=True)
    a = daemons(tree, "a")
    prog = tree.attempt_dir("fenced@1", 1) / "progress.json"
    wait_for(lambda: prog.exists() and (json.loads(prog.read_text())["percent"] or 0) > 0, timeout=60)
    os.killpg(a.proc.pid, signal.SIGSTOP)  # the daemon and its FFmpeg: a hung machine
    try:
        # A stopped process still exists on this host: only a forced, operator-named recovery acts.
        dry = run_cli("recover", "--dry-run", spool=tree, check=True).stdout
        assert "alive" in dry and "leaving" in dry
        out = run_cli("recover", "--worker", f"{HOST}-a", "--force", spool=tree, check=True).stdout
        assert "recovering" in out
        assert state_files(tree)["running"] == []
        b = daemons(tree, "b", drain=True)
        assert b.wait(timeout=120) == 0, b.output()
        assert state_files(tree)["complete"] == ["fenced@1.json"]
        manifest_before = tree.manifest_file("fenced@1").read_bytes()
    finally:
        os.killpg(a.proc.pid, signal.SIGCONT)

    # The paused worker wakes up, finishes its render, and hits its fence.
    lost = tree.attempt_dir("fenced@1", 1) / "interrupted.json"
    wait_for(lambda: lost.exists(), timeout=120)
    assert "lost ownership" in json.loads(lost.read_text())["reason"]
    a.signal(signal.SIGTERM)
    assert a.wait(timeout=60) == 0

    assert tree.manifest_file("fenced@1").read_bytes() == manifest_before
    m = json.loads(manifest_before)
    assert m["attempt"] != 1 and m["worker"] != f"{HOST}-a"
    objects = sorted(p.name for p in (tree.store / "sha256").rglob("*") if p.is_file())
    assert objects == [os.path.basename(m["output"]["store_path"])], "the fenced worker published"
    assert staged_result(tree.attempt_dir("fenced@1", 1)) is None  # nothing staged by the fenced worker
    completes = [
        json.loads(line)
        for f in tree.events.glob("*.jsonl")
        for line in f.read_text().splitlines()
        if json.loads(line)["to"] == "complete"
    ]
    assert len(completes) == 1 and completes[0]["worker"] != f"{HOST}-a"
    assert state_files(tree) == {"pending": [], "complete": ["fenced@1.json"], "failed": [], "running": []}
    assert invariants.check(tree.root) == []
