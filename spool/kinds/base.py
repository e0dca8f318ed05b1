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
  raising :class:`spool.core.errors.Failed` for a located failure or
  :class:`spool.core.errors.Interrupted` when the daemon stops;
* **check** (the validation gate): a report on a candidate; the same check
  recovery runs on a leftover candidate;
* **candidate**: where the evidence of an attempt lies, for recovery;
* **pool**: which resource pool an attempt draws from (``render`` is the
  ``max_active`` FFmpeg slots; a kind waiting on a remote service draws from
  its own allowance so that it never holds a render slot), the pools it
  declares (:meth:`Kind.pools`) and the gate in front of them (:meth:`Kind.gate`:
  how many of its jobs the daemon may claim now, and why not).

How an attempt runs is the kind's choice (:attr:`Kind.runner`):

* ``slot``: a daemon thread calls :meth:`Kind.produce`, which blocks until the
  candidate exists (FFmpeg);
* ``driven``: the daemon's driver (``spoold/driver.py``) calls :meth:`Kind.step`
  whenever the attempt is due; each step does a little work and says when to
  come back (:class:`Next`), or hands over a long :meth:`Kind.transfer`; so a
  thousand attempts waiting on a remote service hold no thread. Endings are
  exceptions, as for ``produce``; :meth:`Kind.abandon` records the kind's own
  side of an ending first, and :meth:`Kind.audit` may look on afterwards.

Everything after the candidate (store, manifest, ``complete/``) is the one
publish path of :mod:`spool.queue.publish`, the same for every kind.
"""

from __future__ import annotations

import abc
import hashlib
import threading
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Literal, TypeVar

from spool.core.errors import InvalidInput
from spool.core.model import JobBase, ValidationReport, canonical_json
from spool.core.sourceref import refs
from spool.kinds import pools

if TYPE_CHECKING:
    from spool.core.config import Config
    from spool.core.families import Family
    from spool.core.submission import Submission
    from spool.disk.tree import Tree
    from spool.queue.attempt import Attempt
    from spool.queue.context import Context

J = TypeVar("J", bound=JobBase)

#: The pool FFmpeg work draws from; its size is ``[limits] max_active``.
RENDER_POOL = pools.RENDER


@dataclass(frozen=True)
class SelfCheck:
    """How a kind's start self-check went on this host (:meth:`Kind.self_check`)."""

    ok: bool
    step: str  # the first step that failed ("" when ok)
    detail: str  # why, in the tool's own last words
    seconds: float
    cached: bool = False  # a recent pass for the same tools was trusted


@dataclass(frozen=True)
class Produced:
    """A candidate output made by an attempt, and how long making it took."""

    path: Path
    seconds: float


@dataclass(frozen=True)
class Next:
    """What a driven attempt needs next from the driver: a step at ``at`` (epoch
    seconds), a transfer now, or the one publish path for ``produced``."""

    action: Literal["wait", "transfer", "publish"]
    at: float = 0.0
    produced: Produced | None = None


@dataclass(frozen=True)
class Gate:
    """How many more jobs of a pool the daemon may claim now (``room``: ``None`` is no
    limit but the pool's own); when none, until when and why (for ``spool status``)."""

    room: int | None = None
    until: float | None = None
    reason: str = ""


class Abort:
    """A way to stop a transfer from another thread within a second.

    The transfer binds a closer (a socket's shutdown) while it blocks; :meth:`trip`
    records why and calls it, so a read waiting on a silent server returns at once.
    """

    def __init__(self) -> None:
        self.reason: str | None = None
        self._closer: Callable[[], None] | None = None
        self._lock = threading.Lock()
        self._tripped = threading.Event()

    def trip(self, reason: str) -> None:
        with self._lock:
            if self.reason is None:
                self.reason = reason
            closer = self._closer
        self._tripped.set()
        _call(closer)

    def bind(self, closer: Callable[[], None] | None) -> None:
        with self._lock:
            self._closer = closer
            tripped = self.reason is not None
        if tripped:
            _call(closer)

    def wait(self, seconds: float) -> bool:
        """Sleep up to ``seconds``; ``True`` at once if tripped."""
        return self._tripped.wait(max(0.0, seconds))


def _call(closer: Callable[[], None] | None) -> None:
    if closer is not None:
        try:
            closer()
        except OSError:
            pass  # already closed


class Kind(abc.ABC, Generic[J]):
    """One kind of job. Subclasses set :attr:`name` and :attr:`job_type`."""

    #: The submission's ``"operation"`` and the job file's tag.
    name: ClassVar[str]
    #: The frozen job's record type (a tagged subclass of :class:`JobBase`).
    job_type: type[J]
    #: Whether poster frames of its outputs make sense (not for a text file).
    poster_frames: ClassVar[bool] = True
    #: How its attempts run: a slot thread calling :meth:`produce`, or the daemon's
    #: driver calling :meth:`step` (see the module docstring).
    runner: ClassVar[Literal["slot", "driven"]] = "slot"
    #: The submission field that holds this kind's own part, and the type it is decoded
    #: as (:func:`spool.core.submission.for_kind`); ``None``: the kind takes none.
    spec_field: ClassVar[str | None] = None
    spec_type: ClassVar[Any] = None

    def pool(self, data: bytes) -> str:
        """The resource pool an attempt of a job of this kind draws from.

        Given the job file's raw bytes, because the daemon decides before it
        claims, from the pending index, which decodes only what ordering needs;
        a kind whose pool depends on the job (a provider per generation) reads
        just that field.
        """
        return RENDER_POOL

    def pools(self, cfg: Config) -> dict[str, int]:
        """The pools this kind's jobs draw from, with their sizes."""
        return {RENDER_POOL: cfg.limits.max_active}

    def owns_pool(self, pool: str) -> bool:
        """Whether ``pool`` is one of this kind's own (it decides the pool's gate and runner)."""
        return pool == RENDER_POOL

    def gate(self, ctx: Context, pool: str, held: Collection[str]) -> Gate:
        """How many more of the pool's jobs the daemon may claim now; ``held`` are the job
        IDs of the pool this daemon holds. By default: no limit but the pool's size."""
        return Gate()

    @abc.abstractmethod
    def freeze(self, tree: Tree, cfg: Config, sub: Submission, common: dict[str, Any]) -> J:
        """Check the kind-specific part of a submission against the world and
        freeze it; ``common`` holds the fields every job has (ID, tags, ...).
        Raises :class:`spool.core.errors.InvalidInput` naming the field."""

    @abc.abstractmethod
    def spec(self, job: J) -> object:
        """The part of the job whose hash is ``recipe_hash``."""

    def spec_hash(self, job: J) -> str:
        """sha256 of the spec; a job with sources from other jobs hashes each upstream's
        pinned job and store object with it (SPEC 11.12), so a frozen dependent's hash
        names the exact bytes it renders from."""
        spec = self.spec(job)
        if job.upstreams:
            spec = {"spec": spec, "upstreams": [[u.role, u.ref, u.job, u.sha256] for u in job.upstreams]}
        return hashlib.sha256(canonical_json(spec)).hexdigest()

    def waiting(
        self, tree: Tree, cfg: Config, sub: Submission, common: dict[str, Any], upstream: set[str]
    ) -> J:
        """A job whose sources ``upstream`` (roles) come from other jobs not yet published:
        check what can be checked without their media, and return the job as it waits in
        ``waiting/`` (:mod:`spool.queue.depends`). By default a kind takes no such source."""
        role = sorted(upstream)[0]
        raise InvalidInput(f"sources.{role}", f"a {self.name} job cannot take a source from another job")

    def upstream_refs(self, tree: Tree, cfg: Config, sub: Submission) -> dict[str, Any]:
        """The sources of a submission that name other jobs, by role (``spool.queue.depends.SourceRef``)."""
        return dict(refs(sub.sources))

    def resolve(self, tree: Tree, cfg: Config, waiting: J, sub: Submission, common: dict[str, Any]) -> J:
        """Freeze a waiting job once its upstreams published: ``sub`` is its submission with
        each upstream source the upstream's store object. By default, :meth:`freeze` again."""
        return self.freeze(tree, cfg, sub, common)

    def produce(self, ctx: Context, job: J, attempt: Attempt) -> Produced:
        """Make the candidate inside ``attempt.work`` (a ``slot`` kind)."""
        raise NotImplementedError(f"{self.name} is a {self.runner} kind: the driver steps it")

    # -- a driven kind (runner = "driven") ------------------------------------------------
    def step(self, ctx: Context, job: J, attempt: Attempt) -> Next:
        """Take the attempt's next step; raise as :meth:`produce` does to end it."""
        raise NotImplementedError(f"{self.name} is a {self.runner} kind: a slot thread produces it")

    def transfer(self, ctx: Context, job: J, attempt: Attempt, abort: Abort) -> Next:
        """The long part a step handed over (``Next("transfer")``), on a transfer thread;
        ``abort`` is tripped when the attempt must stop (a cancel, the daemon stopping)."""
        raise NotImplementedError(f"{self.name} has no transfers")

    def abandon(self, ctx: Context, job: J, attempt: Attempt, exc: BaseException) -> float | None:
        """The attempt ends with ``exc`` (before the failure record): record the kind's own
        side. Returns when to :meth:`audit` it (``None``: never)."""
        return None

    def audit(self, ctx: Context, job_id: str, attempt: int) -> float | None:
        """Look at an ended attempt once more (a remote result arriving late is recorded,
        never used); returns when to look again (``None``: done)."""
        return None

    def revision(self, job: J, spec: Any, sources: dict[str, str]) -> dict[str, Any]:
        """The kind's fields of a submission for a new revision of ``job`` with ``spec`` (the
        new spec as ``spool revise --spec`` reads it) and ``sources`` (roles added or replaced).
        Acceptance checks the result like any submission."""
        raise InvalidInput("--spec", f"a {self.name} job has no spec to revise")

    def retry_cost(self, tree: Tree, job: J) -> str | None:
        """What an operator's retry would spend beyond compute (a paid create at a
        provider), in words, or ``None``."""
        return None

    def metric_families(self, worker: str) -> list[Family]:
        """The kind's own counters for the daemon's metrics file (none by default)."""
        return []

    def self_check(self, cfg: Config) -> SelfCheck | None:
        """Before a daemon claims anything: can this host do the kind's work at all (a tiny
        piece of it, run for real)? A failure quarantines the host (spool.queue.health);
        ``None``: the kind has nothing to check."""
        return None

    def close(self) -> None:
        """Release what the kind holds open (connections) when the daemon stops."""

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
