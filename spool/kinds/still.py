"""The ``still`` kind: one PNG frame of a source clip (a poster, a storyboard frame).

A small kind that renders, and the proof that the kind seam holds: this module is the
whole of it (the registry finds ``KIND``; acceptance, the daemon, the publish path,
status and fsck know nothing of it). A submission::

    {"name": "mug-poster", "operation": "still",
     "sources": {"clip": "/studio/assets/mug-shot.mp4"},
     "still": {"at": 1.5, "width": 640},
     "tags": {...}}

At acceptance the source is resolved inside the asset roots, probed and hashed, and
``at`` must lie inside it. The frame is taken with FFmpeg (file protocol only), and the
gate checks that the candidate is one PNG picture of the width asked for.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import msgspec

from spool.core.decoding import convert
from spool.core.errors import Failed, InvalidInput
from spool.core.model import Check, Expect, JobBase, Output, ValidationReport
from spool.disk.store import sha256_file
from spool.kinds.base import Kind, Produced
from spool.media import sources as sources_
from spool.media.probe import ProbeError, ffprobe, streams_of

if TYPE_CHECKING:
    from spool.core.config import Config
    from spool.core.submission import Submission
    from spool.disk.tree import Tree
    from spool.queue.attempt import Attempt
    from spool.queue.context import Context

#: The one source role of a still job.
ROLE = "clip"
#: Seconds FFmpeg may take for one frame.
TIMEOUT = 120.0


class StillSpec(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """The submission's ``still`` table."""

    #: Where in the clip, in seconds from its start.
    at: Annotated[float, msgspec.Meta(ge=0)] = 0.0
    #: The picture's width in pixels (even; the height keeps the aspect); ``None``: the clip's.
    width: Annotated[int, msgspec.Meta(ge=16, le=8192, multiple_of=2)] | None = None


class StillJob(JobBase, tag="still"):
    """A still job file: the frame asked for, beside what every job has."""

    still: StillSpec


class Still(Kind[StillJob]):
    name = "still"
    job_type = StillJob
    spec_field = "still"
    spec_type = StillSpec
    poster_frames = False  # the output is a picture already

    def freeze(self, tree: Tree, cfg: Config, sub: Submission, common: dict[str, Any]) -> StillJob:
        spec = convert(sub.spec, StillSpec, prefix="still") if sub.spec is not None else StillSpec()
        if set(sub.sources) != {ROLE}:
            raise InvalidInput("sources", f"a still job takes exactly one source, {ROLE!r}")
        path = sources_.resolve(ROLE, sub.sources[ROLE], cfg.asset_roots(tree.root))
        src, _ = sources_.inspect(ROLE, path, cfg)
        if not src.probe.video:
            raise InvalidInput(f"sources.{ROLE}", f"{path.name} has no video stream to take a frame of")
        duration = src.probe.duration or 0.0
        if duration and spec.at >= duration:
            raise InvalidInput("still.at", f"{spec.at:g} s is past the clip's end ({duration:g} s)")
        job = StillJob(
            **common,
            recipe_hash="",
            sources=[src],
            still=spec,
            output=Output(file=sub.output.file or f"{sub.name}.png", container="png", expect=Expect()),
        )
        job.recipe_hash = self.spec_hash(job)
        return job

    def spec(self, job: StillJob) -> object:
        return {"source": job.sources[0].sha256, "at": job.still.at, "width": job.still.width}

    def produce(self, ctx: Context, job: StillJob, attempt: Attempt) -> Produced:
        src = job.sources[0]
        if sha256_file(Path(src.path))[0] != src.sha256:
            raise Failed(
                "prepare",
                "source",
                f"{src.path} changed since the job was accepted",
                expected=f"sha256 {src.sha256}",
                next_action="Submit a new revision if the new file is meant.",
            )
        out = attempt.work / job.output.file
        scale = ["-vf", f"scale={job.still.width}:-2"] if job.still.width else []
        argv = [
            ctx.cfg.render.ffmpeg, "-nostdin", "-hide_banner", "-loglevel", "error",
            "-protocol_whitelist", "file", "-ss", f"{job.still.at:.3f}", "-i", f"file:{src.path}",
            "-map", "0:v:0", "-frames:v", "1", *scale, "-f", "image2", "-c:v", "png", f"file:{out}",
        ]  # fmt: skip
        started = time.monotonic()
        try:
            proc = subprocess.run(argv, capture_output=True, timeout=TIMEOUT, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            raise Failed(
                "produce", "timeout", f"FFmpeg took longer than {TIMEOUT:g} s", next_action="Retry the job."
            ) from None
        attempt.tool_log.write_bytes(proc.stderr)
        if proc.returncode != 0 or not out.exists():
            err = proc.stderr.decode(errors="replace").strip().splitlines()
            raise Failed(
                "produce",
                "exit_code",
                f"FFmpeg made no frame at {job.still.at:g} s: {err[-1] if err else proc.returncode}",
                next_action="See the attempt's ffmpeg.log.",
            )
        return Produced(out, round(time.monotonic() - started, 3))

    def check(self, cfg: Config, job: StillJob, candidate: Path, log: Path) -> ValidationReport:
        started = time.monotonic()
        try:
            videos = streams_of(ffprobe(candidate, cfg.render.ffprobe), "video")
        except ProbeError as exc:
            videos, why = [], str(exc)
        else:
            why = ""
        got = videos[0] if len(videos) == 1 else {}
        checks = [
            Check(
                name="picture",
                expected="one png picture",
                actual=got.get("codec_name", why),
                ok=got.get("codec_name") == "png",
            ),
        ]
        if job.still.width is not None:
            checks.append(
                Check(
                    name="width",
                    expected=job.still.width,
                    actual=got.get("width"),
                    ok=got.get("width") == job.still.width,
                )
            )
        ok = all(c.ok for c in checks)
        return ValidationReport(
            ok=ok, decode_check="none", checks=checks, seconds=round(time.monotonic() - started, 3)
        )


KIND = Still()
