"""What ``spool doctor`` reports: each probe's finding, the chosen strategies, and the
terminal rendering of it all."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from spool.disk.mount import Mount
from spool.disk.tree import HOST


@dataclass
class Finding:
    """One probe's result: ``ok`` is ``None`` when it could not tell."""

    ok: bool | None
    summary: str
    facts: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Choice:
    value: str
    why: str
    pinned: bool


@dataclass
class Report:
    spool: str
    host: str
    mount: Mount
    peer: str | None
    findings: dict[str, Finding]
    publish: Choice
    watch: Choice
    poll_interval: float
    warnings: list[str]
    safe: bool
    seconds: float
    verdict: Any = None  # strategy.Verdict: safe, and on what ground (measured, name, local)

    def to_json(self) -> dict[str, Any]:
        return {
            "spool": self.spool,
            "host": self.host,
            "peer": self.peer,
            "mount": {
                "fstype": self.mount.fstype,
                "kind": self.mount.kind,
                "source": self.mount.source,
                "mountpoint": self.mount.mountpoint,
            },
            "probes": {k: {"ok": f.ok, "summary": f.summary, **f.facts} for k, f in self.findings.items()},
            "choices": {
                "publish": {
                    "value": self.publish.value,
                    "why": self.publish.why,
                    "pinned": self.publish.pinned,
                },
                "watch": {
                    "value": self.watch.value,
                    "why": self.watch.why,
                    "pinned": self.watch.pinned,
                    "poll_interval": self.poll_interval,
                },
            },
            "warnings": self.warnings,
            "safe": self.safe,
            "verdict": (
                {"safe": self.verdict.safe, "basis": self.verdict.basis, "why": self.verdict.why}
                if self.verdict is not None
                else None
            ),
            "seconds": round(self.seconds, 3),
        }


#: Probe names as people read them, in report order.
LABELS = {
    "rename": "rename",
    "rename_race": "rename race",
    "links": "hard links",
    "o_excl": "O_EXCL",
    "locks": "locks",
    "inotify": "inotify",
    "lag": "listing lag",
    "mtime": "mtime",
    "space": "free space",
    "fsync": "fsync",
}


def render(report: Report) -> str:
    """The report for a terminal: one line per probe, then the choices and warnings."""
    m = report.mount
    lines = [
        f"spool doctor: {report.spool} on {HOST}" + (f" (peer: {report.peer})" if report.peer else ""),
        f"  {'filesystem':<12} {m.fstype} ({m.kind}) {m.source} on {m.mountpoint}",
    ]
    for key, f in report.findings.items():
        mark = {True: " ", False: "!", None: "?"}[f.ok]
        lines.append(f"{mark} {LABELS.get(key, key):<12} {f.summary}")
    for name, c in (("publish", report.publish), ("watch", report.watch)):
        value = c.value + (f" (every {report.poll_interval:g} s)" if c.value == "poll" else "")
        lines.append(f"=> {name:<10} {value}: {c.why}")
    if report.verdict is not None:
        v = report.verdict
        lines.append(f"=> {'verdict':<10} {'safe' if v.safe else 'UNSAFE'} (by {v.basis}): {v.why}")
    lines += [f"WARNING: {w}" for w in report.warnings]
    lines.append(f"({report.seconds:.2f} s)")
    return "\n".join(lines)
