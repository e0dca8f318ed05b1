"""Recovery: a logged, evidence-based decision about a job whose worker stopped.

A job is recovered only by the worker that owns it (a daemon adopting its own
``running/<me>/`` at start) or after an explicit takeover, which renames the
job file into the recoverer's running folder first: from then on the old
worker's fencing checks fail, so it can never publish or move the job.

The evidence is the job's latest attempt of the current claim: its records
(the staged result, ``failure.json``, ``interrupted.json``), the candidate in
``work/``, and ``manifests/J.json``. The decision, in order:

=====================  ===========================================================
published              the manifest exists and verifies: finish the move to complete
staged                 the staged result names a verified store file: install the
                       manifest, complete
recorded-failure       ``failure.json`` exists: finish the move to failed
recorded-interruption  ``interrupted.json`` exists: finish the move to pending
accept-candidate       a candidate in ``work/`` passes validation: publish it in a
                       new attempt ("accepted existing validated file"), complete
retry                  otherwise, while ``max_attempts`` allows: back to pending
exhausted              otherwise: failed, with a failure record
=====================  ===========================================================

A retryable failure record (a full disk, a killed FFmpeg) returns the job to
pending while attempts remain. Retries wait by the backoff policy
(:mod:`spool.queue.retry`).

The old attempt is never deleted or written to. Each decision is written to
``attempts/J/recovery-<n>.json`` with its evidence and to the events journal.

Other workers' jobs (:func:`plan`): a worker on this host whose process is
gone is dead, certainly, and its jobs are recovered. A worker on another host
with a stale heartbeat is only suspect: its jobs are recovered when an
operator names it (``spool recover --worker W``) or when ``auto_recover`` is
on. Takeover is a rename into the recoverer's running folder, so the old
worker, if it was only paused, finds its job gone at its next fence.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from spool import kinds
from spool.core.errors import LostOwnership
from spool.core.faults import crashpoint
from spool.core.model import (
    AttemptRecord,
    Decision,
    Evidence,
    Failure,
    JobBase,
    Manifest,
    RecoveryRecord,
    ValidationReport,
    WorkerRecord,
    encode,
    now,
)
from spool.disk import store
from spool.disk.records import read
from spool.disk.tree import Tree, fsync_dir, link_or_copy, make_dirs, transfer, visible_names, write_atomic
from spool.library import index
from spool.queue import liveness, quarantine, retry
from spool.queue.attempt import open_attempt, staged_result, write_failure
from spool.queue.context import Context
from spool.queue.publish import install_manifest, publish
from spool.queue.status import running_workers

log = logging.getLogger("spool.repair.recover")

__all__ = ["Decision", "Evidence", "Outcome", "RecoveryRecord", "adopt", "decide", "plan", "recover"]


@dataclass(frozen=True)
class Outcome:
    job_id: str
    decision: Decision | Literal["quarantine", "resumed"]
    reason: str
    to_state: str
    #: For ``resumed``: the attempt the caller's driver carries on.
    attempt: int = 0


def current_attempt(tree: Tree, job_id: str, worker: str) -> int:
    """The latest attempt belonging to the claim now in ``running/<worker>/``, or 0.

    Attempts are made only by the owner after its claim, so the latest
    attempt is this claim's if that worker made it and no retry closed it. An
    attempt another worker made is this claim's too while nothing closed it: a job
    reaches ``pending/`` again only with its attempt closed (a failure or an
    interruption recorded in it, a recovery decision or an operator's retry beside
    it), so a claim here over an open attempt of another's is a takeover, and a
    recoverer killed right after one must judge that attempt when it restarts, not
    retry the job as if the claim had opened none (which threw a staged result away,
    or failed a job on its last attempt).
    """
    nums = tree.attempt_numbers(job_id)
    if not nums:
        return 0
    n = nums[-1]
    folder = tree.job_attempts(job_id)
    rec = read(tree.attempt_dir(job_id, n) / "attempt.json", AttemptRecord)
    if rec is None or (folder / f"retry-{n}.json").exists():
        return 0
    if rec.worker != worker and _closed(tree, job_id, n):
        return 0
    return n


def _closed(tree: Tree, job_id: str, n: int) -> bool:
    """Whether attempt ``n`` ended in a way that can send its job back to ``pending/``."""
    d = tree.attempt_dir(job_id, n)
    if (d / "failure.json").exists() or (d / "interrupted.json").exists():
        return True
    prefix = f"recovery-{n}"
    return any(
        name.startswith(prefix) and name.endswith(".json") and name[len(prefix)] in ".-"
        for name in os.listdir(tree.job_attempts(job_id))
    )


def inspect(tree: Tree, job: JobBase, worker: str) -> Evidence:
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
        staged = staged_result(d)
        if staged is not None:
            result = store.verify(tree, staged) or "verified"
    cand = "absent"
    if d is not None:
        p = kinds.of(job).candidate(job, d)
        if p.is_file() and p.stat().st_size > 0:
            cand = tree.relative(p)
    return Evidence(
        job_id=jid,
        worker=worker,
        attempt=n,
        attempts_used=retry.claims_made(tree, jid),
        manifest=mstate,
        result=result,
        failure=_failure_kind(d),
        interrupted=bool(d and (d / "interrupted.json").exists()),
        candidate=cand,
    )


def _failure_kind(d: Path | None) -> str:
    if d is None:
        return "absent"
    f = read(d / "failure.json", Failure)
    if f is None:
        return "absent"
    return "retryable" if f.retryable else "final"


def decide(ev: Evidence, max_attempts: int, candidate_valid: bool | None) -> tuple[Decision, str]:
    """Pure: evidence -> decision and a one-line reason."""
    if ev.manifest == "verified":
        return (
            "published",
            "the manifest exists and its store file verifies; finishing the move to complete",
        )
    if ev.result == "verified":
        return "staged", f"attempt {ev.attempt} staged a verified result; installing its manifest"
    if ev.failure == "final" or (ev.failure == "retryable" and ev.attempts_used >= max_attempts):
        return (
            "recorded-failure",
            f"attempt {ev.attempt} recorded a failure; finishing the move to failed",
        )
    if ev.failure == "retryable":
        return "retry", f"attempt {ev.attempt} recorded a retryable failure; returning to pending"
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


def takeover(ctx: Context, owner: str, job_id: str, why: str) -> bool:
    """Move a job from ``running/<owner>/`` into the recoverer's own running folder.

    This is a claim: one rename, exactly one winner. From here on ``owner``'s
    fencing checks fail, so it can never publish or move the job.
    """
    src = ctx.tree.job_file("running", job_id, owner)
    dst = ctx.tree.job_file("running", job_id, ctx.worker)
    make_dirs(dst.parent)
    if not transfer(src, dst):
        return False
    ctx.journal.record(job_id, "running", from_="running", reason=f"taken over from {owner}: {why}")
    return True


def recover(
    ctx: Context, job_id: str, *, owner: str | None = None, why: str = "", dry_run: bool = False
) -> Outcome | None:
    """Decide and apply recovery for a job in ``running/<owner>/`` (default: ours).

    For another worker's job the recoverer first takes the job over; a dry run
    only reads and reports what it would decide.
    """
    tree = ctx.tree
    owner = owner or ctx.worker
    path = tree.job_file("running", job_id, owner)
    if _old_name(tree, path, job_id):
        # Nothing to decide (rename(2) between two names of one file would do nothing): the
        # old name goes, and the job's one "complete" line stays its only one.
        if not dry_run:
            try:
                os.unlink(path)
            except FileNotFoundError:
                return None
            fsync_dir(path.parent)
            log.info("%s: complete; its old name in running/%s/ (kept by a power cut) removed", job_id, owner)
        return Outcome(job_id, "published", "complete already; its old name in running/ goes", "complete")
    try:
        job = quarantine.load(path)
    except quarantine.Damaged as damage:
        if dry_run:
            return Outcome(job_id, "quarantine", f"{damage.field}: {damage.reason}", "quarantine")
        if quarantine.quarantine(tree, path, f"running/{owner}", damage, ctx.worker):
            ctx.journal.record(
                job_id, "quarantine", from_="running", reason=f"{damage.field}: {damage.reason}"
            )
            return Outcome(job_id, "quarantine", f"{damage.field}: {damage.reason}", "quarantine")
        return None
    except OSError:
        return None
    ev = inspect(tree, job, owner)
    needs_validation = (
        ev.manifest != "verified"
        and ev.result != "verified"
        and ev.failure == "absent"
        and not ev.interrupted
        and ev.candidate != "absent"
    )
    if dry_run:
        decision, reason = decide(ev, ctx.cfg.limits.max_attempts, True if needs_validation else None)
        if needs_validation:
            reason += " (if it validates; otherwise a retry)"
        return Outcome(job_id, decision, reason, _target(decision))
    if owner != ctx.worker:
        if not takeover(ctx, owner, job_id, why or "recovery"):
            return None
        crashpoint("after_takeover")
    # A kind may carry on an attempt in flight itself (a generation keeps polling the
    # same provider job); only otherwise does the evidence decide.
    n = current_attempt(tree, job_id, owner)
    kind = kinds.of(job)
    if (
        n
        and ctx.resumes_driven
        and kind.runner == "driven"
        and kind.resume(ctx, job, tree.attempt_dir(job_id, n))
    ):
        reason = f"attempt {n} is in flight; the driver carries it on"
        ctx.journal.record(
            job_id, "running", from_="running", attempt=n, reason=f"recovery (resumed): {reason}"
        )
        log.info("%s: recovery resumed attempt %d", job_id, n)
        return Outcome(job_id, "resumed", reason, "running", attempt=n)
    report = None
    valid: bool | None = None
    if needs_validation:
        report = kinds.of(job).check(
            ctx.cfg,
            job,
            tree.root / ev.candidate,
            tree.job_attempts(job_id) / f"recovery-{ev.attempt}.validate.log",
        )
        valid = report.ok
    decision, reason = decide(ev, ctx.cfg.limits.max_attempts, valid)
    _log_decision(tree, job_id, ev, decision, reason, report, ctx.worker, why)
    to_state = _apply(ctx, job, ev, decision, reason, report)
    if decision != "accept-candidate":  # publishing journals that transition itself
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
    tree: Tree,
    job_id: str,
    ev: Evidence,
    decision: Decision,
    reason: str,
    report: ValidationReport | None,
    by: str,
    why: str,
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
        worker_state=why,
        validation=report,
        decided_by=by,
        decided_at=now(),
    )
    write_atomic(folder / name, encode(rec))


def _apply(
    ctx: Context, job: JobBase, ev: Evidence, decision: Decision, reason: str, report: ValidationReport | None
) -> str:
    tree, jid = ctx.tree, job.job_id
    if decision == "published":
        published = read(tree.manifest_file(jid), Manifest)
        assert published is not None  # decided "published": it exists and verifies
        index.index_job(tree, published, ctx.cfg.acceptance.required_tags)
        _move(ctx, jid, "complete")
        return "complete"
    if decision == "staged":
        staged = staged_result(tree.attempt_dir(jid, ev.attempt))
        assert staged is not None
        # No verified manifest for this recipe exists (else the decision were
        # "published"): the one publish rule installs the verified staged result.
        installed = install_manifest(tree, staged)
        index.index_job(tree, installed, ctx.cfg.acceptance.required_tags)
        _move(ctx, jid, "complete")
        return "complete"
    if decision == "recorded-failure":
        _move(ctx, jid, "failed")
        return "failed"
    if decision in ("recorded-interruption", "retry"):
        if decision == "retry":
            retry.schedule(tree, jid, ctx.cfg.recovery, ev.attempt, reason)
        _move(ctx, jid, "pending")
        return "pending"
    if decision == "accept-candidate":
        att = open_attempt(tree, jid, ctx.worker, reason=f"recovery of attempt {ev.attempt}")
        old = tree.root / ev.candidate
        new = kinds.of(job).candidate(job, att.dir)
        link_or_copy(old, new)  # a copy is verified against the old candidate's bytes
        assert report is not None  # accept-candidate is decided on a report
        publish(
            ctx,
            job,
            att,
            new,
            report,
            0.0,
            note="accepted existing validated file",
            why=f"recovery (accept-candidate): {reason}; ",
        )
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
    if not transfer(ctx.tree.job_file("running", jid, ctx.worker), ctx.tree.job_file(to, jid)):
        raise LostOwnership(f"{jid} left running/{ctx.worker}/ during recovery")


def _old_name(tree: Tree, path: Path, job_id: str) -> bool:
    """Whether ``path`` in ``running/`` is the old name of a job moved to ``complete/``: the
    same file. A power cut may keep it, as a publish owes the removal's fsync to the next
    round (:class:`spool.disk.groupcommit.Owed`); the job is complete and told so."""
    try:
        return os.path.samefile(path, tree.job_file("complete", job_id))
    except FileNotFoundError:
        return False


def jobs_of(tree: Tree, worker: str) -> list[str]:
    return sorted(n[:-5] for n in visible_names(tree.running_dir(worker)))


def adopt(ctx: Context) -> list[Outcome]:
    """At daemon start: recover every job left in this worker's own running folder
    (the previous process with this identity is certainly gone: we hold its lock)."""
    out = []
    for jid in jobs_of(ctx.tree, ctx.worker):
        try:
            o = recover(ctx, jid, why="restart: this worker's previous process is gone")
        except Exception:  # one bad job must not stop the others' recovery
            log.exception("%s: recovery failed; it stays in running/%s/", jid, ctx.worker)
            continue
        if o is not None:
            out.append(o)
    return out


# -- recovering other workers ------------------------------------------------------------


@dataclass(frozen=True)
class WorkerPlan:
    """What ``spool recover`` (or a daemon's policy) would do about one worker."""

    worker: str
    health: str  # alive, suspect, dead, stopped, or "unknown" (no worker record)
    evidence: str
    act: bool
    why: str
    jobs: list[Outcome]
    #: Seconds before it may act: a worker gone while writing through another mount,
    #: whose last writes may not show here yet (``[recovery] mount_lag``).
    wait: float = 0.0


def plan(
    ctx: Context,
    *,
    worker: str | None = None,
    force: bool = False,
    auto: bool = False,
    observer: liveness.Observer | None = None,
    gone: liveness.Gone | None = None,
    report: bool = True,
) -> list[WorkerPlan]:
    """Decide, per worker with jobs in ``running/``, whether to recover it and how.

    ``report=False`` (a daemon's policy, every few seconds): a worker left alone gets
    no per-job decisions (``WorkerPlan.jobs`` empty). Deciding reads each of its jobs'
    file, attempts, records and manifest: for a farm's live workers, every few seconds
    and on a NAS, a steady load that acted on nothing. Its listing of ``running/`` is
    kept while a stat shows the folder unchanged (``running_workers(kept=True)``).

    Dead workers (same host, certain) are recovered. A suspect worker (another
    host, stale heartbeat) only when named by an operator (``worker=``) or when
    policy allows (``auto`` and ``[recovery] auto_recover``). An alive worker
    only with ``force``: an operator who knows it is hung. A gone worker that wrote
    through another mount waits (``WorkerPlan.wait``) until ``gone`` has known it gone
    for ``[recovery] mount_lag``: plan again then.
    """
    stale = ctx.cfg.recovery.stale_after
    server = None if observer is not None else liveness.server_now(ctx.tree)
    out = []
    for w in running_workers(ctx.tree, kept=not report):
        if w == ctx.worker or (worker is not None and w != worker):
            continue
        jobs = jobs_of(ctx.tree, w)
        if not jobs:
            continue
        rec = read(ctx.tree.worker_file(w), WorkerRecord, replaced=True)  # a heartbeat may be mid-replace
        wait = 0.0
        if rec is None:
            health, evidence = "unknown", "no worker record in workers/"
        else:
            h = liveness.assess(ctx.tree, rec, stale, observer=observer, server_time=server)
            health, evidence = h.health, h.reason
            if health in ("dead", "stopped"):
                wait = liveness.settles_in(ctx.tree, rec, ctx.cfg.recovery.mount_lag, gone)
        named = worker is not None
        if wait > 0:
            # Certain it is gone, not yet certain of what it left: a generation's provider
            # job not visible here would be created a second time.
            act = False
            why = (
                f"{w} is {health} ({evidence}) but wrote through another mount, whose last "
                f"writes may show here only in {wait:.0f} s ([recovery] mount_lag)"
            )
        elif health in ("dead", "stopped") or (health == "unknown" and not auto):
            # "unknown" needs a human: on a lagging NAS listing the record may just be late.
            act, why = True, f"{w} is {health}: {evidence}"
        elif health == "suspect" and (named or (auto and ctx.cfg.recovery.auto_recover)):
            act = True
            why = f"{w} is suspect ({evidence}); " + (
                "recovery asked for by an operator" if named else "auto_recover is on"
            )
        elif health in ("alive", "stalled") and named and force:  # stalled: still deliberate
            act, why = True, f"{w} looks alive ({evidence}) but recovery was forced by an operator"
        else:
            act = False
            why = f"{w} is {health} ({evidence}); " + (
                "name it with --worker to recover it"
                if health == "suspect"
                else "use --force if you know it is hung"
            )
        outcomes = (
            [o for jid in jobs if (o := recover(ctx, jid, owner=w, dry_run=True)) is not None]
            if act or report
            else []
        )
        out.append(WorkerPlan(w, health, evidence, act, why, outcomes, wait))
    return out


def plan_settled(
    ctx: Context,
    *,
    worker: str | None = None,
    force: bool = False,
    told: Callable[[float], None] | None = None,
) -> list[WorkerPlan]:
    """:func:`plan` for a one-shot recoverer (``spool recover``): a plan that must wait
    for a gone worker's writes to show here (``WorkerPlan.wait``) is made again after
    that wait, which ``told`` hears of first."""
    gone = liveness.Gone()
    plans = plan(ctx, worker=worker, force=force, gone=gone)
    wait = max((p.wait for p in plans), default=0.0)
    if wait > 0:
        if told is not None:
            told(wait)
        time.sleep(wait)
        plans = plan(ctx, worker=worker, force=force, gone=gone)
    return plans


def execute_plan(ctx: Context, plans: list[WorkerPlan]) -> list[Outcome]:
    """Carry out the recoveries a plan allows."""
    done = []
    for p in plans:
        if not p.act:
            continue
        for o in p.jobs:
            try:
                r = recover(ctx, o.job_id, owner=p.worker, why=p.why)
            except Exception:
                log.exception("%s: recovery from %s failed", o.job_id, p.worker)
                continue
            if r is not None:
                done.append(r)
    return done
