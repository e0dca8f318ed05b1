"""The validation gate (SPEC section 4): a candidate is checked before publish.

Exit code 0 from FFmpeg proves nothing. The gate reads the candidate with
ffprobe and compares it with the job's expectations, then decodes it (all of
it, sampled windows, or not at all, by config). Every check records what was
expected and what the file has, so a failure says exactly what is wrong.

What the gate measured of the file (container, codecs, size, frame rate,
duration, pixel format, audio channels, and the integrated loudness when
``[validation] measure_loudness`` is on and there is audio) is the report's
``media`` (:class:`spool.core.model.MediaInfo`): the publish path keeps it in the
manifest and the version record, for every kind that calls :func:`validate`.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path
from typing import Any

from spool.core.config import Config
from spool.core.errors import Failed
from spool.core.model import Check, Expect, LayerBox, MediaInfo, ValidationReport, media_info
from spool.core.secrets import redact
from spool.media import probe, safearea

#: Container names as the job states them -> names ffprobe's format_name contains.
CONTAINER_FORMATS = {"mp4": "mp4", "mov": "mov", "webm": "webm"}

#: Relative tolerance on frame rate (29.97 vs 30000/1001 and rounding).
FPS_TOLERANCE = 0.01


def _eq(name: str, expected: Any, actual: Any) -> Check:
    return Check(name=name, expected=expected, actual=actual, ok=expected == actual)


def _container_check(fmt: dict[str, Any], container: str, doctype: str | None) -> Check:
    """ffprobe's format_name is shared by mp4 and mov ("mov,mp4,...") and by every
    Matroska file ("matroska,webm"): the mp4 brand and the EBML DocType tell them apart."""
    names = str(fmt.get("format_name", ""))
    ok = CONTAINER_FORMATS[container] in names.split(",")
    actual = names
    if ok and container in ("mp4", "mov"):
        brand = str((fmt.get("tags") or {}).get("major_brand", "")).strip()
        if (brand == "qt") != (container == "mov"):
            ok, actual = False, f"{names} (major brand {brand or 'none'})"
    if ok and container == "webm" and doctype is not None and doctype != "webm":
        ok, actual = False, f"{names} (DocType {doctype})"
    return Check(name="container", expected=container, actual=actual, ok=ok)


def check_probe(
    info: dict[str, Any] | None, container: str, expect: Expect, tolerance: float, doctype: str | None = None
) -> list[Check]:
    """Pure: the probe report against the expectations."""
    if info is None:
        return [Check(name="container", expected=container, actual="unreadable", ok=False)]
    fmt = info.get("format", {})
    checks = [_container_check(fmt, container, doctype)]
    video = probe.streams_of(info, "video")
    audio = probe.streams_of(info, "audio")
    subs = probe.streams_of(info, "subtitle")
    for name, want, have in (
        ("video_streams", expect.video_streams, len(video)),
        ("audio_streams", expect.audio_streams, len(audio)),
        ("subtitle_streams", expect.subtitle_streams, len(subs)),
    ):
        if want is not None:
            checks.append(_eq(name, want, have))
    v = video[0] if video else {}
    a = audio[0] if audio else {}
    if expect.video_codec is not None and video:
        checks.append(_eq("video_codec", expect.video_codec, v.get("codec_name")))
    if expect.audio_codec is not None and audio:
        checks.append(_eq("audio_codec", expect.audio_codec, a.get("codec_name")))
    if expect.width is not None and video:
        checks.append(_eq("width", expect.width, v.get("width")))
    if expect.height is not None and video:
        checks.append(_eq("height", expect.height, v.get("height")))
    if expect.pix_fmt is not None and video:
        checks.append(_eq("pix_fmt", expect.pix_fmt, v.get("pix_fmt")))
    if expect.fps is not None and video:
        fps = probe.rate(v.get("avg_frame_rate")) or probe.rate(v.get("r_frame_rate"))
        ok = abs(fps - expect.fps) <= FPS_TOLERANCE * expect.fps
        checks.append(Check(name="fps", expected=expect.fps, actual=round(fps, 3), ok=ok))
    if expect.duration is not None:
        try:
            dur = float(fmt.get("duration"))
        except (TypeError, ValueError):
            dur = -1.0
        tol = expect.duration_tolerance if expect.duration_tolerance is not None else tolerance
        checks.append(
            Check(
                name="duration",
                expected=f"{expect.duration:g} ± {tol:g} s",
                actual=round(dur, 3),
                ok=abs(dur - expect.duration) <= tol,
            )
        )
    return checks


def decode_windows(
    duration: float | None, mode: str, windows: int, seconds: float
) -> list[tuple[float, float]] | None:
    """Pure: which (start, length) windows to decode; ``None`` means the whole file."""
    if mode == "full" or not duration or duration <= windows * seconds:
        return None
    if windows == 1:
        return [(0.0, seconds)]
    step = (duration - seconds) / (windows - 1)
    return [(round(i * step, 3), seconds) for i in range(windows)]


def count_packets(path: Path, cfg: Config) -> tuple[dict[str, Any], list[str]]:
    """Demux (not decode) the whole file, counting packets per stream: fast, and it
    reads to the very end. Returns ffprobe's report and its error lines."""
    argv = [
        cfg.render.ffprobe, "-v", "error", "-protocol_whitelist", "file", "-count_packets",
        "-show_entries", "stream=index,codec_type,nb_frames,nb_read_packets:format=duration",
        "-of", "json", f"file:{path}",
    ]  # fmt: skip
    proc = subprocess.run(argv, capture_output=True, stdin=subprocess.DEVNULL, timeout=3600)
    errors = redact(proc.stderr.decode("utf-8", "replace")).strip().splitlines()
    try:
        report = json.loads(proc.stdout)
    except ValueError:
        report = {}
    if proc.returncode != 0 and not errors:
        errors = [f"ffprobe exited with {proc.returncode}"]
    return report, errors


def short_streams(report: dict[str, Any], fps: float | None) -> list[str]:
    """Pure: streams with fewer packets than the file's index (or duration x fps) promises."""
    out = []
    try:
        duration = float(report.get("format", {}).get("duration"))
    except (TypeError, ValueError):
        duration = 0.0
    for s in report.get("streams", []):
        if s.get("codec_type") != "video":
            continue  # audio (PCM counts samples, not packets) and subtitles count differently;
            # streams are interleaved, so a short file is short in its video too
        read = int(s.get("nb_read_packets") or 0)
        promised = int(s.get("nb_frames") or 0)
        if not promised and s.get("codec_type") == "video" and fps and duration:
            promised = int(duration * fps) - 1  # a frame of slack for rounding at the end
        if promised and read < promised:
            out.append(
                f"{s.get('codec_type', 'stream')} stream {s.get('index')}: {read} of {promised} packets"
            )
    return out


def completeness_check(path: Path, cfg: Config, expect: Expect, log: Path) -> Check:
    """The file holds everything its index promises, to the last packet.

    A truncated file whose index sits at the front (mp4 with faststart, webm)
    still probes with its full duration; demuxing it to the end shows the gap.
    This runs in every decode mode, ``none`` included: publishing half a file
    is what the gate exists to prevent.
    """
    report, errors = count_packets(path, cfg)
    short = short_streams(report, expect.fps)
    with open(log, "ab") as f:
        f.write(f"[packets] {'; '.join(short + errors) or 'complete'}\n".encode())
    problems = short + errors[:2]
    return Check(
        name="complete",
        expected="every packet the index promises, readable to the end",
        actual="; ".join(problems) or "complete",
        ok=not problems,
    )


def decode_check(path: Path, cfg: Config, duration: float | None, log: Path) -> Check:
    """Decode the candidate (whole or sampled) and report any decoder error.

    Sampled mode is one FFmpeg run with the file opened once per window
    (``-noaccurate_seek -ss S -t T``), every window mapped: each decode starts
    at the keyframe at or before its sample point, so a window costs about its
    own length. (Accurate seeking decodes from that keyframe up to the point
    and then the window, which on long GOPs makes three windows cost as much as
    the whole file.) Truncation is the duration check's job; this one finds
    damage in what it reads.
    """
    mode = cfg.validation.decode_check
    windows = decode_windows(duration, mode, cfg.validation.sample_windows, cfg.validation.sample_seconds)
    inputs: list[str] = []
    maps: list[str] = []
    spans = [[]] if windows is None else [["-ss", f"{s:g}", "-t", f"{t:g}"] for s, t in windows]
    for i, span in enumerate(spans):
        seek = ["-noaccurate_seek", *span] if span else []
        inputs += ["-protocol_whitelist", "file", *seek, "-i", f"file:{path}"]
        maps += ["-map", str(i)]
    argv = [
        cfg.render.ffmpeg, "-nostdin", "-hide_banner", "-v", "error", "-xerror",
        *inputs, *maps,
        "-sn", "-dn",  # subtitles and data are not decoded media; the null muxer has no encoder for them
        "-f", "null", "-",
    ]  # fmt: skip
    proc = subprocess.run(argv, capture_output=True, stdin=subprocess.DEVNULL, timeout=3600)
    text = redact(proc.stderr.decode("utf-8", "replace").strip())
    label_spans = " | ".join(" ".join(span) for span in spans) or "full"
    with open(log, "ab") as f:
        f.write(f"[decode {label_spans}] exit {proc.returncode}\n{text}\n".encode())
    if proc.returncode < 0 and not text:
        # Killed (by the OOM killer, an operator, a torture run) before it said anything:
        # no verdict on the bytes, so not a failed check; the attempt is retried.
        raise Failed(
            "validate",
            "decode_check",
            f"the decode check was killed by signal {-proc.returncode} before it could judge the file",
            expected="a finished decode check",
            actual=f"signal {-proc.returncode}",
            next_action="Nothing if it was a one-off (spool retries the job); check this host's memory "
            "if it recurs.",
            retryable=True,
            fault="host",
        )
    errors = text.splitlines()[:3] if (proc.returncode != 0 or text) else []
    if proc.returncode != 0 and not errors:
        errors = [f"exit status {proc.returncode}"]
    label = "full" if windows is None else f"{len(windows)} windows of {cfg.validation.sample_seconds:g} s"
    return Check(
        name="decode",
        expected=f"no decoder errors ({label})",
        actual="; ".join(errors[:3]) or "clean",
        ok=not errors,
    )


#: The integrated loudness line of ebur128's summary.
_INTEGRATED = re.compile(r"^\s*I:\s*(-?[0-9.]+|-inf)\s*LUFS", re.M)


def integrated_loudness(log: str) -> float | None:
    """Pure: the integrated loudness (LUFS) in the summary ``ebur128`` printed, or ``None``
    (no summary, or digital silence: ``-inf``)."""
    summary = log[log.rfind("Summary:") :] if "Summary:" in log else ""
    m = _INTEGRATED.search(summary)
    return None if m is None or m.group(1) == "-inf" else float(m.group(1))


def measure_loudness(path: Path, cfg: Config, log: Path) -> float | None:
    """The integrated loudness (LUFS, EBU R128) of the first audio stream, by one
    audio-only decoding pass; ``None`` when it cannot be measured (digital silence,
    an FFmpeg error: the details go to ``log``). A measurement, never a check."""
    argv = [
        cfg.render.ffmpeg, "-nostdin", "-hide_banner", "-nostats", "-protocol_whitelist", "file",
        "-i", f"file:{path}", "-map", "0:a:0", "-af", "ebur128=peak=true", "-f", "null", "-",
    ]  # fmt: skip
    try:
        proc = subprocess.run(argv, capture_output=True, stdin=subprocess.DEVNULL, timeout=3600)
    except (OSError, subprocess.TimeoutExpired) as exc:
        with open(log, "ab") as f:
            f.write(f"[loudness] not measured: {exc}\n".encode())
        return None
    text = redact(proc.stderr.decode("utf-8", "replace"))
    value = integrated_loudness(text) if proc.returncode == 0 else None
    with open(log, "ab") as f:
        f.write(
            f"[loudness] exit {proc.returncode}: {value if value is not None else 'not measured'}\n".encode()
        )
    return value


def measure(path: Path, container: str, cfg: Config, log: Path) -> MediaInfo | None:
    """What the gate records of a media file (:class:`spool.core.model.MediaInfo`), measured
    on its own: for a kind whose check built its report without :func:`validate`
    (the publish path asks, so every kind's versions carry it). ``None`` if ffprobe
    cannot read it."""
    try:
        info = probe.ffprobe(path, cfg.render.ffprobe)
    except probe.ProbeError as exc:
        with open(log, "ab") as f:
            f.write(f"[media] not measured: {exc}\n".encode())
        return None
    summary = probe.summarize(info)
    loud = None
    if summary.audio is not None and cfg.validation.measure_loudness:
        loud = measure_loudness(path, cfg, log)
    return media_info(summary, container, loud)


def validate(
    candidate: Path,
    container: str,
    expect: Expect,
    cfg: Config,
    log: Path,
    layers: list[LayerBox] | None = None,
) -> ValidationReport:
    """Run the whole gate on a candidate file. ``layers`` (the job's planned text and
    overlay boxes) are judged against the safe area of the frame the file really has."""
    started = time.monotonic()
    try:
        size = candidate.stat().st_size
    except FileNotFoundError:
        size = 0
    if size == 0:
        checks = [Check(name="output_file", expected="a non-empty file", actual="missing or empty", ok=False)]
        return ValidationReport(
            ok=False,
            decode_check=cfg.validation.decode_check,
            checks=checks,
            seconds=round(time.monotonic() - started, 3),
        )
    try:
        info: dict[str, Any] | None = probe.ffprobe(candidate, cfg.render.ffprobe)
    except probe.ProbeError as exc:
        info = None
        with open(log, "ab") as f:
            f.write(f"[probe] {exc}\n".encode())
    doctype = probe.ebml_doctype(candidate) if container == "webm" else None
    checks = check_probe(info, container, expect, cfg.validation.duration_tolerance, doctype)
    if info is not None:
        checks.append(completeness_check(candidate, cfg, expect, log))
    if info is not None and cfg.validation.decode_check != "none":
        checks.append(decode_check(candidate, cfg, expect.duration, log))
    media = None
    if info is not None:
        summary = probe.summarize(info)
        loud = None
        if summary.audio is not None and cfg.validation.measure_loudness:
            loud = measure_loudness(candidate, cfg, log)
        media = media_info(summary, container, loud)
    judged = None
    if layers:
        video = probe.streams_of(info, "video") if info is not None else []
        width = video[0].get("width") if video else None
        height = video[0].get("height") if video else None
        judged, check = safearea.judge(layers, width, height)
        checks.append(check)
    return ValidationReport(
        ok=all(c.ok for c in checks),
        decode_check=cfg.validation.decode_check,
        checks=checks,
        seconds=round(time.monotonic() - started, 3),
        layers=judged,
        media=media,
    )
