"""Picking and claiming pending jobs, and checking ownership (fencing).

A claim is ``os.rename(pending/J.json, running/W/J.json)``: on every
filesystem we trust, exactly one of several racing renames wins and the others
get an error. On a network filesystem the *reply* to a successful rename can
be lost and the retransmitted request then fails with ENOENT, so any error is
followed by a look at ``running/W/J.json``: if it is there, the claim is ours.

Ownership afterwards is simply "the job file is in my running folder". A
worker checks it before every commit point (store link, manifest, final
move); the final move itself is a rename out of ``running/W/`` and so fails
for a worker whose job was taken away.
"""

from __future__ import annotations

import bisect
import errno
import time
from collections.abc import Iterator
from datetime import datetime
from typing import NamedTuple

import msgspec

from . import blocklist, kinds, pools, retry
from .model import Record
from .tree import NotRegular, Tree, read_regular, transfer, visible_names


class _Order(Record, kw_only=True):
    """The only fields of a job file that ordering needs (decoding skips the rest)."""

    priority: int = 0
    submitted_at: datetime | None = None
    estimate_bytes: int = 0
    operation: str = "render"


class _Key(NamedTuple):
    """Claim order: a tuple, so sorting compares in C and each key stays small
    (the index holds one per pending job: 100,000 of them on a busy spool)."""

    neg_priority: int
    submitted: float
    job_id: str


class PendingIndex:
    """The daemon's ordered view of ``pending/``: higher priority first, then
    earlier submission.

    Each job file is parsed once, when its name first appears. The order is a
    sorted list kept up to date with ``bisect`` (a claim or a new job costs
    O(log n) comparisons, not a re-sort of 100,000 keys); entries that left
    are skipped when read and compacted away now and then. A full rescan
    costs one directory listing; between rescans the watcher's events are
    applied name by name (:meth:`note`).
    """

    def __init__(self, tree: Tree, worker: str | None = None) -> None:
        self.tree = tree
        #: The worker claiming: jobs whose blocklist names it are never offered to it.
        self.worker = worker
        #: job IDs in pending/ that block this worker (spool.blocklist)
        self._blocked: set[str] = set()
        self._keys: dict[str, _Key] = {}
        self._sorted: list[_Key] = []
        self._stale = 0
        #: job ID -> epoch seconds before which it must not be claimed (retry backoff)
        self._delayed: dict[str, float] = {}
        #: job ID -> temporary disk its render may need (reserved while it runs)
        self._estimate: dict[str, int] = {}
        #: job IDs whose retry delay has been looked up since they entered pending/
        self._checked: set[str] = set()
        #: names in pending/ that cannot be a job file (see take_damaged)
        self._damaged: set[str] = set()
        #: job ID -> resource pool, for jobs outside the render pool (few; saves memory)
        self._pool: dict[str, str] = {}

    def __len__(self) -> int:
        return len(self._keys)

    def refresh(self) -> int:
        """Re-read the names in ``pending/``; returns how many jobs it holds."""
        names = {n[:-5] for n in visible_names(self.tree.pending)}
        for jid in self._keys.keys() - names:
            self.discard(jid)
        new = names - self._keys.keys()
        keys = [k for k in (self._read_key(jid) for jid in new) if k is not None]
        for k in keys:
            self._keys[k.job_id] = k
        if len(keys) > 64 or self._stale > len(self._sorted) // 2:
            self._sorted = sorted(self._keys.values())  # one sort beats many inserts
            self._stale = 0
        else:
            for k in keys:
                bisect.insort(self._sorted, k)
        return len(self._keys)

    def note(self, jid: str) -> None:
        """Apply one watcher event about ``pending/<jid>.json`` without a rescan."""
        present = self.tree.job_file("pending", jid).exists()
        if not present:
            self.discard(jid)
        elif jid not in self._keys:
            key = self._read_key(jid)
            if key is not None:
                self._keys[jid] = key
                bisect.insort(self._sorted, key)

    def _read_key(self, jid: str) -> _Key | None:
        try:
            data = read_regular(self.tree.job_file("pending", jid))
            order = msgspec.json.decode(data, type=_Order)
        except (NotRegular, msgspec.DecodeError, msgspec.ValidationError):
            self._damaged.add(jid)  # never claimable: the daemon quarantines it
            return None
        except OSError as exc:
            if exc.errno == errno.ELOOP:  # a symbolic link (O_NOFOLLOW)
                self._damaged.add(jid)
            return None  # gone already, or a NAS hiccup: the next scan tells
        ts = order.submitted_at.timestamp() if order.submitted_at else 0.0
        if order.estimate_bytes:
            self._estimate[jid] = order.estimate_bytes
        kind = kinds.KINDS.get(order.operation)
        pool = kind.pool(data) if kind is not None else pools.RENDER  # claiming judges the rest
        if pool != pools.RENDER:
            self._pool[jid] = pool
        return _Key(-order.priority, ts, jid)

    def take_damaged(self) -> list[str]:
        """Names in ``pending/`` that can never be a job (unparseable, not a regular
        file); each is reported once, for the daemon to quarantine."""
        out, self._damaged = sorted(self._damaged), set()
        return out

    def pool(self, jid: str) -> str:
        """The resource pool the job's attempt will draw from."""
        return self._pool.get(jid, pools.RENDER)

    def estimate(self, jid: str) -> int:
        """Bytes of temporary disk the job's render may need (0 if unknown)."""
        return self._estimate.get(jid, 0)

    def ordered(self) -> Iterator[str]:
        """Job IDs that may be claimed now, in claim order (lazily: the caller
        usually stops after a few)."""
        t = time.time()
        for k in self._sorted:
            if self._keys.get(k.job_id) is not k:
                continue  # left pending/ since it was indexed
            if k.job_id not in self._checked:
                # A retry's backoff is looked up when the job comes up, not for every
                # pending job at indexing time (one stat each: 100,000 at start-up).
                self._checked.add(k.job_id)
                wait_until = retry.not_before(self.tree, k.job_id)
                if wait_until is not None:
                    self._delayed[k.job_id] = wait_until
                if self.worker is not None and blocklist.blocks(self.tree, k.job_id, self.worker):
                    self._blocked.add(k.job_id)
            if k.job_id in self._blocked:
                continue
            until = self._delayed.get(k.job_id)
            if until is not None:
                if until > t:
                    continue
                del self._delayed[k.job_id]
            yield k.job_id

    def claimable(self) -> int:
        """Pending jobs this worker could ever claim (not blocked for it)."""
        return len(self._keys) - len(self._blocked)

    def oldest_submitted(self) -> float | None:
        """When the longest-waiting pending job was submitted (epoch seconds)."""
        return min((k.submitted for k in self._keys.values()), default=None)

    def discard(self, jid: str) -> None:
        if self._keys.pop(jid, None) is not None:
            self._stale += 1
        self._delayed.pop(jid, None)
        self._estimate.pop(jid, None)
        self._pool.pop(jid, None)
        self._blocked.discard(jid)
        self._checked.discard(jid)


def claim(tree: Tree, worker: str, job_id: str) -> bool:
    """Try to take ``job_id`` for ``worker``; ``True`` only if it is now ours.

    One :func:`~spool.tree.transfer` (the rename with its lost-reply check);
    durable on return.
    """
    return transfer(tree.job_file("pending", job_id), tree.job_file("running", job_id, worker))


def owns(tree: Tree, worker: str, job_id: str) -> bool:
    """The fencing check: is the job file still in this worker's running folder?"""
    return tree.job_file("running", job_id, worker).exists()
