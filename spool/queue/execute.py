"""One claimed job, carried through its attempt: produce, validate, publish, commit.

The job's kind (:mod:`spool.kinds`) makes the candidate and judges it; the
rest is the same for every kind: a cancel request is honoured before work
starts and again before anything is published, a validated candidate goes
through the one publish path (:mod:`spool.queue.publish`, whose docstring has the
order of writes), and every ending is recorded in the attempt before the job
file moves:

* complete: the publish path moved it to ``complete/``;
* failed: ``failure.json``, then ``failed/`` (or back to ``pending/`` with a
  delay when the failure is retryable and attempts remain);
* interrupted (the daemon is stopping): ``interrupted.json``, then ``pending/``;
* deferred (it did nothing, and must wait: a provider's quota): ``interrupted.json``
  (``deferred``), ``delay.json`` until then, ``pending/``;
* lost (another worker took the job): ``interrupted.json`` in our own attempt,
  and nothing else is touched.
"""

from __future__ import annotations

import errno
import logging
import time
from typing import Any

import msgspec

from spool import kinds
from spool.core.errors import Deferred, Failed, Interrupted, LostOwnership
from spool.core.faults import crashpoint
from spool.core.model import Failure, Interruption, JobBase, ValidationReport, now
from spool.core.secrets import redact
from spool.disk import formats
from spool.disk.tree import HOST, transfer
from spool.kinds.base import Produced
from spool.queue import blocklist, cancel, endings, quarantine, retry
from spool.queue.attempt import Attempt, NotYet, drop_partial, open_attempt, write_failure
from spool.queue.context import Context
from spool.queue.events import Journal
from spool.queue.publish import Ready, prepare, publish

__all__ = [
    "Context",
    "Journal",
    "end_attempt",
    "execute",
    "finish",
    "gate",
    "give_back",
    "load_claimed",
    "open_claimed",
    "run_to_ready",
    "scrub",
    "start",
    "started",
]

log = logging.getLogger("spool.queue.execute")


def execute(ctx: Context, job_id: str) -> str:
    """Run a job this worker has just claimed, on this thread (a ``slot`` kind). Returns
    the outcome: ``complete``, ``failed``, ``retry``, ``interrupted``, ``deferred``,
    ``early`` (claimed before its retry delay was over: given back untouched),
    ``lost`` (ownership lost), ``quarantined`` (the job file is damaged or was edited:
    never run), or for a host-class failure ``blocked`` (moved on to another worker)
    or ``host-failed``."""
    started = start(ctx, job_id)
    if isinstance(started, str):
        return started
    job, attempt = started
    try:
        cancel.raise_if_cancelled(ctx.tree, job_id, attempt.n, ctx.worker)
        finish(ctx, job, attempt, kinds.of(job).produce(ctx, job, attempt))
    except (Failed, Interrupted, Deferred, LostOwnership, OSError) as exc:
        return end_attempt(ctx, job, attempt, exc)
    return "complete"


def start(
    ctx: Context,
    job_id: str,
    *,
    durable: bool | None = None,
    first: bool = False,
    job: JobBase | None = None,
) -> tuple[JobBase, Attempt] | str:
    """Open the attempt of a job this worker has just claimed (the same for every kind
    and runner), or the outcome if it can never run (``quarantined``, ``lost``, ``early``).

    ``durable``: whether the attempt's record is fsynced before it starts (format 1
    always; format 2 only where asked: a driven kind's attempt writes durable states
    of its own into it). ``first``: see :func:`spool.queue.attempt.open_attempt`.
    ``job``: the job as this process wrote it into the file it then claimed (the daemon's
    acceptance batch), used as it is: the check of :func:`load_claimed` is for bytes
    someone else wrote or may have edited since."""
    loaded = job if job is not None else load_claimed(ctx, job_id)
    if isinstance(loaded, quarantine.Damaged):
        return _quarantine(ctx, job_id, loaded)
    if loaded is None:
        return "lost"  # gone from running/W: taken over meanwhile
    try:
        attempt = open_claimed(ctx, job_id, durable=durable, first=first)
    except NotYet as early:
        return give_back(ctx, early)
    crashpoint("after_attempt_dir")
    started(ctx, job_id, attempt)
    return loaded, attempt


def load_claimed(ctx: Context, job_id: str) -> JobBase | quarantine.Damaged | None:
    """A claimed job file, checked first (an edited job file is never run): the job, why
    it can never run, or ``None`` when it left ``running/<me>/`` meanwhile."""
    try:
        return quarantine.load(ctx.tree.job_file("running", job_id, ctx.worker))
    except quarantine.Damaged as damage:
        return damage
    except OSError:
        return None


def open_claimed(ctx: Context, job_id: str, *, durable: bool | None = None, first: bool = False) -> Attempt:
    """The attempt of a claim (see :func:`start` for ``durable``, and
    :func:`spool.queue.attempt.open_attempt` for ``first``). Raises :class:`~spool.queue.attempt.NotYet`
    for a claim made before the job's retry delay was over (see :func:`give_back`)."""
    if durable is None:
        durable = formats.writing(ctx.tree.root) == 1
    return open_attempt(ctx.tree, job_id, ctx.worker, durable=durable, first=first, claim=True)


def give_back(ctx: Context, early: NotYet) -> str:
    """A claim made before the job's retry delay was over goes back to ``pending/`` as it
    came: no attempt opened, no journal line (it never started), the delay untouched.
    Returns the outcome, ``early`` (or ``lost`` if the job was taken away meanwhile)."""
    if not _move(ctx, early.job_id, "pending"):
        return "lost"
    log.info("%s: claimed before its retry delay was over; given back to pending", early.job_id)
    return "early"


def started(ctx: Context, job_id: str, attempt: Attempt) -> None:
    """Tell that an attempt started (once its claim and folder are durable)."""
    ctx.journal.record(job_id, "running", from_="pending", attempt=attempt.n, reason="claimed")
    log.info("%s: attempt %d started", job_id, attempt.n)


def finish(ctx: Context, job: JobBase, attempt: Attempt, made: Produced) -> None:
    """A candidate exists: the kind's gate, then the one publish path (the same for
    every kind and runner). Raises the ending, as producing does."""
    report = gate(ctx, job, attempt, made)
    publish(
        ctx, job, attempt, made.path, report, made.seconds,
        on_stage=kinds.of(job).stages(ctx, job, attempt, made.path),
    )  # fmt: skip


def gate(ctx: Context, job: JobBase, attempt: Attempt, made: Produced) -> ValidationReport:
    """The kind's validation gate on a candidate, and a last look for a cancel request:
    the report of a candidate that may be published; raises otherwise."""
    report = kinds.of(job).check(ctx.cfg, job, made.path, attempt.dir / "validate.log")
    crashpoint("after_validation")
    # A validated output is not published once cancelled.
    cancel.raise_if_cancelled(ctx.tree, job.job_id, attempt.n, ctx.worker)
    if not report.ok:
        raise validation_failure(report)
    return report


def run_to_ready(ctx: Context, job: JobBase, attempt: Attempt) -> Ready | str:
    """A slot kind's attempt up to its publish (format 2's daemon commits it in a batch,
    :func:`spool.queue.publish.commit`): the prepared publish, or how it ended short of one."""
    try:
        cancel.raise_if_cancelled(ctx.tree, job.job_id, attempt.n, ctx.worker)
        made = kinds.of(job).produce(ctx, job, attempt)
        report = gate(ctx, job, attempt, made)
        return prepare(
            ctx, job, attempt, made.path, report, made.seconds,
            on_stage=kinds.of(job).stages(ctx, job, attempt, made.path),
        )  # fmt: skip
    except (Failed, Interrupted, Deferred, LostOwnership, OSError) as exc:
        return end_attempt(ctx, job, attempt, exc)


def end_attempt(ctx: Context, job: JobBase, attempt: Attempt, exc: BaseException) -> str:
    """Record how an attempt ended short of complete and move the job accordingly (the
    module docstring's endings); the same for every kind, whoever drives the attempt
    (a slot thread here, or the daemon's generation driver). Returns the outcome."""
    if isinstance(exc, Failed):
        return _fail(ctx, job, attempt, exc)
    if isinstance(exc, Interrupted):
        return _interrupt(ctx, job.job_id, attempt, "stopped by the daemon's shutdown")
    if isinstance(exc, Deferred):
        return _defer(ctx, job.job_id, attempt, exc)
    if isinstance(exc, LostOwnership):
        return _lost(ctx, job.job_id, attempt, str(exc))
    if isinstance(exc, OSError):
        return _fail(ctx, job, attempt, _os_failure(exc, attempt, job))
    raise exc


def validation_failure(report: ValidationReport) -> Failed:
    """The located failure for a candidate that failed the gate: its first failed check."""
    bad = report.failed()[0]
    return Failed(
        "validate",
        bad.name,
        f"the output failed the {bad.name} check",
        expected=bad.expected,
        actual=bad.actual,
        log_excerpt=[f"{c.name}: expected {c.expected}, got {c.actual}" for c in report.failed()],
        next_action="Compare the expectation with the recipe: fix the recipe or the stated expectation "
        "and submit a new revision (spool revise).",
    )


def scrub(f: Failure) -> Failure:
    """A failure record with secrets masked in every text it carries."""

    def clean(v: Any) -> Any:
        return redact(v) if isinstance(v, str) else v

    return msgspec.structs.replace(
        f,
        message=redact(f.message),
        expected=clean(f.expected),
        actual=clean(f.actual),
        log_excerpt=[redact(line) for line in f.log_excerpt],
        next_action=redact(f.next_action),
    )


def _os_failure(exc: OSError, attempt: Attempt, job: JobBase) -> Failed:
    if exc.errno == errno.ENOSPC:
        drop_partial(kinds.of(job).candidate(job, attempt.dir))
        return Failed(
            "render",
            "disk_space",
            "the disk filled up during the attempt (the partial output was removed)",
            expected="free space",
            actual="ENOSPC",
            next_action="Free space on the spool's disk (spool gc helps).",
            retryable=True,
        )
    return Failed(
        "render",
        "io_error",
        f"an I/O error stopped the attempt ({exc.strerror or exc})",
        actual=str(exc),
        next_action="Check this host's disks, mounts and permissions.",
        retryable=True,
        fault="host",  # a local disk or mount, not the job
    )


def _move(ctx: Context, job_id: str, to: str) -> bool:
    return transfer(ctx.tree.job_file("running", job_id, ctx.worker), ctx.tree.job_file(to, job_id))


def _fail(ctx: Context, job: JobBase, attempt: Attempt, f: Failed) -> str:
    """Record the failure in the attempt, then move the job as the policy table
    (:mod:`spool.queue.endings`) decides: to ``failed/``; back to ``pending/`` after a
    delay (a retryable failure while attempts remain); or, for a host-class failure,
    back to ``pending/`` at once for another worker, with this worker on the job's
    blocklist (:mod:`spool.queue.blocklist`). The record's next action says which.

    The order of writes is fixed here, whatever the policy: the block entry, the
    failure record, the delay, then the move."""
    ending = endings.decide(ctx, job, attempt, f)
    if ending.block is not None:
        blocklist.add(ctx.tree, ending.block)
        crashpoint("after_blocklist")
    f.message, f.log_excerpt, f.next_action = ending.message, ending.log_excerpt, ending.next_action
    failure = _record(ctx, job, attempt, f)
    if ending.delay > 0:
        retry.delay_until(ctx.tree, job.job_id, time.time() + ending.delay, attempt.n, ending.delay_reason)
    return _end(ctx, job, attempt, failure, ending.to, ending.outcome, ending.what)


def _record(ctx: Context, job: JobBase, attempt: Attempt, f: Failed) -> Failure:
    failure = Failure(
        job_id=job.job_id,
        attempt=attempt.n,
        stage=f.stage,  # type: ignore[arg-type]
        property=f.property,
        expected=f.expected,
        actual=f.actual,
        message=f.message,
        log_excerpt=f.log_excerpt,
        next_action=f.next_action,
        worker=ctx.worker,
        failed_at=now(),
        retryable=f.retryable,
        fault="host" if f.fault == "host" else "job",
        host=HOST,
    )
    failure = scrub(failure)
    write_failure(attempt, failure)
    return failure


def _end(
    ctx: Context, job: JobBase, attempt: Attempt, failure: Failure, to: str, outcome: str, what: str
) -> str:
    """The failure is recorded: move the job and say so in the journal and the log."""
    reason = f"{what}: {failure.message}"
    if not _move(ctx, job.job_id, to):
        return _lost(ctx, job.job_id, attempt, f"the job was taken away before it could move to {to}/")
    ctx.journal.record(
        job.job_id, to, from_="running", attempt=attempt.n, reason=reason,
        stage=failure.stage, property=failure.property,
    )  # fmt: skip
    if outcome == "retry":
        log.warning("%s: attempt %d failed (%s), %s", job.job_id, attempt.n, what, reason.split(" after ")[0])
    elif outcome == "blocked":
        log.warning(
            "%s: attempt %d failed for this host (%s); the job moves on",
            job.job_id,
            attempt.n,
            failure.message,
        )
    else:
        log.warning("%s: failed at %s (%s): %s", job.job_id, failure.stage, failure.property, failure.message)
    return outcome


def _quarantine(ctx: Context, job_id: str, damage: quarantine.Damaged) -> str:
    """A claimed file that must never run: out of the queue, with its reason."""
    path = ctx.tree.job_file("running", job_id, ctx.worker)
    if not quarantine.quarantine(ctx.tree, path, f"running/{ctx.worker}", damage, ctx.worker):
        return "lost"
    ctx.journal.record(job_id, "quarantine", from_="running", reason=f"{damage.field}: {damage.reason}")
    return "quarantined"


def _interrupt(ctx: Context, job_id: str, attempt: Attempt, reason: str) -> str:
    """Record the interruption, then give the job back to ``pending/`` at once."""
    attempt.record(
        "interrupted.json",
        Interruption(job_id=job_id, attempt=attempt.n, reason=reason, worker=ctx.worker, at=now()),
    )
    if not _move(ctx, job_id, "pending"):
        return _lost(ctx, job_id, attempt, "the job was taken away before it could be returned")
    ctx.journal.record(job_id, "pending", from_="running", attempt=attempt.n, reason=f"interrupted: {reason}")
    log.info("%s: attempt %d interrupted, job returned to pending", job_id, attempt.n)
    return "interrupted"


def _defer(ctx: Context, job_id: str, attempt: Attempt, d: Deferred) -> str:
    """The attempt did nothing and must wait: record it (not counted), delay the job,
    give it back to ``pending/``."""
    attempt.record(
        "interrupted.json",
        Interruption(
            job_id=job_id, attempt=attempt.n, reason=f"deferred: {d.reason}", worker=ctx.worker, at=now(),
            deferred=True,
        ),
    )  # fmt: skip
    retry.delay_until(ctx.tree, job_id, d.until, attempt.n, f"deferred: {d.reason}")
    if not _move(ctx, job_id, "pending"):
        return _lost(ctx, job_id, attempt, "the job was taken away before it could be returned")
    ctx.journal.record(job_id, "pending", from_="running", attempt=attempt.n, reason=f"deferred: {d.reason}")
    log.info("%s: attempt %d deferred (%s)", job_id, attempt.n, d.reason)
    return "deferred"


def _lost(ctx: Context, job_id: str, attempt: Attempt, why: str) -> str:
    """Fenced: this worker lost the job; note it in its own attempt, touch nothing else."""
    attempt.record(
        "interrupted.json",
        Interruption(
            job_id=job_id,
            attempt=attempt.n,
            reason=f"lost ownership: {why}",
            worker=ctx.worker,
            at=now(),
        ),
    )
    log.warning("%s: attempt %d lost ownership (%s); nothing published", job_id, attempt.n, why)
    return "lost"
