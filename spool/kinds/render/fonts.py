"""The one font file a text step is drawn with, found through fontconfig.

FFmpeg's ``drawtext`` draws every character of a label from one font file and
has no fallback: a character the file lacks comes out as an empty box ("tofu").
So spool resolves the file once, at acceptance, checks that it has a glyph for
every character of the label, and hands that exact file to ``drawtext``
(``fontfile=``). The measurement in :mod:`spool.kinds.render.layers` uses the same file.

Order of choice: ``[render] font_file`` when set; else fontconfig's match for
``sans-serif``; if that lacks some of the label's characters, fontconfig's best
match for a font that has them (a CJK label finds a CJK font when one is
installed). Results are cached per process: fonts do not change under a
running spool, and acceptance must stay fast.
"""

from __future__ import annotations

import functools
import hashlib
import os
import subprocess

#: What fontconfig is asked for when ``[render] font_file`` is empty.
DEFAULT_FAMILY = "sans-serif"
_TIMEOUT = 20.0


class FontError(Exception):
    """No usable font file (the reason is the message)."""


def _run(argv: list[str]) -> str:
    try:
        proc = subprocess.run(
            argv, capture_output=True, stdin=subprocess.DEVNULL, timeout=_TIMEOUT, text=True
        )
    except FileNotFoundError:
        raise FontError(f"{argv[0]} is not installed (fontconfig); set [render] font_file") from None
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise FontError(f"{argv[0]} did not run ({exc})") from None
    if proc.returncode != 0:
        raise FontError(f"{argv[0]} failed: {proc.stderr.strip()[:200] or proc.returncode}")
    return proc.stdout.strip()


@functools.lru_cache(maxsize=64)
def resolve(font_file: str = "", pattern: str = DEFAULT_FAMILY) -> str:
    """An absolute, existing font file: ``font_file`` if given, else fontconfig's match."""
    path = font_file or _run(["fc-match", "--format=%{file}", pattern])
    if not path or not os.path.isfile(path):
        raise FontError(f"font file {path!r} does not exist")
    return os.path.realpath(path)


@functools.lru_cache(maxsize=64)
def charset(path: str) -> tuple[tuple[int, int], ...]:
    """The code point ranges (inclusive) ``path`` has glyphs for, as fontconfig reads its
    cmap. Face 0 only: in a collection (``.ttc``) that is the face drawtext and Pillow load."""
    text = _run(["fc-query", "--index=0", "--format=%{charset}\n", path])
    ranges = []
    try:
        for part in text.split():
            lo, _, hi = part.partition("-")
            ranges.append((int(lo, 16), int(hi or lo, 16)))
    except ValueError:
        raise FontError(f"fc-query printed a character map spool cannot read for {path}") from None
    if not ranges:
        raise FontError(f"{path} has no character map fontconfig can read")
    return tuple(ranges)


def missing(text: str, path: str) -> list[str]:
    """Characters of ``text`` (line breaks aside) that ``path`` has no glyph for, in order, once each."""
    ranges = charset(path)
    out: list[str] = []
    for ch in dict.fromkeys(text):
        if ch in "\r\n":  # line breaks are not drawn
            continue
        cp = ord(ch)
        if not any(lo <= cp <= hi for lo, hi in ranges):
            out.append(ch)
    return out


def for_text(text: str, font_file: str = "") -> tuple[str, list[str]]:
    """The font file to draw ``text`` with, and the characters it still lacks
    (empty when every character has a glyph). A configured ``font_file`` is
    never swapped for another; fontconfig's default is, for one that has the glyphs."""
    path = resolve(font_file)
    lacking = missing(text, path)
    if not lacking or font_file:
        return path, lacking
    wanted = " ".join(f"{ord(c):x}" for c in sorted(set(text) - {"\n", "\r"}))
    try:
        other = resolve("", f"{DEFAULT_FAMILY}:charset={wanted}")
    except FontError:
        return path, lacking
    still = missing(text, other)
    return (other, still) if not still else (path, lacking)


def digest(path: str) -> str:
    """sha256 of a font file: which exact font a label was measured with. Another
    version of the "same" font has other metrics, so a render checks it."""
    st = os.stat(path)
    return _digest(path, st.st_size, st.st_mtime_ns)


@functools.lru_cache(maxsize=64)
def _digest(path: str, size: int, mtime_ns: int) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()
