"""Threads that run attempts, kept and reused between jobs.

A running attempt needs a thread of its own (it waits on its child, FFmpeg),
but starting a new thread per job costs a thread creation and a handshake on
the loop's critical path: ``Thread.start`` waits until the new thread runs.
With short jobs (no-ops, quick renders) that was the largest single cost of a
claim in the profile. So a thread that finishes an attempt waits a while for
the next one instead of ending; the loop hands work to an idle thread through
a queue, and starts a new one only when none is idle. Idle threads end after
``idle_timeout`` seconds, so a daemon that ran 16 renders at noon does not
keep 16 threads all night.

Invariants: a handed-over call runs exactly once, on exactly one thread; its
:class:`Slot` is done only after the call returned (or raised); the number of
threads never exceeds the number of calls running at once plus the idle ones.
Threads are daemon threads, like the per-job threads they replace: a render
stuck past the stop grace must not hold the process open.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable


class Slot:
    """One handed-over call: what the loop keeps in place of a thread."""

    __slots__ = ("_done", "name")

    def __init__(self, name: str) -> None:
        self.name = name
        self._done = threading.Event()

    def is_alive(self) -> bool:
        """True until the call has returned (the name ``Thread`` uses)."""
        return not self._done.is_set()

    def join(self, timeout: float | None = None) -> None:
        self._done.wait(timeout)


class SlotThreads:
    """A pool of reusable daemon threads with no fixed size: every call handed
    over starts at once, on an idle thread if there is one."""

    def __init__(self, idle_timeout: float = 30.0) -> None:
        self.idle_timeout = idle_timeout
        self._work: queue.SimpleQueue[tuple[Slot, Callable[[], None]]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._idle = 0  # threads waiting on _work and not yet promised an item
        self.started = 0  # threads ever started (for tests and the curious)

    def run(self, name: str, fn: Callable[[], None]) -> Slot:
        """Run ``fn`` on a thread of the pool now; returns its :class:`Slot`."""
        slot = Slot(name)
        with self._lock:
            if self._idle:
                self._idle -= 1  # promised to this item: the thread that takes it is not idle
                self._work.put((slot, fn))
                return slot
            self.started += 1
        t = threading.Thread(target=self._serve, args=(slot, fn), name=name, daemon=True)
        t.start()
        return slot

    def _serve(self, slot: Slot, fn: Callable[[], None]) -> None:
        me = threading.current_thread()
        while True:
            me.name = slot.name  # log lines and py-spy show which job this thread runs
            try:
                fn()
            finally:
                slot._done.set()
            with self._lock:
                self._idle += 1
            try:
                slot, fn = self._work.get(timeout=self.idle_timeout)
                continue
            except queue.Empty:
                pass
            with self._lock:
                # An item may have been promised to an idle thread between the
                # timeout and taking the lock: then it is in the queue, and ours.
                try:
                    slot, fn = self._work.get_nowait()
                except queue.Empty:
                    self._idle -= 1
                    return
