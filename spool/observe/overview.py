"""The queue at a glance: the facts ``spool status``, ``spool watch`` and the
status page show, so all three tell the same story.

Cost on a spool of 100,000 jobs (the rule of :mod:`spool.queue.status`: count with
directory scans, parse only what is shown):

* counts are directory listings, as in :func:`spool.queue.status.counts`;
* ages need one ``stat`` per file of ``incoming/`` and ``running/``. The
  oldest pending age costs no stat per pending job (on a NAS each is a network
  round trip: 20,000 of them took seconds): up to LARGE_QUEUE jobs it is exact;
  beyond, it is what live daemons' heartbeats report (their claim index knows
  it), else the oldest of a sample of SAMPLE files (a lower bound), and the
  report says which (``oldest_pending_age_source``). ``exact=True`` (``spool
  status --exact``) stats every pending file;
* "newest first" needs one ``stat`` per file of ``failed/``, of the
  ``.error.json`` files in ``rejected/`` and, for recent outputs only, of
  ``manifests/``. Nothing else is stat'ed;
* parsed are only the records shown: the running jobs' attempt and progress,
  the newest failures and rejections, the newest manifests, worker records.

Ages come from a file's ctime, not its mtime: a rename updates the ctime
(ext4, xfs, btrfs, tmpfs, and NFS servers on those), so the ctime of
``pending/J.json`` is when the job *entered* pending (for a retried job, the
retry), while its mtime is when it was accepted. Ages are taken against the
file server's clock when the spool is writable (:func:`spool.disk.tree.server_now`),
so a workstation whose clock is off still shows true ages.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from spool.disk import diskfull
from spool.disk.tree import HOST, Tree, boot_id, is_visible, list_folder, server_now, visible_names
from spool.kinds import views
from spool.queue.status import (
    attempt_numbers,
    last_failure,
    library_counts,
    locate,
    read,
    running_workers,
    show,
)

if TYPE_CHECKING:
    from spool.core.config import Config
    from spool.core.model import Manifest, Progress
    from spool.queue import liveness

# What is imported at the top is what `spool status --json` on a queue of counts
# needs: no msgspec (its import alone costs about as much as starting Python), no
# dataclasses (inspect), no config. Records, worker health, the journal and the
# library are imported where they are read.


class _Scan:
    """One pass over a folder: how many files, the oldest, the newest few."""

    __slots__ = ("count", "newest", "oldest")

    def __init__(self) -> None:
        self.count = 0
        self.oldest: float | None = None
        self.newest: list[tuple[float, str]] = []  # (ctime, name), newest first


def _scan(
    folder: Path,
    *,
    suffix: str = ".json",
    skip: str = "",
    stat: bool,
    keep: int = 0,
    first: list[str] | None = None,
    taken: str = "",
) -> _Scan:
    """Count the files of ``folder`` (:func:`spool.disk.tree.list_folder`); with ``stat``, also
    the oldest ctime and the newest ``keep``. ``first`` (without ``stat``) receives the
    first names listed, up to its capacity SAMPLE."""
    listed = list_folder(folder, suffix=suffix, skip=skip, stat=stat, taken=taken)
    out = _Scan()
    out.count, out.oldest = listed.count, listed.oldest
    if first is not None:
        first += listed.names[: SAMPLE - len(first)]
    if keep:
        out.newest = [(ct, name[: -len(suffix)]) for ct, name in sorted(listed.entries, reverse=True)[:keep]]
    return out


def _oldest_ctime(folder: Path, names: list[str]) -> tuple[float | None, int]:
    """The oldest ctime of the named files of ``folder``, and how many were stat'ed."""
    oldest: float | None = None
    n = 0
    for name in names:
        try:
            ct = os.stat(folder / name).st_ctime
        except FileNotFoundError:
            continue
        n += 1
        oldest = ct if oldest is None else min(oldest, ct)
    return oldest, n


def _oldest_pending_from_daemons(tree: Tree, now: float) -> float | None:
    """The earliest submission time the live daemons' claim indexes report."""
    names = list(visible_names(tree.workers))
    if not names:
        return None
    from spool.core.model import WorkerRecord  # here: status --json counts without msgspec (+~28 ms)

    times = []
    for name in names:
        path = tree.workers / name
        rec = read(path, WorkerRecord)
        if rec is None or rec.state != "running" or rec.oldest_pending_submitted is None:
            continue
        try:
            if now - path.stat().st_mtime > FRESH_HEARTBEAT:
                continue
        except FileNotFoundError:
            continue
        times.append(rec.oldest_pending_submitted)
    return min(times, default=None)


def clock(tree: Tree) -> float:
    """Now, by the file server's clock if we may write a probe file, else ours."""
    try:
        return server_now(tree)
    except OSError:
        return time.time()


class QueueScan:
    """Counts per state and the age of the oldest job of each aged state.

    ``quarantined``: newest files in quarantine/ (ctime, job file name without
    .json); ``running``: (job ID, worker, seconds in running/);
    ``pending_age_source``: where the oldest pending age came from: "exact" (a
    stat of every pending file), "workers" (live daemons' heartbeats), "sample"
    (the oldest of the first SAMPLE files listed: a lower bound) or "unknown";
    ``pending_stated``: pending files stat'ed for that age. (A plain class, not a
    dataclass: importing dataclasses imports inspect, a tenth of ``spool status``.)
    """

    __slots__ = (
        "counts",
        "failed",
        "oldest_age",
        "pending_age_source",
        "pending_stated",
        "quarantined",
        "rejected",
        "running",
    )

    def __init__(
        self,
        counts: dict[str, int],
        oldest_age: dict[str, float | None],
        failed: list[tuple[float, str]],
        rejected: list[tuple[float, str]],
        quarantined: list[tuple[float, str]],
        running: list[tuple[str, str, float]],
        pending_age_source: str = "exact",
        pending_stated: int = 0,
    ) -> None:
        self.counts = counts
        self.oldest_age = oldest_age
        self.failed = failed
        self.rejected = rejected
        self.quarantined = quarantined
        self.running = running
        self.pending_age_source = pending_age_source
        self.pending_stated = pending_stated


#: Up to this many pending jobs, their age is exact (one stat each: cheap even over
#: a network mount); above it, it comes from the live daemons' heartbeats (their
#: claim index knows it), else from a stat of the first SAMPLE files listed.
LARGE_QUEUE = 256
#: Pending files stat'ed for a sampled age when no live daemon reports it (at
#: least LARGE_QUEUE: up to that many, the sample is the whole folder).
SAMPLE = LARGE_QUEUE
#: A heartbeat older than this (file-server seconds) is not trusted for that age.
FRESH_HEARTBEAT = 60.0


def scan_queue(
    tree: Tree,
    now: float,
    keep: int = 10,
    *,
    exact: bool = False,
    known_pending: tuple[int, float | None] | None = None,
) -> QueueScan:
    """Counts (names only) and ages of the whole queue.

    The cost never grows with ``pending/`` beyond its listing (on a NAS, one
    round trip per stat): the oldest pending age is exact up to LARGE_QUEUE jobs,
    then taken from live daemons' heartbeats, else from a sample of SAMPLE stats
    (a lower bound). ``exact`` stats every pending file instead. A daemon that
    already knows ``pending/`` from its index passes ``known_pending`` (count,
    oldest submission time): then the folder is not listed at all.
    """
    # Drops a worker has taken (renamed to .accepting.<worker>.<name>) but not yet
    # accepted or rejected are still incoming: a full disk can hold them there.
    incoming = _scan(tree.incoming, stat=True, taken=".accepting.")
    source = "exact"
    if known_pending is not None:
        pending = _Scan()
        pending.count, pending.oldest = known_pending
        stated, source = 0, "workers"
    elif exact:
        pending = _scan(tree.pending, stat=True)
        stated = pending.count
    else:
        first: list[str] = []
        pending = _scan(tree.pending, stat=False, first=first)
        daemons = _oldest_pending_from_daemons(tree, now) if pending.count > LARGE_QUEUE else None
        if daemons is not None:
            pending.oldest, stated, source = daemons, 0, "workers"
        else:
            pending.oldest, stated = _oldest_ctime(tree.pending, first)
            if pending.count > len(first):
                source = "sample" if stated else "unknown"
    held = _scan(tree.held, stat=False)
    waiting = _scan(tree.waiting, stat=False)
    complete = _scan(tree.complete, stat=False)
    failed = _scan(tree.failed, stat=True, keep=keep)
    rejected = _scan(tree.rejected, stat=False, skip=".error.json")
    errors = _scan(tree.rejected, suffix=".error.json", stat=True, keep=keep)
    quarantined = _scan(tree.quarantine, stat=True, keep=keep)
    running: list[tuple[str, str, float]] = []
    oldest_running: float | None = None
    for w in running_workers(tree):
        try:
            with os.scandir(tree.running_dir(w)) as it:
                for e in it:
                    if e.name.endswith(".json") and is_visible(e.name):
                        try:
                            ct = e.stat().st_ctime
                        except FileNotFoundError:
                            continue
                        running.append((e.name[:-5], w, max(0.0, now - ct)))
                        oldest_running = ct if oldest_running is None else min(oldest_running, ct)
        except FileNotFoundError:
            continue
    counts = {
        "incoming": incoming.count,
        "waiting": waiting.count,
        "pending": pending.count,
        "held": held.count,
        "running": len(running),
        "complete": complete.count,
        "failed": failed.count,
        "rejected": rejected.count,
        "quarantine": quarantined.count,
    }

    def age(t: float | None) -> float | None:
        return None if t is None else round(max(0.0, now - t), 1)

    return QueueScan(
        counts=counts,
        oldest_age={
            "incoming": age(incoming.oldest),
            "pending": age(pending.oldest),
            "running": age(oldest_running),
        },
        failed=failed.newest,
        rejected=errors.newest,
        quarantined=quarantined.newest,
        running=sorted(running, key=lambda r: -r[2]),
        pending_age_source=source,
        pending_stated=stated,
    )


# -- what each section shows ------------------------------------------------------------


def latest_attempt(tree: Tree, job_id: str) -> int | None:
    nums = attempt_numbers(tree, job_id)
    return nums[-1] if nums else None


def disk_used(folder: Path) -> int:
    """Bytes of the files under ``folder`` (an attempt's ``work/``: a few files)."""
    total = 0
    for dirpath, _dirs, files in os.walk(folder):
        for name in files:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_blocks * 512
            except OSError:
                continue
    return total


def running_rows(tree: Tree, scan: QueueScan) -> list[dict[str, Any]]:
    if not scan.running:
        return []
    # here: status --json counts without msgspec (+~28 ms)
    from spool.core.model import AttemptRecord, Progress

    rows = []
    for jid, worker, in_state in scan.running:
        n = latest_attempt(tree, jid)
        progress: Progress | None = None
        rec: AttemptRecord | None = None
        used = 0
        if n is not None:
            d = tree.attempt_dir(jid, n)
            progress = read(d / "progress.json", Progress)
            rec = read(d / "attempt.json", AttemptRecord)
            used = disk_used(d / "work")
        rows.append(
            {
                "job_id": jid,
                "worker": worker,
                "attempt": n,
                "claimed_at": rec.claimed_at if rec else None,
                "seconds": round(in_state, 1),
                "progress": progress,
                "disk_used": used,
            }
        )
    return rows


def failed_rows(tree: Tree, scan: QueueScan) -> list[dict[str, Any]]:
    if not scan.failed:
        return []

    rows = []
    for ct, jid in scan.failed:
        f = last_failure(tree, jid)
        rows.append(
            {
                "job_id": jid,
                "attempt": f.attempt if f else None,
                "stage": f.stage if f else "unknown",
                "property": f.property if f else "unknown",
                "expected": f.expected if f else None,
                "actual": f.actual if f else None,
                "message": f.message if f else "no failure record found",
                "next_action": f.next_action if f else "Run spool fsck: a failed job should have a record.",
                "failed_at": f.failed_at if f else datetime.fromtimestamp(ct, UTC),
            }
        )
    return rows


def rejected_rows(tree: Tree, scan: QueueScan) -> list[dict[str, Any]]:
    if not scan.rejected:
        return []
    from spool.core.model import Rejection  # here: status --json counts without msgspec (+~28 ms)

    rows = []
    for _ct, name in scan.rejected:
        rec = read(tree.rejected / f"{name}.error.json", Rejection)
        if rec is not None:
            rows.append(
                {
                    "name": name,
                    "file": rec.file,
                    "field": rec.field,
                    "reason": rec.reason,
                    "at": rec.rejected_at,
                }
            )
    return rows


def _has_workers(tree: Tree) -> bool:
    """Whether ``workers/`` holds anything to read (a record, a quarantine)."""
    try:
        return any(n[0] != "." for n in os.listdir(tree.workers))
    except FileNotFoundError:
        return False


def worker_rows(
    tree: Tree, cfg: Config | Callable[[], Config], now: float, running: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """Every worker with a record, attention first: health, slots, disk, heartbeat."""
    if not _has_workers(tree):
        return []
    if callable(cfg):
        cfg = cfg()
    from spool.core.model import WorkerRecord  # here: status --json counts without msgspec (+~28 ms)
    from spool.queue import liveness

    try:
        healths = liveness.assess_all(tree, cfg.recovery.stale_after)
    except OSError:  # a read-only viewer cannot ask the file server for the time
        recs = [r for r in (read(tree.workers / n, WorkerRecord) for n in visible_names(tree.workers)) if r]
        healths = [liveness.assess(tree, r, cfg.recovery.stale_after, server_time=now) for r in recs]
    if not os.access(tree.workers, os.W_OK):
        healths = [_readonly_view(h, tree, cfg.recovery.stale_after) for h in healths]
    disk: dict[str, int] = {}
    jobs: dict[str, int] = {}
    for r in running:
        disk[r["worker"]] = disk.get(r["worker"], 0) + r["disk_used"]
        jobs[r["worker"]] = jobs.get(r["worker"], 0) + 1
    rows = []
    for h in healths:
        rec = h.record
        try:
            beat_age = max(0.0, now - tree.worker_file(rec.worker).stat().st_mtime)
        except FileNotFoundError:
            beat_age = None
        rows.append(
            {
                "worker": rec.worker,
                "host": rec.host,
                "state": rec.state,
                "health": h.health,
                "reason": h.reason,
                "pid": rec.pid,
                "active": len(rec.active),
                "max_active": rec.max_active,
                "pools": {
                    p: {"active": u.active, "capacity": u.capacity}
                    | (
                        {"waiting_until": u.waiting_until, "waiting_reason": u.waiting_reason}
                        if u.waiting_reason
                        else {}
                    )
                    for p, u in rec.pools.items()
                },
                "quarantined": rec.quarantined,
                "jobs": jobs.get(rec.worker, 0),
                "disk_used": disk.get(rec.worker, 0),
                "disk_limit": rec.temp_disk_limit,
                "heartbeat_age": None if beat_age is None else round(beat_age, 1),
                "version": rec.version,
            }
        )
    return rows


def _readonly_view(
    h: liveness.WorkerHealth, tree: Tree | None = None, stale_after: float = 120.0
) -> liveness.WorkerHealth:
    """A viewer that may not write to the spool cannot open a worker's lock file,
    so liveness takes a live same-host worker for dead. Correct that from the
    evidence we can see: same boot, and the process exists."""
    from spool.queue import liveness  # here: a spool with no worker stays off liveness (+~21 ms)

    rec = h.record
    if h.health == "dead" and rec.host == HOST and rec.boot_id == boot_id() and liveness.pid_alive(rec.pid):
        if tree is not None:
            seen = liveness.same_host_running(tree, rec, stale_after)
            if seen.health == "stalled":
                return seen
        reason = f"process {rec.pid} is running (its lock is not readable here)"
        return liveness.WorkerHealth(h.worker, h.host, "alive", reason, 0.0, rec)
    return h


def _instance(worker: str, host: str) -> str:
    return worker[len(host) + 1 :] if worker.startswith(f"{host}-") else worker


def _utc(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def disk_state(tree: Tree) -> dict[str, Any] | None:
    """Free and total bytes of the spool's filesystem, and whether it counts as full."""
    got = diskfull.free_bytes(tree.root)
    if got is None:
        return None
    free, total = got
    return {"free": free, "total": total, "full": free < diskfull.LOW_SPACE}


def attention(
    counts: dict[str, int],
    workers: list[dict[str, Any]],
    failed: list[dict[str, Any]],
    rejected: list[dict[str, Any]],
    disk: dict[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """What a human should act on, most urgent first, each with its next action."""
    items: list[dict[str, Any]] = []
    full_by = [w["worker"] for w in workers if w["state"] == "disk_full"]
    disk_full = (disk is not None and disk["full"]) or bool(full_by)
    if disk_full:
        free = f"{disk['free']:,} bytes free of {disk['total']:,}" if disk is not None else "no space"
        who = f"; waiting for space: {', '.join(full_by)}" if full_by else ""
        items.append(
            {
                "kind": "disk",
                "subject": "spool",
                "problem": f"disk full: the spool's filesystem has {free}{who}",
                "next_action": "Free space on the spool's filesystem (spool gc removes old work/ folders); "
                "the workers retry on their own and go on when there is room.",
            }
        )
    for w in workers:
        jobs = f"; {w['jobs']} job(s) in running/{w['worker']}/" if w["jobs"] else ""
        if w["health"] == "dead":
            unit = f"spoold@{_instance(w['worker'], w['host'])}"
            items.append(
                {
                    "kind": "worker",
                    "subject": w["worker"],
                    "problem": f"dead: {w['reason']}{jobs}",
                    "next_action": f"Start it again (systemctl restart {unit}): at start it recovers "
                    f"its own jobs. Or run: spool recover --worker {w['worker']}",
                }
            )
        elif w["health"] == "stalled":
            unit = f"spoold@{_instance(w['worker'], w['host'])}"
            items.append(
                {
                    "kind": "worker",
                    "subject": w["worker"],
                    "problem": f"stalled: {w['reason']}{jobs}"
                    + ("; the spool's disk is full, so it cannot write its heartbeat" if disk_full else ""),
                    "next_action": f"On {w['host']}: if it was stopped, kill -CONT {w['pid']}; "
                    f"kill -USR1 {w['pid']} logs where it hangs. If it is hung, restart it "
                    f"(systemctl restart {unit}) or run: spool recover --worker {w['worker']} --force",
                }
            )
        elif w["health"] == "suspect":
            items.append(
                {
                    "kind": "worker",
                    "subject": w["worker"],
                    "problem": f"suspect: {w['reason']}{jobs}",
                    "next_action": f"Check host {w['host']}. If the worker is gone for good, run: "
                    f"spool recover --worker {w['worker']}",
                }
            )
    waits: dict[str, dict[str, Any]] = {}
    for w in workers:
        if w["health"] != "alive":
            continue
        for pool, use in w["pools"].items():
            if use.get("waiting_reason"):
                waits.setdefault(pool, use)
    for pool, use in sorted(waits.items()):
        until = use.get("waiting_until")
        when = f" until {_utc(until)}" if until else ""
        items.append(
            {
                "kind": "waiting",
                "subject": pool,
                "problem": f"its jobs wait in pending/{when}: {use['waiting_reason']}",
                "next_action": "Nothing: they are claimed by themselves when it frees up (oldest first); "
                "raise the limit in spool.toml if the volume is intended.",
            }
        )
    if counts["pending"] + counts["incoming"] and not any(w["health"] == "alive" for w in workers):
        waiting = counts["pending"] + counts["incoming"]
        items.append(
            {
                "kind": "queue",
                "subject": "workers",
                "problem": f"{waiting} job(s) waiting and no worker is alive",
                "next_action": "Start a worker: systemctl start spoold@NAME, or spoold run --spool DIR.",
            }
        )
    for f in failed:
        what = f"{f['stage']}: {f['property']}: {f['message']}"
        if f["expected"] is not None or f["actual"] is not None:
            what += f" (expected {f['expected']}, got {f['actual']})"
        items.append(
            {"kind": "failed", "subject": f["job_id"], "problem": what, "next_action": f["next_action"]}
        )
    for r in rejected:
        items.append(
            {
                "kind": "rejected",
                "subject": r["file"],
                "problem": r["reason"],
                "next_action": f"Fix the submission and submit it again (copy: rejected/{r['name']}.json).",
            }
        )
    return items


def quarantine_attention(tree: Tree, scan: QueueScan) -> list[dict[str, Any]]:
    """Workers in host quarantine, and job files taken out of the queue because they can never run."""
    if not scan.quarantined and not _has_workers(tree):
        return []
    from spool.queue import health  # here: status reads host health only for a quarantine (+~11 ms)
    from spool.queue.quarantine import reason_of

    items = []
    for name in sorted(visible_names(tree.workers, suffix=".quarantined")):
        worker = name[: -len(".quarantined")]
        q = health.quarantined(tree, worker)
        if q is not None:
            seen = "; ".join(q.evidence[-3:]) or "none"
            items.append(
                {
                    "kind": "worker",
                    "subject": worker,
                    "problem": f"quarantined (claims nothing): {q.reason}",
                    "next_action": f"Fix host {q.host or '?'} (evidence: {seen}), "
                    f"then run: spool worker release {worker}",
                }
            )
    for _ct, name in scan.quarantined:
        rec = reason_of(tree, f"{name}.json")
        problem = f"{rec.field}: {rec.reason} (found in {rec.found_in}/)" if rec else "no reason recorded"
        items.append(
            {
                "kind": "quarantine",
                "subject": f"{name}.json",
                "problem": problem,
                "next_action": f"Read quarantine/{name}.json and its .reason; submit the job again "
                "(a new revision) if it is still wanted, then remove both files.",
            }
        )
    return items


def recent_outputs(tree: Tree, limit: int) -> list[dict[str, Any]]:
    """The newest published outputs (by manifest time), with hash and thumbnail."""
    if limit <= 0:
        return []
    from spool.core.model import Manifest  # here: status --json counts without msgspec (+~28 ms)
    from spool.media import thumbs

    rows = []
    for _ct, jid in _scan(tree.manifests, stat=True, keep=limit).newest:
        m = read(tree.manifest_file(jid), Manifest)
        if m is None:
            continue
        rows.append(
            {
                "job_id": jid,
                "file": m.output.file,
                "sha256": m.output.sha256,
                "size": m.output.size,
                "store_path": m.output.store_path,
                "published_at": m.published_at,
                "worker": m.worker,
                "tags": m.tags,
                "thumbnail": thumbs.url(tree, m.output.sha256),
            }
        )
    return rows


def overview(
    tree: Tree,
    cfg: Config | Callable[[], Config],
    *,
    limit: int = 10,
    recent: int = 0,
    exact: bool = False,
) -> dict[str, Any]:
    """Everything the status views show. Keeps the keys of :func:`spool.queue.status.report`
    (``spool``, ``counts``, ``oldest_pending_age``, ``running``, ``failed``,
    ``rejected``, ``workers``) and adds ``oldest_age``, ``attention``, ``recent``,
    and how the pending age was had (``oldest_pending_age_source``, see
    :class:`QueueScan`; ``oldest_pending_stated``: pending files stat'ed).

    ``cfg`` may be a function that loads the config: it is called before the first
    record is read (a running, failed, rejected or quarantined job, a worker, a
    recent output), so that the config's secrets are masked in all of them; a
    queue of counts alone never needs it (``spool status`` on a backlog)."""
    now = clock(tree)
    scan = scan_queue(tree, now, keep=limit, exact=exact)
    if callable(cfg) and (
        scan.running or scan.failed or scan.rejected or scan.quarantined or recent > 0 or _has_workers(tree)
    ):
        cfg = cfg()
    running = running_rows(tree, scan)
    failed = failed_rows(tree, scan)
    rejected = rejected_rows(tree, scan)
    workers = worker_rows(tree, cfg, now, running)
    disk = disk_state(tree)
    kinds = views.status(tree, running, None if callable(cfg) else cfg)
    for row in running:  # what a job with no render progress is doing (a generation's state)
        for k in kinds:
            if row["job_id"] in k.steps:
                row["step"] = k.steps[row["job_id"]]
    return {
        "spool": str(tree.root),
        "generated_at": now,
        "counts": scan.counts,
        "oldest_pending_age": scan.oldest_age["pending"],
        "oldest_pending_age_source": scan.pending_age_source,
        "oldest_pending_stated": scan.pending_stated,
        "oldest_age": scan.oldest_age,
        "running": running,
        "attention": attention(scan.counts, workers, failed, rejected, disk)
        + quarantine_attention(tree, scan)
        + [item for k in kinds for item in k.attention],
        "disk": disk,
        "failed": failed,
        "rejected": rejected,
        "workers": workers,
        "recent": recent_outputs(tree, recent),
        "library": _library_stats(tree),
        **{
            name: value for k in kinds for name, value in k.fields.items()
        },  # only while a kind says something
    }


def _library_stats(tree: Tree) -> dict[str, Any]:
    return library_counts(tree)


def approvals(tree: Tree, job_id: str, current_sha256: str | None = None) -> list[dict[str, Any]]:
    """Approval records of a job (``approvals/<job>/``), each marked ``current``
    when it approves the output the manifest names now."""
    import msgspec  # here: status --json counts without msgspec (+~15 ms)

    from spool.queue import intent  # here: status --json stays off operator intent (+~29 ms)

    out = []
    for a in intent.approvals(tree, job_id):
        row = msgspec.to_builtins(a)
        row["current"] = a.sha256 == current_sha256
        out.append(row)
    return out


def job_detail(tree: Tree, job_id: str) -> dict[str, Any] | None:
    """One job as ``spool show`` and the job page present it: the keys of
    :func:`spool.queue.status.show` plus its ``timeline`` from the journal, ``approvals``
    and the output's ``thumbnail``."""
    from spool.media import thumbs  # here: status --json of a queue stays off thumbnails (+~20 ms)
    from spool.observe import eventlog

    info = show(tree, job_id)
    if info is None:
        return fanout_detail(tree, job_id)
    m: Manifest | None = info["manifest"]
    info |= dependency_detail(tree, info["job"], info["state"])
    info["timeline"] = eventlog.history(tree, job_id)
    info["approvals"] = approvals(tree, job_id, m.output.sha256 if m else None)
    info["thumbnail"] = thumbs.url(tree, m.output.sha256) if m else None
    return info


def dependency_detail(tree: Tree, job: Any, state: str) -> dict[str, Any]:
    """What ``spool show`` draws of a job's dependencies (SPEC 11.12): its ``upstream`` (each
    source from another job, the job it is frozen to or waits for, its state), its
    ``downstream`` (jobs frozen to it or waiting for it), why it waits or is held, and for
    a variant its ``parent``."""
    out: dict[str, Any] = {}
    if not job.upstreams and not (tree.deps / job.name).is_dir() and not (tree.deps / job.job_id).is_dir():
        return {"parent": job.parent, "variant": job.variant} if job.parent else {}
    # here: status and show of a job without dependencies stay off them (+~66 ms)
    from spool.queue import depends

    out["upstream"] = depends.upstream_rows(tree, job)
    out["downstream"] = depends.downstream_rows(tree, job.job_id)
    if state == "waiting" and job.upstreams:
        out["waiting_reason"] = (
            depends.judge(tree, job, depends.Snapshot(tree)).reason or "every upstream published"
        )
    rec = depends.hold_record(tree, job.job_id) if state == "held" else None
    if rec is not None:
        out["held_because"] = rec
    if job.parent:
        out |= {"parent": job.parent, "variant": job.variant}
    return out


def fanout_detail(tree: Tree, parent: str) -> dict[str, Any] | None:
    """``spool show PARENT`` of a fan-out: its axes and each variant (the newest revision of
    its name) with its state, values, output and poster frame."""
    from spool.core.model import Manifest  # here: status --json counts without msgspec (+~28 ms)
    from spool.media import thumbs
    from spool.queue import intent  # here: status --json stays off operator intent (+~29 ms)
    from spool.queue.fanout import FanOut

    fan = read(tree.variants / f"{parent}.json", FanOut)
    jobs = intent.fanout_jobs(tree, parent)
    if fan is None or jobs is None:
        return None

    rows = []
    for listed, jid in zip(fan.jobs, jobs, strict=True):
        values = listed.values
        loc = locate(tree, jid)
        m = read(tree.manifest_file(jid), Manifest) if loc is not None and loc.state == "complete" else None
        rows.append(
            {
                "job": jid,
                "state": loc.state if loc else "unknown",
                "values": values,
                "sha256": m.output.sha256 if m else None,
                "thumbnail": thumbs.url(tree, m.output.sha256) if m else None,
                "approvals": len(intent.approvals(tree, jid)),
            }
        )
    counts: dict[str, int] = {}
    for r in rows:
        counts[r["state"]] = counts.get(r["state"], 0) + 1
    axes = [{"axis": a.axis, "values": a.values} for a in fan.axes]
    return {"parent": parent, "name": fan.name, "revision": fan.revision, "axes": axes,
            "counts": counts, "variants": rows}  # fmt: skip
