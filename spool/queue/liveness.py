"""Is a worker alive? Evidence from its record, its host, and the server's clock.

* **Same host** (the record's ``host`` is ours): the worker is *dead* when its
  boot id differs from ours (the machine rebooted since) or its pid is gone
  (or now belongs to a process that neither holds the worker's identity lock
  nor keeps that lock file open: a lock taken through another mount of the
  same export is invisible here).
  This is certain, so recovery may act on it at once. A live pid whose
  heartbeat has not advanced for ``stale_after`` is *stalled*: the process
  exists but its loop does not run (stopped with SIGSTOP or ^Z, or wedged).
  That needs a human, not an automatic takeover: recovering it stays
  deliberate (``spool recover --worker W --force``).
* **Another host**: we cannot see its processes. A heartbeat that stopped
  advancing only makes the worker *suspect*. Cross-host takeover follows
  policy (``[recovery] auto_recover`` with ``stale_after``) or an operator's
  ``spool recover --worker W``.

Seen late: a worker that wrote through another client of a shared spool (another
host, or another mount of it on this host: another FUSE or NFS client) may have
writes this mount does not show yet. Its death is certain at once, but what it
left is certain only ``[recovery] mount_lag`` later: :func:`settles_in` says how
long a recoverer still waits.

Clock skew: hosts disagree about the time, so a heartbeat is never compared
with the observer's wall clock alone. A long-lived observer (a daemon)
remembers when *it* first saw each heartbeat value and measures staleness on
its own monotonic clock. A one-shot observer (the CLI) compares the record
file's mtime, which the file server assigns, with the mtime the same server
gives a file it touches now (docs/research/nas.md, section 4.8).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Literal

from spool.core.model import WorkerRecord
from spool.disk.tree import HOST, Tree, boot_id, server_now, visible_names
from spool.queue.status import read

Health = Literal["alive", "stalled", "suspect", "dead", "stopped"]


@dataclass(frozen=True)
class WorkerHealth:
    worker: str
    host: str
    health: Health
    reason: str
    age: float | None  # seconds since the heartbeat last advanced, as observed
    record: WorkerRecord


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def holds_identity(tree: Tree, worker: str) -> bool:
    """Whether some process on this host holds the worker's identity lock."""
    import portalocker  # here: readers of worker records stay off portalocker (+~97 ms)

    try:
        # Read-only is enough for flock, so a viewer without write access can ask too.
        with open(tree.worker_lock(worker), "rb") as f:
            try:
                portalocker.lock(f, portalocker.LOCK_EX | portalocker.LOCK_NB)
            except portalocker.LockException:
                return True
            portalocker.unlock(f)
            return False
    except OSError:
        return False


def has_lock_open(pid: int, worker: str) -> bool:
    """Whether process ``pid`` keeps a worker identity lock file named for ``worker`` open.

    The identity lock is only visible through the mount it was taken on (FUSE
    clients such as sshfs keep locks per mount, docs/research/nas.md table row e), so a host
    that mounts the spool twice cannot see a live worker's lock through the
    other mount. A daemon holds its lock file open for its whole life, so an
    open file descriptor is evidence of the same fact. Linux ``/proc`` only;
    ``False`` where it cannot be read.
    """
    suffix = f"/workers/.{worker}.lock"
    fds = f"/proc/{pid}/fd"
    try:
        names = os.listdir(fds)
    except OSError:
        return False
    for fd in names:
        try:
            if os.readlink(f"{fds}/{fd}").endswith(suffix):
                return True
        except OSError:
            continue
    return False


class Observer:
    """Remembers, on this process's monotonic clock, when each worker's beat
    counter last changed. Skew-proof staleness for long-lived observers."""

    def __init__(self) -> None:
        self._seen: dict[str, tuple[int, float]] = {}

    def age(self, rec: WorkerRecord) -> float:
        now = time.monotonic()
        prev = self._seen.get(rec.worker)
        if prev is None or prev[0] != rec.beats:
            self._seen[rec.worker] = (rec.beats, now)
            return 0.0
        return now - prev[1]


class Gone:
    """Remembers, on this process's monotonic clock, when each worker process was first
    seen gone (dead or stopped). A gone process beats no more, so its last beat and pid
    name it; the same worker started again is a new process."""

    def __init__(self) -> None:
        self._since: dict[tuple[str, int, int], float] = {}

    def seen_for(self, rec: WorkerRecord) -> float:
        """Seconds since ``rec``'s process was first seen gone (0 now, the first time)."""
        now = time.monotonic()
        return now - self._since.setdefault((rec.worker, rec.pid, rec.beats), now)


def same_client(tree: Tree, rec: WorkerRecord) -> bool:
    """Whether ``rec``'s worker wrote through the client cache we read through: this host
    and the same device, so every write it made shows here at once."""
    try:
        return rec.host == HOST and rec.device != 0 and rec.device == os.stat(tree.root).st_dev
    except OSError:
        return False


def settles_in(tree: Tree, gone_rec: WorkerRecord, mount_lag: float, gone: Gone | None = None) -> float:
    """Seconds before everything the gone (dead or stopped) process ``gone_rec`` wrote
    shows here: 0 when it wrote through our client; else ``mount_lag`` after ``gone``
    first saw it gone (without ``gone``: seen just now)."""
    if same_client(tree, gone_rec):
        return 0.0
    if gone_rec.host == HOST and gone_rec.boot_id != boot_id():
        return 0.0  # every client cache here was filled after the reboot, after its last write
    seen = gone.seen_for(gone_rec) if gone is not None else 0.0
    return max(0.0, mount_lag - seen)


def assess(
    tree: Tree,
    rec: WorkerRecord,
    stale_after: float,
    *,
    observer: Observer | None = None,
    server_time: float | None = None,
) -> WorkerHealth:
    """The health of one worker, with the evidence in ``reason``."""
    if rec.state == "stopped":
        return WorkerHealth(rec.worker, rec.host, "stopped", "stopped cleanly", None, rec)
    if rec.host == HOST:
        if rec.boot_id != boot_id():
            return WorkerHealth(
                rec.worker, rec.host, "dead", "this host rebooted since its last heartbeat", None, rec
            )
        if not pid_alive(rec.pid) or not (
            holds_identity(tree, rec.worker) or has_lock_open(rec.pid, rec.worker)
        ):
            return WorkerHealth(
                rec.worker, rec.host, "dead", f"process {rec.pid} is gone (same host)", None, rec
            )
        return same_host_running(tree, rec, stale_after, observer=observer, server_time=server_time)
    age, how = heartbeat_age(tree, rec, observer=observer, server_time=server_time)
    if age > stale_after:
        return WorkerHealth(
            rec.worker,
            rec.host,
            "suspect",
            f"{how} {age:.0f} s (stale_after {stale_after:g} s); another host, so not certain",
            age,
            rec,
        )
    return WorkerHealth(rec.worker, rec.host, "alive", f"{how} {age:.0f} s", age, rec)


def heartbeat_age(
    tree: Tree, rec: WorkerRecord, *, observer: Observer | None = None, server_time: float | None = None
) -> tuple[float, str]:
    """Seconds since ``rec``'s heartbeat last advanced, and how that was measured."""
    if observer is not None:
        return observer.age(rec), "no new heartbeat seen for"
    try:
        mtime = tree.worker_file(rec.worker).stat().st_mtime
    except FileNotFoundError:
        mtime = rec.heartbeat_at.timestamp()
    if server_time is None:
        try:
            server_time = server_now(tree)
        except OSError:  # a viewer that may not write: this host's clock
            server_time = time.time()
    return max(0.0, server_time - mtime), "heartbeat file last written"


def same_host_running(
    tree: Tree,
    rec: WorkerRecord,
    stale_after: float,
    *,
    observer: Observer | None = None,
    server_time: float | None = None,
) -> WorkerHealth:
    """A worker of this host whose process is running: alive, or stalled when its
    heartbeat stopped advancing (SIGSTOP, a wedged loop)."""
    age, how = heartbeat_age(tree, rec, observer=observer, server_time=server_time)
    if age > stale_after:
        return WorkerHealth(
            rec.worker,
            rec.host,
            "stalled",
            f"process {rec.pid} exists but its {how} {age:.0f} s (stale_after {stale_after:g} s): "
            "stopped or hung",
            age,
            rec,
        )
    return WorkerHealth(rec.worker, rec.host, "alive", f"process {rec.pid} is running", age, rec)


def assess_all(tree: Tree, stale_after: float, observer: Observer | None = None) -> list[WorkerHealth]:
    """Every worker that has a record, healthiest last (attention first)."""
    now = None if observer is not None else server_now(tree)
    out = []
    for name in visible_names(tree.workers):
        rec = read(tree.workers / name, WorkerRecord, replaced=True)
        if rec is not None:
            out.append(assess(tree, rec, stale_after, observer=observer, server_time=now))
    order = {"dead": 0, "stalled": 1, "suspect": 2, "alive": 3, "stopped": 4}
    return sorted(out, key=lambda h: (order[h.health], h.worker))
