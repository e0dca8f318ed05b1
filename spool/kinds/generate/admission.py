"""A provider whose quota is spent: its jobs wait in ``pending/`` instead of failing.

Runway answers a create with 429 when the organisation's daily quota is spent.
Sending the next job's create at once would only be refused again, and failing
the jobs would throw away a queue that is merely early. So the refusal pauses
the provider: ``providers/<name>/paused.json`` says until when and why, the
daemons claim none of its jobs before then (the gate of its pool, see
:meth:`spool.kinds.generate.runner.Runner.gate`), and ``spool status`` shows
the reason. The refused attempt ends *deferred*: it made nothing and does not
count against ``max_attempts``. When the time comes, one job is claimed and
tries; a fresh refusal pauses the provider again.
"""

from __future__ import annotations

import time
from pathlib import Path

import msgspec

from spool.core.model import Record, decode, encode
from spool.disk.tree import make_dirs, read_retrying, write_atomic


class Pause(Record, kw_only=True):
    """``providers/<name>/paused.json``: no create to this provider before ``until``."""

    provider: str
    until: float
    reason: str


def path(root: Path, provider: str) -> Path:
    return Path(root) / "providers" / provider / "paused.json"


def pause(root: Path, provider: str, until: float, reason: str) -> None:
    """Pause the provider until ``until`` (epoch seconds); a later pause replaces it."""
    target = path(root, provider)
    make_dirs(target.parent)
    write_atomic(target, encode(Pause(provider=provider, until=until, reason=reason)))


def paused(root: Path, provider: str, now: float | None = None) -> Pause | None:
    """The pause in force now, if any (one stat when there is none)."""
    try:
        p = decode(read_retrying(path(root, provider)), Pause)
    except (FileNotFoundError, msgspec.DecodeError, msgspec.ValidationError):
        return None
    return p if p.until > (time.time() if now is None else now) else None
