"""ffprobe, run safely, and the short summaries spool keeps of what it says.

ffprobe opens only ``file:`` URLs under a file-only protocol whitelist, with a
timeout, and never through a shell. Playlist and concat formats are refused by
callers (see :data:`INDIRECT_FORMATS`): they name other files.
"""

from __future__ import annotations

import json
import subprocess
from fractions import Fraction
from pathlib import Path
from typing import Any

from spool.core.model import AudioInfo, ProbeSummary, VideoInfo

#: Demuxers whose "media" is a list of other files or URLs.
INDIRECT_FORMATS = frozenset({"hls", "applehttp", "concat", "dash", "ffconcat", "m3u8", "sdp", "rtsp"})
#: Demuxers of single still images.
_STILL_FORMATS = frozenset(
    {
        "image2",
        "png_pipe",
        "jpeg_pipe",
        "webp_pipe",
        "bmp_pipe",
        "tiff_pipe",
        "gif_pipe",
        "svg_pipe",
        "ppm_pipe",
        "pgm_pipe",
        "qoi_pipe",
    }
)


class ProbeError(Exception):
    """ffprobe could not read the file as media."""


def ffprobe(path: Path | str, ffprobe_bin: str = "ffprobe", timeout: float = 60.0) -> dict[str, Any]:
    """Streams and format of ``path`` as ffprobe's JSON."""
    argv = [
        ffprobe_bin,
        "-v",
        "error",
        "-protocol_whitelist",
        "file",
        "-show_format",
        "-show_streams",
        "-of",
        "json",
        f"file:{path}",
    ]
    try:
        proc = subprocess.run(argv, capture_output=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise ProbeError(f"ffprobe took longer than {timeout:g} s") from None
    except FileNotFoundError:
        raise ProbeError(f"{ffprobe_bin} is not installed") from None
    err = proc.stderr.decode("utf-8", "replace").strip().splitlines()
    if proc.returncode != 0:
        raise ProbeError(err[-1] if err else f"ffprobe exited with {proc.returncode}")
    try:
        info = json.loads(proc.stdout)
    except ValueError:
        raise ProbeError("ffprobe printed no readable report") from None
    if not info.get("streams"):
        raise ProbeError("no audio or video streams found")
    return dict(info)


def rate(text: str | None) -> float:
    """``"30000/1001"`` -> 29.97; ``"0/0"`` or nothing -> 0.0."""
    if not text:
        return 0.0
    try:
        f = Fraction(text)
    except (ValueError, ZeroDivisionError):
        return 0.0
    return float(f)


def _float(x: Any) -> float | None:
    try:
        return float(x)
    except (TypeError, ValueError):
        return None


def streams_of(info: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    """The streams of one type, ignoring cover art (``attached_pic``)."""
    out = []
    for s in info.get("streams", []):
        if s.get("codec_type") != kind:
            continue
        if kind == "video" and s.get("disposition", {}).get("attached_pic"):
            continue
        out.append(s)
    return out


def summarize(info: dict[str, Any]) -> ProbeSummary:
    fmt = info.get("format", {})
    name = str(fmt.get("format_name", "unknown"))
    video = streams_of(info, "video")
    audio = streams_of(info, "audio")
    v = a = None
    if video:
        s = video[0]
        fps = rate(s.get("avg_frame_rate")) or rate(s.get("r_frame_rate"))
        v = VideoInfo(
            codec=str(s.get("codec_name", "unknown")),
            width=int(s.get("width") or 0),
            height=int(s.get("height") or 0),
            fps=round(fps, 3),
            pix_fmt=s.get("pix_fmt"),
        )
    if audio:
        s = audio[0]
        a = AudioInfo(
            codec=str(s.get("codec_name", "unknown")),
            channels=int(s.get("channels") or 0),
            sample_rate=int(s.get("sample_rate") or 0),
        )
    still = name in _STILL_FORMATS or (
        v is not None and not audio and (video[0].get("nb_frames") in ("1", 1))
    )
    duration = None if still else _float(fmt.get("duration"))
    return ProbeSummary(
        format=name,
        duration=round(duration, 3) if duration is not None else None,
        still=still,
        video=v,
        audio=a,
        streams=len(info.get("streams", [])),
    )


def ebml_doctype(path: Path | str) -> str | None:
    """The DocType of a Matroska/WebM file ("webm" or "matroska"), from its EBML header."""
    try:
        with open(path, "rb") as f:
            head = f.read(4096)
    except OSError:
        return None
    i = head.find(b"\x42\x82")  # the DocType element's ID
    if i < 0 or i + 3 > len(head):
        return None
    first = head[i + 2]
    width = next((n for n in range(8) if first & (0x80 >> n)), None)
    if width is None:
        return None
    size = first & (0xFF >> (width + 1))
    for b in head[i + 3 : i + 3 + width]:
        size = (size << 8) | b
    start = i + 3 + width
    return head[start : start + size].decode("ascii", "replace") or None


def is_indirect(info: dict[str, Any]) -> bool:
    """Formats that are lists of other files: never accepted as sources."""
    names = set(str(info.get("format", {}).get("format_name", "")).split(","))
    return bool(names & INDIRECT_FORMATS)
