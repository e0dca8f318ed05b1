"""Queue commands: init, submit, status, ls, show, logs."""

from __future__ import annotations

import getpass
import os
import sys
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from .. import accept, config, status
from ..errors import EXIT_INVALID, InvalidInput, NotFound, SpoolError
from ..events import Journal, cli_writer
from ..model import Rejection
from ..tree import Tree, write_atomic
from .common import JsonOpt, SpoolOpt, app, bar, fail, human_seconds, open_tree, print_json

# -- commands --------------------------------------------------------------------------


@app.command()
def init(
    directory: Annotated[Path, typer.Argument(help="Folder to create the spool in.")],
    asset_root: Annotated[
        list[str] | None,
        typer.Option("--asset-root", help="A folder sources may come from (repeatable)."),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Create the spool tree and a commented spool.toml (existing files are kept)."""
    tree = Tree.at(directory)
    tree.create()
    roots = [str(Path(r).absolute()) for r in (asset_root or [])]
    wrote = False
    if not tree.config_file.exists():
        write_atomic(tree.config_file, config.template(roots).encode())
        wrote = True
    try:
        config.load(tree.config_file)
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
    try:
        tree = open_tree(spool)
        cfg = config.load(tree.config_file)
    except SpoolError as exc:
        raise fail(exc, as_json) from None
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


@app.command("status")
def status_cmd(spool: SpoolOpt = None, as_json: JsonOpt = False) -> None:
    """Counts per state, running jobs with progress, and what needs attention."""
    try:
        tree = open_tree(spool)
    except SpoolError as exc:
        raise fail(exc, as_json) from None
    report = status_report(tree)
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


def status_report(tree: Tree, attention_limit: int = 10) -> dict[str, Any]:
    """The facts ``spool status`` shows; directory scans, parsing only what is shown."""
    counts = status.counts(tree)
    running = [
        {"job_id": jid, "worker": w, "progress": status.progress_of(tree, jid)}
        for jid, w in status.job_ids(tree, "running")
    ]
    failed = []
    for jid in _newest(tree.failed, attention_limit):
        info = status.show(tree, jid)
        f = info["failure"] if info else None
        failed.append(
            {
                "job_id": jid,
                "stage": f.stage if f else "unknown",
                "property": f.property if f else "unknown",
                "message": f.message if f else "no failure record found",
                "next_action": f.next_action if f else "Run spool fsck.",
            }
        )
    rejected = []
    for name in _newest(tree.rejected, attention_limit, suffix=".error.json"):
        rec = status.read(tree.rejected / f"{name}.error.json", Rejection)
        if rec is not None:
            rejected.append({"name": name, "file": rec.file, "reason": rec.reason, "at": rec.rejected_at})
    workers = [
        {
            "worker": w.worker,
            "host": w.host,
            "state": w.state,
            "active": len(w.active),
            "max_active": w.max_active,
            "heartbeat_age": round(time.time() - w.heartbeat_at.timestamp(), 1),
        }
        for w in status.workers(tree)
    ]
    return {
        "spool": str(tree.root),
        "counts": counts,
        "oldest_pending_age": _oldest_age(tree.pending),
        "running": running,
        "failed": failed,
        "rejected": rejected,
        "workers": workers,
    }


def _newest(folder: Path, limit: int, suffix: str = ".json") -> list[str]:
    """Names (without suffix) of the newest files in a folder, newest first."""
    entries = []
    try:
        with os.scandir(folder) as it:
            for e in it:
                if (
                    e.name.endswith(suffix)
                    and not e.name.startswith(".")
                    and (suffix != ".json" or not e.name.endswith(".error.json"))
                ):
                    try:
                        entries.append((e.stat().st_mtime, e.name[: -len(suffix)]))
                    except FileNotFoundError:
                        continue
    except FileNotFoundError:
        return []
    entries.sort(reverse=True)
    return [n for _, n in entries[:limit]]


def _oldest_age(folder: Path) -> float | None:
    oldest = None
    try:
        with os.scandir(folder) as it:
            for e in it:
                if e.name.endswith(".json") and not e.name.startswith("."):
                    try:
                        m = e.stat().st_mtime
                    except FileNotFoundError:
                        continue
                    oldest = m if oldest is None else min(oldest, m)
    except FileNotFoundError:
        return None
    return None if oldest is None else round(max(0.0, time.time() - oldest), 1)


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
