"""spool fsck: planted damage of each kind is repaired or reported; a clean spool exits 0."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import threading
import time

import invariants
import pytest
from conftest import minimal, run_cli, wait_for
from libhelp import allow_noop, as_format_1, noop_sub

from spool.core.model import Manifest
from spool.disk import store
from spool.disk.records import read
from spool.disk.tree import HOST
from spool.queue import accept, claim, execute
from spool.queue.attempt import staged_result
from spool.repair import fsck as fsck_mod


@pytest.fixture()
def done(tree, cfg, journal, assets):
    """A spool with one complete and one failed job, rendered for real."""
    for name, over in (("good", {}), ("bad", {"output": {"expect": {"width": 1}}})):
        job = accept.accept_bytes(tree, cfg, json.dumps(minimal(assets, name=name, **over)).encode(), "t")
        assert claim.claim(tree, "w1", job.job_id)
        execute.execute(execute.Context(tree, cfg, "w1", journal, threading.Event()), job.job_id)
    assert (tree.complete / "good@1.json").exists() and (tree.failed / "bad@1.json").exists()
    return tree


def fsck(tree, *args):
    res = run_cli("fsck", "--json", *args, spool=tree)
    return res.returncode, json.loads(res.stdout)


def store_file(tree):
    m = json.loads(tree.manifest_file("good@1").read_text())
    return tree.root / m["output"]["store_path"]


def test_clean_spool_exits_zero(done):
    code, out = fsck(done)
    assert code == 0 and out == {"clean": True, "problems": []}
    assert "clean" in run_cli("fsck", spool=done).stdout


def test_job_in_two_states_is_repaired_keeping_complete(done):
    shutil.copyfile(done.complete / "good@1.json", done.pending / "good@1.json")
    assert invariants.check(done.root)  # the independent checker sees it too
    code, out = fsck(done)
    assert code == 0
    [p] = out["problems"]
    assert p["invariant"] == 1 and p["repaired"]
    assert not (done.pending / "good@1.json").exists() and (done.complete / "good@1.json").exists()
    assert invariants.check(done.root) == []


def test_job_in_two_states_without_a_verified_manifest_is_reported(done):
    shutil.copyfile(done.failed / "bad@1.json", done.pending / "bad@1.json")
    code, out = fsck(done)
    assert code == 1
    [p] = out["problems"]
    assert p["invariant"] == 1 and not p["repaired"]
    assert (done.pending / "bad@1.json").exists()  # nothing guessed


def test_manifest_that_does_not_match_its_store_file_is_reported(done):
    path = done.manifest_file("good@1")
    m = json.loads(path.read_text())
    m["output"]["sha256"] = "0" * 64
    os.chmod(path, 0o644)
    path.write_text(json.dumps(m))
    code, out = fsck(done)
    assert code == 1
    assert any(p["invariant"] == 3 and "does not match" in p["problem"] for p in out["problems"])
    assert invariants.check(done.root)


def test_complete_without_manifest_is_repaired_from_the_staged_result(done):
    os.unlink(done.manifest_file("good@1"))
    code, out = fsck(done)
    assert code == 0
    [p] = out["problems"]
    assert p["invariant"] == 3 and p["repaired"] and "attempt 1" in p["repair"]
    staged = staged_result(done.attempt_dir("good@1", 1))
    assert staged is not None and read(done.manifest_file("good@1"), Manifest) == staged
    assert invariants.check(done.root) == []


def test_writable_store_file_is_made_read_only(done):
    f = store_file(done)
    os.chmod(f, 0o644)
    code, out = fsck(done)
    assert code == 0
    assert [p["invariant"] for p in out["problems"]] == [2]
    assert not f.stat().st_mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH)


def test_store_object_that_does_not_hash_to_its_name_is_reported(done):
    f = store_file(done)
    os.chmod(f, 0o644)
    with open(f, "r+b") as fh:
        fh.write(b"garbage!")
    os.chmod(f, 0o444)
    code, out = fsck(done)
    assert code == 1
    problems = {(p["invariant"], p["path"]) for p in out["problems"]}
    assert (2, done.relative(f)) in problems
    assert any(p["invariant"] == 3 for p in out["problems"])  # and the manifest no longer matches


def test_orphaned_running_job_is_reported_with_the_recover_command(done):
    ghost = done.running / "otherhost-ghost"
    ghost.mkdir()
    shutil.copyfile(done.failed / "bad@1.json", ghost / "lost@1.json")
    code, out = fsck(done)
    assert code == 1
    [p] = [p for p in out["problems"] if p["invariant"] == 8]
    assert "spool recover --worker otherhost-ghost" in p["repair"] and not p["repaired"]


def test_attempt_without_record_and_failed_without_failure_are_reported(done):
    os.unlink(done.attempt_dir("bad@1", 1) / "failure.json")
    os.unlink(done.attempt_dir("good@1", 1) / "attempt.json")
    code, out = fsck(done)
    assert code == 1
    kinds = {p["invariant"] for p in out["problems"]}
    assert {4, 6} <= kinds
    assert invariants.check(done.root)


def test_old_crash_leftovers_are_removed_young_ones_kept(done):
    old = done.pending / ".x@1.json.host.1.abcd.tmp"
    young = done.pending / ".y@1.json.host.2.abcd.tmp"
    staging = done.job_attempts("good@1") / ".new.host.3.abcd"
    for p in (old, young):
        p.write_text("{")
    staging.mkdir()
    past = time.time() - 3600
    os.utime(old, (past, past))
    os.utime(staging, (past, past))
    code, out = fsck(done)
    assert code == 0
    assert sorted(p["path"] for p in out["problems"]) == sorted([done.relative(old), done.relative(staging)])
    assert not old.exists() and not staging.exists() and young.exists()


def _dead_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


def test_a_daemon_sweeps_dead_writers_leftovers_once_started_and_never_a_live_ones(done, daemons):
    # The sweep runs on a thread of its own after the start (over a NAS the walk of every
    # job folder is minutes): a draining daemon lets it finish before it exits.
    dead = _dead_pid()
    gone = [
        done.attempt_dir("good@1", 1) / f".attempt.json.{HOST}.{dead}.abcd0123.tmp",
        done.job_attempts("bad@1") / f".new.{HOST}.{dead}.abcd0123",
        done.pending / f".x@1.json.{HOST}.{dead}.abcd0123.tmp",
    ]
    kept = done.attempt_dir("good@1", 1) / f".result.json.{HOST}.{os.getpid()}.abcd0123.tmp"
    for p in [*gone, kept]:
        if p.name.startswith(".new."):
            p.mkdir()
        else:
            p.write_text("{")
    d = daemons(done, drain=True)
    assert d.wait(timeout=60) == 0, d.output()[-2000:]
    assert [p for p in gone if p.exists()] == [] and kept.exists()


def test_a_daemon_walks_every_job_folder_only_when_its_worker_owes_the_walk(done, daemons):
    """The walk of every job folder in attempts/ (over a NAS a dozen requests a job ever
    run, at every start) runs when the worker's previous process died or there was none,
    not after a clean stop; the shared folders are swept at every start."""
    from spool.core.model import WorkerRecord
    from spool.disk.records import read

    def read_record() -> WorkerRecord | None:
        return read(done.worker_file(f"{HOST}-w1"), WorkerRecord, replaced=True)  # heartbeats replace it

    def record() -> WorkerRecord:
        rec = read_record()
        assert rec is not None
        return rec

    def running_as(pid: int) -> bool:
        rec = read_record()
        return rec is not None and rec.pid == pid and rec.state == "running"

    first = daemons(done, drain=True)  # no previous process: walks, then stops cleanly
    assert first.wait(timeout=60) == 0, first.output()[-2000:]
    assert (record().state, record().leftovers_owed) == ("stopped", False)
    dead = _dead_pid()
    deep = done.attempt_dir("good@1", 1) / f".attempt.json.{HOST}.{dead}.abcd0123.tmp"
    flat = done.pending / f".x@1.json.{HOST}.{dead}.abcd0123.tmp"
    for p in (deep, flat):
        p.write_text("{")
    clean = daemons(done, drain=True)  # its previous process stopped cleanly: no walk
    assert clean.wait(timeout=60) == 0, clean.output()[-2000:]
    assert not flat.exists() and deep.exists()
    killed = daemons(done)
    wait_for(lambda: running_as(killed.proc.pid))
    killed.kill()  # as a crash leaves it: its record says running
    after = daemons(done, drain=True)
    assert after.wait(timeout=60) == 0, after.output()[-2000:]
    assert not deep.exists(), "a start after a crash walks every job folder"
    assert (record().state, record().leftovers_owed) == ("stopped", False)


def test_a_stopped_sweep_leaves_the_job_folders_it_did_not_reach(done):
    dead = _dead_pid()
    flat = done.pending / f".x@1.json.{HOST}.{dead}.abcd0123.tmp"
    deep = done.attempt_dir("good@1", 1) / f".attempt.json.{HOST}.{dead}.abcd0123.tmp"
    for p in (flat, deep):
        p.write_text("{")
    assert [p.path for p in fsck_mod.sweep_leftovers(done, stop=lambda: True)] == [done.relative(flat)]
    assert not flat.exists() and deep.exists()
    assert [p.path for p in fsck_mod.sweep_leftovers(done)] == [done.relative(deep)]
    assert not deep.exists()


def test_a_daemons_sweep_lists_the_stores_temp_folder_not_its_256_shards(done, monkeypatch):
    """Copies into the store take their temp names in ``store/sha256/`` (store.temp_folder):
    the daemon's sweep removes a dead writer's there and lists no shard (over a NAS 256
    listings were ~1,500 requests at each start); ``spool fsck`` still finds what code
    before wrote in a shard."""
    dead = _dead_pid()
    top = store.temp_folder(done) / f".{'a' * 64}.bin.{HOST}.{dead}.abcd0123.tmp"
    old_code = store.temp_folder(done) / "ab" / f".{'b' * 64}.bin.{HOST}.{dead}.abcd0123.tmp"
    for p in (top, old_code):
        p.write_text("partial")
    listed: list[str] = []
    real_scandir = os.scandir
    monkeypatch.setattr(os, "scandir", lambda p=".": listed.append(os.fspath(p)) or real_scandir(p))
    swept = [p.path for p in fsck_mod.sweep_leftovers(done)]
    assert swept == [done.relative(top)] and not top.exists() and old_code.exists()
    shards = str(store.temp_folder(done))
    assert shards in listed and not [p for p in listed if p.startswith(shards + os.sep)]
    code, out = fsck(done)
    assert code == 0 and [p["path"] for p in out["problems"]] == [done.relative(old_code)]
    assert not old_code.exists()


def test_leftovers_deep_in_the_tree_are_removed_too(done):
    """A temp name is left wherever a write by temp name was cut: an attempt's records, the
    library's segments, held/ (on a NAS every write-once file takes a temp name)."""
    places = [
        done.attempt_dir("good@1", 1) / ".attempt.json.host.1.abcd0123.tmp",
        done.job_attempts("good@1") / ".delay.json.host.1.abcd0123.tmp",
        done.root / "index" / "_segments" / ".x.jsonl.host.1.abcd0123.tmp",
        done.held / ".z@1.json.host.1.abcd0123.tmp",
    ]
    past = time.time() - 3600
    for p in places:
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text("{")
        os.utime(p, (past, past))
    code, out = fsck(done)
    assert code == 0
    assert sorted(p["path"] for p in out["problems"]) == sorted(done.relative(p) for p in places)
    assert not any(p.exists() for p in places)


def test_no_repair_only_reports(done):
    f = store_file(done)
    os.chmod(f, 0o644)
    res = run_cli("fsck", "--no-repair", spool=done)
    assert res.returncode == 1 and "PROBLEM" in res.stdout
    assert f.stat().st_mode & stat.S_IWUSR


# -- issue 11, item 14: a job in no state; a tampered store object with an intact copy ----------------


def test_accepting_keeps_a_frozen_copy_of_the_job(done):
    """Format 2 (a new spool): the copy is the job file's second name, so the same bytes by
    construction, and it outlives the job file's name (what fsck restores from, below)."""
    copy = done.job_attempts("good@1") / "job.json"
    assert copy.read_bytes() == (done.complete / "good@1.json").read_bytes()
    assert copy.stat().st_ino == (done.complete / "good@1.json").stat().st_ino


def test_accepting_keeps_a_read_only_frozen_copy_of_the_job_in_format_1(tree):
    as_format_1(tree)
    cfg = allow_noop(tree)
    job = accept.accept_bytes(tree, cfg, noop_sub("old"), "t")
    copy = tree.job_attempts(job.job_id) / "job.json"
    assert copy.read_bytes() == tree.job_file("pending", job.job_id).read_bytes()
    assert stat.S_IMODE(copy.stat().st_mode) == 0o444
    assert copy.stat().st_ino != tree.job_file("pending", job.job_id).stat().st_ino


@pytest.mark.parametrize(("state", "jid"), [("complete", "good@1"), ("failed", "bad@1")])
def test_a_job_deleted_from_its_state_is_restored_where_the_evidence_says(done, state, jid):
    original = (done.root / state / f"{jid}.json").read_bytes()
    (done.root / state / f"{jid}.json").unlink()
    code, out = fsck(done)
    assert code == 0, out
    [p] = out["problems"]
    assert p["invariant"] == 1 and p["path"] == jid and p["problem"].startswith("in no state")
    assert p["repaired"] and p["repair"].startswith(f"restore {state}/{jid}.json from its frozen copy")
    assert (done.root / state / f"{jid}.json").read_bytes() == original
    assert fsck(done) == (0, {"clean": True, "problems": []})


def test_a_job_without_an_outcome_is_restored_to_held_not_rendered_again(tree, cfg, assets):
    job = accept.accept_bytes(tree, cfg, json.dumps(minimal(assets, name="waiting")).encode(), "t")
    (tree.pending / f"{job.job_id}.json").unlink()
    code, out = fsck(tree)
    assert code == 0 and out["problems"][0]["repair"].startswith("restore held/waiting@1.json")
    assert (tree.held / "waiting@1.json").exists() and not (tree.pending / "waiting@1.json").exists()


def test_a_job_in_no_state_without_a_copy_is_reported_with_what_to_do(done):
    (done.complete / "good@1.json").unlink()
    (done.job_attempts("good@1") / "job.json").unlink()
    code, out = fsck(done, "--no-repair")
    assert code == 1
    [p] = out["problems"]
    assert (
        p["path"] == "good@1" and "no frozen copy of the job exists" in p["problem"] and p["repair"] is None
    )


def test_a_tampered_store_object_is_restored_from_an_intact_work_copy(done):
    obj = store_file(done)
    digest = obj.name.split(".")[0]
    m = json.loads(done.manifest_file("good@1").read_text())
    work = done.attempt_dir("good@1", m["attempt"]) / "work"
    assert any(p.is_file() for p in work.rglob("*")), "the candidate is still in work/"
    fake = obj.parent / ".fake"
    fake.write_bytes(b"tampered" * 100)
    os.rename(fake, obj)  # replaced, not written through: the work/ link keeps the original
    code, out = fsck(done)
    assert code == 0, out
    [p] = out["problems"]
    assert (
        p["invariant"] == 2 and p["repaired"] and p["repair"].startswith("restore it from attempts/good@1/")
    )
    from spool.disk.store import sha256_file

    assert sha256_file(obj)[0] == digest
    assert stat.S_IMODE(obj.stat().st_mode) == 0o444
    assert fsck(done) == (0, {"clean": True, "problems": []})


def test_a_tampered_store_object_without_an_intact_copy_is_reported(done):
    obj = store_file(done)
    m = json.loads(done.manifest_file("good@1").read_text())
    shutil.rmtree(done.attempt_dir("good@1", m["attempt"]) / "work")
    fake = obj.parent / ".fake"
    fake.write_bytes(b"tampered")
    os.rename(fake, obj)
    code, out = fsck(done)
    assert code == 1
    assert any("no intact copy with that hash" in p["problem"] for p in out["problems"])


def test_a_quarantined_job_is_not_taken_for_a_job_in_no_state(tree, cfg, assets):
    job = accept.accept_bytes(tree, cfg, json.dumps(minimal(assets, name="edited")).encode(), "t")
    path = tree.pending / f"{job.job_id}.json"
    os.chmod(path, 0o644)
    edited = json.loads(path.read_text())
    edited["recipe"]["steps"][0]["duration"] = 0.5  # recipe_hash kept: an edit after acceptance
    path.write_text(json.dumps(edited))
    code, out = fsck(tree)
    assert code == 0, out
    assert [p["invariant"] for p in out["problems"]] == [5]  # quarantined, not restored from the copy
    assert (tree.quarantine / "edited@1.json").exists() and not (tree.held / "edited@1.json").exists()
    assert fsck(tree) == (0, {"clean": True, "problems": []})
