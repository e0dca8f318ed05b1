"""How the queue looks in a terminal: the rich renderables of ``spool status``,
``spool watch``, ``spool show`` and ``spool events``. Formatting only; the facts
come from :mod:`spool.observe.overview` and :mod:`spool.observe.eventlog`."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from rich.console import Group, RenderableType
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from spool.cli.plain import human_seconds

if TYPE_CHECKING:  # records are laid out, never decoded here: `spool status` needs no msgspec
    from spool.core.model import Event, Failure, Manifest, Progress

STATE_STYLE = {
    "incoming": "cyan",
    "waiting": "magenta",
    "pending": "yellow",
    "running": "blue",
    "complete": "green",
    "failed": "red",
    "rejected": "magenta",
}
HEALTH_STYLE = {
    "alive": "green",
    "suspect": "yellow",
    "stalled": "bold yellow",
    "dead": "bold red",
    "stopped": "dim",
}
KIND_STYLE = {
    "worker": "bold red",
    "queue": "bold red",
    "failed": "red",
    "rejected": "magenta",
    "quarantine": "magenta",
}


def local(ts: datetime | float | None, fmt: str = "%Y-%m-%d %H:%M:%S") -> str:
    """A time in this machine's zone, as an operator reads a clock."""
    if ts is None:
        return "-"
    if isinstance(ts, int | float):
        ts = datetime.fromtimestamp(ts, UTC)
    return ts.astimezone().strftime(fmt)


def _pools(w: dict[str, Any]) -> str:
    """``2/4 slots`` for renders, then every other pool the worker draws from."""
    pools = w.get("pools") or {"render": {"active": w["active"], "capacity": w["max_active"]}}
    out = []
    for name, use in sorted(pools.items(), key=lambda kv: kv[0] != "render"):
        what = "slots" if name == "render" else name
        out.append(f"{use['active']}/{use['capacity']} {what}")
    return ", ".join(out)


def human_bytes(n: int | None) -> str:
    if n is None:
        return "-"
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"


def _age(seconds: float | None) -> str:
    return "-" if seconds is None else human_seconds(seconds)


def _progress_cells(p: Progress | None, step: str | None = None) -> list[RenderableType]:
    if p is None:
        return [Text(step or "starting", style="dim"), Text(""), Text(""), Text(""), Text("")]
    pct = p.percent
    return [
        ProgressBar(total=100.0, completed=pct or 0.0, width=24, pulse=pct is None),
        Text(f"{pct:5.1f}%" if pct is not None else "    ?"),
        Text(f"{p.fps:.0f} fps" if p.fps else "- fps"),
        Text(f"{p.speed:.2f}x" if p.speed else "-"),
        Text(f"ETA {human_seconds(p.eta_seconds)}" if p.eta_seconds is not None else "ETA ?"),
    ]


def status_view(ov: dict[str, Any]) -> Group:
    """The whole ``spool status`` screen."""
    parts: list[RenderableType] = []
    head = Text.assemble(
        ("spool ", "bold"), (ov["spool"], "bold"), ("   at ", "dim"), (local(ov["generated_at"]), "dim")
    )
    parts.append(head)
    counts = Text("  ")
    ages = ov["oldest_age"]
    for i, (state, n) in enumerate(ov["counts"].items()):
        if i:
            counts.append("  ")
        counts.append(f"{state} {n:,}", style=STATE_STYLE.get(state, "") if n else "dim")
        if n and ages.get(state) is not None:
            word = "oldest" if state != "running" else "longest"
            if state == "pending" and ov.get("oldest_pending_age_source") == "sample":
                word = (
                    f"oldest >= {human_seconds(ages[state])} by a sample of {ov['oldest_pending_stated']}; "
                )
                counts.append(f" ({word}--exact for all)", style="dim")
                continue
            counts.append(f" ({word} {human_seconds(ages[state])})", style="dim")
        elif n and state == "pending" and ov.get("oldest_pending_age_source") == "unknown":
            counts.append(" (age unknown: no live worker; --exact to stat all)", style="dim")
    parts.append(counts)
    if lib := ov.get("library"):  # the asset library (SPEC 9)
        parts.append(
            Text(
                f"  library: {lib['assets']:,} assets, {lib['enriched_objects']:,} enriched, "
                f"~{lib['enrichment_backlog']:,} awaiting enrichment",
                style="dim",
            )
        )

    if gens := ov.get("generations"):  # attempts per state of the running generation jobs
        parts.append(Text("  generations: " + ", ".join(f"{s} {n:,}" for s, n in gens.items()), style="dim"))

    if ov["running"]:
        parts.append(Text("\nRunning", style="bold"))
        table = Table.grid(padding=(0, 1))
        for _ in range(8):
            table.add_column(no_wrap=True)
        for r in ov["running"]:
            table.add_row(
                Text("  " + r["job_id"]),
                Text(r["worker"], style="dim"),
                *_progress_cells(r["progress"], r.get("step")),
                Text(f"for {human_seconds(r['seconds'])}", style="dim"),
            )
        parts.append(table)

    parts.append(Text("\nNeeds attention", style="bold"))
    items = ov["attention"]
    if not items:
        parts.append(Text("  nothing: no failed jobs, rejections or unhealthy workers", style="green"))
    for item in items:
        line = Text("  ")
        line.append(f"{item['kind']:<9}", style=KIND_STYLE.get(item["kind"], ""))
        line.append(f" {item['subject']}: ", style="bold")
        line.append(item["problem"])
        parts.append(line)
        parts.append(Text(f"            next: {item['next_action']}", style="dim"))
    more = []
    for state, key in (("failed", "failed"), ("rejected", "rejected")):
        hidden = ov["counts"][state] - len(ov[key])
        if hidden > 0:
            more.append(f"{hidden:,} more {state} (spool ls {state})")
    if more:
        parts.append(Text("  and " + ", ".join(more), style="dim"))

    if ov["workers"]:
        parts.append(Text("\nWorkers", style="bold"))
        table = Table.grid(padding=(0, 2))
        for _ in range(5):
            table.add_column(no_wrap=True)
        for w in ov["workers"]:
            disk = human_bytes(w["disk_used"])
            if w["disk_limit"]:
                disk += f" of {human_bytes(w['disk_limit'])}"
            table.add_row(
                Text("  " + w["worker"]),
                Text(w["health"], style=HEALTH_STYLE.get(w["health"], "")),
                Text(_pools(w)),
                Text(f"disk {disk}"),
                Text(f"heartbeat {_age(w['heartbeat_age'])} ago", style="dim"),
            )
        parts.append(table)
    return Group(*parts)


def event_line(ev: Event) -> Text:
    """One journal event for humans: when, which job, from -> to, attempt, who, why."""
    t = Text(local(ev.ts, "%Y-%m-%d %H:%M:%S.%f")[:-3] + "  ", style="dim")
    t.append(ev.job, style="bold")
    t.append("  ")
    t.append(ev.from_ or "-", style=STATE_STYLE.get(ev.from_ or "", ""))
    t.append(" -> ")
    t.append(ev.to, style=STATE_STYLE.get(ev.to, ""))
    if ev.attempt is not None:
        t.append(f"  #{ev.attempt}")
    if ev.worker:
        t.append(f"  {ev.worker}", style="dim")
    if ev.reason:
        t.append(f"  {ev.reason}")
    return t


def _failure(f: Failure) -> list[RenderableType]:
    out: list[RenderableType] = [
        Text.assemble(("  ", ""), (f"{f.stage}: {f.property}", "bold red"), (f": {f.message}", "")),
    ]
    if f.expected is not None or f.actual is not None:
        out.append(Text(f"    expected {f.expected}, got {f.actual}"))
    for line in f.log_excerpt[-8:]:
        out.append(Text(f"    | {line}", style="dim"))
    out.append(Text(f"  next: {f.next_action}", style="bold"))
    return out


def _manifest(m: Manifest, thumbnail: str | None) -> list[RenderableType]:
    v = m.validation
    failed = [c.name for c in v.checks if not c.ok]
    checks = f"{len(v.checks)} checks passed" if not failed else f"failed: {', '.join(failed)}"
    out: list[RenderableType] = [
        Text(f"  {m.output.store_path}"),
        Text(f"  sha256 {m.output.sha256}  {human_bytes(m.output.size)}  ({m.output.size} bytes)"),
        Text(
            f"  attempt {m.attempt} on {m.worker}, published {local(m.published_at)}; "
            f"render {m.render_seconds:.1f} s, validation {m.validate_seconds:.1f} s "
            f"({v.decode_check} decode, {checks})"
        ),
    ]
    for layer in v.layers or []:  # required layers (spool.kinds.render.layers): box, safe area, verdict
        x, y, w, h = layer.box
        sx, sy, sw, sh = layer.safe
        size = f" size {layer.size}" if layer.size is not None else ""
        out.append(
            Text(
                f"  layer steps[{layer.step}] {layer.op}{size}: {w}x{h} at {x},{y}; "
                f"safe area {layer.safe_area} {sw}x{sh} at {sx},{sy}: {layer.verdict}",
                style="" if layer.verdict == "inside" else "red",
            )
        )
    if thumbnail:
        out.append(Text(f"  poster frame {thumbnail}", style="dim"))
    return out


def fanout_view(info: dict[str, Any]) -> Group:
    """``spool show PARENT`` of a fan-out: its variants with their states."""
    parts: list[RenderableType] = [
        Text.assemble(
            (info["parent"], "bold"),
            ("  fan-out of ", ""),
            (str(len(info["variants"])), "bold"),
            (" variants", ""),
        )
    ]
    parts.append(
        Text("  axes: " + "; ".join(f"{a['axis']} = {', '.join(a['values'])}" for a in info["axes"]))
    )
    parts.append(Text("  " + ", ".join(f"{n} {s}" for s, n in sorted(info["counts"].items()))))
    parts.append(Text("\nVariants", style="bold"))
    for r in info["variants"]:
        line = Text(f"  {r['job']}  ")
        line.append(r["state"], style=STATE_STYLE.get(r["state"], ""))
        line.append("  " + " ".join(f"{a['axis']}={r['values'].get(a['axis'])}" for a in info["axes"]))
        if r["sha256"]:
            line.append(f"  sha256 {r['sha256'][:12]}", style="dim")
        if r["approvals"]:
            line.append(f"  approved x{r['approvals']}", style="green")
        parts.append(line)
    return Group(*parts)


def _dependencies(info: dict[str, Any]) -> list[RenderableType]:
    """Upstream and downstream of a job (SPEC 11.12), and why it waits or is held."""
    parts: list[RenderableType] = []
    if info.get("parent"):
        values = " ".join(f"{k}={v}" for k, v in (info.get("variant") or {}).items())
        parts.append(Text(f"  variant of {info['parent']}: {values}"))
    if "upstream" not in info:
        return parts
    parts.append(Text("\nUpstream", style="bold"))
    if not info["upstream"]:
        parts.append(Text("  none", style="dim"))
    for u in info["upstream"]:
        line = Text(f"  {u['role']} <- {u['job'] or u['ref']}  ")
        line.append(u["state"] or "unknown", style=STATE_STYLE.get(u["state"] or "", ""))
        line.append(f"  (asked: {u['ref']})" if u["ref"] != u["job"] else "")
        if u["sha256"]:
            line.append(f"  frozen to sha256 {u['sha256'][:16]}", style="green")
        parts.append(line)
    if info.get("waiting_reason"):
        parts.append(Text(f"  {info['waiting_reason']}", style="magenta"))
    held = info.get("held_because")
    if held is not None:
        parts.append(Text(f"  held: {held.reason}", style="red"))
        parts.append(Text(f"  next: {held.next_action}"))
    parts.append(Text("\nDownstream", style="bold"))
    if not info["downstream"]:
        parts.append(Text("  none", style="dim"))
    for d in info["downstream"]:
        line = Text(f"  {d['job']} ({d['role']})  ")
        line.append(d["state"] or "unknown", style=STATE_STYLE.get(d["state"] or "", ""))
        line.append("  frozen to it" if d["frozen"] else "  waits for it")
        parts.append(line)
    return parts


def show_view(info: dict[str, Any]) -> Group:
    """The whole ``spool show JOB`` page."""
    if "job" not in info:
        return fanout_view(info)
    j = info["job"]
    parts: list[RenderableType] = []
    head = Text.assemble((j.job_id, "bold"), ("  ", ""), (info["state"], STATE_STYLE.get(info["state"], "")))
    if info["worker"]:
        head.append(f" on {info['worker']}")
    parts.append(head)
    parts.append(Text(f"  submitted {local(j.submitted_at)} by {j.submitted_by}, priority {j.priority}"))
    if j.supersedes:
        parts.append(Text(f"  supersedes {j.supersedes}"))
    parts.append(Text(f"  {j.operation}, recipe {j.recipe_hash[:16]}, output {j.output.file}"))
    if j.sources:
        parts.append(Text("  sources: " + ", ".join(f"{s.role}={s.path}" for s in j.sources)))
    parts.append(Text("  tags: " + ", ".join(f"{k}={v}" for k, v in sorted(j.tags.items()))))
    parts.extend(_dependencies(info))

    parts.append(Text("\nTimeline", style="bold"))
    if not info["timeline"]:
        parts.append(Text("  no journal lines for this job", style="dim"))
    for ev in info["timeline"]:
        parts.append(Text("  ") + event_line(ev))

    parts.append(Text("\nAttempts", style="bold"))
    if not info["attempts"]:
        parts.append(Text("  none yet", style="dim"))
    for a in info["attempts"]:
        line = Text(f"  {a['n']}  {a['worker'] or '?'}  claimed {local(a['claimed_at'])}  ")
        style = "green" if a["outcome"] == "published" else "red" if a["outcome"].startswith("failed") else ""
        line.append(a["outcome"], style=style)
        p = a["progress"]
        if p is not None and a["outcome"] == "running or abandoned" and p.percent is not None:
            line.append(f"  {p.percent:.1f}%")
        damaged = a.get("damaged") or {}
        if damaged:
            said = ", ".join(f"{name} {why}" for name, why in sorted(damaged.items()))
            line.append(f"  ({said}: lost in a crash; spool fsck repairs what the tree proves)", style="dim")
        parts.append(line)

    if info["failure"] is not None:
        parts.append(Text("\nFailure", style="bold"))
        parts.extend(_failure(info["failure"]))
    if info["manifest"] is not None:
        parts.append(Text("\nOutput", style="bold"))
        parts.extend(_manifest(info["manifest"], info.get("thumbnail")))
    parts.append(Text("\nApprovals", style="bold"))
    if not info["approvals"]:
        parts.append(Text("  none", style="dim"))
    for a in info["approvals"]:
        said = f"  {a['by']} at {a['at']}: sha256 {a['sha256'][:16]}"
        said += "" if a["current"] else " (an earlier output, not the current one)"
        parts.append(Text(said + (f": {a['note']}" if a["note"] else "")))
    return Group(*parts)
