"""The asset library's commands: search, get, enrich, index (SPEC section 9)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from .. import enrich, index, library
from ..errors import InvalidInput, SpoolError
from ..index import NAME_RE
from ..model import JOB_ID_RE
from ..tree import Tree
from . import fast
from .common import JsonOpt, SpoolOpt, app, fail, open_spool, print_json, printable


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


def _targets(tree: Tree, cfg: Any, refs: list[str]) -> list[tuple[str, library.Got]]:
    if refs:
        out = []
        for ref in refs:
            if not (JOB_ID_RE.match(ref) or NAME_RE.match(ref)):
                raise InvalidInput(ref, "is not a job ID (name@revision) or an asset name")
            got = library.resolve(tree, ref)
            out.append((got.job or ref, got))
        return out
    res = library.search(tree, cfg, library.Query(), visibility=_every_visibility(tree))
    return [(h.job, library.Got(h.job, h.sha256, tree.root / h.path, h.file)) for h in res.results]


def _every_visibility(tree: Tree) -> list[str]:
    """Enrichment is not discovery: it covers every visibility there is."""
    return [v for v in (index.decode_value(n) for n in _listdir(index.index_root(tree) / "visibility")) if v]


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
    spool: SpoolOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Check the library index against the manifests (--rebuild repairs it)."""
    tree, cfg = open_spool(spool, as_json)
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
            }
        )
    else:
        for f in findings:
            verb = "repaired" if f.repaired else "found"
            typer.echo(f"{verb}\t{printable(f.path)}: {printable(f.problem)}")
        typer.echo(f"index: {tags} tag entries, {versions} versions")
        if delay:
            typer.echo(f"stored -> indexed: median {delay['median']:.4f} s, max {delay['max']:.4f} s")
    if any(not f.repaired for f in findings):
        raise typer.Exit(1)
