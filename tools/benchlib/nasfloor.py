"""The ceiling over a NAS: how fast any layout keeping SPEC's tree could go (issue 25).

Issue 25 asks dispatch over a network mount for 3x format 1's rate on the same mount.
This measure asks whether that is reachable at all: it replays the least set of file
operations SPEC's tree requires of a job (:func:`benchlib.layoutcost.floor`: each
required name made once, under its final name; nothing a batch can share), alone, with
no daemon around it, in one process of T threads (T = 1, 2, 4, 8, the best taken), on
the same mount and in the same rounds as real ``spoold run --drain`` daemons on format
1 and format 2 trees. No daemon writing that tree can beat the replay of its own
operations on the same transport, so the best replay over format 1's rate bounds the
ratio any format could reach there (a ceiling: necessary, not enough; a daemon's own
requests and CPU come out of the same transport, docs/benchmarks.md). Format 2's file
operations and the leaner layout of docs/format3.md are replayed beside it.

The daemons' rates here are their work alone, N / (first journal line -> last job
complete), without the submitter's enqueue that ``nasdispatch`` counts in (the same
for both formats there, so it pulls every ratio toward 1): the generous reading of
the target. Run only when named (root and FUSE): ``tools/bench nasfloor``.
"""

from __future__ import annotations

import itertools
from pathlib import Path

from .common import Row, interleave, log, median, pair_ratios, scratch
from .dispatch import FORMAT1, spool_at
from .layoutcost import rate
from .nas import mounted
from .nasdispatch import FILESYSTEMS, SHAPES, juicefs_mount

#: Threads replaying the layouts; the best of them is the ceiling.
THREADS = (1, 2, 4, 8)
#: Layouts replayed (benchlib.layoutcost.LAYOUTS).
REPLAYED = ("floor", "leaner", "format 2")


def keys(mode: str) -> list[str]:
    out = []
    for fs in FILESYSTEMS:
        out += [f"nasfloor.{fs}.{shape}.{what}" for shape in SHAPES for what in ("ceiling", "format2")]
        out += [f"nasfloor.{fs}.replay.{name.replace(' ', '')}" for name in REPLAYED]
    return out


def _rows(fs: str, mount: Path, n: int, rounds: int) -> list[Row]:
    serial = itertools.count()

    def daemons(fmt: int, workers: int, slots: int) -> float:
        d = mount / f"run{next(serial)}"
        d.mkdir()
        r = spool_at(d, workers, n, max_active=slots, fmt=fmt)
        return r.n / r.work

    def replay(layout: str) -> float:
        return max(rate(mount, layout, n, t) for t in THREADS)

    runners = {
        f"f{fmt}.{shape}": (lambda f=fmt, s=shape: daemons(f, *SHAPES[s]))
        for fmt in (1, 2)
        for shape in SHAPES
    }
    runners |= {f"replay.{name}": (lambda x=name: replay(x)) for name in REPLAYED}
    log(f"nasfloor: {fs}, {n} jobs x {rounds} rounds: daemons (formats 1 and 2, each shape), replays")
    got = interleave(rounds, runners)
    ceiling = got["replay.floor"]
    rows = []
    for shape, (workers, slots) in SHAPES.items():
        f1, f2 = got[f"f1.{shape}"], got[f"f2.{shape}"]
        reach = median(pair_ratios(ceiling, f1))
        log(f"  {shape}: format 1 {median(f1):.1f}, format 2 {median(f2):.1f}, ceiling {median(ceiling):.1f}")
        rows.append(
            Row(
                key=f"nasfloor.{fs}.{shape}.ceiling",
                measure=f"ceiling (floor layout replayed, best of {len(THREADS)} thread counts) over {fs}, "
                f"against {workers}w x {slots} daemons",
                unit="jobs/s",
                spool=median(ceiling),
                peer=f"{FORMAT1}, work only",
                peer_value=median(f1),
                ratio=reach,
                target=">= 3x: needed for 3x",
                met=reach >= 3.0,
                samples={"ceiling": ceiling, "format1": f1},
            )
        )
        rows.append(
            Row(
                key=f"nasfloor.{fs}.{shape}.format2",
                measure=f"format 2 daemons {workers}w x {slots} over {fs}, work only, against the ceiling",
                unit="jobs/s",
                spool=median(f2),
                peer="the ceiling",
                peer_value=median(ceiling),
                ratio=median(pair_ratios(f2, ceiling)),
                note=f"format 2 against format 1, work only: {median(pair_ratios(f2, f1)):.2f}x",
                samples={"format2": f2, "ceiling": ceiling},
            )
        )
    for name in REPLAYED:
        rows.append(
            Row(
                key=f"nasfloor.{fs}.replay.{name.replace(' ', '')}",
                measure=f"{name}'s file operations replayed alone over {fs}, best of {THREADS} threads",
                unit="jobs/s",
                spool=median(got[f"replay.{name}"]),
                samples={"rates": got[f"replay.{name}"]},
            )
        )
    return rows


def run(mode: str) -> tuple[list[Row], list[str]]:
    n, rounds = {"full": (200, 3), "quick": (100, 2), "smoke": (8, 1)}[mode]
    rows: list[Row] = []
    with scratch("disk", "nasfloor-sshfs") as base, mounted(base) as (_export, mount):
        rows += _rows("sshfs", mount, n, rounds)
    with scratch("disk", "nasfloor-juicefs") as base, juicefs_mount(base) as mount:
        rows += _rows("juicefs", mount, n, rounds)
    notes = [
        f"nasfloor: {n} no-op jobs a run, {rounds} rounds interleaved; the ceiling is the floor layout "
        f"(tools/benchlib/layoutcost.py: each name SPEC's tree requires, made once) replayed alone with "
        f"{THREADS} threads, the best taken; daemons' rates are work only (no enqueue). A ceiling under 3x "
        "format 1 means no layout keeping SPEC's tree reaches issue 25's 3x on that mount and shape; "
        "one over 3x is necessary, not enough (a daemon's own requests and CPU share the transport).",
    ]
    return rows, notes
