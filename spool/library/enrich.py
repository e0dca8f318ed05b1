"""Enrichment on demand: facts and analyses of a published file, stored by content hash.

``enrich/<sha256>.json`` (an :class:`Enrichment`) holds what spool learnt from
the verified store file: equal outputs share one record, and a record never
describes anything but the bytes its name hashes to. Enrichment never touches
the store file, the manifest or the index, so ``spool get`` and search keep
working while it runs.

Built-in enrichers (the names ``--field`` takes):

==========  ============================================================
facts       container, codecs, width, height, fps, duration, bitrate (ffprobe)
scenes      scene cuts (FFmpeg ``scdet``): ``scene_cuts`` times, ``scenes`` = cuts + 1
loudness    integrated loudness (LUFS) and true peak (dBTP) (``ebur128=peak=true``)
black       black stretches (``blackdetect``)
silence     silent stretches (``silencedetect``)
==========  ============================================================

The FFmpeg analyses a request asks for run in one decoding pass. An analysis
that does not apply (loudness of a file without audio) is recorded as done
with a ``None`` value and a note: search reports such assets as partial.

Plug-ins: an entry point in the group ``spool.enrichers`` names a callable
``(path: Path, facts: Facts | None) -> dict[str, float | int | str | bool | None]``;
its result is stored under ``plugins[<entry point name>]`` and searchable as
``<name>.<key>``. A plug-in that raises is recorded as a note, never fatal.

Record updates are read-modify-write of one small file, written atomically:
two enrichers racing on one object may lose one's work (it is recomputed on
the next ``spool enrich``), never corrupt the record.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Callable, Iterable
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

from spool.core.config import Config
from spool.core.errors import InvalidInput
from spool.core.model import Record, decode, encode, now
from spool.disk.tree import Tree, make_dirs, visible_names, write_atomic
from spool.media import probe
from spool.media.validate import integrated_loudness

if TYPE_CHECKING:  # `spool search` imports this module; FFmpeg and plug-ins load where they run
    from importlib import metadata

FOLDER = "enrich"
GROUP = "spool.enrichers"
BUILTIN = ("facts", "scenes", "loudness", "black", "silence")
#: Searchable numeric fields of the built-in enrichers -> the enricher that computes them.
FIELDS = {
    "duration": "facts",
    "width": "facts",
    "height": "facts",
    "fps": "facts",
    "bitrate": "facts",
    "scenes": "scenes",
    "loudness": "loudness",
    "true_peak": "loudness",
    "black": "black",  # seconds of black in all
    "silence": "silence",  # seconds of silence in all
}
_TIMEOUT = 600.0


class Facts(Record, kw_only=True):
    container: str
    video_codec: str | None = None
    audio_codec: str | None = None
    width: int | None = None
    height: int | None = None
    fps: float | None = None
    duration: float | None = None
    bitrate: int | None = None  # bits per second


class Stretch(Record, kw_only=True):
    start: float
    end: float


class Enrichment(Record, kw_only=True):
    """``enrich/<sha256>.json``: what is known about one stored object."""

    sha256: str
    #: Enrichers that have run (whether or not their value applied), with when.
    done: dict[str, datetime] = msgspec.field(default_factory=dict)
    facts: Facts | None = None
    scene_cuts: list[float] | None = None
    loudness: float | None = None  # integrated, LUFS
    true_peak: float | None = None  # dBTP
    black: list[Stretch] | None = None
    silence: list[Stretch] | None = None
    plugins: dict[str, dict[str, Any]] = msgspec.field(default_factory=dict)
    #: Why an enricher produced no value (no audio stream, FFmpeg failed, a plug-in raised).
    notes: dict[str, str] = msgspec.field(default_factory=dict)


def folder(tree: Tree) -> Path:
    return tree.root / FOLDER


def record_path(tree: Tree, digest: str) -> Path:
    return tree.digest_file(FOLDER, digest, ".json")


def load(tree: Tree, digest: str) -> Enrichment | None:
    try:
        return decode(record_path(tree, digest).read_bytes(), Enrichment)
    except (OSError, ValueError):
        return None


def enriched_digests(tree: Tree) -> set[str]:
    """sha256 of every object with a record (one directory listing)."""
    return {n[:-5] for n in visible_names(folder(tree))}


# -- plug-ins ------------------------------------------------------------------------


Plugin = Callable[[Path, Facts | None], dict[str, Any]]


def plugins() -> dict[str, metadata.EntryPoint]:
    """Installed plug-in enrichers by name (the ``spool.enrichers`` entry points)."""
    from importlib import metadata

    return {ep.name: ep for ep in metadata.entry_points(group=GROUP)}


# -- values for search -----------------------------------------------------------------

#: Returned by :func:`value` for a field that has not been computed or does not apply.
UNJUDGED = object()


def enricher_of(field: str, plugin_names: Iterable[str]) -> str | None:
    """The enricher that computes a search field, or ``None`` if no enricher does."""
    if field in FIELDS:
        return FIELDS[field]
    prefix, _, key = field.partition(".")
    return prefix if key and prefix in set(plugin_names) else None


def value(rec: Enrichment | None, field: str) -> Any:
    """The value of a search field in a record, or :data:`UNJUDGED`."""
    if rec is None:
        return UNJUDGED
    v: Any
    if field in ("duration", "width", "height", "fps", "bitrate"):
        v = getattr(rec.facts, field) if rec.facts is not None else None
    elif field == "scenes":
        v = len(rec.scene_cuts) + 1 if rec.scene_cuts is not None else None
    elif field in ("loudness", "true_peak"):
        v = getattr(rec, field)
    elif field in ("black", "silence"):
        stretches = getattr(rec, field)
        v = round(sum(s.end - s.start for s in stretches), 3) if stretches is not None else None
    else:
        prefix, _, key = field.partition(".")
        v = rec.plugins.get(prefix, {}).get(key)
    return UNJUDGED if v is None else v


# -- computing ----------------------------------------------------------------------------


def facts_of(info: dict[str, Any]) -> Facts:
    """Pure: the technical facts in an ffprobe report."""
    fmt = info.get("format", {})
    v = next((s for s in info.get("streams", []) if s.get("codec_type") == "video"), None)
    a = next((s for s in info.get("streams", []) if s.get("codec_type") == "audio"), None)

    def num(x: Any, typ: type = float) -> Any:
        try:
            return typ(x)
        except (TypeError, ValueError):
            return None

    fps = None
    if v is not None:
        fps = round(probe.rate(v.get("avg_frame_rate")) or probe.rate(v.get("r_frame_rate")), 3) or None
    return Facts(
        container=str(fmt.get("format_name", "unknown")),
        video_codec=v.get("codec_name") if v else None,
        audio_codec=a.get("codec_name") if a else None,
        width=num(v.get("width"), int) if v else None,
        height=num(v.get("height"), int) if v else None,
        fps=fps,
        duration=num(fmt.get("duration")),
        bitrate=num(fmt.get("bit_rate"), int),
    )


_CUT = re.compile(r"lavfi\.scd\.time:\s*([0-9.]+)")
_BLACK = re.compile(r"black_start:\s*([0-9.]+)\s+black_end:\s*([0-9.]+)")
_SIL_START = re.compile(r"silence_start:\s*(-?[0-9.]+)")
_SIL_END = re.compile(r"silence_end:\s*([0-9.]+)")
_PEAK = re.compile(r"True peak:\s*\n\s*Peak:\s*(-?[0-9.]+|-inf)\s*dBFS")


def parse_analysis(log: str, duration: float | None) -> dict[str, Any]:
    """Pure: what one FFmpeg analysis pass printed, by field."""
    out: dict[str, Any] = {}
    out["scene_cuts"] = [float(t) for t in _CUT.findall(log)]
    out["black"] = [Stretch(start=float(a), end=float(b)) for a, b in _BLACK.findall(log)]
    sil: list[Stretch] = []
    starts = [max(0.0, float(s)) for s in _SIL_START.findall(log)]
    ends = [float(e) for e in _SIL_END.findall(log)]
    for i, s in enumerate(starts):
        end = ends[i] if i < len(ends) else (duration if duration is not None else s)
        sil.append(Stretch(start=s, end=end))  # silent to the end: silencedetect prints no end
    out["silence"] = sil
    summary = log[log.rfind("Summary:") :] if "Summary:" in log else ""
    out["loudness"] = integrated_loudness(log)
    p = _PEAK.search(summary)
    out["true_peak"] = None if p is None or p.group(1) == "-inf" else float(p.group(1))
    return out


def _analyse(path: Path, facts: Facts, wanted: set[str], cfg: Config) -> tuple[dict[str, Any], str]:
    """One FFmpeg decoding pass running the analysis filters asked for."""
    vf = [f for e, f in (("scenes", "scdet=threshold=10"), ("black", "blackdetect=d=0.1")) if e in wanted]
    af = [
        f
        for e, f in (("loudness", "ebur128=peak=true"), ("silence", "silencedetect=n=-50dB:d=0.3"))
        if e in wanted
    ]
    argv = [cfg.render.ffmpeg, "-nostdin", "-hide_banner", "-nostats", "-protocol_whitelist", "file"]
    argv += ["-i", f"file:{path}"]
    if vf and facts.video_codec:
        argv += ["-map", "0:v:0", "-vf", ",".join(vf)]
    if af and facts.audio_codec:
        argv += ["-map", "0:a:0", "-af", ",".join(af)]
    if "-map" not in argv:
        return {}, ""
    argv += ["-f", "null", "-"]
    try:
        proc = subprocess.run(
            argv,
            capture_output=True,
            timeout=_TIMEOUT,
            stdin=subprocess.DEVNULL,
            preexec_fn=lambda: os.nice(10),
        )
    except subprocess.TimeoutExpired:
        return {}, f"FFmpeg took longer than {_TIMEOUT:g} s"
    except OSError as exc:
        return {}, f"FFmpeg could not run ({exc.strerror})"
    log = proc.stderr.decode("utf-8", "replace")
    if proc.returncode != 0:
        tail = log.strip().splitlines()
        return {}, f"FFmpeg exited with {proc.returncode}: {tail[-1] if tail else ''}"
    return parse_analysis(log, facts.duration), ""


def enrich_object(
    tree: Tree,
    cfg: Config,
    digest: str,
    path: Path,
    fields: Iterable[str] | None = None,
    *,
    force: bool = False,
) -> Enrichment:
    """Compute the enrichers asked for (default: all) that the record lacks; store it.

    ``path`` must be the verified store file of ``digest``.
    """
    rec = load(tree, digest) or Enrichment(sha256=digest)
    installed = plugins()
    asked = list(fields) if fields is not None else [*BUILTIN, *sorted(installed)]
    unknown = [f for f in asked if f not in BUILTIN and f not in installed]
    if unknown:
        known = ", ".join([*BUILTIN, *installed])
        raise InvalidInput("--field", f"unknown enricher {unknown[0]!r} (known: {known})")
    todo = [f for f in asked if force or f not in rec.done]
    if not todo:
        return rec
    done, notes, plug = dict(rec.done), dict(rec.notes), dict(rec.plugins)
    changes: dict[str, Any] = {}
    facts = rec.facts
    if facts is None or "facts" in todo:
        try:
            facts = facts_of(probe.ffprobe(path, cfg.render.ffprobe))
        except probe.ProbeError as exc:
            facts = None
            notes["facts"] = str(exc)
        changes["facts"] = facts
        done["facts"] = now()
    analyses = {"scenes", "loudness", "black", "silence"} & set(todo)
    if analyses and facts is not None:
        got, err = _analyse(path, facts, analyses, cfg)
        for e in sorted(analyses):
            done[e] = now()
            keys = {"scenes": ["scene_cuts"], "loudness": ["loudness", "true_peak"]}.get(e, [e])
            applies = bool(facts.video_codec) if e in ("scenes", "black") else bool(facts.audio_codec)
            notes.pop(e, None)
            if err:
                notes[e] = err
            elif not applies:
                notes[e] = "no video stream" if e in ("scenes", "black") else "no audio stream"
            for k in keys:
                changes[k] = got.get(k) if applies and not err else None
    for name in [f for f in todo if f in installed]:
        done[name] = now()
        try:
            fn = installed[name].load()
            result = fn(path, facts)
            if not isinstance(result, dict):
                raise TypeError(f"returned {type(result).__name__}, not a dict")
            plug[name] = {str(k): v for k, v in result.items() if isinstance(v, int | float | str | bool)}
            notes.pop(name, None)
        except Exception as exc:  # a plug-in's bug is a note, never a crash
            notes[name] = f"plug-in failed: {type(exc).__name__}: {exc}"
    rec = msgspec.structs.replace(rec, done=done, notes=notes, plugins=plug, **changes)
    make_dirs(folder(tree))
    write_atomic(record_path(tree, digest), encode(rec), durable=False)  # recomputable
    return rec
