"""The daemon's policies, each a part composed like middleware (:mod:`spoold.hooks`).

:func:`policies` is the table, in the order the daemon consults it:

* :class:`HostQuarantine`: a host that fails job after job for reasons of its own stops
  claiming (the self-check at start, a streak of host-class failures), until an operator
  lifts it.
* :class:`Backoff`: a failing step (of the start or of the loop) backs off; a full
  disk is one line, a visible state (``disk_full`` in the heartbeat) and a wait for
  space, proven by the next heartbeat written.
* :class:`ConfigReload`: ``spool.toml`` re-read when it changes and on SIGHUP.
* :class:`OrphanRecovery`: this daemon's own running jobs whose attempt ended
  abnormally are recovered by evidence, with backoff (:class:`Orphans`).
* :class:`IndexTidy`: format 2's library index segments compacted or merged when due,
  off the job path.
* :class:`LeftoverSweep`: what interrupted writes of this host's dead processes left
  (hidden temp names, attempt staging folders) removed once after the start, off the
  job path: over a NAS the walk of every job's folders is ~15 requests a finished job.
* :class:`AutoRecover`: look after other workers' jobs.

Each reads and changes the daemon only through its named surface (the ``Hook``
docstring lists it), never a private attribute.

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
from spool.core import config, secrets
from spool.core.config import Config
from spool.disk import diskfull, formats
from spool.disk.tree import Tree, apply_umask
from spool.library import segments
from spool.queue import blocklist, health, liveness, workers
from spool.repair import fsck, recover
from spoold.hooks import Hook

if TYPE_CHECKING:
    from spoold.daemon import Daemon

log = logging.getLogger("spoold.recovery")
loop_log = logging.getLogger("spoold")


def policies(tree: Tree, cfg: Config) -> list[Hook]:
    """The policies every daemon runs with, in the order they are consulted."""
    return [
        LeftoverSweep(),  # first: its thread walks while the self-check renders
        HostQuarantine(),
        Backoff(cfg),
        ConfigReload(tree, cfg),
        OrphanRecovery(),
        IndexTidy(),
        AutoRecover(),
    ]


class AutoRecover(Hook):
    def __init__(self) -> None:
        self.observer = liveness.Observer()
        self.gone = liveness.Gone()
        self.next_check = 0.0

    def tick(self, daemon: Daemon) -> None:
        now = time.monotonic()
        if now < self.next_check or daemon.stopping:
            return
        self.next_check = now + min(5.0, daemon.cfg.recovery.stale_after / 4)
        plans = recover.plan(daemon.ctx, auto=True, observer=self.observer, gone=self.gone, report=False)
        waits = [p.wait for p in plans if p.wait > 0]
        if waits:  # look again as soon as the first gone worker's writes must show
            self.next_check = min(self.next_check, now + min(waits))
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


class Backoff(Hook):
    """A step that raised: a full disk (ENOSPC, EDQUOT) is said once, shown as the
    worker's ``disk_full`` state (``daemon.disk_full_since``) and retried with a bounded
    exponential backoff until the next heartbeat written proves there is space again;
    any other failure of the loop is said once (a traceback), then one line per repeat.
    A start step gets only disk-full errors here (others end the daemon)."""

    def __init__(self, cfg: Config) -> None:
        self.backoff = diskfull.Backoff(first=cfg.daemon.poll_interval, most=30.0)
        self.last_failure: str | None = None

    def step_failed(self, daemon: Daemon, what: str, exc: Exception) -> None:
        if what != "loop":
            self._start_failed(daemon, what, exc)
        elif diskfull.is_disk_full(exc):
            self._disk_full(daemon, exc)
        else:
            key = f"{type(exc).__name__}: {exc}"
            wait = self.backoff.next()
            if key != self.last_failure:
                self.last_failure = key
                loop_log.error("loop step failed; retrying in %g s", wait, exc_info=exc)
            else:  # the same failure again: one line, not another traceback
                loop_log.error("loop step failed again (%s); retrying in %g s", key, wait)
            daemon.pause(wait, f"retrying after: {key}")

    def step_done(self, daemon: Daemon, what: str) -> None:
        if what != "loop":
            if self.backoff.failures:
                loop_log.info("the spool's disk has space again; going on")
            self.backoff.reset()
            return
        if daemon.disk_full_since is not None:
            if not daemon.beat_written:
                return  # not proven: nothing in this step needed to write
            loop_log.info(
                "the spool's disk has space again after %.0f s; accepting and claiming go on",
                time.monotonic() - daemon.disk_full_since,
            )
            daemon.disk_full_since = None
        self.last_failure = None
        self.backoff.reset()

    def _start_failed(self, daemon: Daemon, what: str, exc: Exception) -> None:
        wait = self.backoff.next()
        if self.backoff.failures == 1:
            loop_log.error(
                "cannot %s: the spool's disk is full (%s); retrying every %g-%g s until there is space",
                what,
                diskfull.describe(exc),
                self.backoff.first,
                self.backoff.most,
            )
        else:  # said once above; each retry only at debug level
            loop_log.debug("the spool's disk is still full; trying to %s again in %g s", what, wait)
        daemon.pause(wait, "disk full: waiting for space to " + what)

    def _disk_full(self, daemon: Daemon, exc: Exception) -> None:
        if daemon.disk_full_since is None:
            daemon.disk_full_since = time.monotonic()
            loop_log.error(
                "the spool's disk is full (%s): accepting and claiming wait, retrying with backoff up "
                "to %.0f s",
                diskfull.describe(exc),
                self.backoff.most,
            )
            try:  # best effort: a heartbeat may still fit, and status shows it
                daemon.heartbeat.beat(active=list(daemon.slots), state="disk_full")
            except OSError:
                pass
            wait = self.backoff.next()
        else:  # said once above; each retry only at debug level
            wait = self.backoff.next()
            loop_log.debug("the spool's disk is still full; trying again in %g s", wait)
        daemon.beat_soon()  # each retry tries to write the heartbeat: the proof of space
        daemon.pause(wait, "disk full: " + diskfull.describe(exc))


class ConfigReload(Hook):
    """Apply a changed ``spool.toml`` (looked at before every step; SIGHUP forces a re-read).

    The daemon and ``spool submit`` then judge drops by the same file: a daemon that
    kept its start-up config accepted what submit rejected. A file that no longer
    parses keeps the config in use (:class:`spool.core.config.Reloader`)."""

    def __init__(self, tree: Tree, cfg: Config) -> None:
        self.reloader = config.Reloader(tree.config_file, cfg)
        self.hangups = 0  # the daemon's count of SIGHUPs last seen

    def before_step(self, daemon: Daemon) -> None:
        if daemon.stopping:
            return
        forced, self.hangups = daemon.hangups != self.hangups, daemon.hangups
        new, line = self.reloader.check(force=forced)
        settling = self.reloader.settling()
        if settling is not None:
            daemon.wake_within(settling)  # an edit seen: applied once it has settled
        if line:
            quiet = new is not None or "nothing changed" in line
            (loop_log.info if quiet else loop_log.warning)("%s", line)
        if new is None:
            return
        secrets.install_from(new.secrets.env, new.secrets.files)
        apply_umask(new.permissions.umask_bits)
        daemon.use_config(new)


class Orphans:
    """This daemon's own running jobs whose attempt ended abnormally (its thread died, its
    ending could not be recorded, its claim batch failed): each with when to try
    recovering it next and the wait after a failed try. Any thread adds; the loop takes."""

    def __init__(self) -> None:
        self._due: dict[str, tuple[float, float]] = {}
        self._lock = threading.Lock()

    def add(self, job_id: str, after: float = 0.0) -> None:
        with self._lock:
            self._due[job_id] = (time.monotonic() + after, 1.0)

    def due(self, now: float) -> list[tuple[str, float]]:
        """(job, the wait it last had) for every job due a recovery try at ``now``."""
        with self._lock:
            return [(j, wait) for j, (when, wait) in self._due.items() if when <= now]

    def again(self, job_id: str, now: float, wait: float) -> None:
        """A try failed after ``wait``: the next in twice that (the wait kept at most 5 minutes)."""
        with self._lock:
            self._due[job_id] = (now + wait * 2, min(wait * 2, 300.0))

    def done(self, job_id: str) -> None:
        with self._lock:
            self._due.pop(job_id, None)

    def __bool__(self) -> bool:
        return bool(self._due)

    def __contains__(self, job_id: object) -> bool:
        return job_id in self._due


class OrphanRecovery(Hook):
    """Before every step: recover this daemon's due orphans (``daemon.orphans``) by
    evidence, as a restart would; a failed try waits twice as long."""

    def before_step(self, daemon: Daemon) -> None:
        if not daemon.orphans:
            return
        now = time.monotonic()
        for jid, wait in daemon.orphans.due(now):
            try:
                why = "this worker's attempt thread ended abnormally"
                outcome = recover.recover(daemon.ctx, jid, why=why)
                if outcome is not None:
                    daemon.carry_on(outcome)
            except Exception:
                loop_log.exception("%s: recovery failed; trying again in %.0f s", jid, wait * 2)
                daemon.orphans.again(jid, now, wait)
                continue
            daemon.orphans.done(jid)


class IndexTidy(Hook):
    """Format 2: compact this worker's library index segments, or merge all of them, when
    due (:func:`spool.library.segments.due`, looked at once per heartbeat interval), on a
    thread of its own: off the job path, one at a time. A failure is logged; the
    segments stay readable as they are. A stopping daemon lets a merge end."""

    def __init__(self) -> None:
        self.thread: threading.Thread | None = None
        self.next_look = 0.0

    def tick(self, daemon: Daemon) -> None:
        now = time.monotonic()
        if now < self.next_look or (self.thread is not None and self.thread.is_alive()):
            return
        self.next_look = now + daemon.cfg.daemon.heartbeat_interval
        tree, worker = daemon.tree, daemon.worker
        try:
            if formats.writing(tree.root) < 2 or (what := segments.due(tree, worker)) is None:
                return
        except Exception:
            loop_log.exception("looking at the library index's segments failed")
            return

        def tidy() -> None:
            try:
                if what == "merge":
                    n, jobs = segments.merge(tree)
                    loop_log.info("library index: merged %d segment(s), %d job(s)", n, jobs)
                else:
                    n = segments.compact(tree, worker)
                    loop_log.info("library index: compacted %d segment(s) of %s into one", n, worker)
            except Exception:
                loop_log.exception("library index: %s failed; the segments stay as they are", what)

        self.thread = threading.Thread(target=tidy, name="index-tidy", daemon=True)
        self.thread.start()

    def stopped(self, daemon: Daemon) -> None:
        if self.thread is not None:
            self.thread.join()  # a merge ends cleanly (each step is safe to cut, but why cut it)


class LeftoverSweep(Hook):
    """Once started, on a thread of its own: remove the leftovers of interrupted writes
    by dead processes of this host (:func:`spool.repair.fsck.sweep_leftovers`).

    The shared folders always; every job's folders in ``attempts/`` only when a walk is
    owed (:func:`spool.queue.workers.walk_owed`: this worker's previous process died, or
    stopped before its walk ended), since over a NAS with a long history that walk is
    minutes of requests at every start. The daemon claims and publishes meanwhile, since
    no reader takes a hidden name and no writer reuses one. A stopping daemon ends the
    walk at the next job folder, and its record says the walk is still owed; a draining
    one (``--drain``: nothing left to do, the sweep included) lets it finish."""

    def __init__(self) -> None:
        self.thread: threading.Thread | None = None
        self.stop = threading.Event()

    def started(self, daemon: Daemon) -> None:
        tree = daemon.tree
        walk = workers.walk_owed(daemon.identity.previous)
        daemon.heartbeat.leftovers_owed = walk  # carried by every beat until the walk ends

        def sweep() -> None:
            try:
                for p in fsck.sweep_leftovers(tree, stop=self.stop.is_set, attempts=walk):
                    log.info("removed %s: %s", p.path, p.problem)
                if walk and not self.stop.is_set():
                    daemon.heartbeat.leftovers_owed = False  # the next beat says so
            except Exception:
                loop_log.exception("sweeping the leftovers of interrupted writes failed; fsck finds them")

        self.thread = threading.Thread(target=sweep, name="leftover-sweep", daemon=True)
        self.thread.start()

    def stopped(self, daemon: Daemon) -> None:
        if self.thread is None:
            return
        if not daemon.drain:
            self.stop.set()
        self.thread.join()
        if daemon.heartbeat.rec.leftovers_owed and not daemon.heartbeat.leftovers_owed:
            # The walk ended after the last beat, the stopping one (a drain waits for it):
            # say so, or the next start walks again (a lost write only costs that).
            daemon.heartbeat.beat(active=[], state="stopped")
