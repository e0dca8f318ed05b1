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
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import datetime
from typing import NamedTuple

import msgspec

from spool import kinds
from spool.core.model import Record
from spool.disk import kept
from spool.disk.tree import NotRegular, Tree, is_visible, read_regular, transfer
from spool.kinds import pools
from spool.queue import blocklist, retry


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


#: Jobs read before the first claim when ``pending/`` holds more names than this:
#: the look-ahead of a first scan (see :class:`PendingIndex`).
LOOKAHEAD = 256
#: Threads reading job files of the backlog: over a network mount each read is a
#: round trip, and sshfs or NFS serve several at once (8 read ~4x faster than 1).
READERS = 8
#: Job files one reader task reads before handing its keys back.
BATCH = 32
#: A full listing of ``pending/`` is spaced so that listing costs at most this
#: share of a core (its CPU time over the interval): 100,000 names over a network
#: mount take tens of milliseconds of CPU, too much to repeat every poll interval.
#: Half a percent keeps a daemon idling over a 100,000-job NAS queue under 1 % of a
#: core in all (issue 17); small queues list every poll interval all the same.
LIST_SHARE = 0.005


class _Loaded(NamedTuple):
    """What reading one job file gave, before it joins the index (see ``_load``)."""

    key: _Key | None
    damaged: bool = False
    estimate: int = 0
    pool: str = pools.RENDER


class PendingIndex:
    """The daemon's ordered view of ``pending/``: higher priority first, then
    earlier submission.

    Each job file is parsed once, when its name first appears. The order is a
    sorted list kept up to date with ``bisect`` (a claim or a new job costs
    O(log n) comparisons, not a re-sort of 100,000 keys); entries that left
    are skipped when read and compacted away now and then. A full rescan
    costs one directory listing; between rescans the watcher's events are
    applied name by name (:meth:`note`).

    Reading never holds up claiming for long, so a big queue on a network mount
    (one round trip per job file) starts rendering at once: names a listing
    reveals go to a *backlog*, read in listing order by :data:`READERS` threads
    in the background; :meth:`refresh` adds what they have read and waits only
    until the index holds :data:`LOOKAHEAD` jobs (or the backlog is read). The
    claim-order guarantee:

    * with an empty backlog (every listed job read), :meth:`ordered` is exact:
      priority, then submission time, over all of ``pending/`` as last listed;
    * while a backlog remains (the first scan of a big queue, or a burst of
      thousands of new names), it is that order over the jobs read so far, at
      least the first :data:`LOOKAHEAD` of the listing: a job not read yet
      waits even if its priority is higher. :attr:`backlog` says how many.

    While the backlog lasts no new listing is taken; after it, listings are
    spaced to :data:`LIST_SHARE` of a core (:meth:`listing_due`).
    """

    def __init__(self, tree: Tree, worker: str | None = None) -> None:
        self.tree = tree
        #: The worker claiming: jobs whose blocklist names it are never offered to it.
        self.worker = worker
        #: job IDs in pending/ that block this worker (spool.queue.blocklist)
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
        #: job IDs whose claim tries attempt number 1 without a listing (see guess_first)
        self._guess_first: set[str] = set()
        #: names in pending/ that cannot be a job file (see take_damaged)
        self._damaged: set[str] = set()
        #: job ID -> resource pool, for jobs outside the render pool (few; saves memory)
        self._pool: dict[str, str] = {}
        #: job IDs listed but not read yet: the set, and the list in listing order
        #: (reversed: popped from the end). Only this thread touches either; a name
        #: leaves the set when its key joins the index, or when it is discarded.
        self._unread: list[str] = []
        self._unread_set: set[str] = set()
        #: reader tasks handed out, oldest first; each returns (job ID, _Loaded) pairs
        self._inflight: deque[Future[list[tuple[str, _Loaded]]]] = deque()
        self._readers: ThreadPoolExecutor | None = None
        #: when (monotonic) the next full listing is due
        self._next_listing = 0.0

    def __len__(self) -> int:
        return len(self._keys)

    @property
    def backlog(self) -> int:
        """Job files listed but not in the index yet: the order is exact only at 0."""
        return len(self._unread_set)

    def listing_due(self, now: float) -> bool:
        """Whether a full listing may be taken at ``now`` (monotonic): never while a
        backlog is read, and no more often than :data:`LIST_SHARE` of a core allows."""
        return not self._unread_set and now >= self._next_listing

    def refresh(self) -> int:
        """Re-read the names in ``pending/`` (unless a backlog is still being read),
        then add what the readers have read; returns how many jobs it holds."""
        if not self._unread_set:
            self._list()
        self._read_backlog()
        return len(self._keys)

    def _list(self) -> None:
        cpu = time.thread_time()
        # Kept while a stat shows pending/ unchanged (an idle daemon lists it every 2 s;
        # over a NAS a listing is a round trip a page of names, a stat one).
        names_now = kept.names(self.tree.pending, max_age=kept.QUEUE_RELIST)
        listed = [n[:-5] for n in names_now if n.endswith(".json") and is_visible(n)]
        names = set(listed)
        for jid in self._keys.keys() - names:
            self.discard(jid)
        new = names - self._keys.keys()
        if self._keys:
            # Later listings: the few new names, in any order (every one is read before
            # the order counts on it; listing order matters only for a first scan's
            # look-ahead), without a Python pass over 100,000 listed names.
            self._unread = list(new)
        else:
            self._unread = [j for j in reversed(listed) if j in new]
        self._unread_set = new
        self._next_listing = time.monotonic() + (time.thread_time() - cpu) / LIST_SHARE

    def _read_backlog(self) -> None:
        """Hand out reads and add what came back. Blocks only while the index holds
        fewer than LOOKAHEAD jobs and more are to come; then adds what is done,
        keeps READERS tasks busy, and returns."""
        added: list[_Key] = []

        def merge(task: Future[list[tuple[str, _Loaded]]]) -> None:
            for jid, loaded in task.result():
                key = self._merge(jid, loaded)
                if key is not None:
                    added.append(key)

        while True:
            self._hand_out()
            if not self._inflight:
                break
            if len(self._keys) >= LOOKAHEAD:
                while self._inflight and self._inflight[0].done():
                    merge(self._inflight.popleft())
                self._hand_out()
                break
            merge(self._inflight.popleft())  # waits for it
        if self._stale > len(self._sorted) // 2:
            self._sorted = sorted(self._keys.values())  # compact: drop what left
            self._stale = 0
        elif len(added) > 64:
            # Many at once: append and sort. Timsort finds the long sorted run and
            # merges the new keys into it by galloping, about k log n comparisons;
            # sorting all keys again cost a steady NAS queue of 100,000 a third of
            # its CPU each time a few dozen jobs arrived.
            self._sorted.extend(added)
            self._sorted.sort()
        else:
            for k in added:
                bisect.insort(self._sorted, k)

    def _hand_out(self) -> None:
        """Keep READERS reader tasks of BATCH names each in flight, in listing order."""
        while len(self._inflight) < READERS and self._unread:
            batch: list[str] = []
            while self._unread and len(batch) < BATCH:
                jid = self._unread.pop()
                if jid in self._unread_set:  # else: noted or discarded meanwhile
                    batch.append(jid)
            if batch:
                if self._readers is None:
                    self._readers = ThreadPoolExecutor(READERS, thread_name_prefix="pending-reader")
                self._inflight.append(self._readers.submit(self._load_all, batch))

    def _merge(self, jid: str, loaded: _Loaded) -> _Key | None:
        """Add one read job to the index, unless it left the backlog meanwhile."""
        if jid not in self._unread_set:
            return None
        self._unread_set.discard(jid)
        if loaded.damaged:
            self._damaged.add(jid)  # never claimable: the daemon quarantines it
        if loaded.key is None:
            return None
        if loaded.estimate:
            self._estimate[jid] = loaded.estimate
        if loaded.pool != pools.RENDER:
            self._pool[jid] = loaded.pool
        self._keys[jid] = loaded.key
        return loaded.key

    def note(self, jid: str, present: bool | None = None) -> bool:
        """Apply one watcher event about ``pending/<jid>.json`` without a rescan; ``True``
        if the order gained a job by it. ``present``: whether the file was there at the
        event, a hint that spares a look where the index already agrees (most events are
        the daemon's own: a job it accepted is indexed, one it claimed is gone)."""
        if present is True and jid in self._keys:
            return False
        if present is False and jid not in self._keys and jid not in self._unread_set:
            return False
        if not self.tree.job_file("pending", jid).exists():
            self.discard(jid)
            return False
        if jid in self._keys:
            return False
        self._unread_set.add(jid)
        key = self._merge(jid, self._load(jid))
        if key is None:
            return bool(self._damaged)  # a damaged name: the loop quarantines it
        bisect.insort(self._sorted, key)
        return True

    def note_accepted(self, jid: str, data: bytes) -> None:
        """A job this process has just accepted, indexed from the bytes it wrote (no
        second read of the file it just made)."""
        if jid in self._keys:
            return
        self._unread_set.add(jid)
        # Nothing to look up when it comes up: a job accepted a moment ago has had no
        # attempt, so no retry's delay.json and no worker's blocked-*.json (two lookups a
        # job fewer, a round trip each on a NAS). Should another host run it and return
        # it with a delay unseen here, the claim's attempt refuses it (attempt.NotYet).
        self._checked.add(jid)
        self._guess_first.add(jid)
        key = self._merge(jid, self._parse(data, jid))
        if key is not None:
            bisect.insort(self._sorted, key)

    def _load_all(self, jids: list[str]) -> list[tuple[str, _Loaded]]:
        out = []
        for jid in jids:
            try:
                out.append((jid, self._load(jid)))
            except Exception:  # a bug must not strand the batch: the next listing retries it
                out.append((jid, _Loaded(None)))
        return out

    def _load(self, jid: str) -> _Loaded:
        """Read one job file's order fields (runs in a reader thread: no index state)."""
        try:
            data = read_regular(self.tree.job_file("pending", jid))
        except NotRegular:
            return _Loaded(None, damaged=True)
        except OSError as exc:
            # A symbolic link (O_NOFOLLOW) is damage; otherwise gone already, or a
            # NAS hiccup: the next scan tells.
            return _Loaded(None, damaged=exc.errno == errno.ELOOP)
        return self._parse(data, jid)

    @staticmethod
    def _parse(data: bytes, jid: str) -> _Loaded:
        try:
            order = msgspec.json.decode(data, type=_Order)
        except (msgspec.DecodeError, msgspec.ValidationError):
            return _Loaded(None, damaged=True)
        ts = order.submitted_at.timestamp() if order.submitted_at else 0.0
        kind = kinds.KINDS.get(order.operation)
        pool = kind.pool(data) if kind is not None else pools.RENDER  # claiming judges the rest
        return _Loaded(_Key(-order.priority, ts, jid), estimate=order.estimate_bytes, pool=pool)

    def take_damaged(self) -> list[str]:
        """Names in ``pending/`` that can never be a job (unparseable, not a regular
        file); each is reported once, for the daemon to quarantine."""
        out, self._damaged = sorted(self._damaged), set()
        return out

    def pool(self, jid: str) -> str:
        """The resource pool the job's attempt will draw from."""
        return self._pool.get(jid, pools.RENDER)

    def pools_waiting(self) -> dict[str, int]:
        """Pending jobs per pool outside the render pool (what their gates would hold back)."""
        out: dict[str, int] = {}
        for pool in self._pool.values():
            out[pool] = out.get(pool, 0) + 1
        return out

    def estimate(self, jid: str) -> int:
        """Bytes of temporary disk the job's render may need (0 if unknown)."""
        return self._estimate.get(jid, 0)

    def ordered(self) -> Iterator[str]:
        """Job IDs that may be claimed now, in claim order (lazily: the caller
        usually stops after a few)."""
        t = time.time()
        self._trim_head()
        for k in self._sorted:
            if self._keys.get(k.job_id) is not k:
                continue  # left pending/ since it was indexed
            if k.job_id not in self._checked:
                # A retry's backoff is looked up when the job comes up, not for every
                # pending job at indexing time (one stat each: 100,000 at start-up). The
                # answer is kept while the job stays listed; one another host's retry
                # changed since is caught at the claim (attempt.NotYet), so this lookup
                # only spares claims that would be given back.
                self._checked.add(k.job_id)
                wait_until = retry.not_before(self.tree, k.job_id)
                if wait_until is not None:
                    self._delayed[k.job_id] = wait_until
                else:
                    self._guess_first.add(k.job_id)  # no listing at the claim (a round trip)
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

    def _trim_head(self) -> None:
        """Drop the claimed (stale) entries at the front of the order: each claim
        leaves one there, and skipping a growing prefix on every call made a long
        drain quadratic (100,000 pending: up to 50,000 skipped per claim)."""
        keys, order = self._keys, self._sorted
        i = 0
        while i < len(order) and keys.get(order[i].job_id) is not order[i]:
            i += 1
        if i:
            del order[:i]
            self._stale = max(0, self._stale - i)

    def claimable(self) -> int:
        """Pending jobs this worker could ever claim (not blocked for it; the
        backlog counts: a job not read yet is claimable until it says otherwise)."""
        return len(self._keys) - len(self._blocked) + len(self._unread_set)

    def oldest_submitted(self) -> float | None:
        """When the longest-waiting pending job was submitted (epoch seconds);
        ``None`` while a backlog remains (an unread job may be older)."""
        if self._unread_set:
            return None
        # The order is by priority, then submission: the oldest job is the first
        # live key of one of the priority bands. Visit each band's first live key
        # and jump over the rest (bisect): a few steps per band, not a pass over
        # 100,000 keys at every heartbeat.
        order, keys = self._sorted, self._keys
        oldest: float | None = None
        i = 0
        while i < len(order):
            k = order[i]
            if keys.get(k.job_id) is not k:
                i += 1  # left pending/ since it was indexed
                continue
            if oldest is None or k.submitted < oldest:
                oldest = k.submitted
            i = bisect.bisect_left(order, (k.neg_priority + 1,), lo=i + 1)
        return oldest

    def discard(self, jid: str) -> None:
        if self._keys.pop(jid, None) is not None:
            self._stale += 1
        self._unread_set.discard(jid)  # its entry in _unread, or its read, is ignored
        self._delayed.pop(jid, None)
        self._estimate.pop(jid, None)
        self._pool.pop(jid, None)
        self._blocked.discard(jid)
        self._checked.discard(jid)
        self._guess_first.discard(jid)

    def guess_first(self, jid: str) -> bool:
        """Whether the claim's attempt tries number 1 before any listing of the job's
        attempts (:func:`spool.queue.attempt.open_attempt`): a job this process accepted
        and that has not left the index since, or one whose lookup found no retry delay
        (a job with a delay has run before; most without one have not, and a wrong guess
        costs one refused rename before the listing, never a number used twice)."""
        return jid in self._guess_first


def claim(tree: Tree, worker: str, job_id: str) -> bool:
    """Try to take ``job_id`` for ``worker``; ``True`` only if it is now ours.

    One :func:`~spool.disk.tree.transfer` (the rename with its lost-reply check);
    durable on return.
    """
    return transfer(tree.job_file("pending", job_id), tree.job_file("running", job_id, worker))


def owns(tree: Tree, worker: str, job_id: str) -> bool:
    """The fencing check: is the job file still in this worker's running folder?"""
    return tree.job_file("running", job_id, worker).exists()
