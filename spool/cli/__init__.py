"""The ``spool`` command line: parse, call the library, print. Nothing else.

Every command takes ``--spool DIR`` (or ``SPOOL_DIR``, or runs inside a spool
folder) and ``--json`` for scripts. Exit codes (SPEC section 10): 0 success,
2 invalid input or rejected, 3 not ready, 4 not found, 1 anything else.

Commands live in modules by what they are for; importing them registers them
on the shared ``app``.
"""

from __future__ import annotations

import sys

import typer

from ..errors import SpoolError
from . import intent, observe, queue, repair  # noqa: F401  (importing registers the commands)
from .common import app

__all__ = ["app", "main"]


def main() -> None:
    try:
        app()
    except SpoolError as exc:  # anything a command did not catch itself
        typer.echo(f"spool: {exc}", err=True)
        sys.exit(exc.exit_code)
