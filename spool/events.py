"""The transition journal: one JSON line per transition in ``events/<writer>.jsonl``.

Each writer (a daemon's worker identity, or ``<host>-cli`` for commands run on
a host) has a file of its own, so writers on different hosts never append to
one file (``O_APPEND`` is not atomic across NFS clients). Processes on one
host that share the cli file serialise with a local ``flock``, which is
reliable there. The journal is a record for humans and scripts, not the source of
truth: the tree is. So a line is written but not fsynced.

Line format (documented in the README)::

    {"ts":"2026-11-29T20:13:03.123Z","job":"mug@1","from":"pending","to":"running",
     "attempt":1,"worker":"host-a","reason":"claimed"}
"""

from __future__ import annotations

import fcntl
import logging
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgspec

from .model import Event, decode, encode_line, now
from .secrets import redact
from .tree import HOST, Tree

log = logging.getLogger("spool.events")


def cli_writer() -> str:
    return f"{HOST}-cli"


class Journal:
    """Appends events for one writer; safe to share between threads."""

    def __init__(self, tree: Tree, writer: str) -> None:
        self.path = tree.events / f"{writer}.jsonl"
        self.writer = writer
        self._lock = threading.Lock()
        #: Called with every event after it is written (metrics, notifications).
        self.listeners: list[Callable[[Event], None]] = []

    def record(
        self,
        job: str,
        to: str,
        *,
        from_: str | None = None,
        attempt: int | None = None,
        worker: str | None = None,
        reason: str | None = None,
        **facts: Any,
    ) -> Event:
        """Append one transition; ``facts`` are Event's optional structured fields."""
        with self._lock:  # timestamps in file order, so readers can merge files
            ev = Event(
                ts=now(),
                job=job,
                to=to,
                from_=from_,
                attempt=attempt,
                worker=worker or self.writer,
                reason=redact(reason) if reason else reason,
                **facts,
            )
            line = encode_line(ev)
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)  # umask decides
            try:
                # flock, not portalocker: it is a one-liner here, and importing
                # portalocker costs a CLI call ~100 ms when redis is installed.
                fcntl.flock(fd, fcntl.LOCK_EX)
                os.write(fd, line)
            finally:
                os.close(fd)  # closing drops the lock
        for listen in self.listeners:
            try:
                listen(ev)
            except Exception:  # an observer must never break a transition
                log.exception("event listener failed")
        return ev


def read_file(path: Path) -> Iterator[Event]:
    """Events of one journal file; a torn or foreign line is skipped, not fatal."""
    try:
        f = open(path, "rb")  # noqa: SIM115 - closed by the with below
    except FileNotFoundError:
        return
    with f:
        for line in f:
            if not line.endswith(b"\n"):
                break  # a line still being written
            try:
                yield decode(line, Event)
            except msgspec.DecodeError:
                continue
