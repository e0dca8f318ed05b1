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
