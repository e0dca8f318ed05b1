"""The ``spool`` command line: parse, call the library, print. Nothing else.

Every command takes ``--spool DIR`` (or ``SPOOL_DIR``, or runs inside a spool
folder), and every one but ``watch`` and ``serve`` takes ``--json`` for scripts.
Exit codes (SPEC section 10): 0 success, 2 invalid input or rejected, 3 not ready,
4 not found, 1 anything else.

Commands live in modules by what they are for; importing them registers them
on the shared typer ``app``. Importing this package builds nothing: the
commands scripts call in loops (:mod:`.fast`) run without typer or rich, and
the app is built on first use (``from spool.cli import app`` still works).
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Any

from spool.cli.fast import parse
from spool.cli.plain import echo, guard_output
from spool.core import secrets
from spool.core.errors import EXIT_ERROR, SpoolError

if TYPE_CHECKING:
    import typer

__all__ = ["app", "main", "typer_main"]


def _app() -> typer.Typer:
    """The typer app with every command registered (built once, on first use)."""
    # Importing a group registers its commands; the order is the order of `spool --help`.
    # here: the lean commands never build the typer app (+~130 ms: typer, click, rich)
    from spool.cli import queue  # noqa: F401  # isort: skip

    # here: the lean commands never build the typer app (+~130 ms: typer, click, rich)
    from spool.cli import observe  # noqa: F401  # isort: skip

    # here: the lean commands never build the typer app (+~130 ms: typer, click, rich)
    from spool.cli import intent  # noqa: F401  # isort: skip

    # here: the lean commands never build the typer app (+~130 ms: typer, click, rich)
    from spool.cli import repair  # noqa: F401  # isort: skip

    # here: the lean commands never build the typer app (+~130 ms: typer, click, rich)
    from spool.cli import library  # noqa: F401  # isort: skip

    # here: the lean commands never build the typer app (+~130 ms: typer, click, rich)
    from spool.cli import doctor  # noqa: F401  # isort: skip

    # here: the lean commands never build the typer app (+~130 ms: typer, click, rich)
    from spool.cli import worker  # noqa: F401  # isort: skip

    # here: the lean commands never build the typer app (+~130 ms: typer, click, rich)
    from spool.cli.common import app

    return app


def __getattr__(name: str) -> Any:
    if name == "app":
        return _app()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def main() -> None:
    """``spool``: a command scripts call in loops runs at once; the rest through typer."""
    _run(parse(sys.argv[1:]) or (lambda: _app()()))


def typer_main() -> None:
    """``spool`` with every command going through the typer app (no fast path)."""
    _run(lambda: _app()())


def _run(command: Any) -> None:
    """Run one command with output masked; what it did not catch is one line."""

    secrets.install_from((), ())  # the environment's secrets; each command adds its config's
    guard_output()
    try:
        command()
        sys.stdout.flush()
    except SpoolError as exc:  # anything a command did not catch itself
        echo(f"spool: {exc}", err=True)
        sys.exit(exc.exit_code)
    except BrokenPipeError:  # `spool ls | head -1`: what click does, quietly exit 1
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(EXIT_ERROR)
    except OSError as exc:  # a file the command could not read or write: one line, no traceback
        where = f": {exc.filename}" if exc.filename else ""
        echo(f"spool: {exc.strerror or exc}{where}", err=True)
        sys.exit(EXIT_ERROR)
    finally:
        _commit_journal()


def _commit_journal() -> None:
    """The command's journal lines, durable before it exits (SPEC 11.9): one fsync for a
    command that wrote some, none otherwise (the tree module is loaded only if it was)."""
    tree = sys.modules.get("spool.disk.tree")
    if tree is None:
        return
    try:
        tree.commit_riders()
    except OSError:
        pass  # the transitions themselves are durable; fsck rebuilds a lost line
