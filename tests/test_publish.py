"""Accept -> claim -> render -> validate -> publish, with real FFmpeg, in-process."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import threading
from pathlib import Path

from conftest import minimal, submission

from spool.core.config import Config
from spool.core.model import Failure, Manifest, decode
from spool.disk.tree import Tree
from spool.kinds import Job
from spool.queue import accept, claim, execute
from spool.queue.attempt import staged_result
from spool.queue.events import Journal


def run_one(tree: Tree, cfg: Config, journal: Journal, sub: dict, worker: str = "w1") -> tuple[Job, str]:
    job = accept.accept_bytes(tree, cfg, json.dumps(sub).encode(), "tester")
    assert claim.claim(tree, worker, job.job_id)
    ctx = execute.Context(tree, cfg, worker, journal, threading.Event())
    return job, execute.execute(ctx, job.job_id)


def test_published_output_matches_sha256sum_and_is_read_only(tree, cfg, journal, assets):
    job, outcome = run_one(tree, cfg, journal, submission(assets))
    assert outcome == "complete"
    assert (tree.complete / f"{job.job_id}.json").exists()
    m = decode(tree.manifest_file(job.job_id).read_bytes(), Manifest)
    store_file = tree.root / m.output.store_path
    out = subprocess.run(["sha256sum", str(store_file)], capture_output=True, text=True, check=True)
    assert out.stdout.split()[0] == m.output.sha256
    assert store_file.parent.name == m.output.sha256[:2]
    assert store_file.name == f"{m.output.sha256}.mp4"
    mode = store_file.stat().st_mode
    assert not mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH)
    assert not tree.manifest_file(job.job_id).stat().st_mode & stat.S_IWUSR
    assert m.validation.ok and {c.name for c in m.validation.checks} >= {
        "container",
        "video_streams",
        "audio_streams",
        "video_codec",
        "width",
        "height",
        "fps",
        "duration",
        "decode",
    }
    assert m.recipe_hash == job.recipe_hash


def test_identical_content_shares_one_store_object(tree, cfg, journal, assets):
    a, out_a = run_one(tree, cfg, journal, minimal(assets, name="twin-a"))
    b, out_b = run_one(tree, cfg, journal, minimal(assets, name="twin-b", output={"file": "twin-a.mp4"}))
    assert out_a == out_b == "complete"
    ma = decode(tree.manifest_file(a.job_id).read_bytes(), Manifest)
    mb = decode(tree.manifest_file(b.job_id).read_bytes(), Manifest)
    assert ma.output.sha256 == mb.output.sha256
    assert ma.output.store_path == mb.output.store_path
    objects = [p for p in (tree.store / "sha256").rglob("*") if p.is_file()]
    assert len(objects) == 1
    assert mb.output.method == "existing"


def test_missed_expectation_fails_at_validate_and_publishes_nothing(tree, cfg, journal, assets):
    sub = minimal(assets, name="too-short", output={"expect": {"duration": 5.0}})
    job, outcome = run_one(tree, cfg, journal, sub)
    assert outcome == "failed"
    assert (tree.failed / f"{job.job_id}.json").exists()
    f = decode((tree.attempt_dir(job.job_id, 1) / "failure.json").read_bytes(), Failure)
    assert f.stage == "validate" and f.property == "duration"
    assert f.expected.startswith("5 ") and 0.5 < f.actual < 0.7
    assert f.next_action
    assert not tree.manifest_file(job.job_id).exists()
    assert not any(p.is_file() for p in tree.store.rglob("*"))
    # the candidate stays in the attempt's work folder, away from consumers
    assert (tree.attempt_dir(job.job_id, 1) / "work" / "too-short.mp4").exists()


def test_source_changed_after_acceptance_fails_the_attempt(tree, cfg, journal, assets):
    job = accept.accept_bytes(tree, cfg, json.dumps(minimal(assets, name="changed")).encode(), "t")
    with open(assets / "clip.mp4", "ab") as f:
        f.write(b"\0" * 16)
    assert claim.claim(tree, "w1", job.job_id)
    ctx = execute.Context(tree, cfg, "w1", journal, threading.Event())
    assert execute.execute(ctx, job.job_id) == "failed"
    f = decode((tree.attempt_dir(job.job_id, 1) / "failure.json").read_bytes(), Failure)
    assert f.stage == "prepare"
    assert f.property == "sources.clip.sha256"
    assert f.message == "source changed since submission"
    assert f.expected == job.sources[0].sha256 and f.actual != f.expected
    assert not (tree.attempt_dir(job.job_id, 1) / "ffmpeg.log").exists()  # never rendered


def test_attempt_records_and_progress(tree, cfg, journal, assets):
    job, outcome = run_one(tree, cfg, journal, minimal(assets, name="recorded"))
    assert outcome == "complete"
    d = tree.attempt_dir(job.job_id, 1)
    rec = json.loads((d / "attempt.json").read_text())
    assert rec["worker"] == "w1" and rec["n"] == 1 and rec["pid"] == os.getpid()
    assert rec["host"] and rec["boot_id"] and rec["claimed_at"]
    prog = json.loads((d / "progress.json").read_text())
    assert prog["done"] is True and prog["percent"] == 100.0 and prog["frame"] > 0
    assert (d / "ffmpeg.log").read_text().startswith("$ ffmpeg ")
    result = staged_result(d)  # format 2: the manifest's first name (format 1: a copy)
    assert result == decode(tree.manifest_file(job.job_id).read_bytes(), Manifest)
    assert rec["result"] is None and os.path.samefile(d / "result.json", tree.manifest_file(job.job_id))
    events = [json.loads(line) for line in (tree.events / "test.jsonl").read_text().splitlines()]
    assert [(e["from"], e["to"]) for e in events] == [("pending", "running"), ("running", "complete")]


def test_job_file_never_changes_after_acceptance(tree, cfg, journal, assets):
    job = accept.accept_bytes(tree, cfg, json.dumps(minimal(assets, name="frozen")).encode(), "t")
    before = tree.job_file("pending", job.job_id).read_bytes()
    assert claim.claim(tree, "w1", job.job_id)
    ctx = execute.Context(tree, cfg, "w1", journal, threading.Event())
    assert execute.execute(ctx, job.job_id) == "complete"
    assert tree.job_file("complete", job.job_id).read_bytes() == before


def test_ffmpeg_failure_is_a_render_stage_failure(tree, cfg, journal, assets):
    # An encoder that does not exist makes FFmpeg exit non-zero.
    cfg.render.ffmpeg = str(Path(__file__).parent / "no-such-ffmpeg")
    job = accept.accept_bytes(tree, cfg, json.dumps(minimal(assets, name="broken")).encode(), "t")
    assert claim.claim(tree, "w1", job.job_id)
    ctx = execute.Context(tree, cfg, "w1", journal, threading.Event())
    # FFmpeg missing is this host's fault; with no other worker alive the job fails here.
    assert execute.execute(ctx, job.job_id) == "host-failed"
    f = decode((tree.attempt_dir(job.job_id, 1) / "failure.json").read_bytes(), Failure)
    assert f.stage == "render" and f.property == "ffmpeg" and not f.retryable
    assert f.fault == "host" and "no other live worker" in f.message
