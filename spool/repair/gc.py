"""``spool gc``: reclaim space without ever touching what a manifest references.

Two kinds of garbage:

* **store objects** no manifest and no attempt's staged result names. A
  render publishes its object a moment before it stages its result, so an
  object is only collected once its inode has not
  changed for ``grace`` seconds (linking it updates its ctime): gc never
  races a publish in progress;
* **work folders** of attempts that ended (a staged result, ``failure.json`` or
  ``interrupted.json``, or the job is no longer running) more than
  ``[recovery] work_retention`` seconds ago. The attempt's records stay;
  only ``work/`` (candidates, label files) goes. Published outputs are safe:
  the store holds its own link to the bytes.
"""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

from spool.core.model import AttemptRecord, Manifest
from spool.disk import store
from spool.disk.tree import Tree, fsync_dir, visible_names
from spool.queue.attempt import staged_result
from spool.queue.status import attempt_numbers, locate, read

#: Store objects changed more recently than this are never collected.
GRACE = 3600.0

_ENDINGS = ("result.json", "failure.json", "interrupted.json")


@dataclass
class Report:
    objects: list[str] = field(default_factory=list)
    object_bytes: int = 0
    work_folders: list[str] = field(default_factory=list)
    work_bytes: int = 0
    kept_referenced: int = 0


def referenced(tree: Tree) -> set[str]:
    """Store paths (relative to the spool) named by manifests and staged results."""
    refs = set()
    for name in visible_names(tree.manifests):
        m = read(tree.manifests / name, Manifest)
        if m is not None:
            refs.add(m.output.store_path)
    if tree.attempts.is_dir():
        for jdir in tree.attempts.iterdir():
            for n in attempt_numbers(tree, jdir.name):
                r = staged_result(jdir / str(n))
                if r is not None:
                    refs.add(r.output.store_path)
    return refs


def _size(path: Path) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(root, f)).st_size
            except OSError:
                pass
    return total


def collect(tree: Tree, retention: float, *, dry_run: bool = False, grace: float = GRACE) -> Report:
    report = Report()
    now = time.time()
    refs = referenced(tree)
    for f in store.objects(tree):
        rel = tree.relative(f)
        if rel in refs:
            report.kept_referenced += 1
            continue
        st = f.stat()
        if now - st.st_ctime < grace:
            continue
        report.objects.append(rel)
        report.object_bytes += st.st_size
        if not dry_run:
            f.unlink()
            fsync_dir(f.parent)
    if tree.attempts.is_dir():
        for jdir in sorted(tree.attempts.iterdir()):
            loc = None
            for n in attempt_numbers(tree, jdir.name):
                work = jdir / str(n) / "work"
                if not work.is_dir():
                    continue
                ended = _ended_at(jdir, n)
                if ended is None:
                    loc = loc or locate(tree, jdir.name)
                    if loc is not None and loc.state == "running":
                        continue  # possibly the attempt in progress
                    ended = (jdir / str(n) / "attempt.json").stat().st_mtime
                if now - ended < retention:
                    continue
                report.work_folders.append(tree.relative(work))
                report.work_bytes += _size(work)
                if not dry_run:
                    shutil.rmtree(work)
    return report


def _ended_at(job_dir: Path, n: int) -> float | None:
    """When attempt n ended: its own closing record (format 2: ``attempt.json`` written
    again with its staged result), or a recovery decision about it."""
    paths = [job_dir / str(n) / name for name in _ENDINGS]
    rec = read(job_dir / str(n) / "attempt.json", AttemptRecord)
    if rec is not None and rec.result is not None:
        paths.append(job_dir / str(n) / "attempt.json")
    paths += list(job_dir.glob(f"recovery-{n}.json")) + list(job_dir.glob(f"recovery-{n}-*.json"))
    times = []
    for p in paths:
        try:
            times.append(p.stat().st_mtime)
        except FileNotFoundError:
            continue
    return max(times) if times else None
