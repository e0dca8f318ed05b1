"""Renders from an edit file: an OpenTimelineIO timeline as a recipe's input.

A render's ``recipe.input`` may name a source that is a timeline: ``.otio`` (OpenTimelineIO's
own JSON), ``.edl`` (CMX 3600, through the ``otio-cmx3600-adapter``) or ``.xml`` (Final Cut
Pro 7 XML, through the ``otio-fcp-adapter``). At acceptance the file is parsed once and
frozen into the job (:class:`Timeline`): a changed file after submission changes nothing.

What is rendered, by one FFmpeg graph (:func:`spool.kinds.render.ffcommand.command`): the one video
track, at the timeline's rate; clips with their source ranges, gaps (black, silent), and
``SMPTE_Dissolve`` transitions as cross dissolves (picture and sound). The canvas is the
first clip's picture size; every clip is fitted into it (padded, aspect kept). The clips'
own sound is the timeline's sound when every clip has sound. Anything else (another video
track, an audio track, an effect such as a speed change or freeze frame, another kind of
transition, a nested composition, a clip without media) is refused with the clip's name
and timecode: a render that silently dropped it would not be the edit.

Media references are ``file:`` URLs or paths (relative ones from the timeline's folder),
resolved inside the asset roots like any source, probed and hashed; or another job's
output, ``spool:NAME`` / ``spool:NAME@REV`` (:mod:`spool.queue.depends`: the job waits for it).
Each distinct medium becomes a source of the job, ``<role>_<n>``. The OTIO dissolve model:
a transition between clips A and B with ``in_offset`` i and ``out_offset`` o shows A past
its out point for o and B before its in point for i (handles), so the timeline's duration
is the sum of its clips and gaps; the media must hold those handles.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import unquote, urlparse

import msgspec

from spool.core.errors import InvalidInput
from spool.core.model import AudioInfo, ProbeSummary, Record, Source, VideoInfo
from spool.core.sourceref import SourceRef
from spool.disk.store import sha256_file

if TYPE_CHECKING:
    pass

#: Timeline files by suffix, and the OTIO adapter that reads each.
ADAPTERS = {".otio": "otio_json", ".edl": "cmx_3600", ".xml": "fcp_xml"}
#: The most clips and gaps one timeline may have.
MAX_ITEMS = 500


class Item(Record, kw_only=True):
    """A clip or a gap of the track, in seconds; ``source`` is the medium's role."""

    kind: Literal["clip", "gap"]
    name: str
    source: str | None = None
    start: float = 0.0  # the clip's in point in its medium
    duration: float
    at: float  # where it starts on the timeline
    frames: int  # its duration in frames at the timeline's rate


class Dissolve(Record, kw_only=True):
    """A cross dissolve at the cut before item ``cut``: ``before`` seconds of the outgoing
    item past its end, ``after`` of the incoming before its start (OTIO in and out offsets)."""

    name: str
    cut: int
    before: float
    after: float


class Timeline(Record, kw_only=True):
    """A timeline as frozen at acceptance (``RenderJob.timeline``)."""

    role: str
    file: str
    sha256: str
    rate: float
    width: int = 0
    height: int = 0
    duration: float
    audio: bool = False
    items: list[Item]
    dissolves: list[Dissolve] = msgspec.field(default_factory=list)


def is_timeline(text: object) -> bool:
    return isinstance(text, str) and Path(text).suffix.lower() in ADAPTERS


def _tc(seconds: float, rate: float) -> str:
    import opentimelineio as otio  # here: only a timeline recipe loads OTIO (+~63 ms)

    return str(otio.opentime.to_timecode(otio.opentime.RationalTime(round(seconds * rate), rate), rate))


def parse(role: str, path: Path) -> tuple[Timeline, dict[str, str]]:
    """The timeline in ``path`` frozen (sizes and sound still unknown), and its media by role:
    a path or URL as written, or ``spool:REF``. Raises :class:`InvalidInput`."""
    import opentimelineio as otio  # here: only a timeline recipe loads OTIO (+~63 ms)

    field = f"sources.{role}"
    adapter = ADAPTERS[path.suffix.lower()]
    try:
        tl = otio.adapters.read_from_file(str(path), adapter_name=adapter)
    except Exception as exc:  # adapters raise anything: a missing plug-in, a parse error
        raise InvalidInput(field, f"{path.name} is not a timeline OpenTimelineIO can read ({exc})") from None
    if not isinstance(tl, otio.schema.Timeline):
        raise InvalidInput(field, f"{path.name} holds a {type(tl).__name__}, not a timeline")
    video = list(tl.video_tracks())
    if len(video) != 1:
        raise InvalidInput(field, f"{path.name} has {len(video)} video tracks; spool renders exactly one")
    for t in tl.audio_tracks():
        raise InvalidInput(
            field,
            f"{path.name}: audio track {t.name or '(unnamed)'!r} is not rendered (the clips' own sound is); "
            "remove it or mix its sound into the clips",
        )
    track = video[0]
    rate = _rate(tl, track)
    items: list[Item] = []
    dissolves: list[Dissolve] = []
    media: dict[str, str] = {}
    roles: dict[str, str] = {}
    at = 0
    for child in track:
        when = _tc(at / rate, rate)
        name = child.name or "(unnamed)"
        if isinstance(child, otio.schema.Transition):
            if child.transition_type != otio.schema.TransitionTypes.SMPTE_Dissolve:
                raise InvalidInput(
                    field,
                    f"transition {name!r} at {when} is a {child.transition_type}: "
                    "only SMPTE_Dissolve is rendered",
                )
            dissolves.append(
                Dissolve(
                    name=name,
                    cut=len(items),
                    before=_frames(child.in_offset, rate) / rate,
                    after=_frames(child.out_offset, rate) / rate,
                )
            )
            continue
        if isinstance(child, otio.schema.Gap):
            n = _frames(child.trimmed_range().duration, rate)
            items.append(Item(kind="gap", name=name, duration=n / rate, at=at / rate, frames=n))
            at += n
            continue
        if not isinstance(child, otio.schema.Clip):
            raise InvalidInput(
                field, f"{name!r} at {when} is a {type(child).__name__}: nested compositions are not rendered"
            )
        for effect in child.effects:
            what = effect.effect_name or type(effect).__name__
            raise InvalidInput(field, f"clip {name!r} at {when}: effect {what!r} is not supported")
        ref = child.media_reference
        url = getattr(ref, "target_url", None)
        if not url:
            raise InvalidInput(field, f"clip {name!r} at {when} has no media reference")
        if url not in roles:
            roles[url] = f"{role}_{len(roles) + 1}"
            media[roles[url]] = _location(url, path)
        rng = child.trimmed_range()
        n = _frames(rng.duration, rate)
        start = _frames(rng.start_time, rate) / rate
        items.append(
            Item(
                kind="clip",
                name=name,
                source=roles[url],
                start=start,
                duration=n / rate,
                at=at / rate,
                frames=n,
            )
        )
        at += n
        if len(items) > MAX_ITEMS:
            raise InvalidInput(field, f"{path.name} has more than {MAX_ITEMS} clips and gaps")
    if not any(i.kind == "clip" for i in items):
        raise InvalidInput(field, f"{path.name} has no clip")
    for d in dissolves:
        if d.cut == 0 or d.cut >= len(items):
            raise InvalidInput(field, f"transition {d.name!r} is not between two items")
    tl_rec = Timeline(
        role=role, file=str(path), sha256="", rate=rate, duration=at / rate, items=items, dissolves=dissolves
    )
    return tl_rec, media


def _rate(tl: Any, track: Any) -> float:
    for child in track:
        if hasattr(child, "source_range") and child.source_range is not None:
            return float(child.source_range.duration.rate)
    return float(track.duration().rate or 24.0)


def _frames(t: Any, rate: float) -> int:
    return round(t.value * rate / t.rate) if t.rate else 0


def _location(url: str, timeline: Path) -> str:
    """A media reference as a source text: ``spool:REF`` kept, a ``file:`` URL or a path made a
    path (a relative one from the timeline's folder)."""
    if url.startswith("spool:"):
        return url
    parsed = urlparse(url)
    if parsed.scheme == "file":
        text = unquote(parsed.path)
    elif parsed.scheme and len(parsed.scheme) > 1:
        raise InvalidInput("sources", f"media reference {url!r} is not a file: URL or a path")
    else:
        text = url
    return text if os.path.isabs(text) else str(timeline.parent / text)


def job_refs(media: dict[str, str]) -> dict[str, SourceRef]:
    """The media that are other jobs' outputs (``spool:REF``), as source refs by role."""
    return {
        role: SourceRef(job=text[len("spool:") :])
        for role, text in media.items()
        if text.startswith("spool:")
    }


def finish(tl: Timeline, sources: dict[str, Source], timeline_source: Source) -> tuple[Timeline, Source]:
    """The frozen timeline with its canvas and sound from its media, checked against them
    (every clip's range and dissolve handles inside its medium), and the timeline's own
    source entry whose probe summary is the picture the timeline makes."""
    field = f"sources.{tl.role}"
    first = next(i for i in tl.items if i.kind == "clip")
    v = sources[first.source or ""].probe.video
    if v is None:
        raise InvalidInput(field, f"clip {first.name!r}: its medium has no picture")
    width, height = v.width - v.width % 2, v.height - v.height % 2
    audio = True
    for k, it in enumerate(tl.items):
        if it.kind != "clip":
            continue
        src = sources[it.source or ""]
        when = _tc(it.at, tl.rate)
        if src.probe.video is None or src.probe.still:
            raise InvalidInput(field, f"clip {it.name!r} at {when}: {src.path} is not a video clip")
        audio = audio and src.probe.audio is not None
        before, after = handles(tl, k)
        lo, hi = it.start - before, it.start + it.duration + after
        dur = src.probe.duration
        if lo < -1e-6 or (dur is not None and hi > dur + 1.0 / tl.rate):
            raise InvalidInput(
                field,
                f"clip {it.name!r} at {when}: needs {src.path} from {lo:.3f} s to {hi:.3f} s"
                + (" (with its dissolve's handles)" if before or after else "")
                + f"; the medium has {dur or 0:.3f} s",
            )
    tl = msgspec.structs.replace(tl, width=width, height=height, audio=audio, sha256=timeline_source.sha256)
    probe = ProbeSummary(
        format="timeline",
        duration=tl.duration,
        still=False,
        video=VideoInfo(codec="timeline", width=width, height=height, fps=tl.rate, pix_fmt="yuv420p"),
        audio=AudioInfo(codec="timeline", channels=2, sample_rate=48000) if audio else None,
        streams=2 if audio else 1,
    )
    return tl, msgspec.structs.replace(timeline_source, probe=probe)


def handles(tl: Timeline, k: int) -> tuple[float, float]:
    """Seconds of item ``k``'s medium a dissolve shows before its in point (the incoming side
    of the dissolve at its cut: that dissolve's in offset) and after its out point (the
    outgoing side of the next one: its out offset)."""
    before = next((d.before for d in tl.dissolves if d.cut == k), 0.0)
    after = next((d.after for d in tl.dissolves if d.cut == k + 1), 0.0)
    return before, after


def hash_file(role: str, path: Path) -> Source:
    """The timeline file's own source entry (hashed; its probe is set by :func:`finish`)."""
    digest, size = sha256_file(path)
    empty = ProbeSummary(format="timeline", duration=None, still=False)
    return Source(role=role, path=str(path), size=size, sha256=digest, probe=empty)
