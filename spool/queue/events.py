"""The transition journal: one JSON line per transition in ``events/<writer>.jsonl``.

Each writer (a daemon's worker identity, or ``<host>-cli`` for commands run on
a host) has a file of its own, so writers on different hosts never append to
one file (``O_APPEND`` is not atomic across NFS clients). Processes on one
host that share the cli file serialise with a local ``flock``, which is
reliable there, and open it per line. A daemon keeps its own file open (``keep_open``):
no other process writes under the worker identity it holds. The journal is a
record for humans and scripts, not the source of truth: the tree is.

Durability (SPEC 11, invariant 9): a line is written after the transition it
tells of is durable, and not fsynced on its own. It becomes durable with the
next group commit of this process: every folder fsync of the tree first fsyncs
the journals with lines not yet durable (:func:`spool.disk.tree.ride_folder_fsyncs`;
threads that ask at once share one fsync), and so do a daemon's heartbeat, its
stop and the end of a command. So a power cut loses at most the lines written
since the last fsync of the tree, never an older one; ``spool fsck`` rebuilds
from the tree the lines a cut took (:mod:`spool.repair.fsck`). A torn last line (a cut
in the middle of a write) is ended with a newline before this process appends,
so it never swallows the next line.

Line format (documented in docs/operations.md, "The events journal")::

    {"ts":"2026-11-29T20:13:03.123Z","job":"mug@1","from":"pending","to":"running",
     "attempt":1,"worker":"host-a","reason":"claimed"}
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgspec

from spool.core.model import Event, decode, encode_line, now
from spool.core.secrets import redact
from spool.disk.tree import HOST, Tree, ride_folder_fsyncs, stop_riding

log = logging.getLogger("spool.queue.events")


def cli_writer() -> str:
    return f"{HOST}-cli"


class _File:
    """One journal file as this process writes it: lines written, lines made durable.

    Shared by every :class:`Journal` of the same file in the process, so their
    commits share too; held strongly, so lines written by a journal object that
    is gone are still made durable by the next group commit."""

    def __init__(self, path: Path) -> None:
        self.path = path
        # One writer at a time, in file order; re-entrant for a batch (Journal.batch), whose
        # thread records its lines while holding it.
        self.lock = threading.RLock()
        #: A batch's events (and the journal each was recorded by), held until its one
        #: write (None: no batch open).
        self.held: list[tuple[Journal, Event]] | None = None
        self.sync_lock = threading.Lock()  # one fsync at a time; the next covers all who waited
        self.written = 0
        self.synced = 0
        self.checked_tail = False
        self.fsyncs = 0
        #: Kept open between lines (a daemon's own file, ``Journal(keep_open=True)``): what it holds, the
        #: file's identity, when the name was last compared with it, and descriptors of a
        #: file moved away, fsynced by the next commit and then closed.
        self.keep_open = False
        self._fd: int | None = None
        self._ident: tuple[int, int] | None = None
        self._looked = 0.0
        self._retired: list[int] = []

    def append(self, line: bytes) -> None:
        """Write one line (called with ``lock`` held); it rides on the next group commit."""
        if self.keep_open:
            # No flock: a kept file is a daemon's own, named by the worker identity it holds
            # (spool.queue.workers), so no other process appends to it.
            self._write(self._kept(), line)
            return
        rw = os.O_WRONLY if self.checked_tail else os.O_RDWR  # the first write reads the tail
        fd = os.open(self.path, rw | os.O_APPEND | os.O_CREAT, 0o666)  # umask decides
        try:
            # flock, not portalocker: it is a one-liner here, and importing
            # portalocker costs a CLI call ~100 ms when redis is installed.
            fcntl.flock(fd, fcntl.LOCK_EX)
            self._write(fd, line)
        finally:
            os.close(fd)  # closing drops the lock

    def _write(self, fd: int, lines: bytes) -> None:
        """Whole lines at the end of the open file (a torn tail ended first, once per file)."""
        if not self.checked_tail:
            _end_torn_tail(fd)
            self.checked_tail = True
        os.write(fd, lines)
        self.written += 1
        ride_folder_fsyncs(self)

    def _kept(self) -> int:
        """The kept descriptor (called with ``lock`` held). At most every
        :data:`LOOK_AGAIN` seconds the name is compared with it: a file moved away or
        removed (rotated by hand) is left for a new one at the same name; its lines are
        still made durable by the next commit."""
        now = time.monotonic()
        if self._fd is not None and now - self._looked < LOOK_AGAIN:
            return self._fd
        self._looked = now
        try:
            st = os.stat(self.path)
            ident: tuple[int, int] | None = (st.st_dev, st.st_ino)
        except FileNotFoundError:
            ident = None
        if self._fd is not None:
            if ident == self._ident:
                return self._fd
            self._retired.append(self._fd)
        fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o666)  # umask decides
        st = os.fstat(fd)
        self._fd, self._ident = fd, (st.st_dev, st.st_ino)
        self.checked_tail = False  # another file: its tail is looked at once
        return fd

    def close(self) -> None:
        """Close the kept file (commit first: lines not yet durable stay so); later lines open it per line."""
        with self.sync_lock, self.lock:
            for fd in [*self._retired, *([self._fd] if self._fd is not None else [])]:
                os.close(fd)
            self._fd, self._ident, self._retired, self.keep_open = None, None, [], False

    def commit(self) -> None:
        """Make every line written so far durable: one fsync, unless none is needed.

        Threads that ask while an fsync runs wait for it, and the first of them
        then fsyncs once for all (an fsync covers every line written before it
        began), so concurrent commits share."""
        if self.synced >= self.written:
            return
        with self.sync_lock:
            want = self.written  # every line counted here was written before the fsync below
            if self.synced < want:
                with self.lock:
                    kept, retired, self._retired = self._fd, self._retired, []
                for fd in retired:  # a kept file moved away: its last lines, then let go
                    _fsync_and_close(fd)
                if kept is not None:
                    os.fsync(kept)
                    self.fsyncs += 1
                else:
                    try:
                        _fsync_and_close(os.open(self.path, os.O_WRONLY | os.O_APPEND))
                        self.fsyncs += 1
                    except FileNotFoundError:
                        pass  # removed (a test's tidy-up): nothing left to make durable
                self.synced = max(self.synced, want)
        with self.lock:  # a line written meanwhile rides again (append adds it under this lock)
            if self.synced >= self.written:
                stop_riding(self)


#: How often a kept journal's name is compared with the file it holds (seconds).
LOOK_AGAIN = 1.0

_files: dict[Path, _File] = {}
_files_lock = threading.Lock()


def _file(path: Path) -> _File:
    with _files_lock:
        f = _files.get(path)
        if f is None:
            f = _files[path] = _File(path)
        return f


class Journal:
    """Appends events for one writer; safe to share between threads."""

    def __init__(self, tree: Tree, writer: str, *, keep_open: bool = False) -> None:
        """``keep_open``: the file stays open between lines (a daemon's own journal: one
        open and close fewer a line, and a commit's; a round trip each on a NAS); the
        owner calls :meth:`close` when done."""
        self.path = tree.events / f"{writer}.jsonl"
        self.writer = writer
        self._file = _file(self.path)
        if keep_open:
            self._file.keep_open = True
        #: Called with every event after it is written (metrics, notifications).
        self.listeners: list[Callable[[Event], None]] = []

    @property
    def fsyncs(self) -> int:
        """fsyncs of the journal file this process issued (the cost, for benchmarks and tests)."""
        return self._file.fsyncs

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
        f = self._file
        with f.lock:  # timestamps in file order, so readers can merge files
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
            if f.held is not None:
                f.held.append((self, ev))  # written, then told, when the batch ends
                return ev
            f.append(encode_line(ev))
        self._tell(ev)
        return ev

    @contextlib.contextmanager
    def batch(self) -> Iterator[None]:
        """The lines recorded inside (a publish or acceptance batch's, one a job) reach the
        file in one write at the end: one round trip on a NAS, not one a line. The file's
        lock is held meanwhile (another thread's line waits, so timestamps stay in file
        order); listeners hear each line after that write. Lines recorded before an error
        inside are still written: each tells of a transition already made. Keep the body
        short: a loop of :meth:`record` calls."""
        f = self._file
        written: list[tuple[Journal, Event]] = []  # told once in the file, error or not
        try:
            with f.lock:
                if f.held is not None:  # inside another batch of this file: that one writes
                    yield
                    return
                f.held = []
                try:
                    yield
                finally:
                    held, f.held = f.held, None
                    if held:
                        f.append(b"".join(encode_line(ev) for _, ev in held))  # fails: none told
                    written = held
        finally:
            for journal, ev in written:
                journal._tell(ev)

    def _tell(self, ev: Event) -> None:
        for listen in self.listeners:
            try:
                listen(ev)
            except Exception:  # an observer must never break a transition
                log.exception("event listener failed")

    def commit(self) -> None:
        """Make every line of this journal's file written so far durable (see :class:`_File`)."""
        self._file.commit()

    def close(self) -> None:
        """Make the lines durable and close the kept file (``keep_open``); later lines open it again."""
        self._file.commit()
        self._file.close()


def _fsync_and_close(fd: int) -> None:
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _end_torn_tail(fd: int) -> None:
    """If the file ends inside a line (a cut in the middle of a write), end that
    line, so the fragment stays one skipped line and the next line is whole."""
    size = os.fstat(fd).st_size
    if size and os.pread(fd, 1, size - 1) != b"\n":
        os.write(fd, b"\n")


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
