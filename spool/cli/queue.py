"""Queue commands: init, submit, status, ls, show, logs."""

from __future__ import annotations

import getpass
import grp
import os
from pathlib import Path
from typing import Annotated, Any

import typer

from ..errors import EXIT_INVALID, InvalidInput, SpoolError
from ..events import Journal, cli_writer
from ..tree import Tree, write_atomic
from .common import JsonOpt, SpoolOpt, app, fail, load_config, open_spool, print_json

# -- commands --------------------------------------------------------------------------


@app.command()
def init(
    directory: Annotated[Path, typer.Argument(help="Folder to create the spool in.")],
    asset_root: Annotated[
        list[str] | None,
        typer.Option("--asset-root", help="A folder sources may come from (repeatable)."),
    ] = None,
    group: Annotated[
        str | None,
        typer.Option(help="A group that shares the spool: folders become group-owned, setgid, writable."),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Create the spool tree and a commented spool.toml (existing files are kept)."""
    from .. import config

    tree = Tree.at(directory)
    try:
        gid = None
        if group is not None:
            try:
                gid = grp.getgrnam(group).gr_gid
            except KeyError:
                raise InvalidInput("--group", f"{group!r} is not a group on this host") from None
            os.umask(0o002)
        tree.create()
        if gid is not None:
            tree.share_with_group(gid)
        roots = [str(Path(r).absolute()) for r in (asset_root or [])]
        wrote = False
        if not tree.config_file.exists():
            umask = "0002" if gid is not None else "0022"
            write_atomic(tree.config_file, config.template(roots, umask).encode())
            wrote = True
        load_config(tree)
    except SpoolError as exc:
        raise fail(exc, as_json) from None
    if as_json:
        print_json({"spool": str(tree.root), "config_written": wrote})
    else:
        typer.echo(f"spool ready at {tree.root}" + ("" if wrote else " (kept the existing spool.toml)"))


@app.command()
def submit(
    files: Annotated[list[Path], typer.Argument(help="Submission JSON files.")],
    spool: SpoolOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Accept submissions (prints each job ID) or reject them (exit 2 with the reason)."""
    from .. import accept

    tree, cfg = open_spool(spool, as_json)
    journal = Journal(tree, cli_writer())
    user = getpass.getuser()
    results: list[dict[str, Any]] = []
    rejected = False
    for f in files:
        outcome = accept.submit_file(tree, cfg, f, journal, user)
        if isinstance(outcome, accept.Accepted):
            results.append({"file": str(f), "job_id": outcome.job.job_id, "error": None})
            if not as_json:
                typer.echo(outcome.job.job_id)
        else:
            rejected = True
            results.append(
                {
                    "file": str(f),
                    "job_id": None,
                    "error": str(outcome.error),
                    "field": outcome.error.field,
                    "rejected": tree.relative(outcome.path),
                }
            )
            if not as_json:
                typer.echo(f"{f}: rejected: {outcome.error}", err=True)
    if as_json:
        print_json(results)
    if rejected:
        raise typer.Exit(EXIT_INVALID)
