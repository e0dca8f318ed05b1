"""The driver: every attempt of a *driven* kind this daemon holds, stepped when due.

A driven kind's attempt spends almost all its life waiting for something
remote (a generation, for its provider). Giving it a slot thread, as a render
gets, would tie up a thread per job and, worse, a render slot. So the daemon
hands claimed jobs of a driven kind (:attr:`spool.kinds.base.Kind.runner`) to
this driver, which knows nothing of what the kind does. It keeps:

* one heap of due times, on one scheduling thread; a due attempt's step runs on
  a small pool of step threads (:data:`STEPS`: a step is mostly a wait for a
  remote answer or an fsync, so a few overlap), one step per attempt at a time;
* a pool of transfer threads (:data:`TRANSFERS`) for the long part a step hands
  over (a download), each with an :class:`~spool.kinds.base.Abort` that a
  ``spool cancel`` or the daemon's stop trips within a second;
* the endings every kind has: the candidate goes through
  :func:`spool.queue.execute.finish` (the gate, the one publish path), a failure
  through :meth:`Kind.abandon` then :func:`spool.queue.execute.end_attempt`;
* the kind's audits of ended attempts (a late remote result, recorded only).

Memory per attempt in flight is one heap entry and one small tuple; the job
file is read again when its turn comes. An attempt the daemon's recovery
resumes (its own, after a restart) joins the same heap in the same attempt;
the kind's files say when its next step is due.
"""

from __future__ import annotations

import heapq
import logging
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from spool import kinds
from spool.core.errors import Deferred, Failed, Interrupted, LostOwnership
from spool.core.model import JobBase
from spool.kinds.base import Abort, Kind, Next
from spool.queue import cancel, quarantine
from spool.queue.attempt import Attempt
from spool.queue.context import Context
from spool.queue.execute import end_attempt, execute, finish, start

log = logging.getLogger("spoold.driver")

#: Steps at once (each mostly waits for a remote answer or an fsync): admissions and polls
#: of thousands of generations overlap on these.
STEPS = 8
#: Steps handed to the pool and not yet started, at most (the rest wait in the heap, in order).
STEP_QUEUE = 64
#: Transfers at once: each streams to disk within its kind's limits (rate, total time), so
#: a slow one ends by those limits and holds up the others only as long.
TRANSFERS = 4
#: Seconds between looks for cancel requests of the attempts in flight (at least; one
#: look is a stat per attempt, so with many in flight it comes less often).
CANCEL_LOOK = 0.5
CANCEL_LOOKS_PER_SECOND = 2000
#: Why a transfer is stopped when the daemon stops (the attempt stays in flight).
STOPPING = "the daemon is stopping"


class Driver:
    """The daemon calls :meth:`take` for a claimed job, :meth:`resume` for one recovery
    carries on, and learns of each ending through ``on_done(job_id, outcome)``."""

    def __init__(self, ctx: Context, on_done: Callable[[str, str], None]) -> None:
        self.ctx = ctx
        self.on_done = on_done
        self._lock = threading.Lock()
        #: (due, seq, key) of every scheduled step; stale entries are skipped.
        self._heap: list[tuple[float, int, str]] = []
        self._seq = 0
        #: key -> (job ID, attempt n, kind name, seq of its live heap entry or 0)
        self._flights: dict[str, tuple[str, int, str, int]] = {}
        #: audit key -> (job ID, attempt n, kind name, seq)
        self._audits: dict[str, tuple[str, int, str, int]] = {}
        #: Job IDs this driver holds (for the daemon's drain, pools and heartbeat).
        self.active: set[str] = set()
        self._stepping: set[str] = set()
        self._transfers: dict[str, Abort] = {}
        self._inbox: queue.SimpleQueue[tuple[str, int | None, str]] = queue.SimpleQueue()
        self._later: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._steps = ThreadPoolExecutor(max_workers=STEPS, thread_name_prefix="drive-step")
        self._transfer_pool = ThreadPoolExecutor(max_workers=TRANSFERS, thread_name_prefix="drive-transfer")
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._next_cancel_look = 0.0
        #: Steps taken and the CPU they cost (logged at stop, for tools/genbench.py).
        self.steps_taken = 0
        self._step_cpu = 0.0

    # -- the daemon's side -------------------------------------------------------------
    def take(self, job_id: str, kind: Kind[Any]) -> None:
        """A job the daemon has just claimed (from a pool of a driven kind)."""
        with self._lock:
            self.active.add(job_id)
        self._inbox.put((job_id, None, kind.name))
        self._wake.set()

    def resume(self, job_id: str, attempt: int, kind: Kind[Any]) -> None:
        """Recovery carries on an attempt of this worker's in flight."""
        with self._lock:
            self.active.add(job_id)
        self._inbox.put((job_id, attempt, kind.name))
        self._wake.set()

    def held(self) -> list[str]:
        with self._lock:
            return sorted(self.active)

    def busy(self) -> bool:
        with self._lock:
            return bool(self.active)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="driver", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop stepping; attempts in flight stay in ``running/`` and resume at the next start."""
        self._stop.set()
        self._wake.set()
        with self._lock:
            aborts = list(self._transfers.values())
        for a in aborts:
            a.trip(STOPPING)
        self._steps.shutdown(wait=True, cancel_futures=True)
        if self._thread is not None:
            self._thread.join(timeout=60)
        self._transfer_pool.shutdown(wait=True, cancel_futures=True)
        for k in kinds.KINDS.values():
            k.close()

    # -- the scheduling thread ---------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._turn()
            except Exception:
                log.exception("driver turn failed; going on")
                time.sleep(1.0)
            nxt = self._heap[0][0] if self._heap else None
            wait = 1.0 if nxt is None else max(0.0, min(1.0, nxt - time.time()))
            with self._lock:
                saturated = len(self._stepping) >= STEP_QUEUE
            if saturated:
                wait = 1.0  # due steps wait for room: a finishing step wakes this thread
            self._wake.wait(timeout=wait)
            self._wake.clear()
        # What the driven attempts cost this host (tools/genbench.py reads this line).
        log.info(
            "driver: %d steps; CPU %.3f s in steps, %.3f s on the scheduling thread",
            self.steps_taken,
            self._step_cpu,
            time.thread_time(),
        )

    def _turn(self) -> None:
        while True:
            try:
                jid, n, kind = self._inbox.get_nowait()
            except queue.Empty:
                break
            self._steps.submit(self._admit, jid, n, kind)
        while True:
            try:
                todo = self._later.get_nowait()
            except queue.Empty:
                break
            todo()
        now = time.time()
        with self._lock:
            room = STEP_QUEUE - len(self._stepping)
        while room > 0 and self._heap and self._heap[0][0] <= now:
            _, seq, key = heapq.heappop(self._heap)
            if self._stop.is_set():
                return
            if key in self._audits:
                if self._audits[key][3] == seq:
                    jid, n, kind, _ = self._audits.pop(key)
                    self._steps.submit(self._audit, key, jid, n, kind)
                    room -= 1
                continue
            with self._lock:
                flight = self._flights.get(key)
                if flight is None or flight[3] != seq:
                    continue  # stale
                self._flights[key] = (*flight[:3], 0)
                self._stepping.add(key)
            self._steps.submit(self._step, key, flight[0], flight[1], flight[2])
            room -= 1
        mono = time.monotonic()
        if mono >= self._next_cancel_look:
            with self._lock:
                waiting = len(self._flights)
            self._next_cancel_look = mono + max(CANCEL_LOOK, waiting / CANCEL_LOOKS_PER_SECOND)
            self._look_for_cancels()

    def _schedule(self, key: str, at: float) -> None:
        """Put a step in the heap (the scheduling thread only)."""
        with self._lock:
            flight = self._flights.get(key)
            if flight is None:
                return  # ended meanwhile: no ghost entry
            self._seq += 1
            self._flights[key] = (*flight[:3], self._seq)
        heapq.heappush(self._heap, (at, self._seq, key))
        self._compact()

    def _compact(self) -> None:
        # Rescheduling leaves stale heap entries behind; rebuild when they dominate.
        if len(self._heap) > 2 * (len(self._flights) + len(self._audits)) + 64:
            live = {seq for *_, seq in self._flights.values() if seq} | {a[3] for a in self._audits.values()}
            self._heap = [e for e in self._heap if e[1] in live]
            heapq.heapify(self._heap)

    def _later_on_loop(self, todo: Callable[[], None]) -> None:
        """Run ``todo`` on the scheduling thread (the heap is that thread's alone)."""
        if threading.current_thread() is self._thread:
            todo()
            return
        self._later.put(todo)
        self._wake.set()

    # -- steps (step threads) ------------------------------------------------------------
    def _admit(self, job_id: str, n: int | None, kind_name: str) -> None:
        """A new claim opens its attempt; a resumed one carries on in its own."""
        if self._stop.is_set():
            return  # left in running/: the next start resumes it
        if n is None:
            # Durable before its first step: the kind writes durable states into it.
            started = start(self.ctx, job_id, durable=True)
            if isinstance(started, str):
                self._done(job_id, started)
                return
            job, attempt = started
        else:
            attempt = Attempt(self.ctx.tree, job_id, n)
            try:
                job = self._load(job_id)
            except quarantine.Damaged:
                self._done(job_id, execute(self.ctx, job_id))  # quarantines it, as for any kind
                return
            except OSError:
                self._done(job_id, "lost")
                return
            log.info("%s: attempt %d resumed", job_id, n)
        key = f"{job_id}/{attempt.n}"
        with self._lock:
            self._flights[key] = (job_id, attempt.n, kind_name, 0)
            self._stepping.add(key)
        self._step(key, job_id, attempt.n, kind_name, job)

    def _load(self, job_id: str) -> JobBase:
        return quarantine.load(self.ctx.tree.job_file("running", job_id, self.ctx.worker))

    def _step(self, key: str, job_id: str, n: int, kind_name: str, job: JobBase | None = None) -> None:
        """One step of one attempt, then what it asked for."""
        cpu = time.thread_time()
        attempt = Attempt(self.ctx.tree, job_id, n)
        kind = kinds.KINDS[kind_name]
        try:
            job = job or self._load(job_id)
            cancel.raise_if_cancelled(self.ctx.tree, job_id, n, self.ctx.worker)
            nxt = kind.step(self.ctx, job, attempt)
        except Exception as exc:  # every ending is recorded; the driver itself goes on
            self._end(key, kind, job, attempt, exc)
            return
        finally:
            with self._lock:
                self._stepping.discard(key)
                self.steps_taken += 1
                self._step_cpu += time.thread_time() - cpu
            self._wake.set()
        self._follow(key, kind, job, attempt, nxt)

    def _follow(self, key: str, kind: Kind[Any], job: JobBase, attempt: Attempt, nxt: Next) -> None:
        if nxt.action == "wait":
            self._later_on_loop(lambda: self._schedule(key, nxt.at))
        elif nxt.action == "transfer":
            self._transfer_pool.submit(self._transfer, key, kind, job, attempt)
        else:
            self._publish(key, kind, job, attempt, nxt)

    def _transfer(self, key: str, kind: Kind[Any], job: JobBase, attempt: Attempt) -> None:
        """The long part of a step (a transfer thread), stoppable through its abort."""
        abort = Abort()
        with self._lock:
            self._transfers[key] = abort
        if self._stop.is_set():
            abort.trip(STOPPING)
        try:
            nxt = kind.transfer(self.ctx, job, attempt, abort)
        except Exception as exc:
            self._end(key, kind, job, attempt, exc, stopping=abort.reason == STOPPING)
            return
        finally:
            with self._lock:
                self._transfers.pop(key, None)
        self._follow(key, kind, job, attempt, nxt)

    def _publish(self, key: str, kind: Kind[Any], job: JobBase, attempt: Attempt, nxt: Next) -> None:
        assert nxt.produced is not None
        try:
            finish(self.ctx, job, attempt, nxt.produced)
        except Exception as exc:
            self._end(key, kind, job, attempt, exc)
            return
        with self._lock:
            self._flights.pop(key, None)
        log.info("%s: complete", job.job_id)
        self._done(job.job_id, "complete")

    def _end(
        self,
        key: str,
        kind: Kind[Any],
        job: JobBase | None,
        attempt: Attempt,
        exc: BaseException,
        *,
        stopping: bool = False,
    ) -> None:
        """The kind's side of the ending first, then the ending every kind has."""
        with self._lock:
            self._flights.pop(key, None)
        if stopping or (isinstance(exc, Interrupted) and self._stop.is_set()):
            # The daemon stops: the attempt stays in flight in running/, resumed at the next start.
            with self._lock:
                self.active.discard(attempt.job_id)
            return
        exc = _located(exc, attempt.job_id)
        if job is None:  # the job file could not be read: damaged (quarantined there) or gone
            lost = not isinstance(exc, quarantine.Damaged)
            self._done(attempt.job_id, "lost" if lost else execute(self.ctx, attempt.job_id))
            return
        if isinstance(exc, Failed | Deferred):
            try:
                when = kind.abandon(self.ctx, job, attempt, exc)
            except Exception:
                log.exception("%s: the kind's side of ending attempt %d failed", job.job_id, attempt.n)
                when = None
            if when is not None:
                self._later_on_loop(lambda: self._audit_at(attempt.job_id, attempt.n, kind.name, when))
        try:
            outcome = end_attempt(self.ctx, job, attempt, exc)
        except Exception:
            log.exception("%s: recording the end of attempt %d failed", job.job_id, attempt.n)
            outcome = "error"
        log.info("%s: %s", job.job_id, outcome)
        self._done(job.job_id, outcome)

    def _audit_at(self, job_id: str, n: int, kind_name: str, when: float) -> None:
        key = f"audit:{job_id}/{n}"
        self._seq += 1
        self._audits[key] = (job_id, n, kind_name, self._seq)
        heapq.heappush(self._heap, (when, self._seq, key))

    def _audit(self, key: str, job_id: str, n: int, kind_name: str) -> None:
        try:
            when = kinds.KINDS[kind_name].audit(self.ctx, job_id, n)
        except Exception:
            log.exception("%s: looking again at attempt %d failed", job_id, n)
            when = None
        if when is not None and not self._stop.is_set():
            self._later_on_loop(lambda: self._audit_at(job_id, n, kind_name, when))

    def _done(self, job_id: str, outcome: str) -> None:
        with self._lock:
            self.active.discard(job_id)
        self.on_done(job_id, outcome)

    def _look_for_cancels(self) -> None:
        """``spool cancel`` of an attempt in flight: a waiting one steps now (its step sees
        the request and ends it); a transfer is stopped within a second."""
        with self._lock:
            waiting = [(k, f) for k, f in self._flights.items() if f[3] and k not in self._stepping]
            moving = list(self._transfers.items())
        for key, (jid, _n, _kind, _seq) in waiting:
            if cancel.cancel_requested(self.ctx.tree, jid) is not None:
                self._schedule(key, 0.0)
        for key, abort in moving:
            jid = key.rsplit("/", 1)[0]
            if cancel.cancel_requested(self.ctx.tree, jid) is not None:
                abort.trip("spool cancel")


def _located(exc: BaseException, job_id: str) -> BaseException:
    """What :func:`spool.queue.execute.end_attempt` records for an exception of a step."""
    if isinstance(exc, Failed | Deferred | Interrupted | LostOwnership | OSError | quarantine.Damaged):
        return exc
    log.error("%s: unexpected %s in a step", job_id, type(exc).__name__, exc_info=exc)
    return Failed(
        "produce",
        "internal",
        f"a step failed unexpectedly ({type(exc).__name__}: {exc})",
        next_action="Read the daemon's log; spool retry the job.",
        retryable=True,
    )
