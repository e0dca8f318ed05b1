"""A broken invariant found in a spool: what ``spool fsck`` reports, and what every
checker it asks (the library index's, a kind's) returns to it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Problem:
    invariant: int  # SPEC section 11 item
    path: str  # relative to the spool root
    problem: str
    repair: str | None = None  # the repair done (or that would be done)
    repaired: bool = False

    @property
    def open(self) -> bool:
        return not self.repaired
