"""The job kinds: one folder or module each, and the registry (:mod:`.registry`).

This package's ``__init__`` is light on purpose: ``spool.toml`` is read by every
command, and a kind's settings (the generate kind's ``[providers.<name>]``
tables) are parsed by modules inside the kind's folder, so importing a kind's
settings must not load every kind's machinery (FFmpeg command building, HTTP
clients). The registry's names are loaded on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from spool.kinds.adopt import AdoptJob
    from spool.kinds.base import RENDER_POOL, Kind, Produced
    from spool.kinds.generate.spec import GenerateJob
    from spool.kinds.noop import NoopJob
    from spool.kinds.registry import (
        KINDS,
        Job,
        capacities,
        decode_job,
        named,
        of,
        owner_of_pool,
        parse_submission,
    )
    from spool.kinds.render.kind import RenderJob

__all__ = [
    "KINDS",
    "RENDER_POOL",
    "AdoptJob",
    "GenerateJob",
    "Job",
    "Kind",
    "NoopJob",
    "Produced",
    "RenderJob",
    "capacities",
    "decode_job",
    "named",
    "of",
    "owner_of_pool",
    "parse_submission",
]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from spool.kinds import registry  # here: spool.toml is read without loading every kind (+~70 ms)

        value = getattr(registry, name)
        globals()[name] = value  # found directly from now on (this hook ran ~8 times a job)
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
