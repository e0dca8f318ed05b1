"""The recipe vocabulary and the checks a recipe must pass at acceptance.

A recipe names its main input (a source role) and lists steps:

=========  ==============================================================
``trim``   start, duration: the part of the input clip to use
``fit``    width, height, mode pad|crop: the 16:9, 9:16, 1:1 variants
``fps``    output frame rate
``overlay``  an image (or clip) source such as a logo: position, margin, scale
``text``   a label: text, position, size, colour, box, time range
``audio``  keep | drop | replace | mix with a source; optional loudness (LUFS)
``encode`` container mp4|mov|webm, codec h264|hevc|vp9|prores, quality, audio
=========  ==============================================================

Adding a step means: a Struct here, a case in :func:`check`, in
:func:`default_expect` if it changes the output's shape, and in
:func:`spool.kinds.render.ffcommand.command`, the only module that knows FFmpeg's filter
syntax. Where text and logos may sit is spool.kinds.render.layers' concern.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Literal

import msgspec

from spool.core.errors import InvalidInput
from spool.core.model import Expect
from spool.core.submission import Role

if TYPE_CHECKING:
    from spool.core.model import Expect, Source

Position = Literal[
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

#: Colour names FFmpeg knows that a label or pad is likely to use; hex works too.
NAMED_COLOURS = frozenset(
    "white black red green blue yellow cyan magenta gray grey orange purple pink "
    "brown navy teal silver gold maroon olive lime transparent".split()
)
Colour = Annotated[
    str,
    msgspec.Meta(
        pattern=r"^(#[0-9A-Fa-f]{6}([0-9A-Fa-f]{2})?|[a-z]{3,12})(@(0(\.[0-9]{1,3})?|1(\.0{1,3})?))?$"
    ),
]
Seconds = Annotated[float, msgspec.Meta(ge=0, le=86400)]
Bitrate = Annotated[str, msgspec.Meta(pattern=r"^[1-9][0-9]{0,6}(k|M)?$")]


class Step(msgspec.Struct, tag_field="op", forbid_unknown_fields=True, kw_only=True):
    """Base of every step; ``op`` names it in JSON."""


class Trim(Step, tag="trim"):
    start: Seconds = 0.0
    duration: Annotated[float, msgspec.Meta(gt=0, le=86400)] | None = None


class Fit(Step, tag="fit"):
    width: Annotated[int, msgspec.Meta(ge=16, le=8192, multiple_of=2)]
    height: Annotated[int, msgspec.Meta(ge=16, le=8192, multiple_of=2)]
    mode: Literal["pad", "crop"] = "pad"
    pad_colour: Colour = "black"


class Fps(Step, tag="fps"):
    fps: Annotated[float, msgspec.Meta(gt=0, le=240)]


#: A safe area: a centred fraction of the frame, or a preset name (spool.kinds.render.layers.PRESETS).
SafeArea = (
    Annotated[float, msgspec.Meta(ge=0.5, le=1.0)]
    | Annotated[str, msgspec.Meta(pattern=r"^[a-z][a-z0-9-]{0,31}$")]
)


class Overlay(Step, tag="overlay"):
    source: Role
    position: Position = "top-right"
    margin: Annotated[int, msgspec.Meta(ge=0, le=2000)] = 24
    scale: Annotated[float, msgspec.Meta(gt=0, le=1)] = 0.15  # of the frame's width
    safe_area: SafeArea | None = None  # None: [layers] safe_area of spool.toml


class Text(Step, tag="text"):
    text: Annotated[str, msgspec.Meta(min_length=1, max_length=2000)]
    position: Position = "bottom-left"
    size: Annotated[int, msgspec.Meta(ge=6, le=600)] = 48
    colour: Colour = "white"
    box: bool = False
    box_colour: Colour = "black@0.5"
    margin: Annotated[int, msgspec.Meta(ge=0, le=2000)] = 24
    start: Seconds | None = None
    end: Seconds | None = None
    #: What to do when the label does not fit the safe area at ``size``: reject the
    #: job, shrink to the largest size that fits (not below ``min_size``; default
    #: half of ``size``), or wrap at spaces into at most ``max_lines`` lines.
    fit: Literal["reject", "shrink", "wrap"] = "reject"
    min_size: Annotated[int, msgspec.Meta(ge=6, le=600)] | None = None
    max_lines: Annotated[int, msgspec.Meta(ge=1, le=20)] = 2
    safe_area: SafeArea | None = None  # None: [layers] safe_area of spool.toml


class Audio(Step, tag="audio"):
    mode: Literal["keep", "drop", "replace", "mix"] = "keep"
    source: Role | None = None
    mix_level: Annotated[float, msgspec.Meta(ge=0, le=4)] = 0.5  # gain of the mixed-in bed
    loudness: Annotated[float, msgspec.Meta(ge=-70, le=-5)] | None = None  # target LUFS


class Encode(Step, tag="encode"):
    container: Literal["mp4", "mov", "webm"] = "mp4"
    video_codec: Literal["h264", "hevc", "vp9", "prores"] = "h264"
    crf: Annotated[int, msgspec.Meta(ge=0, le=63)] | None = None
    video_bitrate: Bitrate | None = None
    preset: (
        Literal[
            "ultrafast",
            "superfast",
            "veryfast",
            "faster",
            "fast",
            "medium",
            "slow",
            "slower",
            "veryslow",
        ]
        | None
    ) = None
    pix_fmt: Literal["yuv420p", "yuv422p", "yuv444p", "yuv420p10le", "yuv422p10le", "yuv444p10le"] | None = (
        None
    )
    audio_codec: Literal["aac", "opus", "pcm_s16le"] | None = None
    audio_bitrate: Bitrate | None = None
    faststart: bool = True


AnyStep = Trim | Fit | Fps | Overlay | Text | Audio | Encode


class Recipe(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """``input`` is the role of the main clip; ``steps`` apply in order."""

    input: Role
    steps: Annotated[list[AnyStep], msgspec.Meta(min_length=1, max_length=64)]

    def first(self, kind: type[Step]) -> Step | None:
        return next((s for s in self.steps if isinstance(s, kind)), None)

    @property
    def encode(self) -> Encode:
        enc = self.first(Encode)
        return enc if isinstance(enc, Encode) else Encode()

    @property
    def trim(self) -> Trim:
        t = self.first(Trim)
        return t if isinstance(t, Trim) else Trim()

    @property
    def audio(self) -> Audio:
        a = self.first(Audio)
        return a if isinstance(a, Audio) else Audio()

    def roles(self) -> set[str]:
        """Every source role the recipe uses."""
        used = {self.input}
        for s in self.steps:
            if isinstance(s, (Overlay, Audio)) and s.source:
                used.add(s.source)
        return used


# -- codec facts -------------------------------------------------------------

#: Codecs each container may carry.
CONTAINER_VIDEO = {
    "mp4": {"h264", "hevc", "vp9"},
    "mov": {"h264", "hevc", "prores"},
    "webm": {"vp9"},
}
CONTAINER_AUDIO = {"mp4": {"aac", "opus"}, "mov": {"aac", "pcm_s16le"}, "webm": {"opus"}}
DEFAULT_AUDIO = {"mp4": "aac", "mov": "aac", "webm": "opus"}
DEFAULT_CRF = {"h264": 20, "hevc": 24, "vp9": 32}
MAX_CRF = {"h264": 51, "hevc": 51, "vp9": 63}
EXTENSIONS = {"mp4": ".mp4", "mov": ".mov", "webm": ".webm"}


def pix_fmt(enc: Encode) -> str:
    if enc.pix_fmt:
        return enc.pix_fmt
    return "yuv422p10le" if enc.video_codec == "prores" else "yuv420p"


def audio_codec(enc: Encode) -> str:
    return enc.audio_codec or DEFAULT_AUDIO[enc.container]


# -- checks at acceptance -------------------------------------------------------


def check_roles(recipe: Recipe, declared: set[str]) -> None:
    """Every role the recipe names must be declared in ``sources`` (pure; runs first,
    so a typo is reported where it is, not as an unused source)."""
    if recipe.input not in declared:
        raise InvalidInput("recipe.input", f"names source {recipe.input!r}, which sources does not declare")
    for i, s in enumerate(recipe.steps):
        if isinstance(s, (Overlay, Audio)) and s.source and s.source not in declared:
            raise InvalidInput(
                f"recipe.steps[{i}].source", f"names source {s.source!r}, which sources does not declare"
            )


def check(recipe: Recipe, sources: Mapping[str, Source]) -> None:
    """Cross-field checks the types cannot express. Raises :class:`InvalidInput`
    naming the field; returns only for a recipe that can be rendered."""
    steps = recipe.steps
    once = (Trim, Fit, Fps, Audio, Encode)
    for kind in once:
        idx = [i for i, s in enumerate(steps) if isinstance(s, kind)]
        if len(idx) > 1:
            raise InvalidInput(
                f"recipe.steps[{idx[1]}].op",
                f"step {kind.__struct_config__.tag!r} may appear only once",
            )
    for i, s in enumerate(steps):
        if isinstance(s, Encode) and i != len(steps) - 1:
            raise InvalidInput(f"recipe.steps[{i}].op", "the encode step must be the last step")

    main = _source(sources, recipe.input, "recipe.input")
    if main.probe.video is None or main.probe.still:
        raise InvalidInput("recipe.input", f"source {recipe.input!r} is not a video clip")

    for i, s in enumerate(steps):
        at = f"recipe.steps[{i}]"
        if isinstance(s, Trim):
            dur = main.probe.duration
            if dur is not None and s.start >= dur:
                raise InvalidInput(f"{at}.start", f"{s.start:g} s is past the end of the input ({dur:g} s)")
        elif isinstance(s, (Fit, Text)):
            for name in ("pad_colour", "colour", "box_colour"):
                value = getattr(s, name, None)
                if value and not value.startswith("#") and value.split("@")[0] not in NAMED_COLOURS:
                    raise InvalidInput(
                        f"{at}.{name}", f"{value!r} is not a colour name spool knows; use #rrggbb"
                    )
            if isinstance(s, Text) and s.start is not None and s.end is not None and s.end <= s.start:
                raise InvalidInput(f"{at}.end", "must be later than start")
            if isinstance(s, Text) and "\x00" in s.text:
                raise InvalidInput(f"{at}.text", "must not contain NUL characters")
            if isinstance(s, Text) and s.min_size is not None and s.min_size > s.size:
                raise InvalidInput(f"{at}.min_size", f"{s.min_size} is larger than size {s.size}")
        elif isinstance(s, Overlay):
            src = _source(sources, s.source, f"{at}.source")
            if src.probe.video is None:
                raise InvalidInput(f"{at}.source", f"source {s.source!r} has no picture to overlay")
        elif isinstance(s, Audio):
            _check_audio(s, at, main, sources)
        elif isinstance(s, Encode):
            _check_encode(s, at)


def _check_audio(s: Audio, at: str, main: Source, sources: Mapping[str, Source]) -> None:
    if s.mode in ("replace", "mix"):
        if not s.source:
            raise InvalidInput(f"{at}.source", f"is required when mode is {s.mode!r}")
        src = _source(sources, s.source, f"{at}.source")
        if src.probe.audio is None:
            raise InvalidInput(f"{at}.source", f"source {s.source!r} has no audio stream")
        if s.mode == "mix" and main.probe.audio is None:
            raise InvalidInput(f"{at}.mode", "mix needs the input clip to have audio; use replace")
    elif s.source:
        raise InvalidInput(f"{at}.source", f"is not used when mode is {s.mode!r}; remove it")
    if s.mode == "drop" and s.loudness is not None:
        raise InvalidInput(f"{at}.loudness", "has no effect when audio is dropped; remove it")


def _check_encode(s: Encode, at: str) -> None:
    if s.video_codec not in CONTAINER_VIDEO[s.container]:
        raise InvalidInput(
            f"{at}.video_codec",
            f"{s.video_codec} cannot go in {s.container}; use one of "
            f"{', '.join(sorted(CONTAINER_VIDEO[s.container]))}",
        )
    ac = audio_codec(s)
    if ac not in CONTAINER_AUDIO[s.container]:
        raise InvalidInput(
            f"{at}.audio_codec",
            f"{ac} cannot go in {s.container}; use one of {', '.join(sorted(CONTAINER_AUDIO[s.container]))}",
        )
    if s.video_codec == "prores":
        if s.crf is not None or s.video_bitrate is not None:
            raise InvalidInput(f"{at}.crf", "prores has no crf or bitrate setting; remove it")
        if pix_fmt(s) not in ("yuv422p10le", "yuv444p10le"):
            raise InvalidInput(f"{at}.pix_fmt", "prores needs yuv422p10le or yuv444p10le")
    elif s.crf is not None and s.crf > MAX_CRF[s.video_codec]:
        raise InvalidInput(f"{at}.crf", f"must be at most {MAX_CRF[s.video_codec]} for {s.video_codec}")
    if s.crf is not None and s.video_bitrate is not None:
        raise InvalidInput(f"{at}.video_bitrate", "give either crf or video_bitrate, not both")
    if audio_codec(s) == "pcm_s16le" and s.audio_bitrate:
        raise InvalidInput(f"{at}.audio_bitrate", "pcm_s16le is uncompressed; remove audio_bitrate")


def _source(sources: Mapping[str, Source], role: str, field: str) -> Source:
    try:
        return sources[role]
    except KeyError:
        raise InvalidInput(
            field, f"names source {role!r}, which the submission's sources do not declare"
        ) from None


# -- what the output must look like ----------------------------------------------


@dataclass(frozen=True)
class Shape:
    """The output's picture and timing, derived from the recipe and its sources."""

    width: int
    height: int
    fps: float
    duration: float | None
    has_audio: bool


def shape(recipe: Recipe, sources: Mapping[str, Source]) -> Shape:
    main = sources[recipe.input]
    v = main.probe.video
    assert v is not None
    width, height, fps = v.width, v.height, v.fps
    for s in recipe.steps:
        if isinstance(s, Fit):
            width, height = s.width, s.height
        elif isinstance(s, Fps):
            fps = s.fps
    trim = recipe.trim
    duration = trim.duration
    if main.probe.duration is not None:
        remaining = max(main.probe.duration - trim.start, 0.0)
        duration = remaining if duration is None else min(duration, remaining)
    mode = recipe.audio.mode
    has_audio = mode in ("replace", "mix") or (mode == "keep" and main.probe.audio is not None)
    return Shape(width, height, fps, duration, has_audio)


def default_expect(recipe: Recipe, sources: Mapping[str, Source], tolerance: float) -> Expect:
    """Expectations implied by the recipe; the validation gate checks them."""
    sh = shape(recipe, sources)
    enc = recipe.encode
    return Expect(
        video_streams=1,
        audio_streams=1 if sh.has_audio else 0,
        subtitle_streams=0,
        video_codec=enc.video_codec,
        audio_codec=audio_codec(enc) if sh.has_audio else None,
        width=sh.width,
        height=sh.height,
        fps=round(sh.fps, 3),
        pix_fmt=pix_fmt(enc),
        duration=round(sh.duration, 3) if sh.duration is not None else None,
        # One frame of slack on top of the configured tolerance: encoders round
        # the last frame, and audio priming can lengthen the container by a frame.
        duration_tolerance=round(tolerance + 1.0 / sh.fps, 3),
    )


#: Bits per pixel a quality-targeted encode rarely exceeds (a generous ceiling,
#: since the estimate only reserves temporary disk).
_BITS_PER_PIXEL = {"h264": 0.25, "hevc": 0.2, "vp9": 0.2, "prores": 3.0}
_AUDIO_BITS = {"aac": 320_000, "opus": 256_000, "pcm_s16le": 48_000 * 16 * 2}


def _bits_per_second(text: str) -> int:
    return int(text[:-1]) * (1000 if text[-1] == "k" else 1_000_000) if text[-1] in "kM" else int(text)


def estimate_bytes(recipe: Recipe, sources: Mapping[str, Source]) -> int:
    """Pure: an upper estimate of the output's size, reserved as temporary disk
    before a render is claimed (twice the estimate covers muxer overhead)."""
    sh = shape(recipe, sources)
    seconds = sh.duration if sh.duration is not None else 3600.0
    enc = recipe.encode
    if enc.video_bitrate is not None:
        video = _bits_per_second(enc.video_bitrate)
    else:
        video = int(sh.width * sh.height * sh.fps * _BITS_PER_PIXEL[enc.video_codec])
    audio = _AUDIO_BITS[audio_codec(enc)] if sh.has_audio else 0
    return int(2 * (video + audio) * seconds / 8) + (1 << 20)


def extension(recipe: Recipe) -> str:
    return EXTENSIONS[recipe.encode.container]
