"""One claimed job, carried through prepare, render, validate, publish, commit.

The order of writes after validation is what keeps the invariants at every
crash point (each step durable before the next):

1. fence: the job file is still in ``running/<me>/``;
2. link the validated file into the store (idempotent, content-addressed);
3. ``result.json`` in the attempt: the manifest as this attempt stages it;
4. fence again, then ``manifests/J.json``, written once and never replaced:
   if one exists already (a crash after this step, or an attempt that lost
   ownership at the last moment), it is kept when it names a verified store
   file for the same recipe, and this attempt adopts it;
4b. the library index entries (:mod:`spool.index`), so a complete job is
   always found by its tags;
5. fence and commit: ``rename(running/<me>/J.json, complete/J.json)``. The
   rename fails for a worker whose job was taken away, so a non-owner can
   never complete a job.

So ``complete/J.json`` always has its manifest, a manifest always names a
store file that exists and matches, and a crash between steps leaves a
running job whose attempt holds the evidence recovery needs.
"""

from __future__ import annotations

import errno
import logging
import signal
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import msgspec

from . import claim, index, intent, recipe, render, retry, store
from .attempt import Attempt, Interruption, open_attempt, write_failure, write_result
from .config import Config
from .errors import LostOwnership
from .events import Journal
from .faults import crashpoint
from .model import (
    AttemptRecord,
    Check,
    Failure,
    Job,
    Manifest,
    Progress,
    SourceDigest,
    Stage,
    ValidationReport,
    decode,
    encode,
    now,
)
from .secrets import redact
from .status import read
from .tree import Tree, write_atomic
from .validate import validate

log = logging.getLogger("spool.execute")


@dataclass
class Context:
    """What one worker needs to run jobs: where, with which limits, as whom."""

    tree: Tree
    cfg: Config
    worker: str
    journal: Journal
    #: Set to interrupt running renders now (graceful stop after the grace period).
    stop: threading.Event
    #: How validated outputs enter the store: ``link`` (falling back to a copy where a
    #: link fails) or ``copy`` (copy, fsync, re-hash); the daemon sets it from ``spool doctor``.
    publish: Literal["link", "copy"] = "link"


class _Failed(Exception):
    """A located error: carries the failure record to write."""

    def __init__(
        self,
        stage: Stage,
        prop: str,
        message: str,
        *,
        expected: Any = None,
        actual: Any = None,
        log_excerpt: list[str] | None = None,
        next_action: str,
        retryable: bool = False,
    ) -> None:
        super().__init__(message)
        self.fields = dict(
            stage=stage,
            property=prop,
            message=message,
            expected=expected,
            actual=actual,
            log_excerpt=log_excerpt or [],
            next_action=next_action,
            retryable=retryable,
        )


class _Interrupted(Exception):
    pass


def execute(ctx: Context, job_id: str) -> str:
    """Run a job this worker has just claimed. Returns the outcome:
    ``complete``, ``failed``, ``interrupted`` or ``lost`` (ownership lost)."""
    tree = ctx.tree
    job = decode(tree.job_file("running", job_id, ctx.worker).read_bytes(), Job)
    attempt = open_attempt(tree, job_id, ctx.worker)
    crashpoint("after_attempt_dir")
    ctx.journal.record(job_id, "running", from_="pending", attempt=attempt.n, reason="claimed")
    log.info("%s: attempt %d started", job_id, attempt.n)
    try:
        _check_cancel(ctx, job, attempt)
        if job.operation == "noop":
            candidate, render_seconds = _noop(job, attempt), 0.0
        else:
            _prepare(job)
            candidate, render_seconds = _render(ctx, job, attempt)
        report = check_candidate(ctx.cfg, job, candidate, attempt.dir / "validate.log")
        crashpoint("after_validation")
        _check_cancel(ctx, job, attempt)  # a validated output is not published once cancelled
        if not report.ok:
            bad = report.failed()[0]
            raise _Failed(
                "validate",
                bad.name,
                f"the output failed the {bad.name} check",
                expected=bad.expected,
                actual=bad.actual,
                log_excerpt=[f"{c.name}: expected {c.expected}, got {c.actual}" for c in report.failed()],
                next_action=_VALIDATE_ACTION,
            )
        publish(ctx, job, attempt, candidate, report, render_seconds)
    except _Failed as f:
        return _fail(ctx, job, attempt, f)
    except _Interrupted:
        return _interrupt(ctx, job_id, attempt, "stopped by the daemon's shutdown")
    except LostOwnership as exc:
        return _lost(ctx, job_id, attempt, str(exc))
    except OSError as exc:
        return _fail(ctx, job, attempt, _os_failure(exc, attempt, job))
    return "complete"


_VALIDATE_ACTION = (
    "Compare the expectation with the recipe: fix the recipe or the stated expectation and "
    "submit a new revision (spool revise)."
)


def check_candidate(cfg: Config, job: Job, candidate: Path, log_path: Path) -> ValidationReport:
    """The validation gate for this job's kind of output."""
    if job.operation == "noop":
        try:
            ok = candidate.read_bytes() == job.job_id.encode()
        except OSError:
            ok = False
        check = Check(name="noop", expected=job.job_id, actual="match" if ok else "mismatch", ok=ok)
        return ValidationReport(ok=ok, decode_check="none", checks=[check], seconds=0.0)
    return validate(candidate, job.output.container, job.output.expect, cfg, log_path)


def _noop(job: Job, attempt: Attempt) -> Path:
    """The no-op job's "render": a tiny file naming the job (benchmarks and tests)."""
    out = attempt.work / job.output.file
    out.write_bytes(job.job_id.encode())
    return out


def _prepare(job: Job) -> None:
    """Re-hash every source: the queue renders what was accepted or nothing."""
    for src in job.sources:
        try:
            digest, _size = store.sha256_file(Path(src.path))
        except OSError as exc:
            raise _Failed(
                "prepare",
                f"sources.{src.role}",
                f"source {src.path} cannot be read ({exc.strerror})",
                expected=src.sha256,
                actual="unreadable",
                next_action="Restore the source file, then spool retry the job.",
                retryable=True,
            ) from None
        if digest != src.sha256:
            raise _Failed(
                "prepare",
                f"sources.{src.role}.sha256",
                "source changed since submission",
                expected=src.sha256,
                actual=digest,
                next_action="Submit a new revision that uses the changed file (spool revise), "
                "or restore the original.",
            )


def _render(ctx: Context, job: Job, attempt: Attempt) -> tuple[Path, float]:
    assert job.recipe is not None
    cmd = recipe.command(job.recipe, {s.role: s for s in job.sources}, job.output.file, ctx.cfg.render)
    first = [True]

    def on_progress(p: Progress) -> None:
        if first[0] and not p.done and (attempt.work / job.output.file).exists():
            first[0] = False
            crashpoint("mid_render")  # FFmpeg has written part of the output

    try:
        out = render.run(
            cmd,
            attempt,
            ctx.cfg.limits,
            stop=ctx.stop,
            on_progress=on_progress,
            cancelled=lambda: intent.cancel_requested(ctx.tree, job.job_id) is not None,
        )
    except FileNotFoundError as exc:
        if exc.filename != cmd.argv[0]:
            raise
        raise _Failed(
            "render",
            "ffmpeg",
            f"{cmd.argv[0]} cannot be run ({exc.strerror})",
            expected="an FFmpeg executable",
            actual="not found",
            next_action="Install FFmpeg or fix [render] ffmpeg in spool.toml, then spool retry the job.",
        ) from None
    if out.stopped == "interrupted":
        raise _Interrupted()
    if out.stopped == "cancelled":
        _check_cancel(ctx, job, attempt)
    if out.stopped == "timeout":
        raise _Failed(
            "render",
            "job_timeout",
            f"the render ran longer than {ctx.cfg.limits.job_timeout:g} s",
            expected=f"<= {ctx.cfg.limits.job_timeout:g} s",
            actual=f"{out.seconds:g} s",
            log_excerpt=out.log_tail[-6:],
            next_action="Shorten the job or raise limits.job_timeout in spool.toml, then spool retry it.",
            retryable=False,  # the same render would time out again
        )
    if out.returncode == -signal.SIGXFSZ:
        raise _Failed(
            "render",
            "output_size",
            f"the output grew past limits.output_size ({ctx.cfg.limits.output_size})",
            expected=f"<= {ctx.cfg.limits.output_size}",
            actual="larger",
            log_excerpt=out.log_tail[-4:],
            next_action="Lower the quality or length in a new revision, or raise limits.output_size.",
        )
    if out.returncode != 0 and any("No space left on device" in line for line in out.log_tail):
        _drop_partial(attempt, job)
        raise _Failed(
            "render",
            "disk_space",
            "the disk filled up while FFmpeg wrote the output (the partial output was removed)",
            expected="free space",
            actual="ENOSPC",
            log_excerpt=out.log_tail[-4:],
            next_action="Free space on the spool's disk (spool gc helps); the job is retried automatically.",
            retryable=True,
        )
    if out.returncode is not None and out.returncode < 0:
        # Killed by a signal we did not send: the OOM killer, an operator. Retry.
        raise _Failed(
            "render",
            "ffmpeg_killed",
            f"FFmpeg was killed by signal {-out.returncode}",
            expected="exit status 0",
            actual=f"signal {-out.returncode}",
            log_excerpt=out.log_tail[-8:],
            next_action="Check memory (limits.memory) and the system log; the job is retried automatically.",
            retryable=True,
        )
    if out.returncode != 0:
        raise _Failed(
            "render",
            "ffmpeg_exit_status",
            f"FFmpeg exited with status {out.returncode}",
            expected=0,
            actual=out.returncode,
            log_excerpt=out.log_tail[-8:],
            next_action="Read the log (spool logs JOB); fix the recipe or sources in a new revision, "
            "or spool retry if the cause was temporary.",
        )
    return attempt.work / job.output.file, out.seconds


def _check_cancel(ctx: Context, job: Job, attempt: Attempt) -> None:
    """An operator asked to cancel this job (``spool cancel``): stop here."""
    req = intent.cancel_requested(ctx.tree, job.job_id)
    if req is not None:
        f = intent.cancelled_failure(job.job_id, attempt.n, ctx.worker, req.reason, "running")
        raise _Failed(
            "cancel", "cancelled", req.reason, expected=f.expected, actual=f.actual, next_action=f.next_action
        )


def _fence(ctx: Context, job_id: str, step: str) -> None:
    if not claim.owns(ctx.tree, ctx.worker, job_id):
        raise LostOwnership(f"{job_id} is no longer in running/{ctx.worker}/ before {step}")


def publish(
    ctx: Context,
    job: Job,
    attempt: Attempt,
    candidate: Path,
    report: Any,
    render_seconds: float,
    note: str = "",
    why: str = "",
) -> Manifest:
    """Steps 1-5 of the module docstring for a validated candidate; ``why``
    prefixes the journal line (recovery says so)."""
    tree = ctx.tree
    _fence(ctx, job.job_id, "store link")
    try:
        ext = Path(job.output.file).suffix
        stored = store.publish(tree, candidate, ext, prefer_link=ctx.publish == "link")
    except OSError as exc:
        raise _Failed(
            "publish",
            "store",
            f"the output could not be stored ({exc.strerror or exc})",
            next_action="Free space or fix permissions on the spool's store/, then spool retry the job.",
            retryable=True,
        ) from None
    crashpoint("after_store_link")
    rec = read(attempt.dir / "attempt.json", AttemptRecord)
    manifest = Manifest(
        job_id=job.job_id,
        attempt=attempt.n,
        recipe_hash=job.recipe_hash,
        output=store.published_file(tree, stored, job.output.file, job.output.container),
        sources=[SourceDigest(role=s.role, sha256=s.sha256) for s in job.sources],
        validation=report,
        tags=job.tags,
        worker=ctx.worker,
        claimed_at=rec.claimed_at if rec else now(),
        render_seconds=render_seconds,
        validate_seconds=report.seconds,
        published_at=now(),
        note=note,
    )
    write_result(attempt, manifest)
    crashpoint("after_result")
    _fence(ctx, job.job_id, "manifest")
    manifest = _install_manifest(tree, manifest)
    crashpoint("after_manifest")
    index.index_job(tree, manifest, ctx.cfg.acceptance.required_tags)  # the library (SPEC 9)
    crashpoint("after_index")
    _fence(ctx, job.job_id, "complete")
    crashpoint("before_complete_rename")
    if not claim.move(tree, ctx.worker, job.job_id, "complete"):
        raise LostOwnership(f"{job.job_id} was taken from running/{ctx.worker}/ before it could complete")
    ctx.journal.record(
        job.job_id,
        "complete",
        from_="running",
        attempt=attempt.n,
        reason=why + f"published sha256:{manifest.output.sha256[:16]}" + (f" ({note})" if note else ""),
        bytes=manifest.output.size,
        render_seconds=manifest.render_seconds,
        validate_seconds=manifest.validate_seconds,
    )
    log.info("%s: complete, sha256 %s", job.job_id, manifest.output.sha256)
    return manifest


def _install_manifest(tree: Tree, manifest: Manifest) -> Manifest:
    """Write ``manifests/J.json`` once; an existing valid one for the same recipe wins."""
    path = tree.manifest_file(manifest.job_id)
    try:
        write_atomic(path, encode(manifest), mode=0o444, replace=False)
        return manifest
    except FileExistsError:
        pass
    existing = read(path, Manifest)
    if (
        existing is not None
        and existing.recipe_hash == manifest.recipe_hash
        and store.verify(tree, existing) is None
    ):
        return existing  # the job's selected output stays as it was
    raise _Failed(
        "publish",
        "manifest",
        f"manifests/{manifest.job_id}.json exists and does not match this job",
        expected=manifest.output.sha256,
        actual=existing.output.sha256 if existing else "unreadable",
        next_action="Run spool fsck to inspect the manifest, then spool retry the job.",
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


def _drop_partial(attempt: Attempt, job: Job) -> None:
    """On a full disk, free what this attempt wrote: a partial output is of no use
    to anyone, and the failure record still has to fit."""
    try:
        (attempt.work / job.output.file).unlink()
    except OSError:
        pass


def _os_failure(exc: OSError, attempt: Attempt, job: Job) -> _Failed:
    if exc.errno == errno.ENOSPC:
        _drop_partial(attempt, job)
        return _Failed(
            "render",
            "disk_space",
            "the disk filled up during the attempt (the partial output was removed)",
            expected="free space",
            actual="ENOSPC",
            next_action="Free space on the spool's disk (spool gc helps); the job is retried automatically.",
            retryable=True,
        )
    return _Failed(
        "render",
        "io_error",
        f"an I/O error stopped the attempt ({exc.strerror or exc})",
        actual=str(exc),
        next_action="Check the spool's disk and permissions, then spool retry the job.",
        retryable=True,
    )


def _fail(ctx: Context, job: Job, attempt: Attempt, f: _Failed) -> str:
    """Record the failure in the attempt, then move the job to ``failed/``."""
    failure = scrub(
        Failure(job_id=job.job_id, attempt=attempt.n, worker=ctx.worker, failed_at=now(), **f.fields)
    )
    write_failure(attempt, failure)
    what = f"{failure.stage}: {failure.property}"
    if failure.retryable and retry.may_retry(ctx.tree, job.job_id, ctx.cfg.limits.max_attempts):
        wait = retry.schedule(ctx.tree, job.job_id, ctx.cfg.recovery, attempt.n, what)
        to, outcome, reason = "pending", "retry", f"retry in {wait:.0f} s after {what}: {failure.message}"
    else:
        to, outcome, reason = "failed", "failed", f"{what}: {failure.message}"
    if not claim.move(ctx.tree, ctx.worker, job.job_id, to):
        return _lost(ctx, job.job_id, attempt, f"the job was taken away before it could move to {to}/")
    ctx.journal.record(
        job.job_id, to, from_="running", attempt=attempt.n, reason=reason,
        stage=failure.stage, property=failure.property,
    )  # fmt: skip
    if outcome == "retry":
        log.warning("%s: attempt %d failed (%s), %s", job.job_id, attempt.n, what, reason.split(" after ")[0])
    else:
        log.warning("%s: failed at %s (%s): %s", job.job_id, failure.stage, failure.property, failure.message)
    return outcome


def _interrupt(ctx: Context, job_id: str, attempt: Attempt, reason: str) -> str:
    """Record the interruption, then give the job back to ``pending/`` at once."""
    attempt.record(
        "interrupted.json",
        Interruption(job_id=job_id, attempt=attempt.n, reason=reason, worker=ctx.worker, at=now()),
    )
    if not claim.move(ctx.tree, ctx.worker, job_id, "pending"):
        return _lost(ctx, job_id, attempt, "the job was taken away before it could be returned")
    ctx.journal.record(job_id, "pending", from_="running", attempt=attempt.n, reason=f"interrupted: {reason}")
    log.info("%s: attempt %d interrupted, job returned to pending", job_id, attempt.n)
    return "interrupted"


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
