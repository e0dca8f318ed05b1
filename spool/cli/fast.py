"""The commands scripts call in loops, run without typer.

``spool status``, ``spool ls [STATE]``, ``spool show JOB`` and ``spool submit
FILE...`` (each with or without ``--json``) are what a render farm's glue and
its operators call once per job or once a second. Building the typer app (and
importing click behind it) costs more than the command itself, so
:func:`parse` recognises exactly these shapes of the command line and
:func:`spool.cli.main` runs them straight away. rich is imported only to lay
out the human ``status`` and ``show``; ``--json``, ``ls`` and ``submit`` never
import it. Anything else (``--help``, an unknown or misspelt option, a
missing argument) goes to the typer app, which prints the usual help and
errors.

The typer commands call the same functions below, so both paths print the
same bytes and exit with the same codes: the fast path is only a shorter way
in, never a second implementation.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import EXIT_INVALID, InvalidInput, NotFound, SpoolError
from .plain import before_command, echo, fail, load_config, open_spool, open_tree, print_json, unsecret

if TYPE_CHECKING:
    from rich.console import Console

    from ..config import Config

#: What ``spool ls`` lists, in its order.
LS_STATES = ("pending", "held", "running", "complete", "failed", "rejected")


# -- the commands -----------------------------------------------------------------------


def console() -> Console:
    """Where rich lays out human output: styles on a terminal; plain, unwrapped
    lines in a pipe or file."""
    import sys

    from rich.console import Console

    if sys.stdout.isatty():
        return Console(highlight=False)
    return Console(highlight=False, width=1000, no_color=True, soft_wrap=True)


def status(spool: Path | None, as_json: bool, exact: bool = False) -> None:
    """``spool status``: the overview every status view is drawn from.

    The config is read only when the overview reads a record (a worker, a failure:
    what its secrets must be masked in, what its staleness judges): counting a
    backlog needs neither it nor msgspec, whose import costs as much as Python's
    start-up."""
    from .. import overview

    try:
        tree = open_tree(spool)
    except SpoolError as exc:
        raise fail(exc, as_json) from None

    def config() -> Config:
        try:
            return load_config(tree)
        except SpoolError as exc:
            raise fail(exc, as_json) from None

    ov = overview.overview(tree, config, exact=exact)
    if as_json:
        print_json(ov)
        return
    from . import views

    console().print(views.status_view(unsecret(ov)))


def ls(state: str | None, spool: Path | None, as_json: bool) -> None:
    """``spool ls``: job IDs by listing the state folders (no job file is read)."""
    from .. import status

    try:
        tree = open_tree(spool)
        if state is not None and state not in LS_STATES:
            raise InvalidInput("STATE", f"{state!r} is not one of {', '.join(LS_STATES)}")
    except SpoolError as exc:
        raise fail(exc, as_json) from None
    # Sorted job IDs per state; running/ is per worker: (job ID, worker) pairs there.
    found: list[tuple[str, list[Any]]] = [
        (s, sorted(status.job_ids(tree, s) if s == "running" else status.job_names(tree, s)))
        for s in ([state] if state else LS_STATES)
    ]
    if as_json:
        print_json(
            [
                {"job_id": jid, "state": s, "worker": w}
                for s, ids in found
                for jid, w in (ids if s == "running" else ((jid, None) for jid in ids))
            ]
        )
        return
    import sys

    # One write: 100,000 lines masked and written one by one cost more than listing them.
    lines = []
    for s, ids in found:
        if s == "running":
            lines += [f"{s:<9} {jid}  {w}" for jid, w in ids]
        elif ids:  # one join, not a format per line (100,000 pending jobs)
            head = f"{s:<9} "
            lines.append(head + f"\n{head}".join(ids))
    sys.stdout.write("".join(line + "\n" for line in lines))


def job_info(job: str, spool: Path | None, as_json: bool) -> dict[str, Any]:
    """What ``spool show JOB`` shows, or the command ends with exit 4."""
    from .. import overview

    try:
        tree = open_tree(spool)
        info = overview.job_detail(tree, job)
        if info is None:
            raise NotFound(f"no job {job} in {tree.root}")
    except SpoolError as exc:
        raise fail(exc, as_json) from None
    return info


def show(job: str, spool: Path | None, as_json: bool) -> None:
    """``spool show JOB``: one job's timeline, attempts, failure, output, approvals."""
    info = job_info(job, spool, as_json)
    if as_json:
        print_json(info)
        return
    from . import views

    console().print(views.show_view(unsecret(info)))


def submit(files: list[Path], spool: Path | None, as_json: bool) -> None:
    """``spool submit``: accept or reject each file; ends with the first failure's code."""
    import getpass

    from .. import accept
    from ..events import Journal, cli_writer

    tree, cfg = open_spool(spool, as_json)
    journal = Journal(tree, cli_writer())
    user = getpass.getuser()
    results: list[dict[str, Any]] = []
    code = 0
    for f in files:
        local = unreadable(f)
        if local is not None:
            code = code or local.exit_code
            results.append(
                {"file": str(f), "job_id": None, "error": str(local), "field": "FILES", "rejected": None}
            )
            if not as_json:
                echo(f"spool: {local}", err=True)
            continue
        outcome = accept.submit_file(tree, cfg, f, journal, user)
        if isinstance(outcome, accept.Accepted):
            results.append({"file": str(f), "job_id": outcome.job.job_id, "error": None})
            if not as_json:
                echo(outcome.job.job_id)
        else:
            code = code or EXIT_INVALID
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
                echo(f"{f}: rejected: {outcome.error}", err=True)
    if as_json:
        print_json(results)
    if code:
        raise SystemExit(code)


def unreadable(path: Path) -> SpoolError | None:
    """Why the submitter's own file cannot be submitted at all, if it cannot."""
    import stat

    try:
        st = os.stat(path)
    except FileNotFoundError:
        return NotFound(f"{path}: no such file")
    except OSError as exc:
        return InvalidInput(str(path), f"cannot be read ({exc.strerror})")
    if stat.S_ISDIR(st.st_mode):
        return InvalidInput(str(path), "is a folder, not a submission file")
    if not stat.S_ISREG(st.st_mode):
        return InvalidInput(str(path), "is not a regular file (a FIFO, socket or device)")
    if not os.access(path, os.R_OK):
        return InvalidInput(str(path), "cannot be read (permission denied)")
    return None


# -- the command line -------------------------------------------------------------------


def _click_accepts(value: str) -> bool:
    """Whether typer would take ``value`` as a ``Path`` without a usage error: an
    existing path must be readable (click.Path's default check); anything odd
    (empty, undecodable bytes) is left to typer."""
    if not value or value.startswith("-"):
        return False
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    try:
        os.stat(value)
    except OSError:
        return True
    except ValueError:  # a NUL byte
        return False
    return os.access(value, os.R_OK)


def _encodable(value: str) -> bool:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def parse(argv: list[str]) -> Callable[[], None] | None:
    """The fast command ``argv`` asks for, ready to run, or ``None`` to let typer
    handle it (help, usage errors, human output that rich lays out)."""
    spool_before: str | None = None
    i = 0
    while i < len(argv) and argv[i].startswith("-"):  # options before the command: only --spool
        arg = argv[i]
        if arg == "--spool" and i + 1 < len(argv) and spool_before is None:
            spool_before, i = argv[i + 1], i + 2
        elif arg.startswith("--spool=") and spool_before is None:
            spool_before, i = arg.removeprefix("--spool="), i + 1
        else:
            return None
    if i >= len(argv):
        return None
    command, rest = argv[i], argv[i + 1 :]
    args: list[str] = []
    as_json = exact = False
    spool: str | None = None
    j = 0
    while j < len(rest):
        arg = rest[j]
        if arg == "--json":
            as_json = True
        elif arg == "--exact" and command == "status":
            exact = True
        elif arg == "--spool" and j + 1 < len(rest) and spool is None:
            spool = rest[j + 1]
            j += 1
        elif arg.startswith("--spool=") and spool is None:
            spool = arg.removeprefix("--spool=")
        elif arg.startswith("-"):
            return None  # --help, --, an option of another command, a typo: typer says what
        else:
            args.append(arg)
        j += 1
    for value in (spool_before, spool):
        if value is not None and not _click_accepts(value):
            return None
    if any("\x00" in a or not _encodable(a) for a in args):
        return None
    before_command["spool"] = Path(spool_before) if spool_before is not None else None
    where = Path(spool) if spool is not None else None
    if command == "status" and not args:
        return partial(status, where, as_json, exact)
    if command == "ls" and len(args) <= 1:
        return partial(ls, args[0] if args else None, where, as_json)
    if command == "show" and len(args) == 1 and "@" in args[0]:  # an asset name: the library
        return partial(show, args[0], where, as_json)
    if command == "submit" and args and all(_click_accepts(a) for a in args):
        return partial(submit, [Path(a) for a in args], where, as_json)
    before_command["spool"] = None
    return None
