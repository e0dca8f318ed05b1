"""The poll scheduler under an injected clock and RNG: backoff, back-pressure, rebuild, scale."""

from __future__ import annotations

import random
import threading
import tracemalloc

from spool.polling import DefaultPolicy, Persisted, PollScheduler, backoff, cap, retry_after_wait
from spool.providers.config import Polling


class Clock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


POLICY = Polling(first=5.0, base=2.0, factor=2.0, ceiling=60.0, floor=0.5, retry_after_max=300.0)


def sched(clock: Clock, seed: int = 1, **policies: Polling) -> PollScheduler:
    return PollScheduler(policies or {"rep": POLICY, "run": POLICY}, clock=clock, rng=random.Random(seed))


def test_full_jitter_backoff_stays_between_floor_and_the_growing_cap() -> None:
    rng = random.Random(7)
    for n in range(200):
        waits = [backoff(POLICY, n, rng) for _ in range(50)]
        assert all(
            POLICY.floor <= w <= min(POLICY.ceiling, cap(POLICY, n)) or w == POLICY.floor for w in waits
        )
        assert max(waits) <= POLICY.ceiling
        if cap(POLICY, n) > 4:
            assert len({round(w, 6) for w in waits}) > 40  # jittered, not lockstep
    assert cap(POLICY, 3) == 16.0 and cap(POLICY, 10) == 60.0 and cap(POLICY, 10_000) == 60.0


def test_retry_after_is_honoured_and_capped() -> None:
    rng = random.Random(1)
    assert retry_after_wait(POLICY, 7.0, 0, rng) == 7.0
    assert retry_after_wait(POLICY, 10_000.0, 0, rng) == 300.0
    assert retry_after_wait(POLICY, 0.0, 0, rng) == POLICY.floor
    no_header = [retry_after_wait(POLICY, None, s, rng) for s in range(8)]
    assert no_header[-1] > no_header[0]  # consecutive 5xx without Retry-After back off further


def test_first_poll_waits_first_plus_jitter_and_pops_in_due_order() -> None:
    clock = Clock()
    s = sched(clock)
    for i in range(5):
        due = s.add(f"j{i}", "rep")
        assert clock.t + 5.0 <= due <= clock.t + 7.0
    assert s.pop_due() == []
    clock.t += 7.0
    due = s.pop_due()
    assert sorted(d.key for d in due) == [f"j{i}" for i in range(5)]
    assert s.pop_due() == []  # in flight until reported
    times = [s.report(d.key, "pending") for d in due]
    assert all(t is not None and clock.t + 0.5 <= t <= clock.t + 4.0 for t in times)


def test_a_429_blocks_every_job_of_that_provider_until_retry_after_but_not_others() -> None:
    clock = Clock()
    s = sched(clock)
    for i in range(3):
        s.add(f"rep{i}", "rep", due=clock.t)
        s.add(f"run{i}", "run", due=clock.t)
    first = s.pop_due(limit=1)[0]
    assert first.provider == "rep"
    s.report(first.key, "rate_limited", retry_after=30.0)
    assert s.blocked_until("rep") == clock.t + 30.0
    now = s.pop_due()
    assert {d.provider for d in now} == {"run"} and len(now) == 3  # the other provider is polled
    for d in now:
        s.report(d.key, "pending")
    clock.t += 29.0
    assert [d for d in s.pop_due() if d.provider == "rep"] == []
    clock.t += 3.5  # past Retry-After plus the spread window (base = 2 s)
    assert {d.key for d in s.pop_due() if d.provider == "rep"} == {"rep0", "rep1", "rep2"}
    assert s.counts[("rep", "rate_limited")] == 1


def test_5xx_streak_blocks_longer_and_a_good_answer_resets_it() -> None:
    clock = Clock()
    s = sched(clock, seed=3)
    s.add("a", "rep", due=clock.t)
    waits = []
    for _ in range(6):
        clock.t = s.next_due() or clock.t
        (d,) = s.pop_due()
        nxt = s.report(d.key, "server_error")
        assert nxt is not None
        waits.append(nxt - clock.t)
    assert waits[-1] > waits[0] and max(waits) <= POLICY.ceiling
    clock.t = s.next_due() or clock.t
    (d,) = s.pop_due()
    s.report(d.key, "pending")
    assert s._streak.get("rep") is None


def test_deadline_caps_the_next_poll_and_is_flagged_expired() -> None:
    clock = Clock()
    s = sched(clock)
    s.add("a", "rep", deadline=clock.t + 3.0)
    assert s.due_time("a") == clock.t + 3.0
    clock.t += 3.0
    (d,) = s.pop_due()
    assert d.expired


def test_rebuild_restores_the_schedule_from_persisted_times() -> None:
    clock = Clock()
    persisted = [
        Persisted("late", "rep", clock.t + 50, polls=4),
        Persisted("past", "run", clock.t - 10, polls=9),
        Persisted("soon", "rep", clock.t + 5, polls=1, deadline=clock.t + 2),
    ]
    s = PollScheduler.rebuild(persisted, {"rep": POLICY, "run": POLICY}, clock=clock, rng=random.Random(1))
    assert len(s) == 3
    assert [d.key for d in s.pop_due()] == ["past"]  # overdue after the restart: polled at once
    assert s.next_due() == clock.t + 2  # the deadline caps "soon"
    clock.t += 100
    assert [(d.key, d.polls) for d in s.pop_due()] == [("soon", 1), ("late", 4)]


def test_same_seed_same_schedule() -> None:
    def run(seed: int) -> list[float | None]:
        clock = Clock()
        s = sched(clock, seed=seed)
        out = [s.add(f"j{i}", "rep") for i in range(20)]
        clock.t += 10
        out += [s.report(d.key, "pending") for d in s.pop_due()]
        return out

    assert run(5) == run(5) and run(5) != run(6)


def test_ten_thousand_jobs_bounded_memory_no_threads() -> None:
    clock = Clock()
    s = sched(clock)
    threads = threading.active_count()
    tracemalloc.start()
    n = 10_000
    for i in range(n):
        s.add(f"job-{i:05d}@1/1", "rep" if i % 2 else "run")
    polls = 0
    for _ in range(200):  # ~ an hour and a half of simulated time
        clock.t = max(clock.t + 0.5, s.next_due() or clock.t)
        for d in s.pop_due(limit=2000):
            polls += 1
            s.report(d.key, "pending")
        assert s.heap_size <= 2 * len(s) + 64
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert threading.active_count() == threads
    assert len(s) == n and polls > n
    assert peak < 8 * 2**20, f"peak {peak / 2**20:.1f} MiB for {n} jobs"


def test_polls_approach_the_ceiling_rate_for_a_long_generation() -> None:
    """A 10-minute generation is polled about as often as the ceiling allows, not more."""
    clock = Clock(0.0)
    s = PollScheduler({"rep": POLICY}, clock=clock, rng=random.Random(2), default=DefaultPolicy())
    s.add("long", "rep")
    polls = 0
    while True:
        clock.t = s.next_due() or clock.t
        (d,) = s.pop_due()
        polls += 1
        if clock.t >= 600:
            s.report(d.key, "done")
            break
        s.report(d.key, "pending")
    # Full jitter averages ceiling/2 once capped: about 600/30 = 20 polls, plus the ramp.
    assert 15 <= polls <= 40 and len(s) == 0
