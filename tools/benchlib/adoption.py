"""Adoption: ``spool library adopt`` of an existing folder against ``sha256sum`` of the same files.

Hashing every file is the floor of adopting a library (each must be read to
be named), so ``sha256sum`` of the same files, as an operator would run it
from a shell, is the peer. Two folders, both made by FFmpeg on the local disk
and read from the page cache by both sides:

* many files (``adopt_files``): short clips in a real folder layout
  (``<campaign>/<locale>/<spot>.mp4``), where the per-file work (one ffprobe,
  the publish path's fsyncs) decides the pace, not hashing;
* a few large files (``adopt_bytes``): the same clip remuxed with a different
  comment each, where hashing decides it (adoption reads each file three
  times: at acceptance, in the gate, in the store; the second and third
  from the page cache).

Each round adopts into a fresh spool (the files are linked, so nothing is
copied); ``sha256sum`` runs in the same round.
"""

from __future__ import annotations

import csv
import os
import subprocess
from pathlib import Path

from .common import SPOOL, Row, interleave, log, make_spool, median, pair_ratios, run_timed, scratch

#: mode -> (small files, rounds, large files, MiB each)
PLAN: dict[str, tuple[int, int, int, int]] = {
    "full": (10_000, 1, 8, 256),
    "quick": (2_000, 1, 6, 128),
    "smoke": (40, 1, 2, 8),
}
TAGS = ("campaign", "locale", "asset_type", "visibility")


def keys(mode: str) -> list[str]:
    return ["library.adopt_files", "library.adopt_bytes"]


def _ffmpeg(*args: str) -> None:
    subprocess.run(["ffmpeg", "-v", "error", "-nostdin", "-y", *args], check=True, timeout=3600)


def small_folder(root: Path, n: int) -> list[Path]:
    """``n`` distinct two-frame clips from one FFmpeg run, laid out in folders."""
    flat = root.parent / "segments"
    flat.mkdir(parents=True)
    _ffmpeg(
        "-f", "lavfi", "-i", "testsrc=size=32x18:rate=10", "-f", "lavfi", "-i", "sine=sample_rate=8000",
        "-t", f"{n * 0.2 + 0.1:.1f}", "-c:v", "libx264", "-preset", "ultrafast", "-g", "2",
        "-keyint_min", "2", "-sc_threshold", "0", "-c:a", "aac", "-b:a", "16k",
        "-f", "segment", "-segment_time", "0.2", "-reset_timestamps", "1", "-segment_format", "mp4",
        str(flat / "c%05d.mp4"),
    )  # fmt: skip
    out = []
    for i, seg in enumerate(sorted(flat.iterdir())[:n]):
        dest = root / f"campaign-{i % 7}" / ["en-GB", "fr-FR", "de-DE"][i % 3] / f"spot-{i:05d}.mp4"
        dest.parent.mkdir(parents=True, exist_ok=True)
        os.rename(seg, dest)
        out.append(dest)
    return out


def large_folder(root: Path, n: int, mib: int) -> list[Path]:
    """``n`` distinct files of about ``mib`` MiB: one high-bitrate clip, remuxed with a
    different comment each (a copy of the packets, so it is fast)."""
    root.mkdir(parents=True)
    base = root.parent / "base.mp4"
    seconds = max(1, round(mib / 1.6))  # lossless 720p test picture: about 1.6 MiB a second
    _ffmpeg(
        "-f", "lavfi", "-i", f"testsrc2=size=1280x720:rate=25:duration={seconds}",
        "-c:v", "libx264", "-preset", "ultrafast", "-qp", "0", str(base),
    )  # fmt: skip
    out = []
    for i in range(n):
        dest = root / f"master-{i:02d}.mp4"
        _ffmpeg("-i", str(base), "-c", "copy", "-metadata", f"comment=copy {i}", str(dest))
        out.append(dest)
    return out


def _tags(folder: Path, files: list[Path], path: Path) -> None:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["path", *TAGS])
        for p in files:
            w.writerow([p.relative_to(folder).as_posix(), "bench", "en-GB", "spot", "internal"])


def _measure(d: Path, folder: Path, files: list[Path], rounds: int, label: str) -> dict[str, list[float]]:
    tags = d / f"{label}.csv"
    _tags(folder, files, tags)
    count = [0]

    def adopt() -> float:
        count[0] += 1
        spool = make_spool(d / f"spool-{label}-{count[0]}", {}, [str(folder)])
        r = run_timed([SPOOL, "library", "adopt", str(folder), "--tags", str(tags), "--spool", str(spool)])
        if r.returncode != 0:
            raise RuntimeError(f"spool library adopt exited {r.returncode}")
        return r.wall

    def sha256sum() -> float:
        r = run_timed(["sha256sum", *map(str, files)])
        if r.returncode != 0:
            raise RuntimeError("sha256sum failed")
        return r.wall

    run_timed(["sha256sum", *map(str, files)])  # the page cache, warm for both sides
    return interleave(rounds, {"adopt": adopt, "sha256sum": sha256sum})


def run(mode: str) -> tuple[list[Row], list[str]]:
    n, rounds, big, mib = PLAN[mode]
    rows = []
    with scratch("disk", "adopt") as d:
        folder = d / "library"
        files = small_folder(folder, n)
        size = sum(p.stat().st_size for p in files)
        log(f"adopt: {n:,} files ({size / 2**20:.1f} MiB) made; {rounds} round(s) against sha256sum")
        res = _measure(d, folder, files, rounds, "small")
        ratio = median(pair_ratios(res["adopt"], res["sha256sum"]))
        secs = median(res["adopt"])
        rows.append(
            Row(
                key="library.adopt_files",
                measure=f"spool library adopt, {n:,} short clips in folders, vs sha256sum",
                unit="s",
                spool=secs,
                peer="sha256sum",
                peer_value=median(res["sha256sum"]),
                ratio=ratio,
                note=f"{n / secs:.1f} files/s; per file one ffprobe and the publish path's fsyncs",
                samples=res,
            )
        )
        folder = d / "masters"
        files = large_folder(folder, big, mib)
        size = sum(p.stat().st_size for p in files)
        log(f"adopt: {big} files of {size / big / 2**20:.0f} MiB made")
        res = _measure(d, folder, files, max(rounds, 3 if mode != "smoke" else 1), "large")
        ratio = median(pair_ratios(res["adopt"], res["sha256sum"]))
        secs = median(res["adopt"])
        rows.append(
            Row(
                key="library.adopt_bytes",
                measure=f"spool library adopt, {big} files of {size / big / 2**20:.0f} MiB, vs sha256sum",
                unit="s",
                spool=secs,
                peer="sha256sum",
                peer_value=median(res["sha256sum"]),
                ratio=ratio,
                note=f"{size / secs / 2**20:.0f} MiB/s adopted; "
                f"sha256sum {size / median(res['sha256sum']) / 2**20:.0f} MiB/s",
                samples=res,
            )
        )
    notes = [
        "adopt: spool library adopt into a fresh spool per round (files linked, read from the page "
        "cache) against sha256sum of the same files in the same round; adopt_files has many short "
        "clips in folders, adopt_bytes a few large ones."
    ]
    return rows, notes
