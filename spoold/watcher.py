"""Wake-ups: inotify as a fast path, a periodic rescan as the truth.

inotify sees only changes made through this host's kernel: on a network mount
another host's drops and claims are invisible to it (docs/research/nas.md, table row g). So
the daemon always rescans on a timer too; inotify only makes local changes
fast. Besides waking the loop, the watcher hands over the names that changed
in ``pending/``, so the claim order can be updated name by name instead of
rescanning a folder of 100,000 jobs after every claim.

The loop reads the events itself, on its own thread: it sleeps on the inotify
descriptor beside its waker (:meth:`Watcher.fileno`) and takes what is there
(:meth:`Watcher.poll`) at each step and before it sleeps. Most events are the
daemon's own moves (the drop it took, the job file it wrote, the claim), which
bring it no work; read on a reader thread, each of them took the GIL from the
loop and rang it awake for a step that found nothing to do. Read here, they are
data: the loop sleeps again unless an event brought work (:meth:`poll`'s answer,
and the claim order's, :meth:`spool.queue.claim.PendingIndex.note`).
"""

from __future__ import annotations

import ctypes
import fcntl
import logging
import os
import struct
from pathlib import Path

# watchdog's bindings of the three inotify calls (the library we use for watching); the
# events are read and parsed here, on the loop's thread (see the module docstring).
from watchdog.observers.inotify_c import (
    InotifyConstants,
    Mask,
    WatchDescriptor,
    inotify_add_watch,
    inotify_init,
    inotify_rm_watch,
)

from spool.queue.arrivals import Arrivals

log = logging.getLogger("spoold.watcher")

#: Events that can change what the loop should do: a drop renamed (or written and
#: closed) into incoming/, a job appearing in or leaving pending/. Opening and reading a
#: folder (our own scans) raise no event under this mask.
MASK = Mask(
    InotifyConstants.IN_CREATE
    | InotifyConstants.IN_CLOSE_WRITE
    | InotifyConstants.IN_DELETE
    | InotifyConstants.IN_MOVED_FROM
    | InotifyConstants.IN_MOVED_TO
)

_EVENT = struct.Struct("iIII")  # struct inotify_event: wd, mask, cookie, len (then the name)
#: Bytes read at a time: room for ~2,000 events of job-file names.
_BUFFER = 65536
_APPEARED = InotifyConstants.IN_CREATE | InotifyConstants.IN_CLOSE_WRITE | InotifyConstants.IN_MOVED_TO
_LEFT = InotifyConstants.IN_DELETE | InotifyConstants.IN_MOVED_FROM


class Watcher:
    """inotify watches on the loop's folders, read without blocking by the loop itself:
    drops arriving in ``incoming/`` are told to :class:`Arrivals`, names changing in
    ``pending/`` are collected for :meth:`changed`."""

    def __init__(self, folders: list[Path], pending: Path, arrivals: Arrivals | None = None) -> None:
        self.folders = folders
        self.pending = str(pending)
        #: Told when a drop in its folder is created, finished (closed after
        #: writing, or renamed in) or gone: what makes a drop safe to take.
        self.arrivals = arrivals
        #: job ID -> whether its pending/ file was there at its last event
        self._changed: dict[str, bool] = {}
        self._fd: int | None = None
        self._folder_of: dict[WatchDescriptor, str] = {}

    def start(self) -> bool:
        """Start inotify watches; ``False`` if they cannot be had (polling only)."""
        fd = inotify_init()
        if fd < 0:
            log.warning("inotify unavailable (%s); relying on polling", os.strerror(ctypes.get_errno()))
            return False
        # Never block the loop (it reads only what is there), never leak into children.
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_NONBLOCK)
        os.set_inheritable(fd, False)
        for folder in self.folders:
            wd = inotify_add_watch(fd, os.fsencode(folder), MASK)
            if wd < 0:  # the watch limit, an unsupported filesystem
                why = os.strerror(ctypes.get_errno())
                log.warning("inotify unavailable for %s (%s); relying on polling", folder, why)
                os.close(fd)
                self._folder_of = {}
                return False
            self._folder_of[wd] = str(folder)
        self._fd = fd
        return True

    def fileno(self) -> int | None:
        """The descriptor the loop sleeps on beside its waker (readable: events wait)."""
        return self._fd

    def poll(self) -> bool:
        """Read and apply every event waiting, without blocking. ``True`` when one brought
        the loop work by itself: a drop created, finished or renamed into ``incoming/``, a
        lost watch, or lost events (the queue overflowed: the rescan is the truth). Changes
        in ``pending/`` are for :meth:`changed`; the claim order tells which matter."""
        if self._fd is None:
            return False
        work = False
        while True:
            try:
                buf = os.read(self._fd, _BUFFER)
            except BlockingIOError:
                return work
            except OSError as exc:
                log.warning("inotify read failed (%s); relying on polling", exc)
                self.stop()
                return True
            if not buf:
                return work
            i = 0
            while i + _EVENT.size <= len(buf):
                wd, mask, _cookie, length = _EVENT.unpack_from(buf, i)
                name = buf[i + _EVENT.size : i + _EVENT.size + length].rstrip(b"\0")
                i += _EVENT.size + length
                work |= self._event(wd, mask, name)

    def _event(self, wd: WatchDescriptor, mask: int, raw: bytes) -> bool:
        if mask & InotifyConstants.IN_Q_OVERFLOW:
            return True  # events were lost: the loop's rescan is the truth
        if mask & InotifyConstants.IN_IGNORED:
            folder = self._folder_of.pop(wd, None)
            if folder is not None:
                log.warning("inotify: %s is no longer watched; relying on polling", folder)
            return True
        folder = self._folder_of.get(wd)
        if folder is None or mask & InotifyConstants.IN_ISDIR or not raw or raw.startswith(b"."):
            # A hidden name is never a drop or a job file: a writer's temp file (a
            # submitter's, our own job file's before its link), a drop being accepted.
            # Only its visible end matters (the rename's other half).
            return False
        name = os.fsdecode(raw)
        if folder == self.pending:
            if name.endswith(".json"):
                self._changed[name[:-5]] = bool(mask & _APPEARED)
            return False
        a = self.arrivals
        if a is None or folder != a.folder:
            return False
        if mask & InotifyConstants.IN_CREATE:
            a.created(name)
        elif mask & (InotifyConstants.IN_CLOSE_WRITE | InotifyConstants.IN_MOVED_TO):
            a.finished(name)
        elif mask & _LEFT:
            a.gone(name)  # taken (by us or another acceptor) or withdrawn: no work
            return False
        return True

    def changed(self) -> dict[str, bool]:
        """Job IDs whose ``pending/`` file appeared or went since the last call, each with
        whether it was there at its last event (a hint: the claim order checks)."""
        out, self._changed = self._changed, {}
        return out

    def stop(self) -> None:
        fd, self._fd = self._fd, None
        if fd is None:
            return
        for wd in list(self._folder_of):
            inotify_rm_watch(fd, wd)
        self._folder_of = {}
        os.close(fd)
