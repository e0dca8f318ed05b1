"""Dispatch over network mounts (issue 25): tree format 2 beside format 1 on the same mount.

The dispatch measure's spool run (no-op jobs dropped into ``incoming/``, real
``spoold run --drain`` processes, jobs/s = N / (enqueue + work) by the journal),
with the spool on a mount where every fsync, rename and open is a round trip:
sshfs on loopback (tools/multimount, ``--cache low``) and JuiceFS (tools/juicefsmount:
metadata in a redis-server on loopback, ``--storage file``). Format 1 is the same
code on a spool without ``FORMAT`` (the layout before issue 25); runs interleaved,
order rotated each round; the ratio is the median of per-round ratios. Run only when
named (root and FUSE): ``tools/bench nasdispatch``.

Beside the rates, what a job costs the file server, which no noise moves: the SFTP
requests a no-op job costs the daemons (2 workers x 4 slots) over sshfs, counted from the
request log of a mount of its own (``tools/multimount --trace``), and the commands JuiceFS
sends its metadata engine (the redis-server's ``INFO commandstats``), format 2 beside
format 1; the daemons' run on an empty queue is subtracted, and the submitter's drops
are not counted.
"""

from __future__ import annotations

import contextlib
import itertools
import subprocess
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from .common import (
    SPOOLD,
    Row,
    count_json,
    drop,
    interleave,
    log,
    make_spool,
    median,
    noop_settings,
    noop_submission,
    pair_ratios,
    scratch,
    start,
    wait_all,
)
from .dispatch import FORMAT1, Run, spool_at
from .nas import JUICEFSMOUNT, mounted, redis_commands, sftp_log, sftp_requests

FILESYSTEMS = ("sshfs", "juicefs")


def keys(mode: str) -> list[str]:
    rows = [f"nasdispatch.{fs}.{shape}.format1" for fs in FILESYSTEMS for shape in SHAPES]
    return rows + [f"nasdispatch.{fs}.requests" for fs in FILESYSTEMS]


#: row name -> (workers, max_active): the dispatch measure's shapes.
SHAPES = {"w1": (1, 1), "w2": (2, 1), "w2x4": (2, 4)}


@contextlib.contextmanager
def juicefs_mount(base: Path) -> Iterator[Path]:
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


def _drained_requests(
    mount: Path, count: Callable[[], Counter[str]], name: str, jobs: int, fmt: int
) -> Counter[str]:
    """What ``count`` counts while 2 daemons (x 4 slots) drain a fresh spool with ``jobs``
    no-op drops made first (the drops' own requests not counted)."""
    root = make_spool(mount / name / "spool", noop_settings(limits={"max_active": 4}), fmt=fmt)
    for i in range(jobs):
        drop(root, f"noop-{i:06d}", noop_submission(f"noop-{i:06d}"))
    before = count()
    argv = [SPOOLD, "run", "--spool", str(root), "--drain", "--worker"]
    procs = [start([*argv, f"trace{k}"], log_path=mount / name / f"spoold-{k}.log") for k in range(2)]
    wait_all(procs, timeout=600, what="spoold --drain on the counted mount")
    done = count_json(root / "complete")
    if done != jobs:
        raise RuntimeError(f"nasdispatch: {done} of {jobs} jobs completed on the counted mount")
    # FUSE releases files after close(2) returns: the last CLOSE requests may come later.
    after, deadline = count(), time.monotonic() + 10
    while time.monotonic() < deadline:
        time.sleep(0.3)
        now = count()
        if now == after:
            break
        after = now
    return after - before


#: filesystem -> (what is counted, the row's words for it)
COUNTED = {
    "sshfs": "SFTP requests (round trips)",
    "juicefs": "metadata commands (redis-server's, JuiceFS's engine)",
}


def _requests(fs: str, n: int) -> Row:
    """What a no-op job costs the file server, format 2 beside format 1."""
    per: dict[int, dict[str, float]] = {}
    with contextlib.ExitStack() as stack:
        base = stack.enter_context(scratch("disk", f"nasdispatch-count-{fs}"))
        if fs == "sshfs":
            _export, mount = stack.enter_context(mounted(base, trace=True))
            log_ = sftp_log(base)
            count: Callable[[], Counter[str]] = lambda: sftp_requests(log_)  # noqa: E731
        else:
            mount = stack.enter_context(juicefs_mount(base))
            meta = (base / ".juicefs" / "meta").read_text().strip()
            count = lambda: redis_commands(meta)  # noqa: E731
        for fmt in (2, 1):
            log(f"nasdispatch: {COUNTED[fs]} a job over {fs}, format {fmt}, {n} jobs (and an empty queue)")
            empty = _drained_requests(mount, count, f"empty-f{fmt}", 0, fmt)
            loaded = _drained_requests(mount, count, f"loaded-f{fmt}", n, fmt)
            per[fmt] = {k: (loaded[k] - empty[k]) / n for k in loaded | empty}
    total = {fmt: sum(v.values()) for fmt, v in per.items()}
    top = sorted(per[2].items(), key=lambda kv: -kv[1])[:6]
    return Row(
        key=f"nasdispatch.{fs}.requests",
        measure=f"{COUNTED[fs]} per no-op job, 2w x max_active 4 over {fs}",
        unit="calls",
        spool=total[2],
        peer=FORMAT1,
        peer_value=total[1],
        note=f"format 1 / format 2 = {total[1] / total[2]:.2f}x; format 2's most: "
        + ", ".join(f"{k} {v:.1f}" for k, v in top),
        samples={f"format{fmt}": v for fmt, v in per.items()},
    )


def run(mode: str) -> tuple[list[Row], list[str]]:
    n, rounds = {"full": (200, 3), "quick": (60, 2), "smoke": (8, 1)}[mode]
    rows: list[Row] = []
    with scratch("disk", "nasdispatch-sshfs") as base, mounted(base) as (_export, mount):
        rows += _rows("sshfs", mount, n, rounds)
    with scratch("disk", "nasdispatch-juicefs") as base, juicefs_mount(base) as mount:
        rows += _rows("juicefs", mount, n, rounds)
    rows += [_requests(fs, n) for fs in FILESYSTEMS]
    notes = [
        f"nasdispatch: {n} no-op jobs per run, {rounds} rounds interleaved, spoold max_active as named; "
        "sshfs: tools/multimount (loopback sshd, --cache low); JuiceFS: tools/juicefsmount "
        "(redis-server on loopback, --storage file, default caches); spool's column is tree format 2, "
        "the peer the same code on a format 1 tree; the target is issue 25's (3x on the same mount).",
    ]
    return rows, notes
