"""Readers of records that other hosts replace, and liveness across mounts of one host.

What a NAS client does to a reader of a record that another process is
replacing (a short read, ESTALE, a moment's ENOENT) is faked here; a worker
whose identity lock was taken through another mount is played by a process
that keeps the lock file open without the lock being visible.
"""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from spool import liveness, status
from spool import tree as tree_mod
from spool.model import WorkerRecord, encode, now
from spool.tree import HOST, Tree, boot_id, write_atomic

# -- readers of records that other hosts replace (no mounts needed) -----------------------


def _worker_record(tree: Tree, worker: str, pid: int) -> WorkerRecord:
    rec = WorkerRecord(
        worker=worker,
        host=HOST,
        pid=pid,
        boot_id=boot_id(),
        started_at=now(),
        heartbeat_at=now(),
        beats=1,
        max_active=1,
    )
    write_atomic(tree.worker_file(worker), encode(rec))
    return rec


def test_read_retries_a_short_read(tree, monkeypatch):
    """A FUSE client that cached the old file's size can return a short read of a
    record being replaced; the next read is whole."""
    rec = _worker_record(tree, f"{HOST}-r", 1)
    whole = tree.worker_file(rec.worker).read_bytes()
    answers: list[bytes | OSError] = [whole[:10], whole[:30], whole]

    def flaky(path: Path) -> bytes:
        a = answers.pop(0)
        if isinstance(a, OSError):
            raise a
        return a

    monkeypatch.setattr(status, "read_retrying", flaky)
    assert status.read(tree.worker_file(rec.worker), WorkerRecord) == rec
    # malformed (not merely short) content is not retried: it is just unreadable
    answers[:] = [b"{not json", whole]
    assert status.read(tree.worker_file(rec.worker), WorkerRecord) is None


def test_tree_read_retrying_retries_transient_errnos_then_gives_up(tmp_path, monkeypatch):
    (tmp_path / "x").write_bytes(b"data")
    real_open = open
    stale = [OSError(errno.ESTALE, "stale"), OSError(errno.EFAULT, "bad address")]

    def flaky_open(path: object, mode: str = "r") -> object:
        if stale:
            raise stale.pop(0)
        return real_open(path, mode)  # type: ignore[call-overload]

    monkeypatch.setattr(tree_mod, "open", flaky_open, raising=False)
    assert tree_mod.read_retrying(tmp_path / "x") == b"data"
    calls = []

    def failing_open(path: object, mode: str = "r") -> object:
        calls.append(path)
        raise OSError(errno.EIO, "I/O error")

    monkeypatch.setattr(tree_mod, "open", failing_open, raising=False)
    with pytest.raises(OSError) as err:
        tree_mod.read_retrying(tmp_path / "x")
    assert err.value.errno == errno.EIO and len(calls) == len(tree_mod.READ_RETRY_PAUSES) + 1
    calls.clear()
    monkeypatch.setattr(tree_mod, "open", lambda p, m="r": (_ for _ in ()).throw(FileNotFoundError(p)))
    with pytest.raises(FileNotFoundError):
        tree_mod.read_retrying(tmp_path / "x")  # missing is an answer, at once


def test_a_heartbeat_caught_mid_replace_is_not_a_missing_worker(tree, monkeypatch):
    rec = _worker_record(tree, f"{HOST}-beating", os.getpid())
    whole = tree.worker_file(rec.worker).read_bytes()
    answers: list[bytes | OSError] = [FileNotFoundError(errno.ENOENT, "gone for a moment"), whole]

    def flaky(path: Path) -> bytes:
        a = answers.pop(0) if answers else whole
        if isinstance(a, OSError):
            raise a
        return a

    monkeypatch.setattr(status, "read_retrying", flaky)
    assert status.read(tree.worker_file(rec.worker), WorkerRecord, replaced=True) == rec
    answers[:] = [FileNotFoundError(errno.ENOENT, "gone")]
    assert status.read(tree.worker_file(rec.worker), WorkerRecord) is None  # other records: absent


def test_a_live_worker_whose_lock_cannot_be_seen_is_alive(tree):
    """A lock taken through another mount of the export is invisible here; the
    process keeping the identity's lock file open is evidence enough."""
    worker = f"{HOST}-elsewhere"
    lock = tree.worker_lock(worker)
    lock.touch()
    holder = subprocess.Popen(
        [sys.executable, "-c", f"import time; f = open({str(lock)!r}, 'rb'); time.sleep(60)"]
    )
    try:
        deadline = time.monotonic() + 10
        while not liveness.has_lock_open(holder.pid, worker):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        rec = _worker_record(tree, worker, holder.pid)
        assert not liveness.holds_identity(tree, worker)  # no lock visible through this path
        assert liveness.assess(tree, rec, 60).health == "alive"
    finally:
        holder.kill()
        holder.wait()
    assert liveness.assess(tree, rec, 60).health == "dead"
