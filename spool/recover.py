"""Recovery: a logged, evidence-based decision about a job whose worker stopped.

A job is recovered only by the worker that owns it (a daemon adopting its own
``running/<me>/`` at start) or after an explicit takeover, which renames the
job file into the recoverer's running folder first: from then on the old
worker's fencing checks fail, so it can never publish or move the job.

The evidence is the job's latest attempt of the current claim: its records
(``result.json``, ``failure.json``, ``interrupted.json``), the candidate in
``work/``, and ``manifests/J.json``. The decision, in order:

=====================  ===========================================================
published              the manifest exists and verifies: finish the move to complete
staged                 ``result.json`` names a verified store file: install the
                       manifest, complete
recorded-failure       ``failure.json`` exists: finish the move to failed
recorded-interruption  ``interrupted.json`` exists: finish the move to pending
accept-candidate       a candidate in ``work/`` passes validation: publish it in a
                       new attempt ("accepted existing validated file"), complete
retry                  otherwise, while ``max_attempts`` allows: back to pending
exhausted              otherwise: failed, with a failure record
=====================  ===========================================================

The old attempt is never deleted or written to. Each decision is written to
``attempts/J/recovery-<n>.json`` with its evidence and to the events journal.
"""

from __future__ import annotations

import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from . import claim, store
from .attempt import open_attempt, write_failure
from .execute import Context, check_candidate, publish
from .model import AttemptRecord, Failure, Job, Manifest, Record, decode, encode, now
from .status import attempt_numbers, read
from .tree import Tree, fsync_dir, write_atomic

log = logging.getLogger("spool.recover")

Decision = Literal[
    "published",
    "staged",
    "recorded-failure",
    "recorded-interruption",
    "accept-candidate",
    "retry",
    "exhausted",
]


class Evidence(Record, kw_only=True):
    """What recovery saw, recorded with its decision."""

    job_id: str
    worker: str
    attempt: int  # the attempt of the current claim; 0 if the claim made none
    attempts_used: int
    manifest: str  # "absent", "verified" or why it is not
    result: str
    failure: bool
    interrupted: bool
    candidate: str  # "absent", or the candidate's path relative to the spool


class RecoveryRecord(Record, kw_only=True):
    """``attempts/J/recovery-<n>.json``."""

    job_id: str
    decision: str
    reason: str
    evidence: Evidence
    validation: Any = None
    decided_by: str
    decided_at: Any


@dataclass(frozen=True)
class Outcome:
    job_id: str
    decision: Decision
    reason: str
    to_state: str


def current_attempt(tree: Tree, job_id: str, worker: str) -> int:
    """The latest attempt belonging to the claim now in ``running/<worker>/``, or 0.

    Attempts are made only by the owner after its claim, so the latest
    attempt is this claim's if that worker made it and no retry closed it.
    """
    nums = attempt_numbers(tree, job_id)
    if not nums:
        return 0
    n = nums[-1]
    rec = read(tree.attempt_dir(job_id, n) / "attempt.json", AttemptRecord)
    if rec is None or rec.worker != worker:
        return 0
    if (tree.job_attempts(job_id) / f"retry-{n}.json").exists():
        return 0
    return n


def renders_started(tree: Tree, job_id: str) -> int:
    used = 0
    for n in attempt_numbers(tree, job_id):
        rec = read(tree.attempt_dir(job_id, n) / "attempt.json", AttemptRecord)
        if rec is not None and rec.reason == "claim":
            used += 1
    return used


def inspect(tree: Tree, job: Job, worker: str) -> Evidence:
    """Gather the evidence for a job in ``running/<worker>/`` (reads only)."""
    jid = job.job_id
    n = current_attempt(tree, jid, worker)
    d = tree.attempt_dir(jid, n) if n else None
    manifest = read(tree.manifest_file(jid), Manifest)
    if manifest is None:
        mstate = "absent"
    elif manifest.recipe_hash != job.recipe_hash:
        mstate = "names a different recipe"
    else:
        mstate = store.verify(tree, manifest) or "verified"
    result = "absent"
    if d is not None:
        staged = read(d / "result.json", Manifest)
        if staged is not None:
            result = store.verify(tree, staged) or "verified"
    cand = "absent"
    if d is not None:
        p = d / "work" / job.output.file
        if p.is_file() and p.stat().st_size > 0:
            cand = tree.relative(p)
    return Evidence(
        job_id=jid,
        worker=worker,
        attempt=n,
        attempts_used=renders_started(tree, jid),
        manifest=mstate,
        result=result,
        failure=bool(d and (d / "failure.json").exists()),
        interrupted=bool(d and (d / "interrupted.json").exists()),
        candidate=cand,
    )


def decide(ev: Evidence, max_attempts: int, candidate_valid: bool | None) -> tuple[Decision, str]:
    """Pure: evidence -> decision and a one-line reason."""
    if ev.manifest == "verified":
        return (
            "published",
            "the manifest exists and its store file verifies; finishing the move to complete",
        )
    if ev.result == "verified":
        return "staged", f"attempt {ev.attempt} staged a verified result; installing its manifest"
    if ev.failure:
        return (
            "recorded-failure",
            f"attempt {ev.attempt} recorded a failure; finishing the move to failed",
        )
    if ev.interrupted:
        return (
            "recorded-interruption",
            f"attempt {ev.attempt} was interrupted; returning the job to pending",
        )
    if ev.candidate != "absent" and candidate_valid:
        return "accept-candidate", f"attempt {ev.attempt} left a candidate that passes validation"
    why = (
        f"attempt {ev.attempt} left a candidate that fails validation"
        if ev.candidate != "absent"
        else f"attempt {ev.attempt} left no output"
        if ev.attempt
        else "the claim opened no attempt"
    )
    if ev.attempts_used < max_attempts:
        return (
            "retry",
            f"{why}; {ev.attempts_used} of {max_attempts} attempts used, returning to pending",
        )
    return "exhausted", f"{why}; all {max_attempts} attempts used"


def recover(ctx: Context, job_id: str, *, dry_run: bool = False) -> Outcome | None:
    """Decide and apply recovery for a job in ``running/<ctx.worker>/``."""
    tree = ctx.tree
    path = tree.job_file("running", job_id, ctx.worker)
    try:
        job = decode(path.read_bytes(), Job)
    except OSError:
        return None
    ev = inspect(tree, job, ctx.worker)
    report = None
    valid: bool | None = None
    needs_validation = (
        ev.manifest != "verified"
        and ev.result != "verified"
        and not ev.failure
        and not ev.interrupted
        and ev.candidate != "absent"
    )
    if needs_validation and not dry_run:
        report = check_candidate(
            ctx.cfg,
            job,
            tree.root / ev.candidate,
            tree.job_attempts(job_id) / f"recovery-{ev.attempt}.validate.log",
        )
        valid = report.ok
    elif needs_validation:
        valid = True  # a dry run cannot know; it reports what validation would decide
    decision, reason = decide(ev, ctx.cfg.limits.max_attempts, valid)
    if dry_run:
        return Outcome(job_id, decision, reason, _target(decision))
    _log_decision(tree, job_id, ev, decision, reason, report, ctx.worker)
    to_state = _apply(ctx, job, ev, decision, reason, report)
    ctx.journal.record(
        job_id,
        to_state,
        from_="running",
        attempt=ev.attempt or None,
        reason=f"recovery ({decision}): {reason}",
    )
    log.info("%s: recovery decided %s: %s", job_id, decision, reason)
    return Outcome(job_id, decision, reason, to_state)


def _target(decision: Decision) -> str:
    return {
        "published": "complete",
        "staged": "complete",
        "accept-candidate": "complete",
        "recorded-failure": "failed",
        "exhausted": "failed",
        "recorded-interruption": "pending",
        "retry": "pending",
    }[decision]


def _log_decision(
    tree: Tree, job_id: str, ev: Evidence, decision: str, reason: str, report: Any, by: str
) -> None:
    folder = tree.job_attempts(job_id)
    name, k = f"recovery-{ev.attempt}.json", 1
    while (folder / name).exists():
        k += 1
        name = f"recovery-{ev.attempt}-{k}.json"
    rec = RecoveryRecord(
        job_id=job_id,
        decision=decision,
        reason=reason,
        evidence=ev,
        validation=report,
        decided_by=by,
        decided_at=now(),
    )
    write_atomic(folder / name, encode(rec))


def _apply(ctx: Context, job: Job, ev: Evidence, decision: Decision, reason: str, report: Any) -> str:
    tree, jid = ctx.tree, job.job_id
    if decision == "published":
        _move(ctx, jid, "complete")
        return "complete"
    if decision == "staged":
        staged = read(tree.attempt_dir(jid, ev.attempt) / "result.json", Manifest)
        assert staged is not None
        # No verified manifest exists (else the decision were "published"): an
        # absent one is installed, a damaged one is replaced by the verified result.
        write_atomic(tree.manifest_file(jid), encode(staged), mode=0o444)
        _move(ctx, jid, "complete")
        return "complete"
    if decision == "recorded-failure":
        _move(ctx, jid, "failed")
        return "failed"
    if decision in ("recorded-interruption", "retry"):
        _move(ctx, jid, "pending")
        return "pending"
    if decision == "accept-candidate":
        att = open_attempt(tree, jid, ctx.worker, reason=f"recovery of attempt {ev.attempt}")
        old = tree.root / ev.candidate
        new = att.work / job.output.file
        _link_or_copy(old, new)
        publish(ctx, job, att, new, report, 0.0, note="accepted existing validated file")
        return "complete"
    # exhausted
    att = open_attempt(tree, jid, ctx.worker, reason=f"recovery of attempt {ev.attempt}")
    write_failure(
        att,
        Failure(
            job_id=jid,
            attempt=att.n,
            stage="recover",
            property="max_attempts",
            expected=f"a finished attempt within {ctx.cfg.limits.max_attempts}",
            actual=f"{ev.attempts_used} attempts, the last one ended without a result",
            message=reason,
            next_action="Read the attempts' logs (spool show JOB); fix the cause, then spool retry.",
            worker=ctx.worker,
            failed_at=now(),
            retryable=True,
        ),
    )
    _move(ctx, jid, "failed")
    return "failed"


def _move(ctx: Context, jid: str, to: str) -> None:
    if not claim.move(ctx.tree, ctx.worker, jid, to):
        raise RuntimeError(f"{jid} left running/{ctx.worker}/ during recovery")


def _link_or_copy(src: Path, dst: Path) -> None:
    """Bring the old attempt's candidate into the new attempt without changing it."""
    try:
        os.link(src, dst)
    except OSError:
        shutil.copyfile(src, dst)
    fsync_dir(dst.parent)


def adopt(ctx: Context) -> list[Outcome]:
    """At daemon start: recover every job left in this worker's running folder."""
    out = []
    folder = ctx.tree.running_dir(ctx.worker)
    for name in sorted(os.listdir(folder)) if folder.is_dir() else []:
        if not name.endswith(".json") or name.startswith("."):
            continue
        try:
            o = recover(ctx, name[:-5])
        except Exception:  # one bad job must not stop the others' recovery
            log.exception("%s: recovery failed; it stays in running/%s/", name[:-5], ctx.worker)
            continue
        if o is not None:
            out.append(o)
    return out
