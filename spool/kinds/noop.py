"""The ``noop`` kind: the smallest job there is, and so the best map of the contract.

It does no media work: its "render" writes a file holding the job ID, and its
gate checks exactly that. Benchmarks and tests use it to measure and torture
the queue itself (claims, moves, publish) without FFmpeg's time in the way.
Accepted only where ``[acceptance] allow_noop`` is on.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from spool.core.errors import InvalidInput
from spool.core.model import Check, Expect, JobBase, Output, ValidationReport
from spool.kinds.base import Kind, Produced

if TYPE_CHECKING:
    from spool.core.config import Config
    from spool.core.submission import Submission
    from spool.disk.tree import Tree
    from spool.queue.attempt import Attempt
    from spool.queue.context import Context


class NoopJob(JobBase, tag="noop"):
    """A noop job file: nothing beyond what every job has."""


class Noop(Kind[NoopJob]):
    name = "noop"
    job_type = NoopJob
    poster_frames = False

    def owns_pool(self, pool: str) -> bool:
        return False  # it borrows the render kind's slots

    def freeze(self, tree: Tree, cfg: Config, sub: Submission, common: dict[str, Any]) -> NoopJob:
        if not cfg.acceptance.allow_noop:
            raise InvalidInput(
                "operation", "noop jobs are for benchmarks and tests; set [acceptance] allow_noop = true"
            )
        if sub.sources:
            raise InvalidInput("sources", "a noop job takes none; remove it")
        job = NoopJob(
            **common,
            recipe_hash="",
            sources=[],
            output=Output(file=sub.output.file or f"{sub.name}.txt", container="txt", expect=Expect()),
        )
        job.recipe_hash = self.spec_hash(job)
        return job

    def spec(self, job: NoopJob) -> object:
        return None  # hashes as sha256(b"null"), as noop jobs always have

    def produce(self, ctx: Context, job: NoopJob, attempt: Attempt) -> Produced:
        out = attempt.work / job.output.file
        out.write_bytes(job.job_id.encode())
        return Produced(out, 0.0)

    def check(self, cfg: Config, job: NoopJob, candidate: Path, log: Path) -> ValidationReport:
        try:
            ok = candidate.read_bytes() == job.job_id.encode()
        except OSError:
            ok = False
        check = Check(name="noop", expected=job.job_id, actual="match" if ok else "mismatch", ok=ok)
        return ValidationReport(ok=ok, decode_check="none", checks=[check], seconds=0.0)


KIND = Noop()
