"""The generation driver: every generation job this daemon has claimed, on one thread.

A generation spends almost all its life waiting for a provider. Giving it a
slot thread (as a render gets) would tie up a thread per job and, worse, a
render slot; so the daemon hands claimed jobs of a *driven* kind
(:attr:`spool.kinds.base.Kind.driven`) to this driver instead. The driver
orchestrates library steps only (:mod:`spool.kinds.generate`):

* one thread runs a :class:`spool.polling.PollScheduler` loop: it hands a
  job's polls to a small pool (:data:`POLLERS`) when they fall due
  (full-jitter backoff, ``Retry-After`` and per-provider back-pressure honoured
  by the scheduler; a poll is mostly a wait for the provider's answer, so a
  few overlap), looks for cancel requests (``spool cancel`` cancels at the
  provider). That thread alone touches the scheduler; a key is polled by one
  thread at a time (the scheduler hands it out once until its report);
* a job's admission (its attempt, the intent, the spending guard, the create
  and the provider's ID, each a durable compare-and-set of its own) runs in a
  small bounded pool (:data:`ADMITTERS`): a thousand claims at once are
  admitted side by side, their fsyncs overlapping, instead of one after
  another on the polling thread; each admitted job comes back to the polling
  thread as one small result to schedule;
* a finished generation's download, validation and publish run in a small
  bounded pool of threads (:data:`DOWNLOADS`), never on the polling thread;
* every ending goes through :func:`spool.execute.end_attempt`, as a render's
  does (failure record, retry or failed/, blocklist), after the attempt's
  durable state has moved to ``failed``.

Memory per generation in flight is one scheduler entry and one small tuple;
the job file is read again when its turn comes. Jobs resumed by recovery
(:meth:`spool.kinds.generate.Generate.resume`) join the same loop in the
same attempt, so a restart never sends a second create.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from spool import intent, quarantine
from spool.attempt import Attempt, open_attempt
from spool.context import Context
from spool.errors import ConfigError, Failed, LostOwnership
from spool.execute import end_attempt, execute, validation_failure
from spool.faults import crashpoint
from spool.kinds import generate as gk
from spool.polling import PollScheduler
from spool.providers import Provider, ProviderError
from spool.providers.config import pool_name
from spool.publish import publish

log = logging.getLogger("spoold.generations")

#: Downloads (with validation and publish) at once; they stream to disk, so few suffice.
DOWNLOADS = 2
#: Admissions at once. Each is a few fsyncs and one create request, mostly waiting
#: on the disk or the provider, so a few threads overlap them; the in-flight
#: allowance (the daemon's pool) bounds how many are queued, not this.
ADMITTERS = 8
#: Polls at once (each mostly waits for the provider's answer), and the most handed
#: to them per turn that are not yet started (so a backlog stays in the heap, in order).
POLLERS = 4
POLL_QUEUE = 64
#: Seconds between looks for cancel requests of the generations in flight (at least;
#: one look is a stat per generation, so with many in flight it comes less often:
#: :data:`CANCEL_LOOKS_PER_SECOND` stats a second at most).
CANCEL_LOOK = 1.0
CANCEL_LOOKS_PER_SECOND = 2000
#: Looks at an abandoned attempt's provider job, for a late completion to record (audit
#: only): at least this many, and for at least :data:`AUDIT_CEILINGS` times the provider's
#: polling ceiling (a count alone, with full jitter, could be spent in a fraction of one
#: ceiling and miss a completion that came a moment later).
AUDIT_POLLS = 5
AUDIT_CEILINGS = 2
#: Scheduler keys of those looks start with this.
LATE = "late:"


def _located(exc: BaseException, job: gk.GenerateJob | None) -> BaseException:
    """What :func:`spool.execute.end_attempt` records for an exception of a step."""
    if isinstance(exc, Failed | LostOwnership | OSError | quarantine.Damaged):
        return exc
    if isinstance(exc, ProviderError):
        return Failed("render", f"provider.{exc.operation}", str(exc), next_action=exc.next_action or "")
    name = job.generate.provider if job is not None else "?"
    if isinstance(exc, ConfigError | KeyError):
        # This daemon cannot speak to the provider (no table, no token): the host's fault,
        # so the job moves on to a worker that can (spool.blocklist).
        return Failed(
            "prepare",
            f"providers.{name}",
            f"this worker cannot use provider {name!r}: {exc}",
            expected=f"[providers.{name}] in spool.toml and its token_env in the daemon's environment",
            actual="missing",
            next_action=f"Configure [providers.{name}] and its token variable for this daemon; restart it.",
            fault="host",
        )
    log.error("%s: unexpected %s in a generation step", job.job_id if job else "?", type(exc).__name__)
    return Failed(
        "render",
        "internal",
        f"the generation step failed unexpectedly ({type(exc).__name__}: {exc})",
        next_action="Read the daemon's log; spool retry the job.",
        retryable=True,
    )


class Generations:
    """The driver; the daemon calls :meth:`take` from its loop and :meth:`finished` to reap."""

    def __init__(self, ctx: Context, on_done: Callable[[str, str], None]) -> None:
        self.ctx = ctx
        self.on_done = on_done
        cfgs = ctx.cfg.provider_configs
        self.sched = PollScheduler({n: c.polling for n, c in cfgs.items()}, clock=time.time)
        #: scheduler key -> (job ID, attempt n) of every generation between create and download.
        self.flights: dict[str, tuple[str, int]] = {}
        #: Job IDs this driver holds (in flight, downloading), for the daemon's drain and heartbeat.
        self.active: set[str] = set()
        self._lock = threading.Lock()
        self._inbox: queue.SimpleQueue[tuple[str, int | None]] = queue.SimpleQueue()
        #: Jobs recovery handed over (job ID, pool): the daemon counts them in its pools.
        self._adopted: queue.SimpleQueue[tuple[str, str]] = queue.SimpleQueue()
        self._providers: dict[str, Provider] = {}
        self._downloads = ThreadPoolExecutor(max_workers=DOWNLOADS, thread_name_prefix="gen-download")
        self._admissions = ThreadPoolExecutor(max_workers=ADMITTERS, thread_name_prefix="gen-admit")
        self._polls = ThreadPoolExecutor(max_workers=POLLERS, thread_name_prefix="gen-poll")
        #: Keys whose poll is handed out and not finished (the cancel look leaves them alone).
        self._stepping: set[str] = set()
        #: CPU seconds the poll threads spent in polls (logged at stop, for tools/genbench.py).
        self._poll_cpu = 0.0
        #: Work for the polling thread from the others (schedule an admitted job, an audit).
        self._for_poller: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._next_cancel_look = 0.0
        #: The config the scheduler and the provider clients were made from (see _follow_config).
        self._cfg = ctx.cfg
        #: Clients replaced by a reload (closed at stop) and their counters, carried over.
        self._retired: list[Provider] = []
        self._carried: dict[str, dict[str, int]] = {}
        #: late key -> (job ID, attempt n, provider name, looks left, look until: epoch s)
        self.audits: dict[str, tuple[str, int, str, int, float]] = {}
        gk.set_driver(self)

    # -- the daemon's side -------------------------------------------------------------
    def drives(self, pool: str) -> bool:
        """Whether a job drawing from ``pool`` is handed here instead of a slot thread."""
        return pool.startswith(pool_name(""))  # every provider's pool, also one a reload added

    def take(self, job_id: str) -> None:
        """A job the daemon has just claimed (from a pool this driver drives)."""
        with self._lock:
            self.active.add(job_id)
        self._inbox.put((job_id, None))
        self._wake.set()

    def resume(self, job_id: str, attempt: int, pool: str) -> None:
        """Recovery hands over a generation in flight: keep going in ``attempt``."""
        with self._lock:
            self.active.add(job_id)
        self._adopted.put((job_id, pool))
        self._inbox.put((job_id, attempt))
        self._wake.set()

    def adopted(self) -> list[tuple[str, str]]:
        """Jobs recovery handed over since the last call, with their pools."""
        out = []
        while True:
            try:
                out.append(self._adopted.get_nowait())
            except queue.Empty:
                return out

    def held(self) -> list[str]:
        """The jobs this driver holds now (for the heartbeat)."""
        with self._lock:
            return sorted(self.active)

    def busy(self) -> bool:
        with self._lock:
            return bool(self.active)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="generations", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop polling; generations in flight stay in ``running/`` and resume at the next start."""
        self._stop.set()
        self._wake.set()
        self._admissions.shutdown(wait=True, cancel_futures=True)  # unadmitted ones resume at restart
        self._polls.shutdown(wait=True, cancel_futures=True)
        if self._thread is not None:
            self._thread.join(timeout=60)
        self._downloads.shutdown(wait=True, cancel_futures=True)
        for p in [*self._providers.values(), *self._retired]:
            p.close()
        gk.set_driver(None)

    def counters(self) -> dict[str, dict[str, int]]:
        """What the driver's provider clients did, per provider: polls, creates,
        rate_limited (429s), bytes (retrieved and verified), checksum (mismatches),
        errors (every provider error). Counters since the daemon started."""
        out = {}
        with self._lock:
            clients = list(self._providers.items())
            carried = {n: dict(c) for n, c in self._carried.items()}
        out_raw: dict[str, dict[str, int]] = {}
        for name, c in [*((n, p.counted()) for n, p in clients), *carried.items()]:
            total = out_raw.setdefault(name, {})
            for k, v in c.items():
                total[k] = total.get(k, 0) + v
        for name, c in out_raw.items():
            errors = {k.removeprefix("error."): n for k, n in c.items() if k.startswith("error.")}
            out[name] = {
                "polls": c.get("call.get", 0),
                "creates": c.get("call.create", 0),
                "rate_limited": errors.get("rate_limited", 0),
                "bytes": c.get("bytes", 0),
                "checksum": errors.get("checksum", 0),
                "errors": sum(errors.values()),
            }
        return out

    # -- the loop ----------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._turn()
            except Exception:
                log.exception("generation driver step failed; going on")
                time.sleep(1.0)
            nxt = self.sched.next_due()
            wait = 1.0 if nxt is None else max(0.0, min(1.0, nxt - time.time()))
            if self._saturated():
                wait = 1.0  # a finishing poll wakes the loop
            self._wake.wait(timeout=wait)
            self._wake.clear()
        polls = sum(n for (_, what), n in self.sched.counts.items() if what == "polls")
        # What the polling policy costs this host (tools/genbench.py reads this line).
        log.info(
            "generation driver: %d polls; CPU %.3f s in polls, %.3f s on the scheduling thread",
            polls,
            self._poll_cpu,
            time.thread_time(),
        )

    def _turn(self) -> None:
        self._follow_config()
        while True:
            try:
                jid, n = self._inbox.get_nowait()
            except queue.Empty:
                break
            self._admissions.submit(self._admit, jid, n)
        while True:
            try:
                todo = self._for_poller.get_nowait()
            except queue.Empty:
                break
            todo()
        with self._lock:
            room = POLL_QUEUE - len(self._stepping)
        for due in self.sched.pop_due(limit=max(0, room)):
            if self._stop.is_set():
                return
            if due.key.startswith(LATE):
                self._audit(due.key)
                continue
            with self._lock:
                flight = self.flights.get(due.key)
                if flight is not None:
                    self._stepping.add(due.key)
            if flight is not None:
                self._polls.submit(self._poll, due.key, *flight)
        now = time.monotonic()
        if now >= self._next_cancel_look:
            with self._lock:
                waiting = len(self.flights)
            self._next_cancel_look = now + max(CANCEL_LOOK, waiting / CANCEL_LOOKS_PER_SECOND)
            self._look_for_cancels()

    def _poll(self, key: str, job_id: str, n: int) -> None:
        """One due poll (a poll thread)."""
        cpu = time.thread_time()
        try:
            self._step(job_id, n)
        finally:
            with self._lock:
                self._stepping.discard(key)
                self._poll_cpu += time.thread_time() - cpu
            self._wake.set()  # room for the next due poll

    def _saturated(self) -> bool:
        with self._lock:
            return len(self._stepping) >= POLL_QUEUE

    def _on_poller(self, todo: Callable[[], None]) -> None:
        """Run ``todo`` on the polling thread (the scheduler is that thread's alone)."""
        if threading.current_thread() is self._thread:
            todo()
            return
        self._for_poller.put(todo)
        self._wake.set()

    def _provider(self, name: str) -> Provider:
        with self._lock:
            p = self._providers.get(name)
            if p is None:
                p = self._providers[name] = gk.open_for(self.ctx.cfg, name)
            return p

    def _follow_config(self) -> None:
        """Apply a reloaded spool.toml (the daemon replaces ``ctx.cfg`` on a change or SIGHUP).

        Polling policies apply from each generation's next poll; a provider whose
        table changed gets a new client (base URL, token, timeouts, download limits)
        for its next request, its counters carried over. The allowance (``in_flight``)
        is the daemon's pool, resized by the daemon; the spending guard reads
        ``ctx.cfg`` at each create. The old client is closed at stop, not now: a
        download may still be streaming through it.
        """
        cfg = self.ctx.cfg
        if cfg is self._cfg:
            return
        old, self._cfg = self._cfg.provider_configs, cfg
        new = cfg.provider_configs
        self.sched.set_policies({n: c.polling for n, c in new.items()})
        with self._lock:
            for name, client in list(self._providers.items()):
                if new.get(name) == old.get(name):
                    continue
                del self._providers[name]
                self._retired.append(client)
                kept = self._carried.setdefault(name, {})
                for k, v in client.counted().items():
                    kept[k] = kept.get(k, 0) + v
        changed = sorted(n for n in {*old, *new} if old.get(n) != new.get(n))
        if changed:
            log.info("providers reloaded from spool.toml: %s", ", ".join(changed))

    def _load(self, job_id: str) -> gk.GenerateJob:
        job = quarantine.load(self.ctx.tree.job_file("running", job_id, self.ctx.worker))
        assert isinstance(job, gk.GenerateJob)
        return job

    def _admit(self, job_id: str, n: int | None) -> None:
        """A new claim opens its attempt; a resumed one carries on in its own (an admission thread)."""
        if self._stop.is_set():
            return  # left in running/: the next start resumes it
        try:
            job = self._load(job_id)
        except quarantine.Damaged:
            self._done(job_id, execute(self.ctx, job_id))  # quarantines it, as for any kind
            return
        except OSError:
            self._done(job_id, "lost")
            return
        if n is None:
            attempt = open_attempt(self.ctx.tree, job_id, self.ctx.worker)
            crashpoint("after_attempt_dir")
            self.ctx.journal.record(job_id, "running", from_="pending", attempt=attempt.n, reason="claimed")
            log.info("%s: attempt %d started (generation)", job_id, attempt.n)
            try:
                gk.inherit(self.ctx, job, attempt)  # a provider job still in flight is never created twice
            except OSError as exc:
                self._end(gk.key_of(job_id, attempt.n), job, attempt, exc)
                return
        else:
            attempt = Attempt(self.ctx.tree, job_id, n)
            log.info("%s: attempt %d resumed (generation)", job_id, n)
        with self._lock:
            self.flights[gk.key_of(job_id, attempt.n)] = (job_id, attempt.n)
        self._step(job_id, attempt.n, job)

    def _step(self, job_id: str, n: int, job: gk.GenerateJob | None = None) -> None:
        """One step of one generation, then schedule what comes next (any thread)."""
        key = gk.key_of(job_id, n)
        attempt = Attempt(self.ctx.tree, job_id, n)
        try:
            job = job or self._load(job_id)
            intent.raise_if_cancelled(self.ctx.tree, job_id, n, self.ctx.worker)
            nxt = gk.advance(self.ctx, job, attempt, self._provider(job.generate.provider))
        except Exception as exc:  # every ending is recorded; the driver itself goes on
            self._end(key, job, attempt, exc)
            return
        if nxt.action == "retrieve":
            self._on_poller(lambda: self.sched.discard(key))
            self._downloads.submit(self._retrieve, key, job, attempt)
            return
        provider = job.generate.provider

        def schedule() -> None:
            if key in self.flights:  # not ended meanwhile (a cancel look): no ghost entry
                gk.schedule(self.sched, key, provider, nxt)

        self._on_poller(schedule)
        if nxt.action == "wait" and not nxt.wait:
            self._wake.set()

    def _retrieve(self, key: str, job: gk.GenerateJob, attempt: Attempt) -> None:
        """Download, gate, publish (a download thread)."""
        ctx = self.ctx
        try:
            started = time.monotonic()
            provider = self._provider(job.generate.provider)
            candidate, _size = gk.download(ctx, job, attempt, provider)
            report = gk.KIND.check(ctx.cfg, job, candidate, attempt.dir / "validate.log")
            crashpoint("after_validation")
            intent.raise_if_cancelled(ctx.tree, job.job_id, attempt.n, ctx.worker)
            if not report.ok:
                raise validation_failure(report)
            publish(
                ctx,
                job,
                attempt,
                candidate,
                report,
                time.monotonic() - started,
                on_stage=gk.on_stage(ctx, job, attempt, candidate),
            )
        except Exception as exc:
            self._end(key, job, attempt, exc)
            return
        with self._lock:
            self.flights.pop(key, None)
        self._done(job.job_id, "complete")

    def _end(self, key: str, job: gk.GenerateJob | None, attempt: Attempt, exc: BaseException) -> None:
        """Abandon the attempt (state ``failed``), then the ending every kind has."""
        self._on_poller(lambda: self.sched.discard(key))
        with self._lock:
            self.flights.pop(key, None)
        exc = _located(exc, job)
        if job is None:  # the job file could not be read: damaged (quarantined there) or gone
            lost = not isinstance(exc, quarantine.Damaged)
            self._done(attempt.job_id, "lost" if lost else execute(self.ctx, attempt.job_id))
            return
        if isinstance(exc, Failed):
            try:
                gk.cancel(self.ctx, job, attempt, self._provider(job.generate.provider))  # stop the cost
            except Exception:
                log.exception("%s: cancelling at the provider failed", job.job_id)
            gk.abandon(self.ctx, job, attempt, exc)
            if gk.was_sent(attempt):
                # The provider may finish it anyway: look a few more times, for the record only.
                late, provider = LATE + key, job.generate.provider
                until = time.time() + AUDIT_CEILINGS * self._ceiling(provider)
                audit = (job.job_id, attempt.n, provider, AUDIT_POLLS, until)

                def look_later() -> None:
                    self.audits[late] = audit
                    self.sched.add(late, provider)

                self._on_poller(look_later)
        try:
            outcome = end_attempt(self.ctx, job, attempt, exc)
        except Exception:
            log.exception("%s: recording the end of attempt %d failed", job.job_id, attempt.n)
            outcome = "error"
        log.info("%s: %s", job.job_id, outcome)
        self._done(job.job_id, outcome)

    def _audit(self, late: str) -> None:
        """One look at an abandoned attempt's provider job: a success goes to
        ``late-completion.json`` and nowhere else (the attempt is ``failed``)."""
        jid, n, provider, left, until = self.audits.pop(late, ("", 0, "", 0, 0.0))
        if not jid:
            return
        attempt = Attempt(self.ctx.tree, jid, n)
        try:
            final = gk.record_late(self.ctx, attempt, self._provider(provider))
        except Exception:
            log.exception("%s: looking for a late completion of attempt %d failed", jid, n)
            final = False
        if final or (left <= 1 and time.time() >= until):
            self.sched.discard(late)
            return
        self.audits[late] = (jid, n, provider, max(1, left - 1), until)
        self.sched.report(late, "pending")

    def _ceiling(self, provider: str) -> float:
        """The provider's polling ceiling (seconds), as now configured."""
        cfg = self._cfg.provider_configs.get(provider)
        return cfg.polling.ceiling if cfg is not None else 60.0

    def _done(self, job_id: str, outcome: str) -> None:
        with self._lock:
            self.active.discard(job_id)
        self.on_done(job_id, outcome)

    def _look_for_cancels(self) -> None:
        """``spool cancel`` of a generation waiting at its provider: cancel it there, then fail."""
        with self._lock:
            # Not downloading (out of the scheduler), not being polled now (that step looks itself).
            waiting = [(k, f) for k, f in self.flights.items() if k in self.sched and k not in self._stepping]
        for key, (jid, n) in waiting:
            if intent.cancel_requested(self.ctx.tree, jid) is None:
                continue
            attempt = Attempt(self.ctx.tree, jid, n)
            job: gk.GenerateJob | None = None
            try:
                job = self._load(jid)
                gk.cancel(self.ctx, job, attempt, self._provider(job.generate.provider))
                intent.raise_if_cancelled(self.ctx.tree, jid, n, self.ctx.worker)
            except (Failed, OSError, quarantine.Damaged) as exc:
                self._end(key, job, attempt, exc)
