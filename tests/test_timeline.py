"""Renders from an edit file: an OpenTimelineIO timeline (clips with source ranges, gaps,
cross dissolves) frozen at acceptance and rendered by one FFmpeg graph, checked by probing
the frames at its cut points; unsupported effects and transitions refused with the clip's
name and timecode; a CMX 3600 EDL written by the OTIO adapter accepted."""

from __future__ import annotations

import json
import subprocess
import threading
from pathlib import Path
from typing import Any

import invariants
import opentimelineio as otio
import pytest
from conftest import TAGS

from spool import kinds
from spool.core.errors import InvalidInput
from spool.media import probe
from spool.queue import accept, claim, depends, execute
from spool.queue.context import Context
from spool.queue.events import Journal

RATE = 24
COLOURS = {"red": (255, 0, 0), "green": (0, 128, 0), "blue": (0, 0, 255)}


@pytest.fixture()
def colours(assets: Path) -> dict[str, Path]:
    """Solid-colour clips with sound, 4 s at 24 fps: each frame says which clip it came from."""
    out = {}
    for name in COLOURS:
        path = assets / f"{name}.mp4"
        subprocess.run(
            ["ffmpeg", "-v", "error", "-nostdin", "-y", "-f", "lavfi",
             "-i", f"color=c={name}:s=160x90:r={RATE}:d=4",
             "-f", "lavfi", "-i", "sine=frequency=440:duration=4", "-c:v", "libx264", "-preset", "ultrafast",
             "-pix_fmt", "yuv420p", "-c:a", "aac", "-shortest", str(path)],
            check=True,
        )  # fmt: skip
        out[name] = path
    return out


def rt(seconds: float) -> Any:
    return otio.opentime.RationalTime(round(seconds * RATE), RATE)


def clip(name: str, media: str, start: float, duration: float) -> Any:
    return otio.schema.Clip(
        name=name,
        media_reference=otio.schema.ExternalReference(target_url=media),
        source_range=otio.opentime.TimeRange(rt(start), rt(duration)),
    )


def dissolve(name: str, half: float) -> Any:
    return otio.schema.Transition(
        name=name,
        transition_type=otio.schema.TransitionTypes.SMPTE_Dissolve,
        in_offset=rt(half),
        out_offset=rt(half),
    )


def edit(colours: dict[str, Path], *, relative: bool = True) -> Any:
    """5 clips, 2 dissolves, a gap: A red 0-2 s, dissolve, B green 2-4, gap 4-5, C blue 5-6.5,
    dissolve, D red 6.5-7.5, cut, E green 7.5-8.5."""
    url = (lambda c: f"{c}.mp4") if relative else (lambda c: colours[c].as_uri())
    track = otio.schema.Track(name="V1", kind=otio.schema.TrackKind.Video)
    for item in (
        clip("A", url("red"), 1.0, 2.0),
        dissolve("D1", 0.5),
        clip("B", url("green"), 1.0, 2.0),
        otio.schema.Gap(source_range=otio.opentime.TimeRange(duration=rt(1.0))),
        clip("C", url("blue"), 0.5, 1.5),
        dissolve("D2", 0.25),
        clip("D", url("red"), 0.5, 1.0),
        clip("E", url("green"), 1.0, 1.0),
    ):
        track.append(item)
    tl = otio.schema.Timeline(name="spot")
    tl.tracks.append(track)
    return tl


def submission(timeline: Path, name: str = "spot") -> dict[str, Any]:
    return {
        "name": name,
        "sources": {"edit": str(timeline)},
        "recipe": {"input": "edit", "steps": [{"op": "encode", "preset": "ultrafast"}]},
        "tags": dict(TAGS),
    }


def render(tree: Any, cfg: Any, sub: dict[str, Any]) -> str:
    job = accept.accept_bytes(tree, cfg, json.dumps(sub).encode(), "t")
    assert claim.claim(tree, "w1", job.job_id)
    ctx = Context(tree, cfg, "w1", Journal(tree, "w1"), threading.Event())
    assert execute.execute(ctx, job.job_id) == "complete", (tree.root / "attempts" / job.job_id).as_posix()
    return job.job_id


def pixel(path: Path, t: float) -> tuple[int, int, int]:
    """The mean colour of the frame shown at ``t`` seconds."""
    raw = subprocess.run(
        ["ffmpeg", "-v", "error", "-nostdin", "-ss", f"{t:.3f}", "-i", str(path), "-frames:v", "1",
         "-vf", "scale=1:1:flags=area", "-f", "rawvideo", "-pix_fmt", "rgb24", "-"],
        capture_output=True, check=True,
    ).stdout  # fmt: skip
    return raw[0], raw[1], raw[2]


def near(got: tuple[int, int, int], want: tuple[int, int, int], slack: int = 40) -> bool:
    return all(abs(a - b) <= slack for a, b in zip(got, want, strict=True))


def test_a_timeline_renders_to_its_duration_with_the_right_frame_at_every_cut(tree, cfg, assets, colours):
    path = assets / "spot.otio"
    otio.adapters.write_to_file(edit(colours), str(path))
    jid = render(tree, cfg, submission(path))
    job = kinds.decode_job(tree.job_file("complete", jid).read_bytes())
    assert job.timeline is not None and job.timeline.duration == pytest.approx(8.5)
    assert (job.timeline.width, job.timeline.height, job.timeline.rate) == (160, 90, 24.0)
    assert sorted(s.role for s in job.sources) == ["edit", "edit_1", "edit_2", "edit_3"]  # one per medium
    m = json.loads(tree.manifest_file(jid).read_text())
    out = tree.root / m["output"]["store_path"]
    info = probe.summarize(probe.ffprobe(out, "ffprobe"))
    assert info.duration == pytest.approx(8.5, abs=1.5 / RATE)
    assert info.audio is not None
    red, green, blue, black = COLOURS["red"], COLOURS["green"], COLOURS["blue"], (0, 0, 0)
    expected = [
        (1.0, red), (3.3, green), (3.95, green), (4.05, black), (4.95, black), (5.1, blue),
        (6.0, blue), (7.0, red), (7.45, red), (7.55, green), (8.4, green),
    ]  # fmt: skip
    for t, want in expected:
        assert near(pixel(out, t), want), (t, pixel(out, t), want)
    mid = pixel(out, 2.0)  # halfway through dissolve D1: red and green mixed
    assert 60 < mid[0] < 200 and 30 < mid[1] < 110, mid
    mid = pixel(out, 6.5)  # halfway through D2: blue and red
    assert 60 < mid[0] < 200 and 60 < mid[2] < 200, mid
    assert invariants.check(tree.root) == []


def test_the_timeline_is_frozen_at_acceptance(tree, cfg, assets, colours):
    path = assets / "spot.otio"
    otio.adapters.write_to_file(edit(colours), str(path))
    job = accept.accept_bytes(tree, cfg, json.dumps(submission(path)).encode(), "t")
    short = otio.schema.Timeline(name="other")
    short.tracks.append(otio.schema.Track(kind=otio.schema.TrackKind.Video))
    short.tracks[0].append(clip("X", "blue.mp4", 0, 1.0))
    otio.adapters.write_to_file(short, str(path))  # changed after submission: changes nothing
    assert claim.claim(tree, "w1", job.job_id)
    ctx = Context(tree, cfg, "w1", Journal(tree, "w1"), threading.Event())
    assert execute.execute(ctx, job.job_id) == "complete"
    m = json.loads(tree.manifest_file(job.job_id).read_text())
    assert m["validation"]["media"]["duration"] == pytest.approx(8.5, abs=1.5 / RATE)
    gate = {c["name"]: c for c in m["validation"]["checks"]}
    assert gate["duration"]["expected"].startswith("8.5 ")  # the gate holds it to the edit's duration


@pytest.mark.parametrize(
    ("change", "said"),
    [
        ("effect", "clip 'B' at 00:00:02:00: effect 'LinearTimeWarp' is not supported"),
        ("wipe", "transition 'W' at 00:00:02:00 is a SMPTE_Wipe"),
        ("short", "clip 'A' at 00:00:00:00: needs"),
    ],
)
def test_an_unsupported_effect_or_transition_is_refused_with_the_clips_name_and_time(
    tree, cfg, assets, colours, change, said
):
    tl = edit(colours)
    track = tl.tracks[0]
    if change == "effect":
        track[2].effects.append(otio.schema.LinearTimeWarp(time_scalar=2.0))
    elif change == "wipe":
        track[1] = otio.schema.Transition(
            name="W", transition_type="SMPTE_Wipe", in_offset=rt(0.5), out_offset=rt(0.5)
        )
    else:
        track[0].source_range = otio.opentime.TimeRange(rt(3.0), rt(2.0))  # past the 4 s medium
    path = assets / "bad.otio"
    otio.adapters.write_to_file(tl, str(path))
    with pytest.raises(InvalidInput) as err:
        accept.accept_bytes(tree, cfg, json.dumps(submission(path)).encode(), "t")
    assert err.value.field == "sources.edit" and said in str(err.value)


def test_a_cmx_3600_edl_written_by_the_otio_adapter_is_accepted_and_renders(tree, cfg, assets, colours):
    tl = edit(colours, relative=False)
    del tl.tracks[0][3]  # an EDL has no gap records of its own: keep the picture continuous
    path = assets / "spot.edl"
    otio.adapters.write_to_file(tl, str(path), adapter_name="cmx_3600")
    jid = render(tree, cfg, submission(path, "edl-spot"))
    job = kinds.decode_job(tree.job_file("complete", jid).read_bytes())
    assert job.timeline is not None and job.timeline.duration == pytest.approx(7.5)
    m = json.loads(tree.manifest_file(jid).read_text())
    assert m["validation"]["media"]["duration"] == pytest.approx(7.5, abs=1.5 / RATE)


def test_a_timeline_clip_may_be_another_jobs_output(tree, cfg, assets, colours, journal):
    master = {
        "name": "master",
        "sources": {"clip": str(colours["blue"])},
        "recipe": {"input": "clip", "steps": [{"op": "encode", "preset": "ultrafast"}]},
        "tags": dict(TAGS),
    }
    accept.accept_bytes(tree, cfg, json.dumps(master).encode(), "t")
    tl = otio.schema.Timeline(name="with-master")
    tl.tracks.append(otio.schema.Track(kind=otio.schema.TrackKind.Video))
    tl.tracks[0].append(clip("intro", "red.mp4", 0.5, 1.0))
    tl.tracks[0].append(dissolve("X", 0.25))
    tl.tracks[0].append(clip("hero", "spool:master", 1.0, 2.0))
    path = assets / "with-master.otio"
    otio.adapters.write_to_file(tl, str(path))
    job = accept.accept_bytes(tree, cfg, json.dumps(submission(path, "cut")).encode(), "t")
    assert accept.state_of(job) == "waiting" and job.upstreams[0].role == "edit_2"
    assert claim.claim(tree, "w1", "master@1")
    ctx = Context(tree, cfg, "w1", Journal(tree, "w1"), threading.Event())
    assert execute.execute(ctx, "master@1") == "complete"
    assert depends.settle(tree, cfg, journal, changed=["master@1"]).pending == ["cut@1"]
    assert claim.claim(tree, "w1", "cut@1")
    assert execute.execute(ctx, "cut@1") == "complete"
    assert invariants.check(tree.root) == []


def test_an_edl_naming_only_tape_reels_is_refused_with_the_reason(tree, cfg, assets, colours):
    """A CMX 3600 EDL as a conform suite writes it names reels, not files: nothing to render."""
    path = assets / "reels.edl"
    path.write_text(
        "TITLE: REELS\nFCM: NON-DROP FRAME\n\n"
        "001  TAPE01   V     C        01:00:00:00 01:00:02:00 00:00:00:00 00:00:02:00\n"
    )
    with pytest.raises(InvalidInput) as err:
        accept.accept_bytes(tree, cfg, json.dumps(submission(path, "reels")).encode(), "t")
    assert err.value.field == "sources.edit" and "has no media reference" in str(err.value), err.value
    assert not list(tree.pending.iterdir())
