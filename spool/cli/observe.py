"""Commands that look at the queue: status, watch, ls, show, logs, events, metrics, serve.

None of them changes the spool. The facts come from :mod:`spool.observe.overview`
(status, watch, the page), :mod:`spool.observe.eventlog` (events, show's timeline)
and :mod:`spool.observe.metrics`; how they look in a terminal from :mod:`.views`.
"""

from __future__ import annotations

import os
import select
import signal
import stat
import sys
import time
from typing import Annotated

import typer
from rich.console import Console
from rich.live import Live

from spool.cli import fast, views
from spool.cli.common import (
    JsonOpt,
    SpoolOpt,
    app,
    fail,
    open_spool,
    open_tree,
    print_json,
    printable_all,
    unsecret,
)
from spool.core import families
from spool.core.errors import InvalidInput, NotFound, NotReady, SpoolError
from spool.observe import eventlog, metrics, overview
from spool.queue import status


@app.command("status")
def status_cmd(
    spool: SpoolOpt = None,
    as_json: JsonOpt = False,
    exact: Annotated[
        bool,
        typer.Option(
            "--exact",
            help="Stat every pending job for the oldest pending age (one network round trip "
            "each on a NAS); without it, a big queue's age comes from live workers or a sample.",
        ),
    ] = False,
) -> None:
    """What is waiting, what is running, what needs attention, and the workers."""
    fast.status(spool, as_json, exact=exact)


@app.command()
def watch(
    interval: Annotated[
        float, typer.Option("--interval", "-n", min=0.2, help="Seconds between updates.")
    ] = 1.0,
    spool: SpoolOpt = None,
) -> None:
    """`spool status`, redrawn live from the filesystem until Ctrl-C."""
    tree, cfg = open_spool(spool, False)
    console = Console(highlight=False)
    _ctrl_c_stops()
    try:
        with Live(console=console, screen=console.is_terminal, auto_refresh=False) as live:
            while True:
                live.update(
                    views.status_view(printable_all(unsecret(overview.overview(tree, cfg)))), refresh=True
                )
                time.sleep(interval)
    except KeyboardInterrupt:
        pass


@app.command("ls")
def ls_cmd(
    state: Annotated[
        str | None, typer.Argument(help="waiting, pending, held, running, complete, failed or rejected.")
    ] = None,
    spool: SpoolOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """List job IDs (with their state and, when running, their worker)."""
    fast.ls(state, spool, as_json)


@app.command()
def show(
    job: Annotated[str, typer.Argument(help="Job ID (name@revision), or an asset name for its versions.")],
    visibility: Annotated[
        list[str] | None,
        typer.Option("--visibility", help="With an asset name: also list this visibility (repeatable)."),
    ] = None,
    spool: SpoolOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """One job: its timeline, attempts, failure, manifest and approvals."""
    if "@" not in job:  # an asset name: its versions (the library, SPEC 9)
        return fast.show_asset(job, spool, as_json, visibility)
    fast.show(job, spool, as_json)


@app.command()
def logs(
    job: Annotated[str, typer.Argument(help="Job ID.")],
    attempt: Annotated[int | None, typer.Option(help="Attempt number (default: the latest).")] = None,
    follow: Annotated[bool, typer.Option("-f", "--follow", help="Keep printing while the job runs.")] = False,
    spool: SpoolOpt = None,
    as_json: Annotated[
        bool,
        typer.Option("--json", help="Print {job_id, attempt, attempts, state, log} (not with --follow)."),
    ] = False,
) -> None:
    """Print the FFmpeg log of a job's attempt (exit 3 if it has not started yet)."""
    try:
        if as_json and follow:
            raise InvalidInput("--json", "cannot be combined with --follow; follow with spool events --json")
        tree = open_tree(spool)
        nums = status.attempt_numbers(tree, job)
        loc = status.locate(tree, job)
        if loc is None:
            raise NotFound(f"no job {job} in {tree.root}")
        if attempt is not None and attempt not in nums:
            raise NotFound(f"{job} has no attempt {attempt}")
        if not nums:
            raise NotReady(f"{job} is {loc.state} and has not started yet: no log")
        n = attempt if attempt is not None else nums[-1]
    except SpoolError as exc:
        raise fail(exc, as_json) from None
    path = tree.attempt_dir(job, n) / "ffmpeg.log"
    if as_json:
        try:
            text = path.read_bytes().decode("utf-8", "replace")
        except FileNotFoundError:
            text = ""
        print_json({"job_id": job, "attempt": n, "attempts": nums, "state": loc.state, "log": text})
        return
    pos = 0
    while True:
        try:
            with open(path, "rb") as f:
                f.seek(pos)
                chunk = f.read()
        except FileNotFoundError:
            chunk = b""
        if chunk:
            sys.stdout.buffer.write(chunk)
            sys.stdout.flush()
            pos += len(chunk)
        now_at = status.locate(tree, job)
        if not follow or now_at is None or now_at.state != "running":
            break
        time.sleep(0.5)


# -- events ----------------------------------------------------------------------------------

#: Seconds between looks at the journal while following.
FOLLOW_EVERY = 0.25


def _ctrl_c_stops() -> None:
    """A command that runs until Ctrl-C: make sure SIGINT reaches it, even when it was
    started ignoring or blocking it (a script's background job inherits SIGINT ignored)."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def _reader_gone() -> bool:
    """Whether stdout is a pipe whose reader has exited (``| grep -m1`` is done)."""
    try:
        fd = sys.stdout.fileno()
        if not stat.S_ISFIFO(os.fstat(fd).st_mode):
            return False
        p = select.poll()
        p.register(fd, 0)  # POLLERR and POLLHUP are always reported
        return any(ev & (select.POLLERR | select.POLLHUP) for _, ev in p.poll(0))
    except (OSError, ValueError):
        return False


@app.command()
def events(
    follow: Annotated[
        bool, typer.Option("-f", "--follow", help="Keep printing new events, like tail -f.")
    ] = False,
    job: Annotated[str | None, typer.Option("--job", help="Only this job's events.")] = None,
    lines: Annotated[
        int | None,
        typer.Option("-n", "--lines", min=0, help="Print only the last N past events (default all)."),
    ] = None,
    until: Annotated[
        str | None,
        typer.Option(
            "--until",
            help="Follow until an event goes to one of these states (comma-separated, e.g. complete,failed), "
            "then exit 0. A job already there stops it at once.",
        ),
    ] = None,
    spool: SpoolOpt = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the journal's JSON lines as they are.")
    ] = False,
) -> None:
    """The transition journal of every writer, merged in time order; -f follows it."""
    try:
        tree = open_tree(spool)
    except SpoolError as exc:
        raise fail(exc, as_json) from None
    stop = {s.strip() for s in until.split(",") if s.strip()} if until else set()
    console = fast.console()
    out = sys.stdout.buffer

    def emit(batch: list[eventlog.Line]) -> None:
        for line in batch:
            if as_json:
                out.write(line.raw)
            else:
                console.print(views.event_line(printable_all(unsecret(line.event))))
        sys.stdout.flush()

    follower = eventlog.Follower(tree, job)
    if follow or stop:
        _ctrl_c_stops()
    try:
        past = follower.poll()
        emit(past if lines is None else past[-lines:] if lines else [])
        if stop and past and past[-1].event.to in stop:
            return  # already there: only the latest event says where a job is now
        while follow or stop:
            time.sleep(FOLLOW_EVERY)
            if _reader_gone():
                return
            for line in follower.poll():
                emit([line])
                if line.event.to in stop:
                    return
    except KeyboardInterrupt:
        return
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit
        return


# -- metrics and the status page -------------------------------------------------------------------


@app.command("metrics")
def metrics_cmd(
    worker: Annotated[str | None, typer.Option("--worker", help="Only this worker's series.")] = None,
    spool: SpoolOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """The Prometheus metrics the workers wrote, merged into one exposition."""
    tree, cfg = open_spool(spool, as_json)
    folder = metrics.folder(tree, cfg)
    if folder is None:
        raise fail(
            InvalidInput("observe.metrics_dir", "is empty in spool.toml, so no metrics are written"), as_json
        )
    fams = metrics.merged(folder)
    if worker is not None:
        for f in fams:
            f.samples = [s for s in f.samples if s.labels.get("worker") == worker]
        fams = [f for f in fams if f.samples]
    if as_json:
        print_json(fams)
        return
    if not fams:
        typer.echo(
            f"spool: no metrics in {folder} yet; every running spoold writes its own file there", err=True
        )
        return
    sys.stdout.write(families.exposition(fams))


@app.command()
def serve(
    bind: Annotated[
        str | None, typer.Option("--bind", help="HOST:PORT to listen on (default: [observe] bind).")
    ] = None,
    spool: SpoolOpt = None,
) -> None:
    """Serve the read-only status page and its JSON until Ctrl-C."""
    from spool.observe import web  # here: the other typer commands stay off the web page (+~15 ms)

    tree, cfg = open_spool(spool, False)
    try:
        host, port = web.parse_bind(bind or cfg.observe.bind)
    except ValueError as exc:
        raise fail(InvalidInput("--bind" if bind else "spool.toml: observe.bind", str(exc)), False) from None

    def ready(url: str) -> None:
        typer.echo(f"serving {url} for {tree.root} (read-only; Ctrl-C to stop)")
        sys.stdout.flush()

    try:
        web.serve(tree, cfg, host, port, ready)
    except OSError as exc:
        raise fail(SpoolError(f"cannot listen on {host}:{port} ({exc.strerror})"), False) from None
    except KeyboardInterrupt:
        pass
