"""Attempt folders: one per claim, ``attempts/<job_id>/<n>/``, owned by one worker.

An attempt folder is born whole: it is assembled under a hidden name
(``attempt.json`` written, ``work/`` created) and renamed to its number, so
every visible attempt has its record. The rename also makes the number
exclusive: renaming onto an existing non-empty ``<n>`` fails. Then, for an
attempt opened durably (format 1; a driven kind's, which writes durable states
into it; recovery's and cancel's), ``attempts/<job_id>/`` is fsynced: the number,
once seen, is never given again (and the job's frozen copy there is durable).

Inside: ``attempt.json`` (who and when), ``work/`` (the only place a partial
output may exist), ``ffmpeg.log``, ``progress.json``, and at the end the staged
result ``result.json`` (format 1: a copy of the manifest; format 2: the manifest's
own first name, the same file as ``manifests/J.json``; earlier format-2 code wrote
it into ``attempt.json`` instead, which readers still take) or ``failure.json``, or
``interrupted.json`` when a stop or a crash cut it short. No worker writes into
another's attempt, and recovery never deletes or rewrites one.

Durability (:mod:`spool.disk.formats`): format 1 fsyncs ``attempt.json`` and the
staging folder before the rename. Format 2 fsyncs none of the three for an attempt
opened ``durable=False`` (a slot kind's, opened by the daemon's claim batch):
nothing relies on the attempt until it ends, and every ending is durable
elsewhere or makes it durable. A complete job's manifest names the publishing
attempt with its identity; every durable record written into an attempt
(``failure.json``, ``interrupted.json``) fsyncs ``attempts/<job_id>/`` as well as
its own folder, as does every record beside the attempts (``delay.json``,
``recovery-<n>.json``, retry marks), so the attempt's name is durable before the
job moves on. A power cut may empty such a record, or lose the attempt's folder
(and the frozen copy's name) outright; readers say unknown or read the manifest,
a job still running is recovered as a claim that opened no attempt, and ``spool
fsck`` writes the record or the folder again from what the tree proves
(:mod:`spool.repair.lostwrites`).
"""

from __future__ import annotations

import errno
import os
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path

import msgspec

from spool.core.model import AttemptRecord, Failure, Manifest, Record, encode, now
from spool.disk.records import damaged, read
from spool.disk.tree import HOST, Tree, boot_id, fsync_dir, make_dirs, write_atomic, write_unseen
from spool.queue import retry


class NotYet(Exception):
    """A claim came before the job's retry delay was over: another host failed the job
    and returned it with a ``delay.json`` after this worker last looked it up. No
    attempt was opened; the caller gives the job back to ``pending/``."""

    def __init__(self, job_id: str, until: float) -> None:
        super().__init__(f"{job_id} may not be claimed before {until:.0f} (its retry delay)")
        self.job_id = job_id
        #: epoch seconds: when the job may be claimed
        self.until = until


@dataclass(frozen=True)
class Attempt:
    tree: Tree
    job_id: str
    n: int
    #: ``attempt.json`` as this process wrote it at the claim (``None``: not this
    #: process's attempt, or not known; read the file).
    claimed: AttemptRecord | None = field(default=None, compare=False, repr=False)

    def claim_record(self) -> AttemptRecord | None:
        """``attempt.json`` as written at the claim: in hand if this process wrote it."""
        if self.claimed is not None:
            return self.claimed
        got: AttemptRecord | None = read(self.dir / "attempt.json", AttemptRecord)
        return got

    @property
    def dir(self) -> Path:
        return self.tree.attempt_dir(self.job_id, self.n)

    @property
    def work(self) -> Path:
        return self.dir / "work"

    @property
    def tool_log(self) -> Path:
        """The log of the tool that makes the candidate (FFmpeg for a render)."""
        return self.dir / "ffmpeg.log"

    @property
    def progress(self) -> Path:
        return self.dir / "progress.json"

    def record(self, name: str, rec: Record, *, durable: bool = True) -> Path:
        """Write one of this attempt's record files atomically. A durable one is durable
        by its whole path: ``attempts/<job_id>/`` is fsynced too, since an attempt opened
        ``durable=False`` may not have its own name on disk yet."""
        path = self.dir / name
        write_atomic(path, encode(rec), durable=durable)
        if durable:
            fsync_dir(self.dir.parent)
        return path


def open_attempt(
    tree: Tree,
    job_id: str,
    worker: str,
    reason: str = "claim",
    *,
    durable: bool = True,
    first: bool = False,
    claim: bool = False,
) -> Attempt:
    """Create the next attempt folder for a job this worker owns. ``durable=False``:
    neither the record, the staging folder nor ``attempts/<job_id>/`` is fsynced
    (format 2's slot attempts; see the module docstring); ``durable=True``: all three
    (``attempts/<job_id>/`` inside a group-commit batch at its end).

    ``first``: the caller expects no earlier attempt (it accepted the job a moment ago, or
    found no retry delay), so number 1 is tried without listing ``attempts/<job_id>/`` (a
    round trip on a NAS).
    A wrong guess costs one refused rename and then a listing, never a number used
    twice: attempt folders are never removed while their job lives.

    ``claim``: the attempt of a claim, which must not come before the job's retry delay.
    The claim order looked the delay up earlier, but another host may have run the job
    and returned it with one since; so whenever ``attempts/<job_id>/`` shows earlier
    attempts (the listing this numbering makes anyway, or a refused first guess), a
    ``delay.json`` there is read, and :class:`NotYet` is raised, with nothing created,
    while it is not over. A job with no earlier attempt has no delay: no read."""
    parent = tree.job_attempts(job_id)
    n = 1 if first else _next_number(tree, job_id, claim)
    staging = parent / f".new.{HOST}.{os.getpid()}.{secrets.token_hex(4)}"
    try:
        os.mkdir(staging)
    except FileNotFoundError:  # no reservation folder (a job from before them, or fsck's restore)
        make_dirs(parent)
        os.mkdir(staging)
    os.mkdir(staging / "work")
    rec = AttemptRecord(
        job_id=job_id,
        n=n,
        worker=worker,
        host=HOST,
        pid=os.getpid(),
        boot_id=boot_id(),
        claimed_at=now(),
        reason=reason,
    )
    guessed = first
    while True:
        write_unseen(staging / "attempt.json", encode(rec), durable=durable)  # staging: unseen until renamed
        try:
            os.rename(staging, parent / str(n))
            break
        except OSError as exc:
            # Renaming a folder onto a non-empty one fails with ENOTEMPTY (or EEXIST):
            # <n> was taken (after a crash mid-numbering, or a wrong first guess), so
            # take the next number. Anything else (EACCES, EROFS, ENOSPC) is a located
            # error: retrying it would loop forever with n rising.
            if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                _remove_staging(staging)
                raise
            if guessed:  # the job has a history after all: look at it once
                guessed = False
                try:
                    n = max(n, _next_number(tree, job_id, claim) - 1)
                except NotYet:
                    _remove_staging(staging)
                    raise
            n += 1
            rec = msgspec.structs.replace(rec, n=n)
    if n > 1:
        _drop_torn_result(parent / str(n - 1))
    if durable:
        fsync_dir(parent)
    return Attempt(tree, job_id, n, rec)


def _drop_torn_result(attempt_dir: Path) -> None:
    """The attempt before this one is over (this claim fenced it out), so a ``result.json``
    it left empty or torn (killed while writing it: format 2's is the manifest's first
    name) can never become a manifest: it goes, so that no crash leftover outlives the job.
    One open of a name that is normally absent, on a retry only."""
    path = attempt_dir / "result.json"
    if damaged(path, Manifest) is not None:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


def _next_number(tree: Tree, job_id: str, claim: bool) -> int:
    """The number after the job's last attempt, from one listing of ``attempts/<job_id>/``;
    for a claim, raises :class:`NotYet` if a ``delay.json`` there is not over."""
    try:
        names = os.listdir(tree.job_attempts(job_id))
    except FileNotFoundError:
        return 1
    if claim and retry.DELAY in names:
        until = retry.not_before(tree, job_id)
        if until is not None and until > time.time():
            raise NotYet(job_id, until)
    return max((int(x) for x in names if x.isdigit()), default=0) + 1


def _remove_staging(staging: Path) -> None:
    for p in (staging / "attempt.json", staging / "work"):
        try:
            p.rmdir() if p.is_dir() else p.unlink()
        except OSError:
            pass
    try:
        staging.rmdir()
    except OSError:
        pass


def drop_partial(path: Path) -> None:
    """On a full disk, free what an attempt wrote: a partial output is of no use
    to anyone, and the failure record still has to fit."""
    try:
        path.unlink()
    except OSError:
        pass


def write_failure(attempt: Attempt, failure: Failure) -> Path:
    return attempt.record("failure.json", failure)


def write_result(attempt: Attempt, manifest: Manifest) -> Path:
    """Format 1's staged manifest. Not fsynced: the durable ``manifests/J.json`` follows
    at once, and if a crash loses this file, recovery validates the candidate instead."""
    return attempt.record("result.json", manifest, durable=False)


def staged_result(attempt_dir: Path) -> Manifest | None:
    """The result an attempt staged (``attempt.json``'s, as earlier format-2 code
    wrote it, else ``result.json``), or ``None``: a torn one reads as ``None``."""
    rec = read(attempt_dir / "attempt.json", AttemptRecord)
    if rec is not None and rec.result is not None:
        return rec.result
    m: Manifest | None = read(attempt_dir / "result.json", Manifest)
    return m
