"""What every command shares, without typer: finding the spool, its config,
JSON and one-line errors, and the one place output is masked.

Every field a plain (not ``--json``) command prints passes
:func:`spool.core.printable.printable` (records laid out by rich:
:func:`spool.core.printable.printable_all`), so no tag, name, reason or path can
add a line or a field, or send the terminal an escape sequence.

Importing this costs no typer and no rich, so the commands scripts call in
loops (:mod:`.fast`) run without building the typer app.

Every byte the CLI prints passes one choke point, :func:`guard_output`: both
standard streams (text and their binary buffers) mask the secrets
:mod:`spool.core.secrets` knows. What is laid out or encoded first is masked
before that, by :func:`unsecret`: the records behind ``status``, ``show`` and
``events`` (a terminal may wrap a long secret) and every :func:`print_json`
value (JSON escapes some characters a secret may hold).
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, TextIO

from spool.core import secrets
from spool.core.errors import InvalidInput, NotFound, SpoolError
from spool.core.printable import map_strings, printable
from spool.disk import formats
from spool.disk.tree import Tree, apply_umask

if TYPE_CHECKING:
    from datetime import datetime

    from spool.core.config import Config

#: ``spool --spool DIR COMMAND``: the option given before the command, as ``git -C``.
before_command: dict[str, Path | None] = {"spool": None}


# -- output: the one place secrets are masked ------------------------------------------


class _RedactingBytes:
    """A binary stream that masks secrets in each write (``spool logs``, JSON)."""

    def __init__(self, inner: BinaryIO) -> None:
        self._inner = inner

    def write(self, data: bytes) -> int:
        self._inner.write(secrets.redact_bytes(bytes(data)))
        return len(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class _RedactingText:
    """A text stream that masks secrets in each write; its ``buffer`` does too."""

    def __init__(self, inner: TextIO) -> None:
        self._inner = inner
        self.buffer = _RedactingBytes(inner.buffer)

    def write(self, text: str) -> int:
        self._inner.write(secrets.redact(text))
        return len(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def guard_output() -> None:
    """Mask secrets in everything written to stdout and stderr from now on
    (idempotent). Secrets learnt later (a spool's ``[secrets]``) are masked too:
    :func:`spool.core.secrets.redact` reads the current set at each write."""
    if not isinstance(sys.stdout, _RedactingText):
        sys.stdout = _RedactingText(sys.stdout)
    if not isinstance(sys.stderr, _RedactingText):
        sys.stderr = _RedactingText(sys.stderr)


def unsecret(value: Any) -> Any:
    """``value`` with every string in it masked, keeping its types (records stay
    records). For what a terminal lays out (a wrapped line can split a long
    secret in two, where masking the printed text no longer finds it) and for
    JSON (which escapes some characters a secret may hold)."""
    if not secrets.known():
        return value  # nothing to mask: skip the walk (100,000 rows of `spool ls --json`)
    return map_strings(value, secrets.redact)


# -- helpers -------------------------------------------------------------------------


def load_config(tree: Tree) -> Config:
    """The spool's config; its secrets are masked in everything printed from now on."""
    from spool.core import config  # here: `spool ls` reads no config (+~22 ms)

    cfg = config.load(tree.config_file)
    secrets.install_from(cfg.secrets.env, cfg.secrets.files)
    apply_umask(cfg.permissions.umask_bits)
    return cfg


def open_spool(spool: Path | None, as_json: bool) -> tuple[Tree, Config]:
    """The spool and its config, or the command ends with one clear error."""
    try:
        tree = open_tree(spool)
        return tree, load_config(tree)
    except SpoolError as exc:
        raise fail(exc, as_json) from None


def open_tree(spool: Path | None) -> Tree:
    """The spool named after the command, else before it, else by ``SPOOL_DIR``,
    else the one the current folder is inside (``pending/``, ``attempts/J/1/work/``)."""
    given = (
        spool
        or before_command["spool"]
        or (Path(os.environ["SPOOL_DIR"]) if os.environ.get("SPOOL_DIR") else None)
    )
    if given is None:
        for folder in _upwards(Path.cwd()):
            here = Tree.at(folder)
            if here.is_spool():
                formats.check(here.root)
                return here
        raise InvalidInput(
            "--spool", "no spool given and none around the current folder; pass --spool DIR or set SPOOL_DIR"
        )
    tree = Tree.at(given)
    if not tree.is_spool():
        raise NotFound(f"{given} is not a spool (create one with: spool init {given})")
    formats.check(tree.root)  # a tree of a newer spool is neither read nor written here
    return tree


def _upwards(start: Path) -> Iterator[Path]:
    """``start`` and each folder above it, up to the filesystem root."""
    yield start
    yield from start.parents


def print_json(value: Any) -> None:
    """``value`` as indented JSON on stdout, every string in it masked.

    msgspec writes it, unless ``value`` is small plain data and msgspec is not yet
    imported (``spool status --json`` on a queue of counts): then the standard
    library writes the same bytes (:func:`_stdlib_json`), without an import that
    costs as much as Python's start-up."""
    if "msgspec" not in sys.modules and _plain(value, [_STDLIB_NODES]):
        sys.stdout.buffer.write(_stdlib_json(unsecret(value)))
        return
    import msgspec  # here: small JSON is written by the stdlib; msgspec loads for records (+~15 ms)

    data = unsecret(msgspec.to_builtins(value))
    sys.stdout.buffer.write(msgspec.json.format(msgspec.json.encode(data), indent=2) + b"\n")


#: Up to this many values the standard library's (pure Python, when indenting)
#: encoder is cheaper than importing msgspec; beyond, msgspec is.
_STDLIB_NODES = 2000


def _plain(value: Any, budget: list[int]) -> bool:
    """Whether ``value`` is made of ``budget[0]`` values at most, each one whose JSON
    the standard library writes byte for byte as msgspec does: str keys, str, bool,
    None, 64-bit ints, lists, tuples, and floats whose repr has no exponent (msgspec
    writes ``1e16``, Python ``1e+16``; ``nan`` and ``inf`` differ too)."""
    budget[0] -= 1
    if budget[0] < 0:
        return False
    if value is None or isinstance(value, (str, bool)):
        return True
    if isinstance(value, int):
        return -(2**63) <= value < 2**64
    if isinstance(value, float):
        r = repr(value)
        return "e" not in r and "n" not in r  # no exponent, no inf or nan
    if isinstance(value, dict):
        return all(type(k) is str and _plain(v, budget) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return all(_plain(v, budget) for v in value)
    return False


def _stdlib_json(value: Any) -> bytes:
    """What ``msgspec.json.format(msgspec.json.encode(value), indent=2)`` writes, plus a
    newline, for a value :func:`_plain` accepts (``tests/test_cli_lean.py`` compares)."""
    import json  # here: spool ls and the human views write no JSON (+~1 ms)

    return json.dumps(value, indent=2, ensure_ascii=False).encode("utf-8") + b"\n"


def fail(exc: SpoolError, as_json: bool) -> SystemExit:
    """Report ``exc`` (a JSON object with ``--json``, else one line on stderr); the
    caller raises what is returned, ending the command with the error's exit code."""
    if as_json:
        print_json({"error": str(exc), "exit_code": exc.exit_code})
    else:
        echo(f"spool: {printable(str(exc))}", err=True)
    return SystemExit(exc.exit_code)


#: What click strips from text written to a pipe or file (``typer.echo`` does the same).
_ANSI = re.compile(r"\033\[[;?0-9]*[a-zA-Z]")


def echo(message: str, err: bool = False) -> None:
    """One line on stdout (or stderr), as ``typer.echo`` prints it: colour codes
    dropped when the stream is not a terminal, flushed at once."""
    stream = sys.stderr if err else sys.stdout
    out = message + "\n"
    if not stream.isatty():
        out = _ANSI.sub("", out)
    stream.write(out)
    stream.flush()


def ago(ts: datetime | None) -> str:
    if ts is None:
        return "-"
    from datetime import UTC, datetime  # here: spool ls never prints an age (+~1 ms)

    s = max(0.0, (datetime.now(UTC) - ts).total_seconds())
    return human_seconds(s) + " ago"


def human_seconds(s: float) -> str:
    if s < 60:
        return f"{s:.0f}s"
    if s < 3600:
        return f"{s / 60:.0f}m"
    if s < 86400:
        return f"{s / 3600:.1f}h"
    return f"{s / 86400:.1f}d"


def bar(percent: float | None, width: int = 20) -> str:
    if percent is None:
        return "[" + "?" * width + "]"
    filled = round(width * percent / 100)
    return "[" + "#" * filled + "-" * (width - filled) + "]"
