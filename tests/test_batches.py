"""Format 2's new durable steps (issue 25), each killed at its crash point with SIGKILL:
a publish batch with some jobs moved to complete/ and the rest not; the library index's
segments merged into entries but not yet removed; compacted into one but the old ones not
yet removed. After each: nothing lost or published twice, readers whole, a rerun clean."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import invariants
from conftest import run_cli, state_files
from libhelp import allow_noop, noop_sub, publish, tags_for

from spool.disk import formats
from spool.disk.tree import Tree
from spool.library import catalog, index, segments
from spool.queue import accept


def _hits(tree: Tree, cfg) -> list[str]:
    return sorted(h.job for h in catalog.search(tree, cfg, catalog.parse_terms(["asset_type=ad"])).results)


def _completes(tree: Tree) -> dict[str, int]:
    told: dict[str, int] = {}
    for f in tree.events.glob("*.jsonl"):
        for line in f.read_text().splitlines():
            e = json.loads(line)
            if e["to"] == "complete":
                told[e["job"]] = told.get(e["job"], 0) + 1
    return told


def test_a_daemon_killed_mid_publish_batch_completes_every_job_once(tree, daemons):
    """Eight no-op jobs claimed at once end within milliseconds: published as batches.
    Killed after a batch's first move to complete/ and before its second."""
    assert formats.read(tree.root) == 2
    cfg = allow_noop(tree, limits={"max_active": 8})
    names = [f"pb{i}" for i in range(8)]
    for n in names:
        accept.accept_bytes(tree, cfg, noop_sub(n, tags=tags_for(0)), "tester")
    d = daemons(tree, "w1", drain=True, env={"SPOOL_CRASH_AT": "mid_complete_batch"})
    assert d.wait(timeout=60) == -signal.SIGKILL, "no publish batch of two or more jobs happened"
    wreck = state_files(tree)
    assert 1 <= len(wreck["complete"]) < len(names) and wreck["running"]
    assert invariants.check(tree.root, settled=False) == []
    # A batch tells nothing before all its moves are durable: the cut batch's first move is
    # in complete/ untold; a job told complete is one an earlier (whole) batch published
    # (a first batch of one job can end before the eight are all prepared).
    told = _completes(tree)
    moved = {n[:-5] for n in wreck["complete"]}
    assert set(told) <= moved and set(told) != moved and all(c == 1 for c in told.values())
    for jid in (n[:-5] for n in wreck["complete"]):
        assert index.is_indexed(tree, jid)  # complete only once findable
    again = daemons(tree, "w1", drain=True)
    assert again.wait(timeout=60) == 0, again.output()
    assert state_files(tree)["complete"] == [f"{n}@1.json" for n in names]
    assert state_files(tree)["running"] == []
    assert invariants.check(tree.root) == []
    assert _hits(tree, cfg) == [f"{n}@1" for n in names]
    # The jobs the cut batch had moved were never told (a process kill, like a power cut,
    # takes the lines of the batch in hand): fsck rebuilds them from the tree, once.
    untold = {f"{n}@1" for n in names} - set(_completes(tree))
    assert untold <= {n[:-5] for n in wreck["complete"]}
    fix = json.loads(run_cli("fsck", "--json", "--settle", "0", spool=tree).stdout)
    assert {p["path"] for p in fix["problems"]} == {f"events/ ({j})" for j in untold}, fix
    told = _completes(tree)
    assert set(told) == {f"{n}@1" for n in names} and max(told.values()) == 1  # each told once
    assert json.loads(run_cli("fsck", "--json", spool=tree).stdout) == {"clean": True, "problems": []}


def test_a_merge_killed_between_its_entries_and_removing_its_segments_loses_nothing(tree):
    cfg = allow_noop(tree)
    jobs = [publish(tree, cfg, noop_sub(f"mg{i}", tags=tags_for(i))) for i in range(5)]
    segs = segments.listed(tree)
    assert len(segs) == 5
    r = run_cli("index", "--merge", spool=tree, env={"SPOOL_CRASH_AT": "mid_index_merge"})
    assert r.returncode == -signal.SIGKILL, r.stderr
    # Entries durable and segments still there: duplication, which readers join.
    assert segments.listed(tree) == segs
    assert all(segments.merged_version(tree, j.split("@")[0], 1).is_file() for j in jobs)
    assert _hits(tree, cfg) == sorted(jobs)
    assert index.size(tree) == (5 * 4, 5)  # each job counted once
    assert index.check(tree, cfg.acceptance.required_tags, repair=False) == []
    assert invariants.check(tree.root) == []
    out = json.loads(run_cli("index", "--merge", "--json", spool=tree, check=True).stdout)
    assert out["merged"] == {"segments": 5, "jobs": 5} and out["segments"] == 0
    assert _hits(tree, cfg) == sorted(jobs)
    assert invariants.check(tree.root) == []


def test_a_compaction_killed_before_removing_the_old_segments_loses_nothing(tree):
    cfg = allow_noop(tree)
    jobs = [publish(tree, cfg, noop_sub(f"cp{i}", tags=tags_for(i))) for i in range(4)]
    segs = segments.listed(tree)
    assert len(segs) == 4 and {segments.writer_of(s) for s in segs} == {"w1"}
    # What a daemon's tidying thread runs once it has COMPACT_FILES segments (spoold).
    code = (
        "from spool.library import segments; from spool.disk.tree import Tree; "
        f"segments.compact(Tree.at({str(tree.root)!r}), 'w1')"
    )
    env = {**os.environ, "SPOOL_CRASH_AT": "mid_index_compact"}
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert r.returncode == -signal.SIGKILL, r.stderr
    now = segments.listed(tree)
    assert len(now) == 5 and set(segs) < set(now)  # the compacted one beside the old ones
    assert _hits(tree, cfg) == sorted(jobs)
    assert index.check(tree, cfg.acceptance.required_tags, repair=False) == []
    assert invariants.check(tree.root) == []
    subprocess.run([sys.executable, "-c", code], check=True)
    [one] = segments.listed(tree)
    assert sorted(
        json.loads(x)["job_id"] for x in (tree.root / "index" / "_segments" / one).read_text().splitlines()
    ) == sorted(jobs)
    assert _hits(tree, cfg) == sorted(jobs)
