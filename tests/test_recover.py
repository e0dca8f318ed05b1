"""Crash safety: a daemon SIGKILLed at each named crash point loses nothing.

Each test runs a real daemon that kills itself (SIGKILL, no cleanup) at one
point of a job's life, checks the invariants on the wreck, restarts a daemon
under the same identity, and checks that recovery decided by evidence: the
job ends complete, the first attempt's folder is intact, and the independent
checker (tools/invariants.py, which shares no code with spool) finds nothing.
"""

from __future__ import annotations

import json
import signal

import invariants
import pytest
from conftest import minimal, run_cli, state_files, wait_for, write_json

from spool.core.faults import POINTS

#: crash point -> (recovery decision expected at restart, attempts at the end)
EXPECTED = {
    "after_claim": ("retry", ["1"]),
    "after_attempt_dir": ("retry", ["1", "2"]),
    "mid_render": ("retry", ["1", "2"]),
    "after_validation": ("accept-candidate", ["1", "2"]),
    "after_store_link": ("accept-candidate", ["1", "2"]),
    "after_result": ("staged", ["1"]),
    "after_manifest": ("published", ["1"]),
    "mid_index": ("published", ["1"]),
    "after_index": ("published", ["1"]),
    "before_complete_rename": ("published", ["1"]),
}


def test_every_crash_point_has_an_expectation():
    assert set(EXPECTED) == set(POINTS)


def _job(assets):
    """Long enough (about a second of encoding) that FFmpeg reports progress mid-way."""
    return minimal(
        assets,
        name="crashy",
        steps=[
            {"op": "fit", "width": 1280, "height": 720},
            {"op": "encode", "preset": "medium"},
        ],
    )


def _snapshot(tree, n):
    d = tree.attempt_dir("crashy@1", n)
    return {p.relative_to(d).as_posix(): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("point", POINTS)
def test_crash_point_recovers_by_evidence(point, tree, assets, daemons):
    path = write_json(tree.root.parent / "j.json", _job(assets))
    run_cli("submit", str(path), spool=tree, check=True)
    d = daemons(tree, "w1", env={"SPOOL_CRASH_AT": point})
    assert d.wait(timeout=60) == -signal.SIGKILL, d.output()

    # The wreck: a job mid-transition, but no invariant of a final path broken.
    assert invariants.check(tree.root, settled=False) == []
    assert state_files(tree)["running"] == ["crashy@1.json"]
    before = _snapshot(tree, 1) if tree.attempt_dir("crashy@1", 1).exists() else None

    again = daemons(tree, "w1", drain=True)
    assert again.wait(timeout=60) == 0, again.output()
    assert state_files(tree) == {"pending": [], "complete": ["crashy@1.json"], "failed": [], "running": []}
    assert invariants.check(tree.root) == []

    decision, attempts = EXPECTED[point]
    recs = sorted(tree.job_attempts("crashy@1").glob("recovery-*.json"))
    assert recs, "recovery left no record of its decision"
    rec = json.loads(recs[0].read_text())
    assert rec["decision"] == decision, rec
    assert rec["evidence"]["job_id"] == "crashy@1"
    assert sorted(p.name for p in tree.job_attempts("crashy@1").iterdir() if p.name.isdigit()) == attempts
    if before is not None:
        after = _snapshot(tree, 1)
        # The first attempt is never deleted or written to by recovery.
        assert set(before) <= set(after)
        for name, data in before.items():
            if name != "progress.json":
                assert after[name] == data, f"recovery changed attempts/crashy@1/1/{name}"
    events = [json.loads(x) for f in tree.events.glob("*.jsonl") for x in f.read_text().splitlines()]
    assert any("recovery" in (e.get("reason") or "") for e in events)
    if decision == "accept-candidate":
        m = json.loads(tree.manifest_file("crashy@1").read_text())
        assert m["note"] == "accepted existing validated file" and m["attempt"] == 2


def test_partial_output_never_reaches_a_final_path(tree, assets, daemons):
    """Interrupt the winner after it wrote part of its output: recovery keeps the
    partial file in work/, validates it, and renders anew; the first attempt stays."""
    path = write_json(tree.root.parent / "j.json", _job(assets))
    run_cli("submit", str(path), spool=tree, check=True)
    a = daemons(tree, "a", env={"SPOOL_CRASH_AT": "mid_render"})
    b = daemons(tree, "b", env={"SPOOL_CRASH_AT": "mid_render"})
    # exactly one of the two claims the job and dies mid-render; the other idles
    winner = wait_for(lambda: next((d for d in (a, b) if not d.alive()), None), timeout=60)
    loser = b if winner is a else a
    assert winner.proc.returncode == -signal.SIGKILL
    assert loser.alive()
    loser.signal(signal.SIGTERM)
    assert loser.wait() == 0
    partial = list(tree.job_attempts("crashy@1").glob("1/work/*.mp4"))
    assert partial, "the winner died before writing any output"
    assert invariants.check(tree.root, settled=False) == []
    assert not tree.manifest_file("crashy@1").exists()
    worker = "a" if winner is a else "b"
    again = daemons(tree, worker, drain=True)
    assert again.wait(timeout=60) == 0
    assert invariants.check(tree.root) == []
    assert (tree.complete / "crashy@1.json").exists()
    assert (
        tree.attempt_dir("crashy@1", 1).is_dir()
        and (tree.attempt_dir("crashy@1", 1) / "attempt.json").exists()
    )
    for p in partial:
        assert p.exists(), "recovery deleted the old attempt's partial output"
