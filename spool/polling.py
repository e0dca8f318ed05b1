"""When to ask a provider about a generation again: a heap of due polls.

One :class:`PollScheduler` serves every generation a daemon has in flight:
thousands of them cost one heap entry and one small record each, and no
thread. It is pure: time comes from an injected clock and jitter from an
injected ``random.Random``, so every decision is reproducible in a test.

Policy (per provider, :class:`spool.providers.config.Polling`):

* the first poll comes ``first`` seconds after the create, plus up to ``base``
  of jitter so a batch of submissions does not poll in lockstep;
* after each answer "still working", the next poll waits a *full jitter*
  backoff: ``uniform(0, min(ceiling, base * factor**polls))``, never below
  ``floor`` (AWS's "full jitter": spreads load, bounded by ``ceiling``);
* a 429 (or a 5xx) is *provider* back-pressure: none of that provider's jobs is
  polled until ``Retry-After`` has passed (capped at ``retry_after_max``; a 5xx
  without one blocks for a backoff that grows with consecutive errors). Jobs of
  other providers are unaffected;
* an attempt's deadline caps its next poll time, so an expired attempt is
  noticed on time;
* after a restart :meth:`PollScheduler.rebuild` restores the schedule from the
  next-poll times the attempts persisted (a time in the past is due at once).

The caller owns the I/O: :meth:`pop_due` hands out what is due now (those keys
are "in flight" until :meth:`report` says how the poll went), and
:meth:`next_due` says how long the daemon may sleep.
"""

from __future__ import annotations

import heapq
import math
import random
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Literal, Protocol

#: How a poll went, as far as scheduling cares.
#: ``pending``: the provider answered and the job is still queued or running;
#: ``done``: the job needs no more polls (final at the provider, or abandoned);
#: ``rate_limited``: HTTP 429; ``server_error``: 5xx (both provider back-pressure);
#: ``error``: this job's request failed otherwise (timeout, connection): job backoff only.
Outcome = Literal["pending", "done", "rate_limited", "server_error", "error"]

#: Exponents beyond this are the ceiling anyway (and would overflow a float).
_MAX_EXP = 60


class Policy(Protocol):
    """The knobs :func:`backoff` reads (``[providers.<name>.polling]``)."""

    @property
    def first(self) -> float: ...
    @property
    def base(self) -> float: ...
    @property
    def factor(self) -> float: ...
    @property
    def ceiling(self) -> float: ...
    @property
    def floor(self) -> float: ...
    @property
    def retry_after_max(self) -> float: ...


@dataclass(frozen=True)
class DefaultPolicy:
    first: float = 5.0
    base: float = 2.0
    factor: float = 2.0
    ceiling: float = 60.0
    floor: float = 0.5
    retry_after_max: float = 600.0


def cap(policy: Policy, n: int) -> float:
    """The largest wait after ``n`` answers: ``min(ceiling, base * factor**n)``."""
    if n >= _MAX_EXP:
        return policy.ceiling
    return min(policy.ceiling, policy.base * policy.factor**n)


def backoff(policy: Policy, n: int, rng: random.Random) -> float:
    """Full-jitter wait after ``n`` polls: uniform in ``[0, cap]``, at least ``floor``."""
    return min(policy.ceiling, max(policy.floor, rng.uniform(0.0, cap(policy, n))))


def retry_after_wait(policy: Policy, retry_after: float | None, streak: int, rng: random.Random) -> float:
    """How long a provider under back-pressure is left alone.

    A stated ``Retry-After`` is honoured (up to ``retry_after_max``); without
    one the wait grows with consecutive errors (``streak``), jittered.
    """
    if retry_after is not None and math.isfinite(retry_after) and retry_after >= 0:
        return min(policy.retry_after_max, max(retry_after, policy.floor))
    return max(policy.floor, rng.uniform(0.5, 1.0) * cap(policy, streak))


class _Entry:
    __slots__ = ("deadline", "due", "polls", "provider", "seq")

    def __init__(
        self, provider: str, due: float | None, seq: int, polls: int, deadline: float | None
    ) -> None:
        self.provider = provider
        self.due = due  # None while the poll is in flight
        self.seq = seq
        self.polls = polls
        self.deadline = deadline


@dataclass(frozen=True)
class Due:
    """A poll to make now."""

    key: str
    provider: str
    #: Polls answered so far (the backoff exponent).
    polls: int
    #: Whether the attempt's deadline has passed (cancel instead of polling).
    expired: bool


@dataclass(frozen=True)
class Persisted:
    """What an attempt persisted about its polling (for :meth:`PollScheduler.rebuild`)."""

    key: str
    provider: str
    next_poll_at: float
    polls: int = 0
    deadline: float | None = None


class PollScheduler:
    """Due polls of many generations, keyed by next poll time; see the module docstring."""

    def __init__(
        self,
        policies: Mapping[str, Policy],
        *,
        clock: Callable[[], float],
        rng: random.Random | None = None,
        default: Policy | None = None,
    ) -> None:
        self._policies = dict(policies)
        self._default: Policy = default or DefaultPolicy()
        self._clock = clock
        self._rng = rng or random.Random()
        self._heap: list[tuple[float, int, str]] = []
        self._entries: dict[str, _Entry] = {}
        self._seq = 0
        #: provider -> time before which none of its jobs is polled.
        self._blocked: dict[str, float] = {}
        #: provider -> consecutive 429/5xx answers.
        self._streak: dict[str, int] = {}
        #: Counters for metrics: polls, rate_limited, server_error, error per provider.
        self.counts: Counter[tuple[str, str]] = Counter()

    # -- bookkeeping ---------------------------------------------------------------
    def policy(self, provider: str) -> Policy:
        return self._policies.get(provider, self._default)

    def set_policies(self, policies: Mapping[str, Policy]) -> None:
        """New per-provider policies (a reloaded config): they apply from each job's next
        report; polls already scheduled keep their time."""
        self._policies = dict(policies)

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: str) -> bool:
        return key in self._entries

    @property
    def heap_size(self) -> int:
        """Entries in the heap, stale ones included (bounded: see :meth:`_compact`)."""
        return len(self._heap)

    def _push(self, key: str, entry: _Entry, due: float) -> float:
        if entry.deadline is not None:
            due = min(due, entry.deadline)
        self._seq += 1
        entry.due, entry.seq = due, self._seq
        heapq.heappush(self._heap, (due, self._seq, key))
        self._compact()
        return due

    def _compact(self) -> None:
        # Rescheduling leaves stale heap entries behind; rebuild when they dominate.
        if len(self._heap) > 2 * len(self._entries) + 64:
            self._heap = [(e.due, e.seq, k) for k, e in self._entries.items() if e.due is not None]
            heapq.heapify(self._heap)

    def blocked_until(self, provider: str) -> float | None:
        until = self._blocked.get(provider)
        return until if until is not None and until > self._clock() else None

    # -- the API -------------------------------------------------------------------------
    def add(
        self,
        key: str,
        provider: str,
        *,
        due: float | None = None,
        polls: int = 0,
        deadline: float | None = None,
    ) -> float:
        """Schedule a new generation (first poll per policy unless ``due`` is given)."""
        if due is None:
            p = self.policy(provider)
            due = self._clock() + p.first + self._rng.uniform(0.0, p.base)
        entry = _Entry(provider, None, 0, polls, deadline)
        self._entries[key] = entry
        return self._push(key, entry, due)

    def discard(self, key: str) -> None:
        """Forget a generation (done, cancelled, or taken over by another host)."""
        self._entries.pop(key, None)
        self._compact()

    def pop_due(self, limit: int | None = None) -> list[Due]:
        """The polls due now, earliest first; each is in flight until :meth:`report`."""
        now = self._clock()
        out: list[Due] = []
        deferred: list[tuple[str, _Entry, float]] = []
        while self._heap and self._heap[0][0] <= now and (limit is None or len(out) < limit):
            _, seq, key = heapq.heappop(self._heap)
            entry = self._entries.get(key)
            if entry is None or entry.seq != seq or entry.due is None:
                continue  # stale
            expired = entry.deadline is not None and now >= entry.deadline
            until = self._blocked.get(entry.provider)
            if until is not None and until > now and not expired:
                # Provider back-pressure: spread the waiting jobs over a short window after it lifts.
                spread = self._rng.uniform(0.0, self.policy(entry.provider).base)
                deferred.append((key, entry, until + spread))
                continue
            entry.due = None
            out.append(Due(key, entry.provider, entry.polls, expired))
        for key, entry, when in deferred:
            self._push(key, entry, when)
        return out

    def report(self, key: str, outcome: Outcome, *, retry_after: float | None = None) -> float | None:
        """How a poll of ``key`` went -> its next due time (``None``: no more polls)."""
        entry = self._entries.get(key)
        if entry is None:
            return None
        provider = entry.provider
        p = self.policy(provider)
        now = self._clock()
        self.counts[(provider, "polls")] += 1
        if outcome == "done":
            self._streak.pop(provider, None)
            self.discard(key)
            return None
        if outcome in ("rate_limited", "server_error"):
            self.counts[(provider, outcome)] += 1
            streak = self._streak.get(provider, 0) + 1
            self._streak[provider] = streak
            wait = retry_after_wait(p, retry_after, streak - 1, self._rng)
            self._blocked[provider] = max(self._blocked.get(provider, 0.0), now + wait)
            return self._push(key, entry, now + wait)
        if outcome == "error":
            self.counts[(provider, "error")] += 1
            entry.polls += 1
            return self._push(key, entry, now + backoff(p, entry.polls, self._rng))
        # pending: the provider answered, so it is healthy again.
        self._streak.pop(provider, None)
        entry.polls += 1
        return self._push(key, entry, now + backoff(p, entry.polls, self._rng))

    def next_due(self) -> float | None:
        """The earliest time a poll may be due (for the daemon's sleep), or ``None``.

        A blocked provider's jobs may make this early; :meth:`pop_due` then
        moves them past the block, so the daemon wakes at most once per block.
        """
        while self._heap:
            due, seq, key = self._heap[0]
            entry = self._entries.get(key)
            if entry is None or entry.seq != seq or entry.due is None:
                heapq.heappop(self._heap)
                continue
            return due
        return None

    def due_time(self, key: str) -> float | None:
        """When ``key`` is next polled (to persist as the attempt's next eligible poll time)."""
        entry = self._entries.get(key)
        return None if entry is None else entry.due

    @classmethod
    def rebuild(
        cls,
        persisted: Iterable[Persisted],
        policies: Mapping[str, Policy],
        *,
        clock: Callable[[], float],
        rng: random.Random | None = None,
    ) -> PollScheduler:
        """A scheduler restored from the attempts' persisted next-poll times."""
        s = cls(policies, clock=clock, rng=rng)
        for p in persisted:
            s.add(p.key, p.provider, due=p.next_poll_at, polls=p.polls, deadline=p.deadline)
        return s
