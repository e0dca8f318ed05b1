"""``spoold run``: the daemon's command line (systemd runs it in the foreground)."""

from __future__ import annotations

import faulthandler
import logging
import signal
from pathlib import Path
from typing import Annotated

import typer

from spool.core import config, secrets
from spool.core.errors import SpoolError
from spool.disk import diskfull, formats
from spool.disk.tree import Tree, apply_umask
from spool.queue.workers import worker_id
from spoold.daemon import Daemon
from spoold.notify import log_handler

# No locals in tracebacks: they would print the whole config (and secrets) to the journal.
app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="The spool render daemon.",
    pretty_exceptions_show_locals=False,
)


@app.callback()
def _root() -> None:
    """The spool render daemon."""


@app.command()
def run(
    spool: Annotated[Path, typer.Option(envvar="SPOOL_DIR", help="The spool folder.")],
    worker: Annotated[
        str, typer.Option(envvar="SPOOL_WORKER", help="Worker name; the identity is <host>-NAME.")
    ] = "w1",
    drain: Annotated[bool, typer.Option(help="Exit 0 once nothing is pending, running or arriving.")] = False,
    log_level: Annotated[str, typer.Option(help="debug, info, warning or error.")] = "info",
) -> None:
    """Claim, render, validate and publish jobs until stopped (or drained)."""
    # journald adds time, unit and (from a <N> prefix) priority; a terminal user wants the time.
    faulthandler.register(signal.SIGUSR1)  # kill -USR1 <pid>: every thread's stack on stderr
    # No record needs where it was logged from, or which thread or process: not looked up
    # (the logging HOWTO's "Optimization"; a no-op job logs ~4 lines).
    logging._srcfile = None
    logging.logThreads = logging.logProcesses = logging.logMultiprocessing = False
    handler = log_handler()
    handler.addFilter(secrets.RedactingFilter())
    logging.basicConfig(level=getattr(logging, log_level.upper(), logging.INFO), handlers=[handler])
    logging.getLogger("watchdog").setLevel(logging.INFO)  # its debug output is one line per inotify event
    tree = Tree.at(spool)
    try:
        if not tree.is_spool():
            raise SpoolError(f"{spool} is not a spool (run: spool init {spool})")
        formats.writing(tree.root, fresh=True)  # a tree newer than this code: refused, untouched
        cfg = config.load(tree.config_file)
        secrets.install_from(cfg.secrets.env, cfg.secrets.files)
        apply_umask(cfg.permissions.umask_bits)
        code = Daemon(tree, cfg, worker_id(worker), drain=drain).run()
    except SpoolError as exc:
        typer.echo(f"spoold: {exc}", err=True)
        raise typer.Exit(exc.exit_code) from None
    except OSError as exc:  # the spool cannot be written at all: one line, not a traceback
        typer.echo(f"spoold: cannot run on {spool}: {diskfull.describe(exc)}", err=True)
        raise typer.Exit(1) from None
    raise typer.Exit(code)


def main() -> None:
    app()
