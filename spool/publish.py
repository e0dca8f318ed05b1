"""The one publish path: validated candidate -> store -> manifest -> ``complete/``.

Execution, recovery and fsck all come here, so there is one order of writes
and one rule for an existing manifest. Each step is durable before the next:

1. fence: the job file is still in ``running/<me>/``;
2. link the validated file into the store (idempotent, content-addressed);
3. ``result.json`` in the attempt: the manifest as this attempt stages it;
   The manifest keeps the gate's measurement of the file (``validation.media``);
   a kind whose check did not record one has the stored file measured here;
4. fence again, then ``manifests/J.json`` by :func:`install_manifest`;
4b. the library index entries (:mod:`spool.index`), so a complete job is
   always found by its tags;
5. fence and commit: ``rename(running/<me>/J.json, complete/J.json)``. The
   rename fails for a worker whose job was taken away, so a non-owner can
   never complete a job.

So ``complete/J.json`` always has its manifest, a manifest always names a
store file that exists and matches, and a crash between steps leaves a
running job whose attempt holds the evidence recovery needs.

The manifest rule (:func:`install_manifest`), the same for every caller: a
manifest is written once. An existing one that verifies and names the same
recipe is the job's selected output and stays (the caller adopts it: a later
result never replaces it). An existing one that is unreadable, names a store
file that is missing or changed, or names another recipe is not an output of
this job at all, and the caller's verified manifest replaces it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import msgspec

from . import index, store
from .attempt import Attempt, write_result
from .context import Context
from .errors import Failed, LostOwnership
from .faults import crashpoint
from .model import AttemptRecord, JobBase, Manifest, SourceDigest, ValidationReport, encode, now
from .records import read
from .tree import Tree, transfer, write_atomic
from .validate import CONTAINER_FORMATS, measure

log = logging.getLogger("spool.publish")


def fence(ctx: Context, job_id: str, step: str) -> None:
    """Stop unless the job file is still in this worker's running folder."""
    if not ctx.tree.job_file("running", job_id, ctx.worker).exists():
        raise LostOwnership(f"{job_id} is no longer in running/{ctx.worker}/ before {step}")


def publish(
    ctx: Context,
    job: JobBase,
    attempt: Attempt,
    candidate: Path,
    report: ValidationReport,
    render_seconds: float,
    note: str = "",
    why: str = "",
    on_stage: Callable[[str], None] | None = None,
) -> Manifest:
    """Steps 1-5 for a validated candidate; ``why`` prefixes the journal line
    (recovery says so). Raises :class:`Failed` (store) or :class:`LostOwnership`.

    ``on_stage`` is told ``"stored"`` once the store file and manifest are durable,
    and ``"indexed"`` once the job is findable, just before the move to
    ``complete/``: a kind that keeps its own durable states (generation) records
    them there."""
    tree = ctx.tree
    fence(ctx, job.job_id, "store link")
    try:
        ext = Path(job.output.file).suffix
        stored = store.put(tree, candidate, ext, prefer_link=ctx.publish_by == "link")
    except OSError as exc:
        raise Failed(
            "publish",
            "store",
            f"the output could not be stored ({exc.strerror or exc})",
            next_action="Free space or fix permissions on the spool's store/.",
            retryable=True,
        ) from None
    crashpoint("after_store_link")
    if report.media is None and job.output.container in CONTAINER_FORMATS:
        # Every kind's media version carries the gate's measurement (SPEC 9, issue 22): a
        # check that did not record it has the verified object measured here, once.
        media = measure(stored.path, job.output.container, ctx.cfg, attempt.dir / "validate.log")
        report = msgspec.structs.replace(report, media=media)
    rec = read(attempt.dir / "attempt.json", AttemptRecord)
    manifest = Manifest(
        job_id=job.job_id,
        attempt=attempt.n,
        recipe_hash=job.recipe_hash,
        output=store.published_file(tree, stored, job.output.file, job.output.container),
        sources=[SourceDigest(role=s.role, sha256=s.sha256) for s in job.sources],
        validation=report,
        tags=job.tags,
        worker=ctx.worker,
        claimed_at=rec.claimed_at if rec else now(),
        render_seconds=render_seconds,
        validate_seconds=report.seconds,
        published_at=now(),
        note=note,
    )
    write_result(attempt, manifest)
    crashpoint("after_result")
    fence(ctx, job.job_id, "manifest")
    manifest = install_manifest(tree, manifest)
    crashpoint("after_manifest")
    if on_stage is not None:
        on_stage("stored")
    index.index_job(tree, manifest, ctx.cfg.acceptance.required_tags)  # the library (SPEC 9)
    crashpoint("after_index")
    if on_stage is not None:
        on_stage("indexed")
    fence(ctx, job.job_id, "complete")
    crashpoint("before_complete_rename")
    complete(ctx, job.job_id)
    ctx.journal.record(
        job.job_id,
        "complete",
        from_="running",
        attempt=attempt.n,
        reason=why + f"published sha256:{manifest.output.sha256[:16]}" + (f" ({note})" if note else ""),
        bytes=manifest.output.size,
        render_seconds=manifest.render_seconds,
        validate_seconds=manifest.validate_seconds,
    )
    log.info("%s: complete, sha256 %s", job.job_id, manifest.output.sha256)
    return manifest


def install_manifest(tree: Tree, manifest: Manifest) -> Manifest:
    """Write ``manifests/J.json`` by the rule of the module docstring; returns the
    manifest that names the job's output now (``manifest``, or the one adopted).

    ``manifest`` must name a store file the caller has verified.
    """
    path = tree.manifest_file(manifest.job_id)
    try:
        write_atomic(path, encode(manifest), mode=0o444, replace=False)
        return manifest
    except FileExistsError:
        pass
    existing = read(path, Manifest)
    if (
        existing is not None
        and existing.recipe_hash == manifest.recipe_hash
        and store.verify(tree, existing) is None
    ):
        return existing  # the job's selected output stays as it was
    why = "unreadable" if existing is None else store.verify(tree, existing) or "names another recipe"
    log.warning("%s: replacing manifests/%s.json (%s)", manifest.job_id, manifest.job_id, why)
    write_atomic(path, encode(manifest), mode=0o444)
    return manifest


def complete(ctx: Context, job_id: str) -> None:
    """The commit: move the owned job file to ``complete/``."""
    if not transfer(ctx.tree.job_file("running", job_id, ctx.worker), ctx.tree.job_file("complete", job_id)):
        raise LostOwnership(f"{job_id} was taken from running/{ctx.worker}/ before it could complete")
