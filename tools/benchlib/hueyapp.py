"""The huey application the benchmark's consumer runs (``huey_consumer benchlib.hueyapp.huey``).

SqliteHuey in WAL mode with ``fsync=True`` (``pragma synchronous=FULL``): every
enqueue, dequeue and result is a committed, fsynced transaction, the durable
configuration to compare with spool. The database path comes from
``BENCH_HUEY_DB`` so every run gets a fresh file; the harness's producer calls
:func:`make` with the same path and enqueues through an identical task.
"""

from __future__ import annotations

import os
import time
from typing import Any

from huey import SqliteHuey


def _noop(i: int) -> float:
    """No work; the stored result is the time the task ran (for the run's window)."""
    return time.time()


def make(path: str) -> tuple[SqliteHuey, Any]:
    """A SqliteHuey on ``path`` and its ``benchlib.hueyapp.noop`` task."""
    h = SqliteHuey("bench", filename=path, fsync=True)
    return h, h.task(name="noop")(_noop)


#: The consumer's application (the harness's own process builds its own with make()).
huey, noop = make(os.environ["BENCH_HUEY_DB"]) if "BENCH_HUEY_DB" in os.environ else (None, None)
