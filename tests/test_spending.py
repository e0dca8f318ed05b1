"""The spending guard: real files, real processes racing, windows that roll."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from spool.kinds.generate import spending
from spool.kinds.generate.spending import DAY, HOUR, SpendingRefused, count, folder, release, reserve

T0 = 1_800_000_000.0


def test_admits_up_to_the_hourly_limit_then_refuses_with_a_located_reason(tmp_path: Path) -> None:
    for i in range(3):
        reserve(tmp_path, "rep", 3, 100, job=f"j{i}@1", key=f"j{i}@1/1", now=T0 + i)
    with pytest.raises(SpendingRefused) as info:
        reserve(tmp_path, "rep", 3, 100, job="j9@1", key="j9@1/1", now=T0 + 10)
    err = info.value
    assert "[providers.rep] spending.per_hour = 3" in str(
        err
    ) and "3 create requests in the last hour" in str(err)
    assert str(folder(tmp_path, "rep")) in str(err)
    assert err.retry_at == T0 + HOUR  # when the oldest leaves the window
    assert count(tmp_path, "rep", T0 + 10) == (3, 3)  # the refused request left no file


def test_the_hour_rolls_but_the_day_remembers(tmp_path: Path) -> None:
    for i in range(2):
        reserve(tmp_path, "rep", 2, 3, job="j", key=f"k{i}", now=T0 + i)
    reserve(tmp_path, "rep", 2, 3, job="j", key="k2", now=T0 + HOUR + 5)  # the hour has room again
    with pytest.raises(
        SpendingRefused, match=r"spending.per_day = 3: 3 create requests in the last day"
    ) as info:
        reserve(tmp_path, "rep", 2, 3, job="j", key="k3", now=T0 + HOUR + 6)
    assert info.value.retry_at == T0 + DAY
    reserve(tmp_path, "rep", 2, 3, job="j", key="k4", now=T0 + DAY + 1)


def test_zero_allows_nothing_and_writes_nothing(tmp_path: Path) -> None:
    with pytest.raises(SpendingRefused, match="no create is allowed until the limit is raised"):
        reserve(tmp_path, "rep", 0, 10, job="j", key="k", now=T0)
    assert count(tmp_path, "rep", T0) == (0, 0)


def test_release_gives_the_slot_back_and_providers_are_separate(tmp_path: Path) -> None:
    p = reserve(tmp_path, "rep", 1, 10, job="j", key="k", now=T0)
    reserve(tmp_path, "run", 1, 10, job="j", key="k", now=T0)  # another provider's budget
    with pytest.raises(SpendingRefused):
        reserve(tmp_path, "rep", 1, 10, job="j", key="k2", now=T0 + 1)
    release(p)
    reserve(tmp_path, "rep", 1, 10, job="j", key="k2", now=T0 + 2)


def test_counts_survive_a_restart_in_another_process(tmp_path: Path) -> None:
    reserve(tmp_path, "rep", 5, 10, job="j", key="k", now=T0)
    code = "from spool.kinds.generate.spending import count; "
    code += f"print(count({str(tmp_path)!r}, 'rep', {T0 + 1}))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "(1, 1)"


def test_old_files_are_pruned(tmp_path: Path) -> None:
    reserve(tmp_path, "rep", 5, 10, job="j", key="old", now=T0)
    reserve(tmp_path, "rep", 5, 10, job="j", key="new", now=T0 + 3 * DAY)
    assert len(spending.times(tmp_path, "rep")) == 1


RACER = textwrap.dedent(
    """
    import sys, time
    from spool.kinds.generate.spending import reserve, SpendingRefused
    root, start = sys.argv[1], float(sys.argv[2])
    while time.time() < start:
        pass
    ok = 0
    for i in range(8):
        try:
            reserve(root, "rep", 10, 100, job="j", key=f"{sys.argv[3]}-{i}")
            ok += 1
        except SpendingRefused:
            pass
    print(ok)
    """
)


def test_racing_processes_never_exceed_the_limit(tmp_path: Path) -> None:
    import time

    start = time.time() + 1.0
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", RACER, str(tmp_path), str(start), f"p{n}"],
            stdout=subprocess.PIPE,
            text=True,
            env=os.environ,
        )
        for n in range(6)
    ]
    admitted = sum(int(p.communicate(timeout=60)[0]) for p in procs)
    files = len(spending.times(tmp_path, "rep"))
    assert files == admitted  # every admitted request has its file, no refused one does
    assert 1 <= admitted <= 10  # 48 attempts against a limit of 10


def test_the_allowance_says_how_many_more_and_when_the_next_frees_up(tmp_path: Path) -> None:
    for i in range(2):
        reserve(tmp_path, "rep", 2, 10, job=f"j{i}", key=f"j{i}/1", now=T0 + i)
    full = spending.allowance(tmp_path, "rep", 2, 10, now=T0 + 10)
    assert full.room == 0 and full.frees_at == T0 + HOUR
    assert "spending.per_hour = 2: 2 create requests in the last hour" in full.reason
    assert spending.allowance(tmp_path, "rep", 3, 10, now=T0 + 10).room == 1
    assert spending.allowance(tmp_path, "rep", 2, 10, now=T0 + HOUR + 0.5).room == 1
