"""Is it the job or the host? Classifying failures, and quarantining a broken worker.

Every render farm meets the "black hole" node: a machine that lacks a font, an
encoder or a working GPU driver claims job after job and fails each in
seconds, draining the queue into ``failed/`` while healthy nodes sit idle. So
a failure is classed (:func:`classify_exit`):

* **job**: the job's own fault, the same on any host: a validation mismatch
  against its expectations, a source that changed or cannot be read, a render
  that ran past its time limit or size cap. Failed as before.
* **host**: what this host lacks or did: FFmpeg killed by a signal it was not
  sent by spool, an encoder, filter, codec library or font missing, FFmpeg not
  runnable, a local I/O error, FFmpeg failing without writing any output. The
  worker blocks itself from the job (:mod:`spool.queue.blocklist`) and the job moves
  on to another worker.

A worker with ``[health] quarantine_after`` host-class failures in a row
quarantines itself: ``workers/<worker>.quarantined`` (a
:class:`WorkerQuarantine` with the evidence). It stops claiming, stays alive,
keeps its heartbeat (with the reason), finishes what it runs, and shows under
"Needs attention" until an operator fixes the host and runs ``spool worker
release W``. The start self-check (:mod:`spool.kinds.render.selfcheck`) quarantines the
same way, naming the step that failed. The file survives restarts.
"""

from __future__ import annotations

import os

import msgspec

from spool.core.model import WorkerQuarantine, encode, now
from spool.disk.tree import HOST, Tree, write_atomic

#: Lines of FFmpeg's log that mean "this host cannot do it", not "this job is wrong".
HOST_SIGNS = (
    "Unknown encoder",
    "Encoder not found",
    "Unknown decoder",
    "No such filter",
    "Filter not found",
    "Cannot find a valid font",
    "Fontconfig error",
    "Cannot load font",
    "Could not load font",
    "error while loading shared libraries",
    "Illegal instruction",
    "Exec format error",
    "Cannot allocate memory",
    "Input/output error",
)


def classify_exit(returncode: int | None, log_tail: list[str], wrote_output: bool) -> tuple[str, str]:
    """Pure: how FFmpeg ended -> (``"host"`` or ``"job"``, the evidence in a few words).

    Only for endings spool did not cause itself (not its own timeout, stop,
    cancel, size cap or a full disk: those are classed where they are seen).
    """
    for line in reversed(log_tail):
        for sign in HOST_SIGNS:
            if sign in line:
                return "host", f"FFmpeg said {sign!r}"
    if returncode is not None and returncode < 0:
        return "host", f"FFmpeg was killed by signal {-returncode}"
    if returncode not in (0, None) and not wrote_output:
        return "host", f"FFmpeg exited with status {returncode} without writing any output"
    return "job", f"FFmpeg exited with status {returncode}"


def quarantine(tree: Tree, worker: str, reason: str, evidence: list[str]) -> WorkerQuarantine:
    """Stop this worker claiming, durably (it survives restarts)."""
    rec = WorkerQuarantine(worker=worker, host=HOST, reason=reason, evidence=evidence, since=now())
    write_atomic(tree.workers / f"{worker}.quarantined", encode(rec))
    return rec


def quarantined(tree: Tree, worker: str) -> WorkerQuarantine | None:
    """The worker's quarantine, if it is in one (one stat when it is not)."""
    try:
        data = (tree.workers / f"{worker}.quarantined").read_bytes()
    except FileNotFoundError:
        return None
    try:
        return msgspec.json.decode(data, type=WorkerQuarantine)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return WorkerQuarantine(worker=worker, host="", reason="unreadable quarantine record", since=now())


def release(tree: Tree, worker: str) -> bool:
    """Lift a worker's quarantine (``spool worker release W``); ``False`` if it had none."""
    try:
        os.unlink(tree.workers / f"{worker}.quarantined")
    except FileNotFoundError:
        return False
    return True


class Streak:
    """Consecutive host-class failures of one worker (the daemon keeps one)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.evidence: list[str] = []

    def note(self, outcome: str, job_id: str, why: str = "") -> bool:
        """Record an attempt's outcome; ``True`` when the worker should quarantine itself."""
        if outcome == "complete":
            self.evidence = []
        elif outcome in ("blocked", "host-failed"):
            self.evidence.append(f"{job_id}: {why}" if why else job_id)
        return len(self.evidence) >= self.limit
