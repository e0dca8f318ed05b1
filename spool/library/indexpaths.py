"""Where the library index keeps what: its folders, and a tag value as a file name.

The names every reader and writer of the index agree on (:mod:`spool.library.index` for the
entries of format 1 and the readers, :mod:`spool.library.segments` for format 2's segments and
merged entries), apart from both so neither imports the other for them.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

from spool.disk.tree import Tree

#: Top-level folders of the library.
INDEX = "index"
LIBRARY = "library"
#: Longest encoded value kept whole; longer ones end in ``~<hash>``.
MAX_NAME = 200

_SAFE = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-.")
_ESCAPE = re.compile(r"%([0-9A-F]{2})")


def encode_value(value: str) -> str:
    """A tag value as a file name (see the module docstring); pure and injective."""
    out = []
    for i, b in enumerate(value.encode("utf-8")):
        if b in _SAFE and not (i == 0 and b == ord(".")):
            out.append(chr(b))
        else:
            out.append(f"%{b:02X}")
    name = "".join(out)
    if len(name) <= MAX_NAME:
        return name
    cut = name[: MAX_NAME - 33]
    if "%" in cut[-2:]:  # never split an escape
        cut = cut[: cut.rindex("%")]
    return cut + "~" + hashlib.sha256(value.encode("utf-8")).hexdigest()[:32]


def decode_value(name: str) -> str | None:
    """The value a name encodes, or ``None`` for a hashed (shortened) one."""
    if "~" in name:
        return None
    return _ESCAPE.sub(lambda m: chr(int(m.group(1), 16)), name).encode("latin-1").decode("utf-8")


def index_root(tree: Tree) -> Path:
    return tree.root / INDEX


def library_root(tree: Tree) -> Path:
    return tree.root / LIBRARY


def tag_dir(tree: Tree, tag: str, value: str) -> Path:
    return tree.root / INDEX / tag / encode_value(value)


def version_file(tree: Tree, name: str, revision: int) -> Path:
    return tree.root / LIBRARY / name / str(revision)
