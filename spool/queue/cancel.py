"""The cancel check: whether an operator asked a running job to stop (``spool cancel``
writes ``attempts/J/cancel.json``; :mod:`spool.queue.intent`), and the failure that ends its
attempt then. Its own module because every runner asks it (a render between FFmpeg
reads, a generation between steps, the publish path) and none of them needs the
operator commands themselves.
"""

from __future__ import annotations

from spool.core.errors import Failed
from spool.core.model import CancelRequest, Failure, now
from spool.disk.records import read
from spool.disk.tree import Tree


def cancel_requested(tree: Tree, job_id: str) -> CancelRequest | None:
    """The cancel request for a job, if any (one stat when there is none)."""
    path = tree.job_attempts(job_id) / "cancel.json"
    if not path.exists():
        return None
    req: CancelRequest | None = read(path, CancelRequest)
    return req


def cancelled_failure(job_id: str, attempt: int, worker: str, why: str, state: str) -> Failure:
    return Failure(
        job_id=job_id,
        attempt=attempt,
        stage="cancel",
        property="cancelled",
        expected=f"the job to run ({state} when cancelled)",
        actual="cancelled",
        message=why,
        next_action="Nothing, if the cancellation was meant; otherwise spool retry the job.",
        worker=worker,
        failed_at=now(),
    )


def raise_if_cancelled(tree: Tree, job_id: str, attempt: int, worker: str) -> None:
    """An operator asked to cancel this job (``spool cancel``): end the attempt here,
    as a located failure of stage ``cancel``."""
    req = cancel_requested(tree, job_id)
    if req is not None:
        f = cancelled_failure(job_id, attempt, worker, req.reason, "running")
        raise Failed(
            "cancel", "cancelled", req.reason, expected=f.expected, actual=f.actual, next_action=f.next_action
        )
