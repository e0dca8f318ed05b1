"""Group commit: shared folder fsyncs, real threads, real fsyncs on a real folder."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import run_cli, wait_for
from libhelp import allow_noop, noop_sub, tags_for

from spool.disk import groupcommit
from spool.disk.groupcommit import Coalescer, fsync_folder_now, together
from spool.disk.tree import Tree, fsync_dir, visible_names
from spool.queue import accept
from spool.queue.events import Journal


class Watched:
    """The real folder fsync, with when each one started and ended; ``hold`` keeps
    the next fsync from finishing until it is set."""

    def __init__(self) -> None:
        self.spans: list[tuple[float, float]] = []
        self.folders: list[str] = []
        self.hold: threading.Event | None = None
        self.started = threading.Event()
        self._lock = threading.Lock()

    def __call__(self, folder: str) -> None:
        t0 = time.monotonic()
        self.started.set()
        hold, self.hold = self.hold, None
        if hold is not None:
            assert hold.wait(5)
        fsync_folder_now(folder)
        with self._lock:
            self.spans.append((t0, time.monotonic()))
            self.folders.append(os.path.basename(folder))


@pytest.fixture(autouse=True)
def _no_coalescer_left() -> Iterator[None]:
    """A coalescer a test installs goes with it: left installed, it would fsync with the
    test's own function in later tests of the same process."""
    yield
    groupcommit.install(None)


@pytest.fixture
def watched() -> Iterator[Watched]:
    w = Watched()
    yield w
    groupcommit.install(None)


def test_a_lone_request_is_not_delayed_by_the_window(tmp_path: Path, watched: Watched):
    c = Coalescer(window=0.5, fsync=watched)
    t0 = time.monotonic()
    c.sync(tmp_path)
    assert time.monotonic() - t0 < 0.25  # far less than the half-second window
    assert (c.calls, c.requests) == (1, 1)


def test_threads_syncing_one_folder_share_fsyncs(tmp_path: Path, watched: Watched):
    c = Coalescer(window=0.05, fsync=watched)
    n = 8
    go = threading.Barrier(n)
    asked: dict[int, float] = {}
    answered: dict[int, float] = {}

    def one(i: int) -> None:
        (tmp_path / f"f{i}").touch()
        go.wait()
        asked[i] = time.monotonic()
        c.sync(tmp_path)
        answered[i] = time.monotonic()

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert c.requests == n
    assert 1 <= c.calls < n, f"{c.calls} fsyncs for {n} requests: nothing was shared"
    assert c.calls == len(watched.spans)
    for i in range(n):  # each answer came from an fsync that started after the request
        assert any(asked[i] <= s and e <= answered[i] for s, e in watched.spans), i


def test_a_request_made_during_an_fsync_waits_for_the_next_one(tmp_path: Path, watched: Watched):
    c = Coalescer(window=0.0, fsync=watched)
    hold = watched.hold = threading.Event()
    first = threading.Thread(target=c.sync, args=(tmp_path,))
    first.start()
    assert watched.started.wait(5)  # the first fsync has begun and is held
    asked = time.monotonic()
    done = threading.Event()
    second = threading.Thread(target=lambda: (c.sync(tmp_path), done.set()))
    second.start()
    time.sleep(0.05)
    assert not done.is_set(), "answered by an fsync that began before the request"
    hold.set()
    first.join(5)
    second.join(5)
    assert done.is_set()
    assert c.calls == 2
    assert watched.spans[1][0] >= asked  # the second request's fsync started after it asked


def test_a_failed_fsync_is_raised_and_a_follower_tries_again(tmp_path: Path):
    calls: list[str] = []
    hold = threading.Event()

    def flaky(folder: str) -> None:
        calls.append(folder)
        if len(calls) == 1:
            hold.wait(5)
            raise OSError(5, "I/O error")
        fsync_folder_now(folder)

    c = Coalescer(window=0.0, fsync=flaky)
    errors: list[BaseException] = []

    def leader() -> None:
        try:
            c.sync(tmp_path)
        except OSError as exc:
            errors.append(exc)

    t1 = threading.Thread(target=leader)
    t1.start()
    while not calls:
        time.sleep(0.001)
    t2 = threading.Thread(target=c.sync, args=(tmp_path,))
    t2.start()
    hold.set()
    t1.join(5)
    t2.join(5)
    assert len(errors) == 1 and errors[0].errno == 5
    assert len(calls) == 2 and c.calls == 1  # the follower's own fsync succeeded


def test_a_batch_fsyncs_each_folder_once_when_it_ends(tmp_path: Path, watched: Watched):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    groupcommit.install(Coalescer(fsync=watched))
    with together():
        for i in range(5):
            (a / str(i)).touch()
            fsync_dir(a)
            (b / str(i)).touch()
            fsync_dir(b)
        assert watched.folders == [], "nothing is synced before the batch ends"
    assert watched.folders == ["a", "b"]


def test_without_a_coalescer_every_fsync_is_plain_and_immediate(tmp_path: Path, watched: Watched):
    groupcommit.install(None)
    fsync_dir(tmp_path)  # no coalescer: straight to fsync(2), nothing recorded anywhere
    assert groupcommit.installed() is None
    assert watched.spans == []


# -- crash points inside a batch: a real daemon, SIGKILLed there ------------------------------


def _drop(tree: Tree, names: list[str]) -> None:
    for name in names:
        tmp = tree.incoming / f".{name}.tmp"
        tmp.write_bytes(noop_sub(name, tags=tags_for(0)))
        os.rename(tmp, tree.incoming / f"{name}.json")


def _taken(tree: Tree) -> list[str]:
    """The drops in incoming/, all under a worker's claim name (the names they were dropped as)."""
    names = os.listdir(tree.incoming)
    assert all(n.startswith(".accepting.") for n in names), names
    return sorted(n.split(".")[-2] for n in names)


def _running(tree: Tree) -> list[str]:
    return sorted(p.name for p in tree.running.glob("*/*.json"))


def _journal(tree: Tree) -> list[dict[str, Any]]:
    lines = []
    for p in sorted(tree.events.glob("*.jsonl")):
        lines += [json.loads(ln) for ln in p.read_text().splitlines() if ln.strip()]
    return lines


def _drained_once_each(
    tree: Tree, daemons: Callable[..., Any], names: list[str], env: dict[str, str] | None = None
) -> None:
    """Restart the daemon and drain: every job complete exactly once, nothing rejected."""
    d = daemons(tree, "w1", drain=True, env=env or {})
    assert d.wait(timeout=60) == 0, d.output()
    assert sorted(visible_names(tree.complete)) == [f"{n}@1.json" for n in names]
    for state in ("pending", "failed", "rejected"):
        assert list(visible_names(tree.root / state)) == [], state
    assert os.listdir(tree.incoming) == []
    accepted = [e["job"] for e in _journal(tree) if e["to"] == "pending"]
    assert sorted(set(accepted)) == [f"{n}@1" for n in names]  # the journal has each acceptance
    for n in names:
        assert tree.attempt_numbers(f"{n}@1") == [1]  # accepted once, run once


def test_a_crash_mid_accept_batch_keeps_every_drop_and_accepts_each_once(tree: Tree, daemons):
    allow_noop(tree)
    names = ["gc-a", "gc-b", "gc-c"]
    _drop(tree, names)
    d = daemons(tree, "w1", drain=True, env={"SPOOL_CRASH_AT": "mid_accept_batch"})
    assert d.wait(timeout=60) == -9  # SIGKILLed itself at the crash point
    # The job files are written but nothing was told: every drop is still there
    # (under the worker's claim name) and no journal line says "accepted".
    assert sorted(visible_names(tree.pending)) == [f"{n}@1.json" for n in names]
    assert _taken(tree) == names
    assert [e for e in _journal(tree) if e["to"] == "pending"] == []
    _drained_once_each(tree, daemons, names)


@pytest.mark.parametrize("fmt", ["1", "2"])
def test_a_crash_between_a_job_file_and_its_frozen_copy_makes_the_copy_at_redelivery(
    tree: Tree, daemons, fmt: str
):
    """Killed after the job file and before its frozen copy: the redelivered drop is
    recognised as accepted, and its acceptance makes the copy then (fsck finds none missing)."""
    allow_noop(tree)
    names = ["fc-a"]
    _drop(tree, names)
    env = {"SPOOL_CRASH_AT": "after_job_file", "SPOOL_WRITE_FORMAT": fmt}
    d = daemons(tree, "w1", drain=True, env=env)
    assert d.wait(timeout=60) == -9
    assert sorted(visible_names(tree.pending)) == ["fc-a@1.json"]
    assert not (tree.job_attempts("fc-a@1") / "job.json").exists()  # the window this covers
    assert _taken(tree) == names
    _drained_once_each(tree, daemons, names, env={"SPOOL_WRITE_FORMAT": fmt})
    copy = tree.job_attempts("fc-a@1") / "job.json"
    assert copy.read_bytes() == (tree.complete / "fc-a@1.json").read_bytes()
    r = run_cli("fsck", "--json", "--no-repair", spool=tree, env={"SPOOL_WRITE_FORMAT": fmt})
    assert json.loads(r.stdout)["problems"] == [], r.stdout


def test_a_crash_after_claims_made_in_the_accept_batch_tells_nothing_and_runs_each_once(tree: Tree, daemons):
    """Format 2 claims the drops it accepts in the same batch (one set of folder fsyncs):
    killed after those claims and before the fsyncs, nothing was told and nothing started;
    the restart recovers the claims and recognises the redelivered drops."""
    allow_noop(tree, limits={"max_active": 3})
    names = ["ac-a", "ac-b", "ac-c"]
    _drop(tree, names)
    d = daemons(tree, "w1", drain=True, env={"SPOOL_CRASH_AT": "mid_accept_claims"})
    assert d.wait(timeout=60) == -9
    assert _running(tree) == [f"{n}@1.json" for n in names]  # claimed in the accept batch
    assert _taken(tree) == names  # every drop kept under the claim name
    assert _journal(tree) == []  # neither the acceptance nor a claim was told
    assert all(tree.attempt_numbers(f"{n}@1") == [] for n in names)  # none started
    _drained_once_each(tree, daemons, names)


def test_a_crash_between_the_folders_of_an_accept_batch_loses_nothing(tree: Tree, daemons):
    allow_noop(tree)
    names = ["gs-a", "gs-b"]
    _drop(tree, names)
    d = daemons(tree, "w1", drain=True, env={"SPOOL_CRASH_AT": "mid_group_sync"})
    assert d.wait(timeout=60) == -9
    assert _taken(tree) == names
    _drained_once_each(tree, daemons, names)


@pytest.mark.parametrize("fmt", ["1", "2"])
def test_a_crash_mid_claim_batch_leaves_the_jobs_to_recovery(tree: Tree, daemons, fmt: str):
    cfg = allow_noop(tree, limits={"max_active": 3})
    names = ["cb-a", "cb-b", "cb-c"]
    for n in names:
        accept.accept_bytes(tree, cfg, noop_sub(n, tags=tags_for(0)), "tester")  # no batch: plain
    env = {"SPOOL_CRASH_AT": "mid_group_sync", "SPOOL_WRITE_FORMAT": fmt}
    d = daemons(tree, "w1", drain=True, env=env)
    assert d.wait(timeout=60) == -9  # between running/w1/'s fsync and pending/'s
    assert _running(tree) == [f"{n}@1.json" for n in names]
    # None had started: each job's thread opens its attempt once the batch is durable (in
    # both formats), so none has an attempt, none is told, none has begun its work.
    assert [e for e in _journal(tree) if e["to"] == "running"] == []
    for n in names:
        assert tree.attempt_numbers(f"{n}@1") == []
    d = daemons(tree, "w1", drain=True, env={"SPOOL_WRITE_FORMAT": fmt})
    assert d.wait(timeout=60) == 0, d.output()
    assert sorted(visible_names(tree.complete)) == [f"{n}@1.json" for n in names]
    assert _running(tree) == []


def test_a_batch_at_once_fsyncs_its_folders_concurrently(tmp_path: Path, watched: Watched):
    folders = [tmp_path / c for c in "abcd"]
    for f in folders:
        f.mkdir()
    slow: list[tuple[float, float]] = []

    def slow_fsync(folder: str) -> None:
        t0 = time.monotonic()
        time.sleep(0.1)  # a slow disk: four in a row would take 0.4 s
        fsync_folder_now(folder)
        slow.append((t0, time.monotonic()))

    groupcommit.install(Coalescer(fsync=slow_fsync))
    t0 = time.monotonic()
    with together(at_once=True):
        for f in folders:
            (f / "entry").touch()
            fsync_dir(f)
        assert slow == []
    assert len(slow) == 4
    assert time.monotonic() - t0 < 0.3, "the fsyncs ran one after another"
    assert max(s for s, _ in slow) < min(e for _, e in slow)  # all four were under way together


def test_a_batch_commits_the_journal_when_it_ends_beside_its_first_folders(tree: Tree):
    """A journal's lines ride on the next folder fsync; inside a batch that is the batch's
    end, and the journal's fsync runs beside the first round's folder fsyncs, not before
    them (it waits for no folder, and no folder waits for it)."""
    spans: dict[str, tuple[float, float]] = {}
    journal_fsync = threading.Event()

    def slow_fsync(folder: str) -> None:
        t0 = time.monotonic()
        assert journal_fsync.wait(5), "the journal was not committed beside the folder"
        fsync_folder_now(folder)
        spans[os.path.basename(folder)] = (t0, time.monotonic())

    j = Journal(tree, "w1")
    j.record("a@1", "pending", reason="told before the batch")
    real_fsync = os.fsync

    def watch_fsync(fd: int) -> None:
        if os.readlink(f"/proc/self/fd/{fd}").endswith("w1.jsonl"):
            journal_fsync.set()
        real_fsync(fd)

    groupcommit.install(Coalescer(fsync=slow_fsync))
    try:
        os.fsync = watch_fsync  # type: ignore[assignment]
        with together(at_once=True):
            (tree.pending / "x").touch()
            fsync_dir(tree.pending)
            (tree.complete / "y").touch()
            fsync_dir(tree.complete)
            assert j.fsyncs == 0, "inside a batch the journal waits for the batch's end"
    finally:
        os.fsync = real_fsync  # type: ignore[assignment]
    assert j.fsyncs == 1
    assert set(spans) == {"pending", "complete"}
    # Outside a batch a folder fsync still commits the journal first.
    j.record("b@1", "pending")
    fsync_dir(tree.pending)
    assert j.fsyncs == 2


def test_lines_committed_soon_are_durable_before_the_next_batch_which_then_fsyncs_no_journal(tree: Tree):
    """commit_riders_soon: the journal's fsync starts on a helper thread at once; the next
    batch's end finds the lines durable (or shares the fsync in flight) and fsyncs the
    journal no second time. Lines written after it are still the batch's to commit."""
    j = Journal(tree, "w1")
    j.record("a@1", "pending", reason="told of an acceptance batch")
    real_fsync = os.fsync
    released = threading.Event()
    journal_fsyncs: list[str] = []

    def held_fsync(fd: int) -> None:
        if os.readlink(f"/proc/self/fd/{fd}").endswith("w1.jsonl"):
            journal_fsyncs.append(threading.current_thread().name)
            assert released.wait(5)
        real_fsync(fd)

    os.fsync = held_fsync  # type: ignore[assignment]
    try:
        groupcommit.commit_riders_soon()
        # The fsync is in flight on a helper (held here), and the caller went on.
        wait_for(lambda: len(journal_fsyncs) == 1, timeout=5)
        assert journal_fsyncs[0].startswith("fsync") and j.fsyncs == 0
        released.set()
        with together(at_once=True):
            (tree.pending / "x").touch()
            fsync_dir(tree.pending)
            (tree.complete / "y").touch()
            fsync_dir(tree.complete)
        assert j.fsyncs == 1 and len(journal_fsyncs) == 1  # shared, not done again
        j.record("b@1", "running", reason="told after the early commit")
        with together(at_once=True):
            (tree.pending / "z").touch()
            fsync_dir(tree.pending)
        assert j.fsyncs == 2  # a line written since is the batch's
    finally:
        os.fsync = real_fsync  # type: ignore[assignment]


def test_only_an_explicit_act_routes_folder_fsyncs_never_an_import() -> None:
    """Importing spool.disk.groupcommit changes nothing; installing a coalescer or beginning a
    batch does (the tree layer's behaviour never hangs on what happened to be imported)."""
    code = (
        "import spool.disk.durable as t, spool.disk.groupcommit as g\n"
        "print(t._folder_router is None)\n"
        "with g.together():\n"
        "    pass\n"
        "print(t._folder_router is g.sync_folder)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["True", "True"]


def test_an_owed_folder_a_failed_round_did_not_pay_stays_owed(tmp_path: Path, monkeypatch):
    """An owed folder (a publish's moves' source) is paid beside a batch's first round; when
    that round fails it may not have been paid, so it stays owed for the next fsync."""
    owed_dir, batch_dir = tmp_path / "owed", tmp_path / "batch"
    owed_dir.mkdir()
    batch_dir.mkdir()

    def fsync(folder: str | os.PathLike[str]) -> None:
        if os.fspath(folder) == str(batch_dir):
            raise OSError(errno.EIO, "Input/output error", str(folder))

    monkeypatch.setattr(groupcommit, "fsync_folder_now", fsync)
    monkeypatch.setattr(groupcommit, "_installed", None)
    groupcommit.owed.add(str(owed_dir))
    with pytest.raises(OSError), groupcommit.together(at_once=True):
        groupcommit.sync_folder(batch_dir)
    assert groupcommit.owed.take() == [str(owed_dir)]
