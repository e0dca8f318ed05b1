"""Attempt threads are reused between jobs (spoold.slots)."""

from __future__ import annotations

import threading
import time

from spoold.slots import SlotThreads


def test_sequential_calls_reuse_one_thread_and_each_runs_once():
    pool = SlotThreads(idle_timeout=5.0)
    ran: list[int] = []
    for i in range(20):
        slot = pool.run(f"job-{i}", lambda i=i: ran.append(i))
        slot.join(5.0)
        assert not slot.is_alive()
    assert ran == list(range(20))
    assert pool.started == 1, "an idle thread takes the next job; none is started per job"


def test_overlapping_calls_each_get_a_thread_at_once():
    pool = SlotThreads(idle_timeout=5.0)
    release = threading.Event()
    started = threading.Semaphore(0)

    def work() -> None:
        started.release()
        release.wait(10)

    slots = [pool.run(f"job-{i}", work) for i in range(4)]
    for _ in range(4):  # all four run together: none waits for a free thread
        assert started.acquire(timeout=5.0)
    assert all(s.is_alive() for s in slots)
    release.set()
    for s in slots:
        s.join(5.0)
    assert not any(s.is_alive() for s in slots)
    assert pool.started == 4


def test_a_failing_call_still_ends_its_slot_and_the_thread_serves_on():
    pool = SlotThreads(idle_timeout=5.0)

    def boom() -> None:
        raise RuntimeError("the attempt's own error")

    threading.excepthook, old = (lambda args: None), threading.excepthook
    try:
        slot = pool.run("job-boom", boom)
        slot.join(5.0)
        assert not slot.is_alive()
    finally:
        threading.excepthook = old


def test_idle_threads_end_after_the_timeout():
    pool = SlotThreads(idle_timeout=0.2)
    before = threading.active_count()
    pool.run("job-a", lambda: None).join(5.0)
    deadline = time.monotonic() + 5.0
    while threading.active_count() > before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert threading.active_count() == before, "the idle thread ended"
    pool.run("job-b", lambda: None).join(5.0)
    assert pool.started == 2, "a new thread once the idle one had ended"
