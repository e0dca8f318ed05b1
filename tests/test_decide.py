"""recover.decide, the pure heart of recovery: every decision, from its evidence.

A table: each row is the evidence a crashed attempt can leave and the decision
that must follow. The SIGKILL tests (test_recover.py) reach most rows through a
real daemon; this table reaches every row, including the ones no crash point
gives (a recorded failure or interruption, exhausted attempts).
"""

from __future__ import annotations

import errno
import os
import time
from pathlib import Path

import msgspec
import pytest

from spool.core.model import Evidence
from spool.disk.tree import Tree
from spool.queue import retry
from spool.queue.attempt import NotYet, open_attempt
from spool.repair.recover import decide


def ev(**kw: object) -> Evidence:
    base: dict[str, object] = dict(
        job_id="j@1",
        worker="w1",
        attempt=1,
        attempts_used=1,
        manifest="absent",
        result="absent",
        failure="absent",
        interrupted=False,
        candidate="absent",
    )
    base.update(kw)
    return Evidence(**base)  # type: ignore[arg-type]


CAND = "attempts/j@1/1/work/j.mp4"

#: (evidence, max_attempts, candidate valid?) -> decision
TABLE = [
    (ev(manifest="verified"), 3, None, "published"),
    # a verified manifest wins over everything else the attempt left
    (ev(manifest="verified", failure="final", interrupted=True, candidate=CAND), 3, None, "published"),
    (ev(result="verified"), 3, None, "staged"),
    (ev(manifest="store/x is missing", result="verified"), 3, None, "staged"),
    (ev(failure="final"), 3, None, "recorded-failure"),
    (ev(failure="retryable", attempts_used=3), 3, None, "recorded-failure"),
    (ev(failure="retryable", attempts_used=1), 3, None, "retry"),
    (ev(interrupted=True), 3, None, "recorded-interruption"),
    (ev(interrupted=True, attempts_used=3), 3, None, "recorded-interruption"),
    (ev(candidate=CAND), 3, True, "accept-candidate"),
    (ev(candidate=CAND, attempts_used=3), 3, True, "accept-candidate"),
    (ev(candidate=CAND), 3, False, "retry"),
    (ev(), 3, None, "retry"),
    (ev(attempt=0, attempts_used=0), 3, None, "retry"),
    (ev(candidate=CAND, attempts_used=3), 3, False, "exhausted"),
    (ev(attempts_used=3), 3, None, "exhausted"),
]


@pytest.mark.parametrize(("evidence", "max_attempts", "valid", "decision"), TABLE)
def test_decide_table(evidence: Evidence, max_attempts: int, valid: bool | None, decision: str):
    got, reason = decide(evidence, max_attempts, valid)
    assert got == decision
    assert reason and "\n" not in reason


def test_table_covers_every_decision():
    from typing import get_args

    from spool.core.model import Decision

    assert {row[3] for row in TABLE} == set(get_args(Decision))


def test_reasons_say_how_many_attempts_were_used():
    _, reason = decide(ev(attempts_used=2), 3, None)
    assert "2 of 3 attempts used" in reason
    _, reason = decide(ev(attempts_used=3), 3, None)
    assert "all 3 attempts used" in reason


def test_open_attempt_raises_what_is_not_a_taken_number(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Only "that number exists" moves on to the next number; any other rename
    error is raised (EACCES used to be retried with n rising, forever).

    Root ignores permissions, so the EACCES of a real NAS export is injected
    into the one rename that numbers the attempt; everything else is real.
    """
    tree = Tree.at(tmp_path / "spool")
    tree.create()
    real_rename = os.rename
    calls = []

    def rename(src: object, dst: object) -> None:
        if ".new." in str(src):
            calls.append(dst)
            if len(calls) > 5:
                raise RuntimeError("open_attempt retried a permission error")
            raise PermissionError(errno.EACCES, "Permission denied", str(dst))
        real_rename(src, dst)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "rename", rename)
    with pytest.raises(PermissionError):
        open_attempt(tree, "j@1", "w1")
    assert len(calls) == 1
    assert os.listdir(tree.job_attempts("j@1")) == []  # no staging folder left behind


def test_open_attempt_takes_the_next_number_after_a_taken_one(tmp_path: Path):
    tree = Tree.at(tmp_path / "spool")
    tree.create()
    folder = tree.job_attempts("j@1")
    (folder / "1" / "work").mkdir(parents=True)  # a crash left 1 without attempt.json
    (folder / "1" / "work" / "x").write_text("x")
    a = open_attempt(tree, "j@1", "w1")
    assert a.n == 2 and (a.dir / "attempt.json").is_file()


def test_a_first_attempt_known_as_such_is_numbered_without_a_listing(tmp_path: Path, monkeypatch):
    """A job the daemon accepted a moment ago: attempt 1, no listing of attempts/J/ (a round
    trip on a NAS), and no reservation folder needed beforehand."""
    tree = Tree.at(tmp_path / "spool")
    tree.create()
    real = os.listdir
    folder = str(tree.job_attempts("j@1"))
    monkeypatch.setattr(os, "listdir", lambda p=".": pytest.fail("listed") if str(p) == folder else real(p))
    a = open_attempt(tree, "j@1", "w1", first=True, claim=True)
    assert a.n == 1 and (a.dir / "attempt.json").is_file()


def test_a_wrong_first_guess_takes_the_next_free_number_never_a_used_one(tmp_path: Path):
    """Told "first" for a job that ran twice already (another host ran it while this
    daemon's index did not look): the refused renames lead to 3; 1 and 2 are untouched."""
    tree = Tree.at(tmp_path / "spool")
    tree.create()
    one = open_attempt(tree, "j@1", "w1")
    two = open_attempt(tree, "j@1", "w2")
    before = [(p / "attempt.json").read_bytes() for p in (one.dir, two.dir)]
    third = open_attempt(tree, "j@1", "w1", first=True)
    assert (one.n, two.n, third.n) == (1, 2, 3)
    assert [(p / "attempt.json").read_bytes() for p in (one.dir, two.dir)] == before
    assert msgspec.json.decode((third.dir / "attempt.json").read_bytes())["n"] == 3
    assert sorted(os.listdir(tree.job_attempts("j@1"))) == ["1", "2", "3"]  # no staging left


@pytest.mark.parametrize("first", [False, True], ids=["listed", "guessed-first"])
def test_a_claim_before_its_retry_delay_is_over_opens_no_attempt(tmp_path: Path, first: bool):
    """Another host failed the job and returned it with a delay after this worker looked it
    up: the claim's attempt is refused (NotYet) and nothing is created, whether its number
    came from a listing or from a first guess the refused rename proves wrong. Past the
    delay it opens; recovery's and cancel's attempts (not claims) never wait."""
    tree = Tree.at(tmp_path / "spool")
    tree.create()
    open_attempt(tree, "j@1", "w2")
    retry.delay_until(tree, "j@1", time.time() + 3600, 1, "test: a retryable failure elsewhere")
    before = sorted(os.listdir(tree.job_attempts("j@1")))
    with pytest.raises(NotYet) as early:
        open_attempt(tree, "j@1", "w1", first=first, claim=True)
    assert early.value.until > time.time() + 3000
    assert sorted(os.listdir(tree.job_attempts("j@1"))) == before == ["1", "delay.json"]
    assert open_attempt(tree, "j@1", "w1", reason="recovery of attempt 1").n == 2
    retry.delay_until(tree, "j@1", time.time() - 1, 2, "test: over")
    assert open_attempt(tree, "j@1", "w1", first=first, claim=True).n == 3
