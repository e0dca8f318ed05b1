"""Required layers: every label and logo lands inside the frame's safe area.

At acceptance, :func:`plan` works out each ``text`` and ``overlay`` step's box
in output pixels, before anything is rendered:

* a label is measured with Pillow's FreeType binding, using the exact font file
  ``drawtext`` will be given (:mod:`spool.kinds.render.fonts`), the way ``drawtext`` lays it
  out (per-glyph integer advances plus kerning; the height from the tallest
  ascender to the lowest descender of the label's glyphs, times the lines),
  plus the box border when ``box`` is on;
* a logo's box is its scaled size (``scale`` of the frame width, height kept in
  proportion, both even).

The box is placed by ``position``: it sits ``margin`` px from the frame's edge
or at the safe area's edge, whichever is farther in (a layer never starts
outside the safe area), and centred positions centre in the safe area. A box
that still does not fit is rejected with a reason naming the step and the
numbers, unless the text step says ``"fit": "shrink"`` (largest size that fits,
not below ``min_size``) or ``"fit": "wrap"`` (break at spaces into at most
``max_lines``). A character the font has no glyph for is rejected too.

The plan is frozen in the job (``RenderJob.layers``, spool.kinds.render.kind): the command builder draws each
label at exactly the planned position, size, line breaks and font file, so the
render is what was checked, whatever fonts another worker has. The gate
(:func:`spool.media.safearea.judge`) checks the planned boxes again against the safe area of the
frame size the output really has.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from spool.core.errors import Failed, InvalidInput
from spool.core.model import LayerBox
from spool.kinds.render import fonts
from spool.kinds.render.recipe import Fit, Overlay, Recipe, Text, shape
from spool.media.safearea import Rect, aspect, safe_area

if TYPE_CHECKING:
    from PIL.ImageFont import FreeTypeFont

    from spool.core.config import Layers, Render
    from spool.core.model import LayerBox, Source


# -- measuring text as drawtext draws it -----------------------------------------


@functools.lru_cache(maxsize=128)
def _font(path: str, size: int) -> FreeTypeFont:
    from PIL import ImageFont  # here: only acceptance of a text step needs Pillow

    # BASIC layout is FreeType alone, like drawtext (no HarfBuzz shaping).
    return ImageFont.truetype(path, size, layout_engine=ImageFont.Layout.BASIC)


@functools.lru_cache(maxsize=4096)
def _advance(path: str, size: int, ch: str) -> int:
    return int(_font(path, size).getlength(ch))


@functools.lru_cache(maxsize=4096)
def _kern(path: str, size: int, pair: str) -> int:
    f = _font(path, size)
    return round(f.getlength(pair) - f.getlength(pair[0]) - f.getlength(pair[1]))


@functools.lru_cache(maxsize=4096)
def _ink(path: str, size: int, ch: str) -> tuple[int, int]:
    """(top above the baseline, bottom below it) of one glyph's pixel box; an empty
    glyph (a space) counts as the baseline, as FreeType's box of it is all zeros."""
    left, top, right, bottom = _font(path, size).getbbox(ch, anchor="ls")
    if left == right or top == bottom:
        return 0, 0
    return -int(top), -int(bottom)


def line_width(line: str, path: str, size: int) -> int:
    """drawtext's width of one line: each glyph's advance in whole pixels, plus kerning."""
    x = 0
    for i, ch in enumerate(line):
        x += _advance(path, size, ch)
        if i:
            x += _kern(path, size, line[i - 1 : i + 1])
    return x


def measure(text: str, path: str, size: int) -> tuple[int, int]:
    """drawtext's ``text_w`` x ``text_h`` for ``text``: lines split at ``\\n``, ``\\r``
    or ``\\r\\n`` as drawtext splits them; every character's glyph (newlines too,
    which drawtext loads like any other) counts towards the line height."""
    lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    width = max(line_width(line, path, size) for line in lines)
    tops, bottoms = zip(*(_ink(path, size, ch) for ch in set(text)), strict=True)
    glyph_h = max(tops) - min(bottoms)  # drawtext's max_glyph_h; lines are this far apart
    return width, glyph_h * len(lines)  # line_spacing is 0


def border(step: Text, size: int) -> int:
    """The box border drawtext adds around a boxed label, in px (0 without a box)."""
    return max(4, size // 5) if step.box else 0


def min_size(step: Text) -> int:
    return step.min_size if step.min_size is not None else max(6, math.ceil(step.size / 2))


def wrap(text: str, path: str, size: int, width: int) -> list[str] | str:
    """Greedy break at spaces so every line is at most ``width`` px; the lines, or
    the first word that is wider on its own."""
    out: list[str] = []
    for para in text.split("\n"):
        line = ""
        for word in para.split(" "):
            if word and line_width(word, path, size) > width:
                return word
            trial = f"{line} {word}" if line else word
            if line and line_width(trial, path, size) > width:
                out.append(line)
                line = word
            else:
                line = trial
        out.append(line)
    return out


# -- placing boxes in the frame ------------------------------------------------------


def place(position: str, margin: int, w: int, h: int, frame: tuple[int, int], safe: Rect) -> Rect:
    """A w x h box at ``position``: ``margin`` from the frame edge or at the safe
    area's edge, whichever is farther in; centred positions centre in the safe area."""
    fw, fh = frame
    if "left" in position:
        x = max(margin, safe.x)
    elif "right" in position:
        x = min(fw - margin, safe.right) - w
    else:
        x = safe.x + (safe.w - w) // 2
    if position.startswith("top"):
        y = max(margin, safe.y)
    elif position.startswith("bottom"):
        y = min(fh - margin, safe.bottom) - h
    else:
        y = safe.y + (safe.h - h) // 2
    return Rect(x, y, w, h)


def _fmt(n: int) -> str:
    return f"{n:,}"


def _why(
    what: str, box: Rect, safe: Rect, safe_name: str, shape_name: str, size: int | None = None
) -> str | None:
    """Why ``box`` is not inside ``safe`` (the first reason), or None."""
    area = f"the {shape_name} safe area ({safe_name})"
    at_size = f" at size {size}" if size is not None else ""
    if box.w > safe.w:
        return f"{what} is {_fmt(box.w)} px wide{at_size}; {area} is {_fmt(safe.w)} px"
    if box.h > safe.h:
        return f"{what} is {_fmt(box.h)} px tall{at_size}; {area} is {_fmt(safe.h)} px"
    if not safe.contains(box):
        return (
            f"{what} at x={box.x}, y={box.y} ({box.w}x{box.h}) leaves {area}, "
            f"x {safe.x}..{safe.right}, y {safe.y}..{safe.bottom}; reduce margin"
        )
    return None


@dataclass(frozen=True)
class _Drawn:
    size: int
    text: str
    font: str
    box: Rect  # outer box, border included
    at: tuple[int, int]  # drawtext's x, y


def _draw(step: Text, text: str, path: str, size: int, frame: tuple[int, int], safe: Rect) -> _Drawn:
    tw, th = measure(text, path, size)
    bw = border(step, size)
    box = place(step.position, step.margin, tw + 2 * bw, th + 2 * bw, frame, safe)
    return _Drawn(size, text, path, box, (box.x + bw, box.y + bw))


def _largest(
    step: Text, text: str, path: str, frame: tuple[int, int], safe: Rect, floor: int
) -> _Drawn | None:
    """The largest size from ``step.size`` down to ``floor`` whose box fits, or None."""
    first = _draw(step, text, path, step.size, frame, safe)
    if safe.contains(first.box):
        return first
    # Width and height grow about linearly with size: start just above the estimate.
    ratio = min(safe.w / max(1, first.box.w), safe.h / max(1, first.box.h))  # a blank label has no height
    size = min(step.size - 1, math.floor(step.size * ratio) + 2)
    while size >= floor:
        d = _draw(step, text, path, size, frame, safe)
        if safe.contains(d.box):
            return d
        size -= 1
    return None


def plan_text(
    step: Text, at: str, frame: tuple[int, int], safe: Rect, safe_name: str, render: Render
) -> _Drawn:
    """The label as it will be drawn, or :class:`InvalidInput` saying why it cannot fit."""
    path = font_for(step.text, at, render)
    shape_name = aspect(*frame)
    drawn = _draw(step, step.text, path, step.size, frame, safe)
    reason = _why("text", drawn.box, safe, safe_name, shape_name, step.size)
    if reason is None:
        return drawn
    if step.fit == "shrink":
        best = _largest(step, step.text, path, frame, safe, min_size(step))
        if best is not None:
            return best
        raise InvalidInput(at, f"{reason} even at min_size {min_size(step)}; shorten the text or use wrap")
    if step.fit == "wrap":
        bw = border(step, step.size)
        lines = wrap(step.text, path, step.size, safe.w - 2 * bw)
        if isinstance(lines, str):
            raise InvalidInput(
                at,
                f"the word {lines!r} is {_fmt(line_width(lines, path, step.size))} px wide at size "
                f"{step.size}; the {shape_name} safe area ({safe_name}) is {_fmt(safe.w)} px; "
                "use a smaller size",
            )
        if len(lines) > step.max_lines:
            raise InvalidInput(
                at,
                f"text needs {len(lines)} lines at size {step.size} to fit the {shape_name} safe area "
                f"({safe_name}, {_fmt(safe.w)} px); max_lines is {step.max_lines}; "
                "raise max_lines or use a smaller size",
            )
        drawn = _draw(step, "\n".join(lines), path, step.size, frame, safe)
        reason = _why("wrapped text", drawn.box, safe, safe_name, shape_name, step.size)
        if reason is None:
            return drawn
        raise InvalidInput(at, f"{reason}; use a smaller size or fewer lines")
    best = _largest(step, step.text, path, frame, safe, 6)
    if best is not None and best.size < step.size:
        hint = f'use size <= {best.size} or "fit": "shrink"'
    else:
        hint = 'shorten the text, reduce margin or use "fit": "wrap"'
    raise InvalidInput(at, f"{reason}; {hint}")


def font_for(text: str, at: str, render: Render) -> str:
    """The font file for a label; :class:`InvalidInput` if any character lacks a glyph."""
    try:
        path, lacking = fonts.for_text(text, render.font_file)
    except fonts.FontError as exc:
        raise InvalidInput(f"{at}.text", f"no font to draw it with: {exc}") from None
    try:
        _font(path, 12)
    except OSError as exc:
        raise InvalidInput(
            f"{at}.text", f"the font {path} cannot be read ({exc}); set [render] font_file"
        ) from None
    if lacking:
        shown = ", ".join(f"{c!r} (U+{ord(c):04X})" for c in lacking[:5])
        raise InvalidInput(
            f"{at}.text",
            f"the font {path} has no glyph for {shown}; it would be drawn as an empty box. "
            "Install a font that has them or set [render] font_file",
        )
    return path


def overlay_box(step: Overlay, frame: tuple[int, int], src: Source, safe: Rect) -> Rect:
    """The scaled logo's box: ``scale`` of the frame width, even; height in proportion, even."""
    v = src.probe.video
    assert v is not None
    w = max(2, round(frame[0] * step.scale / 2) * 2)
    # FFmpeg's scale=w:-2: av_rescale rounds half away from zero, then x 2.
    h = max(2, (w * v.height + v.width) // (v.width * 2) * 2)
    return place(step.position, step.margin, w, h, frame, safe)


def plan(recipe: Recipe, sources: Mapping[str, Source], cfg: Layers, render: Render) -> list[LayerBox]:
    """Every text and overlay step's box in the output frame, checked against its
    safe area. Raises :class:`InvalidInput` naming the step and the numbers."""
    fit_at = next((i for i, s in enumerate(recipe.steps) if isinstance(s, Fit)), None)
    sh = shape(recipe, sources)
    frame = (sh.width, sh.height)
    shape_name = aspect(*frame)
    out: list[LayerBox] = []
    for i, s in enumerate(recipe.steps):
        if not isinstance(s, (Text, Overlay)):
            continue
        at = f"recipe.steps[{i}]"
        if fit_at is not None and i < fit_at:
            raise InvalidInput(
                f"{at}.op",
                f"a {s.__struct_config__.tag} step before the fit step would be scaled and may be "
                f"cropped by it; move it after steps[{fit_at}]",
            )
        spec = s.safe_area if s.safe_area is not None else cfg.safe_area
        field = f"{at}.safe_area" if s.safe_area is not None else "spool.toml: layers.safe_area"
        safe_name, safe = safe_area(spec, *frame, field)
        if isinstance(s, Text):
            d = plan_text(s, at, frame, safe, safe_name, render)
            out.append(
                LayerBox(
                    step=i,
                    op="text",
                    box=d.box.as_list(),
                    safe_area=safe_name,
                    safe=safe.as_list(),
                    at=list(d.at),
                    size=d.size,
                    text=d.text,
                    font_file=d.font,
                    font_sha256=fonts.digest(d.font),
                )
            )
        else:
            box = overlay_box(s, frame, sources[s.source], safe)
            reason = _why(f"the {s.source} overlay", box, safe, safe_name, shape_name)
            if reason is not None:
                raise InvalidInput(at, f"{reason}; use a smaller scale")
            out.append(
                LayerBox(
                    step=i,
                    op="overlay",
                    box=box.as_list(),
                    safe_area=safe_name,
                    safe=safe.as_list(),
                    at=[box.x, box.y],
                )
            )
    return out


def check_fonts(planned: list[LayerBox]) -> None:
    """Before a render: each label's font file is on this host and is the very file
    it was measured with. drawtext quietly falls back to fontconfig's choice when
    ``fontfile`` cannot be loaded, and another version of a font has other metrics,
    so either would draw a label that was never checked. A host fault: another
    worker may have the font."""
    for layer in planned:
        if layer.font_file is None:
            continue
        try:
            have = fonts.digest(layer.font_file)
        except OSError as exc:
            have = f"missing or unreadable ({exc.strerror})"
        if have != (layer.font_sha256 or have) or have.startswith("missing"):
            raise Failed(
                "prepare",
                f"recipe.steps[{layer.step}].font",
                f"the font {layer.font_file} this label was measured with at acceptance is not on this host",
                expected=layer.font_sha256,
                actual=have,
                next_action="Install the same font file on this host (or set [render] font_file on every "
                "host to one shared file and resubmit); another worker may take the job meanwhile.",
                fault="host",
            )
