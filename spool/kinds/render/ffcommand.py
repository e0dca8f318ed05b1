"""Recipe -> one FFmpeg command: the only module that knows FFmpeg's filter syntax (but for
the poster frame's one scale filter, in spool.media.thumbs).

:func:`command` turns a checked recipe (spool.kinds.render.recipe) into an argument list.

Text never becomes filter syntax: a label's characters go into a file in the
attempt's ``work/`` folder that ``drawtext`` reads with ``expansion=none``; the
command line carries only that file's fixed, spool-made name.

Layers planned at acceptance (``Job.layers``, spool.kinds.render.layers) are drawn exactly
as planned: the label's size, line breaks and font file and each layer's x, y
are numbers here, not expressions, so the picture is the one that was checked.
A job accepted before layers were planned renders as it always did.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from spool.kinds.render.recipe import (
    DEFAULT_CRF,
    Encode,
    Fit,
    Fps,
    Overlay,
    Recipe,
    Text,
    audio_codec,
    pix_fmt,
    shape,
)
from spool.kinds.render.timeline import handles

if TYPE_CHECKING:
    import ffmpeg

    from spool.core.config import Render
    from spool.core.model import LayerBox, Source
    from spool.kinds.render.timeline import Timeline

#: FFmpeg encoder per codec name used in recipes.
VIDEO_ENCODERS = {"h264": "libx264", "hevc": "libx265", "vp9": "libvpx-vp9", "prores": "prores_ks"}
AUDIO_ENCODERS = {"aac": "aac", "opus": "libopus", "pcm_s16le": "pcm_s16le"}

_VP9_SPEED = {
    "ultrafast": 8,
    "superfast": 7,
    "veryfast": 6,
    "faster": 5,
    "fast": 4,
    "medium": 4,
    "slow": 2,
    "slower": 1,
    "veryslow": 0,
}


@dataclass(frozen=True)
class Command:
    """An FFmpeg invocation: ``argv`` to run with ``cwd`` = the attempt's work
    folder, after writing ``files`` (name -> bytes) there."""

    argv: list[str]
    files: dict[str, bytes]
    duration: float | None


def command(
    recipe: Recipe,
    sources: Mapping[str, Source],
    output_name: str,
    render: Render,
    layers: Sequence[LayerBox] = (),
    timeline: Timeline | None = None,
) -> Command:
    """Recipe -> one FFmpeg argument list. Pure: no I/O, no shell.

    Inputs are opened as ``file:`` URLs with a file-only protocol whitelist, so
    a source can never make FFmpeg read another protocol or the network.
    """
    # here: accepting and showing a job stay off ffmpeg-python (+~11 ms)
    import ffmpeg  # here, not at the top: every spool command imports recipe, few render

    sh = shape(recipe, sources)
    files: dict[str, bytes] = {}
    inputs: dict[str, ffmpeg.nodes.FilterableStream] = {}

    def open_input(role: str, **opts: object) -> ffmpeg.nodes.FilterableStream:
        if role not in inputs:
            inputs[role] = ffmpeg.input("file:" + sources[role].path, protocol_whitelist="file", **opts)
        return inputs[role]

    trim = recipe.trim
    main_opts: dict[str, object] = {}
    if trim.start:
        main_opts["ss"] = _num(trim.start)
    if trim.duration is not None:
        main_opts["t"] = _num(trim.duration)
    if (
        timeline is not None
    ):  # an edit: its clips, gaps and dissolves are the input (spool.kinds.render.timeline)
        video, main_audio = _timeline(timeline, sources)
    else:
        main = open_input(recipe.input, **main_opts)
        video, main_audio = main.video, main.audio
    width, _ = _dims(sources[recipe.input])
    labels = 0
    planned = {layer.step: layer for layer in layers}
    for i, s in enumerate(recipe.steps):
        layer = planned.get(i)
        if isinstance(s, Fit):
            width = s.width
            video = _fit(video, s)
        elif isinstance(s, Fps):
            video = video.filter("fps", fps=_num(s.fps))
        elif isinstance(s, Overlay):
            if layer is not None:
                logo = open_input(s.source).video.filter("scale", layer.box[2], layer.box[3])
                x, y = str(layer.at[0]), str(layer.at[1])
            else:
                logo_w = max(2, round(width * s.scale / 2) * 2)
                logo = open_input(s.source).video.filter("scale", logo_w, -2)
                x, y = _place(s.position, s.margin, "main_w", "main_h", "overlay_w", "overlay_h")
            video = ffmpeg.overlay(video, logo, x=x, y=y, eof_action="repeat", format="auto")
        elif isinstance(s, Text):
            name = f"label-{labels}.txt"
            labels += 1
            text = layer.text if layer is not None and layer.text is not None else s.text
            files[name] = text.encode("utf-8")
            video = _text(video, s, name, render.font_file, layer)

    enc = recipe.encode
    video = video.filter("format", pix_fmt(enc))
    streams: list[ffmpeg.nodes.FilterableStream] = [video]
    aud = recipe.audio
    if sh.has_audio:
        if aud.mode == "keep":
            a = main_audio
        elif aud.mode == "replace":
            assert aud.source
            a = open_input(aud.source).audio
        else:  # mix
            assert aud.source
            bed = open_input(aud.source).audio.filter("volume", _num(aud.mix_level))
            a = ffmpeg.filter([main_audio, bed], "amix", inputs=2, duration="first", normalize=0)
        if aud.loudness is not None:
            a = a.filter("loudnorm", I=_num(aud.loudness), TP=-1.5, LRA=11)
        a = a.filter("aformat", sample_rates=48000, channel_layouts="stereo")
        streams.append(a)

    out_opts: dict[str, object] = _encode_options(enc, sh.has_audio, render)
    if sh.duration is not None:
        out_opts["t"] = _num(sh.duration)
    out = ffmpeg.output(*streams, "file:" + output_name, **out_opts)
    argv = [
        render.ffmpeg,
        "-nostdin",
        "-hide_banner",
        "-nostats",
        "-y",
        "-progress",
        "pipe:1",
        "-loglevel",
        "info",
        *ffmpeg.get_args(out),
    ]
    return Command(argv=argv, files=files, duration=sh.duration)


def _timeline(tl: Timeline, sources: Mapping[str, Source]) -> tuple[Any, Any]:
    """A frozen timeline -> its picture (and sound, if it has any) as filter graph streams.

    Each item is a segment on the timeline's canvas at its rate, a clip lengthened by the
    handles its dissolves show (spool.kinds.render.timeline.handles); segments join by ``concat`` at a
    cut and ``xfade`` / ``acrossfade`` over a dissolve, whose offset is the length so far
    less the dissolve, so the whole lasts exactly the timeline's duration."""
    import ffmpeg  # here: accepting and showing a job stay off ffmpeg-python (+~11 ms)

    w, h, rate = tl.width, tl.height, tl.rate
    video: Any = None
    audio: Any = None
    length = 0.0
    for k, it in enumerate(tl.items):
        before, after = handles(tl, k)
        seconds = before + it.duration + after
        if it.kind == "gap":
            v = ffmpeg.input(f"color=c=black:s={w}x{h}:r={_num(rate)}", f="lavfi", t=_num(seconds)).video
            a = ffmpeg.input("anullsrc=r=48000:cl=stereo", f="lavfi", t=_num(seconds)).audio
        else:
            src = sources[it.source or ""]
            clip = ffmpeg.input(
                "file:" + src.path, protocol_whitelist="file", ss=_num(it.start - before), t=_num(seconds)
            )
            v = clip.video.filter("scale", w, h, force_original_aspect_ratio="decrease", force_divisible_by=2)
            v = v.filter("pad", w, h, "(ow-iw)/2", "(oh-ih)/2", color="black").filter("setsar", 1)
            a = clip.audio
        v = v.filter("fps", _num(rate)).filter("format", "yuv420p")
        v = v.filter("trim", duration=_num(seconds)).filter("setpts", "PTS-STARTPTS")
        v = v.filter("settb", "AVTB")  # concat's time base: xfade joins only inputs that share one
        if tl.audio:
            a = a.filter("aformat", sample_rates=48000, channel_layouts="stereo")
            a = a.filter("atrim", duration=_num(seconds)).filter("asetpts", "PTS-STARTPTS")
        dissolve = next((d for d in tl.dissolves if d.cut == k), None)
        if video is None:
            video, audio, length = v, a, seconds
        elif dissolve is not None:
            d = dissolve.before + dissolve.after
            video = ffmpeg.filter(
                [video, v], "xfade", transition="fade", duration=_num(d), offset=_num(length - d)
            )
            if tl.audio:
                audio = ffmpeg.filter([audio, a], "acrossfade", d=_num(d))
            length += seconds - d
        else:
            video = ffmpeg.concat(video, v, v=1, a=0)
            if tl.audio:
                audio = ffmpeg.concat(audio, a, v=0, a=1)
            length += seconds
    return video, audio if tl.audio else None


def _num(x: float) -> str:
    """Numbers as FFmpeg reads them: no exponent, no trailing zeros."""
    return f"{x:.6f}".rstrip("0").rstrip(".") if isinstance(x, float) else str(x)


def _dims(src: Source) -> tuple[int, int]:
    v = src.probe.video
    assert v is not None
    return v.width, v.height


def _fit(video: ffmpeg.nodes.FilterableStream, s: Fit) -> ffmpeg.nodes.FilterableStream:
    # Square the pixels first: an anamorphic source (HDV, PAL widescreen) is
    # stored narrower than it is shown, and fitting its stored size would squeeze it.
    video = video.filter("scale", "trunc(iw*sar/2)*2", "ih").filter("setsar", 1)
    if s.mode == "pad":
        video = video.filter(
            "scale", s.width, s.height, force_original_aspect_ratio="decrease", force_divisible_by=2
        )
        video = video.filter("pad", s.width, s.height, "(ow-iw)/2", "(oh-ih)/2", color=s.pad_colour)
    else:
        video = video.filter("scale", s.width, s.height, force_original_aspect_ratio="increase")
        video = video.filter("crop", s.width, s.height)
    return video.filter("setsar", 1)


def _place(position: str, margin: int, big_w: str, big_h: str, w: str, h: str) -> tuple[str, str]:
    """x, y expressions for a box of size (w, h) placed in a frame (big_w, big_h)."""
    horiz = "left" if "left" in position else "right" if "right" in position else "center"
    vert = "top" if position.startswith("top") else "bottom" if position.startswith("bottom") else "center"
    x = {"left": str(margin), "center": f"({big_w}-{w})/2", "right": f"{big_w}-{w}-{margin}"}[horiz]
    y = {"top": str(margin), "center": f"({big_h}-{h})/2", "bottom": f"{big_h}-{h}-{margin}"}[vert]
    return x, y


def _text(
    video: ffmpeg.nodes.FilterableStream, s: Text, textfile: str, font_file: str, layer: LayerBox | None
) -> ffmpeg.nodes.FilterableStream:
    size = layer.size if layer is not None and layer.size is not None else s.size
    if layer is not None:
        x, y = str(layer.at[0]), str(layer.at[1])
        font_file = layer.font_file or font_file
    else:
        x, y = _place(s.position, s.margin, "w", "h", "text_w", "text_h")
    opts: dict[str, object] = {
        "textfile": textfile,
        "expansion": "none",
        "fontsize": size,
        "fontcolor": s.colour,
        "x": x,
        "y": y,
    }
    if font_file:
        opts["fontfile"] = font_file
    else:
        opts["font"] = "Sans"
    if s.box:
        # spool.kinds.render.layers.border computes the same width when it measures the label.
        opts.update(box=1, boxcolor=s.box_colour, boxborderw=max(4, size // 5))
    if s.start is not None or s.end is not None:
        start = _num(s.start or 0.0)
        opts["enable"] = f"between(t,{start},{_num(s.end)})" if s.end is not None else f"gte(t,{start})"
    return video.filter("drawtext", **opts)


def _encode_options(enc: Encode, has_audio: bool, render: Render) -> dict[str, object]:
    opts: dict[str, object] = {"c:v": VIDEO_ENCODERS[enc.video_codec]}
    codec = enc.video_codec
    if codec == "prores":
        opts["profile:v"] = 3 if pix_fmt(enc).startswith("yuv422") else 4
    elif enc.video_bitrate is not None:
        opts["b:v"] = enc.video_bitrate
    else:
        opts["crf"] = enc.crf if enc.crf is not None else DEFAULT_CRF[codec]
        if codec == "vp9":
            opts["b:v"] = 0  # constant-quality mode
    if codec in ("h264", "hevc"):
        opts["preset"] = enc.preset or "medium"
    if codec == "hevc":
        opts["tag:v"] = "hvc1"  # plays in Apple players
        opts["x265-params"] = "log-level=error"
    if codec == "vp9":
        opts["deadline"] = "good"
        opts["cpu-used"] = _VP9_SPEED[enc.preset or "fast"]
        opts["row-mt"] = 1
    if render.threads:
        opts["threads"] = render.threads
    if has_audio:
        ac = audio_codec(enc)
        opts["c:a"] = AUDIO_ENCODERS[ac]
        if ac != "pcm_s16le":
            opts["b:a"] = enc.audio_bitrate or "128k"
    if enc.container in ("mp4", "mov") and enc.faststart:
        opts["movflags"] = "+faststart"
    opts["f"] = enc.container
    # Deliverables carry none of the sources' metadata or chapters: a source's
    # tags (titles, comments, locations, tokens) are not the ad's to publish.
    opts["map_metadata"] = -1
    opts["map_chapters"] = -1
    return opts
