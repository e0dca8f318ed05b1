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

from .. import secrets
from ..errors import EXIT_ERROR, SpoolError

# Importing a group registers its commands; the order is the order of `spool --help`.
from . import queue  # noqa: F401  # isort: skip
from . import observe  # noqa: F401  # isort: skip
from . import intent  # noqa: F401  # isort: skip
from . import repair  # noqa: F401  # isort: skip
from . import library  # noqa: F401  # isort: skip
from . import doctor  # noqa: F401  # isort: skip
from . import worker  # noqa: F401  # isort: skip
from .common import app, guard_output

__all__ = ["app", "main"]


def main() -> None:
    secrets.install_from((), ())  # the environment's secrets; each command adds its config's
    guard_output()
    try:
        app()
    except SpoolError as exc:  # anything a command did not catch itself
        typer.echo(f"spool: {exc}", err=True)
        sys.exit(exc.exit_code)
    except OSError as exc:  # a file the command could not read or write: one line, no traceback
        where = f": {exc.filename}" if exc.filename else ""
        typer.echo(f"spool: {exc.strerror or exc}{where}", err=True)
        sys.exit(EXIT_ERROR)
