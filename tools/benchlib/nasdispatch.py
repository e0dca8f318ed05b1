"""Dispatch over network mounts (issue 25): tree format 2 beside format 1 on the same mount.

The dispatch measure's spool run (no-op jobs dropped into ``incoming/``, real
``spoold run --drain`` processes, jobs/s = N / (enqueue + work) by the journal),
with the spool on a mount where every fsync, rename and open is a round trip:
sshfs on loopback (tools/multimount, ``--cache low``) and JuiceFS (tools/juicefsmount:
metadata in a redis-server on loopback, ``--storage file``). Format 1 is the same
code on a spool without ``FORMAT`` (the layout before issue 25); runs interleaved,
order rotated each round; the ratio is the median of per-round ratios. Run only when
named (root and FUSE): ``tools/bench nasdispatch``.
"""

from __future__ import annotations

import contextlib
import itertools
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .common import Row, interleave, log, median, pair_ratios, scratch
from .dispatch import FORMAT1, Run, spool_at
from .nas import JUICEFSMOUNT, mounted

FILESYSTEMS = ("sshfs", "juicefs")


def keys(mode: str) -> list[str]:
    return [f"nasdispatch.{fs}.{shape}.format1" for fs in FILESYSTEMS for shape in SHAPES]


#: row name -> (workers, max_active): the dispatch measure's shapes.
SHAPES = {"w1": (1, 1), "w2": (2, 1), "w2x4": (2, 4)}


@contextlib.contextmanager
def _juicefs(base: Path) -> Iterator[Path]:
    up = subprocess.run(
        [str(JUICEFSMOUNT), "up", str(base), "--mounts", "1"], capture_output=True, text=True, timeout=600
    )
    if up.returncode != 0:
        raise RuntimeError(f"tools/juicefsmount up failed: {up.stderr.strip()[-300:]}")
    try:
        yield base / "a"
    finally:
        subprocess.run([str(JUICEFSMOUNT), "down", str(base)], capture_output=True, timeout=120)


def _rows(fs: str, mount: Path, n: int, rounds: int) -> list[Row]:
    rows = []
    serial = itertools.count()
    for shape, (workers, slots) in SHAPES.items():
        log(f"nasdispatch: {fs}, {workers} worker(s) x {slots}, {n} jobs x {rounds} rounds, format 2 and 1")

        def one(fmt: int, w: int = workers, m: int = slots) -> Run:
            d = mount / f"run{next(serial)}"
            d.mkdir()
            return spool_at(d, w, n, max_active=m, fmt=fmt)

        runners: dict[str, Any] = {"f2": lambda: one(2), "f1": lambda: one(1)}
        res = interleave(rounds, runners)
        rates = {k: [r.rate for r in v] for k, v in res.items()}
        log(f"  format 2 {median(rates['f2']):.1f} jobs/s, format 1 {median(rates['f1']):.1f} jobs/s")
        rows.append(
            Row(
                key=f"nasdispatch.{fs}.{shape}.format1",
                measure=f"dispatch {workers}w x max_active {slots} over {fs}",
                unit="jobs/s",
                spool=median(rates["f2"]),
                peer=FORMAT1,
                peer_value=median(rates["f1"]),
                ratio=median(pair_ratios(rates["f2"], rates["f1"])),
                target=">= 3x",
                met=median(pair_ratios(rates["f2"], rates["f1"])) >= 3.0,
                samples={k: [r.__dict__ for r in v] for k, v in res.items()},
            )
        )
    return rows


def run(mode: str) -> tuple[list[Row], list[str]]:
    n, rounds = {"full": (200, 3), "quick": (60, 2), "smoke": (8, 1)}[mode]
    rows: list[Row] = []
    with scratch("disk", "nasdispatch-sshfs") as base, mounted(base) as (_export, mount):
        rows += _rows("sshfs", mount, n, rounds)
    with scratch("disk", "nasdispatch-juicefs") as base, _juicefs(base) as mount:
        rows += _rows("juicefs", mount, n, rounds)
    notes = [
        f"nasdispatch: {n} no-op jobs per run, {rounds} rounds interleaved, spoold max_active as named; "
        "sshfs: tools/multimount (loopback sshd, --cache low); JuiceFS: tools/juicefsmount "
        "(redis-server on loopback, --storage file, default caches); spool's column is tree format 2, "
        "the peer the same code on a format 1 tree; the target is issue 25's (3x on the same mount).",
    ]
    return rows, notes
