"""Reading the queue: where a job is, how many jobs each state holds, one job's story.

Counting and listing are directory scans and never parse job files, so they
stay fast on a spool of 100,000 jobs; only what is shown gets parsed.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from spool.disk import kept as _kept
from spool.disk.tree import FLAT_STATES, STATES, Tree, Value, list_folder, visible_names

if TYPE_CHECKING:
    from spool.core.model import Failure, Progress, WorkerRecord
    from spool.kinds import Job


def read(path: Path, typ: Any, *, replaced: bool = False) -> Any:
    """:func:`spool.disk.records.read`, for the modules that take it from here. Imported
    on first use: ``spool ls`` lists names and never decodes a record."""
    # here: spool ls lists names and never decodes a record (+~27 ms)
    from spool.disk.records import read as read_record

    return read_record(path, typ, replaced=replaced)


class Location(Value):
    """Where a job is: its state, its file, and the worker for a running job."""

    __match_args__ = ("state", "path", "worker")
    state: str
    path: Path
    worker: str | None

    def __init__(self, state: str, path: Path, worker: str | None = None) -> None:
        self._set(state=state, path=path, worker=worker)


def running_workers(tree: Tree, *, kept: bool = False) -> list[str]:
    """Names of the folders in ``running/`` (one per worker that ever claimed).

    ``kept``: the answer kept while a stat shows ``running/`` unchanged
    (:mod:`spool.disk.kept`), for a daemon's policies that ask every few seconds and that
    a new worker's folder seen late costs time only (over a NAS a listing is six round
    trips, a stat one)."""
    if kept:
        return _kept.LISTINGS.get(
            ("workers", os.fspath(tree.running)), (tree.running,), lambda: running_workers(tree)
        )
    try:
        with os.scandir(tree.running) as it:
            return sorted(e.name for e in it if e.is_dir() and not e.name.startswith("."))
    except FileNotFoundError:
        return []


def locate(tree: Tree, job_id: str) -> Location | None:
    """The state folder holding ``job_id``, or ``None``. A few stats, no parsing."""
    for state in FLAT_STATES:
        p = tree.job_file(state, job_id)
        if p.exists():
            return Location(state, p)
    for w in running_workers(tree):
        p = tree.job_file("running", job_id, w)
        if p.exists():
            return Location("running", p, w)
    return None


def locate_all(tree: Tree, job_id: str) -> list[Location]:
    """Every state folder holding ``job_id``: more than one breaks invariant 1."""
    found = [Location(s, tree.job_file(s, job_id)) for s in FLAT_STATES if tree.job_file(s, job_id).exists()]
    for w in running_workers(tree):
        p = tree.job_file("running", job_id, w)
        if p.exists():
            found.append(Location("running", p, w))
    return found


def job_ids(tree: Tree, state: str) -> list[tuple[str, str | None]]:
    """(job ID, worker) of every job in a state, from names alone."""
    if state == "running":
        return [(n[:-5], w) for w in running_workers(tree) for n in visible_names(tree.running_dir(w))]
    return [(jid, None) for jid in job_names(tree, state)]


def job_names(tree: Tree, state: str) -> list[str]:
    """Job IDs in a state other than ``running`` (which is per worker), unsorted,
    from one listing: no per-entry object, so 100,000 names cost little more than
    the ``getdents`` calls that read them."""
    if state == "rejected":
        return [n[:-5] for n in _listed(tree.rejected) if not n.endswith(".error.json")]
    return [n[:-5] for n in _listed(tree.root / state)]


def _listed(folder: Path, suffix: str = ".json") -> list[str]:
    """The finished ``suffix`` files of ``folder`` (:func:`spool.disk.tree.list_folder`)."""
    return list_folder(folder, suffix=suffix).names


def count(folder: Path, skip_suffix: str | None = None, taken: str = "") -> int:
    return list_folder(folder, skip=skip_suffix or "", taken=taken).count


def counts(tree: Tree) -> dict[str, int]:
    """Jobs per state (and rejections), by directory scans only."""
    out = {s: count(tree.root / s) for s in FLAT_STATES}
    out["running"] = sum(count(tree.running_dir(w)) for w in running_workers(tree))
    out["rejected"] = count(tree.rejected, skip_suffix=".error.json")
    # drops a worker has taken but not yet accepted are still incoming (the page and
    # the metrics count them so too)
    out["incoming"] = count(tree.incoming, taken=".accepting.")
    out["quarantine"] = count(tree.quarantine)
    # The order every reader shows: arriving, the queue states in their order, set aside.
    return {k: out[k] for k in ("incoming", *STATES, "rejected", "quarantine")}


def library_counts(tree: Tree) -> dict[str, int]:
    """Cheap library figures for ``spool status`` (two directory listings, no import
    of the library's search machinery: :func:`spool.library.catalog.stats` is this).

    ``assets``: names with at least one indexed version (``library/<name>/``);
    ``enriched_objects``: enrichment records (``enrich/<sha256>.json``);
    ``enrichment_backlog``: assets without an enrichment record, estimated as
    assets minus records (equal outputs share a record; older versions may have
    one): exact counts need a scan, which ``spool enrich`` does anyway.
    """
    names = _names_in(tree.root / "library") | _names_in(tree.root / "index" / "_names")
    assets = len(names | _segment_names(tree.root / "index" / "_segments"))
    records = count(tree.root / "enrich")
    return {"assets": assets, "enriched_objects": records, "enrichment_backlog": max(0, assets - records)}


def _names_in(folder: Path) -> set[str]:
    try:
        return {n for n in os.listdir(folder) if n[0] != "."}
    except FileNotFoundError:
        return set()


#: segment file name -> the asset names it holds. A segment never changes once it has its
#: name (it is written under a temporary one), so a long-lived reader (a daemon's metrics,
#: every few seconds; the status page) reads each one once, not every segment at every
#: look: over a NAS that was an open, a read and a close per segment, per look.
_segment_cache: dict[str, frozenset[str]] = {}


def _segment_names(folder: Path) -> set[str]:
    """Asset names in the library index's unmerged segments (format 2: spool.library.segments),
    taken from each line's first key, ``job_id`` (no JSON parser: status stays lean)."""
    global _segment_cache
    seen = _segment_cache
    now: dict[str, frozenset[str]] = {}  # the listed ones only: merged segments are forgotten
    out: set[str] = set()
    for fname in _listed(folder, ".jsonl"):
        names = seen.get(fname)
        if names is None:
            try:
                with open(folder / fname, "rb") as f:
                    data = f.read()
            except OSError:
                continue  # merged meanwhile: its names are in index/_names now
            names = frozenset(
                line[11 : line.find(b'"', 11)].rpartition(b"@")[0].decode("ascii", "replace")
                for line in data.split(b"\n")
                if line.startswith(b'{"job_id":"')
            )
        now[fname] = names
        out |= names
    _segment_cache = now  # replaced whole: a reader on another thread keeps its own
    return out


def load_job(tree: Tree, job_id: str) -> tuple[Job, Location] | None:
    # here: spool ls stays off the kind registry (+~70 ms)
    from spool.kinds import Job  # the kinds bring the render machinery: only when a job is read

    loc = locate(tree, job_id)
    if loc is None:
        return None
    job = read(loc.path, Job)
    return (job, loc) if job is not None else None


def attempt_numbers(tree: Tree, job_id: str) -> list[int]:
    return tree.attempt_numbers(job_id)


def attempt_summary(
    tree: Tree, job_id: str, n: int, manifest: Any = None, state: str | None = None
) -> dict[str, Any]:
    """One attempt as ``spool show`` reports it: who, when, and how it ended.

    The tree decides before the attempt's own records (SPEC 11.9): the attempt
    the manifest of a complete job names published it, even when a power cut
    left its ``result.json`` empty. ``damaged`` names the records found empty or
    torn; an outcome no record proves reads as unknown, never as a guess."""
    # here: spool ls lists names and never decodes a record (+~28 ms)
    from spool.core.model import AttemptRecord, Failure, Interruption, Manifest, Progress

    # here: spool ls lists names and never decodes a record (+~27 ms)
    from spool.disk.records import damaged as damage

    d = tree.attempt_dir(job_id, n)
    types = {
        "attempt.json": AttemptRecord,
        "result.json": Manifest,
        "failure.json": Failure,
        "interrupted.json": Interruption,
        "progress.json": Progress,
    }
    got = {name: read(d / name, typ) for name, typ in types.items()}
    lost = not d.is_dir()  # only the attempt a complete job's manifest names gets here
    # Only a record that did not read is looked at again: missing (None) or damaged.
    broken = {
        name: why for name, typ in types.items() if got[name] is None and (why := damage(d / name, typ))
    }
    if lost:
        broken["folder"] = "missing (lost in a power cut; its manifest records it; spool fsck makes it again)"
    rec, failure, progress = (got[k] for k in ("attempt.json", "failure.json", "progress.json"))
    # The staged result: format 2 keeps it in attempt.json, format 1 in result.json.
    result = rec.result if rec is not None and rec.result is not None else got["result.json"]
    if result is not None or (manifest is not None and manifest.attempt == n and state == "complete"):
        outcome = "published"
    elif failure is not None:
        outcome = f"failed at {failure.stage}"
    elif (d / "interrupted.json").exists():
        outcome = "interrupted"
    elif "result.json" in broken or "failure.json" in broken:
        which = " and ".join(k for k in ("result.json", "failure.json") if k in broken)
        how = broken.get("result.json") or broken["failure.json"]
        outcome = f"unknown: its {which} is {how} (lost in a crash)"
    elif "attempt.json" in broken:
        outcome = f"unknown: its attempt.json is {broken['attempt.json']} (lost in a crash)"
    elif state == "running":
        outcome = "running or abandoned"
    else:
        outcome = "abandoned (no outcome recorded)"
    if rec is None and manifest is not None and manifest.attempt == n:
        # Format 2: the manifest is the durable record of the attempt that published.
        who, when = manifest.worker, manifest.claimed_at
    else:
        who, when = (rec.worker, rec.claimed_at) if rec else (None, None)
    return {
        "n": n,
        "dir": tree.relative(d),
        "worker": who,
        "claimed_at": when,
        "outcome": outcome,
        "progress": progress,
        "failure": failure,
        "damaged": broken,
    }


def show(tree: Tree, job_id: str) -> dict[str, Any] | None:
    """Everything ``spool show`` prints about one job (SPEC: job, state,
    attempts, failure, manifest)."""
    from spool.core.model import Manifest  # here: spool ls lists names and never decodes a record (+~28 ms)

    found = load_job(tree, job_id)
    if found is None:
        return None
    job, loc = found
    manifest = read(tree.manifest_file(job_id), Manifest)
    numbers = attempt_numbers(tree, job_id)
    if loc.state == "complete" and manifest is not None and manifest.attempt not in numbers:
        # Format 2: a power cut may take the publishing attempt's folder (its name was
        # never fsynced at claim); the manifest is its durable record (SPEC 11.9).
        numbers = sorted([*numbers, manifest.attempt])

    def state_of(n: int) -> str | None:
        """The job's state as it bears on attempt ``n``: the one the manifest of a
        complete job names, or the last one's; ``None`` for an earlier attempt."""
        if loc.state == "complete" and manifest is not None:
            return "complete" if n == manifest.attempt else None
        return loc.state if n == numbers[-1] else None

    attempts = [attempt_summary(tree, job_id, n, manifest, state_of(n)) for n in numbers]
    failure = None
    if loc.state == "failed":
        failure = next((a["failure"] for a in reversed(attempts) if a["failure"]), None)
    return {
        "job": job,
        "state": loc.state,
        "worker": loc.worker,
        "attempts": attempts,
        "failure": failure,
        "manifest": manifest,
    }


def workers(tree: Tree) -> list[WorkerRecord]:
    # here: spool ls lists names and never decodes a record (+~28 ms)
    from spool.core.model import WorkerRecord

    out = []
    for name in visible_names(tree.workers):
        rec = read(tree.workers / name, WorkerRecord)
        if rec is not None:
            out.append(rec)
    return out


def progress_of(tree: Tree, job_id: str) -> Progress | None:
    from spool.core.model import Progress  # here: spool ls lists names and never decodes a record (+~28 ms)

    nums = attempt_numbers(tree, job_id)
    if not nums:
        return None
    p: Progress | None = read(tree.attempt_dir(job_id, nums[-1]) / "progress.json", Progress)
    return p


def last_failure(tree: Tree, job_id: str) -> Failure | None:
    """The failure record of the job's latest attempt that has one."""
    from spool.core.model import Failure  # here: spool ls lists names and never decodes a record (+~28 ms)

    for n in reversed(attempt_numbers(tree, job_id)):
        f: Failure | None = read(tree.attempt_dir(job_id, n) / "failure.json", Failure)
        if f is not None:
            return f
    return None
