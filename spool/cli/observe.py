"""Commands that look at the queue: status, ls, show, logs."""

from __future__ import annotations

import sys
import time
from typing import Annotated

import typer

from .. import status
from ..errors import InvalidInput, NotFound, SpoolError
from .common import JsonOpt, SpoolOpt, app, bar, fail, human_seconds, open_tree, print_json


@app.command("status")
def status_cmd(spool: SpoolOpt = None, as_json: JsonOpt = False) -> None:
    """Counts per state, running jobs with progress, and what needs attention."""
    try:
        tree = open_tree(spool)
    except SpoolError as exc:
        raise fail(exc, as_json) from None
    report = status.report(tree)
    if as_json:
        print_json(report)
        return
    c = report["counts"]
    typer.echo(f"spool {tree.root}")
    typer.echo("  " + "  ".join(f"{k} {v}" for k, v in c.items()))
    if report["oldest_pending_age"] is not None:
        typer.echo(f"  oldest pending job waiting {human_seconds(report['oldest_pending_age'])}")
    if report["running"]:
        typer.echo("\nRunning")
        for r in report["running"]:
            p = r["progress"]
            if p is None:
                typer.echo(f"  {r['job_id']:<32} {r['worker']:<20} starting")
                continue
            fps = f"{p.fps:.0f} fps" if p.fps else "- fps"
            speed = f"{p.speed:.2f}x" if p.speed else "-"
            eta = human_seconds(p.eta_seconds) if p.eta_seconds is not None else "?"
            pct = f"{p.percent:5.1f}%" if p.percent is not None else "    ?"
            typer.echo(
                f"  {r['job_id']:<32} {r['worker']:<20} {bar(p.percent)} {pct} {fps} {speed} ETA {eta}"
            )
    attention = report["failed"] or report["rejected"]
    if attention:
        typer.echo("\nNeeds attention")
        for f in report["failed"]:
            typer.echo(f"  failed    {f['job_id']}: {f['stage']}: {f['property']}: {f['message']}")
            typer.echo(f"            next: {f['next_action']}")
        for r in report["rejected"]:
            typer.echo(f"  rejected  {r['file']}: {r['reason']}")
    if report["workers"]:
        typer.echo("\nWorkers")
        for w in report["workers"]:
            typer.echo(
                f"  {w['worker']:<24} {w['state']:<9} {w['active']}/{w['max_active']} slots"
                f"  heartbeat {human_seconds(w['heartbeat_age'])} ago"
            )


@app.command("ls")
def ls_cmd(
    state: Annotated[
        str | None, typer.Argument(help="pending, running, complete, failed or rejected.")
    ] = None,
    spool: SpoolOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """List job IDs (with their state and, when running, their worker)."""
    states = ["pending", "running", "complete", "failed", "rejected"]
    try:
        tree = open_tree(spool)
        if state is not None and state not in states:
            raise InvalidInput("STATE", f"{state!r} is not one of {', '.join(states)}")
    except SpoolError as exc:
        raise fail(exc, as_json) from None
    rows = [
        {"job_id": jid, "state": s, "worker": w}
        for s in ([state] if state else states)
        for jid, w in sorted(status.job_ids(tree, s))
    ]
    if as_json:
        print_json(rows)
        return
    out = sys.stdout
    for r in rows:
        out.write(f"{r['state']:<9} {r['job_id']}" + (f"  {r['worker']}" if r["worker"] else "") + "\n")


@app.command()
def show(
    job: Annotated[str, typer.Argument(help="Job ID (name@revision).")],
    spool: SpoolOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """One job: its state, attempts, failure and manifest."""
    try:
        tree = open_tree(spool)
        info = status.show(tree, job)
        if info is None:
            raise NotFound(f"no job {job} in {tree.root}")
    except SpoolError as exc:
        raise fail(exc, as_json) from None
    if as_json:
        print_json(info)
        return
    j = info["job"]
    typer.echo(f"{j.job_id}  {info['state']}" + (f" on {info['worker']}" if info["worker"] else ""))
    typer.echo(f"  submitted {j.submitted_at:%Y-%m-%d %H:%M:%S} by {j.submitted_by}, priority {j.priority}")
    if j.supersedes:
        typer.echo(f"  supersedes {j.supersedes}")
    typer.echo(f"  recipe {j.recipe_hash[:16]}  output {j.output.file}")
    typer.echo("  sources: " + ", ".join(f"{s.role}={s.path}" for s in j.sources))
    typer.echo("  tags: " + ", ".join(f"{k}={v}" for k, v in sorted(j.tags.items())))
    for a in info["attempts"]:
        when = f"{a['claimed_at']:%Y-%m-%d %H:%M:%S}" if a["claimed_at"] else "?"
        typer.echo(f"  attempt {a['n']}: {a['worker']} at {when}: {a['outcome']}")
    f = info["failure"]
    if f is not None:
        typer.echo(f"  failure: {f.stage}: {f.property}: {f.message}")
        if f.expected is not None or f.actual is not None:
            typer.echo(f"    expected {f.expected}, got {f.actual}")
        for line in f.log_excerpt[-5:]:
            typer.echo(f"    | {line}")
        typer.echo(f"  next: {f.next_action}")
    m = info["manifest"]
    if m is not None:
        typer.echo(f"  output: {m.output.store_path}")
        typer.echo(f"    sha256 {m.output.sha256}  {m.output.size} bytes  (attempt {m.attempt})")


@app.command()
def logs(
    job: Annotated[str, typer.Argument(help="Job ID.")],
    attempt: Annotated[int | None, typer.Option(help="Attempt number (default: the latest).")] = None,
    follow: Annotated[bool, typer.Option("-f", "--follow", help="Keep printing while the job runs.")] = False,
    spool: SpoolOpt = None,
) -> None:
    """Print the FFmpeg log of a job's attempt."""
    try:
        tree = open_tree(spool)
        nums = status.attempt_numbers(tree, job)
        if status.locate(tree, job) is None:
            raise NotFound(f"no job {job} in {tree.root}")
        n = attempt if attempt is not None else (nums[-1] if nums else None)
        if n is None or n not in nums:
            raise NotFound(f"{job} has no attempt {attempt}" if attempt else f"{job} has not started yet")
    except SpoolError as exc:
        raise fail(exc, False) from None
    path = tree.attempt_dir(job, n) / "ffmpeg.log"
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
        loc = status.locate(tree, job)
        if not follow or loc is None or loc.state != "running":
            break
        time.sleep(0.5)
