"""The safe area of a frame, and the gate's check that every planned layer is inside it.

A safe area is a centred fraction of the frame or a named preset (broadcast title and
action safe, the social platforms' UI insets). The render kind places labels and logos
inside it at acceptance (:mod:`spool.kinds.render.layers`); the validation gate
(:func:`judge`) checks the planned boxes again against the safe area of the frame the
output really has. Pure: no fonts, no FFmpeg.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from spool.core.errors import InvalidInput
from spool.core.model import Check, LayerBox

if TYPE_CHECKING:
    from spool.core.model import Check, LayerBox


@dataclass(frozen=True)
class Preset:
    """Insets from each edge as fractions of the frame; ``aspect`` (w, h) limits
    the preset to frames of that shape."""

    top: float
    right: float
    bottom: float
    left: float
    aspect: tuple[int, int] | None = None


#: Named safe areas. Broadcast: SMPTE ST 2046-1 / EBU R 95 safe title (90 %) and
#: safe action (93 %). Social 9:16 (Stories, Reels, TikTok, Shorts): the platforms'
#: own UI covers about the top 14 % (profile, progress bar) and the bottom 20 %
#: (caption, call to action), and 6 % at the sides keeps clear of the like/share
#: column's edge; the feeds (4:5, 1:1, 16:9) cover nothing, so title-safe applies.
PRESETS: dict[str, Preset] = {
    "title-safe": Preset(0.05, 0.05, 0.05, 0.05),
    "action-safe": Preset(0.035, 0.035, 0.035, 0.035),
    "social-9x16": Preset(0.14, 0.06, 0.20, 0.06, aspect=(9, 16)),
    "social-4x5": Preset(0.05, 0.05, 0.05, 0.05, aspect=(4, 5)),
    "social-1x1": Preset(0.05, 0.05, 0.05, 0.05, aspect=(1, 1)),
    "social-16x9": Preset(0.05, 0.05, 0.05, 0.05, aspect=(16, 9)),
}
#: ``"social"`` picks the social preset of the frame's aspect (title-safe for others).
SOCIAL = "social"


@dataclass(frozen=True)
class Rect:
    x: int
    y: int
    w: int
    h: int

    @property
    def right(self) -> int:
        return self.x + self.w

    @property
    def bottom(self) -> int:
        return self.y + self.h

    def contains(self, other: Rect) -> bool:
        return (
            other.x >= self.x
            and other.y >= self.y
            and other.right <= self.right
            and other.bottom <= self.bottom
        )

    def as_list(self) -> list[int]:
        return [self.x, self.y, self.w, self.h]


def aspect(width: int, height: int) -> str:
    """``"16:9"``, ``"9:16"``, ``"1:1"``... for a frame (reduced; close shapes such as
    1366x768 are named by the nearest common aspect)."""
    for a, b in ((16, 9), (9, 16), (1, 1), (4, 5), (5, 4), (4, 3), (3, 4)):
        if abs(width * b - height * a) <= max(a, b) * 2:
            return f"{a}:{b}"
    g = math.gcd(width, height)
    return f"{width // g}:{height // g}"


def safe_area(spec: float | str, width: int, height: int, field: str) -> tuple[str, Rect]:
    """``spec`` (a centred fraction or a preset name) -> its name and rectangle in a
    ``width`` x ``height`` frame. Raises :class:`InvalidInput` naming ``field``."""
    shape_name = aspect(width, height)
    if isinstance(spec, str):
        name = spec
        if name == SOCIAL:
            social = f"social-{shape_name.replace(':', 'x')}"
            name = social if social in PRESETS else "title-safe"
        preset = PRESETS.get(name)
        if preset is None:
            raise InvalidInput(field, f"{spec!r} is not a safe area preset; use one of {', '.join(PRESETS)}")
        if preset.aspect is not None and f"{preset.aspect[0]}:{preset.aspect[1]}" != shape_name:
            raise InvalidInput(
                field,
                f"preset {name!r} is for {preset.aspect[0]}:{preset.aspect[1]} frames; this one is "
                f'{width}x{height} ({shape_name}); use "social" to pick by aspect',
            )
        label = name if spec == name else f"{name} (social)"
    else:
        if not 0.5 <= spec <= 1.0:
            raise InvalidInput(field, f"{spec:g} is not a fraction between 0.5 and 1")
        inset = (1.0 - spec) / 2
        preset = Preset(inset, inset, inset, inset)
        label = f"{spec * 100:g} %"
    # Round inwards (to 6 decimals first, so 720 x 0.05 is 36, not 37).
    x0 = math.ceil(round(width * preset.left, 6))
    y0 = math.ceil(round(height * preset.top, 6))
    x1 = math.floor(round(width * (1 - preset.right), 6))
    y1 = math.floor(round(height * (1 - preset.bottom), 6))
    return label, Rect(x0, y0, x1 - x0, y1 - y0)


def spec_of(label: str) -> float | str:
    """The safe area spec back from its label (:func:`safe_area`'s first result):
    ``"90 %"`` -> 0.9, ``"social-9x16 (social)"`` -> ``"social-9x16"``, a preset -> itself."""
    first = label.split(" ")[0]
    return float(first) / 100 if label.endswith(" %") else first


def judge(planned: list[LayerBox], width: int | None, height: int | None) -> tuple[list[LayerBox], Check]:
    """The gate: each planned box against the safe area recomputed for the frame the
    output really has (``width`` x ``height`` from ffprobe). Pure."""
    out: list[LayerBox] = []
    bad: list[str] = []
    for layer in planned:
        box = Rect(*layer.box)
        verdict = "inside"
        if width is None or height is None:
            verdict = "unknown: the output has no video stream"
        else:
            try:
                _, safe = safe_area(spec_of(layer.safe_area), width, height, "layers")
            except InvalidInput as exc:
                safe, verdict = Rect(*layer.safe), f"outside: {exc.problem}"
            if verdict != "inside":
                pass
            elif safe.as_list() != layer.safe:
                verdict = f"outside: the frame is {width}x{height}, not the size the layer was placed in"
            elif not safe.contains(box):
                verdict = "outside"
        if verdict != "inside":
            bad.append(f"steps[{layer.step}] {layer.op} {verdict}")
        out.append(
            LayerBox(
                step=layer.step,
                op=layer.op,
                box=layer.box,
                safe_area=layer.safe_area,
                safe=layer.safe,
                at=layer.at,
                size=layer.size,
                font_file=layer.font_file,
                font_sha256=layer.font_sha256,
                verdict=verdict,
            )
        )
    check = Check(
        name="layers",
        expected=f"{len(planned)} layer(s) inside the safe area",
        actual="; ".join(bad) or "all inside",
        ok=not bad,
    )
    return out, check
