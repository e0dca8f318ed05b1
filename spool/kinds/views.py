"""What a kind adds to the overview, the metrics and ``spool fsck``, found without loading
the kinds.

A kind whose running jobs have more to say than a render's progress (the generate kind:
each attempt's state at the provider, its age, the silent ones) puts a ``watch`` module in
its folder with three functions:

* ``status(tree, running, cfg) -> Status | None``: fields for ``spool status --json`` (and
  the page), the step each of its running jobs is at, and items for "Needs attention";
  ``running`` are the overview's rows (``job_id``, ``attempt``); ``None`` when none of
  them is the kind's;
* ``families(worker, tree, running, mine) -> list[Family]``: its Prometheus gauges, present
  with zeros when none runs (``running``: the IDs of the running jobs; ``mine``: those this
  process runs, whose state a kind keeps in memory: none of them is read from its files);
* ``left_behind(tree, job_id) -> list[(path, why)]``: attempts of an ended job the kind
  still owes a look (``spool fsck``, invariant 10).

The observers ask every such module through this one, so none of them names a kind; a
``watch`` module is light (no provider client, no FFmpeg), so ``spool status`` stays
cheap: the kinds' machinery (:mod:`spool.kinds.registry`) is never loaded here.
"""

from __future__ import annotations

import functools
import importlib
import pkgutil
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from spool.core.families import Family
from spool.disk.tree import Tree

if TYPE_CHECKING:
    from spool.core.config import Config


@dataclass
class Status:
    """One kind's part of the overview."""

    #: Top-level fields of ``spool status --json`` (present only while they say something).
    fields: dict[str, Any] = field(default_factory=dict)
    #: job ID -> what the job is doing (shown where a render shows its progress).
    steps: dict[str, str] = field(default_factory=dict)
    #: "Needs attention" items: ``kind``, ``subject``, ``problem``, ``next_action``.
    attention: list[dict[str, Any]] = field(default_factory=list)


@functools.cache
def watches() -> tuple[ModuleType, ...]:
    """Every kind folder's ``watch`` module, by folder name."""
    here = Path(__file__).parent
    found = []
    for info in sorted(pkgutil.iter_modules([str(here)]), key=lambda i: i.name):
        if info.ispkg and (here / info.name / "watch.py").is_file():
            found.append(importlib.import_module(f"{__package__}.{info.name}.watch"))
    return tuple(found)


def status(tree: Tree, running: list[dict[str, Any]], cfg: Config | None) -> list[Status]:
    """Each kind's part of the overview (none for a kind with nothing running)."""
    if not any(row.get("attempt") is not None for row in running):
        return []  # nothing has begun an attempt: no kind has anything to add
    return [s for w in watches() if (s := w.status(tree, running, cfg)) is not None]


def families(worker: str, tree: Tree, running: list[str], mine: frozenset[str] = frozenset()) -> list[Family]:
    """Every kind's gauges (``mine``: the running jobs this process runs)."""
    return [f for w in watches() for f in w.families(worker, tree, running, mine)]


def left_behind(tree: Tree, job_id: str) -> list[tuple[Path, str]]:
    """Every kind's attempts of an ended job that still need a look."""
    return [found for w in watches() for found in w.left_behind(tree, job_id)]
