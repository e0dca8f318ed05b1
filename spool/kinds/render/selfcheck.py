"""The start self-check: before a daemon claims anything, it renders a tiny clip
with every step kind and every encoder of the recipe vocabulary, with this
host's FFmpeg and the configured font. A step that fails means this host would
fail every job that uses it, so the worker quarantines itself with the step
named (:mod:`spool.queue.health`) instead of draining the queue into ``failed/``.

A pass is a fact about the host, not the spool: it is remembered for a day in
``/var/tmp/spool-<uid>/selfcheck-<key>.json`` (``SPOOL_CACHE_DIR`` moves it),
keyed by the FFmpeg binary (path, size, mtime), the font and spool's version,
so a restart with nothing changed costs one stat and any change runs it again.
Where that folder cannot be written the check simply runs at every start.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import msgspec

from spool.core import version
from spool.core.config import Config
from spool.core.model import Record, encode
from spool.disk.tree import write_atomic
from spool.kinds.base import SelfCheck
from spool.kinds.render import ffcommand, recipe
from spool.media import samples, sources

_FAST = {"op": "encode", "preset": "ultrafast"}

#: step name -> (recipe steps, extra sources it needs, output file)
CHECKS: dict[str, tuple[list[dict[str, Any]], list[str], str]] = {
    "trim, fit, fps, h264": (
        [
            {"op": "trim", "duration": 0.4},
            {"op": "fit", "width": 96, "height": 96},
            {"op": "fps", "fps": 12},
            _FAST,
        ],
        [],
        "a.mp4",
    ),
    "text": ([{"op": "text", "text": "Check £9.99 – ü", "size": 12}, _FAST], [], "b.mp4"),
    "overlay": ([{"op": "overlay", "source": "logo", "scale": 0.3}, _FAST], ["logo"], "c.mp4"),
    "audio mix": ([{"op": "audio", "mode": "mix", "source": "music"}, _FAST], ["music"], "d.mp4"),
    "hevc": ([{"op": "encode", "video_codec": "hevc", "preset": "ultrafast"}], [], "e.mp4"),
    "vp9": ([{"op": "encode", "container": "webm", "video_codec": "vp9"}], [], "f.webm"),
    "prores": ([{"op": "encode", "container": "mov", "video_codec": "prores"}], [], "g.mov"),
}


def check_font(font_file: str) -> str | None:
    """Why text steps would not get the font they ask for, or ``None``.

    FFmpeg's drawtext silently falls back to another font when ``fontfile`` is
    missing, so a render alone would not notice: the font is checked here.
    """
    if font_file:
        p = Path(font_file)
        if not p.is_file():
            return f"[render] font_file {font_file} does not exist on this host"
        probe = subprocess.run(["fc-query", "--format=%{family}", str(p)], capture_output=True, timeout=30)
        if probe.returncode != 0 or not probe.stdout.strip():
            return f"[render] font_file {font_file} is not a font fontconfig can read"
        return None
    try:
        match = subprocess.run(["fc-match", "--format=%{file}", "Sans"], capture_output=True, timeout=30)
    except OSError:
        return "fontconfig (fc-match) is not installed, so drawtext has no font for text steps"
    found = match.stdout.decode("utf-8", "replace").strip()
    if match.returncode != 0 or not found or not Path(found).is_file():
        return "fontconfig finds no Sans font on this host (install fonts-dejavu-core)"
    return None


#: How long a remembered pass is trusted (a shared library can change under a binary).
TRUST_SECONDS = 86400.0


class SelfCheckRecord(Record, kw_only=True):
    """A remembered pass: what it checked, when, and how long it took."""

    key: str
    passed_at: float
    seconds: float


#: How the check went (``detail``: FFmpeg's last lines, or why the check could not run).
Result = SelfCheck


def _key(cfg: Config) -> str:
    exe = shutil.which(cfg.render.ffmpeg) or cfg.render.ffmpeg
    try:
        st = Path(exe).stat()
        binary = f"{Path(exe).resolve()}:{st.st_size}:{st.st_mtime_ns}"
    except OSError:
        binary = f"{exe}:missing"
    return f"{binary}|font={cfg.render.font_file}|spool={version.installed()}|checks={','.join(CHECKS)}"


def _memo(key: str) -> Path:
    folder = Path(os.environ.get("SPOOL_CACHE_DIR") or f"/var/tmp/spool-{os.getuid()}")
    return folder / f"selfcheck-{hashlib.sha256(key.encode()).hexdigest()[:16]}.json"


def run(cfg: Config) -> Result:
    """Run every check (or trust a recent pass for the same FFmpeg and font)."""
    key = _key(cfg)
    memo = _memo(key)
    try:
        rec = msgspec.json.decode(memo.read_bytes(), type=SelfCheckRecord)
        if rec.key == key and time.time() - rec.passed_at < TRUST_SECONDS:
            return Result(True, "", "", 0.0, cached=True)
    except (OSError, msgspec.DecodeError, msgspec.ValidationError):
        pass
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="spool-selfcheck-") as tmp:
        result = _run_checks(Path(tmp), cfg)
    seconds = round(time.monotonic() - t0, 2)
    if result is not None:
        return Result(False, result[0], result[1], seconds)
    try:
        memo.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        write_atomic(
            memo, encode(SelfCheckRecord(key=key, passed_at=time.time(), seconds=seconds)), durable=False
        )
    except OSError:
        pass  # not remembered: the next start checks again
    return Result(True, "", "", seconds)


def _run_checks(folder: Path, cfg: Config) -> tuple[str, str] | None:
    """The first failing (step, detail), or ``None`` when every check passes."""
    font = check_font(cfg.render.font_file)
    if font is not None:
        return "text font", font
    ff = cfg.render.ffmpeg
    try:
        media = {
            "clip": samples.clip(folder / "clip.mp4", seconds=0.6, size="96x64", rate=12, ffmpeg=ff),
            "logo": samples.logo(folder / "logo.png", size="32x16", ffmpeg=ff),
            "music": samples.music(folder / "music.m4a", seconds=1.0, ffmpeg=ff),
        }
        described = {role: sources.describe(role, path, cfg) for role, path in media.items()}
    except (OSError, subprocess.CalledProcessError, Exception) as exc:
        return "test media", f"FFmpeg could not make the test clip ({type(exc).__name__}: {exc})"
    for step, (steps, extra, out) in CHECKS.items():
        rec = msgspec.convert({"input": "clip", "steps": steps}, recipe.Recipe)
        srcs = {r: described[r] for r in ["clip", *extra]}
        cmd = ffcommand.command(rec, srcs, out, cfg.render)
        work = folder / step.replace(" ", "-").replace(",", "")
        work.mkdir()
        for name, data in cmd.files.items():
            (work / name).write_bytes(data)
        try:
            proc = subprocess.run(
                cmd.argv, cwd=work, capture_output=True, timeout=60, stdin=subprocess.DEVNULL
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            return step, f"FFmpeg could not run ({exc})"
        made = work / out
        if proc.returncode != 0 or not made.is_file() or made.stat().st_size == 0:
            tail = proc.stderr.decode("utf-8", "replace").strip().splitlines()[-3:]
            return step, f"exit status {proc.returncode}: " + " | ".join(tail)
    return None
