"""The contract of a job kind: everything spool does that depends on what a job *is*.

A kind is one object registered in :data:`spool.kinds.KINDS` under the name
submissions give as ``"operation"``. Acceptance, execution, recovery, claiming
and the daemon's slot filling ask the job's kind and never branch on the name
(Flamenco's job-type map; huey's smallest storage shows the whole contract,
and :mod:`spool.kinds.noop` is ours).

A kind owns:

* **freeze** (acceptance): turn a checked submission into the frozen job file,
  with whatever it probes and hashes;
* **spec_hash**: the hash of its spec, stored as ``recipe_hash`` and checked
  again at claim, so an edited job file is never run;
* **produce** (execution): make a candidate inside the attempt's ``work/``,
  raising :class:`spool.errors.Failed` for a located failure or
  :class:`spool.errors.Interrupted` when the daemon stops;
* **check** (the validation gate): a report on a candidate; the same check
  recovery runs on a leftover candidate;
* **candidate**: where the evidence of an attempt lies, for recovery;
* **pool**: which resource pool an attempt draws from (``render`` is the
  ``max_active`` FFmpeg slots; a kind waiting on a remote service would draw
  from its own allowance so that it never holds a render slot).

Everything after the candidate (store, manifest, ``complete/``) is the one
publish path of :mod:`spool.publish`, the same for every kind.
"""

from __future__ import annotations

import abc
import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar

from .. import pools
from ..model import JobBase, ValidationReport, canonical_json

if TYPE_CHECKING:
    from ..accept import Submission
    from ..attempt import Attempt
    from ..config import Config
    from ..context import Context
    from ..tree import Tree

J = TypeVar("J", bound=JobBase)

#: The pool FFmpeg work draws from; its size is ``[limits] max_active``.
RENDER_POOL = pools.RENDER


@dataclass(frozen=True)
class Produced:
    """A candidate output made by an attempt, and how long making it took."""

    path: Path
    seconds: float


class Kind(abc.ABC, Generic[J]):
    """One kind of job. Subclasses set :attr:`name` and :attr:`job_type`."""

    #: The submission's ``"operation"`` and the job file's tag.
    name: ClassVar[str]
    #: The frozen job's record type (a tagged subclass of :class:`JobBase`).
    job_type: type[J]
    #: Whether poster frames of its outputs make sense (not for a text file).
    poster_frames: ClassVar[bool] = True
    #: Whether the daemon drives its attempts step by step (a generation waiting on a
    #: provider) instead of giving each one a slot thread that calls :meth:`produce`.
    driven: ClassVar[bool] = False

    def pool(self, data: bytes) -> str:
        """The resource pool an attempt of a job of this kind draws from.

        Given the job file's raw bytes, because the daemon decides before it
        claims, from the pending index, which decodes only what ordering needs;
        a kind whose pool depends on the job (a provider per generation) reads
        just that field.
        """
        return RENDER_POOL

    @abc.abstractmethod
    def freeze(self, tree: Tree, cfg: Config, sub: Submission, common: dict[str, Any]) -> J:
        """Check the kind-specific part of a submission against the world and
        freeze it; ``common`` holds the fields every job has (ID, tags, ...).
        Raises :class:`spool.errors.InvalidInput` naming the field."""

    @abc.abstractmethod
    def spec(self, job: J) -> object:
        """The part of the job whose hash is ``recipe_hash``."""

    def spec_hash(self, job: J) -> str:
        return hashlib.sha256(canonical_json(self.spec(job))).hexdigest()

    @abc.abstractmethod
    def produce(self, ctx: Context, job: J, attempt: Attempt) -> Produced:
        """Make the candidate inside ``attempt.work``."""

    @abc.abstractmethod
    def check(self, cfg: Config, job: J, candidate: Path, log: Path) -> ValidationReport:
        """The validation gate for this kind's output; ``log`` takes the details."""

    def stages(self, ctx: Context, job: J, attempt: Attempt, candidate: Path) -> Callable[[str], None] | None:
        """The publish path's ``on_stage`` for this kind (``None``: it keeps no states of its own)."""
        return None

    def resume(self, ctx: Context, job: J, attempt_dir: Path) -> bool:
        """Recovery asks first: ``True`` when the kind took over the attempt in flight
        itself (a generation keeps polling its provider job); ``False`` leaves the
        decision to the evidence (manifest, records, candidate)."""
        return False

    def candidate(self, job: J, attempt_dir: Path) -> Path:
        """Where an attempt leaves its candidate (recovery looks there)."""
        return attempt_dir / "work" / job.output.file
