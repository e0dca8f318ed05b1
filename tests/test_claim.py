"""Claiming: exactly one winner, the lost-reply check, claim order."""

from __future__ import annotations

import errno
import json
import multiprocessing as mp
import os
import time
from pathlib import Path

import pytest
from conftest import minimal

from spool.disk.tree import Tree, transfer
from spool.queue import accept, claim

ROUNDS = 200


def _racer(root: str, worker: str, barrier, jobs: list[str], results) -> None:  # type: ignore[no-untyped-def]
    tree = Tree.at(root)
    won = []
    for jid in jobs:
        barrier.wait()
        if claim.claim(tree, worker, jid):
            won.append(jid)
    results.put((worker, won))


def test_second_worker_loses_claim_in_every_round(tmp_path: Path):
    tree = Tree.at(tmp_path / "spool")
    tree.create()
    jobs = [f"race-{i}@1" for i in range(ROUNDS)]
    for jid in jobs:
        (tree.pending / f"{jid}.json").write_text("{}")
    ctx = mp.get_context("fork")
    barrier = ctx.Barrier(2)
    results = ctx.Queue()
    procs = [ctx.Process(target=_racer, args=(str(tree.root), w, barrier, jobs, results)) for w in ("a", "b")]
    for p in procs:
        p.start()
    won = dict(results.get(timeout=60) for _ in procs)
    for p in procs:
        p.join(timeout=60)
    assert set(won["a"]).isdisjoint(won["b"]), "two workers won the same claim"
    assert sorted(won["a"] + won["b"]) == sorted(jobs), "a job was claimed by nobody"
    for jid in jobs:
        places = [
            p
            for p in (
                tree.running / "a" / f"{jid}.json",
                tree.running / "b" / f"{jid}.json",
                tree.pending / f"{jid}.json",
            )
            if p.exists()
        ]
        assert len(places) == 1


def test_lost_rename_reply_is_recognised_as_our_claim(tmp_path: Path):
    """On NFS a successful rename can report ENOENT; the claim then checks the destination."""
    tree = Tree.at(tmp_path / "spool")
    tree.create()
    (tree.running / "w1").mkdir()
    # The rename already happened (its reply was lost): the source is gone, the file is ours.
    (tree.running / "w1" / "job@1.json").write_text("{}")
    assert claim.claim(tree, "w1", "job@1") is True
    # ...but a file that went to somebody else is not ours.
    (tree.running / "w2").mkdir()
    (tree.running / "w2" / "other@1.json").write_text("{}")
    assert claim.claim(tree, "w1", "other@1") is False


def test_move_fails_for_a_worker_that_lost_the_job(tmp_path: Path):
    tree = Tree.at(tmp_path / "spool")
    tree.create()
    (tree.running / "w2").mkdir(parents=True)
    (tree.running / "w2" / "j@1.json").write_text("{}")  # recovered away to w2
    assert transfer(tree.job_file("running", "j@1", "w1"), tree.job_file("complete", "j@1")) is False
    assert not (tree.complete / "j@1.json").exists()
    assert claim.owns(tree, "w2", "j@1") and not claim.owns(tree, "w1", "j@1")


def test_claim_order_is_priority_then_submission_time(tree, cfg, assets):
    ids = []
    for name, prio in [("low-a", 0), ("high", 10), ("low-b", 0), ("urgent", 50), ("neg", -5)]:
        job = accept.accept_bytes(
            tree, cfg, json.dumps(minimal(assets, name=name, priority=prio)).encode(), "t"
        )
        ids.append(job.job_id)
    index = claim.PendingIndex(tree)
    assert index.refresh() == 5
    assert list(index.ordered()) == ["urgent@1", "high@1", "low-a@1", "low-b@1", "neg@1"]
    index.discard("urgent@1")
    assert next(index.ordered()) == "high@1"
    # A job that leaves pending/ disappears from the index on the next scan.
    assert claim.claim(tree, "w1", "high@1")
    index.refresh()
    assert "high@1" not in list(index.ordered())


def test_transfer_raises_what_is_not_a_lost_race(tmp_path: Path):
    """EXDEV (or EACCES, EROFS) is a located error, not a claim lost to somebody else."""
    shm = Path("/dev/shm")
    if not shm.is_dir() or os.stat(shm).st_dev == os.stat(tmp_path).st_dev:
        pytest.skip("needs /dev/shm on another filesystem than the test folder")
    src = shm / f"spool-transfer-{os.getpid()}.json"
    src.write_text("{}")
    try:
        with pytest.raises(OSError) as exc:
            transfer(src, tmp_path / "dst.json")
        assert exc.value.errno == errno.EXDEV
        assert src.exists()
    finally:
        src.unlink()


def test_transfer_creates_a_missing_destination_folder_once(tmp_path: Path):
    (tmp_path / "a.json").write_text("{}")
    assert transfer(tmp_path / "a.json", tmp_path / "new" / "a.json") is True
    assert (tmp_path / "new" / "a.json").exists() and not (tmp_path / "a.json").exists()
    # A source that is gone and a destination that never came: lost, not created.
    assert transfer(tmp_path / "b.json", tmp_path / "other" / "b.json") is False
    assert not (tmp_path / "other").exists()


def test_the_pending_index_lists_pending_again_only_when_it_changed(tree, cfg, assets, monkeypatch):
    """The daemon rescans pending/ every 2 s for jobs other hosts added (inotify is blind
    to them): while a stat shows the folder unchanged, the listing is kept
    (spool.disk.kept), and a job another process accepts is still found."""
    accept.accept_bytes(tree, cfg, json.dumps(minimal(assets, name="first")).encode(), "t")
    past = int((time.time() - 60) * 1e9)
    os.utime(tree.pending, ns=(past, past))  # last changed a minute ago
    listed: list[str] = []
    real, real_scan = os.listdir, os.scandir
    monkeypatch.setattr(os, "listdir", lambda p=".": listed.append(os.fspath(p)) or real(p))
    monkeypatch.setattr(os, "scandir", lambda p=".": listed.append(os.fspath(p)) or real_scan(p))
    index = claim.PendingIndex(tree)
    for _ in range(3):
        assert index.refresh() == 1
    assert listed.count(os.fspath(tree.pending)) == 1
    accept.accept_bytes(tree, cfg, json.dumps(minimal(assets, name="second")).encode(), "t")
    assert index.refresh() == 2
    assert list(index.ordered()) == ["first@1", "second@1"]
    assert listed.count(os.fspath(tree.pending)) == 2
