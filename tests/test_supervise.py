"""spool.queue.supervise: the stop, timeout and cancel loop a render (and later a generation) runs under."""

from __future__ import annotations

import itertools
import threading
import time

from spool.queue.supervise import supervise


class Work:
    """Work that ends by itself after ``ticks`` ticks; records the waits it was given."""

    def __init__(self, ticks: int = 10**9) -> None:
        self.left, self.waits = ticks, []

    def tick(self, wait: float) -> bool:
        self.waits.append(wait)
        time.sleep(min(wait, 0.01))
        self.left -= 1
        return self.left > 0


def test_work_that_ends_by_itself_is_not_stopped():
    w = Work(ticks=3)
    assert supervise(w.tick, deadline=time.monotonic() + 60, wait=0.05) is None
    assert w.waits == [0.05, 0.05, 0.05]


def test_past_the_deadline_is_a_timeout():
    w = Work()
    t0 = time.monotonic()
    assert supervise(w.tick, deadline=t0 + 0.1) == "timeout"
    assert 0.1 <= time.monotonic() - t0 < 1.0


def test_stop_is_an_interruption_and_wins_over_the_other_reasons():
    stop = threading.Event()
    stop.set()
    w = Work()
    got = supervise(w.tick, deadline=time.monotonic() - 1, stop=stop, cancelled=lambda: True)
    assert got == "interrupted" and w.waits == []  # checked before the first tick


def test_cancel_is_asked_at_once_then_at_most_every_cancel_every_seconds():
    asked: list[float] = []

    def cancelled() -> bool:
        asked.append(time.monotonic())
        return len(asked) == 3

    w = Work()
    t0 = time.monotonic()
    assert supervise(w.tick, deadline=t0 + 60, cancelled=cancelled, cancel_every=0.1) == "cancelled"
    assert asked[0] - t0 < 0.05 and len(w.waits) >= 10  # many ticks, only three questions
    assert all(b - a >= 0.1 for a, b in itertools.pairwise(asked))
