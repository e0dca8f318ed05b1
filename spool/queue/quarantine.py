"""Quarantine: a file in the queue that can never be run is taken out of it, with a reason.

A job file is written once by acceptance and never changed, so a file in
``pending/`` (or ``held/``, or a worker's ``running/``) that does not decode
as a job, whose name is not its job ID, or whose ``recipe_hash`` does not
match its spec was damaged or edited by hand. Running it would render
something nobody accepted, and skipping it silently would hang
``spoold --drain`` and hide it from everyone. So it moves to
``quarantine/<name>`` (the bytes as they were) with
``quarantine/<name>.reason`` beside it, a :class:`QuarantineRecord` naming
the field and the problem.

Order: the reason first (durable), then one :func:`~spool.disk.tree.transfer` of
the file, which exactly one of several racing workers wins; a loser removes
the reason it wrote. A crash between the two leaves a reason without a file,
which fsck removes. Nothing is ever deleted: an operator reads the file,
fixes the cause and submits again.
"""

from __future__ import annotations

import errno
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec

from spool import kinds
from spool.core.faults import crashpoint
from spool.core.model import QuarantineRecord, encode, now
from spool.disk.records import read
from spool.disk.tree import NotRegular, Tree, make_dirs, read_regular, transfer, write_atomic

if TYPE_CHECKING:
    from spool import kinds

log = logging.getLogger("spool.queue.quarantine")

#: What a reason file's name ends with (job files end with ``.json``: never ambiguous).
REASON = ".reason"


class Damaged(Exception):
    """A job file that must not run: ``field`` is what is wrong."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason


def check(name: str, data: bytes, *, unresolved_ok: bool = False) -> kinds.Job:
    """The job in ``data``, read from a file called ``name``, if it may run; else :class:`Damaged`.

    Checks that it decodes as a job of a known kind, that the file is named
    for its job ID, and that ``recipe_hash`` is the hash of its spec.
    """
    try:
        job = kinds.decode_job(data)
    except msgspec.ValidationError as exc:
        raise Damaged("job", f"is not a valid job file ({exc})") from None
    except msgspec.DecodeError as exc:
        raise Damaged("job", f"is not valid JSON ({exc})") from None
    if name != f"{job.job_id}.json":
        raise Damaged("job_id", f"the file is named {name} but holds job {job.job_id}")
    want = kinds.of(job).spec_hash(job)
    if want != job.recipe_hash:
        raise Damaged(
            "recipe_hash",
            f"is {job.recipe_hash[:16]}... but the job's {job.operation} spec hashes to {want[:16]}...: "
            "the job file was changed after acceptance",
        )
    if not unresolved_ok and not job.resolved:
        waits = ", ".join(u.ref for u in job.upstreams if u.sha256 is None)
        raise Damaged(
            "upstreams", f"names sources from other jobs not yet frozen ({waits}): it belongs in waiting/"
        )
    return job


def load(path: Path, *, unresolved_ok: bool = False) -> kinds.Job:
    """Read and :func:`check` a job file in the queue. Raises :class:`Damaged`, or
    ``OSError`` when it cannot be read for a reason that may pass (gone, a NAS hiccup)."""
    try:
        data = read_regular(path)
    except NotRegular:
        raise Damaged("job", "is not a regular file (a FIFO, device or folder)") from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise Damaged("job", "is a symbolic link, not a job file") from None
        raise
    return check(path.name, data, unresolved_ok=unresolved_ok)


def quarantine(tree: Tree, src: Path, found_in: str, damage: Damaged, by: str) -> bool:
    """Move ``src`` into ``quarantine/`` with its reason; ``False`` if somebody else moved it first."""
    make_dirs(tree.quarantine)
    dst = tree.quarantine / src.name
    why = tree.quarantine / f"{src.name}{REASON}"
    rec = QuarantineRecord(
        file=src.name, found_in=found_in, field=damage.field, reason=damage.reason, by=by, at=now()
    )
    write_atomic(why, encode(rec))
    crashpoint("after_quarantine_reason")
    if dst.exists():  # the same name was quarantined before: keep both, never replace
        dst = tree.quarantine / f"{src.stem}.{int(now().timestamp())}.json"
    if not transfer(src, dst):
        try:
            os.unlink(why)
        except FileNotFoundError:
            pass
        return False
    log.error("quarantined %s/%s: %s: %s", found_in, src.name, damage.field, damage.reason)
    return True


def reason_of(tree: Tree, name: str) -> QuarantineRecord | None:
    rec: QuarantineRecord | None = read(tree.quarantine / f"{name}{REASON}", QuarantineRecord)
    return rec
