"""Queue commands: init, submit, status, ls, show, logs."""

from __future__ import annotations

import grp
from pathlib import Path
from typing import Annotated

import typer

from spool.cli import fast
from spool.cli.common import JsonOpt, SpoolOpt, app, fail, load_config, print_json
from spool.core import config
from spool.core.errors import InvalidInput, SpoolError
from spool.disk.tree import Tree, apply_umask, write_atomic

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
    tree = Tree.at(directory)
    try:
        if directory.exists() and not directory.is_dir():
            raise InvalidInput(
                "DIRECTORY", f"{directory} is a file, not a folder; give a new or existing folder"
            )
        gid = None
        if group is not None:
            try:
                gid = grp.getgrnam(group).gr_gid
            except KeyError:
                raise InvalidInput("--group", f"{group!r} is not a group on this host") from None
            apply_umask(0o002)
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
    except OSError as exc:
        err = SpoolError(f"cannot create a spool at {directory}: {exc.strerror or exc} ({exc.filename})")
        if isinstance(exc, NotADirectoryError | FileExistsError):
            err = InvalidInput("DIRECTORY", f"{directory}: {exc.strerror} ({exc.filename})")
        raise fail(err, as_json) from None
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
    """Accept submissions (prints each job ID) or reject them (exit 2 with the reason).

    A file that cannot be read here (a typo, a folder, a FIFO, no permission) is the
    caller's problem, not the queue's: it is reported and nothing is written
    into the spool. The exit code is that of the first file that failed."""
    fast.submit(files, spool, as_json)
