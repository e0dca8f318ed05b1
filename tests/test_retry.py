"""Technical retries: the same job file, a new attempt, exponential backoff, a bounded count."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from datetime import UTC, datetime

import invariants
import pytest
from conftest import minimal, run_cli, state_files, wait_for, write_json
from libhelp import allow_noop, noop_sub

from spool.core import settings
from spool.core.config import Recovery
from spool.core.model import Manifest, PublishedFile, ValidationReport, encode
from spool.disk.tree import transfer
from spool.queue import accept, claim, execute, retry
from spool.queue.attempt import open_attempt
from spool.queue.events import Journal
from spool.queue.execute import Context


def test_backoff_doubles_and_is_capped():
    p = Recovery(backoff=10.0, backoff_max=60.0)
    assert [retry.backoff(p, k) for k in range(6)] == [0.0, 10.0, 20.0, 40.0, 60.0, 60.0]
    assert retry.backoff(Recovery(backoff=0.0), 3) == 0.0


def test_transient_source_loss_is_retried_after_a_delay_and_then_succeeds(tree, assets, daemons):
    settings.write(tree.config_file, {"recovery": {"backoff": 1.5}})
    run_cli(
        "submit",
        str(write_json(tree.root.parent / "j.json", minimal(assets, name="flaky"))),
        spool=tree,
        check=True,
    )
    before = (tree.pending / "flaky@1.json").read_bytes()
    os.rename(assets / "clip.mp4", assets / "clip.mp4.away")  # a NAS hiccup
    d = daemons(tree, "w1")
    delay = tree.job_attempts("flaky@1") / "delay.json"
    wait_for(delay.exists, timeout=30)
    wait_for(lambda: (tree.pending / "flaky@1.json").exists(), timeout=30)
    f = json.loads((tree.attempt_dir("flaky@1", 1) / "failure.json").read_text())
    assert f["stage"] == "prepare" and f["property"] == "sources.clip" and f["retryable"]
    assert not tree.attempt_dir("flaky@1", 2).exists()  # waiting out the backoff
    os.rename(assets / "clip.mp4.away", assets / "clip.mp4")
    wait_for(lambda: (tree.complete / "flaky@1.json").exists(), timeout=60)
    d.signal(signal.SIGTERM)
    assert d.wait() == 0
    assert (tree.complete / "flaky@1.json").read_bytes() == before  # the same job file, unchanged
    a1 = json.loads((tree.attempt_dir("flaky@1", 1) / "attempt.json").read_text())
    a2 = json.loads((tree.attempt_dir("flaky@1", 2) / "attempt.json").read_text())
    waited = (
        datetime.fromisoformat(a2["claimed_at"]) - datetime.fromisoformat(a1["claimed_at"])
    ).total_seconds()
    assert waited >= 1.4
    m = json.loads(tree.manifest_file("flaky@1").read_text())
    assert m["attempt"] == 2
    assert invariants.check(tree.root) == []


def test_retries_stop_at_max_attempts_with_a_failure_record(tree, assets, daemons):
    settings.write(tree.config_file, {"recovery": {"backoff": 0.1}, "limits": {"max_attempts": 2}})
    run_cli(
        "submit",
        str(write_json(tree.root.parent / "j.json", minimal(assets, name="gone"))),
        spool=tree,
        check=True,
    )
    os.unlink(assets / "clip.mp4")
    d = daemons(tree, "w1", drain=True)
    assert d.wait(timeout=60) == 0
    assert state_files(tree)["failed"] == ["gone@1.json"]
    assert sorted(p.name for p in tree.job_attempts("gone@1").iterdir() if p.name.isdigit()) == ["1", "2"]
    info = json.loads(run_cli("show", "gone@1", "--json", spool=tree).stdout)
    assert info["failure"]["attempt"] == 2 and info["failure"]["property"] == "sources.clip"
    assert invariants.check(tree.root) == []


def test_operator_retry_mark_closes_the_attempt_for_recovery(tree, cfg, assets):
    from spool.queue.attempt import open_attempt
    from spool.repair import recover

    (tree.job_attempts("x@1")).mkdir()
    open_attempt(tree, "x@1", "w1")
    assert recover.current_attempt(tree, "x@1", "w1") == 1
    retry.mark_operator_retry(tree, "x@1", "alice")
    assert recover.current_attempt(tree, "x@1", "w1") == 0


@pytest.mark.parametrize(
    "closing", ["", "failure.json", "interrupted.json", "recovery-1.json", "recovery-1-2.json"]
)
def test_another_workers_attempt_is_the_claims_until_something_closed_it(tree, closing):
    # A claim over another worker's attempt that nothing closed is a takeover: the attempt
    # is judged. Closed (a failure, an interruption, a recovery decision), the job went back
    # to pending and this claim is a new one that opened nothing yet.
    from spool.queue.attempt import open_attempt
    from spool.repair import recover

    (tree.job_attempts("x@1")).mkdir()
    att = open_attempt(tree, "x@1", "w1")
    (tree.job_attempts("x@1") / "recovery-1.validate.log").write_text("a log, not a decision")
    if closing.startswith("recovery"):
        (tree.job_attempts("x@1") / closing).write_text("{}")
    elif closing:
        (att.dir / closing).write_text("{}")
    assert recover.current_attempt(tree, "x@1", "w2") == (0 if closing else 1)
    assert recover.current_attempt(tree, "x@1", "w1") == 1  # its own worker's, closed or not


@pytest.mark.parametrize(("left", "kept"), [(b"", False), (b'{"job_id": "x@1", "outp', False), (None, True)])
def test_the_next_attempt_removes_a_result_its_predecessor_left_unfinished(tree, left, kept):
    # Attempt 1 was killed writing result.json (format 2: the manifest's first name) and the
    # job was taken over: attempt 2's opening removes what can never become a manifest, and
    # keeps a readable one (the evidence recovery and gc read).
    from spool.queue.attempt import open_attempt

    tree.job_attempts("x@1").mkdir()
    first = open_attempt(tree, "x@1", "w1")
    staged = first.dir / "result.json"
    if left is None:
        t = datetime.now(UTC)
        m = Manifest(
            job_id="x@1", attempt=1, recipe_hash="r", sources=[], tags={}, worker="w1", claimed_at=t,
            output=PublishedFile(
                file="x.mp4", sha256="0" * 64, size=1, container="mp4", store_path="s", method="link"
            ),
            validation=ValidationReport(ok=True, decode_check="full", checks=[], seconds=0.0),
            render_seconds=0.0, validate_seconds=0.0, published_at=t,
        )  # fmt: skip
        staged.write_bytes(encode(m))
    else:
        staged.write_bytes(left)
    assert open_attempt(tree, "x@1", "w2").n == 2
    assert staged.exists() == kept


def _returned_with_a_delay_elsewhere(tree, jid: str) -> list[str]:
    """Another host's whole attempt, unseen here: it claims the job, fails it, and returns
    it to pending/ with a retry delay of an hour. Returns attempts/J/ as it left it."""
    assert claim.claim(tree, "other-host", jid)
    open_attempt(tree, jid, "other-host")
    retry.delay_until(tree, jid, time.time() + 3600, 1, "test: a retryable failure on another host")
    assert transfer(tree.job_file("running", jid, "other-host"), tree.job_file("pending", jid))
    return sorted(os.listdir(tree.job_attempts(jid)))


@pytest.mark.parametrize("known", ["accepted-here", "looked-up"])
def test_a_job_returned_with_a_delay_since_it_was_looked_up_is_given_back_not_run(tree, known):
    """The claim order knows the job has no delay (this daemon accepted it, or looked it up);
    then another host claims, fails and returns it with a delay between two of this daemon's
    listings (on a NAS no inotify event shows it). The daemon's claim must not run it early:
    the attempt is refused and the job given back to pending/, its attempts untouched."""
    from spoold.daemon import Daemon

    cfg = allow_noop(tree)
    d = Daemon(tree, cfg, "probe", hooks=[])
    if known == "accepted-here":
        (tree.incoming / "early.json").write_bytes(noop_sub("early"))
        # Every slot busy, so the acceptance batch claims nothing (with a free slot it
        # claims the job at once, before any other host could return it with a delay).
        busy = {pool: [f"busy-{pool}-{k}" for k in range(n)] for pool, n in d.pools.capacity.items()}
        for pool, holders in busy.items():
            for h in holders:
                d.pools.take(h, pool)
        # No watcher runs (as on a NAS): the drop is taken once quiet for incoming_quiet.
        wait_for(lambda: d._accept(time.monotonic()) > 0, timeout=10)
        assert d.index.guess_first("early@1") and d.stats["claims"] == 0
        for holders in busy.values():
            for h in holders:
                d.pools.give_back(h)
    else:
        accept.accept_bytes(tree, cfg, noop_sub("early"), "tester")
        d.index.refresh()
        assert list(d.index.ordered()) == ["early@1"]  # looked up now: no delay yet
    left = _returned_with_a_delay_elsewhere(tree, "early@1")
    d._fill_slots()
    assert d.stats["claims"] == 1  # claimed, then given back (by its slot's thread, which opens attempts)
    d.slots["early@1"].join(30)
    assert (tree.pending / "early@1.json").is_file() and not any(tree.running.rglob("early@1.json"))
    assert sorted(os.listdir(tree.job_attempts("early@1"))) == left
    assert {"1", "delay.json"} <= set(left) and "2" not in left
    d._reap()
    assert not d.slots and not d.reserved
    d._fill_slots()  # its delay is known now: not claimed again
    assert d.stats["claims"] == 1


def test_a_claimed_job_whose_delay_is_not_over_is_given_back_by_execute(tree):
    """The same refusal on the path every runner's start takes (format 1's slot threads,
    the driver's admissions, `spool work`)."""
    cfg = allow_noop(tree)
    accept.accept_bytes(tree, cfg, noop_sub("early"), "tester")
    left = _returned_with_a_delay_elsewhere(tree, "early@1")
    assert claim.claim(tree, "w1", "early@1")
    ctx = Context(tree, cfg, "w1", Journal(tree, "w1"), threading.Event())
    assert execute.execute(ctx, "early@1") == "early"
    assert (tree.pending / "early@1.json").is_file()
    assert sorted(os.listdir(tree.job_attempts("early@1"))) == left
