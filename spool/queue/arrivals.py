"""When is a file dropped into ``incoming/`` finished? Evidence, name by name.

A drop is taken only once its writer is done with it, never mid-write (a shell
redirection creates the file long before ``cat`` fills it; ``cp`` of a large
file grows it for seconds). The rule, in order:

1. **Renamed in, or closed after writing, on this host** (inotify
   ``IN_MOVED_TO`` / ``IN_CLOSE_WRITE``), and unchanged since: finished now.
2. **Seen created on this host and not closed yet** (and not hard-linked in,
   which delivers a file written elsewhere): still being written;
   taken only if it then stays unchanged for :data:`OPEN_WAIT` seconds (an
   inotify event can be lost when its queue overflows; a drop must never be
   stranded for good).
3. **Anything else** (no inotify, a drop made by another host over NFS, a file
   already there when the daemon started): its size, mtime and inode must stay
   unchanged for ``quiet`` seconds, as this process observes them on its own
   monotonic clock (so another host's clock does not matter). On a local
   filesystem (``local=True``: every timestamp comes from this host's clock) a
   file whose ctime is already ``quiet`` seconds old counts as quiet at once;
   ctime moves with every write and every ``touch``, so it cannot be faked old.

Objects that are not regular files (a FIFO, a symlink, a folder) are taken at
once: nothing is written into them, and acceptance rejects them unopened.

The watcher thread reports events; the daemon loop asks :meth:`Arrivals.ready`.
A drop seen whose wait is not over is not looked at again until it is
(:meth:`Arrivals.not_yet`, :meth:`Arrivals.next_look`): whatever its ``lstat`` said
then, it could not be taken, and on a NAS each look is a round trip. A burst of
drops from another host (no inotify event here) used to be ``lstat``-ed, every one,
at each loop step until quiet: several steps a job.
"""

from __future__ import annotations

import os
import stat
import threading
import time
from collections.abc import Callable

#: A file this host saw created but never closed is taken after this many seconds unchanged.
OPEN_WAIT = 60.0

Signature = tuple[int, int, int]  # (size, mtime_ns, inode)


def signature(st: os.stat_result) -> Signature:
    return (st.st_size, st.st_mtime_ns, st.st_ino)


class Arrivals:
    """What this process knows about files arriving in one ``incoming/`` folder."""

    def __init__(
        self,
        folder: os.PathLike[str] | str,
        quiet: float,
        clock: Callable[[], float] = time.monotonic,
        *,
        local: bool = False,
    ):
        self.folder = os.fspath(folder)
        self.quiet = quiet
        self.clock = clock
        #: Timestamps come from this host's clock (a local filesystem): ctime is evidence.
        self.local = local
        self._lock = threading.Lock()
        self._finished: dict[str, Signature] = {}  # closed or renamed in: the signature then
        self._open: set[str] = set()  # created here, no close seen yet
        #: polled: signature, since when unchanged (this clock), how old its ctime was then
        self._seen: dict[str, tuple[Signature, float, float]] = {}
        #: (quiet, local, the next look) while no record changed: a step asks twice, and a
        #: burst of drops from another host may be thousands (10,000: 3.6 ms to work out)
        self._look: tuple[float, bool, float | None] | None = None

    # -- evidence from inotify (the watcher thread) ---------------------------------
    def created(self, name: str) -> None:
        try:
            st = os.lstat(os.path.join(self.folder, name))
        except OSError:
            return
        if st.st_nlink > 1:  # hard-linked in (Maildir's link delivery): written elsewhere, finished
            self.finished(name)
            return
        with self._lock:
            self._open.add(name)
            self._finished.pop(name, None)
            self._look = None

    def finished(self, name: str) -> None:
        """Closed after writing, or renamed in: remember what the file looked like then."""
        try:
            st = os.lstat(os.path.join(self.folder, name))
        except OSError:
            return  # already gone (taken, withdrawn)
        with self._lock:
            self._open.discard(name)
            self._finished[name] = signature(st)
            self._look = None

    def gone(self, name: str) -> None:
        with self._lock:
            self._open.discard(name)
            self._finished.pop(name, None)
            self._seen.pop(name, None)
            self._look = None

    # -- the decision (the daemon loop) --------------------------------------------------
    def ready(self, name: str, st: os.stat_result) -> bool:
        """Whether the drop ``name``, whose ``lstat`` is ``st``, is finished."""
        if not stat.S_ISREG(st.st_mode):
            return True
        sig = signature(st)
        now = self.clock()
        with self._lock:
            done = self._finished.get(name)
            if done == sig:
                return True
            if done is not None:
                del self._finished[name]  # changed since it was closed: the quiet rule decides
            prev = self._seen.get(name)
            if prev is None or prev[0] != sig:
                prev = self._seen[name] = (sig, now, time.time() - st.st_ctime)
                self._look = None
            return now >= self._ready_at(name, prev)

    def _ready_at(self, name: str, seen: tuple[Signature, float, float]) -> float:
        """When a polled drop, unchanged since, may be taken (this clock); holds the lock."""
        _, since, ctime_age = seen
        wait = OPEN_WAIT if name in self._open else self.quiet
        if self.local:  # a ctime already old counts (local timestamps cannot be faked old)
            return since + max(0.0, wait - ctime_age)
        return since + wait

    def not_yet(self, name: str) -> bool:
        """Whether the drop ``name`` was seen and its wait is not over: a listing passes it
        without a look (whatever it shows, it could not be taken before then)."""
        with self._lock:
            seen = self._seen.get(name)
            if seen is None or name in self._finished:
                return False
            return self.clock() < self._ready_at(name, seen)

    def next_look(self) -> float | None:
        """When a listing may next find a drop seen here finished (this clock: now or
        earlier for one closed or renamed in), or ``None`` if none waits. Drops still open
        for writing wait on their close event; the timer's listings find what events miss."""
        with self._lock:
            if self._finished:
                return float("-inf")
            if self._look is None or self._look[:2] != (self.quiet, self.local):
                look = min((self._ready_at(n, seen) for n, seen in self._seen.items()), default=None)
                self._look = (self.quiet, self.local, look)
            return self._look[2]

    def why_waiting(self, name: str) -> str:
        with self._lock:
            if name in self._open:
                return "still open for writing"
        return f"changed less than {self.quiet:g} s ago"

    def taken(self, name: str) -> None:
        """The drop left ``incoming/`` under this name: forget it."""
        self.gone(name)

    def prune(self, present: set[str]) -> None:
        """Forget polling observations of names no longer in the folder (bounded memory).
        inotify's records are dropped by the events that end them (taken, deleted)."""
        with self._lock:
            for n in [n for n in self._seen if n not in present]:
                del self._seen[n]
                self._look = None
