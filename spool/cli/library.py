"""The asset library's commands: search, get, enrich, index (SPEC section 9)."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from spool.cli import fast
from spool.cli.common import JsonOpt, SpoolOpt, app, echo, fail, open_spool, print_json, printable
from spool.cli.views import human_bytes
from spool.core.errors import InvalidInput, SpoolError
from spool.core.model import JOB_ID_RE
from spool.disk.tree import Tree
from spool.library import catalog, enrich, index, indexpaths, segments
from spool.library.index import NAME_RE


@app.command("search")
def search_cmd(
    terms: Annotated[
        list[str] | None,
        typer.Argument(help="TAG=VALUE and enrichment comparisons (loudness<-20, scenes>=3); ANDed."),
    ] = None,
    all_versions: Annotated[bool, typer.Option("--all-versions", help="Every complete revision.")] = False,
    visibility: Annotated[
        list[str] | None,
        typer.Option("--visibility", help="Also list this visibility (repeatable); see [library] visible."),
    ] = None,
    do_enrich: Annotated[
        bool, typer.Option("--enrich", help="Compute missing enrichment of the matches first.")
    ] = False,
    limit: Annotated[int | None, typer.Option(min=1, help="At most this many results.")] = None,
    spool: SpoolOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Find current asset versions by tags and enrichment; every hit's store file exists."""
    fast.search(terms or [], spool, as_json, all_versions, visibility, do_enrich, limit)


@app.command("get")
def get_cmd(
    ref: Annotated[
        str, typer.Argument(help="name@revision, an asset name (its current version), or a sha256.")
    ],
    to: Annotated[
        Path | None, typer.Option("--to", help="Copy (verified) into this folder and print the new path.")
    ] = None,
    link: Annotated[
        bool,
        typer.Option("--link", help="With --to: hard-link instead of copying (shares the store's file)."),
    ] = False,
    visibility: Annotated[
        list[str] | None,
        typer.Option("--visibility", help="Also find this visibility (repeatable); see [library] visible."),
    ] = None,
    spool: SpoolOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Print the path of a verified published file, or put a verified copy into --to;
    an asset [library] visible does not admit is not found (exit 4)."""
    fast.get(ref, spool, as_json, to, link, visibility)


@app.command("enrich")
def enrich_cmd(
    jobs: Annotated[
        list[str] | None, typer.Argument(help="Jobs or asset names (default: every current version).")
    ] = None,
    fields: Annotated[
        list[str] | None,
        typer.Option("--field", help="Only this enricher (repeatable): " + ", ".join(enrich.BUILTIN)),
    ] = None,
    force: Annotated[bool, typer.Option(help="Recompute what is already known.")] = False,
    spool: SpoolOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Compute enrichment (facts, scene cuts, loudness, black and silence, plug-ins) now."""
    tree, cfg = open_spool(spool, as_json)
    try:
        known = [*enrich.BUILTIN, *enrich.plugins()]
        for f in fields or []:
            if f not in known:
                raise InvalidInput("--field", f"unknown enricher {f!r} (known: {', '.join(known)})")
        targets = _targets(tree, cfg, jobs or [])
        out: list[dict[str, Any]] = []
        for jid, got in targets:
            rec = enrich.enrich_object(tree, cfg, got.sha256, got.path, fields or None, force=force)
            out.append({"job": jid, "sha256": got.sha256, "done": sorted(rec.done), "notes": rec.notes})
    except SpoolError as exc:
        raise fail(exc, as_json) from None
    if as_json:
        print_json({"enriched": out})
        return
    for row in out:
        notes = "; ".join(f"{k}: {v}" for k, v in sorted(row["notes"].items()))
        fields = [row["job"], row["sha256"][:12], ",".join(row["done"])] + ([f"({notes})"] if notes else [])
        typer.echo("\t".join(map(printable, fields)))


def _targets(tree: Tree, cfg: Any, refs: list[str]) -> list[tuple[str, catalog.Got]]:
    if refs:
        out = []
        for ref in refs:
            if not (JOB_ID_RE.match(ref) or NAME_RE.match(ref)):
                raise InvalidInput(ref, "is not a job ID (name@revision) or an asset name")
            got = catalog.resolve(tree, ref)
            out.append((got.job or ref, got))
        return out
    res = catalog.search(tree, cfg, catalog.Query(), visibility=_every_visibility(tree))
    return [(h.job, catalog.Got(h.job, h.sha256, tree.root / h.path, h.file)) for h in res.results]


def _every_visibility(tree: Tree) -> list[str]:
    """Enrichment is not discovery: it covers every visibility there is."""
    merged = {
        v
        for v in (indexpaths.decode_value(n) for n in _listdir(indexpaths.index_root(tree) / "visibility"))
        if v
    }
    recent = {x.tags["visibility"] for x in index.Snapshot(tree).view.lines() if "visibility" in x.tags}
    return sorted(merged | recent)


def _listdir(p: Path) -> list[str]:
    try:
        return [e.name for e in p.iterdir()]
    except OSError:
        return []


@app.command("index")
def index_cmd(
    rebuild: Annotated[
        bool, typer.Option("--rebuild", help="Recreate the index from the manifests alone.")
    ] = False,
    merge: Annotated[
        bool,
        typer.Option("--merge", help="Merge every index segment into the shared entries first (format 2)."),
    ] = False,
    spool: SpoolOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Check the library index against the manifests (--rebuild repairs it)."""
    tree, cfg = open_spool(spool, as_json)
    merged = segments.merge(tree) if merge else (0, 0)
    findings = index.check(tree, cfg.acceptance.required_tags, repair=rebuild)
    tags, versions = index.size(tree)
    delays = sorted(index.delays(tree))
    delay = {"median": delays[len(delays) // 2], "max": delays[-1]} if delays else None
    if as_json:
        print_json(
            {
                "findings": [f.__dict__ for f in findings],
                "tag_entries": tags,
                "versions": versions,
                "index_delay_seconds": delay,
                "rebuilt": rebuild,
                "merged": {"segments": merged[0], "jobs": merged[1]},
                "segments": len(segments.listed(tree)),
            }
        )
    else:
        if merge:
            typer.echo(f"merged {merged[0]} segment(s), {merged[1]} job(s)")
        for f in findings:
            verb = "repaired" if f.repaired else "found"
            typer.echo(f"{verb}\t{printable(f.path)}: {printable(f.problem)}")
        typer.echo(f"index: {tags} tag entries, {versions} versions, {len(segments.listed(tree))} segment(s)")
        if delay:
            typer.echo(f"stored -> indexed: median {delay['median']:.4f} s, max {delay['max']:.4f} s")
    if any(not f.repaired for f in findings):
        raise typer.Exit(1)


# -- spool library adopt ------------------------------------------------------------------

library_app = typer.Typer(
    help="The asset library as a whole: adopt an existing folder of media.", no_args_is_help=True
)
app.add_typer(library_app, name="library")


@library_app.command("adopt")
def adopt_cmd(
    folder: Annotated[Path, typer.Argument(help="The folder of existing media (inside [assets] roots).")],
    tags: Annotated[
        Path | None,
        typer.Option("--tags", help="CSV: path,name,<tag>,...; else each file's <file>.tags.json."),
    ] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the plan; change nothing.")] = False,
    shadow: Annotated[
        Path | None,
        typer.Option(
            "--shadow",
            help="Compare this catalogue export (path,id,<tag>... or tags=k=v;k=v) with what spool "
            "would index; print every difference; change nothing.",
        ),
    ] = None,
    jobs: Annotated[int, typer.Option("--jobs", "-j", min=1, max=64, help="Files in flight at once.")] = 4,
    all_lines: Annotated[
        bool, typer.Option("--all", help="Also print the files adopted before (outcome 'already').")
    ] = False,
    spool: SpoolOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Publish every media file of FOLDER as a version with its tags, without re-rendering.

    A file lacking a required tag is listed with what it lacks and not adopted; a second
    run adopts nothing twice; an interrupted run is finished by running it again. Exit 0
    when every file is adopted, 1 when some are not (untagged, invalid, failed)."""
    from spool.library import adopt  # here: the other typer commands stay off adoption (+~50 ms)

    tree, cfg = open_spool(spool, as_json)
    try:
        real = adopt.inside_roots(folder, cfg.asset_roots(tree.root))
        rows = adopt.read_tags_csv(tags, real) if tags is not None else {}
        if shadow is not None:
            diffs = adopt.shadow(tree, cfg, folder, adopt.read_catalogue(shadow, real), rows, jobs)
        else:
            show = None if as_json else _progress(sys.stderr)
            run = adopt.Adoption(tree, cfg, folder, rows, dry_run=dry_run, jobs=jobs, progress=show)
            rep = run.run()
    except SpoolError as exc:
        raise fail(exc, as_json) from None
    if shadow is not None:
        if as_json:
            print_json({"differences": [d.__dict__ for d in diffs]})
        else:
            for d in diffs:
                typer.echo("\t".join(map(printable, (d.kind, d.path, d.detail))))
            echo(f"shadow: {len(diffs)} difference(s); nothing was changed", err=True)
        raise typer.Exit(1 if diffs else 0)
    if as_json:
        print_json(
            {
                "dry_run": rep.dry_run,
                "counts": rep.counts(),
                "items": [it.__dict__ for it in rep.items],
                "unsupported": rep.unsupported,
                "seconds": round(rep.seconds, 3),
            }
        )
    else:
        for it in rep.items:
            if it.outcome != "already" or it.reason or all_lines:
                typer.echo("\t".join(map(printable, adopt.plain_line(it).split("\t"))))
        for rel in rep.unsupported:
            typer.echo(f"unsupported\t-\t{printable(rel)}\tnot a container spool publishes (mp4, mov, webm)")
        echo(adopt.summary(rep), err=True)
    if not rep.dry_run and not rep.complete:
        raise typer.Exit(1)


def _progress(stream: Any) -> Any:
    """Files, bytes and rate as adoption goes: a bar on a terminal, else a line every 5 s."""
    started = time.monotonic()
    last = [0.0]
    tty = stream.isatty()

    def show(files: int, total: int, done: int, size: int) -> None:
        now = time.monotonic()
        if files < total and now - last[0] < (0.2 if tty else 5.0):
            return
        last[0] = now
        secs = max(now - started, 1e-6)
        width = 30
        filled = int(width * files / total) if total else width
        line = (
            f"[{'#' * filled}{'-' * (width - filled)}] {files:,}/{total:,} files, "
            f"{human_bytes(done)} of {human_bytes(size)}, {human_bytes(int(done / secs))}/s, "
            f"{files / secs:.1f} files/s"
        )
        stream.write(("\r" + line + ("\n" if files >= total else "")) if tty else line + "\n")
        stream.flush()

    return show
