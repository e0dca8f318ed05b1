"""``spool doctor``: probe the spool's filesystem and show the strategies it implies."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from spool.cli.common import JsonOpt, SpoolOpt, app, fail, load_config, open_tree, print_json
from spool.core.errors import EXIT_ERROR, InvalidInput, SpoolError


@app.command("doctor")
def doctor_cmd(
    peer: Annotated[
        Path | None,
        typer.Option(
            help="The same spool through another mount of the same export: shows what one mount "
            "cannot (locks, inotify and listing lag across mounts, racing renames and links)."
        ),
    ] = None,
    quick: Annotated[
        bool, typer.Option("--quick", help="Only the fast probes the daemon runs at start.")
    ] = False,
    lag_timeout: Annotated[
        float, typer.Option(help="Longest wait for a change to show through --peer, in seconds.")
    ] = 40.0,
    spool: SpoolOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Probe the spool's filesystem (rename, links, O_EXCL, locks, inotify, lag, mtime, space)
    and print the publish and watch strategies; exit 1 if the filesystem is unsafe for a spool."""
    # here: the other typer commands stay off the doctor (+~7-37 ms)
    from spool import doctor  # imported here: only this command needs it, and spool starts faster

    try:
        tree = open_tree(spool)
        cfg = load_config(tree)
        if peer is not None and not Path(peer).is_dir():
            raise InvalidInput("--peer", f"{peer} is not a folder")
        report = doctor.run(tree, cfg, peer=peer, quick=quick, lag_timeout=lag_timeout)
    except SpoolError as exc:
        raise fail(exc, as_json) from None
    except doctor.PeerMismatch as exc:
        raise fail(InvalidInput("--peer", exc.strerror or str(exc)), as_json) from None
    except OSError as exc:
        raise fail(SpoolError(f"cannot probe {spool or '.'}: {exc.strerror or exc}"), as_json) from None
    if as_json:
        print_json(report.to_json())
    else:
        typer.echo(doctor.render(report))
    if not report.safe:
        raise typer.Exit(EXIT_ERROR)
