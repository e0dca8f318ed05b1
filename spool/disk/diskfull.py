"""A full spool disk: recognise it, say it in one line, and wait it out.

A full disk is not a bug and not bad input: nothing is wrong with the queue,
it just cannot grow. The daemon stops accepting and claiming, says so once,
retries with a bounded exponential backoff, and says so again when space is
back. ``spool status`` shows it from the filesystem itself (a daemon may not
even be able to write its heartbeat then).
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

#: Free bytes below which the spool's filesystem counts as full for status.
LOW_SPACE = 1 << 20


def is_disk_full(exc: BaseException) -> bool:
    """Whether ``exc`` says the disk (or the user's quota) is full."""
    return isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT)


def describe(exc: BaseException) -> str:
    """One line for a disk-full error: what could not be written, no traceback."""
    if isinstance(exc, OSError):
        where = f" writing {exc.filename}" if exc.filename else ""
        return f"{exc.strerror or 'disk full'}{where}"
    return str(exc)


def free_bytes(path: Path) -> tuple[int, int] | None:
    """(free bytes for unprivileged writers, total bytes) of the filesystem holding ``path``."""
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize


class Backoff:
    """Waits of ``first``, 2x, 4x ... seconds, at most ``most``; ``reset`` on success.
    (A plain class: ``spool status`` imports this module, and dataclasses imports inspect.)"""

    def __init__(self, first: float = 2.0, most: float = 30.0, failures: int = 0) -> None:
        self.first = first
        self.most = most
        self.failures = failures

    def next(self) -> float:
        wait = min(self.most, self.first * 2**self.failures)
        self.failures += 1
        return wait

    def reset(self) -> None:
        self.failures = 0
