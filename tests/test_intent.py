"""Intent kept apart from retries: retry, revise, cancel, approve, hold and release."""

from __future__ import annotations

import json
import os
import signal
import time

import invariants
from conftest import minimal, run_cli, state_files, wait_for, write_json

from spool.core import settings


def _submit(tree, assets, name, **over):
    path = write_json(tree.root.parent / f"{name}.json", minimal(assets, name=name, **over))
    return run_cli("submit", str(path), spool=tree, check=True).stdout.strip()


def _show(tree, jid):
    return json.loads(run_cli("show", jid, "--json", spool=tree, check=True).stdout)


def _drain(tree, daemons):
    assert daemons(tree, "w1", drain=True).wait(timeout=120) == 0


def test_retry_sends_a_failed_job_back_with_the_same_job_file(tree, assets, daemons):
    settings.write(tree.config_file, {"limits": {"max_attempts": 1}})
    jid = _submit(tree, assets, "again")
    original = (tree.pending / f"{jid}.json").read_bytes()
    os.rename(assets / "clip.mp4", assets / "clip.away")
    _drain(tree, daemons)
    assert state_files(tree)["failed"] == [f"{jid}.json"]
    os.rename(assets / "clip.away", assets / "clip.mp4")  # the operator fixed the cause
    assert run_cli("retry", jid, spool=tree).returncode == 0
    assert (tree.pending / f"{jid}.json").read_bytes() == original
    _drain(tree, daemons)
    info = _show(tree, jid)
    assert info["state"] == "complete"
    assert [a["n"] for a in info["attempts"]] == [1, 2]
    assert info["manifest"]["attempt"] == 2
    assert (tree.job_attempts(jid) / "retry-1.json").exists()
    assert run_cli("retry", jid, spool=tree).returncode == 2  # only failed jobs can be retried
    assert invariants.check(tree.root) == []


def test_revise_makes_a_new_revision_that_supersedes_the_old(tree, assets, daemons):
    jid = _submit(tree, assets, "ad", output={"expect": {"duration_tolerance": 0.3}})
    _drain(tree, daemons)
    old_file = (tree.complete / f"{jid}.json").read_bytes()
    recipe = tree.root.parent / "new-recipe.json"
    recipe.write_text(json.dumps({"input": "clip", "steps": [
        {"op": "trim", "duration": 0.8},
        {"op": "fit", "width": 160, "height": 90},
        {"op": "overlay", "source": "logo"},
        {"op": "encode", "container": "webm", "video_codec": "vp9", "preset": "ultrafast"},
    ]}))  # fmt: skip
    res = run_cli(
        "revise",
        jid,
        "--recipe",
        str(recipe),
        "--source",
        f"logo={assets / 'logo.png'}",
        "--by",
        "editor",
        spool=tree,
    )
    assert res.returncode == 0, res.stderr
    new = res.stdout.strip()
    assert new == "ad@2"
    job = _show(tree, new)["job"]
    assert job["supersedes"] == jid and job["submitted_by"] == "editor"
    assert {s["role"] for s in job["sources"]} == {"clip", "logo"}
    assert job["output"]["file"] == "ad.webm"
    assert job["output"]["expect"]["width"] == 160  # re-derived from the new recipe
    assert job["output"]["expect"]["duration_tolerance"] == 0.3  # stated, carried over
    assert job["recipe_hash"] != _show(tree, jid)["job"]["recipe_hash"]
    assert (tree.complete / f"{jid}.json").read_bytes() == old_file  # the old job is untouched
    assert "supersedes ad@1" in run_cli("show", new, spool=tree, check=True).stdout
    _drain(tree, daemons)
    assert _show(tree, new)["state"] == "complete"


def test_revise_rejects_a_bad_recipe_naming_the_field(tree, assets):
    jid = _submit(tree, assets, "ad")
    recipe = tree.root.parent / "bad.json"
    recipe.write_text(json.dumps({"input": "clip", "steps": [{"op": "blur"}]}))
    res = run_cli("revise", jid, "--recipe", str(recipe), spool=tree)
    assert res.returncode == 2 and "recipe.steps[0].op" in res.stderr
    assert state_files(tree)["pending"] == [f"{jid}.json"]


def test_cancel_pending_and_held_jobs(tree, assets):
    a = _submit(tree, assets, "waiting")
    b = _submit(tree, assets, "aside")
    assert run_cli("hold", b, spool=tree).returncode == 0
    assert run_cli("cancel", a, "--by", "an editor", spool=tree).returncode == 0
    assert run_cli("cancel", b, spool=tree).returncode == 0
    for jid in (a, b):
        f = _show(tree, jid)["failure"]
        assert f["stage"] == "cancel" and f["property"] == "cancelled" and f["next_action"]
    assert "an editor" in _show(tree, a)["failure"]["message"]
    assert run_cli("cancel", a, spool=tree).returncode == 2  # already failed
    assert os.listdir(tree.running) == []  # the canceller's holding folder went with its jobs
    assert invariants.check(tree.root) == []


def test_cancel_stops_a_running_render_and_publishes_nothing(tree, assets, daemons):
    long = [{"op": "fit", "width": 1280, "height": 720}, {"op": "encode", "preset": "veryslow", "crf": 4}]
    jid = _submit(tree, assets, "stopme", steps=long)
    d = daemons(tree, "w1")
    prog = tree.attempt_dir(jid, 1) / "progress.json"
    wait_for(lambda: prog.exists(), timeout=60)
    t0 = time.monotonic()
    res = run_cli("cancel", jid, "--json", spool=tree)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["state"] == "failed"
    assert time.monotonic() - t0 < 10
    f = json.loads((tree.attempt_dir(jid, 1) / "failure.json").read_text())
    assert f["stage"] == "cancel" and f["attempt"] == 1
    assert "render stopped: cancelled" in (tree.attempt_dir(jid, 1) / "ffmpeg.log").read_text()
    assert not tree.manifest_file(jid).exists()
    assert not [p for p in (tree.store / "sha256").rglob("*") if p.is_file()]
    assert not (tree.job_attempts(jid) / "cancel.json").exists()
    assert d.alive()
    d.signal(signal.SIGTERM)
    d.wait()


def test_approve_records_job_and_hash_and_never_edits_the_job(tree, assets, daemons):
    jid = _submit(tree, assets, "ok")
    assert run_cli("approve", jid, "--by", "alice", spool=tree).returncode == 2  # not complete yet
    _drain(tree, daemons)
    job_bytes = (tree.complete / f"{jid}.json").read_bytes()
    manifest_bytes = tree.manifest_file(jid).read_bytes()
    sha = json.loads(manifest_bytes)["output"]["sha256"]
    wrong = run_cli("approve", jid, "--by", "alice", "--sha256", "0" * 64, spool=tree)
    assert wrong.returncode == 2 and "review it again" in wrong.stderr
    out = json.loads(
        run_cli(
            "approve",
            jid,
            "--by",
            "alice",
            "--sha256",
            sha,
            "--note",
            "ship it",
            "--json",
            spool=tree,
            check=True,
        ).stdout
    )
    assert out["new"] is True and out["approval"]["sha256"] == sha
    again = json.loads(run_cli("approve", jid, "--by", "alice", "--json", spool=tree, check=True).stdout)
    assert again["new"] is False
    rec = tree.approvals / jid / f"{sha}.alice.json"
    assert json.loads(rec.read_text())["note"] == "ship it"
    assert (tree.complete / f"{jid}.json").read_bytes() == job_bytes
    assert tree.manifest_file(jid).read_bytes() == manifest_bytes
    assert "alice" in run_cli("show", jid, spool=tree, check=True).stdout


def test_held_jobs_are_not_claimed_until_released(tree, assets, daemons):
    jid = _submit(tree, assets, "later")
    assert run_cli("hold", jid, spool=tree).returncode == 0
    assert json.loads(run_cli("status", "--json", spool=tree, check=True).stdout)["counts"]["held"] == 1
    d = daemons(tree, "w1")
    # A job submitted after the hold runs to the end: the daemon has claimed since, and
    # passed the held one by (a wait on that, not on a sleep that a slow start outlasts).
    probe = _submit(tree, assets, "probe")
    wait_for(lambda: (tree.complete / f"{probe}.json").exists(), timeout=60)
    assert (tree.held / f"{jid}.json").exists() and not tree.attempt_dir(jid, 1).exists()
    assert run_cli("release", jid, spool=tree).returncode == 0
    wait_for(lambda: (tree.complete / f"{jid}.json").exists(), timeout=60)
    d.signal(signal.SIGTERM)
    d.wait()
    assert run_cli("release", jid, spool=tree).returncode == 2
