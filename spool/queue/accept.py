"""Acceptance: a submission becomes a definite, frozen job, or a readable rejection.

One path serves ``spool submit FILE`` and files dropped into ``incoming/``.
Every field is checked; sources are resolved inside the asset roots, probed
and hashed; the recipe's expectations are worked out; and the job file is
written once and never changed.

Commit order (each step durable before the next):

1. reserve the job ID by creating ``attempts/<job_id>/`` (exists = duplicate,
   unless it is the empty leftover of an acceptance that crashed here);
2. write ``pending/<job_id>.json`` via a hidden temp file, fsync, hard-link to
   the final name (never replacing one), fsync ``pending/``;
3. only then move the drop out of ``incoming/`` (format 2 keeps it as
   ``attempts/<job_id>/submission.json``; format 1 removes it).

A crash anywhere leaves either no job (the drop is processed again) or a
pending job whose drop is still in ``incoming/``: processing it again finds
the job ID taken by a job with the same ``submission_sha256`` and just removes
the drop, instead of rejecting it as a duplicate.
"""

from __future__ import annotations

import errno
import hashlib
import logging
import os
import pwd
import stat
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import msgspec

from spool import kinds
from spool.core.config import Config
from spool.core.decoding import parse_json
from spool.core.errors import InvalidInput
from spool.core.faults import crashpoint
from spool.core.model import Rejection, encode, job_id, now
from spool.core.secrets import redact
from spool.core.submission import Submission
from spool.disk import formats, groupcommit, kept
from spool.disk.diskfull import is_disk_full
from spool.disk.tree import (
    JOB_COPY,
    NO_LINKS,
    SUBMISSION,
    Tree,
    fsync_dir,
    is_visible,
    make_dirs,
    rename_durable,
    write_atomic,
)
from spool.library.visibility import nfc
from spool.queue import depends, fanout
from spool.queue.arrivals import Arrivals
from spool.queue.events import Journal
from spool.queue.status import load_job, locate, read

if TYPE_CHECKING:
    from spool.kinds import Job

log = logging.getLogger("spool.queue.accept")


@dataclass(frozen=True)
class Accepted:
    job: Job
    path: Path
    #: Every job the submission made (a brief, a fan-out), in order; empty for one job.
    more: tuple[Job, ...] = ()

    @property
    def jobs(self) -> tuple[Job, ...]:
        return self.more or (self.job,)

    #: The job file's bytes, when this process wrote them (the daemon indexes the new
    #: job from them, without reading the file again).
    data: bytes | None = None


@dataclass(frozen=True)
class Rejected:
    error: InvalidInput
    path: Path  # rejected/<name>.json


Outcome = Accepted | Rejected


# -- checking -------------------------------------------------------------------


def parse_submission(data: bytes, cfg: Config) -> Submission:
    """Bytes -> a typed submission; every problem is an :class:`InvalidInput`."""
    return kinds.parse_submission(_parse_object(data, cfg))


def _parse_object(data: bytes, cfg: Config) -> dict[str, Any]:
    """Bytes -> the submission's JSON object; every problem is an :class:`InvalidInput`."""
    if len(data) > cfg.acceptance.max_submission_bytes:
        raise InvalidInput(
            "submission",
            f"is {len(data)} bytes, more than the {cfg.acceptance.max_submission_bytes} allowed",
        )
    value = parse_json(data)
    if not isinstance(value, dict):
        raise InvalidInput("submission", f"must be a JSON object, not {type(value).__name__}")
    return value


def build_job(
    tree: Tree,
    cfg: Config,
    sub: Submission,
    submitted_by: str,
    *,
    snap: depends.Snapshot | None = None,
    raw: dict[str, Any] | None = None,
    prefix: str = "",
) -> Job:
    """Check everything a submission says against the world and freeze it.

    The fields every job has are checked here; the rest belongs to the job's
    kind (:mod:`spool.kinds`), which probes and hashes what it needs. A job with
    sources from other jobs (:mod:`spool.queue.depends`) is frozen at once if they are all
    published, else returned unresolved, to wait in ``waiting/``; ``raw`` is its
    submission (JSON values), kept to freeze it then.
    """
    kind = kinds.named(sub.operation)
    jid = job_id(sub.name, sub.revision)
    tags = check_tags(sub.tags, cfg.acceptance.required_tags)
    if sub.supersedes is not None:
        _check_supersedes(tree, sub, jid)
    if (tree.variants / f"{jid}.json").exists():
        raise InvalidInput("name", f"{jid} is the parent of a fan-out of variants; submit a new revision")
    common: dict[str, Any] = dict(
        job_id=jid,
        name=sub.name,
        revision=sub.revision,
        supersedes=sub.supersedes,
        tags=tags,
        priority=sub.priority,
        submitted_at=now(),
        submitted_by=sub.submitted_by or submitted_by,
    )
    refs = kind.upstream_refs(tree, cfg, sub)
    if not refs:
        return kind.freeze(tree, cfg, sub, common)
    snap = snap if snap is not None else depends.Snapshot(tree)
    ups = depends.plan(tree, cfg, refs, jid, snap, prefix)
    job = kind.waiting(tree, cfg, sub, common, set(refs))
    request = raw if raw is not None else msgspec.to_builtins(sub)
    job = msgspec.structs.replace(job, upstreams=ups, request=request)
    job.recipe_hash = kind.spec_hash(job)
    verdict = depends.judge(tree, job, snap)
    role = next((u.role for u in ups if verdict.upstream and verdict.upstream.startswith(u.ref)), ups[0].role)
    if verdict.action == "hold":
        raise InvalidInput(f"{prefix}sources.{role}", f"{verdict.reason}; retry or revise it first")
    if verdict.action == "ready":
        try:
            return depends.freeze(tree, cfg, job, verdict.targets)
        except depends.Unusable as exc:
            raise InvalidInput(f"{prefix}sources.{role}", str(exc)) from None
    return job


def check_tags(tags: dict[str, str], required: list[str]) -> dict[str, str]:
    """The tags as a job keeps them: values in Unicode NFC (so ``é`` typed either way
    is one value, in the index and in every query), every required one present.
    A value with leading or trailing white space is refused: it would never match
    what a person types."""
    for key in required:
        if not tags.get(key, "").strip():
            raise InvalidInput(f"tags.{key}", "is a required tag and is missing or empty")
    out = {}
    for key, value in tags.items():
        if value != value.strip():
            raise InvalidInput(f"tags.{key}", "has leading or trailing white space; remove it")
        out[key] = nfc(value)
    return out


def _check_supersedes(tree: Tree, sub: Submission, jid: str) -> None:
    prev = sub.supersedes or ""
    name, _, rev = prev.partition("@")
    if name != sub.name or not rev.isdigit() or int(rev) >= sub.revision:
        raise InvalidInput("supersedes", f"must name an earlier revision of {sub.name}, not {prev!r}")
    if locate(tree, prev) is None:
        raise InvalidInput("supersedes", f"names {prev}, which is not a job in this spool")


# -- committing ---------------------------------------------------------------------


def commit(tree: Tree, job: Job, data: bytes | None = None) -> Path:
    """Write the frozen job into ``pending/`` (see the module docstring's order); a job
    still waiting for an upstream into ``waiting/``, after its reverse index entries.
    ``data``: the job file's bytes, when the caller has them already."""
    data = encode(job) if data is None else data
    jid = job.job_id
    _reserve(tree, jid, job.submission_sha256)
    state = state_of(job)
    if job.upstreams:
        depends.write_entries(tree, job)  # durable before the job file: a publish finds it
        if not tree.waiting.is_dir():
            make_dirs(tree.waiting)
    dest = tree.job_file(state, jid)
    copy = tree.job_attempts(jid) / JOB_COPY
    if formats.writing(tree.root) >= 2:
        # Format 2: the copy is the job file's second name: the same bytes by construction,
        # durable with the job file's own fsync (and its mode: a job file stays a record
        # others may replace by rename, group-writable on a shared spool; an edit in place
        # is caught by its recipe_hash wherever it is read). The copy's name is durable
        # with the next fsync of attempts/J/ (a durable attempt record, a delay or a
        # recovery record); a cut before one may lose it, and spool fsck links it again
        # from the job file (spool.repair.lostwrites.lost_names).
        try:
            write_atomic(dest, data, replace=False)
        except FileExistsError:
            raise InvalidInput("name", f"job {jid} already exists; submit a new revision") from None
        crashpoint("after_job_file")  # the job file written, its frozen copy not yet
        _freeze(tree, dest, copy, data)
        return dest
    try:
        write_atomic(dest, data, replace=False)
    except FileExistsError:
        raise InvalidInput("name", f"job {jid} already exists; submit a new revision") from None
    crashpoint("after_job_file")
    # For fsck (issue 11.14). Its folder is fsynced with the first attempt's number
    # (attempt.open_attempt): until then the job file itself is durable in pending/,
    # and the copy only matters once that file has gone missing.
    write_atomic(copy, data, mode=0o444, folder_later=True)
    return dest


def _freeze(tree: Tree, dest: Path, copy: Path, data: bytes) -> None:
    """The frozen copy ``attempts/J/job.json`` of the job file ``dest`` (whose bytes are
    ``data``): format 2 links it as the job file's second name, format 1 writes a file."""
    if formats.writing(tree.root) >= 2:
        try:
            os.link(dest, copy)
            return
        except FileExistsError:
            return  # a crashed acceptance of these same bytes left its copy (_crashed_acceptance)
        except FileNotFoundError:
            pass  # a daemon claimed the job already (its file moved on): a copy of its own
        except OSError as exc:
            if exc.errno not in NO_LINKS:
                raise
    # No hard links here (or format 1), or nothing left to link: a copy of its own, fsynced.
    write_atomic(copy, data, mode=0o444, folder_later=True)


def restore_copy(tree: Tree, jid: str) -> None:
    """The frozen copy of an accepted job whose acceptance died after its job file and
    before the copy (crash point ``after_job_file``), made by whoever takes the job up
    again: a redelivered drop, a resumed adoption. Nothing when it is there."""
    copy = tree.job_attempts(jid) / JOB_COPY
    if copy.exists():
        return
    loc = locate(tree, jid)
    if loc is None:
        return
    try:
        data = loc.path.read_bytes()
    except FileNotFoundError:
        return  # moved on meanwhile: whoever moved it owns it now
    _freeze(tree, loc.path, copy, data)


def state_of(job: Job) -> str:
    """The state a newly accepted job starts in."""
    return "pending" if job.resolved else "waiting"


def _reserve(tree: Tree, jid: str, submission_sha256: str | None) -> None:
    folder = tree.job_attempts(jid)
    try:
        os.mkdir(folder)
    except FileExistsError:
        # An empty reservation with no job anywhere is a crashed acceptance's, and so
        # is one holding only this same submission's frozen copy (an acceptance batch
        # cut short before its folders were fsynced: any of its names may survive).
        if locate(tree, jid) is not None or not _crashed_acceptance(folder, submission_sha256):
            raise InvalidInput(
                "name",
                f"job {jid} already exists; submit revision {_next_revision(tree, jid)} instead",
            ) from None
    else:
        # Durable now: every attempt folder of the job will live under this entry.
        fsync_dir(tree.attempts)


def _crashed_acceptance(folder: Path, submission_sha256: str | None) -> bool:
    names = os.listdir(folder)
    if not names:
        return True
    if names != [JOB_COPY] or submission_sha256 is None:
        return False
    try:
        copy = parse_json((folder / JOB_COPY).read_bytes())
    except (OSError, InvalidInput):
        return False
    return isinstance(copy, dict) and copy.get("submission_sha256") == submission_sha256


def _next_revision(tree: Tree, jid: str) -> int:
    name, _, rev = jid.partition("@")
    n = int(rev) + 1
    while (tree.job_attempts(f"{name}@{n}")).exists():
        n += 1
    return n


def accept_bytes(tree: Tree, cfg: Config, data: bytes, submitted_by: str) -> Job:
    """Check and commit one submission; raises :class:`InvalidInput` if rejected. For a
    submission that makes several jobs (:mod:`spool.queue.fanout`), the last of them."""
    return accept_all(tree, cfg, data, submitted_by)[-1]


def accept_all(
    tree: Tree, cfg: Config, data: bytes, submitted_by: str, snap: depends.Snapshot | None = None
) -> list[Job]:
    """:func:`accept_made` without saying which jobs were made now."""
    return [job for job, _new in accept_made(tree, cfg, data, submitted_by, snap)]


def accept_made(
    tree: Tree, cfg: Config, data: bytes, submitted_by: str, snap: depends.Snapshot | None = None
) -> list[tuple[Job, bool]]:
    """Check and commit a submission: every job it makes, in order (one job, a fan-out of
    variants, a brief). All are checked before any is committed: accepted whole or
    rejected whole. Of a submission that makes several jobs, one that already exists
    with the same ``submission_sha256`` (a drop taken again after a crash, a submit run
    again after one) is kept and not made again; if they all exist, it is a duplicate."""
    value = _parse_object(data, cfg)
    digest = hashlib.sha256(data).hexdigest()
    entries, fans = fanout.entries(value)
    if len(entries) == 1 and not fans:
        sub = kinds.parse_submission(value)
        job = build_job(tree, cfg, sub, submitted_by, snap=snap)
        job = msgspec.structs.replace(job, submission_sha256=digest)
        commit(tree, job)
        return [(job, True)]
    snap = snap if snap is not None else depends.Snapshot(tree)
    built: list[Job] = []
    for e in entries:
        sub = kinds.parse_submission(e.raw, prefix=e.prefix.rstrip("."))
        jid = job_id(sub.name, sub.revision)
        done = _same_submission(tree, jid, digest)
        if done is not None:
            built.append(done)
            snap.add(jid, "kept")
            continue
        job = build_job(tree, cfg, sub, submitted_by, snap=snap, raw=e.raw, prefix=e.prefix)
        job = msgspec.structs.replace(job, submission_sha256=digest, parent=e.parent, variant=e.variant)
        built.append(job)
        snap.add(jid, state_of(job))
    kept = {j.job_id for j in built if locate(tree, j.job_id) is not None}
    if len(kept) == len(built):
        raise InvalidInput(
            "name", f"job {built[0].job_id} already exists (this submission was accepted before)"
        )
    for fan in fans:
        _commit_fanout(tree, msgspec.structs.replace(fan, submission_sha256=digest))
    for job in built:
        if job.job_id not in kept:
            commit(tree, job)
    return [(job, job.job_id not in kept) for job in built]


def _same_submission(tree: Tree, jid: str, digest: str) -> Job | None:
    found = load_job(tree, jid)
    return found[0] if found is not None and found[0].submission_sha256 == digest else None


def _commit_fanout(tree: Tree, fan: fanout.FanOut) -> None:
    """``variants/<parent>.json``, written once, before the variants' job files."""
    path = tree.variants / f"{fan.parent}.json"
    if locate(tree, fan.parent) is not None:
        raise InvalidInput("name", f"{fan.parent} is a job; a fan-out's parent needs a name of its own")
    if not tree.variants.is_dir():
        make_dirs(tree.variants)
    try:
        write_atomic(path, encode(fan), mode=0o444, replace=False)
    except FileExistsError:
        old = read(path, fanout.FanOut)
        if old is None or old.submission_sha256 != fan.submission_sha256:
            raise InvalidInput(
                "name", f"the fan-out {fan.parent} already exists; submit a new revision"
            ) from None


def _already_accepted(tree: Tree, data: bytes) -> Job | None:
    """The job a re-delivered drop already became (same bytes), if any."""
    try:
        value = parse_json(data)
        jid = job_id(value["name"], value.get("revision", 1))
    except (InvalidInput, KeyError, TypeError, AttributeError):
        return None
    found = load_job(tree, jid) if isinstance(jid, str) else None
    if found and found[0].submission_sha256 == hashlib.sha256(data).hexdigest():
        return found[0]
    return None


# -- rejections ---------------------------------------------------------------------


#: The suffix of a rejection's reason file. No rejected submission's stem ends
#: in ``.error`` (see :func:`_stem`), so ``X.error.json`` is always a reason and
#: ``X.json`` otherwise always the submission it explains.
REASON_SUFFIX = ".error.json"


def _stem(name: str) -> str:
    """The name a rejected submission is filed under, minus ``.json``: safe
    characters only, never hidden, and never ending in ``.error`` (a drop named
    ``oops.error.json`` is filed as ``oops-error.json``, reason
    ``oops-error.error.json``; the reason records the original name)."""
    base = name[:-5] if name.endswith(".json") else name
    safe = "".join(c if c.isalnum() or c in "._-" else "_" for c in base).lstrip(".")[:100]
    safe = safe or "submission"
    if safe.endswith(".error"):
        safe = safe[: -len(".error")] + "-error"
    return safe


#: A reason without its rejected file, older than this, was left by a crash between the
#: two writes of :func:`reject` (they take milliseconds) and is taken over by a later
#: rejection of the same file; a younger one may be another writer's rejection under way.
LEFTOVER_AGE = 60.0


def _stems(stem: str) -> Iterator[str]:
    """The stems a rejection may be filed under, in order: ``stem``, ``stem-2``, ..."""
    yield stem
    n = 2
    while True:
        yield f"{stem}-{n}"
        n += 1


def _leftover(tree: Tree, stem: str, original_name: str) -> bool:
    """Whether ``stem``'s reason is a crash's leftover for this same file: no rejected
    file beside it, and older than :data:`LEFTOVER_AGE`."""
    if (tree.rejected / f"{stem}.json").exists():
        return False
    left = read(tree.rejected / f"{stem}{REASON_SUFFIX}", Rejection)
    if left is None or left.file != original_name:
        return False
    return (now() - left.rejected_at).total_seconds() >= LEFTOVER_AGE


def reject(
    tree: Tree,
    original_name: str,
    error: InvalidInput,
    by: str,
    *,
    data: bytes | None = None,
    move_from: Path | None = None,
) -> Path:
    """File a submission under ``rejected/`` with a one-sentence reason beside it.

    The reason is written first, so a reader who sees ``rejected/<name>.json``
    can always read ``<name>.error.json``. Either ``data`` (a copy, for
    ``spool submit``) or ``move_from`` (the drop itself, renamed out of
    ``incoming/``) gives the rejected file.

    The reason is written once (it fails if the name exists), so it reserves its stem:
    two writers rejecting files of one name at the same moment (two hosts, a drop and a
    ``spool submit``) take different stems, and neither rename replaces the other's file.
    """
    rec = Rejection(
        file=original_name,
        field=redact(error.field),  # a field can name a tag or role that is a secret
        reason=redact(str(error)),
        rejected_at=now(),
        rejected_by=by,
    )
    for stem in _stems(_stem(original_name)):
        if (tree.rejected / f"{stem}.json").exists():
            continue
        reason = tree.rejected / f"{stem}{REASON_SUFFIX}"
        try:
            write_atomic(reason, encode(rec), replace=False)
        except FileExistsError:
            if not _leftover(tree, stem, original_name):
                continue
            write_atomic(reason, encode(rec))  # a crash's leftover for this file: taken over
        dest = tree.rejected / f"{stem}.json"
        if move_from is not None:
            rename_durable(move_from, dest)
        else:
            write_atomic(dest, data or b"")
        return dest
    raise AssertionError("unreachable: _stems never ends")


# -- the two entry points ----------------------------------------------------------------


def submit_file(tree: Tree, cfg: Config, path: Path, journal: Journal, user: str) -> Outcome:
    """``spool submit FILE``: the file is the user's; spool keeps a copy if rejected."""
    name = display_name(path.name)
    try:
        data = _read_submission(path, cfg)
    except InvalidInput as exc:
        rej = reject(tree, name, exc, user, data=b"")
        journal.record(name, "rejected", from_="submit", reason=str(exc))
        return Rejected(exc, rej)
    return _accept_or_reject(tree, cfg, data, name, journal, user, source_path=None)


class _Recorder(Protocol):
    """What acceptance needs of a journal: :class:`~spool.queue.events.Journal`, or the
    batch's :class:`_Held` lines, written only once the batch is durable."""

    writer: str

    def record(self, job: str, to: str, *, from_: str | None = None, reason: str | None = None) -> object: ...


class _Held:
    """Journal lines of an acceptance batch, held until its folder fsyncs are done."""

    def __init__(self, journal: Journal) -> None:
        self.journal = journal
        self.writer = journal.writer
        self.lines: list[tuple[str, str, str | None, str | None]] = []

    def record(self, job: str, to: str, *, from_: str | None = None, reason: str | None = None) -> object:
        self.lines.append((job, to, from_, reason))
        return None

    def release(self) -> None:
        with self.journal.batch():  # one write for the batch's lines
            for job, to, from_, reason in self.lines:
                self.journal.record(job, to, from_=from_, reason=reason)
        self.lines.clear()


def _accept_or_reject(
    tree: Tree,
    cfg: Config,
    data: bytes,
    name: str,
    journal: _Recorder,
    user: str,
    source_path: Path | None,
    redelivered: bool = False,
) -> Outcome:
    from_ = "incoming" if source_path is not None else "submit"
    try:
        made = accept_made(tree, cfg, data, user)
    except InvalidInput as exc:
        done = _already_accepted(tree, data) if redelivered else None
        if done is not None:
            # Its batch was cut short before the journal line (or the drop's move out), or
            # even before the frozen copy: make that now, and say it, so the journal has
            # every acceptance.
            restore_copy(tree, done.job_id)
            why = f"accepted from {name} (before a crash)"
            journal.record(done.job_id, state_of(done), from_=from_, reason=why)
            return Accepted(done, tree.job_file(state_of(done), done.job_id))
        rej = reject(tree, name, exc, journal.writer, data=data, move_from=source_path)
        journal.record(name, "rejected", from_=from_, reason=str(exc))
        return Rejected(exc, rej)
    for job, new in made:
        why = f"accepted from {name}" + ("" if new else " (before a crash)")
        if not job.resolved:
            why += "; waits for " + ", ".join(u.ref for u in job.upstreams if u.sha256 is None)
        journal.record(job.job_id, state_of(job), from_=from_, reason=why)
    jobs = tuple(job for job, _ in made)
    last = jobs[-1]
    # The daemon indexes a single new pending job from these bytes, without reading it back.
    written = encode(last) if len(jobs) == 1 and last.resolved else None
    return Accepted(
        last, tree.job_file(state_of(last), last.job_id), more=jobs if len(jobs) > 1 else (), data=written
    )


def _read_submission(path: Path, cfg: Config, shown: str | None = None) -> bytes:
    """Read a dropped file without following symlinks or blocking on FIFOs.

    ``shown`` is the name the user gave the file (a drop is read under this
    worker's hidden claim name, which must never appear in a reason)."""
    field = "submission"
    name = shown or path.name
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise InvalidInput(field, f"{name} is a symbolic link; drop the file itself") from None
        raise InvalidInput(field, f"{name} cannot be read ({exc.strerror})") from None
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise InvalidInput(field, f"{name} is a folder, not a JSON file")
        if not stat.S_ISREG(st.st_mode):
            raise InvalidInput(field, f"{name} is not a regular file")
        limit = cfg.acceptance.max_submission_bytes
        chunks: list[bytes] = []
        got = 0
        while got <= limit:  # plain reads: a buffered file object cost a dup, fstat, ioctl, lseek
            chunk = os.read(fd, limit + 1 - got)
            if not chunk:
                break
            chunks.append(chunk)
            got += len(chunk)
        data = b"".join(chunks)
        if len(data) > limit:
            raise InvalidInput(field, f"{name} is larger than the {limit} bytes allowed")
        return data
    finally:
        os.close(fd)


def _kind(mode: int) -> str:
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "not a regular file"


def _dispose_of_object(tree: Tree, taken: Path, name: str, st: os.stat_result) -> str:
    """Take a non-regular drop out of ``incoming/`` without opening it; what was done.

    ``rejected/`` keeps regular files only, so that ``cat rejected/*.json`` and
    ``sha256sum rejected/*`` never block on a FIFO or follow a link out of the
    spool. A symlink, FIFO, socket or device holds nothing at rest, so it is
    removed (a link's target is recorded, and never touched). An empty folder
    is removed too; a folder with contents is kept, out of every glob's way,
    under ``rejected/.kept/``.
    """
    if stat.S_ISDIR(st.st_mode):
        try:
            os.rmdir(taken)
            return "the empty folder was removed"
        except OSError:
            kept = tree.rejected / ".kept"
            os.makedirs(kept, exist_ok=True)
            stem, n = _stem(name), 1
            dest = kept / f"{stem}.json"
            while os.path.lexists(dest):  # never onto an earlier kept folder
                n += 1
                dest = kept / f"{stem}-{n}.json"
            rename_durable(taken, dest)
            return f"it was kept as {tree.relative(dest)}/ because it is not empty"
    what = "the link was removed"
    if stat.S_ISLNK(st.st_mode):
        try:
            target = redact(display_name(os.readlink(taken)))
            what = f"it pointed to {target}; the link was removed, its target untouched"
        except OSError:
            pass
    elif not stat.S_ISREG(st.st_mode):
        what = "it was removed without being opened"
    os.unlink(taken)
    fsync_dir(taken.parent)
    return what


#: uid -> (user name, monotonic time looked up): a lookup opens and reads /etc/passwd
#: (and nsswitch.conf) each time, once per accepted drop; a renamed user is seen within
#: USER_NAME_TTL seconds.
_user_names: dict[int, tuple[str, float]] = {}
USER_NAME_TTL = 60.0


def _user_name(uid: int) -> str:
    t = time.monotonic()
    hit = _user_names.get(uid)
    if hit is not None and t - hit[1] < USER_NAME_TTL:
        return hit[0]
    try:
        name = pwd.getpwuid(uid).pw_name
    except KeyError:
        name = "unknown"
    _user_names[uid] = (name, t)
    return name


def _taken_prefix(worker: str) -> str:
    return f".accepting.{worker}."


def take_incoming(
    tree: Tree, worker: str, arrivals: Arrivals | None = None
) -> Iterator[tuple[str, Path, bool, os.stat_result | None]]:
    """Claim finished drops in ``incoming/`` one by one by renaming each to a
    hidden name of this worker's (rename is the one exclusive primitive across
    hosts). Yields (original name, claimed path, redelivered, its ``lstat`` from just
    before the rename or ``None``); leftovers a crash left under this worker's prefix
    come first, marked redelivered.

    ``arrivals`` decides which drops are finished (:mod:`spool.queue.arrivals`);
    without it every drop is taken (for callers that know the writers are done).
    """
    prefix = _taken_prefix(worker)
    # Kept while a stat shows incoming/ unchanged: an idle daemon polls every 2 s, and
    # over a NAS a listing of even an empty folder is six round trips, a stat one. A drop
    # being written in place does not change the folder: its name is in the kept listing.
    names = kept.names(tree.incoming, max_age=kept.QUEUE_RELIST)
    for name in sorted(n for n in names if n.startswith(prefix)):
        yield name[len(prefix) :], tree.incoming / name, True, None
    if arrivals is not None:
        arrivals.prune(set(names))
    for name in sorted(names):
        if not name.endswith(".json") or not is_visible(name):
            continue
        st: os.stat_result | None = None
        if arrivals is not None:
            if arrivals.not_yet(name):
                continue  # seen, its wait not over: no look (a round trip on a NAS)
            try:
                st = os.lstat(tree.incoming / name)
            except OSError:
                continue  # withdrawn, or taken by another acceptor
            if not arrivals.ready(name, st):
                continue  # still being written; a later pass takes it
        taken = tree.incoming / f"{prefix}{name}"
        try:
            os.rename(tree.incoming / name, taken)
        except OSError:
            continue  # another acceptor took it, or it was withdrawn
        if arrivals is not None:
            arrivals.taken(name)
        yield name, taken, False, st


def accept_incoming(
    tree: Tree,
    cfg: Config,
    worker: str,
    journal: Journal,
    limit: int = 1000,
    arrivals: Arrivals | None = None,
    seconds: float | None = None,
) -> list[Outcome]:
    """Process up to ``limit`` finished drops from ``incoming/``, and no more once
    ``seconds`` have passed (the drops not yet taken stay for the next batch); never raises
    on bad input. A full disk (ENOSPC, EDQUOT) is raised: nothing can be accepted then.

    One batch (group commit): every job file and reservation is written (each
    file fsynced), then ``attempts/``, ``pending/`` and the other folders
    touched are fsynced once for the batch, and only then are the drops moved out
    and the journal lines written. A crash before that leaves every drop under
    this worker's claim name, taken up again as redelivered (a job already
    written is recognised by its ``submission_sha256``, never accepted twice).
    """
    with groupcommit.together(at_once=True):  # attempts/ and pending/ need no order
        batch = take_batch(tree, cfg, worker, journal, limit, arrivals, seconds)
    return batch.tell(tree)


@dataclass
class Batch:
    """An acceptance batch made but not told: its job files are written, its folders not
    fsynced yet. Whoever made it inside a :func:`groupcommit.together` block calls
    :meth:`tell` once the block has ended (its folders durable), and not before."""

    out: list[Outcome]
    taken_of: list[tuple[Outcome, Path]]
    held: _Held
    error: Exception | None = None

    def tell(self, tree: Tree) -> list[Outcome]:
        """Durable now: the journal lines, then the drops moved out (a drop that outlives a
        crash in between is redelivered, and recognised). Raises a full disk met while
        making the batch, after telling what was done before it."""
        self.release_lines()
        return self.keep_drops(tree)

    def release_lines(self) -> None:
        """The first half of :meth:`tell`: the journal lines."""
        self.held.release()

    def keep_drops(self, tree: Tree) -> list[Outcome]:
        """The second half of :meth:`tell`: the drops moved out; the outcomes."""
        for outcome, taken in self.taken_of:
            if isinstance(outcome, Accepted):
                keep_submission(tree, outcome.job.job_id, taken)
        if self.error is not None:
            raise self.error
        return self.out


def take_batch(
    tree: Tree,
    cfg: Config,
    worker: str,
    journal: Journal,
    limit: int = 1000,
    arrivals: Arrivals | None = None,
    seconds: float | None = None,
) -> Batch:
    """The writing half of :func:`accept_incoming`, inside the caller's batch: a daemon
    claims in the same batch, so that the claims and the acceptance share their folder
    fsyncs (one round fewer from a drop to its claim)."""
    batch = Batch([], [], _Held(journal))
    try:
        until = None if seconds is None else time.monotonic() + seconds
        _accept_batch(tree, cfg, worker, batch.held, limit, arrivals, batch.out, batch.taken_of, until)
    except Exception as exc:  # a full disk: what was done so far is still told
        batch.error = exc
    if any(isinstance(o, Accepted) for o in batch.out):
        crashpoint("mid_accept_batch")  # job files written, their folders not fsynced, drops kept
    return batch


def keep_submission(tree: Tree, jid: str, taken: Path) -> None:
    """Move an accepted drop out of ``incoming/``: format 2 keeps it as
    ``attempts/<jid>/submission.json`` (the bytes as submitted), format 1 removes it.

    No fsync either way: if the move is lost in a crash, the drop comes back and is
    recognised as already accepted (same ``submission_sha256``), so nothing is lost.
    Kept rather than removed because removing is the costlier half: ext4 without a
    journal steps over every inode freed in the last ~30 s at each create in the same
    block group, and a busy queue frees one a job; on a NAS either is one round trip.
    """
    if formats.writing(tree.root) >= 2:
        try:
            os.rename(taken, tree.job_attempts(jid) / SUBMISSION)
            return
        except OSError:
            pass  # gone already, or its job's folder is (a redelivery of a finished job)
    try:
        os.unlink(taken)
    except FileNotFoundError:
        pass


def _accept_batch(
    tree: Tree,
    cfg: Config,
    worker: str,
    journal: _Recorder,
    limit: int,
    arrivals: Arrivals | None,
    out: list[Outcome],
    taken_of: list[tuple[Outcome, Path]],
    until: float | None = None,
) -> None:
    for raw_name, taken, redelivered, looked in take_incoming(tree, worker, arrivals):
        name = display_name(raw_name)
        try:
            outcome = _accept_drop(tree, cfg, name, taken, redelivered, worker, journal, looked)
            out.append(outcome)
            taken_of.append((outcome, taken))
        except Exception as exc:  # a bug must not wedge the queue on one file
            if is_disk_full(exc):
                # Not the drop's fault: it stays under its claim name, to be taken up
                # again (as redelivered, so a job already committed is recognised)
                # once there is space; the caller backs off.
                raise
            log.exception("accepting %s failed", name)
            why = str(exc).replace(str(taken), name).replace(taken.name, name)  # never the claim name
            err = InvalidInput("submission", f"could not be processed ({type(exc).__name__}: {why})")
            try:
                regular = stat.S_ISREG(os.lstat(taken).st_mode)
                if not regular:
                    _dispose_of_object(tree, taken, name, os.lstat(taken))
                rej = reject(
                    tree,
                    name,
                    err,
                    worker,
                    data=b"" if not regular else None,
                    move_from=taken if regular else None,
                )
                out.append(Rejected(err, rej))
                journal.record(name, "rejected", from_="incoming", reason=str(err))
            except Exception:
                log.exception("could not move %s to rejected/", name)
        if len(out) >= limit or (until is not None and time.monotonic() >= until):
            break


def _accept_drop(
    tree: Tree,
    cfg: Config,
    name: str,
    taken: Path,
    redelivered: bool,
    worker: str,
    journal: _Recorder,
    looked: os.stat_result | None = None,
) -> Outcome:
    # ``looked``: its lstat just before this worker's rename took it (the same file: one
    # look fewer, a round trip on a NAS). Should another file have been renamed over the
    # name in between, the read below still refuses anything but a regular file.
    try:
        st = looked if looked is not None else os.lstat(taken)
    except FileNotFoundError:
        raise InvalidInput("submission", f"{name} vanished while being accepted") from None
    user = _user_name(st.st_uid)
    if not stat.S_ISREG(st.st_mode):
        # Never opened (a FIFO would block, a link would lead out of the spool):
        # the reason records what the object was, rejected/ gets an empty file.
        kind = _kind(st.st_mode)
        done = _dispose_of_object(tree, taken, name, st)
        exc = InvalidInput("submission", f"{name} is {kind}, not a regular file; {done}")
        rej = reject(tree, name, exc, worker, data=b"")
        journal.record(name, "rejected", from_="incoming", reason=str(exc))
        return Rejected(exc, rej)
    try:
        data = _read_submission(taken, cfg, shown=name)
    except InvalidInput as exc:
        rej = reject(tree, name, exc, worker, move_from=taken)
        journal.record(name, "rejected", from_="incoming", reason=str(exc))
        return Rejected(exc, rej)
    # An accepted drop is moved out by the caller (keep_submission), once the batch is durable.
    return _accept_or_reject(tree, cfg, data, name, journal, user, source_path=taken, redelivered=redelivered)


def display_name(name: str) -> str:
    """A file name as text that can be written anywhere (undecodable bytes escaped)."""
    return name.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
