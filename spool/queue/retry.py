"""Retry policy: when a job goes back to pending, and how long it waits there.

Technical retries (a crash, a full disk, an OOM-killed FFmpeg, an unreadable
source on a flaky mount) never change the recipe: the same job file returns
to ``pending/`` and the next claim opens a new attempt. They are bounded by
``[limits] max_attempts`` (attempts that started a render count) and spaced
by exponential backoff, ``backoff * 2^(k-1)`` seconds capped at
``backoff_max``, after the k-th attempt.

The job file is immutable, so the wait is a record beside it:
``attempts/J/delay.json`` says "not before T". The claim order skips a job
until then, and a claim's attempt is refused until then too
(:class:`spool.queue.attempt.NotYet`): another host may have returned the job with
a delay after this worker's order looked. An operator's ``spool retry`` clears it.
"""

from __future__ import annotations

import os
import time
from datetime import UTC, datetime

from spool.core.config import Recovery
from spool.core.model import AttemptRecord, Delay, Interruption, RetryMark, decode, encode, now
from spool.disk.records import read
from spool.disk.tree import Tree, write_atomic

#: The record of a retry's wait, beside the job's attempts.
DELAY = "delay.json"


def claims_made(tree: Tree, job_id: str) -> int:
    """Attempts that were claims (not recovery or cancel bookkeeping, nor deferred:
    an attempt that waited for a provider's quota did nothing): what ``max_attempts``
    counts."""
    used = 0
    for n in tree.attempt_numbers(job_id):
        d = tree.attempt_dir(job_id, n)
        rec = read(d / "attempt.json", AttemptRecord)
        if rec is None or rec.reason != "claim":
            continue
        stop = read(d / "interrupted.json", Interruption) if (d / "interrupted.json").exists() else None
        if stop is None or not stop.deferred:
            used += 1
    return used


def backoff(policy: Recovery, attempts_used: int) -> float:
    """Seconds to wait before the next attempt, after ``attempts_used`` attempts."""
    if attempts_used <= 0 or policy.backoff <= 0:
        return 0.0
    return min(policy.backoff * 2 ** (attempts_used - 1), policy.backoff_max)


def schedule(tree: Tree, job_id: str, policy: Recovery, after_attempt: int, reason: str) -> float:
    """Record when the job may run again; returns the wait in seconds."""
    wait = backoff(policy, claims_made(tree, job_id))
    if wait > 0:
        delay_until(tree, job_id, time.time() + wait, after_attempt, reason)
    return wait


def delay_until(tree: Tree, job_id: str, until: float, after_attempt: int, reason: str) -> None:
    """``delay.json``: the job is not claimed before ``until`` (epoch seconds)."""
    when = datetime.fromtimestamp(until, UTC)
    rec = Delay(job_id=job_id, not_before=when, after_attempt=after_attempt, reason=reason)
    write_atomic(tree.job_attempts(job_id) / DELAY, encode(rec))


def not_before(tree: Tree, job_id: str) -> float | None:
    """The earliest time (epoch seconds) the job may be claimed, if it must wait."""
    try:
        data = (tree.job_attempts(job_id) / DELAY).read_bytes()
    except OSError:
        return None
    try:
        return decode(data, Delay).not_before.timestamp()
    except Exception:
        return None


def clear(tree: Tree, job_id: str) -> None:
    try:
        os.unlink(tree.job_attempts(job_id) / DELAY)
    except FileNotFoundError:
        pass


def mark_operator_retry(tree: Tree, job_id: str, by: str) -> None:
    """Close the latest attempt for recovery's purposes: the next claim is new."""
    nums = tree.attempt_numbers(job_id)
    n = nums[-1] if nums else 0
    path = tree.job_attempts(job_id) / f"retry-{n}.json"
    if not path.exists():
        write_atomic(path, encode(RetryMark(job_id=job_id, after_attempt=n, by=by, at=now())))
    clear(tree, job_id)
