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

import getpass
import os
import re
import stat
import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from spool.cli.plain import (
    before_command,
    echo,
    fail,
    load_config,
    open_spool,
    open_tree,
    print_json,
    unsecret,
)
from spool.core.errors import EXIT_INVALID, InvalidInput, NotFound, SpoolError
from spool.core.printable import printable, printable_all, unsafe
from spool.queue import status as queue_status

if TYPE_CHECKING:
    from rich.console import Console

    from spool.core.config import Config

#: What ``spool ls`` lists, in its order.
LS_STATES = ("waiting", "pending", "held", "running", "complete", "failed", "rejected")


# -- the commands -----------------------------------------------------------------------


def console() -> Console:
    """Where rich lays out human output: styles on a terminal; plain, unwrapped
    lines in a pipe or file."""
    from rich.console import Console  # here: only the human views load rich (+~25 ms)

    if sys.stdout.isatty():
        return Console(highlight=False)
    return Console(highlight=False, width=1000, no_color=True, soft_wrap=True)


def status(spool: Path | None, as_json: bool, exact: bool = False) -> None:
    """``spool status``: the overview every status view is drawn from.

    The config is read only when the overview reads a record (a worker, a failure:
    what its secrets must be masked in, what its staleness judges): counting a
    backlog needs neither it nor msgspec, whose import costs as much as Python's
    start-up."""
    # here: ls, submit and the library commands stay off the overview (+~10 ms)
    from spool.observe import overview

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
    from spool.cli import views  # here: --json stays off rich (views +~28 ms)

    console().print(views.status_view(printable_all(unsecret(ov))))


def ls(state: str | None, spool: Path | None, as_json: bool) -> None:
    """``spool ls``: job IDs by listing the state folders (no job file is read)."""

    try:
        tree = open_tree(spool)
        if state is not None and state not in LS_STATES:
            raise InvalidInput("STATE", f"{state!r} is not one of {', '.join(LS_STATES)}")
    except SpoolError as exc:
        raise fail(exc, as_json) from None
    # Sorted job IDs per state; running/ is per worker: (job ID, worker) pairs there.
    found: list[tuple[str, list[Any]]] = [
        (s, sorted(queue_status.job_ids(tree, s) if s == "running" else queue_status.job_names(tree, s)))
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

    # One write: 100,000 lines masked and written one by one cost more than listing them.
    lines = []
    for s, ids in found:
        if s == "running":
            lines += [f"{s:<9} {printable(jid)}  {printable(w)}" for jid, w in ids]
        elif ids:  # one join, not a format per line (100,000 pending jobs)
            head = f"{s:<9} "
            blob = "\n".join(ids)
            if unsafe(blob.replace("\n", "")):  # a name no job ID has: escape each (rare)
                ids = [printable(jid) for jid in ids]
            lines.append(head + f"\n{head}".join(ids))
    sys.stdout.write("".join(line + "\n" for line in lines))


def job_info(job: str, spool: Path | None, as_json: bool) -> dict[str, Any]:
    """What ``spool show JOB`` shows, or the command ends with exit 4."""
    # here: ls, submit and the library commands stay off the overview (+~10 ms)
    from spool.observe import overview

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
    from spool.cli import views  # here: --json stays off rich (views +~28 ms)

    console().print(views.show_view(printable_all(unsecret(info))))


def submit(files: list[Path], spool: Path | None, as_json: bool) -> None:
    """``spool submit``: accept or reject each file; ends with the first failure's code."""
    from spool.queue import accept  # here: status, ls and show stay off acceptance (+~110 ms)
    from spool.queue.events import Journal, cli_writer

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
                echo(f"spool: {printable(str(local))}", err=True)
            continue
        outcome = accept.submit_file(tree, cfg, f, journal, user)
        if isinstance(outcome, accept.Accepted):
            for job in outcome.jobs:  # a brief or a fan-out makes several
                results.append(
                    {"file": str(f), "job_id": job.job_id, "error": None, "state": accept.state_of(job)}
                )
                if not as_json:
                    echo(job.job_id)
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
                echo(f"{printable(str(f))}: rejected: {printable(str(outcome.error))}", err=True)
    if as_json:
        print_json(results)
    if code:
        raise SystemExit(code)


def unreadable(path: Path) -> SpoolError | None:
    """Why the submitter's own file cannot be submitted at all, if it cannot."""
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


def search(
    terms: list[str],
    spool: Path | None,
    as_json: bool,
    all_versions: bool = False,
    visibility: list[str] | None = None,
    do_enrich: bool = False,
    limit: int | None = None,
) -> None:
    """``spool search``: current asset versions by tags and enrichment; every hit's
    store file exists."""
    # here: the queue commands stay off the library (catalog +~60 ms)
    from spool.library import catalog, enrich

    tree, cfg = open_spool(spool, as_json)
    try:
        # Only a dotted field (``plugin.key``) can name a plug-in's value: the entry-point
        # lookup (importlib.metadata, a fifth of the command) is for a query that has one.
        dotted = any("." in re.split(r"[<>!=]", t, maxsplit=1)[0] for t in terms)
        query = catalog.parse_terms(terms, enrich.plugins() if dotted else ())
        if do_enrich and query.comparisons:
            tag_only = catalog.Query(query.tags, [])
            base = catalog.search(tree, cfg, tag_only, all_versions=all_versions, visibility=visibility or ())
            fields = {enrich.enricher_of(c.field, enrich.plugins()) for c in query.comparisons}
            for hit in base.results:
                enrich.enrich_object(
                    tree, cfg, hit.sha256, tree.root / hit.path, sorted(f for f in fields if f)
                )
        result = catalog.search(
            tree, cfg, query, all_versions=all_versions, visibility=visibility or (), limit=limit
        )
    except SpoolError as exc:
        raise fail(exc, as_json) from None
    if as_json:
        print_json(result)
        return
    for h in result.results:
        tags = " ".join(f"{printable(k)}={printable(v)}" for k, v in sorted(h.tags.items()))
        dur = f"{h.duration:.2f}s" if h.duration is not None else "-"
        cells = [h.job, h.sha256[:12], h.resolution or "-", dur, h.path]
        echo("\t".join([*map(printable, cells), tags]))
    for f, n in sorted(result.partial.items()):
        echo(
            f"partial: {n} matching asset(s) could not be judged on {printable(f)} "
            "(spool enrich, or --enrich)",
            err=True,
        )


def get(
    ref: str,
    spool: Path | None,
    as_json: bool,
    to: Path | None = None,
    link: bool = False,
    visibility: list[str] | None = None,
) -> None:
    """``spool get``: the path of a verified published file, or a verified copy in ``to``;
    only what ``[library] visible`` (widened by ``visibility``) admits."""
    from spool.library import catalog  # here: the queue commands stay off the library (catalog +~60 ms)
    from spool.library import visibility as vis

    tree, cfg = open_spool(spool, as_json)
    try:
        got = catalog.resolve(tree, ref, vis.rule(cfg, visibility or ()))
        path = catalog.copy_to(got, to, link=link) if to is not None else got.path
    except SpoolError as exc:
        raise fail(exc, as_json) from None
    except OSError as exc:
        raise fail(SpoolError(f"{ref}: {exc.strerror or exc}"), as_json) from None
    if as_json:
        print_json({"job": got.job, "sha256": got.sha256, "path": str(path)})
        return
    echo(printable(str(path)))


def show_asset(name: str, spool: Path | None, as_json: bool, visibility: list[str] | None = None) -> None:
    """``spool show NAME`` (no ``@``): the versions of an asset and which one is current;
    only versions ``[library] visible`` (widened by ``visibility``) admits."""
    from spool.core.model import Manifest  # here: ls and status --json count without msgspec (+~28 ms)
    from spool.disk.records import read
    from spool.library import catalog  # here: the queue commands stay off the library (catalog +~60 ms)
    from spool.library import visibility as vis

    tree, cfg = open_spool(spool, as_json)
    vs = catalog.versions(tree, name, vis.rule(cfg, visibility or ()))
    if not vs:
        raise fail(NotFound(f"no asset or job {name} in {tree.root}"), as_json)
    if as_json:
        cur = next((v.job for v in vs if v.current), None)
        print_json({"name": name, "current": cur, "versions": vs})
        return
    for v in vs:
        m = read(tree.manifest_file(v.job), Manifest)
        when = "-" if m is None else m.published_at.isoformat(timespec="seconds")
        mark = "* current" if v.current else ""
        row = [v.job, v.state, (v.sha256 or "-")[:12], when, mark]
        echo("\t".join(map(printable, row)).rstrip())


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


#: Per fast command: its flags and the options that take a value (besides ``--spool``).
FLAGS = {
    "status": {"--json", "--exact"},
    "ls": {"--json"},
    "show": {"--json"},
    "submit": {"--json"},
    "search": {"--json", "--all-versions", "--enrich"},
    "get": {"--json", "--link"},
}
VALUED = {"search": {"--limit", "--visibility"}, "get": {"--to", "--visibility"}, "show": {"--visibility"}}
#: Valued options that may be given more than once (each adds a value).
REPEATABLE = {"--visibility"}


def parse(argv: list[str]) -> Callable[[], None] | None:
    """The fast command ``argv`` asks for, ready to run, or ``None`` to let typer
    handle it (help, usage errors, anything it would read differently)."""
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
    if i >= len(argv) or argv[i] not in FLAGS:
        return None
    command, rest = argv[i], argv[i + 1 :]
    flags, valued = FLAGS[command], VALUED.get(command, set()) | {"--spool"}
    args: list[str] = []
    given: set[str] = set()
    values: dict[str, list[str]] = {}
    j = 0
    while j < len(rest):
        arg = rest[j]
        name, eq, inline = arg.partition("=")
        if arg in flags:
            given.add(arg)
        elif name in valued and (eq or j + 1 < len(rest)):
            if name in values and name not in REPEATABLE:
                return None  # given twice: typer says which one wins
            if not eq:
                j += 1
            values.setdefault(name, []).append(inline if eq else rest[j])
        elif arg.startswith("-"):
            return None  # --help, --, an option of another command, a typo: typer says what
        else:
            args.append(arg)
        j += 1
    spool = values.get("--spool", [None])[0]
    for value in (spool_before, spool, *values.get("--to", [])):
        if value is not None and not _click_accepts(value):
            return None
    if any(not v or v.startswith("-") for v in values.get("--visibility", [])):
        return None  # a value that looks like an option: typer says what it makes of it
    if any("\x00" in a or not _encodable(a) for a in [*args, *values.get("--visibility", [])]):
        return None
    limit: int | None = None
    if "--limit" in values:
        text = values["--limit"][0]
        if not (text.isascii() and text.isdigit() and int(text) >= 1):
            return None  # typer words the usage error
        limit = int(text)
    before_command["spool"] = Path(spool_before) if spool_before is not None else None
    where = Path(spool) if spool is not None else None
    as_json = "--json" in given
    run = _command(command, args, where, as_json, given, values, limit)
    if run is None:
        before_command["spool"] = None
    return run


def _command(
    command: str,
    args: list[str],
    where: Path | None,
    as_json: bool,
    given: set[str],
    values: dict[str, list[str]],
    limit: int | None,
) -> Callable[[], None] | None:
    """The parsed command line as a call, or ``None`` where typer must answer."""
    if command == "status" and not args:
        return partial(status, where, as_json, "--exact" in given)
    if command == "ls" and len(args) <= 1:
        return partial(ls, args[0] if args else None, where, as_json)
    if command == "show" and len(args) == 1:
        if "@" in args[0]:
            return partial(show, args[0], where, as_json)
        # an asset name: the library
        return partial(show_asset, args[0], where, as_json, values.get("--visibility"))
    if command == "submit" and args and all(_click_accepts(a) for a in args):
        return partial(submit, [Path(a) for a in args], where, as_json)
    if command == "search":
        visibility = values.get("--visibility")
        return partial(
            search, args, where, as_json, "--all-versions" in given, visibility, "--enrich" in given, limit
        )
    if command == "get" and len(args) == 1:
        to = values.get("--to")
        return partial(
            get,
            args[0],
            where,
            as_json,
            Path(to[0]) if to else None,
            "--link" in given,
            values.get("--visibility"),
        )
    return None
