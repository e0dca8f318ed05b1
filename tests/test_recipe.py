"""Recipes rendered for real: every step's effect checked with ffprobe and decoded pixels or samples.

Each render goes accept -> claim -> execute, so every job here also passed the
validation gate and was published with a manifest. Nothing mocks FFmpeg.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import shutil
import struct
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import pytest
from conftest import minimal, submission

from spool.core.config import Config
from spool.core.errors import InvalidInput
from spool.core.model import Failure, Manifest, Source, decode
from spool.disk.tree import Tree
from spool.kinds import Job
from spool.kinds.render import ffcommand, recipe
from spool.media import probe
from spool.queue import accept, claim, execute
from spool.queue.events import Journal

# -- helpers -------------------------------------------------------------------------------


def run_one(tree: Tree, cfg: Config, journal: Journal, sub: dict, worker: str = "w1") -> tuple[Job, str]:
    job = accept.accept_bytes(tree, cfg, json.dumps(sub).encode(), "tester")
    assert claim.claim(tree, worker, job.job_id)
    ctx = execute.Context(tree, cfg, worker, journal, threading.Event())
    return job, execute.execute(ctx, job.job_id)


@dataclass
class Rendered:
    job: Job
    manifest: Manifest
    path: Path  # the published store file
    info: dict[str, Any]  # ffprobe of it

    def video(self) -> dict[str, Any]:
        (v,) = probe.streams_of(self.info, "video")
        return v

    def audio(self) -> list[dict[str, Any]]:
        return probe.streams_of(self.info, "audio")

    @property
    def duration(self) -> float:
        return float(self.info["format"]["duration"])


def render(tree: Tree, cfg: Config, journal: Journal, sub: dict) -> Rendered:
    """Render ``sub`` and insist it completed: validated, stored, with a manifest."""
    job, outcome = run_one(tree, cfg, journal, sub)
    failure = tree.attempt_dir(job.job_id, 1) / "failure.json"
    why = decode(failure.read_bytes(), Failure) if failure.exists() else None
    assert outcome == "complete", f"{job.job_id} ended {outcome}: {why}"
    assert (tree.complete / f"{job.job_id}.json").exists()
    m = decode(tree.manifest_file(job.job_id).read_bytes(), Manifest)
    assert m.validation.ok and not m.validation.failed()
    path = tree.root / m.output.store_path
    assert hashlib.sha256(path.read_bytes()).hexdigest() == m.output.sha256
    return Rendered(job, m, path, probe.ffprobe(path))


def ffmpeg(*args: str | Path) -> bytes:
    proc = subprocess.run(
        ["ffmpeg", "-nostdin", "-hide_banner", "-v", "error", "-y", *map(str, args)],
        capture_output=True,
        check=True,
        stdin=subprocess.DEVNULL,
    )
    return proc.stdout


@dataclass
class Frame:
    """One decoded picture as packed RGB24."""

    w: int
    h: int
    data: bytes

    def px(self, x: int, y: int) -> tuple[int, int, int]:
        i = (y * self.w + x) * 3
        r, g, b = self.data[i : i + 3]
        return r, g, b

    def region(self, x0: int, y0: int, x1: int, y1: int) -> bytes:
        return b"".join(self.data[(y * self.w + x0) * 3 : (y * self.w + x1) * 3] for y in range(y0, y1))

    def dark_fraction(self, x0: int, y0: int, x1: int, y1: int, limit: int = 24) -> float:
        """Share of pixels in the box whose every channel is at most ``limit`` (black)."""
        pix = self.region(x0, y0, x1, y1)
        n = len(pix) // 3
        return sum(1 for i in range(0, len(pix), 3) if max(pix[i : i + 3]) <= limit) / n


def grab(path: Path, t: float) -> Frame:
    """The frame shown at ``t`` seconds, decoded to RGB24."""
    v = probe.streams_of(probe.ffprobe(path), "video")[0]
    w, h = int(v["width"]), int(v["height"])
    data = ffmpeg("-ss", f"{t:g}", "-i", path, "-frames:v", "1", "-f", "rawvideo", "-pix_fmt", "rgb24", "-")
    assert len(data) == w * h * 3, f"expected one {w}x{h} frame at {t} s"
    return Frame(w, h, data)


def mad(a: bytes, b: bytes) -> float:
    """Mean absolute difference of two equally long byte strings."""
    assert len(a) == len(b) and a
    return sum(abs(x - y) for x, y in zip(a, b, strict=True)) / len(a)


def changed(a: bytes, b: bytes, by: int = 48) -> int:
    """How many bytes differ by more than ``by``."""
    return sum(1 for x, y in zip(a, b, strict=True) if abs(x - y) > by)


def tone_levels(path: Path, freqs: tuple[float, ...], start: float = 0.2, length: float = 0.6) -> list[float]:
    """Amplitude (0..1 of full scale) of each frequency in the first audio stream (Goertzel)."""
    rate = 8000
    raw = ffmpeg(
        "-ss", f"{start:g}", "-t", f"{length:g}", "-i", path,
        "-map", "0:a:0", "-ac", "1", "-ar", str(rate), "-f", "s16le", "-",
    )  # fmt: skip
    samples = [s / 32768.0 for (s,) in struct.iter_unpack("<h", raw)]
    n = len(samples)
    assert n > rate * length * 0.9
    out = []
    for f in freqs:
        coeff = 2 * math.cos(2 * math.pi * f / rate)
        s1 = s2 = 0.0
        for x in samples:
            s1, s2 = x + coeff * s1 - s2, s1
        power = s1 * s1 + s2 * s2 - coeff * s1 * s2
        out.append(2 * math.sqrt(max(power, 0.0)) / n)
    return out


def integrated_loudness(path: Path) -> float:
    """Integrated loudness (LUFS) measured by FFmpeg's EBU R128 scanner."""
    proc = subprocess.run(
        ["ffmpeg", "-nostdin", "-hide_banner", "-nostats", "-i", str(path), "-map", "0:a:0",
         "-af", "ebur128", "-f", "null", "-"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    summary = proc.stderr.rpartition("Summary:")[2]
    m = re.search(r"I:\s+(-?[0-9.]+) LUFS", summary)
    assert m, proc.stderr[-2000:]
    return float(m.group(1))


def top_level_boxes(path: Path) -> list[str]:
    """The ISO-BMFF / QuickTime top-level box types, in file order, read from the bytes."""
    data = path.read_bytes()
    boxes, pos = [], 0
    while pos + 8 <= len(data):
        size, kind = struct.unpack(">I4s", data[pos : pos + 8])
        if size == 1:
            (size,) = struct.unpack(">Q", data[pos + 8 : pos + 16])
        elif size == 0:
            size = len(data) - pos
        assert size >= 8, f"bad box at {pos}"
        boxes.append(kind.decode("latin-1"))
        pos += size
    assert pos == len(data), "boxes do not tile the file"
    return boxes


def ftyp_brand(path: Path) -> str:
    data = path.read_bytes()[:16]
    assert data[4:8] == b"ftyp"
    return data[8:12].decode("latin-1")


def sub_with(assets: Path, name: str, steps: list[dict], **sources: str) -> dict:
    """A submission of ``steps`` whose sources are files in ``assets`` (default: the clip)."""
    srcs = {role: str(assets / f) for role, f in (sources or {"clip": "clip.mp4"}).items()}
    inp = "clip" if "clip" in srcs else next(iter(srcs))
    s = minimal(assets, name=name, steps=steps, sources=srcs)
    s["recipe"]["input"] = inp
    return s


ENC = {"op": "encode", "preset": "ultrafast"}


@pytest.fixture(scope="module")
def extra_media(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("recipe-media")
    blue, tone = d / "blue.mp4", d / "tone1000.m4a"
    # A static picture (flat blue) with a 440 Hz tone: identical frames make pixel checks exact.
    ffmpeg(
        "-f", "lavfi", "-i", "color=c=blue:size=320x240:rate=25:duration=2",
        "-f", "lavfi", "-i", "sine=frequency=440:sample_rate=48000:duration=2",
        "-c:v", "libx264", "-preset", "ultrafast", "-pix_fmt", "yuv420p", "-g", "25",
        "-c:a", "aac", "-shortest", blue,
    )  # fmt: skip
    # A 1 kHz bed, easy to tell from the clip's 440 Hz tone.
    ffmpeg("-f", "lavfi", "-i", "sine=frequency=1000:sample_rate=48000:duration=3", "-c:a", "aac", tone)
    return {"blue": blue, "tone": tone}


@pytest.fixture()
def more(assets: Path, extra_media: dict[str, Path]) -> Path:
    """The asset root, with the static blue clip and the 1 kHz bed added."""
    for p in extra_media.values():
        shutil.copyfile(p, assets / p.name)
    return assets


# -- trim ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("start", "duration", "expected"),
    [(0.4, 1.0, 1.0), (0.0, 0.6, 0.6), (0.8, None, 1.2)],
)
def test_trim_sets_duration_and_start(tree, cfg, journal, assets, start, duration, expected):
    trim: dict[str, Any] = {"op": "trim", "start": start}
    if duration is not None:
        trim["duration"] = duration
    r = render(tree, cfg, journal, sub_with(assets, "trim", [trim, ENC]))
    assert r.job.output.expect.duration == pytest.approx(expected)
    assert r.duration == pytest.approx(expected, abs=0.08)
    assert float(r.video()["duration"]) == pytest.approx(expected, abs=0.08)
    # The first output frame is the source's frame at `start`, not at 0 (or elsewhere).
    src = assets / "clip.mp4"
    first = grab(r.path, 0.0).data
    at_start = mad(first, grab(src, start).data)
    for other in {0.0, 1.6} - {start}:
        assert at_start * 2 < mad(first, grab(src, other).data)


# -- fit --------------------------------------------------------------------------------------

# width, height, the black bars (x0, y0, x1, y1) a 320x240 (4:3) source gets when padded (pillarbox
# columns in 16:9, letterbox rows in 9:16 and 1:1), and the picture area between them.
VARIANTS = {
    "16:9": (320, 180, [(0, 0, 40, 180), (280, 0, 320, 180)], (40, 0, 280, 180)),
    "9:16": (180, 320, [(0, 0, 180, 92), (0, 228, 180, 320)], (0, 92, 180, 228)),
    "1:1": (240, 240, [(0, 0, 240, 30), (0, 210, 240, 240)], (0, 30, 240, 210)),
}


def _inset(box: tuple[int, int, int, int], by: int = 4) -> tuple[int, int, int, int]:
    x0, y0, x1, y1 = box
    return x0 + by, y0 + by, x1 - by, y1 - by


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_fit_pad_puts_black_bars_where_the_aspect_differs(tree, cfg, journal, assets, variant):
    w, h, bars, picture = VARIANTS[variant]
    steps = [{"op": "trim", "duration": 0.5}, {"op": "fit", "width": w, "height": h, "mode": "pad"}, ENC]
    r = render(tree, cfg, journal, sub_with(assets, "pad", steps))
    v = r.video()
    assert (v["width"], v["height"]) == (w, h)
    assert v.get("sample_aspect_ratio", "1:1") in ("1:1", "0:1")
    f = grab(r.path, 0.2)
    for bar in bars:
        assert f.dark_fraction(*_inset(bar)) > 0.99, f"{variant}: bar {bar} is not black"
    assert f.dark_fraction(*_inset(picture)) < 0.5, f"{variant}: the picture area is black"


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_fit_crop_fills_the_frame_without_bars(tree, cfg, journal, assets, variant):
    w, h, _, _ = VARIANTS[variant]
    steps = [{"op": "trim", "duration": 0.5}, {"op": "fit", "width": w, "height": h, "mode": "crop"}, ENC]
    r = render(tree, cfg, journal, sub_with(assets, "crop", steps))
    v = r.video()
    assert (v["width"], v["height"]) == (w, h)
    f = grab(r.path, 0.2)
    strips = [(0, 0, w, 6), (0, h - 6, w, h), (0, 0, 6, h), (w - 6, 0, w, h)]
    for strip in strips:
        assert f.dark_fraction(*strip) < 0.5, f"{variant}: border {strip} looks like a bar"
    if variant == "16:9":
        # 320x240 -> 320x180 needs no scaling: the output is the source's middle 180 rows.
        src = grab(assets / "clip.mp4", 0.2)
        assert mad(f.data, src.region(0, 30, 320, 210)) < 6
        assert mad(f.data, src.region(0, 0, 320, 180)) > 2 * mad(f.data, src.region(0, 30, 320, 210))


def test_fit_pad_colour_fills_the_bars(tree, cfg, journal, assets):
    steps = [
        {"op": "trim", "duration": 0.5},
        {"op": "fit", "width": 320, "height": 180, "pad_colour": "#00ff00"},
        ENC,
    ]
    f = grab(render(tree, cfg, journal, sub_with(assets, "green", steps)).path, 0.2)
    for x in (4, 20, 36, 284, 300, 315):
        r, g, b = f.px(x, 90)
        assert g > 200 and r < 60 and b < 60, f"bar pixel at x={x} is {(r, g, b)}, not green"


def test_fit_respects_an_anamorphic_sources_display_aspect(tree, cfg, journal, assets):
    # 240x180 pixels with a 4:3 sample aspect ratio display as 16:9 (like HDV 1440x1080 or PAL widescreen).
    wide = assets / "anamorphic.mp4"
    ffmpeg(
        "-f", "lavfi", "-i", "testsrc2=size=240x180:rate=25:duration=1",
        "-f", "lavfi", "-i", "sine=frequency=440:sample_rate=48000:duration=1",
        "-vf", "setsar=4/3", "-c:v", "libx264", "-preset", "ultrafast", "-c:a", "aac", "-shortest", wide,
    )  # fmt: skip
    assert probe.streams_of(probe.ffprobe(wide), "video")[0]["display_aspect_ratio"] == "16:9"
    steps = [{"op": "fit", "width": 320, "height": 180, "mode": "pad"}, ENC]
    f = grab(
        render(tree, cfg, journal, sub_with(assets, "anamorphic", steps, clip="anamorphic.mp4")).path, 0.2
    )
    # A 16:9 picture in a 16:9 frame needs no bars.
    for strip in [(0, 0, 12, 180), (308, 0, 320, 180)]:
        assert f.dark_fraction(*strip) < 0.5, f"bar at {strip}: the picture was squeezed"


# -- fps ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(("fps", "rate"), [(15, "15/1"), (29.97, "2997/100")])
def test_fps_step_sets_the_output_frame_rate(tree, cfg, journal, assets, fps, rate):
    steps = [{"op": "trim", "duration": 1.0}, {"op": "fps", "fps": fps}, ENC]
    r = render(tree, cfg, journal, sub_with(assets, "fps", steps))
    v = r.video()
    assert v["avg_frame_rate"] == rate
    assert abs(int(v["nb_frames"]) - round(fps * 1.0)) <= 1
    assert r.job.output.expect.fps == pytest.approx(fps)


# -- overlay ------------------------------------------------------------------------------------

GOLD = lambda p: p[0] > 180 and p[1] > 150 and p[2] < 90  # noqa: E731
NAVY = lambda p: p[0] < 60 and p[1] < 60 and 70 < p[2] < 180  # noqa: E731
BLUE = lambda p: p[0] < 60 and p[1] < 60 and p[2] > 200  # noqa: E731

# The 80x40 logo scaled to 0.25 x 320 = 80 px wide, margin 16, in a 320x240 frame.
LOGO_AT = {"top-right": (224, 16), "bottom-left": (16, 184)}


@pytest.mark.parametrize("position", list(LOGO_AT))
def test_overlay_lands_in_the_named_corner(tree, cfg, journal, more, position):
    steps = [
        {"op": "trim", "duration": 0.5},
        {"op": "overlay", "source": "logo", "position": position, "margin": 16, "scale": 0.25},
        ENC,
    ]
    r = render(tree, cfg, journal, sub_with(more, "logo", steps, clip="blue.mp4", logo="logo.png"))
    f = grab(r.path, 0.2)
    for pos, (x0, y0) in LOGO_AT.items():
        gold, navy, corner = f.px(x0 + 16, y0 + 20), f.px(x0 + 40, y0 + 20), f.px(x0 + 3, y0 + 3)
        if pos == position:
            assert GOLD(gold), f"{pos}: {gold} is not the logo's gold"
            assert NAVY(navy), f"{pos}: {navy} is not the logo's navy bar"
            assert BLUE(corner), f"{pos}: the logo's transparent corner is not see-through: {corner}"
        else:
            assert BLUE(gold) and BLUE(navy), f"{pos}: the logo appears where it was not placed"


# -- text -----------------------------------------------------------------------------------------


def test_text_draws_in_its_region_only(tree, cfg, journal, more):
    base = [{"op": "trim", "duration": 0.5}]
    label = {"op": "text", "text": "Only £9.99", "size": 32, "margin": 10, "position": "bottom-left"}
    plain = render(tree, cfg, journal, sub_with(more, "plain", [*base, ENC], clip="blue.mp4"))
    text = render(tree, cfg, journal, sub_with(more, "label", [*base, label, ENC], clip="blue.mp4"))
    a, b = grab(plain.path, 0.2), grab(text.path, 0.2)
    region = (0, 160, 200, 240)
    assert changed(a.region(*region), b.region(*region)) > 300
    assert any(min(b.px(x, y)) > 200 for x in range(0, 200) for y in range(160, 240)), "no white text"
    assert changed(a.region(0, 0, 320, 120), b.region(0, 0, 320, 120)) == 0  # nothing drawn up top


def test_text_time_range_enables_the_label_only_inside_it(tree, cfg, journal, more):
    label = {"op": "text", "text": "SALE", "size": 40, "position": "center", "start": 0.5, "end": 1.0}
    r = render(
        tree,
        cfg,
        journal,
        sub_with(more, "timed", [{"op": "trim", "duration": 1.5}, label, ENC], clip="blue.mp4"),
    )
    before, during, after = (grab(r.path, t).region(80, 80, 240, 160) for t in (0.2, 0.7, 1.3))
    assert changed(before, during) > 300
    assert changed(before, after) == 0


# -- audio ----------------------------------------------------------------------------------------


def test_audio_keep_carries_the_clips_sound(tree, cfg, journal, more):
    r = render(tree, cfg, journal, sub_with(more, "keep", [{"op": "audio", "mode": "keep"}, ENC]))
    (a,) = r.audio()
    assert a["codec_name"] == "aac" and int(a["sample_rate"]) == 48000 and a["channels"] == 2
    t440, t1000 = tone_levels(r.path, (440, 1000))
    assert t440 > 0.05 and t1000 < 0.01


def test_audio_drop_leaves_no_audio_stream(tree, cfg, journal, more):
    r = render(tree, cfg, journal, sub_with(more, "drop", [{"op": "audio", "mode": "drop"}, ENC]))
    assert r.audio() == []
    assert r.job.output.expect.audio_streams == 0
    assert {"name": "audio_streams", "ok": True, "expected": 0, "actual": 0} in [
        msgspec.to_builtins(c) for c in r.manifest.validation.checks
    ]


def test_audio_replace_swaps_in_the_source(tree, cfg, journal, more):
    steps = [{"op": "audio", "mode": "replace", "source": "bed"}, ENC]
    r = render(tree, cfg, journal, sub_with(more, "replace", steps, clip="clip.mp4", bed="tone1000.m4a"))
    (a,) = r.audio()
    assert a["codec_name"] == "aac"
    t440, t1000 = tone_levels(r.path, (440, 1000))
    assert t1000 > 0.05 and t440 < 0.01
    # the bed is 3 s, the clip 2 s: the output keeps the clip's length
    assert r.duration == pytest.approx(2.0, abs=0.1)


def test_audio_replace_gives_a_silent_clip_sound(tree, cfg, journal, more):
    steps = [{"op": "audio", "mode": "replace", "source": "bed"}, ENC]
    r = render(tree, cfg, journal, sub_with(more, "dub", steps, clip="silent.mp4", bed="tone1000.m4a"))
    assert len(r.audio()) == 1
    assert tone_levels(r.path, (1000,))[0] > 0.05


def test_audio_mix_keeps_both_at_the_given_level(tree, cfg, journal, more):
    steps = [{"op": "audio", "mode": "mix", "source": "bed", "mix_level": 0.5}, ENC]
    r = render(tree, cfg, journal, sub_with(more, "mix", steps, clip="clip.mp4", bed="tone1000.m4a"))
    t440, t1000 = tone_levels(r.path, (440, 1000))
    assert t440 > 0.05 and t1000 > 0.025
    # both sine sources have the same amplitude; the bed is mixed in at half of it
    assert t1000 / t440 == pytest.approx(0.5, rel=0.2)


@pytest.mark.parametrize("target", [-16.0, -30.0])
def test_loudness_normalises_to_the_target(tree, cfg, journal, more, target):
    before = integrated_loudness(more / "clip.mp4")
    steps = [{"op": "audio", "mode": "keep", "loudness": target}, ENC]
    r = render(tree, cfg, journal, sub_with(more, f"loud{-int(target)}", steps))
    measured = integrated_loudness(r.path)
    print(f"loudness: source {before} LUFS, target {target}, output {measured}")
    assert abs(before - target) > 4  # the step has real work to do
    assert measured == pytest.approx(target, abs=2.0)


# -- encode ----------------------------------------------------------------------------------------

# (container, video codec, audio codec or None for the default) -> (codec names ffprobe reports, pix_fmt)
COMBOS = [
    ("mp4", "h264", None, "h264", "aac", "yuv420p"),
    ("mp4", "hevc", None, "hevc", "aac", "yuv420p"),
    ("mp4", "vp9", None, "vp9", "aac", "yuv420p"),
    ("mp4", "vp9", "opus", "vp9", "opus", "yuv420p"),
    ("mov", "h264", None, "h264", "aac", "yuv420p"),
    ("mov", "hevc", None, "hevc", "aac", "yuv420p"),
    ("mov", "prores", "pcm_s16le", "prores", "pcm_s16le", "yuv422p10le"),
    ("mov", "prores", "aac", "prores", "aac", "yuv422p10le"),
    ("webm", "vp9", None, "vp9", "opus", "yuv420p"),
]
BRANDS = {"mp4": "isom", "mov": "qt  "}


@pytest.mark.parametrize(
    ("container", "vcodec", "acodec", "want_v", "want_a", "pix"),
    COMBOS,
    ids=[f"{c[0]}-{c[1]}-{c[4]}" for c in COMBOS],
)
def test_encode_container_and_codecs(
    tree, cfg, journal, assets, container, vcodec, acodec, want_v, want_a, pix
):
    enc: dict[str, Any] = {
        "op": "encode",
        "container": container,
        "video_codec": vcodec,
        "preset": "ultrafast",
    }
    if acodec:
        enc["audio_codec"] = acodec
    steps = [{"op": "trim", "duration": 0.5}, {"op": "fit", "width": 160, "height": 120}, enc]
    r = render(tree, cfg, journal, sub_with(assets, f"enc-{container}-{vcodec}", steps))
    assert r.path.suffix == f".{container}"
    v = r.video()
    (a,) = r.audio()
    assert (v["codec_name"], a["codec_name"], v["pix_fmt"]) == (want_v, want_a, pix)
    assert (v["width"], v["height"]) == (160, 120)
    exp = r.job.output.expect
    assert (exp.video_codec, exp.audio_codec, exp.pix_fmt) == (vcodec, want_a, pix)
    if container == "webm":
        assert "webm" in r.info["format"]["format_name"].split(",")
        assert b"webm" in r.path.read_bytes()[:64]  # EBML DocType
    else:
        assert ftyp_brand(r.path) == BRANDS[container]
        boxes = top_level_boxes(r.path)
        assert boxes.index("moov") < boxes.index("mdat"), boxes  # faststart is the default
    if vcodec == "hevc":
        assert v["codec_tag_string"] == "hvc1"
    if vcodec == "prores":
        assert v["profile"] == "HQ"
    assert r.duration == pytest.approx(0.5, abs=0.1)


@pytest.mark.parametrize("container", ["mp4", "mov"])
def test_faststart_false_leaves_the_index_at_the_end(tree, cfg, journal, assets, container):
    enc = {**ENC, "container": container, "faststart": False}
    r = render(
        tree, cfg, journal, sub_with(assets, f"late-{container}", [{"op": "trim", "duration": 0.5}, enc])
    )
    boxes = top_level_boxes(r.path)
    assert boxes.index("mdat") < boxes.index("moov"), boxes


def _argv_for(job: Job, cfg: Config) -> list[str]:
    return ffcommand.command(job.recipe, {s.role: s for s in job.sources}, job.output.file, cfg.render).argv


def _opt(argv: list[str], name: str) -> str | None:
    return argv[argv.index(name) + 1] if name in argv else None


def test_crf_and_video_bitrate_control_the_size(tree, cfg, journal, assets):
    trim = {"op": "trim", "duration": 1.0}
    sizes, rates = {}, {}
    for key, extra in {
        "crf10": {"crf": 10},
        "crf45": {"crf": 45},
        "b150k": {"video_bitrate": "150k"},
        "b1500k": {"video_bitrate": "1500k"},
    }.items():
        r = render(tree, cfg, journal, sub_with(assets, key, [trim, {**ENC, **extra}]))
        argv = _argv_for(r.job, cfg)
        if "crf" in extra:
            assert _opt(argv, "-crf") == str(extra["crf"]) and "-b:v" not in argv
        else:
            assert _opt(argv, "-b:v") == extra["video_bitrate"] and "-crf" not in argv
        sizes[key] = r.path.stat().st_size
        rates[key] = int(r.video()["bit_rate"])
    print("sizes", sizes, "video bit rates", rates)
    assert sizes["crf10"] > 3 * sizes["crf45"]
    assert rates["b1500k"] > 3 * rates["b150k"]
    assert rates["b150k"] < 150_000 * 2


def test_vp9_preset_maps_to_cpu_used_and_crf_is_constant_quality(tree, cfg, journal, assets):
    steps = [{"op": "trim", "duration": 0.5}, {**ENC, "container": "webm", "video_codec": "vp9", "crf": 40}]
    job = accept.accept_bytes(tree, cfg, json.dumps(sub_with(assets, "vp9", steps)).encode(), "t")
    argv = _argv_for(job, cfg)
    assert _opt(argv, "-c:v") == "libvpx-vp9"
    assert _opt(argv, "-cpu-used") == "8"
    assert _opt(argv, "-crf") == "40" and _opt(argv, "-b:v") == "0"


# -- text never becomes filter syntax ------------------------------------------------------------------

LABELS = {
    "quotes": "It's \"quoted\" and 'single'",
    "syntax": "a:b;c,d [in] [out] {x} = drawtext=text=pwned:fontfile=/etc/passwd",
    "backslash": "back\\slash \\' \\\\ \\n \\:",
    "percent": "100% off %{pts} %{n} %{localtime} %%{eif:1:d}",
    "newlines": "line one\nline two\r\nline three",
    "scripts": "Привет мир · Καλημέρα κόσμε · مرحبا بالعالم",
    "injection": "'];[0:v]drawbox=c=red:t=fill[x];[x]null['",
}


def _text_job(assets: Path, name: str, text: str) -> dict:
    # "shrink": some of these labels are wider than the 320 px frame at size 16.
    label = {"op": "text", "text": text, "size": 16, "box": True, "fit": "shrink", "min_size": 6}
    return sub_with(assets, name, [{"op": "trim", "duration": 0.4}, label, ENC])


@pytest.mark.parametrize("key", list(LABELS))
def test_label_text_stays_out_of_the_command_line(tree, cfg, journal, assets, key):
    text = LABELS[key]
    r = render(tree, cfg, journal, _text_job(assets, f"label-{key}", text))
    cmd = ffcommand.command(r.job.recipe, {s.role: s for s in r.job.sources}, r.job.output.file, cfg.render)
    assert cmd.files == {"label-0.txt": text.encode("utf-8")}
    # the exact bytes FFmpeg read are in the attempt's work folder
    assert (tree.attempt_dir(r.job.job_id, 1) / "work" / "label-0.txt").read_bytes() == text.encode("utf-8")
    for arg in cmd.argv:
        assert text not in arg, f"the label reached the FFmpeg argument {arg!r}"
    # Stronger: the argv is exactly the one a placeholder label gives, so no part of the text is in it.
    placeholder = msgspec.structs.replace(
        r.job.recipe,
        steps=[
            msgspec.structs.replace(s, text="x") if isinstance(s, recipe.Text) else s
            for s in r.job.recipe.steps
        ],
    )
    assert ffcommand.command(
        placeholder, {s.role: s for s in r.job.sources}, r.job.output.file, cfg.render
    ).argv == (cmd.argv)
    (graph,) = [cmd.argv[i + 1] for i, a in enumerate(cmd.argv) if a == "-filter_complex"]
    assert "textfile=label-0.txt" in graph and "expansion=none" in graph


def test_label_is_drawn_literally_never_expanded(tree, cfg, journal, more):
    steps = [
        {"op": "trim", "duration": 2.0},
        {"op": "text", "text": "%{n} %{pts}", "size": 28, "position": "top-left", "margin": 8},
        {**ENC, "crf": 0},
    ]
    r = render(tree, cfg, journal, sub_with(more, "literal", steps, clip="blue.mp4"))
    plain = render(tree, cfg, journal, sub_with(more, "nolabel", [steps[0], steps[2]], clip="blue.mp4"))
    region = (0, 0, 320, 60)
    early, late = grab(r.path, 0.2).region(*region), grab(r.path, 1.6).region(*region)
    assert early == late, "the label's pixels changed between frames: it was expanded"
    assert changed(early, grab(plain.path, 0.2).region(*region)) > 300, "no label was drawn"

    # Control: the same label WITH expansion changes between those frames, so the check above can fail.
    expanded = more / "expanded.mp4"
    font = f"fontfile={cfg.render.font_file}" if cfg.render.font_file else "font=Sans"
    ffmpeg(
        "-i", more / "blue.mp4", "-vf",
        f"drawtext=text='%{{n}} %{{pts}}':{font}:fontsize=28:fontcolor=white:x=8:y=8",
        "-c:v", "libx264", "-preset", "ultrafast", "-crf", "0", "-an", expanded,
    )  # fmt: skip
    assert grab(expanded, 0.2).region(*region) != grab(expanded, 1.6).region(*region)


def test_two_labels_get_two_files(tree, cfg, journal, more):
    steps = [
        {"op": "trim", "duration": 0.4},
        {"op": "text", "text": "first: 'one'", "position": "top-left", "size": 16},
        {"op": "text", "text": 'second; "two"', "position": "bottom-right", "size": 16},
        ENC,
    ]
    r = render(tree, cfg, journal, sub_with(more, "two-labels", steps, clip="blue.mp4"))
    cmd = ffcommand.command(r.job.recipe, {s.role: s for s in r.job.sources}, r.job.output.file, cfg.render)
    assert cmd.files == {"label-0.txt": b"first: 'one'", "label-1.txt": b'second; "two"'}
    (graph,) = [cmd.argv[i + 1] for i, a in enumerate(cmd.argv) if a == "-filter_complex"]
    assert graph.index("textfile=label-0.txt") < graph.index("textfile=label-1.txt")
    f = grab(r.path, 0.2)
    assert any(min(f.px(x, y)) > 200 for x in range(0, 160) for y in range(0, 60))  # top-left
    assert any(min(f.px(x, y)) > 200 for x in range(160, 320) for y in range(180, 240))  # bottom-right


def test_label_with_an_unpaired_surrogate_is_rejected_readably(tree, cfg, journal, assets):
    sub = _text_job(assets, "surrogate", "PLACEHOLDER")
    data = json.dumps(sub).replace("PLACEHOLDER", "price \\ud800 tag").encode()
    assert b"\\ud800" in data
    with pytest.raises(InvalidInput):
        accept.accept_bytes(tree, cfg, data, "t")
    # dropped into incoming/, it becomes a rejection with a reason, not a crash or a stuck drop
    (tree.incoming / "surrogate.json").write_bytes(data)
    (outcome,) = accept.accept_incoming(tree, cfg, "w1", journal)
    assert isinstance(outcome, accept.Rejected)
    assert (tree.rejected / "surrogate.error.json").exists()
    assert not list(tree.incoming.iterdir())


# -- the command is a pure function, never a shell ------------------------------------------------------


def test_command_is_pure_and_opens_inputs_as_files_only(tree, cfg, journal, assets, tmp_path, monkeypatch):
    job = accept.accept_bytes(tree, cfg, json.dumps(submission(assets, name="pure")).encode(), "t")
    sources = {s.role: s for s in job.sources}
    monkeypatch.chdir(tmp_path)
    before = sorted(os.listdir(tmp_path))
    a = ffcommand.command(job.recipe, sources, job.output.file, cfg.render)
    b = ffcommand.command(job.recipe, sources, job.output.file, cfg.render)
    assert a == b and a.argv is not b.argv
    assert sorted(os.listdir(tmp_path)) == before  # it wrote nothing (label files are the caller's job)
    assert a.files == {"label-0.txt": "Only £9.99".encode()}

    # No I/O: the same argv even when every source file has gone.
    for s in job.sources:
        os.unlink(s.path)
    assert ffcommand.command(job.recipe, sources, job.output.file, cfg.render) == a

    argv = a.argv
    assert argv[0] == cfg.render.ffmpeg
    assert not {"sh", "bash", "/bin/sh", "/bin/bash", "-c"} & set(argv)
    inputs = [i for i, arg in enumerate(argv) if arg == "-i"]
    assert len(inputs) == 3  # clip, logo, music
    prev = 0
    for i in inputs:
        assert argv[i + 1].startswith("file:/") and argv[i + 1][5:] in {s.path for s in job.sources}
        opts = argv[prev:i]
        assert "-protocol_whitelist" in opts and opts[opts.index("-protocol_whitelist") + 1] == "file"
        prev = i + 2
    assert argv[-1] == f"file:{job.output.file}"
    assert [arg for arg in argv if arg.startswith(("pipe:", "http", "tcp:", "concat:"))] == ["pipe:1"]


def test_shell_metacharacters_in_a_source_path_are_just_a_name(tree, cfg, journal, assets, tmp_path):
    odd = "clip; $(touch PWNED) `touch PWNED` 'q' \"d\" & | > x.mp4"
    shutil.copyfile(assets / "clip.mp4", assets / odd)
    r = render(
        tree, cfg, journal, sub_with(assets, "odd-name", [{"op": "trim", "duration": 0.4}, ENC], clip=odd)
    )
    argv = _argv_for(r.job, cfg)
    assert f"file:{assets / odd}" in argv
    work = tree.attempt_dir(r.job.job_id, 1) / "work"
    for d in (work, Path.cwd(), assets, tmp_path):
        assert not (d / "PWNED").exists()
    assert not (work / "x.mp4").exists()


# -- expectations implied by the recipe ---------------------------------------------------------------


def _sources(assets: Path, **files: str) -> dict[str, Source]:
    out = {}
    for role, name in files.items():
        p = assets / name
        out[role] = Source(
            role=role,
            path=str(p),
            size=p.stat().st_size,
            sha256="0" * 64,
            probe=probe.summarize(probe.ffprobe(p)),
        )
    return out


def _expect(steps: list[dict], sources: dict[str, Source], tolerance: float = 0.1) -> Any:
    r = msgspec.convert({"input": "clip", "steps": steps}, recipe.Recipe)
    return recipe.default_expect(r, sources, tolerance)


def test_default_expect_follows_the_recipe(assets):
    clip = _sources(assets, clip="clip.mp4")
    plain = _expect([ENC], clip)
    assert (plain.width, plain.height, plain.fps, plain.duration) == (320, 240, 25.0, 2.0)
    assert (plain.video_streams, plain.audio_streams, plain.subtitle_streams) == (1, 1, 0)
    assert (plain.video_codec, plain.audio_codec, plain.pix_fmt) == ("h264", "aac", "yuv420p")
    assert plain.duration_tolerance == pytest.approx(0.1 + 1 / 25, abs=1e-3)

    fit = _expect([{"op": "fit", "width": 192, "height": 108}, ENC], clip)
    assert (fit.width, fit.height) == (192, 108)

    fps = _expect([{"op": "fps", "fps": 15}, ENC], clip, tolerance=0.25)
    assert fps.fps == 15 and fps.duration_tolerance == pytest.approx(0.25 + 1 / 15, abs=1e-3)

    assert _expect([{"op": "trim", "start": 0.2, "duration": 0.8}, ENC], clip).duration == 0.8
    assert _expect([{"op": "trim", "start": 0.5}, ENC], clip).duration == 1.5
    assert _expect([{"op": "trim", "start": 1.5, "duration": 5}, ENC], clip).duration == 0.5  # clipped

    drop = _expect([{"op": "audio", "mode": "drop"}, ENC], clip)
    assert drop.audio_streams == 0 and drop.audio_codec is None

    prores = _expect([{"op": "encode", "container": "mov", "video_codec": "prores"}], clip)
    assert (prores.video_codec, prores.pix_fmt, prores.audio_codec) == ("prores", "yuv422p10le", "aac")

    webm = _expect([{"op": "encode", "container": "webm", "video_codec": "vp9"}], clip)
    assert (webm.video_codec, webm.audio_codec) == ("vp9", "opus")

    silent = _sources(assets, clip="silent.mp4", music="music.m4a")
    assert _expect([ENC], silent).audio_streams == 0
    dub = _expect([{"op": "audio", "mode": "replace", "source": "music"}, ENC], silent)
    assert (dub.audio_streams, dub.audio_codec) == (1, "aac")


def test_accepted_job_carries_the_default_expectations(tree, cfg, assets):
    steps = [
        {"op": "trim", "duration": 1.0},
        {"op": "fit", "width": 240, "height": 240},
        {"op": "fps", "fps": 10},
        {"op": "audio", "mode": "drop"},
        {**ENC, "container": "mov", "video_codec": "prores"},
    ]
    job = accept.accept_bytes(tree, cfg, json.dumps(sub_with(assets, "defaults", steps)).encode(), "t")
    exp = job.output.expect
    assert (exp.width, exp.height, exp.fps, exp.duration) == (240, 240, 10.0, 1.0)
    assert (exp.audio_streams, exp.audio_codec, exp.video_codec, exp.pix_fmt) == (
        0,
        None,
        "prores",
        "yuv422p10le",
    )
    assert exp == _expect(steps, {s.role: s for s in job.sources}, cfg.validation.duration_tolerance)
