"""Hooks that let people see what a daemon does: its metrics file and poster frames.

Both only observe. Neither can fail or slow a job: the metrics hook counts
events under a lock and writes its file from a thread of its own; the
thumbnail hook hands finished jobs to a background thread of its own.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from spool import kinds
from spool.core.families import Family
from spool.core.model import Event, Manifest
from spool.disk.tree import make_dirs
from spool.media import thumbs
from spool.observe import metrics, overview
from spool.queue.status import read
from spoold.hooks import Hook

if TYPE_CHECKING:
    from spoold.daemon import Daemon

log = logging.getLogger("spoold.observers")


class Metrics(Hook):
    """Keeps ``<metrics_dir>/spool-<worker>.prom`` up to date (see :mod:`spool.observe.metrics`).

    The loop thread only takes a snapshot of what the daemon knows (its counters,
    its claim index's count, its heartbeat); a thread of the hook's own asks the
    file server the rest (a stat per folder, listings of the folders that changed)
    and writes the file, so a slow NAS never holds up a claim. The last write, at
    stop, runs on the loop thread once that thread has finished."""

    #: Seconds between two probes of the file server's clock (a file written and
    #: stat'ed in ``workers/``); between them its offset from ours is trusted.
    CLOCK_EVERY = 300.0
    #: Seconds the daemon waits at stop for a write under way.
    STOP_WAIT = 30.0

    def __init__(self) -> None:
        self.counters = metrics.WorkerCounters()
        self.path: Path | None = None
        self.view: metrics.QueueView | None = None
        self._due = 0.0
        self._unwritable = False
        self._offset = 0.0
        self._clock_due = 0.0
        self._todo: queue.Queue[_Snapshot | None] = queue.Queue(maxsize=1)
        self._thread: threading.Thread | None = None

    def started(self, daemon: Daemon) -> None:
        folder = metrics.folder(daemon.tree, daemon.cfg)
        if folder is None:
            return
        make_dirs(folder)
        self.path = metrics.file_for(folder, daemon.worker)
        self.view = metrics.QueueView(daemon.tree)
        self._due = 0.0  # the first tick writes, once the index has listed pending/
        self._thread = threading.Thread(target=self._run, args=(daemon,), name="metrics", daemon=True)
        self._thread.start()

    def event(self, daemon: Daemon, event: Event) -> None:
        self.counters.observe(event)

    def tick(self, daemon: Daemon) -> None:
        if self.path is None or time.monotonic() < self._due:
            return
        self._due = time.monotonic() + daemon.cfg.observe.metrics_interval
        try:
            self._todo.put_nowait(self._snapshot(daemon))
        except queue.Full:  # the last write is still under way: this one comes next interval
            pass

    def stopped(self, daemon: Daemon) -> None:
        if self.path is None:
            return
        if self._thread is not None:
            self._todo.put(None)
            self._thread.join(timeout=self.STOP_WAIT)
            if self._thread.is_alive():  # a hung mount: the view is the thread's, leave it be
                log.warning("metrics file %s: last write skipped (no answer from the file server)", self.path)
                return
            self._thread = None
        self.write(daemon, self._snapshot(daemon))

    def flush(self, timeout: float = 30.0) -> bool:
        """Wait until the snapshots handed to the thread are written (tests)."""
        end = time.monotonic() + timeout
        while self._todo.unfinished_tasks and time.monotonic() < end:
            time.sleep(0.01)
        return not self._todo.unfinished_tasks

    def _snapshot(self, daemon: Daemon) -> _Snapshot:
        """What the daemon knows, taken on the loop thread (its index is not shared)."""
        fams = self.counters.families(
            daemon.worker,
            daemon.stats,
            daemon.cfg.limits.max_active,
            len(daemon.slots),
            daemon.pools.usage(),
            daemon.quarantined is not None,
        )
        for kind in kinds.KINDS.values():
            fams += kind.metric_families(daemon.worker)
        # pending/ as the daemon's index knows it: listing a big queue on a NAS every
        # metrics_interval cost a core's percent (issue 17); while the index is still
        # reading a backlog, its count is the listed names. The oldest submission is
        # the one the last heartbeat carried (heartbeat_interval old at most): asking
        # the index again is a pass over every pending job, 100,000 on a big queue.
        index, beat = daemon.index, daemon.heartbeat.rec
        own = metrics.Own(
            daemon.worker,
            (len(index) + index.backlog, beat.oldest_pending_submitted),
            None if beat.state == "stopped" else max(0.0, time.time() - beat.heartbeat_at.timestamp()),
        )
        return _Snapshot(fams, own)

    def _run(self, daemon: Daemon) -> None:
        while (snap := self._todo.get()) is not None:
            try:
                self.write(daemon, snap)
            except Exception:  # a NAS hiccup: the next interval tries again
                log.exception("metrics file %s not written", self.path)
            finally:
                self._todo.task_done()
        self._todo.task_done()

    def _now(self, daemon: Daemon) -> float:
        """The file server's clock, probed every CLOCK_EVERY seconds (three round trips)."""
        if time.monotonic() >= self._clock_due:
            self._offset = overview.clock(daemon.tree) - time.time()
            self._clock_due = time.monotonic() + self.CLOCK_EVERY
        return time.time() + self._offset

    def write(self, daemon: Daemon, snap: _Snapshot) -> None:
        assert self.path is not None and self.view is not None
        fams = snap.families + self.view.families(snap.own, self._now(daemon))
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


@dataclass
class _Snapshot:
    families: list[Family]
    own: metrics.Own


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
                job = read(daemon.tree.job_file("complete", job_id), kinds.Job)
                if m is not None and job is not None and kinds.of(job).poster_frames:  # its kind says
                    made = thumbs.make(daemon.tree, daemon.cfg, m)
                    if made is not None:
                        log.debug("%s: poster frame %s", job_id, daemon.tree.relative(made))
            except thumbs.ThumbnailError as exc:
                log.warning("%s: no poster frame: %s", job_id, exc)
            except Exception:  # a courtesy must never take the daemon down
                log.exception("%s: making the poster frame failed", job_id)
