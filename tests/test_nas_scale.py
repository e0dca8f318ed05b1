"""A big queue must not cost one network round trip per pending job (issue 17).

* the claim index starts claiming after a bounded look-ahead and reads the rest
  in the background; its order is exact once the backlog is read, and during
  the first scan the best of what was read (spool.queue.claim.PendingIndex);
* after that, a rescan reads only names it has not seen;
* ``spool status`` stats no pending job beyond a bounded sample: the oldest
  pending age comes from live workers' heartbeats, else a sample; ``--exact``
  stats every one and says so (counted with strace on the real command).

These run on the local disk: what is counted (files read, stat calls) is the
same through a network mount, where each one is a round trip; tools/bench's
``nas`` measure times them through tools/multimount.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from conftest import SPOOL, run_cli

from spool.core import config
from spool.core.model import WorkerRecord, encode
from spool.disk.tree import HOST, Tree, boot_id
from spool.observe import overview
from spool.queue import claim

BASE = datetime(2026, 1, 1, tzinfo=UTC)


def _pending(tree: Tree, n: int, *, prio: dict[int, int] | None = None) -> list[tuple[int, float, str]]:
    """``n`` job files in pending/ with what claim order reads; the expected order keys."""
    prio = prio or {}
    keys = []
    for i in range(n):
        jid = f"j{i:05d}@1"
        p = prio.get(i, i % 3)
        at = BASE + timedelta(seconds=(i * 7919) % n)  # submission order unlike name order
        body = {"job_id": jid, "operation": "noop", "priority": p, "submitted_at": at.isoformat()}
        (tree.pending / f"{jid}.json").write_text(json.dumps(body))
        keys.append((-p, at.timestamp(), jid))
    return sorted(keys)


@pytest.fixture()
def bare(tmp_path: Path) -> Tree:
    tree = Tree.at(tmp_path / "spool")
    tree.create()
    tree.config_file.write_text(config.template([str(tmp_path)]))
    return tree


class Gate:
    """Counts the job files the index reads; a reader asked for a name outside
    ``allowed`` waits until released (so the test sees the index mid-scan)."""

    def __init__(self, index: claim.PendingIndex, allowed: set[str] | None = None) -> None:
        self.reads = 0
        self.released = threading.Event()
        self._lock = threading.Lock()
        real = index._load

        def load(jid: str) -> claim._Loaded:
            with self._lock:
                self.reads += 1
            if allowed is not None and jid not in allowed:
                self.released.wait(30)
            return real(jid)

        index._load = load  # type: ignore[method-assign]


def _listing(tree: Tree) -> list[str]:
    return [e.name[:-5] for e in os.scandir(tree.pending)]


def test_first_refresh_indexes_a_bounded_lookahead_and_claims_its_best(bare: Tree):
    n = 3000
    expected = _pending(bare, n, prio={2999: 99})  # one urgent job, listed anywhere
    index = claim.PendingIndex(bare)
    first = set(_listing(bare)[: claim.LOOKAHEAD])
    gate = Gate(index, first)
    try:
        assert index.refresh() == claim.LOOKAHEAD
        assert index.backlog == n - claim.LOOKAHEAD
        assert index.claimable() == n, "an unread job still counts as claimable (drain waits)"
        assert index.oldest_submitted() is None, "an unread job may be older: no age yet"
        assert set(index._keys) == first, "the first LOOKAHEAD names of the listing"
        best = min(k for k in expected if k[2] in first)
        assert next(index.ordered()) == best[2], "the best of the jobs read so far"
    finally:
        gate.released.set()
    while index.backlog:
        index.refresh()
        time.sleep(0.01)
    assert len(index) == n and gate.reads == n
    assert list(index.ordered()) == [k[2] for k in expected], "exact order once the backlog is read"
    assert next(index.ordered()) == "j02999@1"
    assert index.oldest_submitted() == min(k[1] for k in expected)


def test_refresh_returns_before_reading_every_job_without_holding_readers(bare: Tree):
    """No gate: however fast the disk, one refresh reads the look-ahead and hands
    out a bounded number of batches more (READERS merged once done, READERS in flight)."""
    n = 4000
    _pending(bare, n)
    index = claim.PendingIndex(bare)
    gate = Gate(index)
    index.refresh()
    assert len(index) >= claim.LOOKAHEAD
    assert gate.reads <= claim.LOOKAHEAD + (2 * claim.READERS + 1) * claim.BATCH < n


def test_rescan_reads_only_names_it_has_not_seen(bare: Tree):
    _pending(bare, 500)
    index = claim.PendingIndex(bare)
    gate = Gate(index)
    while index.refresh() < 500 or index.backlog:
        pass
    assert gate.reads == 500
    index.refresh()
    assert gate.reads == 500, "a rescan of unchanged pending/ reads no job file"
    (bare.pending / "j00007@1.json").unlink()
    for i in range(3):
        jid = f"late{i}@1"
        body = {"job_id": jid, "priority": 100, "submitted_at": BASE.isoformat()}
        (bare.pending / f"{jid}.json").write_text(json.dumps(body))
    index.refresh()
    while index.backlog:  # the new names are read in the background
        index.refresh()
    assert gate.reads == 503 and len(index) == 502
    assert list(index.ordered())[:3] == ["late0@1", "late1@1", "late2@1"]


# -- spool status ---------------------------------------------------------------------------

STATS = re.compile(r"\b(?:stat|lstat|newfstatat|statx|openat|open)\(.*?/pending/j\d{5}@1\.json")


def _status_syscalls(tree: Tree, *args: str) -> tuple[dict, int]:
    """``spool status --json ARGS`` under strace: its report, and its calls on pending job files."""
    if shutil.which("strace") is None:
        pytest.skip("strace is not installed")
    trace = tree.root.parent / "trace"
    argv = [SPOOL, "status", "--json", *args, "--spool", str(tree.root)]
    proc = subprocess.run(
        ["strace", "-f", "-qq", "-e", "trace=%file", "-o", str(trace), *argv],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    calls = sum(1 for line in trace.read_text(errors="replace").splitlines() if STATS.search(line))
    return json.loads(proc.stdout), calls


def _heartbeat(tree: Tree, oldest: float | None, state: str = "running") -> None:
    at = datetime.now(UTC)
    rec = WorkerRecord(
        worker="w1",
        host=HOST,
        pid=os.getpid(),
        boot_id=boot_id(),
        started_at=at,
        heartbeat_at=at,
        beats=1,
        state=state,  # type: ignore[arg-type]
        max_active=1,
        oldest_pending_submitted=oldest,
    )
    (tree.workers / "w1.json").write_bytes(encode(rec))


def test_status_without_a_live_worker_stats_a_bounded_sample(bare: Tree):
    n = 1000
    _pending(bare, n)
    report, calls = _status_syscalls(bare)
    assert report["counts"]["pending"] == n
    assert report["oldest_pending_age_source"] == "sample"
    assert report["oldest_pending_stated"] == overview.SAMPLE
    assert calls == overview.SAMPLE, "one stat per sampled job, no more, no open"
    assert report["oldest_pending_age"] is not None
    text = run_cli("status", spool=bare, check=True).stdout
    assert f"by a sample of {overview.SAMPLE}" in text and "--exact" in text


def test_status_takes_the_age_from_a_live_workers_heartbeat(bare: Tree):
    _pending(bare, 1000)
    submitted = time.time() - 3600
    _heartbeat(bare, submitted)
    report, calls = _status_syscalls(bare)
    assert report["oldest_pending_age_source"] == "workers"
    assert calls == 0, "no pending job is stat'ed or opened"
    assert 3590 <= report["oldest_pending_age"] <= 3700
    # A stopped worker's figure is not trusted: back to the sample.
    _heartbeat(bare, submitted, state="stopped")
    report, _ = _status_syscalls(bare)
    assert report["oldest_pending_age_source"] == "sample"


def test_status_exact_stats_every_pending_job_and_says_so(bare: Tree):
    n = 1000
    _pending(bare, n)
    _heartbeat(bare, time.time() - 3600)
    report, calls = _status_syscalls(bare, "--exact")
    assert report["oldest_pending_age_source"] == "exact"
    assert report["oldest_pending_stated"] == n
    assert calls == n
    assert report["oldest_pending_age"] < 600, "from the files' ctime, not the heartbeat"


def test_status_of_a_small_queue_is_exact_without_asking(bare: Tree):
    _pending(bare, 40)
    report, calls = _status_syscalls(bare)
    assert report["oldest_pending_age_source"] == "exact"
    assert report["oldest_pending_stated"] == 40 == calls


def test_the_metrics_hook_never_lists_pending(tree, monkeypatch):
    """The daemon's metrics take pending/ from its index: listing 100,000 names on a NAS
    every metrics_interval was a core's 1-2 % (issue 17)."""
    import os

    from spool.core import config
    from spoold.daemon import Daemon
    from spoold.observers import Metrics

    for i in range(5):
        (tree.pending / f"p{i}@1.json").write_text("{}")
    d = Daemon(tree, config.load(tree.config_file), "probe", hooks=[])
    listed: list[str] = []

    def spying(real):  # type: ignore[no-untyped-def]
        def spy(path):  # type: ignore[no-untyped-def]
            listed.append(os.path.basename(path))
            return real(path)

        return spy

    monkeypatch.setattr(os, "scandir", spying(os.scandir))  # listings with a stat each
    monkeypatch.setattr(os, "listdir", spying(os.listdir))  # listings of names only
    hook = Metrics()
    hook.started(d)
    hook.tick(d)
    assert hook.flush()
    assert "pending" not in listed and "complete" in listed
    text = (tree.root / "metrics" / "spool-probe.prom").read_text()
    assert 'spool_jobs{worker="probe",state="pending"} 0' in text  # what its (empty) index knows
