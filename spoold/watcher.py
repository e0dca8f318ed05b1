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

from watchdog.events import (
    FileClosedEvent,
    FileCreatedEvent,
    FileDeletedEvent,
    FileMovedEvent,
    FileSystemEvent,
    FileSystemEventHandler,
)
from watchdog.observers import Observer

from spool.queue.arrivals import Arrivals
from spoold.waker import Waker

log = logging.getLogger("spoold.watcher")

#: Events that can change what the loop should do: a drop renamed (or written and
#: closed) into incoming/, a job appearing in or leaving pending/.
WANTED: list[type[FileSystemEvent]] = [FileCreatedEvent, FileMovedEvent, FileDeletedEvent, FileClosedEvent]


class _Handler(FileSystemEventHandler):
    def __init__(self, watcher: Watcher) -> None:
        self.watcher = watcher

    def on_any_event(self, event: FileSystemEvent) -> None:
        # Only changes matter. Opening and reading a folder (our own scans) also
        # raise inotify events, and waking on those would spin the loop.
        if event.event_type in ("opened", "closed_no_write"):
            return
        src = os.fsdecode(event.src_path)
        dest = os.fsdecode(getattr(event, "dest_path", "") or "")
        self.watcher.note_arrival(event.event_type, src, dest)
        self.watcher.saw([p for p in (src, dest) if p])


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
        self._observer: Observer | None = None  # type: ignore[valid-type]

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
        try:
            obs = Observer()
            for folder in self.folders:
                # Ask the kernel only for what matters: a watch without a filter also
                # reports every open and read of the folder (our own scans), which
                # cost a fifth of the daemon's CPU in the dispatch benchmark.
                obs.schedule(_Handler(self), str(folder), recursive=False, event_filter=WANTED)
            obs.daemon = True
            obs.start()
        except Exception as exc:  # inotify limits, unsupported filesystems
            log.warning("inotify unavailable (%s); relying on polling", exc)
            return False
        self._observer = obs
        return True

    def stop(self) -> None:
        if self._observer is not None:
            # watchdog logs a spurious ERROR when events arrive while its emitter
            # thread is stopping; at shutdown there is nothing left to wake.
            logging.getLogger("watchdog.observers.inotify").setLevel(logging.CRITICAL)
            self._observer.stop()
            self._observer.join(timeout=5)
            self._observer = None
