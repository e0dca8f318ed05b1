"""Commands that change what should happen: retry, revise, cancel, approve, hold, release."""

from __future__ import annotations

import getpass
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer

from spool.cli.common import JsonOpt, SpoolOpt, app, echo, fail, open_spool, open_tree, print_json, printable
from spool.core.config import Config
from spool.core.decoding import parse_json
from spool.core.errors import InvalidInput, SpoolError
from spool.disk.tree import Tree
from spool.queue import intent
from spool.queue.events import Journal, cli_writer

JobArg = Annotated[str, typer.Argument(help="Job ID (name@revision).")]
ByOpt = Annotated[str | None, typer.Option("--by", help="Who does this (default: your user name).")]


def _journal(spool: Path | None, as_json: bool) -> tuple[Tree, Config, Journal]:
    tree, cfg = open_spool(spool, as_json)
    return tree, cfg, Journal(tree, cli_writer())


def _move(
    move: Callable[[Tree, str, str, Journal], None],
    job: str,
    by: str | None,
    spool: Path | None,
    as_json: bool,
    state: str,
    said: str,
) -> None:
    """retry, hold and release: one intent function moving one job, one line of output."""
    tree, _, journal = _journal(spool, as_json)
    try:
        move(tree, job, by or getpass.getuser(), journal)
    except SpoolError as exc:
        raise fail(exc, as_json) from None
    if as_json:
        print_json({"job_id": job, "state": state})
    else:
        typer.echo(f"{printable(job)}: {said}")


@app.command("retry")
def retry_cmd(
    job: JobArg,
    yes: Annotated[
        bool,
        typer.Option(
            "--yes", help="Retry although it costs: a generation's new create request at its provider."
        ),
    ] = False,
    by: ByOpt = None,
    spool: SpoolOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Send a failed job back to pending: same job file and recipe, a new attempt.

    A retry that sends a generation's new create request to its provider (it may cost)
    needs --yes; one that downloads a kept result again does not."""
    tree, _, journal = _journal(spool, as_json)
    try:
        cost = intent.resubmits_to(tree, job)
        intent.retry_job(tree, job, by or getpass.getuser(), journal, resubmit=yes)
    except SpoolError as exc:
        raise fail(exc, as_json) from None
    if cost is not None:
        echo(f"spool: warning: the retry of {job} sends {cost}", err=True)
    if as_json:
        out: dict[str, object] = {"job_id": job, "state": "pending"}
        if cost is not None:
            out |= {"submits_again": True, "cost": cost}
        print_json(out)
    else:
        typer.echo(f"{printable(job)}: pending (retry)")


@app.command()
def revise(
    job: JobArg,
    spec: Annotated[
        Path,
        typer.Option(
            "--spec",
            "--recipe",
            help="JSON file with the new spec: a render's recipe, or a generation's generate table "
            "(provider, model, input; what it leaves out carries over).",
        ),
    ],
    source: Annotated[list[str] | None, typer.Option("--source", help="ROLE=PATH to add or replace.")] = None,
    force: Annotated[
        bool, typer.Option("--force", help="Revise JOB even though a newer revision of it exists.")
    ] = False,
    by: ByOpt = None,
    spool: SpoolOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """A new editorial choice: a new revision name@N+1 that supersedes JOB (which stays as it was).

    A render's new recipe, or a generation's new prompt or parameters. Refused while JOB has a
    newer revision (revise the newest), unless --force."""
    tree, cfg, journal = _journal(spool, as_json)
    try:
        try:
            value = parse_json(spec.read_bytes(), "--spec")
        except OSError as exc:
            raise InvalidInput("--spec", f"{spec} cannot be read ({exc.strerror})") from None
        if isinstance(value, dict) and ("recipe" in value or "generate" in value):
            # A job or submission file carries sources, tags and output too, which
            # revise would silently ignore: ask for the spec alone.
            raise InvalidInput(
                "--spec",
                f"{spec} is a whole job or submission file; pass a file holding only its spec "
                "(a render's recipe, e.g. jq .recipe FILE; a generation's generate table, jq .generate FILE)",
            )
        extra = {}
        for item in source or []:
            role, sep, path = item.partition("=")
            if not sep or not role or not path:
                raise InvalidInput("--source", f"{item!r} is not ROLE=PATH")
            extra[role] = path
        if intent.fanout_jobs(tree, job) is not None:  # a fan-out's parent: every variant again
            if extra:
                raise InvalidInput("--source", "give sources per variant: revise one variant, or submit anew")
            made = intent.revise_fanout(tree, cfg, job, value, by or getpass.getuser(), journal)
        else:
            made = [
                intent.revise(tree, cfg, job, value, by or getpass.getuser(), journal, extra, force=force)
            ]
    except SpoolError as exc:
        raise fail(exc, as_json) from None
    if as_json:
        if len(made) == 1:
            print_json({"job_id": made[0].job_id, "supersedes": job})
        else:
            print_json(
                {"parent": job, "jobs": [{"job_id": j.job_id, "supersedes": j.supersedes} for j in made]}
            )
    else:
        for new in made:
            typer.echo(new.job_id)


@app.command()
def cancel(
    job: JobArg,
    wait: Annotated[
        float, typer.Option(help="Seconds to wait for a running job's worker to stop it.")
    ] = 30.0,
    by: ByOpt = None,
    spool: SpoolOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Cancel a pending, held or running job (a running render is stopped and recorded)."""
    tree, _, journal = _journal(spool, as_json)
    try:
        state = intent.cancel(tree, job, by or getpass.getuser(), journal, wait=wait)
    except SpoolError as exc:
        raise fail(exc, as_json) from None
    if as_json:
        print_json({"job_id": job, "state": state})
    elif state == "failed":
        typer.echo(f"{printable(job)}: cancelled")
    else:
        typer.echo(f"{printable(job)}: too late to cancel, it is {state}")


@app.command()
def approve(
    job: JobArg,
    by: Annotated[str, typer.Option("--by", help="Who approves.")],
    note: Annotated[str, typer.Option(help="A note kept with the approval.")] = "",
    sha256: Annotated[
        str | None, typer.Option(help="The output hash you reviewed (refused if it changed).")
    ] = None,
    spool: SpoolOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Record an approval of a complete job's output, keyed by job and output hash."""
    try:
        tree = open_tree(spool)
        done = intent.approve_all(tree, job, by, note, sha256)
    except SpoolError as exc:
        raise fail(exc, as_json) from None
    if as_json:
        if len(done) == 1 and done[0][0] == job:
            print_json({"approval": done[0][1], "new": done[0][2]})
        else:
            print_json(
                {"parent": job, "approvals": [{"job_id": j, "approval": r, "new": n} for j, r, n in done]}
            )
    else:
        for jid, rec, new in done:
            if rec is None:
                typer.echo(f"{printable(jid)}: not approved: not complete yet")
                continue
            said = f"approved by {printable(rec.by)} (sha256 {rec.sha256[:16]})" + (
                "" if new else ", already"
            )
            typer.echo(f"{printable(jid)}: {said}")


@app.command()
def hold(job: JobArg, by: ByOpt = None, spool: SpoolOpt = None, as_json: JsonOpt = False) -> None:
    """Set a pending job aside in held/ (no worker claims it) until released."""
    _move(intent.hold, job, by, spool, as_json, "held", "held")


@app.command()
def release(job: JobArg, by: ByOpt = None, spool: SpoolOpt = None, as_json: JsonOpt = False) -> None:
    """Return a held job to pending (one waiting for its upstreams to waiting/); a fan-out's
    parent: every held variant."""
    tree, cfg, journal = _journal(spool, as_json)
    try:
        done = intent.release_all(tree, job, by or getpass.getuser(), journal, cfg)
    except SpoolError as exc:
        raise fail(exc, as_json) from None
    if as_json:
        if len(done) == 1 and job in done:
            print_json({"job_id": job, "state": done[job]})
        else:
            print_json({"parent": job, "jobs": [{"job_id": j, "state": st} for j, st in done.items()]})
    else:
        for jid, state in done.items():
            typer.echo(f"{printable(jid)}: {state} (released)")
