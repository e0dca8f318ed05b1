"""The ``render`` kind: a recipe rendered by FFmpeg from hashed sources.

Acceptance resolves the sources inside the asset roots, probes and hashes
them, checks the recipe against them and works out the expectations of the
output. An attempt re-hashes every source (the queue renders what was
accepted or nothing), runs FFmpeg under the operator's limits, and hands the
candidate to the validation gate (:mod:`spool.media.validate`).
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

from spool.core import sourceref
from spool.core.decoding import convert
from spool.core.errors import Failed, Interrupted, InvalidInput
from spool.core.faults import crashpoint
from spool.core.model import JobBase, LayerBox, Output, Progress, Source, ValidationReport
from spool.disk import store
from spool.kinds.base import Kind, Produced, SelfCheck
from spool.kinds.render import ffcommand, ffrun, layers, recipe, selfcheck
from spool.kinds.render import timeline as timeline_
from spool.media import sources as sources_
from spool.media.validate import validate
from spool.queue import cancel, health
from spool.queue.attempt import drop_partial

if TYPE_CHECKING:
    from spool.core.config import Config
    from spool.core.submission import Submission
    from spool.disk.tree import Tree
    from spool.queue.attempt import Attempt
    from spool.queue.context import Context


class RenderJob(JobBase, tag="render"):
    """A render job file: the recipe, frozen with its sources."""

    recipe: recipe.Recipe
    layers: list[LayerBox] = msgspec.field(
        default_factory=list
    )  # text/overlay boxes fixed at acceptance (spool.kinds.render.layers); drawn exactly
    #: The edit the recipe's input names, frozen at acceptance (spool.kinds.render.timeline), if it is one.
    timeline: timeline_.Timeline | None = None


class Render(Kind[RenderJob]):
    name = "render"
    job_type = RenderJob
    spec_field = "recipe"
    spec_type = recipe.Recipe

    # -- acceptance -------------------------------------------------------------
    def revision(self, job: RenderJob, spec: Any, sources: dict[str, str]) -> dict[str, Any]:
        """A new recipe; the sources carry over (``sources`` adds or replaces roles, and each
        must be used by the new recipe, as at submission)."""
        parsed = convert(spec, recipe.Recipe, prefix="recipe")
        unused = sorted(set(sources) - parsed.roles())
        if unused:
            raise InvalidInput(
                "--source",
                f"the new recipe does not use role {', '.join(map(repr, unused))} "
                f"(it uses {', '.join(sorted(parsed.roles()))})",
            )
        srcs = {s.role: s.path for s in job.sources}
        srcs.update(sources)
        return {
            "sources": {r: p for r, p in srcs.items() if r in parsed.roles()},  # drop what it no longer uses
            "recipe": spec,
            "output_file": f"{Path(job.output.file).stem}{recipe.extension(parsed)}",
        }

    def freeze(self, tree: Tree, cfg: Config, sub: Submission, common: dict[str, Any]) -> RenderJob:
        return self._freeze(tree, cfg, sub, common, None)

    def resolve(
        self, tree: Tree, cfg: Config, waiting: RenderJob, sub: Submission, common: dict[str, Any]
    ) -> RenderJob:
        """Frozen again once its upstreams published; a timeline stays the one parsed at acceptance."""
        return self._freeze(tree, cfg, sub, common, waiting)

    def upstream_refs(self, tree: Tree, cfg: Config, sub: Submission) -> dict[str, Any]:
        """The submission's sources from other jobs, and a timeline's media that are (``spool:``)."""
        refs: dict[str, Any] = dict(sourceref.refs(sub.sources))
        rec: recipe.Recipe | None = sub.spec
        edit = sub.sources.get(rec.input) if rec is not None else None
        if rec is not None and timeline_.is_timeline(edit):
            path = sources_.resolve(rec.input, edit, cfg.asset_roots(tree.root))
            refs |= timeline_.job_refs(timeline_.parse(rec.input, path)[1])
        return refs

    def _edit(
        self, tree: Tree, cfg: Config, sub: Submission, rec: recipe.Recipe, frozen: RenderJob | None
    ) -> tuple[timeline_.Timeline | None, Source | None, dict[str, object]]:
        """A timeline input: (the timeline, its file's source entry, its media texts by role)."""
        if frozen is not None and frozen.timeline is not None:
            tl = frozen.timeline
            media_roles = {i.source for i in tl.items if i.source}
            texts: dict[str, object] = {s.role: s.path for s in frozen.sources if s.role in media_roles}
            return tl, frozen.source(tl.role), texts
        edit = sub.sources.get(rec.input)
        if not timeline_.is_timeline(edit):
            return None, None, {}
        path = sources_.resolve(rec.input, edit, cfg.asset_roots(tree.root))
        tl, media = timeline_.parse(rec.input, path)
        for i, st in enumerate(rec.steps):
            if isinstance(st, recipe.Trim):
                raise InvalidInput(
                    f"recipe.steps[{i}]", "trim cannot cut a timeline input; cut it in the edit"
                )
        return tl, timeline_.hash_file(rec.input, path), dict(media)

    def _freeze(
        self, tree: Tree, cfg: Config, sub: Submission, common: dict[str, Any], frozen: RenderJob | None
    ) -> RenderJob:
        rec: recipe.Recipe | None = sub.spec
        if rec is None:
            raise InvalidInput("recipe", "is required but missing")
        if not sub.sources:
            raise InvalidInput("sources", "is required but missing (declare at least the input clip)")
        recipe.check_roles(rec, set(sub.sources))
        roots = cfg.asset_roots(tree.root)
        tl, tl_source, media = self._edit(tree, cfg, sub, rec, frozen)
        texts: dict[str, object] = {**media, **dict(sub.sources)}
        if tl is not None:
            texts.pop(tl.role, None)
        resolved = {role: sources_.resolve(role, text, roots) for role, text in texts.items()}
        media_roles = {i.source for i in tl.items if i.source} if tl is not None else set()
        unused = sorted(set(sub.sources) - rec.roles() - media_roles)  # an upstream medium comes in sub
        if unused:
            raise InvalidInput(f"sources.{unused[0]}", "is declared but no recipe step uses it; remove it")
        with sources_.memoized():
            sources = {role: sources_.describe(role, path, cfg) for role, path in resolved.items()}
        if tl is not None and tl_source is not None:
            tl, sources[tl.role] = timeline_.finish(tl, sources, tl_source)
        recipe.check(rec, sources)

        out_file = _output_file(sub, rec)
        estimate = recipe.estimate_bytes(rec, sources)
        if estimate > cfg.limits.temp_disk_bytes:
            raise InvalidInput(
                "recipe",
                f"this render may need {estimate / 2**30:.1f} GiB of temporary disk, more than "
                f"limits.temp_disk ({cfg.limits.temp_disk_bytes / 2**30:.1f} GiB) allows; "
                "shorten it or raise the limit",
            )
        expect = sources_.merge_expect(
            recipe.default_expect(rec, sources, cfg.validation.duration_tolerance),
            sub.output.expect,
        )
        job = RenderJob(
            **common,
            recipe=rec,
            recipe_hash="",
            sources=[sources[r] for r in sorted(sources)],
            output=Output(
                file=out_file, container=rec.encode.container, expect=expect, stated=sub.output.expect
            ),
            estimate_bytes=estimate,
            layers=layers.plan(rec, sources, cfg.layers, cfg.render),  # rejects a label that cannot fit
            timeline=tl,
        )
        job.recipe_hash = self.spec_hash(job)
        return job

    def waiting(
        self, tree: Tree, cfg: Config, sub: Submission, common: dict[str, Any], upstream: set[str]
    ) -> RenderJob:
        """A render whose input (or overlay, or music, or a timeline's medium) is another job's
        output: the recipe's roles and every other source are checked, probed and hashed now;
        what depends on the upstream's media (the recipe's checks, expectations, the layer
        plan) when it publishes. A timeline is parsed and frozen now."""
        rec: recipe.Recipe | None = sub.spec
        if rec is None:
            raise InvalidInput("recipe", "is required but missing")
        recipe.check_roles(rec, set(sub.sources))
        tl, tl_source, media = self._edit(tree, cfg, sub, rec, None)
        unused = sorted(set(sub.sources) - rec.roles())
        if unused:
            raise InvalidInput(f"sources.{unused[0]}", "is declared but no recipe step uses it; remove it")
        roots = cfg.asset_roots(tree.root)
        texts: dict[str, object] = {**media, **dict(sub.sources)}
        own = {
            role: sources_.describe(role, sources_.resolve(role, text, roots), cfg)
            for role, text in texts.items()
            if role not in upstream and (tl is None or role != tl.role)
        }
        if tl is not None and tl_source is not None:
            own[tl.role] = tl_source  # hashed now; its picture is known once every medium is
        out_file = _output_file(sub, rec)
        return RenderJob(
            **common,
            recipe=rec,
            recipe_hash="",
            sources=[own[r] for r in sorted(own)],
            output=Output(
                file=out_file,
                container=rec.encode.container,
                expect=sub.output.expect,
                stated=sub.output.expect,
            ),
            timeline=tl,
        )

    def spec(self, job: RenderJob) -> object:
        """The recipe, and the layer plan frozen with it: both decide what is drawn,
        so an edit to either is caught at claim. A job without layers hashes its
        recipe alone, as jobs always have."""
        spec: dict[str, Any] = {"recipe": job.recipe, "layers": job.layers}
        if job.timeline is not None:
            spec["timeline"] = job.timeline
        elif not job.layers:
            return job.recipe
        return spec

    # -- an attempt ---------------------------------------------------------------
    def produce(self, ctx: Context, job: RenderJob, attempt: Attempt) -> Produced:
        before = rehash_sources(job)
        layers.check_fonts(job.layers)  # the exact font each label was measured with, or a host fault
        out = _run_ffmpeg(ctx, job, attempt)
        _classify(ctx, job, attempt, out)
        unchanged_since(job, before)
        return Produced(attempt.work / job.output.file, out.seconds)

    def self_check(self, cfg: Config) -> SelfCheck:
        """The font, then a tiny render through every step kind and encoder
        (:mod:`spool.kinds.render.selfcheck`; a pass is remembered per FFmpeg and font)."""
        return selfcheck.run(cfg)

    def check(self, cfg: Config, job: RenderJob, candidate: Path, log: Path) -> ValidationReport:
        return validate(candidate, job.output.container, job.output.expect, cfg, log, job.layers)


KIND = Render()


def _output_file(sub: Submission, rec: recipe.Recipe) -> str:
    ext = recipe.extension(rec)
    out_file = sub.output.file or f"{sub.name}{ext}"
    if not out_file.endswith(ext):
        raise InvalidInput(
            "output.file", f"must end with {ext} to match the {rec.encode.container} container"
        )
    return out_file


#: What identifies one version of a source file: inode, size, mtime and ctime.
Fingerprint = tuple[int, int, int, int]


def rehash_sources(job: RenderJob) -> list[Fingerprint]:
    """Re-hash every source before FFmpeg starts: the queue renders what was
    accepted or nothing. Returns each source's fingerprint, taken before it was
    hashed, for :func:`unchanged_since`."""
    return [_rehash(src) for src in _media(job)]


def _media(job: RenderJob) -> list[Source]:
    """The sources a render reads: not a timeline's file, which was read once, at acceptance."""
    return [s for s in job.sources if job.timeline is None or s.role != job.timeline.role]


def unchanged_since(job: RenderJob, before: list[Fingerprint]) -> None:
    """After the render, before anything is published: every source must still be
    the file that was hashed before it. A write during the render changes the
    ctime (and usually mtime and size) even when it restores the bytes, and a
    replacement changes the inode; the hash is taken again for what stat alone
    cannot see (a filesystem with coarse or frozen times)."""
    for src, fp in zip(_media(job), before, strict=True):
        now_fp = _fingerprint(src)
        if now_fp != fp:
            raise _changed_during(src, f"stat changed ({_what_changed(fp, now_fp)})")
        digest, _size = store.sha256_file(Path(src.path))
        if digest != src.sha256:
            raise _changed_during(src, f"sha256 is now {digest}")


def _fingerprint(src: Source) -> Fingerprint:
    try:
        st = os.stat(src.path)
    except OSError as exc:
        raise _changed_during(src, f"it cannot be read ({exc.strerror})") from None
    return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _what_changed(a: Fingerprint, b: Fingerprint) -> str:
    names = ("inode", "size", "mtime", "ctime")
    return ", ".join(n for n, x, y in zip(names, a, b, strict=True) if x != y)


def _changed_during(src: Source, how: str) -> Failed:
    return Failed(
        "render",
        f"sources.{src.role}",
        f"source changed during render: {src.path}: {how}",
        expected=src.sha256,
        actual=how,
        next_action="Nothing was published. Restore the accepted file and spool retry the job, "
        "or submit a new revision that uses the changed file (spool revise).",
    )


def _rehash(src: Source) -> Fingerprint:
    try:
        st = os.stat(src.path)
        fp = (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
        digest, _size = store.sha256_file(Path(src.path))
    except OSError as exc:
        raise Failed(
            "prepare",
            f"sources.{src.role}",
            f"source {src.path} cannot be read ({exc.strerror})",
            expected=src.sha256,
            actual="unreadable",
            next_action="Restore the source file.",
            retryable=True,
        ) from None
    if digest != src.sha256:
        raise Failed(
            "prepare",
            f"sources.{src.role}.sha256",
            "source changed since submission",
            expected=src.sha256,
            actual=digest,
            next_action="Submit a new revision that uses the changed file (spool revise), "
            "or restore the original.",
        )
    return fp


def _run_ffmpeg(ctx: Context, job: RenderJob, attempt: Attempt) -> ffrun.RenderOutcome:
    """FFmpeg under the operator's limits, watched for stop, timeout and cancel."""
    cmd = ffcommand.command(
        job.recipe,
        {s.role: s for s in job.sources},
        job.output.file,
        ctx.cfg.render,
        job.layers,
        job.timeline,
    )
    first = [True]

    def on_progress(p: Progress) -> None:
        if first[0] and not p.done and (attempt.work / job.output.file).exists():
            first[0] = False
            crashpoint("mid_render")  # FFmpeg has written part of the output

    try:
        return ffrun.run(
            cmd,
            attempt,
            ctx.cfg.limits,
            stop=ctx.stop,
            on_progress=on_progress,
            cancelled=lambda: cancel.cancel_requested(ctx.tree, job.job_id) is not None,
        )
    except FileNotFoundError as exc:
        if exc.filename != cmd.argv[0]:
            raise
        raise Failed(
            "render",
            "ffmpeg",
            f"{cmd.argv[0]} cannot be run ({exc.strerror})",
            expected="an FFmpeg executable",
            actual="not found",
            next_action="Install FFmpeg or fix [render] ffmpeg in spool.toml on this host.",
            fault="host",
        ) from None


def _classify(ctx: Context, job: RenderJob, attempt: Attempt, out: ffrun.RenderOutcome) -> None:
    """Turn how FFmpeg ended into a located failure, or return for a finished render."""
    limits = ctx.cfg.limits
    if out.stopped == "interrupted":
        raise Interrupted()
    if out.stopped == "cancelled":
        cancel.raise_if_cancelled(ctx.tree, job.job_id, attempt.n, ctx.worker)
    if out.stopped == "timeout":
        raise Failed(
            "render",
            "job_timeout",
            f"the render ran longer than {limits.job_timeout:g} s",
            expected=f"<= {limits.job_timeout:g} s",
            actual=f"{out.seconds:g} s",
            log_excerpt=out.log_tail[-6:],
            next_action="Shorten the job or raise limits.job_timeout in spool.toml, then spool retry it.",
            retryable=False,  # the same render would time out again
        )
    if out.returncode == -signal.SIGXFSZ:
        raise Failed(
            "render",
            "output_size",
            f"the output grew past limits.output_size ({limits.output_size})",
            expected=f"<= {limits.output_size}",
            actual="larger",
            log_excerpt=out.log_tail[-4:],
            next_action="Lower the quality or length in a new revision, or raise limits.output_size.",
        )
    if out.returncode != 0 and any("No space left on device" in line for line in out.log_tail):
        drop_partial(attempt.work / job.output.file)
        raise Failed(
            "render",
            "disk_space",
            "the disk filled up while FFmpeg wrote the output (the partial output was removed)",
            expected="free space",
            actual="ENOSPC",
            log_excerpt=out.log_tail[-4:],
            next_action="Free space on the spool's disk (spool gc helps).",
            retryable=True,
        )
    if out.returncode != 0:
        output = attempt.work / job.output.file
        wrote = output.exists() and output.stat().st_size > 0
        fault, evidence = health.classify_exit(out.returncode, out.log_tail, wrote)
        killed = out.returncode is not None and out.returncode < 0
        raise Failed(
            "render",
            "ffmpeg_killed" if killed else "ffmpeg_exit_status",
            f"FFmpeg was killed by signal {-(out.returncode or 0)}"
            if killed
            else f"FFmpeg exited with status {out.returncode}",
            expected="exit status 0" if killed else 0,
            actual=f"signal {-(out.returncode or 0)}" if killed else out.returncode,
            log_excerpt=[f"host-class: {evidence}" if fault == "host" else evidence, *out.log_tail[-8:]],
            next_action=(
                "Check this host (memory, limits.memory, FFmpeg's build and fonts: spool logs JOB)."
                if fault == "host"
                else "Read the log (spool logs JOB); fix the recipe or sources in a new revision, "
                "or spool retry if the cause was temporary."
            ),
            fault=fault,
        )
