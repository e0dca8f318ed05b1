"""Resource pools: what an attempt holds while it runs, per kind of work.

A render holds one of the ``[limits] max_active`` FFmpeg slots (CPU and disk
bound). Work that waits on something else (a hosted model generating a clip)
draws from an allowance of its own, so a waiting job never holds a render
slot and a full render queue never starves it. Each kind names the pool of
its attempts (:meth:`spool.kinds.base.Kind.pool`); the daemon fills every pool
to its capacity, best job first, and reports each pool in its heartbeat.
"""

from __future__ import annotations

from spool.core.model import PoolUse

#: The pool of FFmpeg work (sized by ``[limits] max_active``).
RENDER = "render"


class Pools:
    """Which running job holds which pool; one per daemon (main thread only)."""

    def __init__(self, capacity: dict[str, int]) -> None:
        self.capacity = dict(capacity)
        self._holder: dict[str, str] = {}  # job ID -> pool
        self._active: dict[str, int] = dict.fromkeys(self.capacity, 0)

    def has_room(self, pool: str) -> bool:
        """Whether one more attempt may draw from ``pool`` (an unknown pool has none)."""
        return self._active.get(pool, 0) < self.capacity.get(pool, 0)

    def full(self) -> bool:
        """No pool has room: nothing more can be claimed now."""
        return all(not self.has_room(p) for p in self.capacity)

    def take(self, job_id: str, pool: str) -> None:
        self._holder[job_id] = pool
        self._active[pool] = self._active.get(pool, 0) + 1

    def give_back(self, job_id: str) -> None:
        pool = self._holder.pop(job_id, None)
        if pool is not None:
            self._active[pool] -= 1

    def active(self, pool: str) -> int:
        return self._active.get(pool, 0)

    def holders(self, pool: str) -> set[str]:
        """The job IDs holding ``pool`` now."""
        return {j for j, p in self._holder.items() if p == pool}

    def usage(self) -> dict[str, PoolUse]:
        """For the heartbeat, status and metrics."""
        return {
            p: PoolUse(capacity=c, active=self._active.get(p, 0)) for p, c in sorted(self.capacity.items())
        }
