"""``spool worker``: the workers' side of the queue (host quarantine)."""

from __future__ import annotations

from typing import Annotated

import typer

from spool.cli.common import JsonOpt, SpoolOpt, app, fail, open_spool, print_json, printable
from spool.core.errors import NotFound
from spool.queue import health

worker_app = typer.Typer(help="Workers: lift a host quarantine.", no_args_is_help=True)
app.add_typer(worker_app, name="worker")


@worker_app.command("release")
def release_cmd(
    worker: Annotated[str, typer.Argument(help="The worker's name as spool status shows it (host-name).")],
    spool: SpoolOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Lift a worker's quarantine after fixing its host: it claims again within a poll interval."""
    tree, _ = open_spool(spool, as_json)
    q = health.quarantined(tree, worker)
    if q is None or not health.release(tree, worker):
        raise fail(NotFound(f"worker {worker} is not quarantined in {tree.root}"), as_json)
    if as_json:
        print_json({"worker": worker, "released": True, "was": q.reason})
    else:
        typer.echo(f"{printable(worker)}: released (was quarantined: {printable(q.reason)})")
