"""The typer app every command registers on, and its ``--spool``/``--json`` options.

The helpers commands share live in :mod:`.plain` (no typer, no rich) and are
re-exported here for the command modules.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from spool.cli.plain import (
    ago,
    bar,
    before_command,
    echo,
    fail,
    guard_output,
    human_seconds,
    load_config,
    open_spool,
    open_tree,
    print_json,
    unsecret,
)
from spool.core.printable import printable, printable_all

__all__ = [
    "JsonOpt",
    "SpoolOpt",
    "ago",
    "app",
    "bar",
    "echo",
    "fail",
    "guard_output",
    "human_seconds",
    "load_config",
    "open_spool",
    "open_tree",
    "print_json",
    "printable",
    "printable_all",
    "unsecret",
]

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="A filesystem-native render queue: see and steer a spool.",
    # A traceback with locals can print a token or a whole config: never.
    pretty_exceptions_enable=False,
    pretty_exceptions_show_locals=False,
)

SPOOL_HELP = "The spool folder (default: SPOOL_DIR, or the spool the current folder is inside)."
SpoolOpt = Annotated[Path | None, typer.Option("--spool", help=SPOOL_HELP, show_default=False)]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON for scripts.")]


@app.callback()
def _global_options(spool: SpoolOpt = None) -> None:
    """A filesystem-native render queue: see and steer a spool."""
    before_command["spool"] = spool
