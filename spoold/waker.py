"""A wake-up the main loop can sleep on and anyone may ring, signal handlers included.

``threading.Event`` must not be set from a signal handler: the handler runs in
the main thread between two bytecodes, possibly while the main thread is
inside ``Event.wait()`` holding the event's lock, and ``set()`` then waits for
that lock forever (seen in CI as a daemon that ignored its second SIGTERM).
A pipe has no such lock: ringing is one ``os.write`` (async-signal-safe), and
waiting is ``select`` on the read end.
"""

from __future__ import annotations

import os
import select


class Waker:
    def __init__(self) -> None:
        self._r, self._w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)

    def set(self) -> None:
        """Wake the loop (from any thread, or a signal handler)."""
        try:
            os.write(self._w, b"!")
        except BlockingIOError:
            pass  # the pipe is full: the loop will wake anyway

    def wait(self, timeout: float, also: tuple[int, ...] = ()) -> bool:
        """Sleep until rung, one of ``also`` is readable (the watcher's inotify: its owner
        reads it), or ``timeout`` seconds pass; True if woken before the timeout. Consumes
        the rings, not what ``also`` holds."""
        ready, _, _ = select.select([self._r, *also], [], [], max(0.0, timeout))
        if not ready:
            return False
        if self._r in ready:
            self.clear()
        return True

    def clear(self) -> None:
        try:
            while os.read(self._r, 4096):
                pass
        except BlockingIOError:
            pass

    def close(self) -> None:
        os.close(self._r)
        os.close(self._w)
