"""The Prometheus view of a spool, as textfiles for node_exporter's textfile collector.

Each daemon writes its own file, ``<metrics_dir>/spool-<worker>.prom``, so no
two writers ever share a file (on a NAS, hosts must not). Every series in a
worker's file carries ``worker="<that worker>"``, so the files that one
collector merges never hold the same series twice. There are two kinds:

* **what this worker did** since it started: counters and histograms fed with
  the events it records in the journal (:class:`WorkerCounters`). They start
  from zero when the daemon restarts, which ``rate()`` and ``increase()``
  handle;
* **what this worker sees of the queue** when it writes the file: gauges from
  directory scans (:func:`queue_families`). Every worker sees the same queue,
  so aggregate them with ``max without (worker, instance) (spool_jobs)``.

A file is replaced atomically (temp name, rename; no fsync: metrics are
hints) every ``[observe] metrics_interval`` seconds and when the daemon stops.
Names follow Prometheus conventions: base units as suffixes (``_seconds``,
``_bytes``), counters end in ``_total``, one ``# HELP`` and ``# TYPE`` per
family, no timestamps (the textfile collector forbids them).
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from spool.core.config import Config
from spool.core.families import Family, Histogram, exposition, parse
from spool.core.model import Event, PoolUse, WorkerRecord
from spool.disk.kept import Kept
from spool.disk.tree import Tree, list_folder, visible_names, write_atomic
from spool.kinds import views
from spool.library import enrich, index
from spool.library.catalog import families as library_families
from spool.library.catalog import stats as library_stats
from spool.observe import overview
from spool.queue.status import read, running_workers

#: Upper bounds (seconds) of the render-time histogram's buckets.
RENDER_BUCKETS = (1.0, 5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0)
#: Upper bounds (seconds) of the validation-time histogram's buckets.
VALIDATE_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
#: The library's size gauges (assets, enrichment backlog) in a daemon's metrics are read
#: again at most this often (seconds): see :meth:`QueueView._library`.
LIBRARY_EVERY = 300.0
#: File names of metrics files: ``spool-<worker>.prom``.
PREFIX, SUFFIX = "spool-", ".prom"


class WorkerCounters:
    """What one worker did, fed with every event it records (safe across threads)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.transitions: Counter[tuple[str, str]] = Counter()
        self.validation_failures: Counter[str] = Counter()
        self.published_bytes = 0
        self.render = Histogram(RENDER_BUCKETS)
        self.validate = Histogram(VALIDATE_BUCKETS)

    def observe(self, ev: Event) -> None:
        with self._lock:
            self.transitions[(ev.from_ or "", ev.to)] += 1
            if ev.to == "failed" and ev.stage == "validate" and ev.property:
                self.validation_failures[ev.property] += 1
            if ev.to == "complete":
                self.published_bytes += ev.bytes or 0
                if ev.render_seconds is not None:
                    self.render.observe(ev.render_seconds)
                if ev.validate_seconds is not None:
                    self.validate.observe(ev.validate_seconds)

    def families(
        self,
        worker: str,
        stats: dict[str, int],
        slots: int,
        busy: int,
        pools: dict[str, PoolUse] | None = None,
        quarantined: bool = False,
    ) -> list[Family]:
        trans = Family(
            "spool_transitions_total",
            "counter",
            "Job transitions this worker recorded, by from and to state.",
        )
        claims = Family("spool_claims_total", "counter", "Jobs this worker claimed.")
        conflicts = Family(
            "spool_claim_conflicts_total", "counter", "Claims this worker lost to another worker."
        )
        vfail = Family(
            "spool_validation_failures_total",
            "counter",
            "Jobs this worker failed at the validation gate, by the first failed check.",
        )
        published = Family(
            "spool_published_bytes_total", "counter", "Bytes of output this worker published to the store."
        )
        render = Family(
            "spool_render_seconds", "histogram", "Wall-clock seconds of this worker's published renders."
        )
        validate = Family(
            "spool_validation_seconds", "histogram", "Seconds the validation gate took on published outputs."
        )
        slot_fam = Family("spool_worker_slots", "gauge", "Render slots of this worker (limits.max_active).")
        busy_fam = Family("spool_worker_busy_slots", "gauge", "Render slots of this worker in use.")
        with self._lock:
            for (frm, to), n in sorted(self.transitions.items()):
                trans.add(n, worker=worker, **{"from": frm, "to": to})
            for check, n in sorted(self.validation_failures.items()):
                vfail.add(n, worker=worker, check=check)
            published.add(self.published_bytes, worker=worker)
            self.render.fill(render, worker=worker)
            self.validate.fill(validate, worker=worker)
        claims.add(stats.get("claims", 0), worker=worker)
        conflicts.add(stats.get("claim_conflicts", 0), worker=worker)
        slot_fam.add(slots, worker=worker)
        busy_fam.add(busy, worker=worker)
        cap_fam = Family("spool_pool_capacity", "gauge", "Attempts each resource pool of this worker allows.")
        use_fam = Family("spool_pool_active", "gauge", "Attempts holding each resource pool of this worker.")
        for name, use in sorted((pools or {}).items()):
            cap_fam.add(use.capacity, worker=worker, pool=name)
            use_fam.add(use.active, worker=worker, pool=name)
        quar = Family(
            "spool_worker_quarantined", "gauge", "1 while this worker is in host quarantine (claims nothing)."
        )
        quar.add(1 if quarantined else 0, worker=worker)
        fams = [trans, claims, conflicts, vfail, published, render, validate, slot_fam, busy_fam, quar]
        return fams + ([cap_fam, use_fam] if pools else [])


def queue_families(
    tree: Tree, worker: str, now: float, known_pending: tuple[int, float | None] | None = None
) -> list[Family]:
    """Gauges of the whole queue as ``worker`` sees it at ``now`` (file-server time),
    from one scan of every folder; a daemon keeps a :class:`QueueView` instead,
    which lists only the folders that changed."""
    scan = overview.scan_queue(tree, now, keep=0, known_pending=known_pending)
    beats: list[tuple[str, float]] = []
    for name in sorted(visible_names(tree.workers)):
        rec = read(tree.workers / name, WorkerRecord)
        if rec is None or rec.state == "stopped":
            continue
        try:
            mtime = (tree.workers / name).stat().st_mtime
        except FileNotFoundError:
            continue
        beats.append((rec.worker, now - mtime))

    return [
        *_queue_gauges(worker, now, scan.counts, scan.oldest_age, beats),
        *views.families(worker, tree, [jid for jid, _, _ in scan.running]),
        *library_families(worker, library_stats(tree)),
    ]


def _queue_gauges(
    worker: str,
    now: float,
    counts: dict[str, int],
    oldest_age: dict[str, float | None],
    beats: list[tuple[str, float]],
) -> list[Family]:
    jobs = Family("spool_jobs", "gauge", "Jobs per state (rejected: submissions), from directory scans.")
    for state, n in counts.items():
        jobs.add(n, worker=worker, state=state)
    oldest = Family(
        "spool_oldest_job_age_seconds",
        "gauge",
        "Seconds since the oldest job entered its state (incoming, pending, running); 0 when there is none.",
    )
    for state, age in oldest_age.items():
        oldest.add(age or 0.0, worker=worker, state=state)
    fam = Family(
        "spool_worker_heartbeat_age_seconds",
        "gauge",
        "Seconds since each worker (peer) not stopped wrote its heartbeat, by the file server's clock.",
    )
    for peer, age in sorted(beats):
        fam.add(round(max(0.0, age), 3), worker=worker, peer=peer)
    written = Family(
        "spool_metrics_written_timestamp_seconds", "gauge", "When this worker last wrote its metrics file."
    )
    written.add(round(now, 3), worker=worker)
    return [jobs, oldest, fam, written]


# -- a daemon's view: list a folder only when it changed ------------------------------------

#: A worker record's identity and modification time, as last read.
RecordStamp = tuple[int, int] | None


@dataclass
class Own:
    """What a daemon knows of itself without asking the file server."""

    worker: str
    #: jobs in its claim index (with the names still to read) and the oldest submission time
    pending: tuple[int, float | None]
    #: seconds since it wrote its heartbeat; ``None`` when it is stopped
    beat_age: float | None


class QueueView:
    """The queue gauges of :func:`queue_families` for a daemon that writes them every
    ``metrics_interval``: ``pending/`` comes from its claim index, its own heartbeat
    from memory, and every other folder is listed only when its mtime changed
    (a stat each): 100,000 pending jobs on a NAS cost nothing here, and an idle
    spool costs a dozen stats a tick. The figures equal a full scan's, except that
    a change is seen one tick late when the mount's attribute cache (sshfs: 1 s at
    ``--cache low``) still shows the old mtime. Used from one thread."""

    def __init__(self, tree: Tree) -> None:
        self.tree = tree
        self.folders = Kept()
        self._records: dict[str, tuple[RecordStamp, WorkerRecord | None]] = {}
        #: the library's size figures as last read (catalog.stats), and when (``now``)
        self._library_stats: dict[str, Any] | None = None
        self._library_at = 0.0

    def families(self, own: Own, now: float) -> list[Family]:
        t, get = self.tree, self.folders.get
        incoming = get(
            "incoming", (t.incoming,), partial(list_folder, t.incoming, stat=True, taken=".accepting."), now
        )
        counts = {"incoming": incoming.count, "pending": own.pending[0]}
        for state, folder, skip in (
            ("waiting", t.waiting, ""),
            ("held", t.held, ""),
            ("complete", t.complete, ""),
            ("failed", t.failed, ""),
            ("rejected", t.rejected, ".error.json"),
            ("quarantine", t.quarantine, ""),
        ):
            counts[state] = get(state, (folder,), partial(list_folder, folder, skip=skip), now).count
        running = self._running(now)
        counts["running"] = len(running)
        order: tuple[str, ...] = ("incoming", "waiting", "pending", "held", "running")
        order += ("complete", "failed", "rejected", "quarantine")
        oldest_running = min((ct for _, ct, _ in running), default=None)

        def age(at: float | None) -> float | None:
            return None if at is None else round(max(0.0, now - at), 1)

        oldest_age = {
            "incoming": age(incoming.oldest),
            "pending": age(own.pending[1]),
            "running": age(oldest_running),
        }
        gauges = _queue_gauges(
            own.worker,
            now,
            {s: counts[s] for s in order},
            oldest_age,
            self._beats(own, now),
        )
        mine = frozenset(jid for jid, _, w in running if w == own.worker)
        kinds = views.families(own.worker, self.tree, [jid for jid, _, _ in running], mine)
        return [*gauges, *kinds, *self._library(own.worker, now)]

    def _running(self, now: float) -> list[tuple[str, float, str]]:
        """(job ID, ctime, worker) of every job in ``running/<worker>/``."""
        run = self.tree.running
        workers = self.folders.get("running", (run,), partial(running_workers, self.tree), now)
        out: list[tuple[str, float, str]] = []
        for w in workers:
            folder = run / w
            listed = self.folders.get(("running", w), (folder,), partial(list_folder, folder, stat=True), now)
            out += [(name[:-5], ct, w) for ct, name in listed.entries]
        return out

    def _beats(self, own: Own, now: float) -> list[tuple[str, float]]:
        """(worker, heartbeat age) of every worker not stopped: this one's from memory,
        a peer's record read again only when its file changed."""
        folder = self.tree.workers
        beats = [] if own.beat_age is None else [(own.worker, own.beat_age)]
        mine = f"{own.worker}.json"
        names = sorted(visible_names(folder))
        records: dict[str, tuple[RecordStamp, WorkerRecord | None]] = {}
        for name in names:
            if name == mine:
                continue
            try:
                st = (folder / name).stat()
            except FileNotFoundError:
                continue
            sig: RecordStamp = (st.st_ino, st.st_mtime_ns)
            seen = self._records.get(name)
            rec = seen[1] if seen is not None and seen[0] == sig else read(folder / name, WorkerRecord)
            records[name] = (sig, rec)
            if rec is not None and rec.state != "stopped":
                beats.append((rec.worker, now - st.st_mtime))
        self._records = records
        return beats

    def _library(self, worker: str, now: float) -> list[Family]:
        """The asset library's gauges. Its size figures are read again only when its
        folders changed, and at most every :data:`LIBRARY_EVERY` s: they read every
        unmerged index segment, and every daemon read each one a publish batch wrote
        (over a NAS five requests a segment a daemon, and at each start all of them);
        a daemon writing segments compacts them meanwhile, so most are never read here.
        The index delays are this daemon's own, from memory, at every write."""
        if self._library_stats is None or now - self._library_at >= LIBRARY_EVERY:
            self._library_stats = self.folders.get(
                "library",
                (*index.watched(self.tree), enrich.folder(self.tree)),
                partial(library_stats, self.tree),
                now,
            )
            self._library_at = now
        return library_families(worker, self._library_stats)


# -- files --------------------------------------------------------------------------------------


def folder(tree: Tree, cfg: Config) -> Path | None:
    """Where metrics files go (``[observe] metrics_dir``), or ``None`` when off."""
    d = cfg.observe.metrics_dir
    if not d:
        return None
    p = Path(d)
    return p if p.is_absolute() else tree.root / p


def file_for(folder: Path, worker: str) -> Path:
    return folder / f"{PREFIX}{worker}{SUFFIX}"


def write(path: Path, families: Iterable[Family]) -> None:
    write_atomic(path, exposition(families).encode(), durable=False)


def merged(folder: Path) -> list[Family]:
    """Every worker's file in ``folder`` as one exposition: each family once, every series once."""
    out: dict[str, Family] = {}
    seen: set[tuple[str, tuple[tuple[str, str], ...]]] = set()
    try:
        names = sorted(n for n in visible_names(folder, SUFFIX) if n.startswith(PREFIX))
    except NotADirectoryError:
        names = []
    for name in names:
        try:
            text = (folder / name).read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        for fam in parse(text):
            into = out.setdefault(fam.name, Family(fam.name, fam.type, fam.help))
            for s in fam.samples:
                key = (s.name, tuple(sorted(s.labels.items())))
                if key not in seen:
                    seen.add(key)
                    into.samples.append(s)
    return list(out.values())
