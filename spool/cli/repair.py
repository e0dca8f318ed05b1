"""Commands that repair and maintain a spool: recover, fsck, gc, verify."""

from __future__ import annotations

import threading
from typing import Annotated, Any

import typer

from spool import kinds
from spool.cli.common import JsonOpt, SpoolOpt, app, fail, open_spool, print_json
from spool.cli.common import printable as pr
from spool.core.errors import EXIT_ERROR, EXIT_NOT_FOUND, EXIT_NOT_READY, NotFound, SpoolError
from spool.core.model import Manifest
from spool.disk import formats, store
from spool.disk.tree import HOST
from spool.queue import status
from spool.queue.events import Journal
from spool.repair import migrate

#: The identity ``spool recover`` acts under while it holds recovered jobs.
RECOVERER = f"{HOST}-recover"


@app.command("recover")
def recover_cmd(
    worker: Annotated[
        str | None, typer.Option(help="Recover this worker's jobs (also when only suspect).")
    ] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Only say what would be done and why.")] = False,
    force: Annotated[
        bool, typer.Option(help="Recover a worker that looks alive (you know it is hung).")
    ] = False,
    spool: SpoolOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Inspect interrupted attempts and recover them by evidence (dead workers; suspect ones when named)."""
    # here: the other typer commands stay off the attempt machinery (+~9-26 ms)
    from spool.queue.execute import Context

    # here: the other typer commands stay off worker identities (+~1-3 ms)
    from spool.queue.workers import Identity
    from spool.repair import recover  # here: the other typer commands stay off recovery (+~6-9 ms)

    tree, cfg = open_spool(spool, as_json)
    ident = Identity(tree, RECOVERER)
    if not dry_run:
        try:
            ident.acquire()
        except SpoolError as exc:
            raise fail(exc, as_json) from None
    try:
        ctx = Context(tree, cfg, RECOVERER, Journal(tree, RECOVERER), threading.Event())
        if not dry_run:
            # Our own folder first: jobs a crashed earlier `spool recover` left holding.
            recover.adopt(ctx)
        if dry_run:
            plans = recover.plan(ctx, worker=worker, force=force)
        else:
            plans = recover.plan_settled(
                ctx, worker=worker, force=force, told=None if as_json else _tell_wait
            )
        done = [] if dry_run else recover.execute_plan(ctx, plans)
    finally:
        ident.release()
    if worker is not None and not any(p.worker == worker for p in plans):
        raise fail(NotFound(f"worker {worker} has no jobs in running/"), as_json)
    rows: list[dict[str, Any]] = [
        {
            "worker": p.worker,
            "health": p.health,
            "evidence": p.evidence,
            "act": p.act,
            "why": p.why,
            "jobs": [
                {"job_id": o.job_id, "decision": o.decision, "reason": o.reason, "to": o.to_state}
                for o in p.jobs
            ],
        }
        for p in plans
    ]
    if as_json:
        print_json(
            {
                "dry_run": dry_run,
                "workers": rows,
                "done": [{"job_id": o.job_id, "decision": o.decision, "to": o.to_state} for o in done],
            }
        )
        return
    if not plans:
        typer.echo("nothing to recover: no other worker holds jobs in running/")
    for p in plans:
        verb = ("would recover" if dry_run else "recovering") if p.act else "leaving"
        typer.echo(f"{pr(p.worker)}: {p.health}: {pr(p.evidence)}")
        typer.echo(f"  {verb} its {len(p.jobs)} job(s): {pr(p.why)}")
        for o in p.jobs:
            typer.echo(f"    {pr(o.job_id)}: {o.decision} -> {o.to_state}: {pr(o.reason)}")
    for o in done:
        typer.echo(f"recovered {pr(o.job_id)}: {o.decision} -> {o.to_state}")


def _tell_wait(seconds: float) -> None:
    typer.echo(f"waiting {seconds:.0f} s for this mount to show what another mount wrote", err=True)


@app.command("fsck")
def fsck_cmd(
    no_repair: Annotated[bool, typer.Option("--no-repair", help="Only report; repair nothing.")] = False,
    quick: Annotated[bool, typer.Option(help="Skip re-hashing store files.")] = False,
    settle: Annotated[
        float | None,
        typer.Option(
            help="Seconds a record must have been left alone before it is judged lost to a crash "
            "(default 5; 0 when no daemon runs)."
        ),
    ] = None,
    spool: SpoolOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Check every invariant over the whole tree; repair what has one repair; exit 0 only when clean."""
    from spool.repair import fsck  # here: the other typer commands stay off fsck (+~45-97 ms)

    tree, cfg = open_spool(spool, as_json)
    problems = fsck.check(
        tree,
        repair=not no_repair,
        stale_after=cfg.recovery.stale_after,
        verify_hashes=not quick,
        settle=settle,
    )
    remaining = [p for p in problems if p.open]
    if as_json:
        print_json({"clean": not remaining, "problems": [p.__dict__ for p in problems]})
    else:
        for p in problems:
            tag = "repaired" if p.repaired else "PROBLEM"
            line = f"{tag:<8} invariant {p.invariant}: {pr(p.path)}: {pr(p.problem)}"
            if p.repair:
                line += f" ({'did' if p.repaired else 'fix'}: {pr(p.repair)})"
            typer.echo(line)
        typer.echo("clean" if not remaining else f"{len(remaining)} problem(s) need attention")
    if remaining:
        raise typer.Exit(EXIT_ERROR)


@app.command("gc")
def gc_cmd(
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Only list what would be removed.")] = False,
    spool: SpoolOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Remove unreferenced store objects and old attempts' work folders (never what a manifest names)."""
    from spool.repair import gc  # here: the other typer commands stay off gc (+~3 ms)

    tree, cfg = open_spool(spool, as_json)
    rep = gc.collect(tree, cfg.recovery.work_retention, dry_run=dry_run)
    if as_json:
        print_json({"dry_run": dry_run, **rep.__dict__})
        return
    verb = "would remove" if dry_run else "removed"
    typer.echo(
        f"{verb} {len(rep.objects)} store object(s), {rep.object_bytes} bytes; "
        f"{len(rep.work_folders)} work folder(s), {rep.work_bytes} bytes; "
        f"kept {rep.kept_referenced} referenced object(s)"
    )


@app.command("verify")
def verify_cmd(
    job: Annotated[list[str] | None, typer.Argument(help="Job IDs (default: every complete job).")] = None,
    revalidate: Annotated[
        bool, typer.Option(help="Also run the validation gate on each output again.")
    ] = False,
    spool: SpoolOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Re-hash published outputs against their manifests (and optionally re-validate them).

    Exit 1 if an output fails; else 4 if a named job does not exist; else 3 if
    a named job is not complete yet."""

    tree, cfg = open_spool(spool, as_json)
    ids = job or sorted(j for j, _ in status.job_ids(tree, "complete"))
    rows: list[dict[str, Any]] = []
    for jid in ids:
        loc = status.locate(tree, jid)
        if loc is None:
            rows.append({"job_id": jid, "ok": False, "problem": f"no job {jid}", "exit_code": EXIT_NOT_FOUND})
            continue
        if loc.state != "complete":
            why = f"is {loc.state}, not complete: nothing published to verify yet"
            rows.append({"job_id": jid, "ok": False, "problem": why, "exit_code": EXIT_NOT_READY})
            continue
        m = status.read(tree.manifest_file(jid), Manifest)
        if m is None:
            rows.append({"job_id": jid, "ok": False, "problem": "no manifest", "exit_code": EXIT_ERROR})
            continue
        problem = store.verify(tree, m)
        if problem is None and revalidate:
            found = status.load_job(tree, jid)
            if found is not None:
                j = found[0]
                rep = kinds.of(j).check(
                    cfg, j, tree.root / m.output.store_path, tree.job_attempts(jid) / "verify.log"
                )
                if not rep.ok:
                    bad = rep.failed()[0]
                    problem = f"fails the {bad.name} check: expected {bad.expected}, got {bad.actual}"
        rows.append(
            {
                "job_id": jid,
                "ok": problem is None,
                "problem": problem,
                "sha256": m.output.sha256,
                "exit_code": EXIT_ERROR if problem else 0,
            }
        )
    bad_rows = [r for r in rows if not r["ok"]]
    if as_json:
        print_json({"ok": not bad_rows, "jobs": rows})
    else:
        for r in rows:
            typer.echo(
                f"{'ok' if r['ok'] else 'BAD':<4} {pr(r['job_id'])}"
                + (f": {pr(r['problem'])}" if r["problem"] else "")
            )
        typer.echo(f"{len(rows) - len(bad_rows)} of {len(rows)} verified")
    codes = {r["exit_code"] for r in bad_rows}
    for code in (EXIT_ERROR, EXIT_NOT_FOUND, EXIT_NOT_READY):
        if code in codes:
            raise typer.Exit(code)


@app.command("migrate")
def migrate_cmd(
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Only say what would be converted.")] = False,
    spool: SpoolOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Move the spool to the newest tree format in place (crash-safe: run it again after any stop)."""
    tree, cfg = open_spool(spool, as_json)
    try:
        rep = migrate.migrate(tree, cfg.acceptance.required_tags, dry_run=dry_run)
    except (SpoolError, OSError) as exc:
        raise fail(
            exc if isinstance(exc, SpoolError) else SpoolError(f"migrate stopped: {exc}"), as_json
        ) from None
    if as_json:
        print_json({**rep.__dict__, "dry_run": dry_run, "current": formats.CURRENT})
        return
    verb = "would convert" if dry_run else "converted"
    typer.echo(
        f"format {rep.was} -> {rep.now}: {verb} {rep.versions} version record(s) to format "
        f"{formats.CURRENT}'s index entries"
    )
    for path in rep.left:
        typer.echo(f"left\t{pr(path)}: no manifest names it (spool fsck judges it)")
