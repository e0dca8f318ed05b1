"""The transition journal a daemon keeps open (``Journal(keep_open=True)``): the same lines
as one opened per line, made durable by its commits, a torn tail ended, and a file moved
away by hand left for a new one at the same name without losing a line."""

from __future__ import annotations

import os

import pytest

from spool.disk.tree import Tree
from spool.queue import events
from spool.queue.events import Journal, read_file


def _lines(path: os.PathLike[str]) -> list[tuple[str, str]]:
    return [(e.job, e.to) for e in read_file(path)]  # type: ignore[arg-type]


@pytest.fixture
def fsyncs(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The files fsynced (by the name their descriptor had when fsynced)."""
    seen: list[str] = []
    real = os.fsync

    def watch(fd: int) -> None:
        seen.append(os.readlink(f"/proc/self/fd/{fd}"))
        real(fd)

    monkeypatch.setattr(os, "fsync", watch)
    return seen


def test_a_kept_journal_writes_each_line_without_opening_the_file_again(tree: Tree, monkeypatch, fsyncs):
    j = Journal(tree, "keep-w1", keep_open=True)
    j.record("a@1", "pending")  # opens the file once
    opened: list[str] = []
    real_open = os.open
    monkeypatch.setattr(os, "open", lambda p, *a, **k: opened.append(os.fspath(p)) or real_open(p, *a, **k))
    j.record("a@1", "running")
    j.commit()
    j.record("a@1", "complete")
    j.commit()
    assert [p for p in opened if p.endswith(".jsonl")] == []
    assert _lines(j.path) == [("a@1", "pending"), ("a@1", "running"), ("a@1", "complete")]
    assert j.fsyncs == 2 and fsyncs.count(str(j.path)) == 2
    j.close()
    j.record("b@1", "pending")  # closed: a line opens the file for itself again
    assert _lines(j.path)[-1] == ("b@1", "pending")


def test_a_kept_journal_ends_a_torn_tail_before_its_first_line(tree: Tree):
    path = tree.events / "keep-w2.jsonl"
    path.write_bytes(b'{"ts":"2026-01-01T00:00:00Z","job":"a@1","to":"pending"}\n{"ts":"2026-01-01T00:0')
    j = Journal(tree, "keep-w2", keep_open=True)
    j.record("b@1", "complete", reason="after the cut")
    j.record("c@1", "complete")
    j.close()
    assert _lines(path) == [("a@1", "pending"), ("b@1", "complete"), ("c@1", "complete")]


def test_a_kept_journal_moved_away_gets_a_new_file_and_loses_no_line(tree: Tree, monkeypatch, fsyncs):
    monkeypatch.setattr(events, "LOOK_AGAIN", 0.0)  # compare the name with the file at every line
    j = Journal(tree, "keep-w3", keep_open=True)
    j.record("a@1", "pending")
    rotated = tree.events / "keep-w3.jsonl.1"
    os.rename(j.path, rotated)  # rotated by hand while the daemon runs
    j.record("a@1", "running")
    j.commit()
    assert _lines(rotated) == [("a@1", "pending")]
    assert _lines(j.path) == [("a@1", "running")]
    # The moved file's line was made durable through the descriptor it was written with,
    # and the new file's by its own; the moved one is let go.
    assert str(rotated) in fsyncs and str(j.path) in fsyncs
    assert not [fd for fd in os.listdir("/proc/self/fd") if _target(fd) == str(rotated)]
    j.close()


def _target(fd: str) -> str:
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return ""


def _count_writes(monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    written: list[bytes] = []
    real_write = os.write

    def watch(fd: int, data: bytes) -> int:
        written.append(bytes(data))
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", watch)
    return written


@pytest.mark.parametrize("keep_open", [True, False])
def test_a_batch_writes_its_lines_at_once_and_tells_listeners_after(tree: Tree, monkeypatch, keep_open):
    """A publish or acceptance batch's lines reach the file in one write (a round trip each
    on a NAS), in the order recorded; listeners hear each only once it is in the file."""
    j = Journal(tree, "batch-w1", keep_open=keep_open)
    j.record("a@1", "pending")  # the first line looks at the tail: not counted below
    heard: list[tuple[str, list[tuple[str, str]]]] = []
    j.listeners.append(lambda ev: heard.append((ev.job, _lines(j.path))))
    written = _count_writes(monkeypatch)
    with j.batch():
        for k in range(5):
            j.record(f"b{k}@1", "complete")
        assert _lines(j.path) == [("a@1", "pending")]  # held until the batch ends
        assert heard == []
    assert len(written) == 1
    assert _lines(j.path) == [("a@1", "pending"), *((f"b{k}@1", "complete") for k in range(5))]
    assert [job for job, _ in heard] == [f"b{k}@1" for k in range(5)]
    assert all(len(seen) == 6 for _, seen in heard)  # each heard after the one write
    j.close()


def test_a_batch_cut_by_an_error_still_writes_the_lines_recorded(tree: Tree):
    """Each line tells of a transition already made: an error later in the batch's loop
    must not lose it."""
    j = Journal(tree, "batch-w2")
    heard: list[str] = []
    j.listeners.append(lambda ev: heard.append(ev.job))
    with pytest.raises(RuntimeError), j.batch():
        j.record("a@1", "complete")
        raise RuntimeError("the next job's line failed")
    assert _lines(j.path) == [("a@1", "complete")]
    assert heard == ["a@1"]  # written, so told


def test_lines_a_batch_could_not_write_are_told_to_nobody(tree: Tree, monkeypatch):
    j = Journal(tree, "batch-w4")
    j.record("a@1", "pending")
    heard: list[str] = []
    j.listeners.append(lambda ev: heard.append(ev.job))

    def full(fd: int, data: bytes) -> int:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "write", full)
    with pytest.raises(OSError), j.batch():
        j.record("b@1", "complete")
    monkeypatch.undo()
    assert heard == []
    assert _lines(j.path) == [("a@1", "pending")]


def test_another_threads_line_waits_for_a_batch_so_timestamps_stay_in_file_order(tree: Tree):
    import threading

    j = Journal(tree, "batch-w3")
    inside, other_done = threading.Event(), threading.Event()

    def other() -> None:
        inside.wait(10)
        j.record("o@1", "running")
        other_done.set()

    t = threading.Thread(target=other)
    t.start()
    with j.batch():
        j.record("a@1", "complete")
        inside.set()
        assert not other_done.wait(0.2)  # it waits for the batch's lock
        j.record("b@1", "complete")
    t.join(10)
    evs = list(read_file(j.path))
    assert [e.job for e in evs] == ["a@1", "b@1", "o@1"]
    assert [e.ts for e in evs] == sorted(e.ts for e in evs)
