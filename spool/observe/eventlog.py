"""Reading the transition journal: one job's story, every writer merged in time
order, and following it live like ``tail -f``.

:mod:`spool.queue.events` writes ``events/<writer>.jsonl``, one file per writer;
this module only reads, and never locks. Invariants a reader relies on:

* a line is complete once it ends in a newline; a torn last line is left for
  the next read (it is being written);
* each file is in time order; files are merged by ``ts``;
* a file only grows. If it shrinks or is replaced (a future ``spool gc``
  compacting the journal), it is read again from the start.

While following, the lines that arrived since the last poll are sorted by
``ts`` before they are handed out, so lines that different writers wrote at
about the same time come out in order; a line that reaches this host late
(a slow network mount) is handed out when it arrives.

Filtering by job looks for the job's JSON-encoded ID in the raw bytes before
decoding anything, so ``spool show`` on a spool of 100,000 jobs decodes only
that job's lines.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import msgspec

from spool.core.model import Event, decode
from spool.disk.tree import Tree

#: How much of a journal file is read at once.
_CHUNK = 8 << 20


@dataclass(frozen=True)
class Line:
    """One journal line: the decoded event and the bytes exactly as stored."""

    event: Event
    raw: bytes


def _needle(job: str) -> bytes:
    # Event encodes ``job`` as its second field with no whitespace (spool.core.model.encode_line).
    return b'"job":' + msgspec.json.encode(job)


def _decode(raw: bytes, job: str | None) -> Line | None:
    try:
        ev = decode(raw, Event)
    except msgspec.DecodeError:
        return None  # a foreign or damaged line is skipped, never fatal
    if job is not None and ev.job != job:
        return None
    return Line(ev, raw if raw.endswith(b"\n") else raw + b"\n")


def _lines(data: bytes, job: str | None) -> Iterable[Line]:
    """Complete lines of ``data`` (which ends at a newline) that match ``job``."""
    if job is None:
        for raw in data.splitlines(keepends=True):
            line = _decode(raw, None)
            if line is not None:
                yield line
        return
    needle = _needle(job)
    pos = 0
    while (i := data.find(needle, pos)) >= 0:
        start = data.rfind(b"\n", 0, i) + 1
        end = data.find(b"\n", i) + 1
        pos = end
        line = _decode(data[start:end], job)
        if line is not None:
            yield line


def read_from(path: Path, offset: int, job: str | None = None) -> tuple[list[Line], int]:
    """Complete lines of one file from byte ``offset``, and the offset after the
    last complete line (where the next read starts)."""
    out: list[Line] = []
    try:
        f = open(path, "rb")  # noqa: SIM115 - closed by the with below
    except FileNotFoundError:
        return out, offset
    with f:
        f.seek(offset)
        rest = b""
        while chunk := f.read(_CHUNK):
            data = rest + chunk
            cut = data.rfind(b"\n") + 1
            out.extend(_lines(data[:cut], job))
            offset += cut
            rest = data[cut:]
    return out, offset


@dataclass
class Follower:
    """Reads the whole journal once, then only what was appended since.

    ``poll()`` returns new lines (the first call: the whole history), merged
    in time order. New writer files are picked up as they appear.
    """

    tree: Tree
    job: str | None = None
    _seen: dict[str, tuple[int, int]] = field(default_factory=dict)  # file -> (inode, offset)

    def poll(self) -> list[Line]:
        batch: list[Line] = []
        try:
            with os.scandir(self.tree.events) as it:
                entries = [e for e in it if e.name.endswith(".jsonl") and not e.name.startswith(".")]
        except FileNotFoundError:
            return batch
        for e in sorted(entries, key=lambda e: e.name):
            try:
                st = e.stat()
            except FileNotFoundError:
                continue
            ino, offset = self._seen.get(e.name, (st.st_ino, 0))
            if ino != st.st_ino or st.st_size < offset:
                ino, offset = st.st_ino, 0  # replaced or compacted: read it again
            if st.st_size > offset:
                lines, offset = read_from(Path(e.path), offset, self.job)
                batch.extend(lines)
            self._seen[e.name] = (ino, offset)
        # Each file is already in order: Python's sort merges such runs in linear time.
        batch.sort(key=lambda line: line.event.ts)
        return batch


def history(tree: Tree, job: str | None = None) -> list[Event]:
    """Every event (of one job, if given) of every writer, in time order."""
    return [line.event for line in Follower(tree, job).poll()]
