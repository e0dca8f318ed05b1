"""The registry of job kinds: ``operation`` -> the :class:`~spool.kinds.base.Kind` that runs it.

Adding a kind is one new module or folder in :mod:`spool.kinds`: its job record, a
``Kind`` subclass and ``KIND = ...`` (in a folder, in its ``kind`` module). The registry
finds it; nothing else in spool lists or branches on the kinds. ``noop`` is the
smallest example, ``still`` a small one that renders.
"""

from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path
from typing import TYPE_CHECKING, Any, Union

import msgspec

from spool.core.config import Config
from spool.core.decoding import convert
from spool.core.errors import InvalidInput
from spool.core.model import JobBase
from spool.core.submission import Submission, for_kind
from spool.kinds.adopt import AdoptJob
from spool.kinds.base import RENDER_POOL, Kind, Produced
from spool.kinds.generate.spec import GenerateJob
from spool.kinds.noop import NoopJob
from spool.kinds.render.kind import RenderJob

#: Modules of this package that are not kinds.
_NOT_KINDS = frozenset({"base", "registry"})


def _discover() -> list[Kind[Any]]:
    """Every kind in this package, by name: a module with a ``KIND``, or a folder whose
    ``kind`` module has one."""
    found: list[Kind[Any]] = []
    for info in pkgutil.iter_modules([str(Path(__file__).parent)]):
        if info.name in _NOT_KINDS or info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{__package__}.{info.name}{'.kind' if info.ispkg else ''}")
        kind = getattr(module, "KIND", None)
        if isinstance(kind, Kind):
            found.append(kind)
    return sorted(found, key=lambda k: k.name)


#: Every kind spool runs, by the name submissions use as ``"operation"``.
KINDS: dict[str, Kind[Any]] = {k.name: k for k in _discover()}

if TYPE_CHECKING:
    #: A job file of any kind (what type checkers see: every job's fields).
    Job = JobBase
else:
    #: A job file of any kind: a tagged union on ``"operation"`` of every kind's record.
    Job = Union[tuple(k.job_type for k in KINDS.values())]  # noqa: UP007 - built at run time

_decoder = msgspec.json.Decoder(Job)

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


def capacities(cfg: Config) -> dict[str, int]:
    """Every pool this spool's config sizes, by name, as each kind declares them (the
    render slots; one allowance per configured provider of the generate kind)."""
    out = {RENDER_POOL: cfg.limits.max_active}
    for kind in KINDS.values():
        out.update(kind.pools(cfg))
    return out


def parse_submission(raw: dict[str, Any], prefix: str = "") -> Submission:
    """A submission's JSON object -> its kind's submission type (every submission's fields
    and the kind's own one); each problem an :class:`InvalidInput` naming the field."""
    op = raw.get("operation", "render")
    if not isinstance(op, str):
        return convert(raw, Submission, prefix=prefix)  # refused, naming "operation"
    try:
        kind = named(op)
    except InvalidInput as exc:
        raise InvalidInput(f"{prefix}.operation" if prefix else "operation", exc.problem) from None
    return convert(raw, for_kind(kind.name, kind.spec_field, kind.spec_type), prefix=prefix)


def named(operation: str) -> Kind[Any]:
    """The kind a submission asks for, or a rejection naming the field."""
    try:
        return KINDS[operation]
    except KeyError:
        raise InvalidInput(
            "operation", f"must be one of {', '.join(sorted(KINDS))}, not {operation!r}"
        ) from None


def of(job: JobBase) -> Kind[Any]:
    """The kind of a frozen job."""
    return KINDS[job.operation]


def owner_of_pool(pool: str) -> Kind[Any]:
    """The kind whose pool this is: it decides the pool's gate and how its attempts run."""
    for kind in KINDS.values():
        if kind.owns_pool(pool):
            return kind
    return KINDS["render"]


def decode_job(data: bytes) -> Job:
    """A job file's bytes -> the job of its kind (raises msgspec errors)."""
    return _decoder.decode(data)
