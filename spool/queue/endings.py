"""What a failed attempt comes to: the declared policy table, read top to bottom.

:data:`POLICIES` is consulted in order by :func:`spool.queue.execute.end_attempt`;
the first policy whose ``after_failure`` returns an :class:`Ending` decides:

1. :class:`Blocklist`: a host-class failure (``fault = "host"``) blocks this worker
   from the job; the job moves on to another worker at once, or fails as the job's
   fault when it cannot (:func:`spool.queue.blocklist.verdict`);
2. :class:`Retry`: a retryable failure goes back to ``pending/`` after an
   exponential backoff while ``[limits] max_attempts`` remain; once they are used
   it fails, its next action saying how to retry it;
3. :class:`Fail`: anything else fails.

Each policy gathers the facts it needs from the spool (the attempts made, the
blocklist, the live workers) and hands them to a pure function (``retry_ending``,
``block_ending``) that makes the decision. The ending is a plan, not an act: the
writes it implies are made by ``end_attempt`` in the one durable order (the block
entry, then ``failure.json``, then ``delay.json``, then the move; ARCHITECTURE.md,
"Order of writes").
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from spool.core.config import Limits, Recovery
from spool.core.errors import Failed
from spool.core.model import BlockEntry, now
from spool.core.secrets import redact
from spool.disk.tree import HOST
from spool.queue import blocklist, retry

if TYPE_CHECKING:
    from spool.core.model import JobBase
    from spool.queue.attempt import Attempt
    from spool.queue.context import Context


@dataclass(frozen=True)
class Ending:
    """Where a failed attempt's job goes, and what is written before it moves.

    ``message``, ``log_excerpt`` and ``next_action`` are the failure record's final
    texts (the next action says which ending happens); ``what`` is the journal's and
    the log's summary."""

    to: str  # "pending" or "failed"
    outcome: str  # "retry", "failed", "blocked" or "host-failed"
    what: str
    message: str
    log_excerpt: list[str]
    next_action: str
    #: Written (durably) before the failure record: this worker blocked from the job.
    block: BlockEntry | None = None
    #: Seconds the job waits in ``pending/`` before its next claim (``delay.json``; 0: none).
    delay: float = 0.0
    #: The reason ``delay.json`` gives.
    delay_reason: str = field(default="")


class Policy(Protocol):
    """One row of the table: an ending for this failure, or ``None`` (the next row decides)."""

    def after_failure(self, ctx: Context, job: JobBase, attempt: Attempt, f: Failed) -> Ending | None: ...


def summary(f: Failed) -> str:
    return f"{f.stage}: {f.property}"


def retry_ending(f: Failed, job_id: str, used: int, limits: Limits, recovery: Recovery) -> Ending:
    """Pure: a retryable failure after ``used`` counted attempts -> back to pending after
    the backoff while attempts remain, else failed."""
    what = summary(f)
    if used < limits.max_attempts:
        wait = retry.backoff(recovery, used)
        return Ending(
            "pending",
            "retry",
            f"retry in {wait:.0f} s after {what}",
            f.message,
            f.log_excerpt,
            f"{f.next_action} spool retries the job by itself (attempt {used + 1} of {limits.max_attempts}).",
            delay=wait,
            delay_reason=what,
        )
    return Ending(
        "failed",
        "failed",
        what,
        f.message,
        f.log_excerpt,
        f"{f.next_action} All {limits.max_attempts} attempts are used, so it is not retried by itself: "
        f"then run spool retry {job_id}.",
    )


def block_ending(
    f: Failed, job_id: str, worker: str, entry: BlockEntry, blocked: list[BlockEntry], v: blocklist.Verdict
) -> Ending:
    """Pure: a host-class failure, this worker's block ``entry`` among ``blocked`` (every
    worker blocked from the job, this one included), and the blocklist's verdict ->
    failed with every blocked worker's evidence, or on to another worker."""
    if v.fail:
        return Ending(
            "failed",
            "host-failed",
            summary(f),
            # Only a job that failed like this on several workers is at fault; one that
            # nobody else could take is failed for its host (it read "the job's fault" too).
            f"{f.message}; failed as the job's fault: {v.why}"
            if v.job_fault
            else f"{f.message}; failed: {v.why}",
            [f"{e.worker} (attempt {e.attempt}): {e.message}" for e in blocked] + f.log_excerpt,
            f"{f.next_action} Every blocked worker's evidence is in attempts/{job_id}/blocked-*.json; "
            f"after fixing the hosts (or the job), run spool retry {job_id}.",
            block=entry,
        )
    return Ending(
        "pending",
        "blocked",
        f"{summary(f)} on {worker} (host-class)",
        f.message,
        f.log_excerpt,
        f"{f.next_action} Nothing to do for the job: {v.why}, and this worker will not claim it again.",
        block=entry,
    )


class Blocklist:
    """A host-class failure: this host, not the job (:mod:`spool.queue.blocklist`)."""

    def after_failure(self, ctx: Context, job: JobBase, attempt: Attempt, f: Failed) -> Ending | None:
        if f.fault != "host":
            return None
        tree, cfg = ctx.tree, ctx.cfg
        entry = BlockEntry(
            job_id=job.job_id,
            worker=ctx.worker,
            host=HOST,
            attempt=attempt.n,
            property=f.property,
            message=redact(f.message),
            log_excerpt=[redact(x) for x in f.log_excerpt],
            at=now(),
        )
        # Every worker blocked so far, with this entry in place of an older one of ours.
        earlier = [e for e in blocklist.entries(tree, job.job_id) if e.worker != ctx.worker]
        blocked = sorted([*earlier, entry], key=lambda e: e.at)
        others = blocklist.other_workers(tree, job.job_id, ctx.worker, cfg.recovery.stale_after)
        v = blocklist.verdict(
            blocked,
            others,
            retry.claims_made(tree, job.job_id),
            cfg.limits.max_attempts,
            cfg.health.fail_after_workers,
        )
        return block_ending(f, job.job_id, ctx.worker, entry, blocked, v)


class Retry:
    """A retryable failure (:mod:`spool.queue.retry`): the attempts made decide."""

    def after_failure(self, ctx: Context, job: JobBase, attempt: Attempt, f: Failed) -> Ending | None:
        if not f.retryable:
            return None
        used = retry.claims_made(ctx.tree, job.job_id)  # one look at the attempts
        return retry_ending(f, job.job_id, used, ctx.cfg.limits, ctx.cfg.recovery)


class Fail:
    """Anything else: the job failed, its record says what to fix."""

    def after_failure(self, ctx: Context, job: JobBase, attempt: Attempt, f: Failed) -> Ending | None:
        return Ending("failed", "failed", summary(f), f.message, f.log_excerpt, f.next_action)


#: The table, in the order it is consulted: the first ending wins.
POLICIES: tuple[Policy, ...] = (Blocklist(), Retry(), Fail())


def decide(ctx: Context, job: JobBase, attempt: Attempt, f: Failed) -> Ending:
    """The ending of a failed attempt: the first policy that decides."""
    for policy in POLICIES:
        ending = policy.after_failure(ctx, job, attempt, f)
        if ending is not None:
            return ending
    raise AssertionError("the last policy (Fail) decides every failure")
