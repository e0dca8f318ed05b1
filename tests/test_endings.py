"""The policy table after a failed attempt (spool.queue.endings): each row's decision
as a pure function of its facts, the order the rows are read in, and end_attempt
carrying the ending out in the one order of writes."""

from __future__ import annotations

import threading
from datetime import UTC, datetime

from libhelp import allow_noop, noop_sub

from spool.core.config import Limits, Recovery
from spool.core.errors import Failed
from spool.core.model import BlockEntry, Failure, decode
from spool.queue import accept, blocklist, claim, endings, execute, retry
from spool.queue.context import Context
from spool.queue.events import Journal


def _failed(**over: object) -> Failed:
    kw: dict = {"next_action": "Fix it.", "log_excerpt": ["line"]}
    kw.update(over)
    return Failed("render", "exit_code", "ffmpeg exited 1", **kw)


def _entry(worker: str, attempt: int = 1) -> BlockEntry:
    return BlockEntry(
        job_id="j@1", worker=worker, host="h", attempt=attempt, property="exit_code",
        message=f"broken on {worker}", at=datetime.now(UTC),
    )  # fmt: skip


def test_the_table_is_blocklist_then_retry_then_fail():
    assert [type(p).__name__ for p in endings.POLICIES] == ["Blocklist", "Retry", "Fail"]


def test_a_retryable_failure_waits_the_backoff_while_attempts_remain():
    limits, recovery = Limits(max_attempts=3), Recovery(backoff=10.0, backoff_max=60.0)
    first = endings.retry_ending(_failed(retryable=True), "j@1", 1, limits, recovery)
    assert (first.to, first.outcome, first.delay) == ("pending", "retry", 10.0)
    assert first.next_action == "Fix it. spool retries the job by itself (attempt 2 of 3)."
    assert first.what == "retry in 10 s after render: exit_code" and first.delay_reason == "render: exit_code"
    assert first.block is None
    second = endings.retry_ending(_failed(retryable=True), "j@1", 2, limits, recovery)
    assert (second.outcome, second.delay) == ("retry", 20.0)


def test_a_retryable_failure_with_every_attempt_used_fails_saying_how_to_retry():
    used_up = endings.retry_ending(_failed(retryable=True), "j@1", 3, Limits(max_attempts=3), Recovery())
    assert (used_up.to, used_up.outcome, used_up.delay) == ("failed", "failed", 0.0)
    assert used_up.next_action.endswith(
        "All 3 attempts are used, so it is not retried by itself: then run spool retry j@1."
    )


def test_a_host_class_failure_moves_on_or_fails_with_every_workers_evidence():
    mine, theirs = _entry("me", 2), _entry("other", 1)
    moves_on = blocklist.Verdict(False, "another worker can take it")
    on = endings.block_ending(_failed(fault="host"), "j@1", "me", mine, [mine], moves_on)
    assert (on.to, on.outcome, on.block) == ("pending", "blocked", mine)
    assert on.what == "render: exit_code on me (host-class)"
    assert on.next_action.endswith("another worker can take it, and this worker will not claim it again.")
    assert on.message == "ffmpeg exited 1" and on.log_excerpt == ["line"]

    alone = endings.block_ending(
        _failed(fault="host"), "j@1", "me", mine, [mine], blocklist.verdict([mine], [], 1, 3, 2)
    )
    assert (alone.to, alone.outcome) == ("failed", "host-failed")
    assert alone.message == "ffmpeg exited 1; failed: no other live worker can take it"  # not the job's fault

    verdict = blocklist.verdict([theirs, mine], ["third"], 2, 3, 2)
    why = "it failed with host-class errors on 2 workers (me, other)"
    assert verdict == blocklist.Verdict(True, why, job_fault=True)
    out = endings.block_ending(_failed(fault="host"), "j@1", "me", mine, [theirs, mine], verdict)
    assert (out.to, out.outcome, out.block) == ("failed", "host-failed", mine)
    assert out.message == f"ffmpeg exited 1; failed as the job's fault: {why}"
    assert out.log_excerpt == ["other (attempt 1): broken on other", "me (attempt 2): broken on me", "line"]
    assert "attempts/j@1/blocked-*.json" in out.next_action


def _claimed(tree, cfg, name: str) -> tuple[Context, object, object]:
    job = accept.accept_bytes(tree, cfg, noop_sub(name), "tester")
    assert claim.claim(tree, "w1", job.job_id)
    ctx = Context(tree, cfg, "w1", Journal(tree, "w1"), threading.Event())
    started = execute.start(ctx, job.job_id)
    assert not isinstance(started, str)
    return ctx, *started


def test_end_attempt_follows_the_table_over_a_real_spool(tree):
    """One failure of each row, ended by the production path: where each job went and
    the records written before it moved."""
    cfg = allow_noop(tree, recovery={"backoff": 30.0})
    ctx, job, attempt = _claimed(tree, cfg, "plain")
    assert execute.end_attempt(ctx, job, attempt, _failed()) == "failed"
    assert tree.job_file("failed", job.job_id).exists()
    rec = decode((attempt.dir / "failure.json").read_bytes(), Failure)
    assert rec.next_action == "Fix it." and not (tree.job_attempts(job.job_id) / "delay.json").exists()

    ctx, job, attempt = _claimed(tree, cfg, "flaky")
    assert execute.end_attempt(ctx, job, attempt, _failed(retryable=True)) == "retry"
    assert tree.job_file("pending", job.job_id).exists()
    assert (attempt.dir / "failure.json").exists()
    until = retry.not_before(tree, job.job_id)  # backoff 30 s after the first attempt
    assert until is not None and until - datetime.now(UTC).timestamp() > 25

    # A host-class failure with no other live worker: blocked, and failed as nobody can take it.
    ctx, job, attempt = _claimed(tree, cfg, "hostly")
    assert execute.end_attempt(ctx, job, attempt, _failed(fault="host")) == "host-failed"
    assert blocklist.blocks(tree, job.job_id, "w1")
    assert tree.job_file("failed", job.job_id).exists()
    rec = decode((attempt.dir / "failure.json").read_bytes(), Failure)
    assert rec.fault == "host" and "no other live worker can take it" in rec.message
