"""The validation gate on its own: real files made by FFmpeg, each missing one expectation.

A check must pass on a good file and fail, naming what was expected and what the
file has, on a file that misses it. Broken files (truncated, corrupted) never pass.
"""

from __future__ import annotations

import itertools
import random
import struct
import subprocess
from pathlib import Path
from typing import Any

import pytest

from spool.core.config import Config, Validation
from spool.core.model import Check, Expect, ValidationReport
from spool.media import probe
from spool.media.validate import check_probe, decode_windows, validate

SECONDS = 2

GOOD = Expect(
    video_streams=1,
    audio_streams=1,
    subtitle_streams=0,
    video_codec="h264",
    audio_codec="aac",
    width=320,
    height=240,
    fps=25,
    pix_fmt="yuv420p",
    duration=2.0,
    duration_tolerance=0.1,
)
PROBED = {
    "container",
    "video_streams",
    "audio_streams",
    "subtitle_streams",
    "video_codec",
    "audio_codec",
    "width",
    "height",
    "fps",
    "pix_fmt",
    "duration",
    "complete",  # read by demuxing to the end, whatever the decode mode
}


def make(
    path: Path,
    *,
    size: str = "320x240",
    rate: str = "25",
    seconds: float = SECONDS,
    vcodec: str = "libx264",
    pix_fmt: str = "yuv420p",
    audio: str | None = "aac",
    faststart: bool = True,
    extra_inputs: tuple[str, ...] = (),
    extra: tuple[str, ...] = (),
) -> Path:
    """A test picture with a tone, made by FFmpeg with exactly the given properties."""
    args = ["-f", "lavfi", "-i", f"testsrc2=size={size}:rate={rate}:duration={seconds}"]
    if audio:
        args += ["-f", "lavfi", "-i", f"sine=frequency=440:sample_rate=48000:duration={seconds}"]
    args += [*extra_inputs, "-map", "0:v"]
    if audio:
        args += ["-map", "1:a", "-c:a", audio]
    args += ["-c:v", vcodec, "-pix_fmt", pix_fmt, "-g", "25"]
    if vcodec == "libx264":
        args += ["-preset", "ultrafast"]
    if faststart and path.suffix in (".mp4", ".mov"):
        args += ["-movflags", "+faststart"]
    subprocess.run(
        ["ffmpeg", "-nostdin", "-hide_banner", "-v", "error", "-y", *args, *extra, str(path)],
        check=True,
        stdin=subprocess.DEVNULL,
    )
    return path


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("validate")
    srt = d / "subs.srt"
    srt.write_text("1\n00:00:00,000 --> 00:00:01,000\nhello\n")
    return {
        "good": make(d / "good.mp4"),
        "late_index": make(d / "late-index.mp4", faststart=False),
        "small": make(d / "small.mp4", size="160x120"),
        "mpeg4": make(d / "mpeg4.mp4", vcodec="mpeg4"),
        "mute": make(d / "mute.mp4", audio=None),
        "short": make(d / "short.mp4", seconds=1),
        "slow": make(d / "slow.mp4", rate="15"),
        "ntsc": make(d / "ntsc.mp4", rate="30000/1001"),
        "yuv444": make(d / "yuv444.mp4", pix_fmt="yuv444p"),
        "ac3": make(d / "ac3.mp4", audio="ac3"),
        "mkv": make(d / "good.mkv"),
        "mov": make(d / "good.mov"),
        "subs": make(
            d / "subs.mp4", extra_inputs=("-i", str(srt)), extra=("-map", "2:s", "-c:s", "mov_text")
        ),
        "two_video": make(d / "two-video.mp4", extra=("-map", "0:v")),
        "vp9_mkv": make(
            d / "vp9.mkv",
            size="160x120",
            vcodec="libvpx-vp9",
            audio="libopus",
            extra=("-deadline", "good", "-cpu-used", "8"),
        ),
    }


def conf(mode: str = "sampled", **validation: Any) -> Config:
    return Config(validation=Validation(decode_check=mode, **validation))  # type: ignore[arg-type]


def run(
    path: Path,
    tmp_path: Path,
    *,
    container: str = "mp4",
    expect: Expect = GOOD,
    mode: str = "sampled",
    **validation: Any,
) -> ValidationReport:
    return validate(path, container, expect, conf(mode, **validation), tmp_path / "validate.log")


def by_name(report: ValidationReport | list[Check]) -> dict[str, Check]:
    checks = report.checks if isinstance(report, ValidationReport) else report
    names = [c.name for c in checks]
    assert len(names) == len(set(names)), f"a check is reported twice: {names}"
    return {c.name: c for c in checks}


def truncate(src: Path, dest: Path, fraction: float) -> Path:
    data = src.read_bytes()
    dest.write_bytes(data[: int(len(data) * fraction)])
    return dest


def boxes(data: bytes) -> dict[str, tuple[int, int]]:
    """Top-level box type -> (payload start, end) of an MP4."""
    out, pos = {}, 0
    while pos + 8 <= len(data):
        size, kind = struct.unpack(">I4s", data[pos : pos + 8])
        head = 8
        if size == 1:
            (size,) = struct.unpack(">Q", data[pos + 8 : pos + 16])
            head = 16
        out[kind.decode("latin-1")] = (pos + head, pos + size)
        pos += size
    return out


# -- a good file passes ---------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["full", "sampled"])
def test_good_file_passes_every_check(files, tmp_path, mode):
    report = run(files["good"], tmp_path, mode=mode)
    checks = by_name(report)
    assert report.ok, report.failed()
    assert set(checks) == PROBED | {"decode"}
    assert all(c.ok for c in report.checks)
    assert checks["container"].expected == "mp4" and "mp4" in checks["container"].actual.split(",")
    assert (checks["width"].actual, checks["height"].actual) == (320, 240)
    assert (checks["video_codec"].actual, checks["audio_codec"].actual) == ("h264", "aac")
    assert checks["fps"].actual == 25 and checks["pix_fmt"].actual == "yuv420p"
    assert checks["duration"].expected == "2 ± 0.1 s" and checks["duration"].actual == pytest.approx(
        2.0, abs=0.05
    )
    label = "full" if mode == "full" else "3 windows of 0.5 s"
    assert checks["decode"].expected == f"no decoder errors ({label})"
    assert checks["decode"].actual == "clean"
    assert report.decode_check == mode
    # the decode run is logged: the whole file, or every window in one run
    runs = [ln for ln in (tmp_path / "validate.log").read_text().splitlines() if ln.startswith("[decode")]
    assert len(runs) == 1 and runs[0].endswith("exit 0")
    assert runs[0].count("-ss") == (0 if mode == "full" else 3)


def test_only_stated_expectations_are_checked(files, tmp_path):
    report = run(files["small"], tmp_path, expect=Expect())
    assert report.ok
    assert set(by_name(report)) == {"container", "complete", "decode"}


# -- each check fails on a file that misses it ---------------------------------------------------------

# file -> {check: (expected, actual)}: exactly these checks fail, every other one passes
MISSES = {
    "small": {"width": (320, 160), "height": (240, 120)},
    "mpeg4": {"video_codec": ("h264", "mpeg4")},
    "mute": {"audio_streams": (1, 0)},
    "short": {"duration": ("2 ± 0.1 s", 1.0)},
    "slow": {"fps": (25, 15.0)},
    "yuv444": {"pix_fmt": ("yuv420p", "yuv444p")},
    "ac3": {"audio_codec": ("aac", "ac3")},
    "subs": {"subtitle_streams": (0, 1)},
    "two_video": {"video_streams": (1, 2)},
    "mkv": {"container": ("mp4", "matroska,webm")},
}


@pytest.mark.parametrize("key", list(MISSES))
def test_a_missed_expectation_fails_with_expected_and_actual(files, tmp_path, key):
    report = run(files[key], tmp_path, mode="none")
    assert not report.ok
    failed = by_name(report.failed())
    assert set(failed) == set(MISSES[key]), [f"{c.name}: {c.expected} vs {c.actual}" for c in report.failed()]
    for name, (expected, actual) in MISSES[key].items():
        c = failed[name]
        assert c.expected == expected
        if isinstance(actual, float):
            assert c.actual == pytest.approx(actual, abs=0.05)
        else:
            assert c.actual == actual
    if key == "mute":
        assert "audio_codec" not in by_name(report)  # no audio stream: nothing to compare


@pytest.mark.parametrize("key", list(MISSES))
def test_sound_files_pass_the_decode_check(files, tmp_path, key):
    # These files miss an expectation but are not damaged: decoding them finds nothing.
    report = run(files[key], tmp_path, expect=Expect(), mode="full")
    decode = by_name(report)["decode"]
    assert decode.ok and decode.actual == "clean", decode.actual


def test_check_probe_is_pure_and_reads_only_the_probe_report(files):
    info = probe.ffprobe(files["good"])
    assert check_probe(info, "mp4", GOOD, 0.1) == check_probe(info, "mp4", GOOD, 0.1)
    assert all(c.ok for c in check_probe(info, "mp4", GOOD, 0.1))
    assert check_probe(None, "mp4", GOOD, 0.1) == [
        Check(name="container", expected="mp4", actual="unreadable", ok=False)
    ]
    webm = by_name(check_probe(info, "webm", GOOD, 0.1))["container"]
    assert not webm.ok and webm.expected == "webm" and webm.actual == info["format"]["format_name"]


def test_duration_tolerance_comes_from_the_job_or_the_config(files):
    info = probe.ffprobe(files["good"])  # 2.0 s

    def dur(expect: Expect, tolerance: float) -> Check:
        return by_name(check_probe(info, "mp4", expect, tolerance))["duration"]

    assert dur(Expect(duration=2.3, duration_tolerance=0.5), 0.1).ok
    c = dur(Expect(duration=2.3, duration_tolerance=0.1), 0.5)  # the job's tolerance wins
    assert not c.ok and c.expected == "2.3 ± 0.1 s" and c.actual == pytest.approx(2.0, abs=0.05)
    assert dur(Expect(duration=2.3), 0.5).ok  # none stated: the config's
    c = dur(Expect(duration=2.3), 0.1)
    assert not c.ok and c.expected == "2.3 ± 0.1 s"
    assert not dur(Expect(duration=1.7), 0.1).ok  # too long fails as well as too short
    assert dur(Expect(duration=2.0, duration_tolerance=0.0), 0.1).actual == pytest.approx(2.0, abs=0.05)


def test_fps_check_tolerates_ntsc_rounding_only(files):
    info = probe.ffprobe(files["ntsc"])  # 30000/1001
    fps = {want: by_name(check_probe(info, "mp4", Expect(fps=want), 0.1))["fps"] for want in (29.97, 25.0)}
    assert fps[29.97].ok and fps[29.97].actual == 29.97
    assert not fps[25.0].ok and fps[25.0].expected == 25.0 and fps[25.0].actual == 29.97


def test_missing_or_empty_candidate_fails_before_probing(tmp_path):
    empty = tmp_path / "empty.mp4"
    empty.write_bytes(b"")
    for path in (empty, tmp_path / "absent.mp4"):
        report = run(path, tmp_path)
        assert not report.ok
        assert [(c.name, c.ok) for c in report.checks] == [("output_file", False)]


def test_not_media_is_unreadable_not_a_crash(tmp_path):
    junk = tmp_path / "junk.mp4"
    junk.write_bytes(b"this is not a video\n" * 100)
    report = run(junk, tmp_path, mode="full")
    assert not report.ok
    c = by_name(report)["container"]
    assert (c.expected, c.actual, c.ok) == ("mp4", "unreadable", False)
    assert "decode" not in by_name(report)


# -- broken files never pass -----------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["full", "sampled", "none"])
def test_truncated_file_with_the_index_at_the_end_is_unreadable(files, tmp_path, mode):
    cut = truncate(files["late_index"], tmp_path / "cut.mp4", 0.5)
    assert boxes(files["late_index"].read_bytes()).keys() >= {"mdat", "moov"}
    report = run(cut, tmp_path, mode=mode)
    assert not report.ok
    c = by_name(report)["container"]
    assert (c.actual, c.ok) == ("unreadable", False)


@pytest.mark.parametrize("fraction", [0.5, 0.9, 0.999])
@pytest.mark.parametrize("mode", ["full", "sampled", "none"])
def test_truncated_faststart_file_fails_the_completeness_check(files, tmp_path, mode, fraction):
    # The index is at the front, so ffprobe still reads the whole (promised) duration:
    # only reading to the end shows the file is short, in every decode mode.
    cut = truncate(files["good"], tmp_path / "cut.mp4", fraction)
    report = run(cut, tmp_path, mode=mode)
    assert not report.ok
    checks = by_name(report)
    assert checks["container"].ok and checks["duration"].ok
    assert not checks["complete"].ok and checks["complete"].actual != "complete"
    if mode == "full":
        assert not checks["decode"].ok
    print(f"truncated to {fraction:.1%}, {mode}: {checks['complete'].actual}")


@pytest.fixture(scope="module")
def corrupt(files: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The good file with 4 KiB of garbage in the middle of its media data."""
    data = bytearray(files["good"].read_bytes())
    start, end = boxes(bytes(data))["mdat"]
    mid = (start + end) // 2
    assert end - start > 16 * 4096
    data[mid - 2048 : mid + 2048] = random.Random(20240611).randbytes(4096)
    path = tmp_path_factory.mktemp("corrupt") / "corrupt.mp4"
    path.write_bytes(bytes(data))
    return path


def test_corrupted_middle_fails_the_full_decode_check(corrupt, tmp_path):
    report = run(corrupt, tmp_path, mode="full")
    assert not report.ok
    checks = by_name(report)
    failed = {c.name for c in report.failed()}
    assert "decode" in failed and failed <= {"decode", "complete"}  # the probe itself sees nothing
    assert checks["decode"].expected == "no decoder errors (full)"
    assert checks["decode"].actual != "clean" and checks["decode"].actual
    print(f"corrupted middle, full: {checks['decode'].actual}")


def test_corrupted_middle_under_sampled_and_none(corrupt, tmp_path):
    sampled = run(corrupt, tmp_path, mode="sampled")
    print(
        f"corrupted middle, sampled (3 x 0.5 s): ok={sampled.ok}, decode={by_name(sampled)['decode'].actual}"
    )
    # Sampling may or may not hit the damage; whatever it says, only reading checks can fail.
    assert {c.name for c in sampled.failed()} <= {"decode", "complete"}
    none = run(corrupt, tmp_path, mode="none")
    # With decoding off only the demux to the end reads the media data (its parser
    # may notice the damage; that is a bonus, not a promise).
    assert none.decode_check == "none" and "decode" not in by_name(none)
    assert {c.name for c in none.failed()} <= {"complete"}
    print(f"corrupted middle, none: ok={none.ok}, complete={by_name(none)['complete'].actual}")


def test_decode_none_skips_decoding(files, tmp_path):
    report = run(files["good"], tmp_path, mode="none")
    assert report.ok and report.decode_check == "none"
    assert set(by_name(report)) == PROBED
    log = tmp_path / "validate.log"
    assert not log.exists() or "[decode" not in log.read_text()


# -- the container check names the container, not the demuxer family --------------------------------------


def test_quicktime_file_does_not_pass_as_mp4(files, tmp_path):
    report = run(files["mov"], tmp_path)
    c = by_name(report)["container"]
    assert not c.ok and c.expected == "mp4"


def test_matroska_file_does_not_pass_as_webm(files, tmp_path):
    expect = Expect(video_codec="vp9", audio_codec="opus", width=160, height=120)
    report = run(files["vp9_mkv"], tmp_path, container="webm", expect=expect)
    c = by_name(report)["container"]
    assert not c.ok and c.expected == "webm"


# -- which windows sampled decoding reads ---------------------------------------------------------------


def test_decode_windows():
    assert decode_windows(600.0, "full", 3, 0.5) is None
    assert decode_windows(None, "sampled", 3, 0.5) is None  # unknown length: decode it all
    assert decode_windows(0.0, "sampled", 3, 0.5) is None
    assert decode_windows(1.5, "sampled", 3, 0.5) is None  # windows would cover it anyway
    assert decode_windows(1.2, "sampled", 1, 2.0) is None
    assert decode_windows(10.0, "sampled", 1, 2.0) == [(0.0, 2.0)]
    assert decode_windows(10.0, "sampled", 2, 0.5) == [(0.0, 0.5), (9.5, 0.5)]
    assert decode_windows(10.0, "sampled", 3, 0.5) == [(0.0, 0.5), (4.75, 0.5), (9.5, 0.5)]
    for duration, n, secs in [(2.0, 3, 0.5), (7.3, 4, 1.0), (3600.0, 5, 2.0), (86399.9, 7, 0.25)]:
        w = decode_windows(duration, "sampled", n, secs)
        assert w is not None and len(w) == n
        assert w[0][0] == 0.0  # the start
        assert w[-1][0] + w[-1][1] == pytest.approx(duration, abs=1e-3)  # ... and the very end
        assert all(length == secs for _, length in w)
        starts = [s for s, _ in w]
        assert starts == sorted(starts) and all(b - a >= secs for a, b in itertools.pairwise(starts))


def test_sampled_decoding_reads_the_windows_it_names(files, tmp_path):
    report = run(files["good"], tmp_path, mode="sampled", sample_windows=2, sample_seconds=0.25)
    assert by_name(report)["decode"].expected == "no decoder errors (2 windows of 0.25 s)"
    text = (tmp_path / "validate.log").read_text()
    assert "[decode -ss 0 -t 0.25 | -ss 1.75 -t 0.25]" in text


def test_a_decode_check_killed_by_a_signal_is_no_verdict_on_the_bytes(files, tmp_path):
    """A decoder the OOM killer (or a torture run) kills says nothing about the file: the
    attempt is retried, never failed as "the output failed the decode check"."""
    from spool.core.errors import Failed
    from spool.media.validate import decode_check

    killed = tmp_path / "ffmpeg"
    killed.write_text("#!/bin/sh\nkill -KILL $$\n")
    killed.chmod(0o755)
    cfg = Config()
    cfg.render.ffmpeg = str(killed)
    with pytest.raises(Failed) as info:
        decode_check(files["good"], cfg, 2.0, tmp_path / "validate.log")
    f = info.value
    assert (f.stage, f.property, f.retryable, f.fault) == ("validate", "decode_check", True, "host")
    assert "signal 9" in f.message
