"""tools/bench runs to the end and prints its one table with every row.

These tests assert no timing at all (the machines are shared and noisy): only
that the harness completes, exits 0, and that every row each measure promises
is in the table it prints. ``--smoke`` (tiny sizes, measures side by side)
keeps the default suite fast; ``--quick`` is the CI-sized run, marked slow and
run only when asked for (``pytest -m slow`` or ``SPOOL_BENCH_QUICK=1``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: tools/bench.py itself, not the tools/bench wrapper: the wrapper runs tools/setup, which
#: may install into the .venv other tests are importing spool from at that moment.
BENCH = ROOT / "tools" / "bench.py"


def run_bench(tmp_path: Path, mode: str, timeout: float) -> tuple[subprocess.CompletedProcess[str], dict]:
    out = tmp_path / "bench.json"
    proc = subprocess.run(
        [sys.executable, str(BENCH), mode, "--json", str(out), "--disk-dir", str(tmp_path / "disk")],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert proc.returncode == 0, f"tools/bench {mode} exited {proc.returncode}:\n{proc.stderr[-4000:]}"
    return proc, json.loads(out.read_text())


def assert_every_row_printed(proc: subprocess.CompletedProcess[str], report: dict, mode: str) -> None:
    import bench  # tools/ is on sys.path (conftest)

    header = proc.stdout.splitlines()[2]
    for column in ("measure", "spool", "peer", "peer figure", "ratio", "target", "result"):
        assert column in header
    keys = [row["key"] for row in report["rows"]]
    assert keys == [k for k in keys if not k.endswith(".error")]
    assert sorted(keys) == sorted(bench.expected_keys(mode))
    table = proc.stdout.split("\nHow each figure was taken:")[0]
    for row in report["rows"]:
        assert row["measure"] in table, f"row {row['key']} is not in the printed table"
        assert row["result"] in ("met", "MISSED", "reported")


def test_bench_smoke_prints_every_row(tmp_path: Path) -> None:
    proc, report = run_bench(tmp_path, "--smoke", timeout=300)
    assert_every_row_printed(proc, report, "smoke")


@pytest.mark.slow
def test_bench_quick_prints_every_row(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    # Minutes long, so only when asked for: pytest -m slow (or SPOOL_BENCH_QUICK=1).
    if "slow" not in (request.config.option.markexpr or "") and not os.environ.get("SPOOL_BENCH_QUICK"):
        pytest.skip("tools/bench --quick takes minutes; run it with -m slow or SPOOL_BENCH_QUICK=1")
    proc, report = run_bench(tmp_path, "--quick", timeout=1800)
    assert_every_row_printed(proc, report, "quick")


def test_timeline_times_each_step_of_a_job_inside_the_daemon(tmp_path: Path) -> None:
    """tools/timeline.py: both measures run to the end on a few jobs, and each names the
    steps it promises (its figures are not asserted: only that the daemon's own functions
    and fsyncs were recorded and put in order)."""
    proc = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "timeline.py"), "--jobs", "12", "--dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    claim, cycle = proc.stdout.split("\ncycle: ")
    assert claim.startswith("drop-to-claim: 12 jobs one at a time")
    steps = [line.split()[-1] for line in claim.splitlines()[2:]]
    # In the order a claim takes them: the job file durable, the claim in the same batch,
    # the batch's folders, then the acceptance told and the attempt started.
    for earlier, later in [
        ("accept.take_batch", "S/pending/#new"),
        ("S/pending/#new", "claim.claim"),
        # after the batch's fsyncs: steps microseconds apart are not ordered by their medians
        ("claim.claim", "accept.Batch.release_lines"),
        ("claim.claim", "accept.keep_submission"),
        ("claim.claim", "execute.started"),
    ]:
        assert steps.index(earlier) < steps.index(later), steps
    assert "12 jobs drained by 1 daemon x 1 slot" in cycle
    for step in ("publish.commit", "S/complete", "S/attempts/J/1/work/J.txt"):
        assert any(line.endswith(step) for line in cycle.splitlines()), (step, cycle)
    assert list(tmp_path.iterdir()) == []  # its scratch spools removed


def test_the_create_probe_times_new_inodes_and_leaves_nothing(tmp_path: Path) -> None:
    from benchlib.common import create_probe  # tools/ is on sys.path (conftest)

    files, folders = create_probe(tmp_path, n=5)
    assert files > 0 and folders > 0
    assert list(tmp_path.iterdir()) == []
