"""Text that cannot change the shape of what prints it.

A tag value, a file name, a failure reason or a path may hold a tab, a newline,
a carriage return or a terminal escape sequence. Printed as they are, they
split one field or line into several (a script reading tab-separated lines
reads a forged hit) or drive the terminal. Every field the plain CLI prints,
and every Prometheus label value, passes :func:`printable` first: a character
that is not printable on its own line of a terminal is shown as an escape.
Backslashes are left as they are (messages and paths keep their look), so a
value that holds the text ``\\n`` prints like one holding a newline; the
shape of the output never changes, and ``--json`` tells them apart:

========================  ===========================
``\\t`` ``\\n`` ``\\r``     tab, newline, carriage return
``\\xHH``                 the rest of C0, DEL and C1 (ESC is ``\\x1b``)
``\\uHHHH``               line and paragraph separators (U+2028, U+2029) and
                          the bidirectional controls (U+200E, U+200F,
                          U+202A-U+202E, U+2066-U+2069)
========================  ===========================

``--json`` carries the exact value instead (JSON has its own escapes). The
status page never needs this: it puts values on screen as text nodes.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from typing import Any

_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u200e\u200f\u202a-\u202e\u2066-\u2069]")
_NAMED = {"\t": "\\t", "\n": "\\n", "\r": "\\r"}


def _escape(m: re.Match[str]) -> str:
    c = m.group(0)
    named = _NAMED.get(c)
    if named is not None:
        return named
    o = ord(c)
    return f"\\x{o:02x}" if o < 0x100 else f"\\u{o:04x}"


def printable(text: str) -> str:
    """``text`` with every character that could forge output escaped (see the module docstring)."""
    if text.isprintable():  # the common case, in C
        return text
    return _UNSAFE.sub(_escape, text)


def unsafe(text: str) -> bool:
    """Whether :func:`printable` would change ``text``."""
    return _UNSAFE.search(text) is not None


def printable_all(value: Any) -> Any:
    """``value`` with every string in it (keys too) passed through :func:`printable`,
    keeping its types (records stay records): for what rich lays out."""
    return map_strings(value, printable)


def map_strings(value: Any, fn: Callable[[str], str]) -> Any:
    """``value`` with ``fn`` applied to every string in it (dict keys too), keeping its
    types: records stay records, and what ``fn`` leaves alone is the same object."""
    msgspec = sys.modules.get("msgspec")  # records exist only where msgspec decoded: never import it

    def walk(value: Any) -> Any:
        if isinstance(value, str):
            return fn(value)
        if msgspec is not None and isinstance(value, msgspec.Struct):
            changed = {}
            for name in value.__struct_fields__:
                old = getattr(value, name)
                new = walk(old)
                if new is not old:
                    changed[name] = new
            return msgspec.structs.replace(value, **changed) if changed else value
        if isinstance(value, dict):
            return {walk(k): walk(v) for k, v in value.items()}
        if isinstance(value, list):
            return [walk(v) for v in value]
        if isinstance(value, tuple):
            return tuple(walk(v) for v in value)
        return value

    return walk(value)
