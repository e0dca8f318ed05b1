"""The daemon's policies, each a part composed like middleware (:mod:`spoold.hooks`).

* :class:`HostQuarantine`: a host that fails job after job for reasons of its own stops
  claiming (the self-check at start, a streak of host-class failures), until an operator
  lifts it.
* :class:`AutoRecover`: look after other workers' jobs.

AutoRecover:

Every ``stale_after / 4`` seconds (at least every 5 s) the daemon plans
recovery for the other workers that have jobs in ``running/``: jobs of a dead
worker on this host are recovered at once (that is certain); jobs of a
suspect worker on another host only when ``[recovery] auto_recover`` is on.
Staleness is measured on this daemon's own clock (``liveness.Observer``), so
clock skew between hosts cannot make a healthy worker look dead.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING

from spool import kinds
from spool.queue import blocklist, health, liveness
from spool.repair import recover
from spoold.hooks import Hook

if TYPE_CHECKING:
    from spoold.daemon import Daemon

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


class HostQuarantine(Hook):
    """Host quarantine (:mod:`spool.queue.health`): before the first claim a quarantine left from
    before stays in force and the self-check must pass; ``[health] quarantine_after``
    host-class failures in a row quarantine the worker; an operator lifts it by removing
    its file (``spool worker release``). It sets ``daemon.quarantined`` (the reason, or
    ``None``), which the loop reads before claiming."""

    def __init__(self) -> None:
        self.streak: health.Streak | None = None
        self.lock = threading.Lock()  # slot threads end at once: one of them quarantines, once
        self.next_look = 0.0

    def started(self, daemon: Daemon) -> None:
        self.streak = health.Streak(daemon.cfg.health.quarantine_after)
        q = health.quarantined(daemon.tree, daemon.worker)
        if q is not None:
            daemon.quarantined = q.reason
            log.error(
                "quarantined since %s: %s; spool worker release %s lifts it", q.since, q.reason, daemon.worker
            )
            return
        if not daemon.cfg.health.self_check:
            return
        for kind in kinds.KINDS.values():  # each kind checks what it needs of this host
            result = kind.self_check(daemon.cfg)
            if result is None:
                continue
            if not result.ok:
                reason = f"self-check failed at step {result.step!r}: {result.detail}"
                health.quarantine(daemon.tree, daemon.worker, reason, [f"{result.step}: {result.detail}"])
                daemon.quarantined = reason
                log.error(
                    "%s; this worker claims nothing until spool worker release %s", reason, daemon.worker
                )
                return
            log.info(
                "%s self-check passed%s",
                kind.name,
                " (unchanged since last time)" if result.cached else f" in {result.seconds:.1f} s",
            )

    def tick(self, daemon: Daemon) -> None:
        now = time.monotonic()
        if daemon.quarantined is None or now < self.next_look:
            return
        self.next_look = now + daemon.cfg.daemon.poll_interval
        if health.quarantined(daemon.tree, daemon.worker) is None:
            log.info("quarantine lifted: claiming again")
            daemon.quarantined = None
            with self.lock:
                self.streak = health.Streak(daemon.cfg.health.quarantine_after)

    def attempt_ended(self, daemon: Daemon, job_id: str, outcome: str) -> None:
        why = ""
        if outcome in ("blocked", "host-failed"):
            entry = next(
                (e for e in blocklist.entries(daemon.tree, job_id) if e.worker == daemon.worker), None
            )
            why = entry.message if entry else ""
        with self.lock:
            if self.streak is None:
                self.streak = health.Streak(daemon.cfg.health.quarantine_after)
            if not self.streak.note(outcome, job_id, why) or daemon.quarantined is not None:
                return
            reason = (
                f"{len(self.streak.evidence)} host-class failures in a row "
                f"([health] quarantine_after = {daemon.cfg.health.quarantine_after})"
            )
            health.quarantine(daemon.tree, daemon.worker, reason, list(self.streak.evidence))
            daemon.quarantined = reason
        log.error("quarantined: %s; last: %s; spool worker release %s lifts it", reason, why, daemon.worker)
