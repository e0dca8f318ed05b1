"""The validation gate (SPEC section 4): a candidate is checked before publish.

Exit code 0 from FFmpeg proves nothing. The gate reads the candidate with
ffprobe and compares it with the job's expectations, then decodes it (all of
it, sampled windows, or not at all, by config). Every check records what was
expected and what the file has, so a failure says exactly what is wrong.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Any

from . import probe
from .config import Config
from .model import Check, Expect, ValidationReport
from .secrets import redact

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


def decode_check(path: Path, cfg: Config, duration: float | None, log: Path) -> Check:
    """Decode the candidate (whole or sampled) and report any decoder error."""
    mode = cfg.validation.decode_check
    windows = decode_windows(duration, mode, cfg.validation.sample_windows, cfg.validation.sample_seconds)
    spans: list[list[str]] = (
        [[]] if windows is None else [["-ss", f"{s:g}", "-t", f"{t:g}"] for s, t in windows]
    )
    errors: list[str] = []
    for span in spans:
        argv = [
            cfg.render.ffmpeg,
            "-nostdin",
            "-hide_banner",
            "-v",
            "error",
            "-xerror",
            "-protocol_whitelist",
            "file",
            *span,
            "-i",
            f"file:{path}",
            "-map",
            "0",
            "-sn",  # subtitles and data are not decoded media; the null muxer has no encoder for them
            "-dn",
            "-f",
            "null",
            "-",
        ]
        proc = subprocess.run(argv, capture_output=True, stdin=subprocess.DEVNULL, timeout=3600)
        text = redact(proc.stderr.decode("utf-8", "replace").strip())
        with open(log, "ab") as f:
            f.write(f"[decode {' '.join(span) or 'full'}] exit {proc.returncode}\n{text}\n".encode())
        if proc.returncode != 0 or text:
            errors.extend(text.splitlines()[:3] or [f"exit status {proc.returncode}"])
    label = "full" if windows is None else f"{len(windows)} windows of {cfg.validation.sample_seconds:g} s"
    return Check(
        name="decode",
        expected=f"no decoder errors ({label})",
        actual="; ".join(errors[:3]) or "clean",
        ok=not errors,
    )


def validate(candidate: Path, container: str, expect: Expect, cfg: Config, log: Path) -> ValidationReport:
    """Run the whole gate on a candidate file."""
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
    if info is not None and cfg.validation.decode_check != "none":
        checks.append(decode_check(candidate, cfg, expect.duration, log))
    return ValidationReport(
        ok=all(c.ok for c in checks),
        decode_check=cfg.validation.decode_check,
        checks=checks,
        seconds=round(time.monotonic() - started, 3),
    )
