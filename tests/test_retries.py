"""The retry table per remote operation, and provider-wide back-pressure (pure, seeded)."""

from __future__ import annotations

import random

from spool.kinds.generate.providers.config import parse_provider
from spool.kinds.generate.retries import TABLE, Backpressure, RetryPolicy, policies


def test_full_jitter_stays_between_the_floor_and_the_growing_cap():
    p = RetryPolicy(1.0, 2.0, 30.0, 4, frozenset(), floor=0.5)
    rng = random.Random(3)
    for n in range(12):
        waits = [p.wait(n, rng) for _ in range(200)]
        assert min(waits) >= 0.5 and max(waits) <= min(30.0, 2.0**n)
    assert p.cap(100) == 30.0  # no overflow past the ceiling


def test_a_stated_retry_after_wins_up_to_the_most_and_attempts_bound_the_tries():
    p = TABLE["create"]
    rng = random.Random(1)
    assert p.wait(0, rng, retry_after=12.0, most=600.0) == 12.0
    assert p.wait(0, rng, retry_after=9000.0, most=600.0) == 600.0
    assert not p.exhausted(4) and p.exhausted(5)
    assert RetryPolicy(1, 2, 3, None, frozenset()).exhausted(10**6) is False


def test_each_entry_of_the_table_can_be_overridden_and_poll_follows_the_polling_settings():
    table = {"kind": "replicate", "base_url": "https://a", "token_env": "T"}
    table |= {"polling": {"base": 3.0, "ceiling": 9.0}}
    table |= {"retries": {"create": {"attempts": 2, "initial": 0.1}}}
    cfg = parse_provider("sim", table)
    table = policies(cfg)
    assert (table["create"].attempts, table["create"].initial, table["create"].ceiling) == (2, 0.1, 60.0)
    assert table["find"] == TABLE["find"]
    assert (table["poll"].initial, table["poll"].ceiling, table["poll"].attempts) == (3.0, 9.0, None)
    assert {"lost", "unauthorized"} <= table["poll"].final


def test_back_pressure_blocks_one_provider_and_grows_until_it_answers():
    bp = Backpressure(random.Random(5))
    poll = RetryPolicy(1.0, 2.0, 60.0, None, frozenset(), floor=0.5)
    assert bp.until("a", 100.0) is None
    first = bp.hit("a", 100.0, None, poll, 600.0)
    assert 100.5 <= first <= 101.0 and bp.until("b", 100.0) is None  # other providers go on
    later = [bp.hit("a", 100.0, None, poll, 600.0) for _ in range(6)]
    assert max(later) > first
    assert bp.hit("a", 100.0, 30.0, poll, 600.0) >= 130.0  # a stated Retry-After wins
    assert 130.0 <= bp.until("a", 100.0) <= 131.0  # spread by up to a second
    bp.ok("a")
    assert bp.hit("a", 200.0, None, poll, 600.0) <= 201.0  # the streak starts over
