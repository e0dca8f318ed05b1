"""What a power cut takes: writes that were never fsynced, found and mended from the tree.

A crash of the machine (power, kernel panic, a NAS head failing over) loses
every write that was not fsynced, while names already renamed into place may
stay: a record written without fsync can come back *empty* or torn under its
final name. SPEC 11.9 says which records may be lost and what must hold
anyway; this module is how ``spool fsck`` keeps that promise:

* :func:`damaged_records`: every record file of the tree that is empty or not
  JSON, each with the repair the tree proves. An attempt's ``result.json``
  (format 1's staged manifest, written without fsync; format 2's is the manifest's
  own first name, fsynced, so never torn by a cut) is written again from
  ``manifests/J.json`` when that manifest names the attempt: the same bytes the
  attempt staged. Hints that nothing proves (progress, a generation's
  ``gen/progress.json``, worker records, enrichment, poster frames) are set aside under
  a hidden name (``.<name>.damaged``, kept as found), so every reader sees
  "unknown" instead of an empty file and the writer makes a new one. Records
  that are fsynced before anything relies on them (attempt, failure, recovery
  records...) are only reported: a damaged one is not a power cut's doing.
* :func:`lost_names`: names format 2 does not fsync the folder of (a slot kind's
  attempt folder and the job's frozen copy, both in ``attempts/J/``, made durable
  only by a later fsync of that folder: any durable record an attempt's ending
  writes): the attempt folder a complete job's manifest names, made again with
  its record written from the manifest; a frozen copy linked again from the job
  file (the same inode by construction).
* :func:`journal_gaps`: jobs in ``complete/`` or ``failed/`` whose last journal
  line about a queue state says otherwise (the line telling the transition
  was lost: written after the transition, it becomes durable only with the next
  group commit; a process killed in between loses it too). The repair appends
  a line marked ``rebuilt`` saying what the tree proves.

Both only look at what settled: files changed in the last few seconds may be
a writer at work.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from spool.core.model import AttemptRecord, Failure, Interruption, Manifest, encode
from spool.disk import formats
from spool.disk.records import damaged as damage
from spool.disk.records import read
from spool.disk.tree import (
    JOB_COPY,
    NO_LINKS,
    SUBMISSION,
    Tree,
    fsync_dir,
    make_dirs,
    visible_names,
    write_atomic,
)
from spool.queue.events import read_file

#: Seconds a file must have been left alone before it is judged (a writer may be at work).
SETTLE = 5.0

#: Hints: records written without fsync that nothing relies on; a damaged one is set aside
#: (a render's and a generation's ``progress.json``; ``poll.json`` of spools made before it).
HINTS = frozenset({"progress.json", "poll.json"})

#: The queue states a journal line can tell (its ``to``).
QUEUE_STATES = frozenset({"waiting", "pending", "held", "running", "complete", "failed"})


@dataclass(frozen=True)
class Damaged:
    """One damaged record: where, how (``empty`` or ``torn``), and what mends it."""

    path: Path
    how: str
    #: "rewrite": from ``data`` (what the tree proves); "aside": set aside; None: report only.
    action: str | None
    why: str
    data: bytes = b""


def _settled(path: Path, now: float, settle: float) -> bool:
    try:
        return now - path.lstat().st_mtime >= settle
    except OSError:
        return False


def _records(folder: Path) -> Iterator[Path]:
    """Visible ``*.json`` files directly in ``folder``."""
    try:
        with os.scandir(folder) as it:
            for e in it:
                visible = e.name.endswith(".json") and not e.name.startswith(".")
                if visible and e.is_file(follow_symlinks=False):
                    yield Path(e.path)
    except (FileNotFoundError, NotADirectoryError):
        return


def damaged_records(tree: Tree, settle: float = SETTLE) -> list[Damaged]:
    """Every settled record of the tree that is empty or torn, with its repair."""
    now = time.time()
    out: list[Damaged] = []

    def judge(path: Path, action: str | None, why: str, data: bytes = b"") -> None:
        how = damage(path)
        if how is not None and _settled(path, now, settle):
            out.append(Damaged(path, how, action, why, data))

    # A format 1 tree fsyncs every attempt record before the attempt starts: one found
    # damaged there is the disk's doing, reported only. Format 2 does not fsync a slot
    # attempt's record (spool.queue.attempt): a cut may empty it, and the tree proves what it said.
    try:
        lossy_attempts = formats.read(tree.root) >= 2
    except formats.Unreadable:
        lossy_attempts = True
    for jdir in sorted(tree.attempts.iterdir()) if tree.attempts.is_dir() else []:
        if jdir.name.startswith(".") or not jdir.is_dir():
            continue
        jid = jdir.name
        for f in _records(jdir):
            if f.name == SUBMISSION:
                continue  # the drop as its submitter wrote it, never fsynced: nothing reads it
            judge(f, None, "fsynced before use: not a power cut's doing; look at the disk")
        manifest: Manifest | None = None
        for adir in sorted(d for d in jdir.iterdir() if d.name.isdigit() and d.is_dir()):
            for f in _records(adir):
                if f.name in HINTS:
                    judge(f, "aside", "a hint written without fsync; readers say unknown without it")
                elif f.name == "attempt.json" and lossy_attempts:
                    if damage(f) is None:
                        continue
                    if manifest is None:
                        manifest = read(tree.manifest_file(jid), Manifest)
                    why, data = attempt_record(jid, int(adir.name), adir, manifest)
                    judge(f, "rewrite", why, data)
                elif f.name == "result.json":
                    if damage(f) is None:
                        continue
                    if manifest is None:
                        manifest = read(tree.manifest_file(jid), Manifest)
                    if manifest is not None and manifest.job_id == jid and manifest.attempt == int(adir.name):
                        why = "its manifest names this attempt: rewritten from it"
                        judge(f, "rewrite", why, encode(manifest))
                    else:
                        judge(f, "aside", "a staged result no manifest names: it proves nothing")
                else:
                    judge(f, None, "fsynced before use: not a power cut's doing; look at the disk")
            for f in _records(adir / "gen"):
                if f.name in HINTS:
                    judge(f, "aside", "a hint written without fsync; readers say unknown without it")
                else:
                    judge(f, None, "fsynced before use: not a power cut's doing; look at the disk")
    for f in _records(tree.workers):
        judge(f, "aside", "a heartbeat written without fsync; its worker writes a new one")
    for f in _records(tree.root / "enrich"):
        judge(f, "aside", "enrichment is recomputed on demand")
    thumbs = tree.root / "thumbs"
    if thumbs.is_dir():
        for f in thumbs.iterdir():
            if f.suffix == ".jpg" and not f.name.startswith("."):
                try:
                    empty = f.stat().st_size == 0
                except OSError:
                    continue
                if empty and _settled(f, now, settle):
                    why = "a poster frame written without fsync; made again"
                    out.append(Damaged(f, "empty", "aside", why))
    return out


def attempt_record(jid: str, n: int, adir: Path, manifest: Manifest | None) -> tuple[str, bytes]:
    """An attempt record a power cut emptied (format 2 fsyncs a slot attempt's record only
    through what ends it), written again from what the tree proves: the manifest naming
    the attempt (its identity and staged result), else its failure or interruption
    record (who), else only its number and when its folder was made."""
    if manifest is not None and manifest.job_id == jid and manifest.attempt == n:
        rec = AttemptRecord(
            job_id=jid, n=n, worker=manifest.worker, host=manifest.host, pid=manifest.pid,
            boot_id=manifest.boot_id, claimed_at=manifest.claimed_at, result=manifest,
            rewritten="from its manifest, which names this attempt",
        )  # fmt: skip
        return "its manifest names this attempt: rewritten from it", encode(rec)
    failure = read(adir / "failure.json", Failure)
    stop = read(adir / "interrupted.json", Interruption)
    worker = failure.worker if failure else stop.worker if stop else "unknown"
    try:
        made = datetime.fromtimestamp(adir.stat().st_mtime, UTC)
    except OSError:
        made = datetime.now(UTC)
    source = "its failure record" if failure else "its interruption record" if stop else "its folder"
    rec = AttemptRecord(
        job_id=jid, n=n, worker=worker, host=failure.host if failure else "", pid=0, boot_id="",
        claimed_at=made, rewritten=f"lost in a power cut; who and when from {source}",
    )  # fmt: skip
    return f"lost in a power cut (never fsynced): rewritten from {source}", encode(rec)


@dataclass(frozen=True)
class LostName:
    """A name a power cut took from ``attempts/<job>/`` that the tree proves: ``what`` is
    ``attempt`` (the folder of the attempt the manifest names; ``data`` its record) or
    ``copy`` (the frozen copy; ``source`` the job file it is a second name of)."""

    job_id: str
    what: str
    path: Path
    why: str
    data: bytes = b""
    source: Path | None = None


def lost_names(tree: Tree, job_id: str, state: str, job_file: Path, settle: float = SETTLE) -> list[LostName]:
    """The names of ``attempts/<job_id>/`` a power cut took from a settled job in
    ``state`` (format 2 only: format 1 fsyncs that folder before anything relies on it).
    A complete job's published attempt comes back from its manifest (who, when, the
    staged result: the record fsck would write for an emptied ``attempt.json``); a
    missing frozen copy comes back as the job file's second name."""
    try:
        if formats.read(tree.root) < 2:
            return []
    except formats.Unreadable:
        return []
    if not _settled(job_file, time.time(), settle):
        return []
    out = []
    jdir = tree.job_attempts(job_id)
    if state == "complete":
        m = read(tree.manifest_file(job_id), Manifest)
        if m is not None and m.job_id == job_id and m.attempt > 0:
            adir = tree.attempt_dir(job_id, m.attempt)
            if not adir.exists():
                _, data = attempt_record(job_id, m.attempt, adir, m)
                why = "the folder of the attempt its manifest names was lost in a power cut"
                out.append(LostName(job_id, "attempt", adir, why, data))
    copy = jdir / JOB_COPY
    if not copy.exists() and job_file.is_file():
        why = "its frozen copy's name was lost in a power cut (format 2: a second name of the job file)"
        out.append(LostName(job_id, "copy", copy, why, source=job_file))
    return out


def restore_name(lost: LostName) -> None:
    """Make a lost name again, durably (its folder fsynced)."""
    if lost.what == "attempt":
        make_dirs(lost.path / "work")
        write_atomic(lost.path / "attempt.json", lost.data)
    else:
        assert lost.source is not None
        make_dirs(lost.path.parent)
        try:
            os.link(lost.source, lost.path)
        except FileExistsError:
            return
        except OSError as exc:
            if exc.errno not in NO_LINKS:
                raise
            # No hard links on this filesystem: a copy of its own, as acceptance makes.
            write_atomic(lost.path, lost.source.read_bytes(), mode=0o444)
    fsync_dir(lost.path.parent)


def mend(d: Damaged) -> None:
    """Apply ``d``'s repair (never for a report-only one)."""
    if d.action == "rewrite":
        write_atomic(d.path, d.data)
    elif d.action == "aside":
        try:
            os.rename(d.path, d.path.with_name(f".{d.path.name}.damaged"))
        except FileNotFoundError:
            pass  # its writer replaced it meanwhile


@dataclass(frozen=True)
class Gap:
    """A settled job whose journal does not tell its state: what the last line says."""

    job_id: str
    state: str
    last: str | None
    attempt: int | None


@dataclass
class _Told:
    """What the journal tells of one job: whether it ever said complete, and when it last
    said failed and last told of a move out of failed (an operator's retry)."""

    complete: bool = False
    failed: Any = None
    left_failed: Any = None
    last: str | None = None  # the last queue state a line named


def told(tree: Tree) -> dict[str, _Told]:
    """Each job's story as the journal tells it: every writer's file read as a stream
    (one job's facts kept, never the lines: a journal of millions of lines costs the
    jobs, not the lines), merged by the lines' timestamps."""
    out: dict[str, _Told] = {}
    last_ts: dict[str, Any] = {}
    for f in sorted(tree.events.glob("*.jsonl")):
        if f.name.startswith("."):
            continue
        for ev in read_file(f):
            if ev.to not in QUEUE_STATES and ev.from_ != "failed":
                continue
            t = out.setdefault(ev.job, _Told())
            if ev.to in QUEUE_STATES and (ev.job not in last_ts or ev.ts >= last_ts[ev.job]):
                t.last, last_ts[ev.job] = ev.to, ev.ts
            if ev.to == "complete":
                t.complete = True
            elif ev.to == "failed" and (t.failed is None or ev.ts > t.failed):
                t.failed = ev.ts
            if ev.from_ == "failed" and (t.left_failed is None or ev.ts > t.left_failed):
                t.left_failed = ev.ts
    return out


def _tells(t: _Told | None, state: str) -> bool:
    """Whether the journal tells that the job is in ``state`` now. ``complete`` is for
    good (one line is enough, whatever came after: a drop delivered again after a crash
    is journaled as accepted); ``failed`` must not have been left since."""
    if t is None:
        return False
    if state == "complete":
        return t.complete
    if state == "failed":
        return t.failed is not None and (t.left_failed is None or t.left_failed < t.failed)
    return True  # pending: any line at all (waiting again after a retry, a release, an interruption)


def journal_gaps(tree: Tree, settle: float = SETTLE) -> list[Gap]:
    """Jobs in ``complete/`` or ``failed/`` (settled) whose journal does not tell it, and
    jobs in ``pending/`` the journal never saw."""
    now = time.time()
    story = told(tree)
    out = []
    for state in ("complete", "failed", "pending"):
        for name in sorted(visible_names(tree.root / state)):
            jid = name[:-5]
            t = story.get(jid)
            if _tells(t, state) or not _settled(tree.job_file(state, jid), now, settle):
                continue
            out.append(Gap(jid, state, t.last if t else None, _attempt_of(tree, jid, state)))
    return out


def _attempt_of(tree: Tree, jid: str, state: str) -> int | None:
    """The attempt that ended the job, as the tree proves it."""
    if state == "complete":
        m = read(tree.manifest_file(jid), Manifest)
        return m.attempt if m is not None else None
    if state == "failed":
        numbers = tree.attempt_numbers(jid)
        return numbers[-1] if numbers else None
    return None


def rebuild(tree: Tree, gaps: list[Gap], journal: Any) -> None:
    """Append one ``rebuilt`` line per gap, saying what the tree proves."""
    for g in gaps:
        why = {
            "complete": "its manifest and complete/ prove it was published",
            "failed": "failed/ and its failure record prove it",
            "pending": "pending/ proves it was accepted",
        }[g.state]
        journal.record(
            g.job_id,
            g.state,
            attempt=g.attempt,
            reason=f"rebuilt by spool fsck: the line telling this was lost in a crash; {why}",
            rebuilt=True,
        )


__all__ = [
    "Damaged",
    "Gap",
    "LostName",
    "damaged_records",
    "journal_gaps",
    "lost_names",
    "mend",
    "rebuild",
    "restore_name",
]
