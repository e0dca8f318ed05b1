"""Per-job blocklists: a worker that failed a job for a reason of its own host
never claims that job again, and the job moves on to a healthy worker.

``attempts/J/blocked-<worker>.json`` (a :class:`BlockEntry` with the evidence)
is written by the failing worker itself, before the job leaves its running
folder, so it is durable before any other worker can claim the job; ``ls
attempts/J/`` shows who is blocked. The file is per worker, not per host name:
two daemons on one machine can run different FFmpeg builds.

The decision after a host-class failure (:func:`verdict`, pure):

* the job has now failed like this on ``[health] fail_after_workers`` different
  workers: it is failed as its own fault (a job that crashes FFmpeg everywhere),
  with every worker's evidence in its failure record;
* no other live, unquarantined, unblocked worker exists: failed now (nobody
  else could take it; an operator retries it after fixing the host);
* all ``max_attempts`` are used: failed;
* otherwise: back to ``pending/`` at once, for another worker.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from spool.core.model import BlockEntry, encode
from spool.disk.records import read
from spool.disk.tree import Tree, visible_names, write_atomic
from spool.queue import liveness

PREFIX = "blocked-"


def path(tree: Tree, job_id: str, worker: str) -> Path:
    return tree.job_attempts(job_id) / f"{PREFIX}{worker}.json"


def add(tree: Tree, entry: BlockEntry) -> None:
    """Durably block ``entry.worker`` from ``entry.job_id``."""
    write_atomic(path(tree, entry.job_id, entry.worker), encode(entry))


def entries(tree: Tree, job_id: str) -> list[BlockEntry]:
    """Every worker blocked from the job, oldest first."""
    folder = tree.job_attempts(job_id)
    found = (read(folder / n, BlockEntry) for n in visible_names(folder) if n.startswith(PREFIX))
    return sorted((e for e in found if e is not None), key=lambda e: e.at)


def blocks(tree: Tree, job_id: str, worker: str) -> bool:
    """Whether ``worker`` must not claim the job (one stat)."""
    return path(tree, job_id, worker).exists()


def clear(tree: Tree, job_id: str) -> int:
    """Lift every block on a job (an operator's ``spool retry``: the hosts were fixed)."""
    n = 0
    for name in list(visible_names(tree.job_attempts(job_id))):
        if name.startswith(PREFIX):
            try:
                (tree.job_attempts(job_id) / name).unlink()
                n += 1
            except FileNotFoundError:
                pass
    return n


@dataclass(frozen=True)
class Verdict:
    """What happens to a job after a host-class failure."""

    fail: bool
    why: str
    #: Failed because it failed like this on enough workers (the job's own fault), not
    #: because nobody else could take it or its attempts ran out.
    job_fault: bool = False


def verdict(
    blocked: list[BlockEntry], others: list[str], attempts_used: int, max_attempts: int, fail_after: int
) -> Verdict:
    """Pure: the blocklist so far (this failure included), the other live workers
    that could still take the job, and the attempt budget -> fail now, or move on."""
    workers = sorted({e.worker for e in blocked})
    if len(workers) >= fail_after:
        return Verdict(
            True,
            f"it failed with host-class errors on {len(workers)} workers ({', '.join(workers)})",
            job_fault=True,
        )
    if attempts_used >= max_attempts:
        return Verdict(True, f"all {max_attempts} attempts are used")
    if not others:
        return Verdict(True, "no other live worker can take it")
    return Verdict(False, f"another worker can take it ({', '.join(sorted(others)[:3])})")


def other_workers(tree: Tree, job_id: str, me: str, stale_after: float) -> list[str]:
    """Workers that could still take the job: alive, running, not quarantined, not blocked."""
    return [
        h.worker
        for h in liveness.assess_all(tree, stale_after)
        if h.worker != me
        and h.health == "alive"
        and h.record.state == "running"
        and h.record.quarantined is None
        and not blocks(tree, job_id, h.worker)
    ]
