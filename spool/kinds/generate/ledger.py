"""The ledger of provider jobs: which attempt of which spool job each one belongs to.

A provider job ID is entered once, by the first attempt that records it, in
``providers/<provider>/jobs/<id>.json`` (written whole, linked exclusively: one
winner on one host or across NAS clients). It is entered before the attempt's
move to ``generating`` is made durable, so the ledger holds every provider job
any attempt ever ran.

It answers the adoption rule's first question: a job found by a lookup after a
lost create reply may be adopted only if no *other* attempt of any job in this
spool has recorded it (two jobs with the same prompt never publish one
prediction; attempt 2 never takes attempt 1's late result). An attempt that
inherits its predecessor's job (a re-download) does not go through the ledger:
the inheritance is recorded in its own ``generating`` record.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import quote

import msgspec

from spool.core.model import Record, decode, encode, now
from spool.disk.tree import make_dirs, read_retrying, write_atomic


class Entry(Record, kw_only=True):
    """``providers/<provider>/jobs/<id>.json``: the attempt a provider job belongs to."""

    provider: str
    provider_job_id: str
    job: str
    attempt: int
    #: ``created`` or ``adopted``.
    how: str
    at: float


def folder(root: Path, provider: str) -> Path:
    return Path(root) / "providers" / provider / "jobs"


def path(root: Path, provider: str, provider_job_id: str) -> Path:
    # Provider IDs are URL-safe in practice; quoting keeps any other one a single file name.
    return folder(root, provider) / f"{quote(provider_job_id, safe='')}.json"


def owner(root: Path, provider: str, provider_job_id: str) -> Entry | None:
    """Who recorded this provider job (``None``: nobody in this spool)."""
    try:
        return decode(read_retrying(path(root, provider, provider_job_id)), Entry)
    except FileNotFoundError:
        return None
    except (msgspec.DecodeError, msgspec.ValidationError):
        # Written whole before it is visible: unreadable only if damaged. Someone had it.
        return Entry(provider=provider, provider_job_id=provider_job_id, job="?", attempt=0, how="?", at=0.0)


def enter(root: Path, provider: str, provider_job_id: str, job: str, attempt: int, how: str) -> Entry:
    """Record the job for this attempt (durably) and return the entry that stands: this
    attempt's, or the one another attempt made first."""
    entry = Entry(
        provider=provider, provider_job_id=provider_job_id, job=job, attempt=attempt, how=how,
        at=now().timestamp(),
    )  # fmt: skip
    target = path(root, provider, provider_job_id)
    make_dirs(target.parent)
    try:
        write_atomic(target, encode(entry), replace=False)
    except FileExistsError:
        return owner(root, provider, provider_job_id) or entry
    return entry


def ours(entry: Entry | None, job: str, attempt: int) -> bool:
    return entry is not None and entry.job == job and entry.attempt == attempt
