"""The one publish path: validated candidate -> store -> manifest -> ``complete/``.

Execution, recovery and fsck all come here, so there is one order of writes
and one rule for an existing manifest. Each step is durable before the next:

1. fence: the job file is still in ``running/<me>/``;
2. link the validated file into the store (idempotent, content-addressed);
3. the staged result in the attempt: the manifest as this attempt stages it,
   ``result.json`` (format 1: a copy, not fsynced; format 2: the manifest's own bytes,
   fsynced, which step 4 gives their second name).
   The manifest keeps the gate's measurement of the file (``validation.media``);
   a kind whose check did not record one has the stored file measured here;
4. fence again, then ``manifests/J.json`` by :func:`install_manifest`;
4b. the library index (:mod:`spool.library.index`), so a complete job is always found
   by its tags;
5. fence and commit: ``rename(running/<me>/J.json, complete/J.json)``. The
   rename fails for a worker whose job was taken away, so a non-owner can
   never complete a job.

So ``complete/J.json`` always has its manifest, a manifest always names a
store file that exists and matches, and a crash between steps leaves a
running job whose attempt holds the evidence recovery needs.

**Batches** (format 2, :mod:`spool.disk.formats`). The same steps for several jobs
that end close together, in two halves. :func:`prepare`, on the attempt's own
thread: steps 1-3, the object's bytes fsynced and linked into the store, the
manifest written and fsynced as the attempt's ``result.json`` (not yet in ``manifests/``).
:func:`commit`, once for the batch: every manifest linked into ``manifests/``, then
one index segment for them all (:mod:`spool.library.segments`, its bytes fsynced),
then the objects' store folders, ``manifests/`` and the segments' folder fsynced at once;
then every move to ``complete/`` and ``complete/`` fsynced once (the old names' removal
from ``running/<me>/`` is owed to the next folder fsync: :class:`spool.disk.groupcommit.Owed`);
then the journal lines. (The daemon claims its
next jobs just before, in a batch of their own, so they run while it commits.)
Each job is fenced on its own: one taken away meanwhile is
dropped from the batch, the others go on. A job's publish alone is a batch of
one (recovery, the CLI, a generation's driver).

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
from dataclasses import dataclass
from pathlib import Path

import msgspec

from spool.core.errors import Failed, LostOwnership
from spool.core.faults import crashpoint
from spool.core.model import AttemptRecord, JobBase, Manifest, SourceDigest, ValidationReport, encode, now
from spool.disk import formats, store
from spool.disk.groupcommit import together
from spool.disk.records import read
from spool.disk.tree import Prepared, Tree, fsync_dir, transfer
from spool.library import index
from spool.media.validate import CONTAINER_FORMATS, measure
from spool.queue.attempt import Attempt, write_result
from spool.queue.context import Context

log = logging.getLogger("spool.queue.publish")


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
    if formats.writing(ctx.tree.root) == 1:
        return _publish_v1(ctx, job, attempt, candidate, report, render_seconds, note, why, on_stage)
    ready = prepare(ctx, job, attempt, candidate, report, render_seconds, note, why, on_stage)
    [done] = commit(ctx, [ready])
    if isinstance(done, BaseException):
        raise done
    return done


def _stored(ctx: Context, job: JobBase, candidate: Path, *, folder_later: bool) -> store.Stored:
    fence(ctx, job.job_id, "store link")
    try:
        ext = Path(job.output.file).suffix
        return store.put(
            ctx.tree, candidate, ext, prefer_link=ctx.publish_by == "link", folder_later=folder_later
        )
    except OSError as exc:
        raise Failed(
            "publish",
            "store",
            f"the output could not be stored ({exc.strerror or exc})",
            next_action="Free space or fix permissions on the spool's store/.",
            retryable=True,
        ) from None


def _manifest(
    ctx: Context,
    job: JobBase,
    attempt: Attempt,
    stored: store.Stored,
    report: ValidationReport,
    render_seconds: float,
    note: str,
    rec: AttemptRecord | None,
) -> Manifest:
    if report.media is None and job.output.container in CONTAINER_FORMATS:
        # Every kind's media version carries the gate's measurement (SPEC 9, issue 22): a
        # check that did not record it has the verified object measured here, once.
        media = measure(stored.path, job.output.container, ctx.cfg, attempt.dir / "validate.log")
        report = msgspec.structs.replace(report, media=media)
    return Manifest(
        job_id=job.job_id,
        attempt=attempt.n,
        recipe_hash=job.recipe_hash,
        output=store.published_file(ctx.tree, stored, job.output.file, job.output.container),
        sources=[SourceDigest(role=s.role, sha256=s.sha256) for s in job.sources],
        validation=report,
        tags=job.tags,
        worker=ctx.worker,
        claimed_at=rec.claimed_at if rec else now(),
        render_seconds=render_seconds,
        validate_seconds=report.seconds,
        published_at=now(),
        note=note,
        host=rec.host if rec else "",
        pid=rec.pid if rec else 0,
        boot_id=rec.boot_id if rec else "",
    )


def _publish_v1(
    ctx: Context,
    job: JobBase,
    attempt: Attempt,
    candidate: Path,
    report: ValidationReport,
    render_seconds: float,
    note: str,
    why: str,
    on_stage: Callable[[str], None] | None,
) -> Manifest:
    """Format 1: one job, every step durable on its own before the next."""
    tree = ctx.tree
    stored = _stored(ctx, job, candidate, folder_later=False)
    crashpoint("after_store_link")
    rec = attempt.claim_record()
    manifest = _manifest(ctx, job, attempt, stored, report, render_seconds, note, rec)
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
    _told(ctx, job, attempt, manifest, note, why)
    return manifest


def _told(ctx: Context, job: JobBase, attempt: Attempt, manifest: Manifest, note: str, why: str) -> None:
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


# -- format 2: batches ---------------------------------------------------------------------


@dataclass
class Ready:
    """A job whose attempt is done and whose publish is prepared (:func:`prepare`):
    its object stored (bytes and name durable) and its manifest's bytes
    written durably in ``manifests/``, waiting for their name (unnamed, or under a
    hidden temp name where the filesystem has no unnamed files)."""

    job: JobBase
    attempt: Attempt
    manifest: Manifest
    prepared: Prepared
    note: str = ""
    why: str = ""
    on_stage: Callable[[str], None] | None = None

    @property
    def job_id(self) -> str:
        return self.job.job_id


def prepare(
    ctx: Context,
    job: JobBase,
    attempt: Attempt,
    candidate: Path,
    report: ValidationReport,
    render_seconds: float,
    note: str = "",
    why: str = "",
    on_stage: Callable[[str], None] | None = None,
) -> Ready:
    """The half of a batch's publish each job does alone (on its attempt's thread): steps
    1-3 and the manifest's bytes. Raises :class:`Failed` (store) or
    :class:`LostOwnership`."""
    stored = _stored(ctx, job, candidate, folder_later=True)
    # The object's name is made durable by the batch's commit, in its first round beside
    # manifests/ (an object found already stored, "existing", may be another thread's, not
    # yet fsynced: that fsync covers it too). Here it would be two more waits on the
    # attempt's thread, the journal's commit (which rides on a folder fsync) and the
    # folder's own, for the one wait it shares in the round.
    crashpoint("after_store_link")
    rec = attempt.claim_record()
    manifest = _manifest(ctx, job, attempt, stored, report, render_seconds, note, rec)
    # The staged result is the manifest's own first name: its bytes, fsynced, as the
    # attempt's result.json, linked into manifests/ by the commit (no second copy, and no
    # temp name to make and remove where there are no unnamed files: over a NAS that is
    # about ten round trips a job fewer than a temp manifest plus attempt.json rewritten).
    first = attempt.dir / "result.json"
    prepared = Prepared(ctx.tree.manifest_file(job.job_id), encode(manifest), mode=0o444, first_name=first)
    crashpoint("after_result")
    return Ready(job, attempt, manifest, prepared, note, why, on_stage)


def commit(ctx: Context, batch: list[Ready]) -> list[Manifest | BaseException]:
    """The half of a batch's publish done once for all (see the module docstring).

    Returns, per job in order, the manifest that names its output now, or the
    exception that ended it (:class:`LostOwnership` when it was taken away). An
    ``OSError`` of the batch itself is raised: its jobs stay in ``running/`` for
    recovery by evidence."""
    tree = ctx.tree
    out: dict[str, Manifest | BaseException] = {}
    try:
        # 2b. The objects' store folders, 4. the manifests named, then 4b. the batch's
        # segment, then all those folders at once, in one round. A line is named after its
        # manifest and a manifest after its object (a reader never sees a name before the
        # one it needs), but they become durable together: a cut may keep a line whose
        # manifest it took, or a manifest whose object's name it took. Neither is counted
        # by any reader (an entry counts only for a job whose manifest agrees, a manifest
        # only for a job in complete/, and no job moves before the round ends), and
        # recovery publishes the candidate again or runs the job again: the one manifest
        # rule replaces a manifest naming a missing object. Format 1 indexes after the
        # batch: its entries, then its version record, each durable in turn.
        v2 = formats.writing(tree.root) >= 2
        with together(at_once=True):
            for shard in dict.fromkeys((tree.root / r.manifest.output.store_path).parent for r in batch):
                fsync_dir(shard)  # joins the batch: fsynced in its round, once per folder
            for r in batch:
                try:
                    fence(ctx, r.job_id, "manifest")
                    out[r.job_id] = _install_prepared(tree, r)
                except LostOwnership as exc:
                    out[r.job_id] = exc
            live = [r for r in batch if isinstance(out[r.job_id], Manifest)]
            crashpoint("after_manifest")  # format 2: the manifests named, not yet durable
            if v2:
                _index_batch(ctx, live, out)
        if not v2:
            _index_batch(ctx, live, out)
        crashpoint("after_index")  # the manifests and the index durable, no job moved yet
        for r in live:
            if r.on_stage is not None:
                r.on_stage("stored")
                r.on_stage("indexed")
        # 5. The moves, then complete/ once. The removals from running/<worker>/ are owed to
        # this process's next folder fsync (the next claim batch has running/<worker>/ in its
        # first round anyway): a cut before it may leave a told-complete job's old name
        # there too, which recovery removes (nothing runs again) and fsck reports.
        moved: list[Ready] = []
        with together(at_once=True, sources_later=True):
            for k, r in enumerate(live):
                if k == 0:
                    crashpoint("before_complete_rename")
                elif k == 1:
                    crashpoint("mid_complete_batch")  # some jobs moved, the rest not yet
                try:
                    complete(ctx, r.job_id)
                    moved.append(r)
                except LostOwnership as exc:
                    out[r.job_id] = exc
    finally:
        for r in batch:
            r.prepared.discard()  # named now (its temp name, if any, goes) or no longer needed
    with ctx.journal.batch():  # the batch's lines in one write
        for r in moved:
            m = out[r.job_id]
            assert isinstance(m, Manifest)
            _told(ctx, r.job, r.attempt, m, r.note, r.why)
    return [out.get(r.job_id, LostOwnership(f"{r.job_id} was not published")) for r in batch]


def _index_batch(ctx: Context, live: list[Ready], out: dict[str, Manifest | BaseException]) -> None:
    """Index a publish batch's jobs (format 2: one segment). A manifest linked into place
    just now has no index line yet, so only the ones found in place already are looked up."""
    fresh = [r.manifest for r in live if out[r.job_id] is r.manifest]
    kept = [m for r in live if (m := out[r.job_id]) is not r.manifest and isinstance(m, Manifest)]
    todo = fresh + (index.unindexed(ctx.tree, kept) if kept else [])
    index.index_jobs(ctx.tree, todo, ctx.cfg.acceptance.required_tags, writer=ctx.worker, force=True)


def _install_prepared(tree: Tree, r: Ready) -> Manifest:
    """:func:`install_manifest` for a manifest prepared on its attempt's thread (no second
    write); its folder's fsync is the caller's batch's."""
    return _name_manifest(tree, r.manifest, r.prepared)


def install_manifest(tree: Tree, manifest: Manifest) -> Manifest:
    """Write ``manifests/J.json`` by the rule of the module docstring; returns the
    manifest that names the job's output now (``manifest``, or the one adopted).

    ``manifest`` must name a store file the caller has verified.
    """
    prepared = Prepared(tree.manifest_file(manifest.job_id), encode(manifest), mode=0o444)
    try:
        return _name_manifest(tree, manifest, prepared)
    finally:
        prepared.discard()


def _name_manifest(tree: Tree, manifest: Manifest, prepared: Prepared) -> Manifest:
    """Give the prepared manifest its name, never over another: an existing one that
    verifies for the same recipe is adopted (the job's selected output stays), any other
    (unreadable, naming a missing object or another recipe) is replaced. Then the folder."""
    path = tree.manifest_file(manifest.job_id)
    try:
        prepared.link(path)
        fsync_dir(path.parent)
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
    prepared.replace(path)
    fsync_dir(path.parent)
    return manifest


def complete(ctx: Context, job_id: str) -> None:
    """The commit: move the owned job file to ``complete/``."""
    if not transfer(ctx.tree.job_file("running", job_id, ctx.worker), ctx.tree.job_file("complete", job_id)):
        raise LostOwnership(f"{job_id} was taken from running/{ctx.worker}/ before it could complete")
