"""Required layers: labels and logos are measured, placed and checked against the
safe area before rendering, and the render draws exactly what was checked."""

from __future__ import annotations

import json
import subprocess
import threading
from pathlib import Path

import msgspec
import pytest
from conftest import minimal, run_cli
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spool.core.config import Config, Layers, Render, parse
from spool.core.errors import InvalidInput
from spool.core.model import LayerBox, Manifest, ProbeSummary, Source, VideoInfo, decode
from spool.disk.tree import Tree
from spool.kinds.render import ffcommand, fonts, layers
from spool.kinds.render.kind import RenderJob
from spool.kinds.render.recipe import Recipe
from spool.media import probe, safearea
from spool.media.safearea import Rect
from spool.queue import accept, claim, execute
from spool.queue.events import Journal

FONT = fonts.resolve()
LABEL = "The Morning Mug – only £9.99"
FRAMES = {"16:9": (1280, 720), "9:16": (720, 1280), "1:1": (720, 720)}
SAFE_AREAS: list[float | str] = [0.9, 0.8, 1.0, "social", *safearea.PRESETS]
POSITIONS = [
    "top-left",
    "top",
    "top-right",
    "left",
    "center",
    "right",
    "bottom-left",
    "bottom",
    "bottom-right",
]


# -- helpers ------------------------------------------------------------------------------------


def _source(w: int = 320, h: int = 240, role: str = "clip", still: bool = False) -> Source:
    video = VideoInfo(codec="png" if still else "h264", width=w, height=h, fps=25.0)
    summary = ProbeSummary(format="mov", duration=None if still else 2.0, still=still, video=video)
    return Source(role=role, path=f"/media/{role}", size=1, sha256="0" * 64, probe=summary)


def _plan(
    steps: list[dict], frame: tuple[int, int], safe: float | str = 0.9, **srcs: Source
) -> list[LayerBox]:
    fit = {"op": "fit", "width": frame[0], "height": frame[1]}
    rec = msgspec.convert({"input": "clip", "steps": [fit, *steps]}, Recipe)
    return layers.plan(rec, {"clip": _source(), **srcs}, Layers(safe_area=safe), Render())


def _text(text: str = LABEL, **kw: object) -> dict:
    return {"op": "text", "text": text, **kw}


def _boxed_width(text: str, size: int) -> tuple[int, int]:
    return layers.measure(text, FONT, size)


def _largest_fitting(text: str, safe: Rect) -> int:
    def fits(size: int) -> bool:
        w, h = _boxed_width(text, size)
        return w <= safe.w and h <= safe.h

    return max(s for s in range(6, 400) if fits(s))


def _ffmpeg(*args: str | Path) -> bytes:
    argv = ["ffmpeg", "-nostdin", "-hide_banner", "-v", "error", "-y", *map(str, args)]
    return subprocess.run(argv, capture_output=True, check=True, stdin=subprocess.DEVNULL).stdout


def _bright_box(gray: bytes, w: int, h: int, limit: int = 96) -> Rect | None:
    """The bounding box of pixels brighter than ``limit`` in a grey frame."""
    xs, ys = [], []
    for y in range(h):
        row = gray[y * w : (y + 1) * w]
        hits = [x for x, v in enumerate(row) if v > limit]
        if hits:
            xs += [hits[0], hits[-1]]
            ys.append(y)
    if not ys:
        return None
    return Rect(min(xs), min(ys), max(xs) - min(xs) + 1, max(ys) - min(ys) + 1)


def _frame(path: Path, t: float) -> tuple[bytes, int, int]:
    v = probe.streams_of(probe.ffprobe(path), "video")[0]
    w, h = int(v["width"]), int(v["height"])
    data = _ffmpeg("-ss", f"{t:g}", "-i", path, "-frames:v", "1", "-f", "rawvideo", "-pix_fmt", "gray", "-")
    assert len(data) == w * h
    return data, w, h


# -- measurement matches what drawtext draws --------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "size"),
    [
        (LABEL, 71),
        ("Crème brûlée à £5 – naïve, déjà vu", 33),
        ("jumpy QUAY ÅÉÎ", 97),
        ("Line one\nthe second, longer line", 40),
        ("a\r\nb\rc", 20),
        ("Привет · Καλημέρα", 29),
    ],
)
def test_measured_box_is_exactly_drawtexts_text_box(text, size, tmp_path):
    # drawtext's box with no border covers exactly text_w x text_h at (x, y).
    (tmp_path / "t.txt").write_bytes(text.encode())
    vf = (
        f"drawtext=fontfile={FONT}:textfile=t.txt:expansion=none:fontsize={size}:fontcolor=black@0:"
        "box=1:boxcolor=white:boxborderw=0:x=10:y=10,format=gray"
    )
    argv = ["ffmpeg", "-v", "error", "-f", "lavfi", "-i", "color=black:s=1600x400", "-frames:v", "1"]
    gray = subprocess.run(
        [*argv, "-vf", vf, "-f", "rawvideo", "-"], capture_output=True, check=True, cwd=tmp_path
    ).stdout
    drawn = _bright_box(gray, 1600, 400)
    assert drawn is not None and (drawn.x, drawn.y) == (10, 10)
    assert (drawn.w, drawn.h) == layers.measure(text, FONT, size)


# -- every position x safe area x aspect, just fitting and just not -----------------------------------


@pytest.mark.parametrize("aspect", list(FRAMES))
@pytest.mark.parametrize("safe", SAFE_AREAS)
def test_labels_that_just_fit_are_placed_inside_and_one_size_up_are_rejected(aspect, safe):
    frame = FRAMES[aspect]
    preset = safearea.PRESETS.get(safe) if isinstance(safe, str) else None
    for_aspect = f"{preset.aspect[0]}:{preset.aspect[1]}" if preset and preset.aspect else aspect
    if for_aspect != aspect:
        with pytest.raises(InvalidInput, match=r"steps\[1\]\.safe_area: preset .* frames; this one is"):
            _plan([_text(safe_area=safe)], frame)
        return
    name, area = safearea.safe_area(safe, *frame, "t")
    fits = _largest_fitting(LABEL, area)
    too_big = min(s for s in range(fits + 1, 600) if _boxed_width(LABEL, s)[0] > area.w)
    for position in POSITIONS:  # margin 0: the safe area alone decides (margins: the test below)
        (layer,) = _plan([_text(size=fits, position=position, margin=0)], frame, safe)
        box = Rect(*layer.box)
        assert area.contains(box), (position, box, area)
        assert layer.size == fits and layer.safe == area.as_list() and layer.verdict == "inside"
        # Anchored at the safe area's edges, centred in it otherwise.
        if "left" in position:
            assert box.x == area.x
        if "right" in position:
            assert box.right == area.right
        if position.startswith("bottom"):
            assert box.bottom == area.bottom
        if position == "center":
            assert abs((box.x + box.right) - (area.x + area.right)) <= 1
        with pytest.raises(InvalidInput) as err:
            _plan([_text(size=too_big, position=position, margin=0)], frame, safe)
        width = _boxed_width(LABEL, too_big)[0]
        assert str(err.value) == (
            f"recipe.steps[1]: text is {width:,} px wide at size {too_big}; the {aspect} safe area "
            f'({name}) is {area.w:,} px; use size <= {fits} or "fit": "shrink"'
        )


def test_the_demo_label_is_rejected_in_9x16_with_the_numbers():
    with pytest.raises(InvalidInput) as err:
        _plan([_text(size=71, position="bottom", box=True)], (720, 1280))
    assert str(err.value) == (
        "recipe.steps[1]: text is 1,103 px wide at size 71; the 9:16 safe area (90 %) is 648 px; "
        'use size <= 41 or "fit": "shrink"'
    )


def test_social_9x16_keeps_clear_of_the_top_and_bottom_bands():
    (layer,) = _plan([_text(size=30, position="bottom")], (720, 1280), "social")
    assert layer.safe_area == "social-9x16 (social)"
    assert layer.safe == [44, 180, 632, 844]  # 6 % sides, 14 % top, 20 % bottom of 720x1280
    assert layer.box[1] + layer.box[3] == 1024  # the label sits on the bottom band, not in it
    (square,) = _plan([_text(size=30)], (720, 720), "social")
    assert square.safe_area == "social-1x1 (social)" and square.safe == [36, 36, 648, 648]


def test_the_margin_is_a_minimum_distance_from_the_frame_edge():
    # The safe area's edge (36 px in) is farther in than the margin (24): the label sits there.
    (layer,) = _plan([_text("SALE", size=40, position="bottom-left")], (720, 720))
    assert layer.box[0] == 36 and layer.box[1] + layer.box[3] == 684
    # A margin farther in than the safe area's edge wins.
    (layer,) = _plan([_text("SALE", size=40, position="bottom-left", margin=100)], (720, 720))
    assert layer.box[0] == 100 and layer.box[1] + layer.box[3] == 620


def test_a_margin_that_pushes_a_label_out_is_rejected_naming_it():
    with pytest.raises(
        InvalidInput, match=r"recipe\.steps\[1\]: text at x=.* leaves the 1:1 safe area .*margin"
    ):
        _plan([_text("SALE", size=40, position="left", margin=600)], (720, 720))


# -- fit: shrink and wrap --------------------------------------------------------------------------


def test_shrink_picks_the_largest_size_that_fits_and_never_goes_below_min_size():
    (layer,) = _plan([_text(size=71, fit="shrink", box=True)], (720, 1280))
    assert layer.size == 41 and Rect(*layer.safe).contains(Rect(*layer.box))
    with pytest.raises(InvalidInput, match=r"even at min_size 60; shorten the text or use wrap"):
        _plan([_text(size=71, fit="shrink", min_size=60)], (720, 1280))
    with pytest.raises(InvalidInput, match=r"steps\[1\]\.min_size: 80 is larger than size 71"):
        accept_recipe_check([_text(size=71, min_size=80)])


def accept_recipe_check(steps: list[dict]) -> None:
    from spool.kinds.render import recipe

    rec = msgspec.convert({"input": "clip", "steps": [{"op": "trim"}, *steps]}, Recipe)
    recipe.check(rec, {"clip": _source()})


def test_a_blank_label_too_wide_is_shrunk_or_rejected_without_crashing():
    (layer,) = _plan([_text(" " * 200, size=60, fit="shrink", min_size=6)], (720, 720))
    assert layer.box[3] == 0 and Rect(*layer.safe).contains(Rect(*layer.box))
    with pytest.raises(InvalidInput, match=r"px wide at size 60"):
        _plan([_text(" " * 200, size=60)], (720, 720))


def test_wrap_breaks_at_spaces_into_at_most_max_lines():
    (layer,) = _plan([_text(size=71, fit="wrap", box=True)], (720, 1280))
    assert layer.text == "The Morning Mug\n– only £9.99" and layer.size == 71
    assert Rect(*layer.safe).contains(Rect(*layer.box))
    with pytest.raises(InvalidInput, match=r"text needs 4 lines at size 120 .* max_lines is 2"):
        _plan([_text(size=120, fit="wrap")], (720, 1280))
    with pytest.raises(InvalidInput, match=r"the word 'Supercalifragilistic' is [0-9,]+ px wide at size 90"):
        _plan([_text("Supercalifragilistic deal", size=90, fit="wrap")], (720, 1280))


# -- Unicode and fonts -----------------------------------------------------------------------------


def test_a_character_the_font_lacks_is_a_located_rejection_not_tofu():
    lacking = fonts.missing("中文", FONT)
    if not lacking:
        pytest.skip("the default font has CJK glyphs here")
    if fonts.for_text("特价 中文", "")[1] == []:
        pytest.skip("fontconfig finds a CJK font here: covered by the next test")
    with pytest.raises(InvalidInput) as err:
        _plan([_text("特价 only £9.99", size=30)], (1280, 720))
    assert err.value.field == "recipe.steps[1].text"
    assert "'特' (U+7279)" in err.value.problem and "has no glyph" in err.value.problem
    with pytest.raises(InvalidInput, match=r"U\+0009"):
        _plan([_text("tab\there", size=30)], (1280, 720))


def test_a_cjk_label_is_drawn_from_a_font_that_has_its_glyphs():
    path, lacking = fonts.for_text("特价 中文", "")
    if lacking:
        pytest.skip("no font with CJK glyphs is installed (fc-list ':charset=7279')")
    (layer,) = _plan([_text("特价 中文", size=30)], (1280, 720))
    assert layer.font_file == path and not fonts.missing("特价 中文", path)


@pytest.mark.parametrize("content", [b"", b"not a font at all\n"])
def test_a_configured_font_that_is_missing_or_not_a_font_is_a_located_rejection(tmp_path, content):
    bad = tmp_path / "broken.ttf"
    if content:
        bad.write_bytes(content)
    rec = msgspec.convert({"input": "clip", "steps": [_text("Sale", size=20)]}, Recipe)
    with pytest.raises(InvalidInput) as err:
        layers.plan(rec, {"clip": _source()}, Layers(), Render(font_file=str(bad)))
    assert err.value.field == "recipe.steps[0].text" and "broken.ttf" in err.value.problem


def test_accents_pound_and_dashes_are_in_the_default_font():
    assert fonts.missing("Crème brûlée – naïve £9.99 — déjà", FONT) == []


# -- overlays and order ----------------------------------------------------------------------------


def test_an_overlay_gets_its_scaled_box_and_a_too_big_one_is_rejected():
    logo = _source(240, 120, role="logo", still=True)
    (layer,) = _plan([{"op": "overlay", "source": "logo", "scale": 0.18}], (720, 1280), logo=logo)
    assert layer.op == "overlay" and layer.box == [684 - 130, 64, 130, 66]
    with pytest.raises(
        InvalidInput, match=r"the logo overlay is 720 px wide; the 9:16 safe area \(90 %\) is 648"
    ):
        _plan([{"op": "overlay", "source": "logo", "scale": 1.0}], (720, 1280), logo=logo)


def test_a_layer_before_the_fit_step_is_rejected():
    rec = msgspec.convert(
        {"input": "clip", "steps": [_text(size=10), {"op": "fit", "width": 320, "height": 240}]}, Recipe
    )
    with pytest.raises(InvalidInput, match=r"recipe\.steps\[0\]\.op: a text step before the fit step"):
        layers.plan(rec, {"clip": _source()}, Layers(), Render())


# -- configuration -----------------------------------------------------------------------------------


def test_spool_toml_names_the_safe_area_and_a_bad_one_is_located():
    assert parse(b"[layers]\nsafe_area = 0.8\n").layers.safe_area == 0.8
    assert parse(b'[layers]\nsafe_area = "social"\n').layers.safe_area == "social"
    assert Config().layers.safe_area == 0.9
    with pytest.raises(InvalidInput, match=r"layers"):
        parse(b"[layers]\nsafe_area = 0.2\n")
    with pytest.raises(
        InvalidInput, match=r"spool.toml: layers.safe_area: 'tiktok' is not a safe area preset"
    ):
        _plan([_text(size=20)], (720, 720), "tiktok")


# -- the gate --------------------------------------------------------------------------------------


def test_the_gate_judges_planned_boxes_against_the_frame_the_file_has():
    planned = _plan([_text(size=30)], (720, 1280))
    judged, check = safearea.judge(planned, 720, 1280)
    assert check.ok and judged[0].verdict == "inside" and judged[0].box == planned[0].box
    judged, check = safearea.judge(planned, 1280, 720)
    assert not check.ok and judged[0].verdict.startswith("outside: the frame is 1280x720")
    _, check = safearea.judge(planned, None, None)
    assert not check.ok
    assert safearea.spec_of("90 %") == 0.9 and safearea.spec_of("social-1x1 (social)") == "social-1x1"


# -- real renders: label pixels only inside the planned box ----------------------------------------------


@pytest.fixture(scope="module")
def dark(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("layers-media") / "dark.mp4"
    _ffmpeg(
        "-f", "lavfi", "-i", "color=c=0x202020:size=320x240:rate=25:duration=1",
        "-c:v", "libx264", "-preset", "ultrafast", "-pix_fmt", "yuv420p", path,
    )  # fmt: skip
    return path


def _render(tree: Tree, cfg: Config, journal: Journal, sub: dict) -> tuple[RenderJob, Manifest, Path]:
    job = accept.accept_bytes(tree, cfg, json.dumps(sub).encode(), "tester")
    assert claim.claim(tree, "w1", job.job_id)
    ctx = execute.Context(tree, cfg, "w1", journal, threading.Event())
    assert execute.execute(ctx, job.job_id) == "complete"
    m = decode(tree.manifest_file(job.job_id).read_bytes(), Manifest)
    return job, m, tree.root / m.output.store_path


@pytest.mark.parametrize(
    ("name", "label", "frame"),
    [
        ("shrink-9x16", _text(size=36, fit="shrink", position="bottom"), (360, 640)),
        ("wrap-9x16", _text(size=36, fit="wrap", position="top-right"), (360, 640)),
        ("fits-16x9", _text("Crème brûlée – £5", size=30, position="center"), (640, 360)),
        ("social-1x1", _text("Only £9.99\nthis week", size=40, position="bottom-left"), (360, 360)),
        ("fallback-font", _text("𝐒𝐀𝐋𝐄 −50 %", size=40, position="top-left"), (640, 360)),
    ],
)
def test_rendered_label_pixels_lie_inside_the_planned_box(
    tree, cfg, journal, assets, dark, name, label, frame
):
    if fonts.for_text(label["text"])[1]:
        pytest.skip("no installed font has every glyph of this label")
    (assets / "dark.mp4").write_bytes(dark.read_bytes())
    steps = [
        {"op": "fit", "width": frame[0], "height": frame[1], "mode": "crop"},
        {**label, "safe_area": "social"} if name.startswith("social") else label,
        {"op": "encode", "preset": "ultrafast", "crf": 0},
    ]
    sub = minimal(assets, name=name, steps=steps, sources={"clip": str(assets / "dark.mp4")})
    job, manifest, out = _render(tree, cfg, journal, sub)
    (layer,) = job.layers
    # The render drew the frozen plan: numbers, not expressions, and the resolved font file.
    cmd = ffcommand.command(
        job.recipe, {s.role: s for s in job.sources}, job.output.file, cfg.render, job.layers
    )
    (fg,) = [cmd.argv[i + 1] for i, a in enumerate(cmd.argv) if a == "-filter_complex"]
    assert (
        f"fontfile={layer.font_file}:fontsize={layer.size}" in fg and f"x={layer.at[0]}:y={layer.at[1]}" in fg
    )
    assert manifest.validation.layers is not None and manifest.validation.layers[0].verdict == "inside"
    assert any(c.name == "layers" and c.ok for c in manifest.validation.checks)
    gray, w, h = _frame(out, 0.4)
    ink = _bright_box(gray, w, h)
    box, safe = Rect(*layer.box), Rect(*layer.safe)
    assert ink is not None, "no label was drawn"
    grown = Rect(box.x - 2, box.y - 2, box.w + 4, box.h + 4)
    assert grown.contains(ink), f"label pixels {ink} outside the planned box {box}"
    # The box is tight: a line without descenders leaves a little room below.
    assert ink.w >= box.w - 6 and ink.h >= box.h - max(6, box.h // 5), f"box {box} is much bigger than {ink}"
    assert safe.contains(ink)
    if "wrap" in name:
        assert layer.text is not None and layer.text.count("\n") == 1
    if "shrink" in name:
        assert layer.size is not None and layer.size < 36
        shown = run_cli("show", job.job_id, spool=tree, check=True).stdout
        x, y, w, h = layer.box
        assert f"layer steps[1] text size {layer.size}: {w}x{h} at {x},{y}; safe area 90 %" in shown
        assert shown.rstrip().count(": inside") == 1


def test_a_label_that_cannot_fit_is_rejected_at_submit_and_never_rendered(tree, cfg, journal, assets):
    steps = [{"op": "fit", "width": 360, "height": 640}, _text(size=36), {"op": "encode"}]
    sub = minimal(assets, name="clipped", steps=steps)
    with pytest.raises(InvalidInput, match=r"recipe\.steps\[1\]: text is 543 px wide at size 36"):
        accept.accept_bytes(tree, cfg, json.dumps(sub).encode(), "tester")
    assert not list(tree.pending.iterdir())


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    text=st.one_of(
        st.text(st.sampled_from("aWil .,!£–—éßÅ\n  "), min_size=1, max_size=300),  # drawable: layout paths
        st.text(st.characters(exclude_categories=("Cs",)), min_size=1, max_size=60),  # anything at all
    ).filter(lambda t: "\x00" not in t),
    size=st.integers(6, 600),
    fit=st.sampled_from(["reject", "shrink", "wrap"]),
    position=st.sampled_from(POSITIONS),
    box=st.booleans(),
)
def test_any_label_is_placed_inside_or_rejected_with_a_located_reason(text, size, fit, position, box):
    label = _text(text, size=size, fit=fit, position=position, box=box, min_size=6)
    try:
        (layer,) = _plan([label], (720, 1280), "social")
    except InvalidInput as exc:
        assert exc.field.startswith("recipe.steps[1]") and exc.problem
        return
    assert Rect(*layer.safe).contains(Rect(*layer.box))
    assert layer.size is not None and 6 <= layer.size <= size


def test_glyphs_the_default_font_lacks_come_from_one_font_that_has_them_all():
    text = "𝐒𝐀𝐋𝐄 −50 %"  # mathematical bold letters: not in DejaVu Sans, in DejaVu Math TeX Gyre
    if not fonts.missing(text, FONT):
        pytest.skip("the default font has these glyphs")
    path, lacking = fonts.for_text(text, "")
    if lacking:
        pytest.skip("no installed font has all of these glyphs")
    (layer,) = _plan([_text(text, size=40)], (1280, 720))
    assert layer.font_file == path != FONT and fonts.missing(text, path) == []
    # A configured font is never swapped: the label is rejected instead.
    rec = msgspec.convert({"input": "clip", "steps": [_text(text, size=40)]}, Recipe)
    with pytest.raises(InvalidInput, match=r"recipe\.steps\[0\]\.text: the font .* has no glyph for '𝐒'"):
        layers.plan(rec, {"clip": _source()}, Layers(), Render(font_file=FONT))


@pytest.mark.parametrize("change", ["deleted", "another version"])
def test_a_host_without_the_measured_font_fails_as_a_host_fault_and_never_draws(
    tree, cfg, journal, assets, tmp_path, change
):
    font = tmp_path / "house.ttf"
    font.write_bytes(Path(FONT).read_bytes())
    cfg = msgspec.structs.replace(cfg, render=msgspec.structs.replace(cfg.render, font_file=str(font)))
    steps = [
        {"op": "trim", "duration": 0.4},
        _text("Only £9.99", size=20),
        {"op": "encode", "preset": "ultrafast"},
    ]
    job = accept.accept_bytes(
        tree, cfg, json.dumps(minimal(assets, name="fonted", steps=steps)).encode(), "t"
    )
    assert isinstance(job, RenderJob) and job.layers[0].font_file == str(font.resolve())
    if change == "deleted":
        font.unlink()
    else:
        font.write_bytes(Path(FONT).read_bytes() + b"\0")  # same name, other bytes
    assert claim.claim(tree, "w1", job.job_id)
    outcome = execute.execute(execute.Context(tree, cfg, "w1", journal, threading.Event()), job.job_id)
    assert outcome in ("blocked", "host-failed")
    failure = json.loads((tree.attempt_dir(job.job_id, 1) / "failure.json").read_text())
    assert failure["property"] == "recipe.steps[1].font" and failure["fault"] == "host"
    assert failure["expected"] == job.layers[0].font_sha256
    assert not (tree.attempt_dir(job.job_id, 1) / "work" / "fonted.mp4").exists()
