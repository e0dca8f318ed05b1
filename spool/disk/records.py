"""Reading a record file that may be missing, half-replaced or written by another host.

The one reader every part of spool uses for its own records (jobs, attempts,
heartbeats, manifests): it never raises, and it rides out what NAS clients do
while another host replaces a file.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import msgspec

from spool.core.model import decode
from spool.disk.tree import READ_RETRY_PAUSES, read_retrying


def read(path: Path, typ: Any, *, replaced: bool = False) -> Any:
    """A record of type ``typ`` (a Struct or a union of them), or ``None`` if the
    file is missing or unreadable (never raises).

    Records may be written by another host, and some are replaced while we read
    (heartbeats, progress). Transient NAS errnos are retried (``read_retrying``),
    and so is a read that decodes as truncated JSON: a FUSE client that cached
    the old file's size can hand out a short read of the new one for a moment
    (measured on sshfs: the next read is whole). ``replaced=True`` marks a file
    that is rewritten in place, where a missing file is retried too: sshfs
    answers ENOENT to a reader on the writer's own mount while it replaces it.

    An empty or torn record left by a power cut (the file's name was durable, its
    bytes were not: SPEC 11.9) reads as ``None`` too, at once once the file is
    older than :data:`SETTLED` seconds: nobody is replacing it, so no retry helps.
    """
    for pause in (*READ_RETRY_PAUSES, None):
        try:
            return decode(read_retrying(path), typ)
        except FileNotFoundError:
            if pause is None or not replaced:
                return None
        except OSError:
            return None
        except msgspec.DecodeError as exc:
            if pause is None or "truncated" not in str(exc) or settled(path):
                return None
        time.sleep(pause)
    return None


#: A record not modified for this long is not being replaced right now (seconds).
SETTLED = 5.0


def settled(path: Path) -> bool:
    """Whether ``path`` was last changed more than :data:`SETTLED` seconds ago."""
    try:
        return time.time() - path.stat().st_mtime > SETTLED
    except OSError:
        return False


def damaged(path: Path, typ: Any = None) -> str | None:
    """Why an existing record file cannot be read: ``"empty"`` (no bytes, or only NULs and
    blanks: a cut kept the name, not the bytes) or ``"torn"`` (not JSON, or with ``typ``
    not that record); ``None`` when it reads, or is gone. For ``spool fsck`` and
    ``spool show``: the records a power cut may leave empty (SPEC 11.9)."""
    try:
        data = path.read_bytes()
    except OSError:
        return None
    if not data.strip(b"\0 \n\t\r"):
        return "empty"
    try:
        if typ is None:
            msgspec.json.decode(data)
        else:
            decode(data, typ)
    except msgspec.DecodeError:
        return "torn"
    return None
