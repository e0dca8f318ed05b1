"""Poster frames: a small JPEG of each published video, made after publish.

``thumbs/<sha256>.jpg`` is named by the output's content hash, like the store
file it shows: equal outputs share one, and every name is 64 hex digits plus
``.jpg``, so nothing in a URL can steer the status page to another file.

A thumbnail is a courtesy. Making one never fails or delays a job: the daemon
makes it on a background thread after the job is already complete
(``spoold.observers.Thumbnails``), and a missing one is shown as "no preview".
Thumbnails are hints, written atomically but without fsync.

FFmpeg runs with a fixed argument list (seek, one frame, scale, MJPEG to a
pipe), never through a shell, under the file-only protocol whitelist that
probing uses, with a timeout and at low priority.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from spool.core.config import Config
from spool.core.model import Manifest
from spool.disk.tree import Tree, make_dirs, write_atomic
from spool.media import probe

#: The folder of thumbnails, under the spool root.
FOLDER = "thumbs"
#: A thumbnail's name without ``.jpg``: a sha256 in hex.
#: A poster frame is taken this far into the video (capped at ``_MAX_AT`` seconds).
_AT = 1 / 3
_MAX_AT = 10.0
_TIMEOUT = 60.0
_MAX_BYTES = 4 << 20


class ThumbnailError(Exception):
    """No poster frame could be made (the reason is the message)."""


def folder(tree: Tree) -> Path:
    return tree.root / FOLDER


def path(tree: Tree, digest: str) -> Path:
    return tree.digest_file(FOLDER, digest, ".jpg")


def url(tree: Tree, digest: str) -> str | None:
    """The thumbnail's path relative to the spool root (and the status page), if it exists."""
    try:
        p = path(tree, digest)
    except ValueError:
        return None
    return f"{FOLDER}/{digest}.jpg" if p.is_file() else None


def poster_time(duration: float | None) -> float:
    """Where the poster frame is taken: a third in, at most ``_MAX_AT`` seconds."""
    return 0.0 if not duration or duration <= 0 else round(min(duration * _AT, _MAX_AT), 3)


def grab(source: Path, at: float, width: int, ffmpeg: str = "ffmpeg") -> bytes:
    """One frame of ``source`` at ``at`` seconds, ``width`` pixels wide, as JPEG bytes."""
    argv = [
        ffmpeg,
        "-nostdin",
        "-hide_banner",
        "-loglevel",
        "error",
        "-protocol_whitelist",
        "file",
        "-ss",
        f"{at:.3f}",
        "-i",
        f"file:{source}",
        "-map",
        "0:v:0",
        "-frames:v",
        "1",
        "-vf",
        f"scale={width}:-2",  # width px wide, height in proportion and even
        "-q:v",
        "5",
        "-f",
        "mjpeg",
        "pipe:1",
    ]
    try:
        proc = subprocess.run(
            argv,
            capture_output=True,
            timeout=_TIMEOUT,
            stdin=subprocess.DEVNULL,
            preexec_fn=lambda: os.nice(10),  # one system call in the child, nothing that locks
        )
    except subprocess.TimeoutExpired:
        raise ThumbnailError(f"FFmpeg took longer than {_TIMEOUT:g} s") from None
    except OSError as exc:
        raise ThumbnailError(f"FFmpeg could not run ({exc.strerror})") from None
    data = proc.stdout
    if proc.returncode != 0 or not data.startswith(b"\xff\xd8") or len(data) > _MAX_BYTES:
        err = proc.stderr.decode(errors="replace").strip().splitlines()
        raise ThumbnailError(f"FFmpeg made no frame at {at:g} s: {err[-1] if err else 'no output'}")
    return data


def make(tree: Tree, cfg: Config, manifest: Manifest) -> Path | None:
    """Make the poster frame of a published output unless it exists; ``None``
    when the output has no video or thumbnails are off. Raises ThumbnailError."""
    width = cfg.observe.thumbnail_width
    if width == 0:
        return None
    out = path(tree, manifest.output.sha256)
    if out.is_file():
        return out
    source = tree.root / manifest.output.store_path
    try:
        info = probe.ffprobe(source, cfg.render.ffprobe, timeout=_TIMEOUT)
    except probe.ProbeError as exc:
        raise ThumbnailError(f"{manifest.output.store_path} cannot be probed: {exc}") from None
    if not any(s.get("codec_type") == "video" for s in info.get("streams", [])):
        return None
    try:
        duration = float(info.get("format", {}).get("duration") or 0)
    except ValueError:
        duration = 0.0
    width -= width % 2
    at = poster_time(duration)
    try:
        data = grab(source, at, width, cfg.render.ffmpeg)
    except ThumbnailError:
        if at == 0:
            raise
        data = grab(source, 0.0, width, cfg.render.ffmpeg)  # a short or odd file: its first frame
    make_dirs(out.parent)
    write_atomic(out, data, durable=False)
    return out
