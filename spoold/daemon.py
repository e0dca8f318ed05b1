"""The daemon loop: accept drops, claim into free slots, run, heartbeat, stop well.

One loop iteration:

1. accept what finished arriving in ``incoming/`` (never dies on bad input);
2. claim pending jobs, best first, while the pool each draws from has room
   (render slots: ``max_active``; see spool.kinds.pools);
3. refresh the heartbeat when it is due;
4. sleep until inotify, a finished render, a signal or the poll timer wakes it.

Stopping (SIGTERM or SIGINT): stop claiming at once; running renders get
``stop_grace`` seconds to finish, then are interrupted, recorded as
interrupted, and their jobs go back to ``pending/``. A second signal
interrupts them at once.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from functools import partial
from types import FrameType

from spool import doctor, kinds
from spool.core.config import Config
from spool.core.faults import crashpoint
from spool.core.model import Event, JobBase, PoolUse
from spool.disk import diskfull, formats, groupcommit
from spool.disk.tree import Tree, commit_riders, make_dirs, visible_names
from spool.kinds import capacities
from spool.kinds.pools import Pools
from spool.queue import accept, claim, depends, execute, liveness, publish, quarantine
from spool.queue.arrivals import Arrivals
from spool.queue.events import Journal
from spool.queue.execute import Context
from spool.queue.publish import Ready
from spool.queue.status import count
from spool.queue.workers import Heartbeat, Identity
from spool.repair import recover
from spoold.driver import Driver
from spoold.hooks import Hook, call
from spoold.notify import SystemdNotify
from spoold.observers import Metrics, Thumbnails
from spoold.policies import Orphans, policies
from spoold.slots import Slot, SlotThreads
from spoold.waker import Waker
from spoold.watcher import Watcher

log = logging.getLogger("spoold")

#: Seconds the first attempt ready to publish waits, at most, for this daemon's other
#: running attempts to join its batch (format 2; see Daemon._take_ready).
COMPANY = 0.005


#: Drops accepted in one step at most (one group-commit batch); a full batch lists again.
INTAKE_BATCH = 1000
#: ... and at most this long (seconds). A render's drop is probed at acceptance (~0.07 s: its
#: sources' ffprobe), and a batch tells nothing and claims nothing until it ends: 1,000 render
#: drops in one batch would keep every slot idle for ~70 s, and daemons killed every few
#: seconds never finished one (tools/torture at 100 jobs killed no render, recovered nothing).
INTAKE_SECONDS = 0.25


def _written(outcomes: list[accept.Outcome]) -> dict[str, JobBase]:
    """The jobs an acceptance batch wrote, as written (by job ID): one the same batch
    claims starts from this object, not from its file read back. The claim moved that
    very file (a job file is never written in place), so the read would give these bytes
    again: over a NAS, five round trips a job fewer; locally, a decode and a spec hash."""
    return {o.job.job_id: o.job for o in outcomes if isinstance(o, accept.Accepted) and o.data is not None}


class Daemon:
    def __init__(
        self, tree: Tree, cfg: Config, worker: str, *, drain: bool = False, hooks: list[Hook] | None = None
    ) -> None:
        self.tree = tree
        self.cfg = cfg
        self.worker = worker
        self.drain = drain
        self.wake = Waker()  # not a threading.Event: signal handlers ring it too
        self.interrupt = threading.Event()
        self.stopping = False
        self.stop_deadline = 0.0
        self.journal = Journal(tree, worker, keep_open=True)  # its own file: open for good
        self.ctx = Context(tree, cfg, worker, self.journal, self.interrupt, resumes_driven=True)
        self.index = claim.PendingIndex(tree, worker)
        #: One thread per running attempt, whatever pool it draws from.
        self.slots: dict[str, Slot] = {}
        self.threads = SlotThreads()
        #: What each running attempt holds: a render slot, or a kind's own allowance.
        self.pools = Pools(capacities(cfg))
        #: Why this worker stopped claiming (host quarantine: spool.queue.health), if it did; set
        #: by the HostQuarantine policy (spoold/policies.py).
        self.quarantined: str | None = None
        #: Temporary disk reserved per running job (its estimate), within limits.temp_disk.
        self.reserved: dict[str, int] = {}
        #: Own running jobs whose attempt ended abnormally: recovered by the OrphanRecovery policy.
        self.orphans = Orphans()
        #: Guards what slot threads hand the loop: _finished, _ready, _waiting.
        self._lock = threading.Lock()
        #: Slots whose job function has returned (the thread may linger a moment).
        self._finished: set[str] = set()
        #: Format 2: prepared publishes waiting for the loop's next batch, since when, and
        #: the slots whose attempts handed one over (held until that batch frees them).
        self._ready: list[Ready] = []
        self._ready_since = 0.0
        self._waiting: set[str] = set()
        #: How soon the loop must look again (waiting for company for a publish batch).
        self._wake_in: float | None = None
        self._disk_warned: set[str] = set()
        self.identity = Identity(tree, worker)
        self.heartbeat = Heartbeat(tree, worker, cfg.limits.max_active, cfg.limits.temp_disk_bytes)
        #: Which drops in incoming/ are finished (inotify evidence, else a quiet period).
        self.arrivals = Arrivals(tree.incoming, cfg.daemon.incoming_quiet)
        self.watcher = Watcher([tree.incoming, tree.pending], tree.pending, self.arrivals)
        #: When (monotonic) incoming/ must be listed again though nothing said it changed.
        self._next_intake = 0.0
        self._signals = 0
        self._told_stopping = False
        #: Counters hooks may read (metrics): claims lost to another worker, and so on.
        self.stats: dict[str, int] = {"claim_conflicts": 0, "claims": 0}
        # The parts every daemon runs with: its policies, then observers.
        self.hooks = (
            [*policies(tree, cfg), SystemdNotify(), Metrics(), Thumbnails()] if hooks is None else hooks
        )
        self.journal.listeners.append(lambda ev: call(self.hooks, "event", self, ev))
        #: Jobs whose state this daemon changed: their dependents (spool.queue.depends) may move on.
        self._changed: set[str] = set()
        self._changed_lock = threading.Lock()
        self._next_sweep = 0.0
        self.journal.listeners.append(self._note_change)
        #: Attempts of driven kinds (generations) are stepped here, not in slot threads.
        self.driver = Driver(self.ctx, self._driven_done)
        #: Why a pool's gate is closed (for the heartbeat and spool status): pool -> gate.
        self.gates: dict[str, kinds.base.Gate] = {}
        self._next_beat = 0.0
        self._next_scan = 0.0
        #: SIGHUPs received (systemctl reload): the ConfigReload policy re-reads spool.toml.
        self.hangups = 0
        #: Since when the spool's disk is full (the Backoff policy): the heartbeat's state.
        self.disk_full_since: float | None = None
        #: Whether this loop step wrote the heartbeat (proof that the disk has space).
        self.beat_written = False

    # -- lifecycle ---------------------------------------------------------------
    def run(self) -> int:
        """Run until drained or stopped; the exit status for the process."""
        self.identity.acquire()
        # Slot threads share folder fsyncs (group commit); restored for in-process callers.
        before = groupcommit.installed()
        syncer = before or groupcommit.Coalescer()
        groupcommit.install(syncer)
        try:
            return self._run()
        finally:
            groupcommit.install(before)
            log.info("group commit: %d folder fsyncs for %d asked", syncer.calls, syncer.requests)
            try:
                self.journal.close()
            except OSError as exc:  # its lines are in the file; only the last fsync failed
                log.error("could not make the journal's last lines durable: %s", diskfull.describe(exc))
            self.identity.release()

    def _run(self) -> int:
        self._install_signals()
        if not self._start_step("start", self._begin):
            return 0  # stopped while the disk was full: nothing was started
        watching = self._probe_filesystem() == "inotify" and self.watcher.start()
        # inotify is chosen for local filesystems only: their timestamps are this host's
        self.arrivals.local = watching
        log.info(
            "worker %s started on %s (max_active %d, %s)",
            self.worker,
            self.tree.root,
            self.cfg.limits.max_active,
            "inotify + polling" if watching else "polling",
        )
        try:
            if not self._start_step("recover its own jobs", self._adopt):
                return 0
            call(self.hooks, "started", self)  # policies first: a quarantine, the self-check
            self.driver.start()
            while True:
                try:
                    if not self._step():
                        break
                    call(self.hooks, "step_done", self, "loop")
                except Exception as exc:
                    # A transient I/O error (a NAS hiccup, a full disk) must not kill the
                    # daemon: the Backoff policy says it once and waits; the loop goes on.
                    call(self.hooks, "step_failed", self, "loop", exc)
        finally:
            self.watcher.stop()
            self.driver.stop()  # driven attempts in flight stay in running/ and resume at restart
            if self.slots:
                self.interrupt.set()
            for t in list(self.slots.values()):
                t.join()
            try:
                self.heartbeat.beat(active=[], state="stopped")
                self.journal.commit()  # the durable beat above made it so already; say it
            except OSError as exc:
                log.error("could not record this worker as stopped: %s", diskfull.describe(exc))
            call(self.hooks, "stopped", self)
            log.info("worker %s stopped", self.worker)
        return 0

    def _begin(self) -> None:
        make_dirs(self.tree.running_dir(self.worker))
        self.heartbeat.beat(state="running", active=[])

    def _adopt(self) -> None:
        prev = self.identity.previous
        if prev is not None and recover.jobs_of(self.tree, self.worker):
            # Its last writes went through another mount: what they left (a generation's
            # provider job) shows here only once this mount's caches let it.
            wait = liveness.settles_in(self.tree, prev, self.cfg.recovery.mount_lag)
            if wait > 0:
                log.info(
                    "this worker's previous process wrote through another mount: its jobs wait %.0f s", wait
                )
                if not self.pause(wait, "its previous process's writes to show through this mount"):
                    return
        for outcome in recover.adopt(self.ctx):
            log.info("adopted %s: %s -> %s", outcome.job_id, outcome.decision, outcome.to_state)
            self.carry_on(outcome)

    def carry_on(self, outcome: recover.Outcome) -> None:
        """An attempt recovery resumed (a driven kind's, in flight): the driver takes it,
        and it holds its pool as a claim would."""
        if outcome.decision != "resumed":
            return
        jid = outcome.job_id
        try:
            data = self.tree.job_file("running", jid, self.worker).read_bytes()
            kind = kinds.of(kinds.decode_job(data))
        except Exception:
            self.orphans.add(jid)  # vanished or damaged since: recover it by evidence
            return
        self.pools.take(jid, kind.pool(data))
        self.driver.resume(jid, outcome.attempt, kind)

    def _start_step(self, what: str, step: Callable[[], None]) -> bool:
        """Run a start step, again while the spool's disk is full (the hooks' ``step_failed``
        say so and wait); ``False`` if a stop signal came first. Other errors propagate."""
        while True:
            try:
                step()
            except OSError as exc:
                if not diskfull.is_disk_full(exc):
                    raise
                call(self.hooks, "step_failed", self, what, exc)
                if self.stopping:
                    return False
                continue
            call(self.hooks, "step_done", self, what)
            return True

    def pause(self, seconds: float, why: str) -> bool:
        """Sleep ``seconds`` (telling the hooks the loop lives); ``False`` if a stop signal came."""
        end = time.monotonic() + seconds
        while not self.stopping:
            call(self.hooks, "waiting", self, why)
            left = end - time.monotonic()
            if left <= 0:
                return True
            self.wake.wait(min(left, 5.0))  # an inotify ring does not end a backoff early
        return False

    def wake_within(self, seconds: float) -> None:
        """Step again within ``seconds``, even if nothing arrives meanwhile."""
        self._wake_in = seconds if self._wake_in is None else min(self._wake_in, seconds)

    def beat_soon(self) -> None:
        """Write the heartbeat in the next step (new limits to show, a proof of space)."""
        self._next_beat = 0.0

    def _probe_filesystem(self) -> str:
        """``spool doctor``'s quick probes at start: log what the spool's filesystem
        does, apply the publish strategy, and return the watch strategy."""
        try:
            report = doctor.run(self.tree, self.cfg, quick=True)
        except Exception as exc:
            if diskfull.is_disk_full(exc):
                log.warning("filesystem probe skipped: the spool's disk is full (%s)", diskfull.describe(exc))
            else:
                log.exception(
                    "filesystem probe failed; publish by link (copy where it fails), watch by inotify"
                )
            return "poll" if self.cfg.daemon.watch == "poll" else "inotify"
        for warning in report.warnings:
            (log.warning if report.safe else log.error)("filesystem: %s", warning)
        m = report.mount
        log.info(
            "filesystem: %s (%s) on %s, probed in %.2f s; publish by %s (%s); watch by %s (%s)",
            m.fstype,
            m.kind,
            m.mountpoint,
            report.seconds,
            report.publish.value,
            report.publish.why,
            report.watch.value,
            report.watch.why,
        )
        self.ctx.publish_by = "copy" if report.publish.value == "copy" else "link"
        return report.watch.value

    def _step(self) -> bool:
        """One iteration of the loop; ``False`` when the daemon should exit."""
        self._reap()
        if not self.stopping:
            self.wake.clear()
        self._take_events()
        call(self.hooks, "before_step", self)  # policies: orphans, a changed spool.toml
        now = time.monotonic()
        if self.stopping:
            if not self._told_stopping:
                self._told_stopping = True
                log.info(
                    "stopping: no more claims; %d render(s) may finish within %.0f s",
                    len(self.slots),
                    self.cfg.daemon.stop_grace,
                )
                call(self.hooks, "stopping", self)
            self._fill_slots()  # no claims now; attempts that ended are still published
            if not self.slots:
                return False
            if (now >= self.stop_deadline or self._signals > 1) and not self.interrupt.is_set():
                why = "a second stop signal" if self._signals > 1 else "grace period over"
                log.info("%s: interrupting %d render(s)", why, len(self.slots))
                self.interrupt.set()
        else:
            if self._intake_due(now):
                self._accept(now)
            if self.index.backlog or (now >= self._next_scan and self.index.listing_due(now)):
                self.index.refresh()  # the truth, on a timer: inotify misses other hosts
                self._next_scan = now + self.cfg.daemon.poll_interval
            self._fill_slots()
            # Dependents after the claims (a listing of deps/ off the drop-to-claim path);
            # those released to pending/ are claimed in this same step.
            if self._settle(now):
                self._fill_slots()
            if self.drain and self._drained():
                log.info("drained: nothing pending, running or arriving")
                return False
        self.beat_written = False
        if now >= self._next_beat:
            self.heartbeat.beat(
                active=[*self.slots, *self.driver.held()],
                state="stopping" if self.stopping else ("disk_full" if self.disk_full_since else "running"),
                temp_disk_reserved=sum(self.reserved.values()),
                oldest_pending_submitted=self.index.oldest_submitted(),
                pools=self._pool_usage(),
                quarantined=self.quarantined,
            )
            self._next_beat = now + self.cfg.daemon.heartbeat_interval
            self.beat_written = True
            # Journal lines (and owed folders: a publish's old names in running/) ride on the
            # tree's folder fsyncs; an idle daemon has none, so they are made durable here,
            # within one heartbeat (SPEC 11.9).
            commit_riders()
        call(self.hooks, "tick", self)
        # While a big first scan is read (in the background), look back soon for more.
        reading = self.index.backlog and not self.stopping
        timeout = 0.05 if reading else 0.5 if self.stopping else self.cfg.daemon.poll_interval
        if self._wake_in is not None:
            timeout, self._wake_in = min(timeout, self._wake_in), None
        if not self.slots:
            # Nothing running: this step's journal lines (and owed folders) are made durable
            # now, while idle, not by the next job's first folder fsync (an fsync on its
            # drop-to-claim path).
            commit_riders()
        if self._take_events() and not self.stopping:
            timeout = 0.0  # something arrived meanwhile: step again at once
        fd = self.watcher.fileno()
        self.wake.wait(timeout, also=() if fd is None else (fd,))
        return True

    def _take_events(self) -> bool:
        """Apply what inotify saw since the last look, name by name; ``True`` when it
        brought work: a drop to take, a job the claim order did not hold. Most events
        are this loop's own moves (the drop it took, the job file it wrote, its claim):
        they change nothing here and wake nothing."""
        work = self.watcher.poll()
        for jid, present in self.watcher.changed().items():
            work |= self.index.note(jid, present)
        return work

    # -- steps -------------------------------------------------------------------------
    def _pool_usage(self) -> dict[str, PoolUse]:
        """Each pool's use, and why a closed gate keeps its jobs waiting."""
        usage = self.pools.usage()
        for pool, gate in self.gates.items():
            if pool in usage:
                usage[pool].waiting_until = gate.until if gate.until != float("inf") else None
                usage[pool].waiting_reason = gate.reason
        return usage

    def use_config(self, new: Config) -> None:
        """Run with a new spool.toml from now on (the ConfigReload policy): running
        attempts keep what they hold; the heartbeat shows the new limits at once."""
        self.cfg = self.ctx.cfg = new
        self.heartbeat.rec.max_active = new.limits.max_active
        self.pools.capacity = capacities(new)
        self.heartbeat.rec.temp_disk_limit = new.limits.temp_disk_bytes
        self.arrivals.quiet = new.daemon.incoming_quiet
        self.beat_soon()

    def _intake_due(self, now: float) -> bool:
        """Whether this step lists ``incoming/``: when a drop seen (by the watcher's events
        or a listing) may be taken now (closed or renamed in, or quiet for long enough), and
        at least every ``poll_interval`` (another host's drops raise no event here). Not at
        every step: a loop steps several times a job, and on a NAS each listing is four
        round trips, and each drop looked at one more."""
        look = self.arrivals.next_look()
        return (look is not None and now >= look) or now >= self._next_intake

    def _accept(self, now: float) -> int:
        """Accept what arrived in ``incoming/``, and in format 2 claim into free slots in the
        same group-commit batch: the acceptance's folders and the claims' share their fsyncs
        (``attempts/`` and ``running/W/`` in one round, ``pending/`` after), one round fewer
        from a drop to its claim. Nothing of either is told, and no claimed job starts,
        before the batch is durable."""
        v2 = formats.writing(self.tree.root) >= 2
        claiming = v2 and self.quarantined is None and not self.stopping and not self.pools.full()
        claimed: list[tuple[str, str, bool]] = []
        try:
            with groupcommit.together(at_once=True):  # the claims' order (running/ first) kept
                batch = accept.take_batch(
                    self.tree,
                    self.cfg,
                    self.worker,
                    self.journal,
                    limit=INTAKE_BATCH,
                    arrivals=self.arrivals,
                    seconds=INTAKE_SECONDS,
                )
                self._index_accepted(batch.out)  # claimable in this very batch
                if claiming and any(isinstance(o, accept.Accepted) for o in batch.out):
                    self._claim_batch(claimed, self._gates())
                    if claimed:
                        crashpoint("mid_accept_claims")  # accepted and claimed; nothing durable, nothing told
        except Exception as exc:  # the daemon never dies on input; log and carry on
            # Claimed but maybe not durable: none starts; recovered by evidence. The drops
            # stay under this worker's claim name, taken up again as redelivered.
            self._orphan([j for j, _, _ in claimed])
            if diskfull.is_disk_full(exc):
                raise  # the loop backs off and says so once
            log.exception("accepting from incoming/ failed")
            return 0
        # Durable now. The acceptance's lines come before any claimed job's "running" line
        # (its thread writes one); the drops are moved out once the jobs are on their way.
        try:
            try:
                batch.release_lines()
            finally:
                # durable: they start whatever telling met, each from the job in hand
                self._start_claimed(claimed, v2, _written(batch.out))
            outcomes = batch.keep_drops(self.tree)
        except Exception as exc:
            if diskfull.is_disk_full(exc):
                raise
            log.exception("accepting from incoming/ failed")
            return 0
        # Listed and taken: the next listing is due on the timer, or at once if the batch was
        # full or ran out of time (drops may be left).
        full = len(outcomes) >= INTAKE_BATCH or time.monotonic() - now >= INTAKE_SECONDS
        self._next_intake = 0.0 if full else now + self.cfg.daemon.poll_interval
        look = self.arrivals.next_look()
        if look is not None and not full and look > now:
            self.wake_within(look - now)  # a seen drop's wait ends then
        if outcomes:
            groupcommit.commit_riders_soon()  # the lines just told, durable while the claims are made
        for o in outcomes:
            if isinstance(o, accept.Rejected):
                log.warning("rejected %s: %s", o.path.name, o.error)
            else:
                for job in o.jobs:
                    log.info("accepted %s%s", job.job_id, "" if job.resolved else " (waiting)")
        return len(outcomes)

    def _index_accepted(self, outcomes: list[accept.Outcome]) -> None:
        """The jobs just accepted, into the claim index (from the bytes in hand)."""
        for o in outcomes:
            if isinstance(o, accept.Accepted):
                for job in o.jobs:
                    if o.data is not None and job is o.job:
                        self.index.note_accepted(job.job_id, o.data)
                    else:
                        self.index.note(job.job_id)

    def _note_change(self, ev: Event) -> None:
        """A journal line of this daemon (any thread): its job's dependents may move on.
        Not a claim's: from pending/ to running/ the job stays in flight, which changes
        nothing for its dependents (a listing of deps/ a job fewer, a round trip on a NAS)."""
        if ev.to == "running" and ev.from_ == "pending":
            return
        with self._changed_lock:
            self._changed.add(ev.job)
        if ev.to in ("complete", "failed"):
            self.wake.set()

    def _settle(self, now: float) -> bool:
        """Dependents (spool.queue.depends) of the jobs this daemon published, failed or accepted
        move on, one batch per iteration; every ``depends.SWEEP`` s all of them are looked at
        (a publish on another host, a recovery by the CLI). ``True`` if some went to pending/."""
        with self._changed_lock:
            changed, self._changed = self._changed, set()
        sweep = now >= self._next_sweep
        if not changed and not sweep:
            return False
        if sweep:
            self._next_sweep = now + depends.SWEEP
        try:
            done = depends.settle(
                self.tree, self.cfg, self.journal, changed=None if sweep else changed, by=self.worker
            )
        except Exception as exc:
            if diskfull.is_disk_full(exc):
                with self._changed_lock:
                    self._changed |= changed
                raise
            log.exception("settling dependents failed; trying again")
            with self._changed_lock:
                self._changed |= changed
            return False
        for jid in done.pending:
            self.index.note(jid)
        if done:
            log.info(
                "dependents: %d to pending, %d held, %d waiting again",
                len(done.pending), len(done.held), len(done.waiting),
            )  # fmt: skip
        return bool(done.pending)

    def _quarantine_damaged(self) -> None:
        """Files in ``pending/`` that can never be claimed leave the queue at once
        (a silent skip would hang ``--drain`` and hide them from everyone)."""
        for jid in self.index.take_damaged():
            path = self.tree.job_file("pending", jid)
            try:
                quarantine.load(path)
                continue  # readable now (it was being replaced): the next scan indexes it
            except quarantine.Damaged as damage:
                if quarantine.quarantine(self.tree, path, "pending", damage, self.worker):
                    self.stats["quarantined"] = self.stats.get("quarantined", 0) + 1
                    self.journal.record(
                        jid, "quarantine", from_="pending", reason=f"{damage.field}: {damage.reason}"
                    )
            except OSError:
                continue

    def _fill_slots(self) -> None:
        """Claim the best pending jobs while their pools have room (a job whose pool is full
        waits; one from another pool may still go), start them, then publish the attempts
        that are ready (format 2).

        The claims go first, in a group-commit batch of their own (their folder fsyncs once
        for all), and start at once: the slot of an attempt whose publish is prepared is
        free (the slot count limits production, not publishing), so the next job is
        produced while this loop commits the previous one's publish
        (:func:`spool.queue.publish.commit`), instead of after it."""
        self._quarantine_damaged()
        v2 = formats.writing(self.tree.root) >= 2
        ready = self._take_ready()
        claiming = self.quarantined is None and not self.stopping
        if not ready and (not claiming or self.pools.full()):
            return
        claimed: list[tuple[str, str, bool]] = []
        rooms = self._gates() if claiming else {}
        for r in ready:
            self._release(r.job_id)  # its attempt is done: its slot is free for a claim
        try:
            if claiming:
                # The claims' folder fsyncs, once for all, then they start.
                with groupcommit.together(at_once=v2):
                    self._claim_batch(claimed, rooms)
        except BaseException:
            # Claimed or ready but maybe not durable: none starts or is told; recovered by
            # evidence, as at a restart.
            self._orphan([*(r.job_id for r in ready), *(j for j, _, _ in claimed)])
            raise
        self._start_claimed(claimed, v2)
        if not ready:
            return
        try:
            results = publish.commit(self.ctx, ready)
        except BaseException:
            self._orphan([r.job_id for r in ready])  # maybe not durable: recovered by evidence
            raise
        for r, res in zip(ready, results, strict=True):
            self._published(r, res)

    def _orphan(self, jids: list[str]) -> None:
        """Jobs whose claim or publish batch failed: none is told; the OrphanRecovery policy
        recovers each by evidence, as a restart would."""
        with self._lock:
            for jid in jids:
                self.orphans.add(jid)
                self._finished.add(jid)
                self._waiting.discard(jid)

    def _start_claimed(
        self, claimed: list[tuple[str, str, bool]], v2: bool, written: dict[str, JobBase] | None = None
    ) -> None:
        """Start the jobs of a durable claim batch (a thread each, or the driver). A slot
        job's thread opens its attempt itself: the loop thread, which every claim and
        publish of this daemon goes through, makes no round trip of any one job's (on a NAS
        the attempt's folders and record were a third of the loop's time a job).
        ``written``: jobs this batch accepted, as written (see :func:`_written`)."""
        written = written or {}
        for jid, pool, first in claimed:
            kind = kinds.owner_of_pool(pool)
            crashpoint("after_claim")
            if kind.runner == "driven":
                self.driver.take(jid, kind)  # no thread, no render slot: stepped by the driver
                continue
            job = written.get(jid)
            run = partial(self._run_slot, jid, first, job) if v2 else partial(self._run_job, jid)
            self.slots[jid] = self.threads.run(f"job-{jid}", run)

    def _take_ready(self) -> list[Ready]:
        """The prepared publishes to commit now, or none yet: while other attempts of this
        daemon are still running, the first waits up to :data:`COMPANY` seconds for
        them (no-op jobs end within a few milliseconds of each other; a render's
        publish waits at most that long)."""
        with self._lock:
            if not self._ready:
                return []
            age = time.monotonic() - self._ready_since
            running = [j for j in self.slots if j not in self._waiting and j not in self._finished]
            if running and age < COMPANY and not self.stopping:
                self.wake_within(COMPANY - age)
                return []
            ready, self._ready = self._ready, []
            self._ready_since = 0.0
            return ready

    def _release(self, jid: str) -> None:
        """A slot whose attempt handed over its publish: free it for a claim."""
        self.slots.pop(jid, None)
        self._waiting.discard(jid)
        self.reserved.pop(jid, None)
        self.pools.give_back(jid)

    def _published(self, r: Ready, res: object) -> None:
        """How a job of a publish batch ended: complete, or taken away meanwhile."""
        if isinstance(res, BaseException):
            try:
                outcome = execute.end_attempt(self.ctx, r.job, r.attempt, res)
            except Exception:
                log.exception("%s: recording the end of attempt %d failed", r.job_id, r.attempt.n)
                self.orphans.add(r.job_id)
                return
            log.info("%s: %s", r.job_id, outcome)
        else:
            outcome = "complete"  # said by publish already, with the object's sha256
        call(self.hooks, "attempt_ended", self, r.job_id, outcome)

    def _gates(self) -> dict[str, int]:
        """The room each gated pool with pending jobs has now (its kind decides: a provider's
        quota, its spending allowance); closed gates are kept for the heartbeat."""
        rooms: dict[str, int] = {}
        self.gates = {}
        for pool in self.index.pools_waiting():
            gate = kinds.owner_of_pool(pool).gate(self.ctx, pool, self.pools.holders(pool))
            if gate.room is not None:
                rooms[pool] = gate.room
                if gate.room <= 0:
                    self.gates[pool] = gate
        return rooms

    def _claim_batch(
        self,
        claimed: list[tuple[str, str, bool]],
        rooms: dict[str, int],
    ) -> None:
        """Claim into free slots (inside the caller's batch): (job, pool, first) each, where
        ``first`` says its attempt tries number 1 without a listing (the index expects no
        earlier attempt: :meth:`spool.queue.claim.PendingIndex.guess_first`)."""
        for jid in self.index.ordered():
            if self.stopping or self.pools.full():
                break
            pool = self.index.pool(jid)
            if not self.pools.has_room(pool):
                continue
            room = rooms.get(pool)
            if room is not None and room <= 0:
                continue  # the pool's gate is closed (a provider's quota or spending): it waits
            need = self.index.estimate(jid)
            if not self._disk_allows(need):
                if jid not in self._disk_warned:
                    self._disk_warned.add(jid)
                    log.warning(
                        "%s waits: its render may need %d bytes of temporary disk, more than is "
                        "free or left of limits.temp_disk now",
                        jid,
                        need,
                    )
                continue  # leave it pending; a smaller job may fit now, this one later
            first = self.index.guess_first(jid)
            self.index.discard(jid)  # either ours now, or somebody else's
            if not claim.claim(self.tree, self.worker, jid):
                self.stats["claim_conflicts"] += 1
                continue
            self.stats["claims"] += 1
            call(self.hooks, "claimed", self, jid)
            self.reserved[jid] = need
            self.pools.take(jid, pool)
            claimed.append((jid, pool, first))
            if room is not None:
                rooms[pool] = room - 1

    def _run_job(self, jid: str) -> None:
        try:
            outcome = execute.execute(self.ctx, jid)
            log.info("%s: %s", jid, outcome)
            call(self.hooks, "attempt_ended", self, jid, outcome)
        except Exception:
            # An I/O error at a commit point (a NAS hiccup, a full disk while
            # writing a record) or a bug: the job is still ours in running/, so
            # recover it by evidence from the loop, as a restart would.
            log.exception("%s: attempt ended abnormally; recovering it", jid)
            self.orphans.add(jid)
        finally:
            # Say "done" before waking the loop: a thread is still alive for a moment
            # after this, and a loop that waited for is_alive() to turn false would
            # sleep a whole poll interval with a free slot (the benchmark saw it).
            with self._lock:
                self._finished.add(jid)
            self.wake.set()

    def _run_slot(self, jid: str, first: bool, job: JobBase | None = None) -> None:
        """Format 2: a slot kind's attempt, opened on this thread, up to its publish, which
        the loop commits with the others that end close together (:meth:`_fill_slots`).
        ``job``: the job as this process wrote it, if it did (not read back)."""
        handed = False
        try:
            started = execute.start(self.ctx, jid, first=first, job=job)
            if isinstance(started, str):  # it can never run (quarantined), gone, or early
                log.info("%s: %s", jid, started)
                call(self.hooks, "attempt_ended", self, jid, started)
                return
            job, attempt = started
            got = execute.run_to_ready(self.ctx, job, attempt)
            if isinstance(got, Ready):
                # Said before the hand-over, so it precedes the next claim of this slot.
                log.info("%s: attempt %d produced, its publish prepared", jid, attempt.n)
                with self._lock:
                    if not self._ready:
                        self._ready_since = time.monotonic()
                    self._ready.append(got)
                    self._waiting.add(jid)
                handed = True
            else:
                log.info("%s: %s", jid, got)
                call(self.hooks, "attempt_ended", self, jid, got)
        except Exception:
            log.exception("%s: attempt ended abnormally; recovering it", jid)
            self.orphans.add(jid)
        finally:
            if not handed:
                with self._lock:
                    self._finished.add(jid)
            self.wake.set()

    def _driven_done(self, jid: str, outcome: str) -> None:
        """The driver finished a job: reap it like a slot thread's. One whose ending could
        not be recorded (a full disk, a NAS hiccup) is still ours in running/: recover it
        by evidence from the loop, with backoff, as a slot thread's."""
        call(self.hooks, "attempt_ended", self, jid, outcome)
        with self._lock:
            self._finished.add(jid)
            if outcome == "error":
                self.orphans.add(jid, after=1.0)
        self.wake.set()

    def _reap(self) -> None:
        with self._lock:
            finished, self._finished = self._finished, set()
            waiting = set(self._waiting)
        for jid, t in list(self.slots.items()):
            if jid in waiting:
                continue  # its publish is prepared: the slot is freed by the batch that commits it
            if jid in finished or not t.is_alive():
                del self.slots[jid]
                self.reserved.pop(jid, None)
                self.pools.give_back(jid)
        for jid in finished - self.slots.keys():  # driven jobs: no thread to join
            self.reserved.pop(jid, None)
            self.pools.give_back(jid)

    def _disk_allows(self, need: int) -> bool:
        """Reserve before claiming: within the allowance, and actually free on disk."""
        held = sum(self.reserved.values())
        if held + need > self.cfg.limits.temp_disk_bytes:
            return False
        if held + need == 0:
            return True  # nothing to find room for (a no-op, an adoption): no statvfs
        st = os.statvfs(self.tree.attempts)
        return st.f_bavail * st.f_frsize >= held + need

    def _drained(self) -> bool:
        """Nothing left that this worker could do: nothing running, arriving, or pending
        that it may claim (a quarantined worker may claim nothing; a blocked job is
        another worker's)."""
        if self.slots or self.orphans or self.driver.busy():
            return False
        with self._changed_lock:
            if self._changed:  # jobs it just published or failed: their dependents may move on
                return False
        if self.quarantined is not None:
            return True
        if self.index.claimable():
            return False
        if any(True for _ in visible_names(self.tree.incoming)):
            return False
        return count(self.tree.pending) == len(self.index)

    # -- signals ----------------------------------------------------------------------
    def _install_signals(self) -> None:
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)
        signal.signal(signal.SIGHUP, self._on_hangup)

    def _on_hangup(self, signum: int, frame: FrameType | None) -> None:
        # systemctl reload (ExecReload=kill -HUP): the ConfigReload policy re-reads spool.toml.
        self.hangups += 1
        self.wake.set()

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        # Plain assignments and a pipe write only: a handler runs between two
        # bytecodes of the main thread, which may hold any lock (even the one
        # inside a threading.Event). The loop does the rest.
        self._signals += 1
        if self._signals == 1:
            self.stopping = True
            self.stop_deadline = time.monotonic() + self.cfg.daemon.stop_grace
        self.wake.set()
