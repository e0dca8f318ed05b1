"""The tree's format: which layout the files of one spool follow, and which one to write.

A spool records its format in ``FORMAT`` at its root: one integer on the first
line, then a line saying what it is, so ``cat FORMAT`` answers a person too. A
spool without the file is format 1 (every spool made before the file existed).

* **Format 1**: each job's attempt record (``attempt.json``) is durable before
  the attempt starts, its staged result is ``result.json``, the frozen copy of
  the job file is a file of its own, and publishing writes every library entry
  of a job durably (``index/<tag>/<value>/<job>``, ``index/_sha256/<sha256>/<job>``,
  ``library/<name>/<rev>``), one job at a time.
* **Format 2** (issue 25, ARCHITECTURE.md "What each fsync protects"): the frozen
  copy is a second name of the job file; slot attempts are opened by the claim
  batch and their record is durable only through what ends them (the manifest,
  which carries the attempt's identity, or ``failure.json``/``interrupted.json``);
  the staged result is in ``attempt.json``; a daemon publishes the jobs that end
  close together as one batch, and their library entries are one durable index
  segment (``index/_segments/``), merged later into entries in shared folders
  (:mod:`spool.library.segments`).

Every reader reads both formats, always: during a rolling upgrade old and new
daemons write into one spool. A writer writes the tree's format (``spool
migrate`` moves a tree to the next), and refuses a tree newer than it knows.
``SPOOL_WRITE_FORMAT=1`` makes a process write format 1 whatever the tree says:
what a daemon of the old code does, for rolling-upgrade tests and the benchmark's
side-by-side rows.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from spool.core.errors import SpoolError
from spool.disk.durable import write_atomic

#: The newest format this code reads and writes.
CURRENT = 2
#: The format of a spool without a ``FORMAT`` file.
ORIGINAL = 1
#: The file at the spool's root.
FILE = "FORMAT"
#: Forces the format a process writes (1 or 2): old code's behaviour, for tests and benchmarks.
ENV = "SPOOL_WRITE_FORMAT"

_TEXT = {
    1: "spool tree format 1",
    2: "spool tree format 2: attempt records and library index segments (issue 25)",
}


class TooNew(SpoolError):
    """The tree was written by a newer spool: this one must not write into it."""


class Unreadable(SpoolError):
    """``FORMAT`` exists but does not say a format."""


def path(root: Path) -> Path:
    return root / FILE


def parse(data: bytes) -> int | None:
    """The format a ``FORMAT`` file's bytes name, or ``None`` (empty or damaged)."""
    try:
        first = data.decode("ascii").strip().splitlines()[0].strip()
    except (UnicodeDecodeError, IndexError):
        return None
    return int(first) if first.isdigit() and 0 < int(first) < 1000 else None


def read(root: Path) -> int:
    """The tree's format (``ORIGINAL`` without the file). Raises :class:`Unreadable`
    for a file that names none: guessing would let a writer pick the wrong layout."""
    try:
        data = path(root).read_bytes()
    except FileNotFoundError:
        return ORIGINAL
    except OSError as exc:
        raise Unreadable(f"{path(root)} cannot be read ({exc.strerror})") from None
    n = parse(data)
    if n is None:
        raise Unreadable(f"{path(root)} does not name a format (its first line must be a number, like 2)")
    return n


def check(root: Path) -> int:
    """The tree's format, if this code knows it; :class:`TooNew` with what to do if not."""
    n = read(root)
    if n > CURRENT:
        raise TooNew(
            f"{root} is a spool of tree format {n}, newer than the format {CURRENT} this spool "
            f"({_version()}) knows: upgrade spool on this host before running it here "
            f"(nothing was written)"
        )
    return n


def _version() -> str:
    try:
        from importlib.metadata import version

        return f"version {version('spool')}"
    except Exception:  # an uninstalled checkout
        return "this checkout"


def forced() -> int | None:
    """The format ``SPOOL_WRITE_FORMAT`` forces this process to write, if it is set."""
    raw = os.environ.get(ENV, "")
    if not raw:
        return None
    if raw not in {str(n) for n in range(ORIGINAL, CURRENT + 1)}:
        raise SpoolError(f"{ENV}={raw!r} is not a format this spool writes ({ORIGINAL} to {CURRENT})")
    return int(raw)


#: root -> (format, monotonic time read, what ``FORMAT`` looked like then).
_cache: dict[Path, tuple[int, float, tuple[int, int, int, int] | None]] = {}
#: How long a writer trusts what it read (seconds): ``spool migrate`` is seen within it.
RECHECK = 1.0


def writing(root: Path, *, fresh: bool = False) -> int:
    """The format a writer in this process writes into the tree at ``root``: the tree's
    (looked at at most once a second, so a migration is taken up while running), unless
    :data:`ENV` forces one. Raises :class:`TooNew` for a tree newer than this code.

    After the first read, a look is a stat: ``FORMAT`` is read again only when it shows
    another file, size or time (it is only ever replaced whole, by a rename, so a new
    format is a new file). Over a NAS a stat is one round trip where a read is three
    (open, read, close): an idle daemon looked every 2 s."""
    f = forced()
    if f is not None:
        return f
    now = time.monotonic()
    hit = _cache.get(root)
    if hit is not None and not fresh and now - hit[1] < RECHECK:
        return hit[0]
    looks = _looks(root)  # before a read: a replace in between is seen at the next look
    n = hit[0] if hit is not None and not fresh and looks == hit[2] else check(root)
    _cache[root] = (n, now, looks)
    return n


def _looks(root: Path) -> tuple[int, int, int, int] | None:
    """``FORMAT``'s inode, size, mtime and ctime (``None``: no such file, format 1)."""
    try:
        st = os.stat(path(root))
    except FileNotFoundError:
        return None
    except OSError:
        return (-1, -1, -1, -1)  # unreadable: never equal to a look that was read
    return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def write(root: Path, n: int) -> None:
    """Record format ``n`` durably (the last step of creating or migrating a tree)."""
    write_atomic(path(root), f"{n}\n{_TEXT.get(n, f'spool tree format {n}')}\n".encode())
    _cache.pop(root, None)
