"""Stop, timeout and cancel for work an attempt waits on, whatever the work is.

A render waits on FFmpeg's pipes; a generation will poll a provider over
HTTP. Both must stop for the same three reasons with the same words, so the
loop that watches for them lives here and the work is a ``tick``: one bounded
wait for progress that says whether there is more to wait for.

Invariants:

* the reasons are checked before every tick, in this order: ``stop`` set
  (the daemon is shutting down) -> ``"interrupted"``; the monotonic clock
  past ``deadline`` -> ``"timeout"``; ``cancelled()`` true -> ``"cancelled"``;
* ``cancelled()`` (which reads the spool) is asked at once and then at most
  every ``cancel_every`` seconds;
* a tick waits at most ``wait`` seconds, so a reason is noticed within about
  that long; the caller stops the work itself (supervise only says why).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Literal

Stopped = Literal["timeout", "interrupted", "cancelled"]

#: The longest one tick waits for the work.
TICK = 0.2
#: How often ``cancelled()`` is asked.
CANCEL_EVERY = 0.5


def supervise(
    tick: Callable[[float], bool],
    *,
    deadline: float,
    stop: threading.Event | None = None,
    cancelled: Callable[[], bool] | None = None,
    wait: float = TICK,
    cancel_every: float = CANCEL_EVERY,
) -> Stopped | None:
    """Call ``tick(wait)`` until it returns False (the work ended by itself: ``None``)
    or a reason to stop turns up (returned; the work is still running then)."""
    next_cancel_check = 0.0
    while True:
        if stop is not None and stop.is_set():
            return "interrupted"
        now = time.monotonic()
        if now > deadline:
            return "timeout"
        if cancelled is not None and now >= next_cancel_check:
            next_cancel_check = now + cancel_every
            if cancelled():
                return "cancelled"
        if not tick(wait):
            return None
