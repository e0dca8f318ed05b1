"""When to ask a provider again: the retry table, and provider-wide back-pressure.

Every remote operation of a generation has one declared policy (Temporal's
``RetryPolicy``): the first wait, its growth, its ceiling, how many tries at
most, and which errors no retry can help. The waits are bounded exponential
backoff with *full jitter* (``uniform(floor, min(ceiling, initial * factor**n))``),
so a batch of generations never asks in lockstep.

==========  =======  ======  =======  ========  =============================================
operation   initial  factor  ceiling  attempts  final (never retried)
==========  =======  ======  =======  ========  =============================================
create      2 s      2       60 s     5         invalid, unauthorized, lost, too_large
find        5 s      2       60 s     6         unauthorized
poll        polling  polling polling  deadline  lost, unauthorized
download    1 s      2       30 s     4         too_large, aborted
cancel      1 s      2       10 s     3         lost, unauthorized
==========  =======  ======  =======  ========  =============================================

``create``'s attempts bound every create *request* of one attempt (the ones the
provider certainly refused, and at most :data:`RECREATES` sent again after the
provider proved an ambiguous one made nothing); ``poll`` takes its numbers from
``[providers.<name>.polling]`` and is bounded by the attempt's deadline; each
entry but ``poll`` can be overridden in ``[providers.<name>.retries.<operation>]``.
A ``Retry-After`` (or ``retry-after-ms``) is honoured up to
``polling.retry_after_max``; no wait ever runs past the attempt's deadline (the
workflow fails the attempt instead of waiting in vain).

:class:`Backpressure` is the other half: a 429 or 5xx is the *provider's*
trouble, so none of that provider's requests go out until its ``Retry-After``
(or a growing backoff) has passed; other providers are unaffected. It lives in
the process (a daemon's generations share it), never on disk.
"""

from __future__ import annotations

import math
import random
import threading
from dataclasses import dataclass, replace

from spool.kinds.generate.providers.config import ProviderConfig, RetryOverride

#: Exponents beyond this are the ceiling anyway (and would overflow a float).
_MAX_EXP = 60
#: Times an ambiguous create may be sent again after the provider proved it made nothing.
RECREATES = 2


@dataclass(frozen=True)
class RetryPolicy:
    """One remote operation's retries."""

    initial: float
    factor: float
    ceiling: float
    #: Tries at most (the first one included); ``None``: until the attempt's deadline.
    attempts: int | None
    #: Error codes (:class:`~.providers.base.ProviderError` ``code``) no retry can help.
    final: frozenset[str]
    #: The shortest wait (full jitter never waits less: a zero wait would hammer).
    floor: float = 0.5

    def cap(self, n: int) -> float:
        """The longest wait after ``n`` tries: ``min(ceiling, initial * factor**n)``."""
        if n >= _MAX_EXP:
            return self.ceiling
        return min(self.ceiling, self.initial * self.factor**n)

    def wait(
        self, n: int, rng: random.Random, retry_after: float | None = None, most: float = 600.0
    ) -> float:
        """Seconds before try ``n + 1`` after ``n`` tries; a stated Retry-After wins (up to ``most``)."""
        if retry_after is not None and math.isfinite(retry_after) and retry_after >= 0:
            return min(most, max(retry_after, self.floor))
        return min(self.ceiling, max(self.floor, rng.uniform(0.0, self.cap(n))))

    def exhausted(self, tries: int) -> bool:
        return self.attempts is not None and tries >= self.attempts


#: The table above, before a provider's overrides.
TABLE: dict[str, RetryPolicy] = {
    "create": RetryPolicy(2.0, 2.0, 60.0, 5, frozenset({"invalid", "unauthorized", "lost", "too_large"})),
    "find": RetryPolicy(5.0, 2.0, 60.0, 6, frozenset({"unauthorized"})),
    "download": RetryPolicy(1.0, 2.0, 30.0, 4, frozenset({"too_large", "aborted"})),
    "cancel": RetryPolicy(1.0, 2.0, 10.0, 3, frozenset({"lost", "unauthorized"})),
}


def _apply(base: RetryPolicy, over: RetryOverride) -> RetryPolicy:
    changes = {
        k: v for k in ("initial", "factor", "ceiling", "attempts") if (v := getattr(over, k)) is not None
    }
    return replace(base, **changes) if changes else base


def policies(cfg: ProviderConfig) -> dict[str, RetryPolicy]:
    """The retry table for one provider: its polling settings and its overrides applied."""
    p = cfg.polling
    out = {op: _apply(pol, getattr(cfg.retries, op)) for op, pol in TABLE.items()}
    out["poll"] = RetryPolicy(
        p.base, p.factor, p.ceiling, None, frozenset({"lost", "unauthorized"}), floor=p.floor
    )
    return out


class Backpressure:
    """Per provider: the time before which none of its requests go out (see the module docstring)."""

    def __init__(self, rng: random.Random | None = None) -> None:
        self._until: dict[str, float] = {}
        self._streak: dict[str, int] = {}
        self._lock = threading.Lock()
        self._rng = rng or random.Random()

    def until(self, provider: str, now: float) -> float | None:
        """When the provider may be asked again (``None``: now), spread by up to a second so
        the waiting generations do not all ask the moment the block lifts."""
        with self._lock:
            t = self._until.get(provider)
        if t is None or t <= now:
            return None
        return t + self._rng.uniform(0.0, 1.0)

    def hit(
        self, provider: str, now: float, retry_after: float | None, poll: RetryPolicy, most: float
    ) -> float:
        """A 429 or 5xx from ``provider``: block it; returns until when."""
        with self._lock:
            streak = self._streak.get(provider, 0)
            self._streak[provider] = streak + 1
            wait = poll.wait(streak, self._rng, retry_after, most)
            t = max(self._until.get(provider, 0.0), now + wait)
            self._until[provider] = t
            return t

    def ok(self, provider: str) -> None:
        """The provider answered: its error streak is over."""
        with self._lock:
            self._streak.pop(provider, None)
