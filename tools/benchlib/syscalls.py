"""Syscalls per job: what one job's whole life costs the kernel, counted with strace.

Count before cutting (issue 14): every change to how spool makes a job durable
shows here first. For no-op jobs (2 workers x 4 slots, the dispatch row's
loaded case) and for render jobs (1 worker), N submissions are dropped into
``incoming/`` Maildir-style and real ``spoold run --drain`` daemons, each
under ``strace -f``, accept, claim, run, validate, publish and complete them.
The same daemons are also run on an empty queue; what the loaded run adds,
divided by N, is the per-job figure, so start-up, the self-check and shutdown
drop out (heartbeats while jobs run stay in: they are part of running them).
The daemon's start self-check is cached per host after its first run, so one
empty-queue run per kind goes first and is not counted: both counted runs
then find it cached. The filesystem probe at start (``spool/.doctor/``) runs
for a set time, so how many calls it makes varies from run to run: calls on
its files are left out (``strace -y`` names each descriptor's file).

Counted (every call, failed ones too): ``fsync``, ``fdatasync``, ``rename``
(rename/renameat/renameat2), ``open`` (open/openat/openat2), ``stat``
(stat/lstat/newfstatat/statx: recent glibc makes ``fstat`` a
``newfstatat(fd, "")``, so opens bring one each) and ``write``
(write/pwrite64/writev), ``mkdir`` (mkdir/mkdirat) and, derived from those, ``creates``:
the mkdirs and the opens with ``O_CREAT`` or ``O_TMPFILE``, that is, the new inodes a job
costs (on this VM one costs from 13 us to 450 us, up to three fsyncs: see
docs/benchmarks.md). Calls of child processes (FFmpeg, ffprobe: any
traced process that ``execve``s) are counted apart, as the peer column: they
are the render's own work, not spool's.
"""

from __future__ import annotations

import re
import subprocess
from collections import Counter
from pathlib import Path

from .common import (
    SPOOLD,
    Row,
    count_json,
    drop,
    log,
    make_spool,
    median,
    noop_settings,
    noop_submission,
    scratch,
    start,
    wait_all,
)

#: The families counted, each as the syscalls that make it up.
FAMILIES: dict[str, tuple[str, ...]] = {
    "fsync": ("fsync",),
    "fdatasync": ("fdatasync",),
    "rename": ("rename", "renameat", "renameat2"),
    "open": ("open", "openat", "openat2"),
    "stat": ("stat", "lstat", "newfstatat", "statx"),
    "write": ("write", "pwrite64", "writev"),
    "mkdir": ("mkdir", "mkdirat"),
}
_FAMILY_OF = {call: fam for fam, calls in FAMILIES.items() for call in calls}
TRACE = ",".join(sorted({*_FAMILY_OF, "execve"}))
#: Counted as well: new names that are new inodes (a folder, a file created or unnamed).
CREATES = "creates"
COUNTED = (*FAMILIES, CREATES)

#: The start-up filesystem probe's folder (its calls are left out: they vary with time).
PROBE = "/.doctor/"

#: ``PID name(`` at the start of a line of ``strace -f`` (resumed halves do not match).
_CALL = re.compile(r"^(\d+)\s+([a-z0-9_]+)\(")

#: mode -> (no-op jobs, render jobs, rounds)
PLAN: dict[str, tuple[int, int, int]] = {
    "full": (200, 3, 3),
    "quick": (60, 1, 1),
    "smoke": (8, 1, 1),
}

#: Kinds whose daemons have run once here (the self-check's host cache is warm).
_WARMED: set[str] = set()

#: Issue 25's target: fsyncs (fsync + fdatasync) per no-op job under load (issue 14 asked 6).
FSYNC_TARGET = 8


def have_strace() -> None:
    try:
        subprocess.run(["strace", "-V"], capture_output=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        raise RuntimeError("strace is not installed (tools/setup --test installs it)") from None


def count_trace(path: Path) -> tuple[Counter[str], Counter[str]]:
    """(spool's calls, child processes' calls) per family, from one ``strace -f -o`` file."""
    lines = path.read_text(errors="replace").splitlines()
    calls = [(m.group(1), m.group(2), ln) for ln in lines if (m := _CALL.match(ln))]
    root = calls[0][0] if calls else ""
    children = {pid for pid, name, _ in calls if name == "execve" and pid != root}
    calls = [c for c in calls if PROBE not in c[2]]
    own: Counter[str] = Counter()
    kids: Counter[str] = Counter()
    for pid, name, line in calls:
        fam = _FAMILY_OF.get(name)
        if fam is not None:
            tally = kids if pid in children else own
            tally[fam] += 1
            if fam == "mkdir" or (fam == "open" and ("O_CREAT" in line or "O_TMPFILE" in line)):
                tally[CREATES] += 1
    return own, kids


def traced_daemons(root: Path, workers: int, out: Path) -> tuple[Counter[str], Counter[str]]:
    """Run ``workers`` draining daemons on ``root`` under strace; their summed counts."""
    procs = []
    for k in range(workers):
        argv = ["strace", "-f", "-qq", "-y", "-e", f"trace={TRACE}", "-o", str(out / f"trace-{k}")]
        argv += [SPOOLD, "run", "--spool", str(root), "--worker", f"sys{k}", "--drain"]
        procs.append(start(argv, log_path=out / f"spoold-{k}.log"))
    wait_all(procs, timeout=1200, what="spoold --drain under strace")
    own: Counter[str] = Counter()
    kids: Counter[str] = Counter()
    for k in range(workers):
        o, c = count_trace(out / f"trace-{k}")
        own += o
        kids += c
    return own, kids


def _render_submission(name: str, mode: str) -> tuple[bytes, list[str]]:
    """A small ad (the render measure's recipe at its smoke or quick size) and its asset root."""
    import json

    from . import render

    spec = render.SPECS["quick" if mode == "full" else "smoke"]
    src = render.media(spec)
    return json.dumps(render.submission(name, spec, src)).encode(), [str(src["clip"].parent)]


def per_job(kind: str, n: int, mode: str, fmt: int = 2) -> dict[str, dict[str, float]]:
    """Per-job counts (spool's and children's) for ``n`` jobs of ``kind``, on a tree of
    format ``fmt`` (1: the layout before issue 25, for the before/after rows)."""
    workers, slots = (2, 4) if kind == "noop" else (1, 1)
    loaded: dict[str, tuple[Counter[str], Counter[str]]] = {}
    phases = [("empty", 0), ("loaded", n)]
    if kind not in _WARMED:
        phases.insert(0, ("warm-up", 0))
        _WARMED.add(kind)
    for phase, jobs in phases:
        with scratch("disk", f"syscalls-{kind}") as d:
            if kind == "noop":
                settings = noop_settings(limits={"max_active": slots})
                subs = [(f"noop-{i:05d}", noop_submission(f"noop-{i:05d}")) for i in range(jobs)]
                roots: list[str] = []
            else:
                subs = []
                roots = []
                for i in range(jobs):
                    data, roots = _render_submission(f"ad-{i:03d}", mode)
                    subs.append((f"ad-{i:03d}", data))
                if not roots:
                    _, roots = _render_submission("ad-probe", mode)
                settings = {"limits": {"max_active": slots}}  # poster frames on, as deployed
            root = make_spool(d / "spool", settings, asset_roots=roots, fmt=fmt)
            for name, data in subs:
                drop(root, name, data)
            loaded[phase] = traced_daemons(root, workers, d)
            done = count_json(root / "complete")
            if done != jobs:
                raise RuntimeError(f"syscalls: {done} of {jobs} {kind} jobs completed; see {d}")
    (own1, kid1), (own0, kid0) = loaded["loaded"], loaded["empty"]
    return {
        "own": {f: (own1[f] - own0[f]) / n for f in COUNTED},
        "children": {f: (kid1[f] - kid0[f]) / n for f in COUNTED},
    }


def keys(mode: str) -> list[str]:
    """The rows this measure promises (the smoke test checks every one is printed)."""
    return [
        *(f"syscalls.{kind}.{f}" for kind in ("noop", "render") for f in ("fsyncs", *COUNTED)),
        *(f"syscalls.noop_format1.{f}" for f in ("fsyncs", *COUNTED)),
    ]


def run(mode: str) -> tuple[list[Row], list[str]]:
    have_strace()
    n_noop, n_render, rounds = PLAN[mode]
    rows: list[Row] = []
    for kind, n in (("noop", n_noop), ("render", n_render), ("noop_format1", n_noop)):
        fmt = 1 if kind.endswith("_format1") else 2
        kind_run = kind.removesuffix("_format1")
        samples = []
        for r in range(rounds):
            got = per_job(kind_run, n, mode, fmt)
            samples.append(got)
            log(
                f"syscalls: {kind} round {r + 1}/{rounds}, {n} jobs: "
                + ", ".join(f"{f} {got['own'][f]:.1f}" for f in COUNTED)
                + " per job"
            )
        own = {f: median([s["own"][f] for s in samples]) for f in COUNTED}
        kids = {f: median([s["children"][f] for s in samples]) for f in COUNTED}
        where = "2 workers x 4 slots" if kind_run == "noop" else "1 worker"
        what = {"noop": "no-op", "render": "render", "noop_format1": "no-op (tree format 1: before)"}[kind]
        total = own["fsync"] + own["fdatasync"]
        target = kind == "noop"
        rows.append(
            Row(
                key=f"syscalls.{kind}.fsyncs",
                measure=f"fsync + fdatasync per {what} job ({where})",
                unit="calls",
                spool=total,
                target=f"<= {FSYNC_TARGET}" if target else "",
                met=total <= FSYNC_TARGET if target else None,
                samples={"per_round": samples},
                note="strace -f of the draining daemons, minus the same daemons on an empty queue, / N; "
                "FFmpeg/ffprobe children apart (peer column)",
            )
        )
        for f in COUNTED:
            name = "new inodes (mkdir, O_CREAT, O_TMPFILE)" if f == CREATES else f
            rows.append(
                Row(
                    key=f"syscalls.{kind}.{f}",
                    measure=f"  {name} per {what} job",
                    unit="calls",
                    spool=own[f],
                    peer="FFmpeg/ffprobe children" if kind == "render" else "",
                    peer_value=kids[f] if kind == "render" else None,
                )
            )
    notes = [
        "syscalls: spool's rows are on a tree of format 2; the noop_format1 rows run the same code "
        "on a tree of format 1 (no FORMAT file), the layout before issue 25.",
        f"syscalls: {n_noop} no-op jobs (2 spoold x max_active 4) and {n_render} render job(s) "
        f"(1 spoold; the {'quick' if mode == 'full' else 'smoke'}-size ad of the render measure), "
        f"dropped into incoming/ and drained under strace -f; median of {rounds} round(s); "
        "counts are per job, after subtracting a run on an empty queue (the first job of a run "
        "also pays the modules the daemon imports on first use, so few jobs read high).",
    ]
    return rows, notes
