"""The kill -9 torture run, bounded for CI: real renders, real daemons, real SIGKILLs.

The long run (``tools/torture --jobs 300 --kills 100``) is the same code with
bigger numbers; its figures are quoted in the issue's closing note. Three
generation jobs against tools/provsim.py are mixed in (``--generate``), and
``spool library adopt`` of 30 clips is killed again and again (``--adopt``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.torture
def test_bounded_torture_run_loses_nothing(tmp_path):
    jobs = os.environ.get("SPOOL_TORTURE_JOBS", "20")
    kills = os.environ.get("SPOOL_TORTURE_KILLS", "10")
    proc = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "torture.py"), "--jobs", jobs, "--kills", kills,
         "--seed", "11", "--generate", "3", "--adopt", "30", "--keep", str(tmp_path / "run"), "--json"],
        capture_output=True, text=True, timeout=900,
        env={**os.environ, "PYTHONPATH": str(ROOT / "tools")},
    )  # fmt: skip
    assert proc.stdout, proc.stderr
    f = json.loads(proc.stdout)
    print(json.dumps({k: v for k, v in f.items() if k != "details"}))
    assert f["lost"] == 0, f["details"]
    assert f["double_published"] == 0, f["details"]
    assert f["partial_at_final"] == 0, f["details"]
    assert f["fsck_problems"] == 0, f["details"]
    assert f["independent_problems"] == 0, f["details"]
    assert f["damaged_not_quarantined"] == 0  # every damaged file dropped into pending/ ends in quarantine/
    assert f["complete"] + f["failed"] == f["jobs"]
    assert f["kills"] >= 1
    # generation jobs mixed in: each ends, and no attempt sent a second create
    assert f["generations"] == 3
    assert f["generation_complete"] + f["generation_failed"] == 3
    assert 3 <= f["generation_creates"] <= f["generation_attempts"], f
    # spool library adopt killed again and again, then finished: every file one asset, once
    assert f["adopt_complete"] == 30 and f["adopt_wrong"] == [], f
    assert f["adopt_kills"] >= 1
    assert proc.returncode == 0


@pytest.mark.torture
def test_bounded_torture_with_dependencies_renders_only_from_resolved_upstream_bytes(tmp_path):
    """Chains of 3, a fan-out of 12 on one master and a failing upstream with a chain on it,
    heads revised mid-run, daemons killed (some at the settle's crash points): nothing lost,
    every dependent of a published upstream complete and frozen to its bytes (invariant 12,
    tools/invariants.py), those of a failed one held with the reason, nothing left waiting."""
    proc = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "torture.py"), "--jobs", "4", "--kills", "8",
         "--depends", "3", "--seed", "7", "--crash-point-rate", "0.6",
         "--keep", str(tmp_path / "run"), "--json"],
        capture_output=True, text=True, timeout=900,
        env={**os.environ, "PYTHONPATH": str(ROOT / "tools")},
    )  # fmt: skip
    assert proc.stdout, proc.stderr
    f = json.loads(proc.stdout)
    print(json.dumps({k: v for k, v in f.items() if k != "details"}))
    assert f["lost"] == 0 and f["fsck_problems"] == 0 and f["independent_problems"] == 0, f["details"]
    assert f["double_published"] == 0, f["details"]  # two settlers never run one dependent twice
    assert f["depends_wrong"] == [], f["depends_wrong"]
    assert f["depends_groups"] == 3 and f["depends_jobs"] >= 3 + 13 + 3
    ends = f["depends_ends"]
    assert sum(ends.values()) == f["depends_jobs"] and "missing" not in ends, ends
    # the failing upstream failed and held its dependent; dependents of published upstreams
    # rendered (a kill may fail any render for good: depends_wrong judges each end by its
    # upstreams' ends)
    assert ends["failed"] >= 1 and ends["held"] >= 1 and ends["complete"] >= 10, ends
    assert f["kills"] >= 1
    assert proc.returncode == 0


@pytest.mark.torture
def test_bounded_torture_of_spool_migrate_keeps_every_search_result(tmp_path):
    """A format 1 run (old writers: SPOOL_WRITE_FORMAT=1, daemons killed) leaves a library of
    format 1 records; spool migrate, SIGKILLed at its crash points and at random moments on
    copies of that tree and in a chain on the tree itself, then run to the end: after every
    kill and at the end the library reads exactly as before (every hit, version, object and
    name: no false hit, no miss), invariants and fsck clean, and a further run does nothing."""
    proc = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "torture.py"), "--jobs", "4", "--kills", "3",
         "--migrate", "60", "--migrate-kills", "5", "--seed", "3",
         "--keep", str(tmp_path / "run"), "--json"],
        capture_output=True, text=True, timeout=900,
        env={**os.environ, "PYTHONPATH": str(ROOT / "tools")},
    )  # fmt: skip
    assert proc.stdout, proc.stderr
    f = json.loads(proc.stdout)
    print(json.dumps({k: v for k, v in f.items() if k != "details"}))
    assert f["lost"] == 0 and f["fsck_problems"] == 0 and f["independent_problems"] == 0, f["details"]
    assert f["migrate_wrong"] == [], f["migrate_wrong"]
    # the old writers made the library: one format 1 record per version (60 names, 9 at rev 2)
    assert f["migrate_versions"] == f["migrate_v1_records"] >= 60 + 8
    phases = f["migrate_phases"]
    # both crash points hit, on a copy and in the chain (random kills may land after a run ends)
    for point in ("mid_migrate", "mid_group_sync"):
        assert any(p.startswith(f"{point}: ") for p in phases), phases
        assert any(p.startswith(f"chain, {point}: ") for p in phases), phases
    assert f["migrate_kills"] >= 4, phases
    assert proc.returncode == 0
