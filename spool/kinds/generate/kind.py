"""The ``generate`` kind: a clip from a hosted video model, published like a render.

A generation job names a ``[providers.<name>]`` table, a model and the input
passed to it verbatim (SPEC section 8). It is a *driven* kind: its attempt is
not one blocking call but steps the daemon's driver takes whenever the attempt
is due (:meth:`Generate.step`), so a waiting generation holds no thread and no
render slot. Every step is the workflow's (:mod:`.workflow`), performed by the
one :class:`~.runner.Runner` of the process; the download runs on a transfer
thread (:meth:`Generate.transfer`) and its candidate goes through the one
publish path every kind shares.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import msgspec

from spool.core.decoding import convert
from spool.core.errors import InvalidInput
from spool.core.families import Family
from spool.core.faults import crashpoint
from spool.core.model import AttemptRecord, Output, ValidationReport
from spool.disk.records import read
from spool.disk.store import sha256_file
from spool.kinds.base import Abort, Gate, Kind, Next
from spool.kinds.generate import states
from spool.kinds.generate.providers.config import pool_capacities, pool_name
from spool.kinds.generate.runner import Runner
from spool.kinds.generate.spec import GenerateJob, GenerateSpec
from spool.media.validate import validate

if TYPE_CHECKING:
    from spool.core.config import Config
    from spool.disk.tree import Tree
    from spool.queue.accept import Submission
    from spool.queue.attempt import Attempt
    from spool.queue.context import Context

POOL_PREFIX = pool_name("")


class _Peek(msgspec.Struct):
    provider: str = ""


class _PeekJob(msgspec.Struct):
    generate: _Peek = msgspec.field(default_factory=_Peek)


_peek = msgspec.json.Decoder(_PeekJob)


class Generate(Kind[GenerateJob]):
    name = "generate"
    #: A generation's request (provider, model, input; SPEC section 8), checked by freeze.
    spec_field = "generate"
    spec_type = dict[str, Any]
    job_type = GenerateJob
    runner: ClassVar[Literal["slot", "driven"]] = "driven"

    def __init__(self) -> None:
        self.run = Runner()

    # -- pools -------------------------------------------------------------------------------
    def pool(self, data: bytes) -> str:
        try:
            return pool_name(_peek.decode(data).generate.provider)
        except (msgspec.DecodeError, msgspec.ValidationError):
            return pool_name("")  # no such pool: never claimed; claiming judges the file anyway

    def pools(self, cfg: Config) -> dict[str, int]:
        return pool_capacities(cfg.provider_configs.values())

    def owns_pool(self, pool: str) -> bool:
        return pool.startswith(POOL_PREFIX)

    def gate(self, ctx: Context, pool: str, held: Collection[str]) -> Gate:
        return self.run.gate(ctx, pool.removeprefix(POOL_PREFIX), set(held))

    # -- acceptance ----------------------------------------------------------------------------
    def freeze(self, tree: Tree, cfg: Config, sub: Submission, common: dict[str, Any]) -> GenerateJob:
        if sub.spec is None:
            raise InvalidInput("generate", "is required but missing (provider, model and input)")
        # The submission carries it untyped (acceptance knows no kind's spec); the kind
        # checks it here, every problem named by its field (generate.model, ...).
        spec = convert(sub.spec, GenerateSpec, prefix="generate")
        if sub.sources:
            raise InvalidInput("sources", "a generate job takes none; remove it")
        known = cfg.provider_configs
        if spec.provider not in known:
            have = ", ".join(sorted(known)) or "none"
            raise InvalidInput(
                "generate.provider",
                f"names no [providers.{spec.provider}] table in spool.toml (configured: {have})",
            )
        out_file = sub.output.file or f"{sub.name}.mp4"
        if not out_file.endswith(".mp4"):
            raise InvalidInput("output.file", "must end with .mp4: a generated clip is published as MP4")
        stated = sub.output.expect
        # Only what the submitter states is checked, plus one decodable video stream.
        expect = msgspec.structs.replace(
            stated, video_streams=1 if stated.video_streams is None else stated.video_streams
        )
        job = GenerateJob(
            **common,
            generate=spec,
            recipe_hash="",
            sources=[],
            output=Output(file=out_file, container="mp4", expect=expect, stated=stated),
        )
        job.recipe_hash = self.spec_hash(job)
        return job

    def spec(self, job: GenerateJob) -> object:
        return job.generate

    def check(self, cfg: Config, job: GenerateJob, candidate: Path, log: Path) -> ValidationReport:
        return validate(candidate, job.output.container, job.output.expect, cfg, log)

    # -- the driven runner's entry points ------------------------------------------------------
    def step(self, ctx: Context, job: GenerateJob, attempt: Attempt) -> Next:
        return self.run.step(ctx, job, attempt)

    def transfer(self, ctx: Context, job: GenerateJob, attempt: Attempt, abort: Abort) -> Next:
        return self.run.transfer(ctx, job, attempt, abort)

    def abandon(self, ctx: Context, job: GenerateJob, attempt: Attempt, exc: BaseException) -> float | None:
        return self.run.abandon(ctx, job, attempt, exc)

    def audit(self, ctx: Context, job_id: str, attempt: int) -> float | None:
        return self.run.audit(ctx, job_id, attempt)

    def close(self) -> None:
        self.run.close()

    def metric_families(self, worker: str) -> list[Family]:
        """Per provider: polls, creates, 429s, bytes, checksum failures and errors this process
        saw; and the compare-and-set conflicts of the attempts' states."""
        counts = {}
        for name, c in self.run.counters().items():
            errors = {k.removeprefix("error."): n for k, n in c.items() if k.startswith("error.")}
            counts[name] = {
                "polls": c.get("call.get", 0),
                "creates": c.get("call.create", 0),
                "rate_limited": errors.get("rate_limited", 0),
                "bytes": c.get("bytes", 0),
                "checksum": errors.get("checksum", 0),
                "errors": sum(errors.values()),
            }
        return generation_families(worker, counts, states.conflicts())

    def stages(
        self, ctx: Context, job: GenerateJob, attempt: Attempt, candidate: Path
    ) -> Callable[[str], None] | None:
        """The publish path's callback: record ``stored`` then ``indexed`` (each once)."""
        gen = states.gen_dir(attempt.dir)

        def stage(name: str) -> None:
            frm: states.GenState = "retrieving" if name == "stored" else "stored"
            to: states.GenState = "stored" if name == "stored" else "indexed"
            fields: dict[str, Any] = {}
            if to == "stored":
                digest, size = sha256_file(candidate)
                fields = {"sha256": digest, "bytes_retrieved": size}
            try:
                states.transition(gen, to, ctx.worker, expect=frm, **fields)
            except states.Conflict:
                return  # recorded before a crash (or by a contender): once is enough
            ctx.journal.record(
                job.job_id, f"gen.{to}", from_=f"gen.{frm}", attempt=attempt.n,
                reason="the output is " + ("in the store" if to == "stored" else "findable"),
            )  # fmt: skip
            crashpoint(f"after_gen_{to}")

        return stage

    def resume(self, ctx: Context, job: GenerateJob, attempt_dir: Path) -> bool:
        """An attempt of this worker's in flight goes on in the driver, in the same attempt
        (never a second create). Another worker's is never written into: recovery sends
        the job back to pending, and the next attempt inherits its provider job."""
        view = states.read(states.gen_dir(attempt_dir))
        if view.state is None or view.state == "failed":
            return False
        rec = read(attempt_dir / "attempt.json", AttemptRecord)
        return rec is not None and rec.worker == ctx.worker

    def revision(self, job: GenerateJob, spec: Any, sources: dict[str, str]) -> dict[str, Any]:
        """A new prompt or parameters: ``spec`` is a ``generate`` table; what it leaves out
        (provider, model, input) carries over, and ``input`` replaces the old one whole."""
        if sources:
            raise InvalidInput("--source", "a generate job takes no sources")
        if not isinstance(spec, dict):
            raise InvalidInput("--spec", "must be a JSON object: the generate table (provider, model, input)")
        merged = {**msgspec.to_builtins(job.generate), **spec}
        return {"generate": merged, "output_file": job.output.file}

    # -- what an operator's retry costs -----------------------------------------------------
    def retry_cost(self, tree: Tree, job: GenerateJob) -> str | None:
        """A retry sends a new create request (it may cost) unless the last attempt kept a
        paid result (then the retry downloads it again) or left a provider job in flight."""
        found = states.last_begun(tree, job.job_id)
        if found is not None:
            view = found[1]
            rec = view.record
            if rec is not None and rec.provider_job_id and (view.state != "failed" or rec.result == "kept"):
                return None
        return f"a new create request at provider {job.generate.provider!r} (it may cost)"


KIND = Generate()


#: The generation driver's counters: (family, help, key in its counts).
COUNTERS = (
    ("spool_generation_polls_total", "Status requests (polls) this worker sent.", "polls"),
    ("spool_generation_creates_total", "Create requests (each may cost) this worker sent.", "creates"),
    ("spool_generation_rate_limited_total", "HTTP 429 answers this worker got.", "rate_limited"),
    ("spool_generation_retrieved_bytes_total", "Bytes of generated output downloaded and verified.", "bytes"),
    ("spool_generation_checksum_failures_total", "Downloads whose sha-256 did not match.", "checksum"),
    ("spool_generation_provider_errors_total", "Provider errors of any kind (429s included).", "errors"),
)


def generation_families(
    worker: str, by_provider: dict[str, dict[str, int]], cas_conflicts: int
) -> list[Family]:
    """The generate kind's counters, per provider, and its compare-and-set conflicts."""
    fams = []
    for name, help_, key in COUNTERS:
        fam = Family(name, "counter", help_)
        for provider, counts in sorted(by_provider.items()):
            fam.add(counts.get(key, 0), worker=worker, provider=provider)
        fams.append(fam)
    cas = Family(
        "spool_generation_cas_conflicts_total",
        "counter",
        "Generation state transitions this worker lost to another contender (compare-and-set conflicts).",
    )
    cas.add(cas_conflicts, worker=worker)
    return [*fams, cas]
