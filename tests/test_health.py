"""A broken render node must not fail the queue (issue 16): host-class failures
block the worker from the job and move it on; a worker failing like that again
and again quarantines itself; the start self-check catches a broken host early.

Real daemons, real renders; the broken node is a failing ``ffmpeg`` put first
on one daemon's PATH.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from conftest import minimal, run_cli, wait_for, write_json

from spool.core import settings
from spool.core.model import Failure, decode
from spool.disk.tree import HOST, Tree
from spool.queue import blocklist, health

REAL_FFMPEG = shutil.which("ffmpeg")


def _fake_ffmpeg(folder: Path, body: str) -> dict[str, str]:
    """An environment whose PATH starts with an ``ffmpeg`` script running ``body``."""
    folder.mkdir(parents=True, exist_ok=True)
    script = folder / "ffmpeg"
    script.write_text(f"#!/bin/sh\n{body}\n")
    script.chmod(0o755)
    return {"PATH": f"{folder}:{os.environ['PATH']}"}


def _config(tree: Tree, **sections: dict[str, object]) -> None:
    settings.write(tree.config_file, sections)


def _submit(tree: Tree, assets: Path, names: list[str], **over: object) -> None:
    for n in names:
        write_json(tree.incoming / f"{n}.json", minimal(assets, name=n, **over))


BROKEN = "echo \"[vost#0:0 @ 0x1] Unknown encoder 'libx264'\" >&2; exit 1"


def test_a_broken_node_quarantines_itself_and_the_healthy_one_renders_everything(
    tree, assets, daemons, tmp_path
):
    _config(tree, health={"self_check": False})
    names = [f"job{i:02d}" for i in range(20)]
    broken = daemons(tree, "broken", env=_fake_ffmpeg(tmp_path / "bad", BROKEN))
    healthy = daemons(tree, "healthy")
    wait_for(lambda: all(tree.worker_file(f"{HOST}-{w}").exists() for w in ("broken", "healthy")), timeout=30)
    _submit(tree, assets, names)
    wait_for(lambda: len(list(tree.complete.iterdir())) == 20, timeout=180)
    for d in (broken, healthy):
        d.signal(15)
        assert d.wait(timeout=60) == 0
    assert sorted(p.name for p in tree.complete.iterdir()) == sorted(f"{n}@1.json" for n in names)
    assert not list(tree.failed.iterdir())
    q = health.quarantined(tree, f"{HOST}-broken")
    assert q is not None and "3 host-class failures in a row" in q.reason and len(q.evidence) == 3
    blocked = [p.name for p in tree.attempts.glob("*/blocked-*.json")]
    # 3 in a row quarantine it; a job in its second slot at that moment may make a 4th.
    assert 3 <= len(blocked) <= 4 and all(b == f"blocked-{HOST}-broken.json" for b in blocked)
    for m in tree.manifests.iterdir():
        assert json.loads(m.read_text())["worker"] == f"{HOST}-healthy"
    status = json.loads(run_cli("status", "--json", spool=tree, check=True).stdout)
    assert any(a["kind"] == "worker" and "quarantined" in a["problem"] for a in status["attention"])


def test_a_truly_bad_job_fails_once_without_moving_on(tree, assets, daemons):
    _submit(tree, assets, ["bad"], output={"expect": {"width": 999}})
    a, b = daemons(tree, "a", drain=True), daemons(tree, "b", drain=True)
    assert a.wait(timeout=60) == 0 and b.wait(timeout=60) == 0
    assert (tree.failed / "bad@1.json").exists()
    assert tree.attempt_numbers("bad@1") == [1]
    f = decode((tree.attempt_dir("bad@1", 1) / "failure.json").read_bytes(), Failure)
    assert f.fault == "job" and f.stage == "validate" and blocklist.entries(tree, "bad@1") == []


def test_a_job_that_crashes_ffmpeg_everywhere_fails_after_two_workers_with_both_evidence(
    tree, assets, daemons, tmp_path
):
    crash = f'case "$*" in *crashme*) kill -SEGV $$ ;; esac\nexec {REAL_FFMPEG} "$@"'
    env = _fake_ffmpeg(tmp_path / "crashy", crash)
    _submit(tree, assets, ["crashme"])
    a = daemons(tree, "a", env=env)
    b = daemons(tree, "b", env=env)
    wait_for(lambda: (tree.failed / "crashme@1.json").exists(), timeout=120)
    for d in (a, b):
        d.signal(15)
        assert d.wait(timeout=60) == 0
    entries = blocklist.entries(tree, "crashme@1")
    assert sorted(e.worker for e in entries) == [f"{HOST}-a", f"{HOST}-b"]
    last = tree.attempt_numbers("crashme@1")[-1]
    f = decode((tree.attempt_dir("crashme@1", last) / "failure.json").read_bytes(), Failure)
    assert f.fault == "host" and f.property == "ffmpeg_killed"
    assert "failed with host-class errors on 2 workers" in f.message
    assert any(line.startswith(f"{HOST}-a ") for line in f.log_excerpt)
    assert any(line.startswith(f"{HOST}-b ") for line in f.log_excerpt)
    assert health.quarantined(tree, f"{HOST}-a") is None  # one failure is no streak
    # An operator who fixed the hosts retries it: the blocks are lifted with it.
    run_cli("retry", "crashme@1", spool=tree, check=True)
    assert blocklist.entries(tree, "crashme@1") == [] and (tree.pending / "crashme@1.json").exists()


def test_a_lone_broken_worker_is_bounded_and_its_quarantine_outlives_a_restart(
    tree, assets, daemons, tmp_path
):
    _config(tree, health={"self_check": False})
    _submit(tree, assets, [f"lone{i}" for i in range(5)])
    bad_env = _fake_ffmpeg(tmp_path / "bad", BROKEN)
    d = daemons(tree, "solo", drain=True, env=bad_env)
    assert d.wait(timeout=60) == 0  # drained: quarantined, nothing left it may do
    # No other worker: each failed here, until the streak of 3 stopped it (a job in a
    # second slot when the third failed may end the same way).
    failed, pending = len(list(tree.failed.iterdir())), len(list(tree.pending.iterdir()))
    assert 3 <= failed <= 4 and failed + pending == 5
    worker = f"{HOST}-solo"
    assert health.quarantined(tree, worker) is not None
    # A restart keeps the quarantine: nothing is claimed.
    d = daemons(tree, "solo", drain=True, env=bad_env)
    assert d.wait(timeout=30) == 0
    assert len(list(tree.pending.iterdir())) == pending and "quarantined since" in d.output()
    # The operator fixes the host (a working FFmpeg) and lifts the quarantine.
    out = run_cli("worker", "release", worker, "--json", spool=tree, check=True)
    assert json.loads(out.stdout)["released"] is True
    assert run_cli("worker", "release", worker, spool=tree).returncode == 4  # not quarantined now
    d = daemons(tree, "solo", drain=True)
    assert d.wait(timeout=60) == 0
    assert len(list(tree.complete.iterdir())) == pending


def test_the_start_self_check_catches_a_missing_font(tree, assets, daemons):
    _config(tree, render={"font_file": "/no/such/font.ttf"})
    # straight into pending/: a drained, quarantined worker exits before a drop settles
    sub = write_json(tree.root.parent / "needs-font.json", minimal(assets, name="needs-font"))
    run_cli("submit", str(sub), spool=tree, check=True)
    d = daemons(tree, "fontless", drain=True)
    assert d.wait(timeout=60) == 0
    q = health.quarantined(tree, f"{HOST}-fontless")
    assert q is not None and "text font" in q.reason and "/no/such/font.ttf" in q.reason
    assert (tree.pending / "needs-font@1.json").exists() and tree.attempt_numbers("needs-font@1") == []


@pytest.mark.parametrize(
    ("code", "tail", "wrote", "fault"),
    [
        (1, ["[vost#0:0] Unknown encoder 'libx265'"], False, "host"),
        (1, ["[AVFilterGraph] No such filter: 'drawtext'"], True, "host"),
        (-11, [], True, "host"),
        (-9, ["Killed"], False, "host"),
        (1, ["Conversion failed!"], False, "host"),  # a crash with no output
        (1, ["Error while filtering: Invalid argument"], True, "job"),
        (187, [], True, "job"),
    ],
)
def test_classify_exit(code, tail, wrote, fault):
    assert health.classify_exit(code, tail, wrote)[0] == fault


def test_verdict_moves_on_until_two_workers_or_nobody_else():
    from datetime import UTC, datetime

    from spool.core.model import BlockEntry

    def e(w: str) -> BlockEntry:
        return BlockEntry(
            job_id="j@1", worker=w, host="h", attempt=1, property="p", message="m", at=datetime.now(UTC)
        )

    assert not blocklist.verdict([e("a")], ["b"], 1, 3, 2).fail
    assert blocklist.verdict([e("a"), e("b")], ["c"], 2, 3, 2).fail
    assert blocklist.verdict([e("a")], [], 1, 3, 2).fail
    assert blocklist.verdict([e("a")], ["b"], 3, 3, 2).fail
    assert not blocklist.verdict([e("a"), e("a")], ["b"], 2, 3, 2).fail  # one worker twice is one worker


def test_a_crash_after_the_block_is_written_leaves_the_job_to_other_workers(tree, assets, daemons, tmp_path):
    """Crash point ``after_blocklist``: the block is durable before the job moves, so the
    restarted worker recovers the job to pending and never claims it again."""
    _config(tree, health={"self_check": False})
    _submit(tree, assets, ["bl"])
    env = {**_fake_ffmpeg(tmp_path / "bad", BROKEN), "SPOOL_CRASH_AT": "after_blocklist"}
    d = daemons(tree, "w1", env=env)
    assert d.wait(timeout=60) == -9
    assert (
        blocklist.blocks(tree, "bl@1", f"{HOST}-w1") and (tree.running / f"{HOST}-w1" / "bl@1.json").exists()
    )
    d = daemons(tree, "w1", drain=True)  # a working FFmpeg now; still blocked from this job
    assert d.wait(timeout=60) == 0
    assert (tree.pending / "bl@1.json").exists()
    d = daemons(tree, "w2", drain=True)
    assert d.wait(timeout=60) == 0
    assert (tree.complete / "bl@1.json").exists()
