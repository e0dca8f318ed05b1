"""Readings of folders kept while a stat shows each folder unchanged.

A daemon looks at some folders every few seconds (the sweep of dependencies, the metrics'
gauges), and most looks find them as they were. Over a NAS a listing is a round trip
per page of names (``complete/`` with 20,000 jobs was ~200 over sshfs) where a stat is
one. A folder's mtime moves when a name is added, removed or renamed in it, so a reading
is kept while each folder's stat (inode, mtime, ctime, link count) is unchanged.

Two holes, closed by rule:

- **The same tick** (git's "racy" index): a change within the timestamp's granularity
  of the reading leaves the mtime where it was (SFTP carries whole seconds). A reading
  whose newest folder mtime is within :data:`Kept.RACY` s of when it was read is not
  trusted; the next call reads again.
- **A NAS client's attribute cache** (sshfs ``--cache low``: ~1 s; NFS ``acdirmax``: up to
  60 s) may show an old stat after another host's change, and a file server whose clock
  runs behind this host's makes the racy rule trust a reading too soon. ``max_age`` bounds
  how long a reading is kept at all.

So a kept reading can be stale for up to ``max_age`` s: a caller acts on one only where
staleness costs time (a gauge a tick late, a dependent that waits a sweep longer), never
where it would make a wrong move.
"""

from __future__ import annotations

import os
import threading
import time
from collections import Counter
from collections.abc import Callable, Hashable
from pathlib import Path
from typing import TypeVar, cast

T = TypeVar("T")

#: A folder's inode, mtime and ctime (ns) and link count; ``None``: it does not exist.
Signature = tuple[int, int, int, int] | None


def signature(folder: os.PathLike[str] | str) -> Signature:
    """One stat of ``folder``: one round trip on a network mount."""
    try:
        st = os.stat(folder)
    except (FileNotFoundError, NotADirectoryError):
        return None
    return (st.st_ino, st.st_mtime_ns, st.st_ctime_ns, st.st_nlink)


class Kept:
    """What ``read()`` returned for a key, returned again while its folders are as they
    were then (and the reading was not racy, and is younger than ``max_age`` s)."""

    RACY = 2.0

    def __init__(self, max_age: float = float("inf"), limit: int = 256) -> None:
        self.max_age = max_age
        self.limit = limit
        #: key -> (signatures, value, trusted, extra, monotonic time read)
        self._seen: dict[Hashable, tuple[tuple[Signature, ...], object, bool, object, float]] = {}
        self._lock = threading.Lock()
        #: readings that ran, per key (the other calls were answered from what was kept)
        self.reads: Counter[Hashable] = Counter()

    def get(
        self,
        key: Hashable,
        folders: tuple[os.PathLike[str] | str, ...],
        read: Callable[[], T],
        now: float | None = None,
        extra: object = None,
        max_age: float | None = None,
    ) -> T:
        """``read()``, or what it returned last time for ``key`` if every folder (and
        ``extra``, an in-memory part of the answer) is as it was then. ``now``: the wall
        clock the racy rule compares folder mtimes with (default: ``time.time()``);
        ``max_age``: this call's bound (default: the instance's)."""
        sigs = tuple(signature(f) for f in folders)  # before the read: a change in between is seen next time
        mono = time.monotonic()
        age = self.max_age if max_age is None else max_age
        seen = self._seen.get(key)
        if seen is not None and seen[0] == sigs and seen[2] and seen[3] == extra and mono - seen[4] < age:
            return cast(T, seen[1])
        value = read()
        wall = time.time() if now is None else now
        newest = max((s[1] / 1e9 for s in sigs if s is not None), default=0.0)
        with self._lock:
            if len(self._seen) >= self.limit and key not in self._seen:
                self._seen.clear()  # bounded: a reading forgotten is only read again
            self._seen[key] = (sigs, value, newest < wall - self.RACY, extra, mono)
            self.reads[key] += 1
        return value

    def forget(self, key: Hashable) -> None:
        """Read ``key`` afresh next time (this process changed what it reads)."""
        with self._lock:
            self._seen.pop(key, None)


#: Listings kept by :func:`names` (for at most 30 s unless a caller asks for less).
LISTINGS = Kept(max_age=30.0)
#: How long the queue's own folders' listings (``incoming/``, ``pending/``) are kept at
#: most: what a stale folder stat hides from the daemon's poll (another host's drop behind
#: an NFS client's attribute cache) is seen this late at worst, where the poll lists them
#: every ``poll_interval`` (2 s). A drop from another host waits ``incoming_quiet`` anyway.
QUEUE_RELIST = 10.0


def listdir(folder: Path) -> list[str]:
    """A folder's names now (none if it does not exist): what :func:`names` keeps."""
    try:
        return os.listdir(folder)
    except (FileNotFoundError, NotADirectoryError):
        return []


def names(folder: Path, max_age: float | None = None) -> list[str]:
    """A folder's names (none if it does not exist), the listing kept while unchanged
    (and for at most ``max_age`` s; default 30). The list is shared: do not change it."""
    return LISTINGS.get(os.fspath(folder), (folder,), lambda: listdir(folder), max_age=max_age)


def forget(folder: Path) -> None:
    """List ``folder`` afresh at the next :func:`names` (this process changed it)."""
    LISTINGS.forget(os.fspath(folder))
