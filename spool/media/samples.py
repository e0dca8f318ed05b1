"""Sample media made by FFmpeg's lavfi sources, for the demo, the tests and benchmarks.

Real files, really encoded: a product clip with a tone, a logo PNG with
transparency, and a music bed. Nothing here is needed to run a spool.
"""

from __future__ import annotations

import subprocess
from pathlib import Path


def _ffmpeg(args: list[str], ffmpeg: str = "ffmpeg") -> None:
    subprocess.run(
        [ffmpeg, "-nostdin", "-hide_banner", "-loglevel", "error", "-y", *args],
        check=True,
        stdin=subprocess.DEVNULL,
    )


def clip(
    path: Path,
    *,
    seconds: float = 4.0,
    size: str = "640x360",
    rate: int = 25,
    audio: bool = True,
    codec: str = "libx264",
    ffmpeg: str = "ffmpeg",
) -> Path:
    """A moving test picture (the "product shot") with a 440 Hz tone."""
    args = ["-f", "lavfi", "-i", f"testsrc2=size={size}:rate={rate}:duration={seconds}"]
    if audio:
        args += ["-f", "lavfi", "-i", f"sine=frequency=440:sample_rate=48000:duration={seconds}"]
    args += ["-c:v", codec, "-pix_fmt", "yuv420p", "-g", str(rate)]
    if codec == "libx264":
        args += ["-preset", "veryfast"]
    if audio:
        args += ["-c:a", "aac", "-b:a", "96k", "-shortest"]
    _ffmpeg([*args, str(path)], ffmpeg)
    return path


def logo(path: Path, *, size: str = "240x120", ffmpeg: str = "ffmpeg") -> Path:
    """A gold diamond badge with a navy bar, on a transparent background (PNG)."""
    _ffmpeg(
        [
            "-f",
            "lavfi",
            "-i",
            f"color=c=gold:size={size},format=rgba,"
            "drawbox=x=iw*0.3:y=ih*0.35:w=iw*0.4:h=ih*0.3:color=navy:t=fill,"
            "geq=r='r(X,Y)':g='g(X,Y)':b='b(X,Y)':a='if(lte(abs(X-W/2)/W+abs(Y-H/2)/H,0.5),255,0)'",
            "-frames:v",
            "1",
            str(path),
        ],
        ffmpeg,
    )
    return path


def music(path: Path, *, seconds: float = 8.0, ffmpeg: str = "ffmpeg") -> Path:
    """A soft two-note chord with a slow pulse: a stand-in music bed."""
    expr = "0.2*sin(2*PI*220*t)*(0.6+0.4*sin(2*PI*0.5*t))+0.15*sin(2*PI*330*t)"
    _ffmpeg(
        [
            "-f",
            "lavfi",
            "-i",
            f"aevalsrc={expr}|{expr}:s=48000:d={seconds}",
            "-c:a",
            "aac",
            "-b:a",
            "128k",
            str(path),
        ],
        ffmpeg,
    )
    return path


def demo_assets(folder: Path) -> dict[str, Path]:
    """Everything the demo's mug ad needs, made once (existing files are kept)."""
    folder.mkdir(parents=True, exist_ok=True)
    made = {
        "clip": folder / "mug-shot.mp4",
        "logo": folder / "logo.png",
        "music": folder / "music-bed.m4a",
    }
    if not made["clip"].exists():
        clip(made["clip"], seconds=6.0, size="1280x720")
    if not made["logo"].exists():
        logo(made["logo"])
    if not made["music"].exists():
        music(made["music"], seconds=10.0)
    return made
