"""spool gc: unreferenced store objects and old work folders go; referenced outputs never do."""

from __future__ import annotations

import json
import os
import threading
import time

import invariants
from conftest import minimal, run_cli

from spool.queue import accept, claim, execute
from spool.repair import gc


def _render(tree, cfg, journal, assets, name, **over):
    job = accept.accept_bytes(tree, cfg, json.dumps(minimal(assets, name=name, **over)).encode(), "t")
    assert claim.claim(tree, "w1", job.job_id)
    return execute.execute(execute.Context(tree, cfg, "w1", journal, threading.Event()), job.job_id)


def _age(path, seconds):
    """Make an inode look old: gc reads ctime, which only the clock can set, so age mtime and
    pass a matching grace instead."""
    past = time.time() - seconds
    os.utime(path, (past, past))


def test_gc_removes_only_unreferenced_objects_and_old_work(tree, cfg, journal, assets):
    assert _render(tree, cfg, journal, assets, "kept") == "complete"
    assert _render(tree, cfg, journal, assets, "broken", output={"expect": {"width": 2}}) == "failed"
    # an orphan object: a whole, valid-looking file nobody references
    orphan_dir = tree.store / "sha256" / "ab"
    orphan_dir.mkdir(exist_ok=True)
    orphan = orphan_dir / ("ab" + "0" * 62 + ".mp4")
    orphan.write_bytes(b"x" * 1000)
    os.chmod(orphan, 0o444)

    # fresh objects are protected by the grace period
    rep = gc.collect(tree, retention=0.0, dry_run=True)
    assert rep.objects == [] and rep.kept_referenced == 1
    # with no grace, only the orphan goes; the referenced output stays
    rep = gc.collect(tree, retention=0.0, grace=0.0)
    assert rep.objects == [tree.relative(orphan)] and rep.object_bytes == 1000
    assert not orphan.exists()
    m = json.loads(tree.manifest_file("kept@1").read_text())
    assert (tree.root / m["output"]["store_path"]).exists()
    # both finished attempts' work folders went; their records stay
    assert sorted(rep.work_folders) == ["attempts/broken@1/1/work", "attempts/kept@1/1/work"]
    for jid in ("kept@1", "broken@1"):
        assert not (tree.attempt_dir(jid, 1) / "work").exists()
        assert (tree.attempt_dir(jid, 1) / "attempt.json").exists()
    assert run_cli("verify", spool=tree).returncode == 0
    assert invariants.check(tree.root) == []


def test_gc_keeps_work_within_retention_and_of_running_attempts(tree, cfg, journal, assets):
    assert _render(tree, cfg, journal, assets, "recent") == "complete"
    rep = gc.collect(tree, retention=3600.0, grace=0.0)
    assert rep.work_folders == []
    # an attempt in progress (job in running/, no closing record) is never collected
    job = accept.accept_bytes(tree, cfg, json.dumps(minimal(assets, name="busy")).encode(), "t")
    assert claim.claim(tree, "w1", job.job_id)
    from spool.queue.attempt import open_attempt

    att = open_attempt(tree, job.job_id, "w1")
    (att.work / "busy.mp4").write_bytes(b"partial")
    _age(att.dir / "attempt.json", 10_000)
    rep = gc.collect(tree, retention=0.0, grace=0.0)
    assert "attempts/busy@1/1/work" not in rep.work_folders
    assert (att.work / "busy.mp4").exists()


def test_gc_cli_dry_run_lists_without_removing(tree, cfg, journal, assets):
    assert _render(tree, cfg, journal, assets, "listed") == "complete"
    out = json.loads(run_cli("gc", "--dry-run", "--json", spool=tree, check=True).stdout)
    assert out["dry_run"] is True and out["kept_referenced"] == 1
    assert (tree.attempt_dir("listed@1", 1) / "work").exists()
