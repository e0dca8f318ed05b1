"""Wake-ups: inotify (watchdog) as a fast path, a periodic rescan as the truth.

inotify sees only changes made through this host's kernel: on a network mount
another host's drops and claims are invisible to it (docs/research/nas.md, table row g). So
the daemon always rescans on a timer too; inotify only makes local changes
fast. Besides waking the loop, the watcher hands over the names that changed
in ``pending/``, so the claim order can be updated name by name instead of
rescanning a folder of 100,000 jobs after every claim.
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path

from watchdog.observers.inotify_c import (
    CallbackId,
    InotifyConstants,
    InotifyEvent,
    InotifyFD,
    Mask,
    WatchDescriptor,
)

from spool.queue.arrivals import Arrivals
from spoold.waker import Waker

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


class _Folder:
    """watchdog's callback for one watched folder, called on its inotify reader thread.

    Only watchdog's reader is used, not its observer: the observer's two more threads
    (an emitter pairing moves through a delayed queue, a dispatcher) cost a daemon ~15 %
    of its CPU per job and a GIL hand-off each on the drop-to-claim path; a move's two
    halves need no pairing here (the name that left, the name that arrived)."""

    def __init__(self, watcher: Watcher, folder: str) -> None:
        self.watcher = watcher
        self.folder = folder

    def on_event(self, event: InotifyEvent) -> None:
        if event.is_directory or not event.name or event.name.startswith(b"."):
            # A hidden name is never a drop or a job file: a writer's temp file (a
            # submitter's, our own job file's before its link), a drop being accepted.
            # Only its visible end matters (the rename's other half), so it wakes nothing:
            # each such wake-up cost the loop a step on the drop-to-claim path.
            return
        path = os.path.join(self.folder, os.fsdecode(event.name))
        if event.is_create:
            self.watcher.note_arrival("created", path, "")
        elif event.is_close_write:
            self.watcher.note_arrival("closed", path, "")
        elif event.is_delete or event.is_moved_from:
            self.watcher.note_arrival("deleted", path, "")
        elif event.is_moved_to:
            self.watcher.note_arrival("moved", "", path)
        self.watcher.saw([path])

    def on_watch_deleted(self, wd: WatchDescriptor) -> None:
        if not self.watcher.stopping:  # stop() removes every watch: nothing to say then
            log.warning("inotify: %s is no longer watched; relying on polling", self.folder)
        self.watcher.wake.set()

    def on_queue_overflow(self) -> None:
        # Events were lost: the loop's rescan (on every wake-up and on its timer) is the truth.
        self.watcher.wake.set()


class Watcher:
    """Sets ``wake`` whenever something changes in the watched folders, and
    collects the job IDs that changed in ``pending``."""

    def __init__(
        self, folders: list[Path], wake: Waker, pending: Path, arrivals: Arrivals | None = None
    ) -> None:
        self.folders = folders
        self.wake = wake
        self.pending = str(pending)
        #: Told when a drop in its folder is created, finished (closed after
        #: writing, or renamed in) or gone: what makes a drop safe to take.
        self.arrivals = arrivals
        self._changed: set[str] = set()
        self._lock = threading.Lock()
        self._reader: InotifyFD | None = None
        self.stopping = False

    def saw(self, paths: list[str]) -> None:
        with self._lock:
            for p in paths:
                folder, name = os.path.split(p)
                if folder == self.pending and name.endswith(".json") and not name.startswith("."):
                    self._changed.add(name[:-5])
        self.wake.set()

    def note_arrival(self, kind: str, src: str, dest: str) -> None:
        a = self.arrivals
        if a is None:
            return
        folder, name = os.path.split(src)
        if folder == a.folder:
            if kind == "created":
                a.created(name)
            elif kind == "closed":
                a.finished(name)
            elif kind in ("deleted", "moved"):
                a.gone(name)
        if kind == "moved" and dest:
            folder, name = os.path.split(dest)
            if folder == a.folder:
                a.finished(name)

    def changed(self) -> set[str]:
        """Job IDs whose ``pending/`` file appeared or went since the last call."""
        with self._lock:
            out, self._changed = self._changed, set()
        return out

    def start(self) -> bool:
        """Start inotify watches; ``False`` if they cannot be had (polling only)."""
        reader: InotifyFD | None = None
        try:
            reader = InotifyFD()
            for i, folder in enumerate(self.folders):
                reader.add_callback(os.fsencode(folder), MASK, _Folder(self, str(folder)), CallbackId(i))
            reader.start()
        except Exception as exc:  # inotify limits, unsupported filesystems
            log.warning("inotify unavailable (%s); relying on polling", exc)
            if reader is not None:
                reader.close()
            return False
        self._reader = reader
        return True

    def stop(self) -> None:
        if self._reader is not None:
            self.stopping = True
            self._reader.stop()  # closes the inotify descriptor, which ends its thread
            self._reader.join(timeout=5)
            self._reader = None
