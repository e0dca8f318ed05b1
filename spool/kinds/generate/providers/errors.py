"""What a provider call can end in, without the HTTP side: the normalised statuses
and :class:`ProviderError` (see :mod:`.base` for the contract and what each
``outcome`` lets the caller do).

Its own module so that the generate runner, which every command decoding a job
imports, names these at the top of its module without loading httpx (which
:mod:`.base` needs, and which brings click and rich); :mod:`.base` re-exports them.
"""

from __future__ import annotations

from typing import Literal

from spool.core import secrets
from spool.core.errors import SpoolError

#: Normalised provider statuses. ``queued`` covers "accepted, not started" and
#: "throttled"; ``failed`` covers the provider's own aborts; ``unknown`` is a status
#: the provider does not document (never final: polled until the deadline).
Status = Literal["queued", "running", "succeeded", "failed", "canceled", "unknown"]
#: Statuses after which a generation never changes at the provider.
FINAL: frozenset[str] = frozenset({"succeeded", "failed", "canceled"})

Outcome = Literal["retryable", "final", "ambiguous"]


class ProviderError(SpoolError):
    """A provider operation that did not give an answer; ``outcome`` says what may follow."""

    def __init__(
        self,
        provider: str,
        operation: str,
        problem: str,
        *,
        outcome: Outcome,
        code: str,
        http_status: int | None = None,
        retry_after: float | None = None,
        next_action: str | None = None,
    ) -> None:
        self.provider = provider
        self.operation = operation
        self.problem = secrets.redact(problem)
        self.outcome: Outcome = outcome
        #: A short machine tag: rate_limited, quota, server_error, timeout, connect,
        #: unauthorized, lost, invalid, bad_reply, transit, truncated, too_large, checksum,
        #: expired, stalled, aborted, http.
        self.code = code
        self.http_status = http_status
        self.retry_after = retry_after
        self.next_action = next_action
        text = f"provider {provider!r}: {operation} {self.problem}"
        if next_action:
            text += f"; next: {next_action}"
        super().__init__(text)

    @property
    def retryable(self) -> bool:
        return self.outcome == "retryable"

    @property
    def back_pressure(self) -> bool:
        """Whether the whole provider (not just this job) should be left alone for a while."""
        return self.code in ("rate_limited", "server_error")
