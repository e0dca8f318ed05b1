"""Wake-ups: inotify (watchdog) as a fast path, a periodic rescan as the truth.

inotify sees only changes made through this host's kernel: on a network mount
another host's drops and claims are invisible to it (nas.md, table row g). So
the daemon always rescans on a timer too; inotify only makes local drops fast.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

from watchdog.events import FileSystemEvent, FileSystemEventHandler
from watchdog.observers import Observer

log = logging.getLogger("spoold.watcher")


class _Wake(FileSystemEventHandler):
    def __init__(self, wake: threading.Event) -> None:
        self.wake = wake

    def on_any_event(self, event: FileSystemEvent) -> None:
        # Only changes matter. Opening and reading a folder (our own scans) also
        # raise inotify events, and waking on those would spin the loop.
        if event.event_type in ("opened", "closed_no_write"):
            return
        self.wake.set()


class Watcher:
    """Sets ``wake`` whenever something changes in the watched folders."""

    def __init__(self, folders: list[Path], wake: threading.Event) -> None:
        self.folders = folders
        self.wake = wake
        self._observer: Observer | None = None  # type: ignore[valid-type]

    def start(self) -> bool:
        """Start inotify watches; ``False`` if they cannot be had (polling only)."""
        try:
            obs = Observer()
            for folder in self.folders:
                obs.schedule(_Wake(self.wake), str(folder), recursive=False)
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
