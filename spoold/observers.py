"""Hooks that let people see what a daemon does: its metrics file and poster frames.

Both only observe. Neither can fail or slow a job: the metrics hook counts
events under a lock and writes its file from the loop thread between steps;
the thumbnail hook hands finished jobs to a background thread of its own.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

from spool import generation, metrics, overview, thumbs
from spool.model import Event, Manifest
from spool.status import read
from spool.tree import make_dirs

from .hooks import Hook

if TYPE_CHECKING:
    from .daemon import Daemon

log = logging.getLogger("spoold.observers")


class Metrics(Hook):
    """Keeps ``<metrics_dir>/spool-<worker>.prom`` up to date (see :mod:`spool.metrics`)."""

    def __init__(self) -> None:
        self.counters = metrics.WorkerCounters()
        self.path: Path | None = None
        self._due = 0.0
        self._unwritable = False

    def started(self, daemon: Daemon) -> None:
        folder = metrics.folder(daemon.tree, daemon.cfg)
        if folder is None:
            return
        make_dirs(folder)
        self.path = metrics.file_for(folder, daemon.worker)
        self._due = 0.0  # the first tick writes, once the index has listed pending/

    def event(self, daemon: Daemon, event: Event) -> None:
        self.counters.observe(event)

    def tick(self, daemon: Daemon) -> None:
        if self.path is not None and time.monotonic() >= self._due:
            self.write(daemon)

    def stopped(self, daemon: Daemon) -> None:
        if self.path is not None:
            self.write(daemon)

    def write(self, daemon: Daemon) -> None:
        assert self.path is not None
        self._due = time.monotonic() + daemon.cfg.observe.metrics_interval
        fams = self.counters.families(
            daemon.worker,
            daemon.stats,
            daemon.cfg.limits.max_active,
            len(daemon.slots),
            daemon.pools.usage(),
            daemon.quarantined is not None,
        )
        # pending/ as the daemon's index knows it: listing a big queue on a NAS every
        # metrics_interval cost a core's percent (issue 17); while the index is still
        # reading a backlog, its count is the listed names.
        index = daemon.index
        known = (len(index) + index.backlog, index.oldest_submitted())
        fams += metrics.queue_families(daemon.tree, daemon.worker, overview.clock(daemon.tree), known)
        fams += metrics.generation_families(
            daemon.worker, daemon.generations.counters(), generation.conflicts()
        )
        try:
            metrics.write(self.path, fams)
        except OSError as exc:
            # A full or read-only disk: say so once, not a traceback every interval
            # (the daemon's own full-disk handling says the rest).
            if not self._unwritable:
                log.warning(
                    "metrics file %s not written (%s); trying again every interval", self.path, exc.strerror
                )
            self._unwritable = True
            return
        if self._unwritable:
            log.info("metrics file %s written again", self.path)
        self._unwritable = False


#: Outputs that have a picture to make a poster frame of.
VIDEO_CONTAINERS = frozenset({"mp4", "mov", "webm"})


class Thumbnails(Hook):
    """Makes the poster frame of every job this daemon completes, off the job's thread."""

    #: Seconds the daemon waits at stop for thumbnails already queued.
    STOP_WAIT = 20.0

    def __init__(self) -> None:
        self.jobs: queue.Queue[str | None] = queue.Queue()
        self.thread: threading.Thread | None = None

    def started(self, daemon: Daemon) -> None:
        if daemon.cfg.observe.thumbnail_width == 0:
            return
        self.thread = threading.Thread(target=self._run, args=(daemon,), name="thumbnails", daemon=True)
        self.thread.start()

    def event(self, daemon: Daemon, event: Event) -> None:
        if self.thread is not None and event.to == "complete":
            self.jobs.put(event.job)

    def stopped(self, daemon: Daemon) -> None:
        if self.thread is not None:
            self.jobs.put(None)
            self.thread.join(timeout=self.STOP_WAIT)

    def _run(self, daemon: Daemon) -> None:
        while (job_id := self.jobs.get()) is not None:
            try:
                m = read(daemon.tree.manifest_file(job_id), Manifest)
                if m is not None and m.output.container in VIDEO_CONTAINERS:  # not noop outputs
                    made = thumbs.make(daemon.tree, daemon.cfg, m)
                    if made is not None:
                        log.debug("%s: poster frame %s", job_id, daemon.tree.relative(made))
            except thumbs.ThumbnailError as exc:
                log.warning("%s: no poster frame: %s", job_id, exc)
            except Exception:  # a courtesy must never take the daemon down
                log.exception("%s: making the poster frame failed", job_id)
