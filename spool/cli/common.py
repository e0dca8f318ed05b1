"""What every command shares: the app, ``--spool``/``--json``, output helpers."""

from __future__ import annotations

import os
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import msgspec
import typer

from .. import config, secrets
from ..config import Config
from ..errors import InvalidInput, NotFound, SpoolError
from ..tree import Tree

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="A filesystem-native render queue: see and steer a spool.",
)

SpoolOpt = Annotated[
    Path | None,
    typer.Option(
        "--spool",
        envvar="SPOOL_DIR",
        help="The spool folder (default: SPOOL_DIR, or the current folder).",
    ),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON for scripts.")]


# -- helpers -------------------------------------------------------------------------


def load_config(tree: Tree) -> Config:
    """The spool's config; its secrets are masked in everything printed from now on."""
    cfg = config.load(tree.config_file)
    secrets.install_from(cfg.secrets.env, cfg.secrets.files)
    os.umask(cfg.permissions.umask_bits)
    return cfg


def open_spool(spool: Path | None, as_json: bool) -> tuple[Tree, Config]:
    """The spool and its config, or the command ends with one clear error."""
    try:
        tree = open_tree(spool)
        return tree, load_config(tree)
    except SpoolError as exc:
        raise fail(exc, as_json) from None


def open_tree(spool: Path | None) -> Tree:
    if spool is None:
        here = Tree.at(Path.cwd())
        if here.is_spool():
            return here
        raise InvalidInput("--spool", "no spool given; pass --spool DIR or set SPOOL_DIR")
    tree = Tree.at(spool)
    if not tree.is_spool():
        raise NotFound(f"{spool} is not a spool (create one with: spool init {spool})")
    return tree


def print_json(value: Any) -> None:
    sys.stdout.buffer.write(msgspec.json.format(msgspec.json.encode(value), indent=2) + b"\n")


def fail(exc: SpoolError, as_json: bool) -> typer.Exit:
    if as_json:
        print_json({"error": str(exc), "exit_code": exc.exit_code})
    else:
        typer.echo(f"spool: {exc}", err=True)
    return typer.Exit(exc.exit_code)


def ago(ts: datetime | None) -> str:
    if ts is None:
        return "-"
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
