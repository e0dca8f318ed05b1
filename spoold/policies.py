"""Recovery policy as a daemon hook: look after other workers' jobs.

Every ``stale_after / 4`` seconds (at least every 5 s) the daemon plans
recovery for the other workers that have jobs in ``running/``: jobs of a dead
worker on this host are recovered at once (that is certain); jobs of a
suspect worker on another host only when ``[recovery] auto_recover`` is on.
Staleness is measured on this daemon's own clock (``liveness.Observer``), so
clock skew between hosts cannot make a healthy worker look dead.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from spool import liveness, recover

from .hooks import Hook

if TYPE_CHECKING:
    from .daemon import Daemon

log = logging.getLogger("spoold.recovery")


class AutoRecover(Hook):
    def __init__(self) -> None:
        self.observer = liveness.Observer()
        self.next_check = 0.0

    def tick(self, daemon: Daemon) -> None:
        now = time.monotonic()
        if now < self.next_check or daemon.stopping:
            return
        self.next_check = now + min(5.0, daemon.cfg.recovery.stale_after / 4)
        plans = recover.plan(daemon.ctx, auto=True, observer=self.observer)
        for p in plans:
            if p.act:
                log.warning("recovering %d job(s) of %s: %s", len(p.jobs), p.worker, p.why)
        for outcome in recover.execute_plan(daemon.ctx, plans):
            daemon.carry_on(outcome)
            log.warning(
                "recovered %s: %s -> %s (%s)",
                outcome.job_id,
                outcome.decision,
                outcome.to_state,
                outcome.reason,
            )
