"""Living under systemd: the notification protocol as a daemon hook, and logs journald reads well.

**Notifications** (``sd_notify``, spoken directly: no library). With
``Type=notify`` systemd passes ``$NOTIFY_SOCKET``, a unix datagram socket: a
path, or a name in the abstract namespace when it starts with ``@``. Each
message is one datagram of newline-separated ``KEY=VALUE`` lines. The daemon
sends:

* ``READY=1`` once it holds its identity and has recovered its own jobs;
* ``STATUS=2 running, 14 pending, 1 failed`` when that changes (recounted,
  names only, once per ``heartbeat_interval``);
* ``WATCHDOG=1`` every half of ``$WATCHDOG_USEC``, only from the loop thread
  (a tick, or an event the loop itself recorded while accepting a long drop),
  so a hung loop stops the pings and systemd restarts the daemon;
* ``STOPPING=1`` at the first stop signal, with ``EXTEND_TIMEOUT_USEC`` so
  that the unit's stop timeout covers ``stop_grace`` whatever it is set to.

Without ``$NOTIFY_SOCKET`` nothing is sent. The variables are removed from the
environment at start, so FFmpeg and other children cannot speak for the
daemon. A failed send is logged once and never stops the daemon.

**Logs** go to stderr. Under journald (``$JOURNAL_STREAM`` names our stderr)
each line starts with its syslog priority, ``<3>`` for errors down to ``<7>``
for debug, and carries no time (journald adds it); under another service
manager (``$INVOCATION_ID``) only the time is dropped.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
import threading
import time
from typing import TYPE_CHECKING

from spool.core.model import Event
from spool.queue.status import count, job_ids
from spoold.hooks import Hook

if TYPE_CHECKING:
    from spoold.daemon import Daemon

log = logging.getLogger("spoold.notify")

#: Seconds added to ``stop_grace`` for recording interruptions after the grace period.
STOP_MARGIN = 30.0


class Notifier:
    """Sends notification datagrams to one socket address (or nowhere)."""

    def __init__(self, address: str | None) -> None:
        self.address: str | None = None
        self._sock: socket.socket | None = None
        self._warned = False
        if not address:
            return
        if address.startswith("@"):
            self.address = "\0" + address[1:]  # the abstract namespace
        elif address.startswith("/"):
            self.address = address
        else:
            log.warning("NOTIFY_SOCKET %r is not a unix socket address; not notifying systemd", address)
            return
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)

    @property
    def enabled(self) -> bool:
        return self._sock is not None

    def send(self, *assignments: str) -> bool:
        """Send ``KEY=VALUE`` lines as one datagram; ``False`` if it was not delivered."""
        if self._sock is None or self.address is None:
            return False
        for a in assignments:
            if "=" not in a or "\n" in a:
                raise ValueError(f"{a!r} is not one KEY=VALUE line")
        try:
            self._sock.sendto("\n".join(assignments).encode(), self.address)
        except OSError as exc:
            if not self._warned:
                log.warning("cannot notify systemd at NOTIFY_SOCKET (%s)", exc)
                self._warned = True
            return False
        return True

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None


def watchdog_interval(environ: dict[str, str] | os._Environ[str]) -> float | None:
    """Seconds between watchdog pings: half of ``WATCHDOG_USEC``, if it is meant for us."""
    usec = environ.get("WATCHDOG_USEC", "")
    pid = environ.get("WATCHDOG_PID", "")
    if not usec.isdigit() or int(usec) == 0 or (pid and pid != str(os.getpid())):
        return None
    return int(usec) / 2e6


def queue_status(daemon: Daemon) -> str:
    """The one line ``systemctl status`` shows."""
    tree = daemon.tree
    text = (
        f"{len(job_ids(tree, 'running'))} running, {count(tree.pending)} pending, {count(tree.failed)} failed"
    )
    if daemon.stopping:
        return f"stopping: {len(daemon.slots)} render(s) finishing here; {text}"
    return f"{text}; {len(daemon.slots)}/{daemon.cfg.limits.max_active} slots busy here"


class SystemdNotify(Hook):
    """Tells systemd when the daemon is ready, how it is doing, that it lives, and that it stops."""

    def __init__(self, environ: dict[str, str] | os._Environ[str] | None = None) -> None:
        env = os.environ if environ is None else environ
        self.notifier = Notifier(env.get("NOTIFY_SOCKET"))
        self.watchdog = watchdog_interval(env)
        if environ is None:
            for key in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID"):
                os.environ.pop(key, None)
        self._next_ping = 0.0
        self._next_status = 0.0
        self._status = ""

    def started(self, daemon: Daemon) -> None:
        if self.notifier.enabled:
            self._status = queue_status(daemon)
            self._next_status = time.monotonic() + daemon.cfg.daemon.heartbeat_interval
            self.notifier.send("READY=1", f"STATUS={self._status}")

    def tick(self, daemon: Daemon) -> None:
        if not self.notifier.enabled:
            return
        self._ping()
        now = time.monotonic()
        if now >= self._next_status:
            self._next_status = now + daemon.cfg.daemon.heartbeat_interval
            self._update(queue_status(daemon))

    def waiting(self, daemon: Daemon, why: str) -> None:
        if self.notifier.enabled:
            self._ping()  # paused on purpose, not hung
            self._update(why)

    def event(self, daemon: Daemon, event: Event) -> None:
        if threading.current_thread() is threading.main_thread():
            self._ping()  # the loop is busy, not hung: accepting a large drop records many events

    def stopping(self, daemon: Daemon) -> None:
        if self.notifier.enabled:
            extend = int((daemon.cfg.daemon.stop_grace + STOP_MARGIN) * 1e6)
            self._status = queue_status(daemon)
            self.notifier.send("STOPPING=1", f"STATUS={self._status}", f"EXTEND_TIMEOUT_USEC={extend}")

    def stopped(self, daemon: Daemon) -> None:
        if self.notifier.enabled:
            self.notifier.send("STATUS=stopped")
            self.notifier.close()

    def _ping(self) -> None:
        if self.watchdog is None:
            return
        now = time.monotonic()
        if now >= self._next_ping:
            self._next_ping = now + self.watchdog
            self.notifier.send("WATCHDOG=1")

    def _update(self, status: str) -> None:
        if status != self._status:
            self._status = status
            self.notifier.send(f"STATUS={status}")


# -- logs ---------------------------------------------------------------------------------------

#: syslog priorities of logging levels (sd-daemon(3): ``<N>`` prefixes).
PRIORITY = {
    logging.DEBUG: 7,
    logging.INFO: 6,
    logging.WARNING: 4,
    logging.ERROR: 3,
    logging.CRITICAL: 2,
}


class JournalFormatter(logging.Formatter):
    """Every line of a record (tracebacks too) prefixed with the record's syslog priority."""

    def format(self, record: logging.LogRecord) -> str:
        prio = PRIORITY.get(record.levelno, 6 if record.levelno < logging.WARNING else 3)
        return "\n".join(f"<{prio}>{line}" for line in super().format(record).splitlines())


def stderr_is_journal() -> bool:
    """Whether stderr is connected to journald (``$JOURNAL_STREAM`` is ``device:inode`` of it)."""
    dev, _, ino = os.environ.get("JOURNAL_STREAM", "").partition(":")
    if not (dev.isdigit() and ino.isdigit()):
        return False
    try:
        st = os.fstat(sys.stderr.fileno())
    except (OSError, ValueError):
        return False
    return st.st_dev == int(dev) and st.st_ino == int(ino)


def log_handler() -> logging.Handler:
    """The daemon's stderr handler, formatted for whoever reads it."""
    handler = logging.StreamHandler(sys.stderr)
    if stderr_is_journal():
        handler.setFormatter(JournalFormatter("%(name)s: %(message)s"))
    elif os.environ.get("INVOCATION_ID"):
        handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    return handler
