"""The daemon's claim index stays cheap on a big queue: what was claimed is not
skipped again on every claim, new keys are merged rather than sorted again, and
the oldest pending age is found without a pass over every key."""

from __future__ import annotations

import json
import random
import time
from pathlib import Path

import pytest

from spool.disk.tree import Tree
from spool.queue import claim, retry


@pytest.fixture()
def tree(tmp_path: Path) -> Tree:
    t = Tree.at(tmp_path / "spool")
    t.create()
    return t


def _write(tree: Tree, jid: str, priority: int, minute: int, second: int) -> None:
    body = {
        "job_id": jid,
        "operation": "noop",
        "priority": priority,
        "submitted_at": f"2026-01-01T{minute // 60:02d}:{minute % 60:02d}:{second:02d}Z",
    }
    (tree.pending / f"{jid}.json").write_text(json.dumps(body))


def _indexed(tree: Tree) -> claim.PendingIndex:
    index = claim.PendingIndex(tree)
    while index.refresh() < len(list(tree.pending.iterdir())) or index.backlog:
        pass
    return index


def _expected(index: claim.PendingIndex) -> list[str]:
    return [k.job_id for k in sorted(index._keys.values())]


def test_claim_order_drops_claimed_entries_instead_of_skipping_them_each_time(tree: Tree):
    n = 300
    for i in range(n):
        jid = f"j{i:04d}@1"
        body = {
            "job_id": jid,
            "operation": "noop",
            "priority": i % 3,
            "submitted_at": f"2026-01-01T00:{i // 60:02d}:{i % 60:02d}Z",
        }
        (tree.pending / f"{jid}.json").write_text(json.dumps(body))
    index = claim.PendingIndex(tree)
    while index.refresh() < n or index.backlog:
        pass
    taken = []
    for _ in range(n - 10):
        jid = next(index.ordered())
        # What was claimed before is gone from the front: this call started at a live entry.
        assert len(index._sorted) == n - len(taken)
        index.discard(jid)
        taken.append(jid)
    assert len(set(taken)) == n - 10
    assert list(index.ordered()) == [k.job_id for k in sorted(index._keys.values())]


def test_many_new_jobs_join_the_order_exactly(tree: Tree):
    rng = random.Random(7)
    for i in range(400):
        _write(tree, f"a{i:04d}@1", rng.choice((0, 5, 10)), rng.randrange(600), rng.randrange(60))
    index = _indexed(tree)
    for i in range(300):  # more than 64 at once: appended and sorted with the rest
        _write(tree, f"b{i:04d}@1", rng.choice((0, 5, 10, 20)), rng.randrange(600), rng.randrange(60))
    index._next_listing = 0.0
    while index.refresh() < 700 or index.backlog:
        pass
    assert list(index.ordered()) == _expected(index)
    assert len(index._sorted) == 700


def test_oldest_submitted_is_the_minimum_over_every_band_and_ignores_what_left(tree: Tree):
    rng = random.Random(3)
    for i in range(500):
        _write(tree, f"j{i:04d}@1", rng.choice((-5, 0, 3, 10)), rng.randrange(1, 600), rng.randrange(60))
    _write(tree, "old@1", 0, 0, 0)  # the oldest, in a middle band
    index = _indexed(tree)
    everything = lambda: min(k.submitted for k in index._keys.values())  # noqa: E731
    assert index.oldest_submitted() == everything()
    index.discard("old@1")  # claimed elsewhere: its key is stale in the order
    assert index.oldest_submitted() == everything()
    for jid in rng.sample(sorted(index._keys), 400):
        index.discard(jid)
        assert index.oldest_submitted() == everything()


def test_a_job_indexed_from_its_accepted_bytes_is_not_looked_up_for_a_delay(tree: Tree, monkeypatch):
    """A job this daemon accepted a moment ago has had no attempt: no delay.json, no
    blocked-*.json to look for when it comes up. One indexed from its file is looked up."""
    looked: list[str] = []
    monkeypatch.setattr(claim.retry, "not_before", lambda t, jid: looked.append(jid))
    _write(tree, "old@1", 0, 1, 0)
    index = _indexed(tree)
    body = {"job_id": "new@1", "operation": "noop", "priority": 0, "submitted_at": "2026-01-01T00:02:00Z"}
    index.note_accepted("new@1", json.dumps(body).encode())
    assert list(index.ordered()) == ["old@1", "new@1"]
    assert looked == ["old@1"]


def test_number_1_is_guessed_for_a_job_accepted_here_or_found_without_a_delay(tree: Tree):
    """An attempt is numbered 1 without a listing (guess_first) for a job accepted by this
    process, or one whose lookup found no retry delay; a job with a delay has run before."""
    _write(tree, "old@1", 0, 1, 0)
    _write(tree, "retried@1", 0, 1, 1)
    (tree.attempts / "retried@1").mkdir()
    retry.delay_until(tree, "retried@1", time.time() - 5, 1, "a retryable failure")  # over
    index = _indexed(tree)
    body = {"job_id": "new@1", "operation": "noop", "priority": 0, "submitted_at": "2026-01-01T00:02:00Z"}
    index.note_accepted("new@1", json.dumps(body).encode())
    assert index.guess_first("new@1") and not index.guess_first("old@1")  # not looked up yet
    assert sorted(index.ordered()) == ["new@1", "old@1", "retried@1"]
    assert index.guess_first("old@1") and not index.guess_first("retried@1")
    index.discard("new@1")  # claimed (by anyone): back in pending/ later, it may have run
    assert not index.guess_first("new@1")
