"""Nothing in the queue can hang a daemon or run unaccepted: damaged or edited job
files are quarantined with a located reason (issue 11, bugs 2 and 3)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from conftest import minimal, run_cli, write_json

from spool.core.model import QuarantineRecord, decode
from spool.disk.tree import Tree
from spool.queue import quarantine


def _reason(tree: Tree, name: str) -> QuarantineRecord:
    return decode((tree.quarantine / f"{name}.reason").read_bytes(), QuarantineRecord)


def _events(tree: Tree) -> list[dict]:
    out = []
    for f in tree.events.iterdir():
        out += [json.loads(line) for line in f.read_text().splitlines() if line.strip()]
    return out


def test_a_corrupt_job_file_in_pending_is_quarantined_and_drain_ends(tree: Tree, daemons):
    (tree.pending / "c1@1.json").write_text('{"job_id": "c1@1", broken')
    d = daemons(tree, "w1", drain=True)
    assert d.wait(timeout=30) == 0
    assert not (tree.pending / "c1@1.json").exists()
    assert (tree.quarantine / "c1@1.json").read_text() == '{"job_id": "c1@1", broken'
    rec = _reason(tree, "c1@1.json")
    assert rec.field == "job" and "not valid JSON" in rec.reason and rec.found_in == "pending"
    assert "quarantined pending/c1@1.json" in d.output()
    assert any(e["to"] == "quarantine" and e["job"] == "c1@1" for e in _events(tree))
    status = json.loads(run_cli("status", "--json", spool=tree, check=True).stdout)
    assert status["counts"]["quarantine"] == 1
    assert any(a["kind"] == "quarantine" and a["subject"] == "c1@1.json" for a in status["attention"])


def test_an_edited_recipe_is_never_rendered(tree: Tree, assets: Path, daemons):
    """Change the trim in pending/J.json and keep the hash: the claim refuses it."""
    run_cli(
        "submit",
        str(write_json(tree.root.parent / "j.json", minimal(assets, name="e"))),
        spool=tree,
        check=True,
    )
    path = tree.pending / "e@1.json"
    job = json.loads(path.read_text())
    job["recipe"]["steps"][0]["duration"] = 0.3
    os.chmod(path, 0o644)
    path.write_text(json.dumps(job))
    d = daemons(tree, "w1", drain=True)
    assert d.wait(timeout=60) == 0
    assert _reason(tree, "e@1.json").field == "recipe_hash"
    assert not (tree.manifests / "e@1.json").exists() and not list(tree.store.rglob("*.mp4"))
    assert not (tree.complete / "e@1.json").exists() and not (tree.failed / "e@1.json").exists()


def test_a_fifo_or_a_symlink_in_pending_cannot_hang_the_daemon(tree: Tree, daemons):
    os.mkfifo(tree.pending / "fifo@1.json")
    os.symlink("/etc/passwd", tree.pending / "link@1.json")
    d = daemons(tree, "w1", drain=True)
    assert d.wait(timeout=30) == 0
    assert _reason(tree, "fifo@1.json").field == "job"
    assert (tree.quarantine / "link@1.json").is_symlink()
    assert "symbolic link" in _reason(tree, "link@1.json").reason


def test_a_job_file_named_for_another_job_is_damaged(tree: Tree, assets: Path):
    run_cli(
        "submit",
        str(write_json(tree.root.parent / "j.json", minimal(assets, name="a"))),
        spool=tree,
        check=True,
    )
    data = (tree.pending / "a@1.json").read_bytes()
    try:
        quarantine.check("b@1.json", data)
    except quarantine.Damaged as d:
        assert d.field == "job_id"
    else:
        raise AssertionError("a job file under another job's name passed the check")
    assert quarantine.check("a@1.json", data).job_id == "a@1"


def test_fsck_reports_and_quarantines_a_damaged_job_file(tree: Tree, assets: Path):
    run_cli(
        "submit",
        str(write_json(tree.root.parent / "j.json", minimal(assets, name="f"))),
        spool=tree,
        check=True,
    )
    path = tree.pending / "f@1.json"
    job = json.loads(path.read_text())
    job["tags"]["campaign"] = "edited"
    job["recipe"]["steps"][0]["duration"] = 0.2
    os.chmod(path, 0o644)
    path.write_text(json.dumps(job))
    out = run_cli("fsck", "--no-repair", "--json", spool=tree)
    assert out.returncode != 0 and "recipe_hash" in out.stdout
    assert path.exists()  # --no-repair only reports
    run_cli("fsck", "--json", spool=tree)
    assert not path.exists() and _reason(tree, "f@1.json").field == "recipe_hash"


def test_a_crash_between_reason_and_move_is_finished_by_the_next_daemon(tree: Tree, daemons):
    (tree.pending / "c2@1.json").write_text("[]")
    d = daemons(tree, "w1", drain=True, env={"SPOOL_CRASH_AT": "after_quarantine_reason"})
    assert d.wait(timeout=30) == -9  # SIGKILLed itself at the crash point
    assert (tree.pending / "c2@1.json").exists() and (tree.quarantine / "c2@1.json.reason").exists()
    d = daemons(tree, "w1", drain=True)
    assert d.wait(timeout=30) == 0
    assert sorted(p.name for p in tree.quarantine.iterdir()) == ["c2@1.json", "c2@1.json.reason"]
    assert not (tree.pending / "c2@1.json").exists()


def test_an_edited_layer_plan_is_caught_like_an_edited_recipe(tree: Tree, assets: Path):
    steps = [
        {"op": "trim", "duration": 0.4},
        {"op": "text", "text": "Only £9.99", "size": 16, "fit": "shrink"},
        {"op": "encode", "preset": "ultrafast"},
    ]
    sub = minimal(assets, name="lab", steps=steps)
    run_cli("submit", str(write_json(tree.root.parent / "l.json", sub)), spool=tree, check=True)
    path = tree.pending / "lab@1.json"
    data = path.read_bytes()
    assert quarantine.check(path.name, data).job_id == "lab@1"
    job = json.loads(data)
    assert job["layers"], "a text step freezes its box"
    job["layers"][0]["at"][0] += 40  # move the label somewhere it was never checked
    try:
        quarantine.check(path.name, json.dumps(job).encode())
    except quarantine.Damaged as d:
        assert d.field == "recipe_hash"
    else:
        raise AssertionError("an edited layer plan passed the integrity check")
