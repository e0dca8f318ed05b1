"""Policies the daemon composes, in the manner of dramatiq's middleware.

A hook is a small object with optional callbacks; the loop calls them and
never knows what they do. Metrics, systemd notifications and the like live
in hooks, not in ``if``s threaded through the loop. A hook must be cheap and
must not raise: a failing hook is logged and the daemon carries on.

The policies (:mod:`spoold.policies`) are hooks too, and act on the loop through
the daemon's named surface, the only part of a ``Daemon`` a hook touches:

* read: ``tree``, ``cfg``, ``ctx``, ``worker``, ``journal``, ``stopping``, ``slots``,
  ``pools``, ``index``, ``heartbeat``, ``stats``, ``hangups`` (SIGHUPs so far),
  ``beat_written`` (this step wrote the heartbeat), ``orphans``, ``drain`` (it ends once
  nothing is left to do);
* set: ``quarantined`` (why this worker claims nothing), ``disk_full_since``;
* call: ``pause(seconds, why)``, ``beat_soon()``, ``use_config(cfg)``,
  ``carry_on(outcome)``.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from spool.core.model import Event

if TYPE_CHECKING:
    from spoold.daemon import Daemon

log = logging.getLogger("spoold.hooks")


class Hook:
    """Override what you need; every callback defaults to doing nothing."""

    def started(self, daemon: Daemon) -> None:
        """The daemon holds its identity, adopted its jobs and is about to loop
        (main thread, as are ``tick``, ``stopping`` and ``stopped``)."""

    def before_step(self, daemon: Daemon) -> None:
        """At the start of every loop iteration, before accepting and claiming (main
        thread; also while stopping: a hook that must not act then looks at
        ``daemon.stopping``)."""

    def step_failed(self, daemon: Daemon, what: str, exc: Exception) -> None:
        """A step raised: ``what`` is ``"loop"`` (an iteration) or a start step
        (``"start"``, ``"recover its own jobs"``: only a full disk reaches here, other
        errors end the daemon). A hook may ``daemon.pause`` here: the step is retried
        when the hooks return, unless the daemon is stopping."""

    def step_done(self, daemon: Daemon, what: str) -> None:
        """A step (as for ``step_failed``) succeeded."""

    def tick(self, daemon: Daemon) -> None:
        """Once per loop iteration (at least every poll interval)."""

    def waiting(self, daemon: Daemon, why: str) -> None:
        """The loop is paused (a full disk, a failure it backs off from) but lives."""

    def event(self, daemon: Daemon, event: Event) -> None:
        """A transition this daemon recorded in the journal.

        Called on the thread that recorded it: the main loop's (accepting,
        quarantining) or a job's own slot thread (claimed, complete, failed), so
        several calls may run at once; a hook that keeps state locks it."""

    def claimed(self, daemon: Daemon, job_id: str) -> None:
        """This daemon won the claim of ``job_id`` (main thread; the attempt opens next)."""

    def attempt_ended(self, daemon: Daemon, job_id: str, outcome: str) -> None:
        """An attempt of this daemon ended and its ending is recorded: ``outcome`` is where
        the job went or why (``complete``, ``failed``, ``retry``, ``blocked``,
        ``host-failed``, ``interrupted``...). Called on the thread that ended it."""

    def stopping(self, daemon: Daemon) -> None:
        """The first stop signal arrived: no more claims."""

    def stopped(self, daemon: Daemon) -> None:
        """The loop ended; every render has finished or been interrupted."""


def call(hooks: list[Hook], name: str, daemon: Daemon, *args: object) -> None:
    """Call one callback on every hook that has it, containing their failures."""
    for hook in hooks:
        if not _overrides(type(hook), name):
            continue  # Hook's own does nothing (a job passes ~10 calls to ~15 hooks)
        try:
            getattr(hook, name)(daemon, *args)
        except Exception:
            log.exception("hook %s.%s failed", type(hook).__name__, name)


_overridden: dict[tuple[type, str], bool] = {}


def _overrides(cls: type, name: str) -> bool:
    """Whether ``cls`` has a callback ``name`` of its own (not :class:`Hook`'s no-op)."""
    key = (cls, name)
    got = _overridden.get(key)
    if got is None:
        got = _overridden[key] = getattr(cls, name, None) is not getattr(Hook, name, None)
    return got
