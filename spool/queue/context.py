"""What one worker needs to run and recover jobs: where, with which limits, as whom."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Literal

from spool.core.config import Config
from spool.disk.tree import Tree
from spool.queue.events import Journal


@dataclass
class Context:
    """A worker's view of its spool, shared by execute, publish and recover."""

    tree: Tree
    cfg: Config
    worker: str
    journal: Journal
    #: Set to interrupt running work now (graceful stop after the grace period).
    stop: threading.Event
    #: The publish *strategy* for validated outputs: ``link`` (falling back to a
    #: copy where a link fails) or ``copy`` (copy, fsync, re-hash); the daemon
    #: sets it from ``spool doctor``'s probes.
    publish_by: Literal["link", "copy"] = "link"
    #: Whether this worker carries on a driven kind's attempt in flight after a restart
    #: (a daemon, whose driver takes it); the CLI's recovery sends such jobs back to pending.
    resumes_driven: bool = False
