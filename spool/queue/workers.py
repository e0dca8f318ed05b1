"""Worker identity and heartbeats: ``workers/<worker>.json``.

A worker is one daemon process, named ``<host>-<name>``. Exactly one live
process may hold an identity: it takes an exclusive lock on
``workers/.<worker>.lock``. Locks are trustworthy between processes of one
host (docs/research/nas.md: even on sshfs and NFS mounts they block a second local process),
and the host is part of the name, so no other host ever contends for it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import IO

from spool.core import version
from spool.core.errors import SpoolError
from spool.core.model import PoolUse, WorkerRecord, encode, now
from spool.disk.tree import HOST, Tree, boot_id, write_atomic
from spool.queue import liveness
from spool.queue.status import read


def worker_id(name: str) -> str:
    """The identity of the worker ``name`` on this host."""
    return name if name.startswith(f"{HOST}-") else f"{HOST}-{name}"


class IdentityTaken(SpoolError):
    pass


@dataclass
class Identity:
    """Holds the identity lock for as long as the daemon lives."""

    tree: Tree
    worker: str
    _file: IO[bytes] | None = field(default=None, repr=False)
    #: The record the previous process of this identity left (read when acquired).
    previous: WorkerRecord | None = field(default=None, repr=False)

    def acquire(self) -> None:
        # here: readers of worker records stay off portalocker (+~97 ms)
        import portalocker  # only daemons need it; keeps the CLI's start fast

        path = self.tree.worker_lock(self.worker)
        f = open(path, "a+b")  # noqa: SIM115 - held open for the daemon's life
        try:
            portalocker.lock(f, portalocker.LOCK_EX | portalocker.LOCK_NB)
        except portalocker.LockException:
            f.close()
            raise IdentityTaken(
                f"worker {self.worker} is already running on this host (lock {path} is held)"
            ) from None
        # A lock taken through another mount of this spool on this host is invisible
        # here (FUSE keeps locks per mount); the previous holder's record and its open
        # lock file are not.
        rec = self.previous = read(self.tree.worker_file(self.worker), WorkerRecord)
        if (
            rec is not None
            and rec.host == HOST
            and rec.pid != os.getpid()
            and rec.state != "stopped"
            and liveness.pid_alive(rec.pid)
            and liveness.has_lock_open(rec.pid, self.worker)
        ):
            portalocker.unlock(f)
            f.close()
            raise IdentityTaken(
                f"worker {self.worker} is already running on this host as process {rec.pid} "
                "(through another mount of this spool)"
            )
        self._file = f

    def release(self) -> None:
        import portalocker  # here: readers of worker records stay off portalocker (+~97 ms)

        if self._file is not None:
            portalocker.unlock(self._file)
            self._file.close()
            self._file = None


def walk_owed(previous: WorkerRecord | None) -> bool:
    """Whether a starting daemon walks every job folder in ``attempts/`` for leftovers of
    interrupted writes (:func:`spool.repair.fsck.sweep_leftovers`): when the previous
    process of its worker died (its record does not say ``stopped``), stopped before a walk
    it owed had finished, or there is none (a first start: what else died on this host is
    not known). A process that stopped cleanly finished or removed its writes, and over a
    NAS the walk is a dozen requests a job ever run, at every start. What other processes
    of this host (a killed ``spool cancel``) leave meanwhile waits for an owed walk or
    ``spool fsck``: hidden names no reader takes."""
    return previous is None or previous.state != "stopped" or previous.leftovers_owed


class Heartbeat:
    """Writes ``workers/<worker>.json``; ``beat()`` refreshes it."""

    def __init__(self, tree: Tree, worker: str, max_active: int, temp_disk_limit: int) -> None:
        self.tree = tree
        self.rec = WorkerRecord(
            worker=worker,
            host=HOST,
            pid=os.getpid(),
            boot_id=boot_id(),
            started_at=now(),
            heartbeat_at=now(),
            beats=0,
            max_active=max_active,
            temp_disk_limit=temp_disk_limit,
            version=version.installed(),
            device=os.stat(tree.root).st_dev,
        )
        #: The state of the last beat written durably (``None``: none yet by this process).
        self._durable_state: str | None = None
        #: Carried by every beat (WorkerRecord.leftovers_owed): set while an owed walk runs.
        self.leftovers_owed = False

    def beat(
        self,
        *,
        active: list[str] | None = None,
        state: str | None = None,
        temp_disk_reserved: int | None = None,
        oldest_pending_submitted: float | None = None,
        pools: dict[str, PoolUse] | None = None,
        quarantined: str | None = None,
    ) -> WorkerRecord:
        r = self.rec
        r.beats += 1
        r.heartbeat_at = now()
        if active is not None:
            r.active = sorted(active)
        if state is not None:
            r.state = state  # type: ignore[assignment]
        if temp_disk_reserved is not None:
            r.temp_disk_reserved = temp_disk_reserved
        r.oldest_pending_submitted = oldest_pending_submitted
        if pools is not None:
            r.pools = pools
        r.quarantined = quarantined
        r.leftovers_owed = self.leftovers_owed
        # Only a beat that changes who or what the worker is (its first, a new state) is
        # fsynced: a lost periodic beat only makes the worker look older. Liveness never
        # trusts a beat's age alone: same host, pid and boot id decide (and a reboot, the
        # only crash that loses unsynced writes, changes the boot id); across hosts, a
        # beat that stops advancing only makes a worker suspect.
        durable = r.state != self._durable_state
        write_atomic(self.tree.worker_file(r.worker), encode(r), durable=durable)
        if durable:
            self._durable_state = r.state
        return r
