#!/usr/bin/env python3
"""Where a no-op job's time goes, step by step: a timeline recorded inside the daemon.

A throughput A/B on a shared VM cannot see a change of a few percent (single rounds of
the same code spread 0.7x-1.4x); a timeline of one run can. The daemon runs in its own
process with ``os.fsync`` and the functions of the job path wrapped, each call recording
its start, end and thread (about 5 us a wrapper); this process drops the jobs. Fsyncs
are named by the path of their descriptor (``S/`` is the spool; ``#new`` an unnamed
file). Two measures:

``drop-to-claim``
    jobs dropped one at a time into ``incoming/`` (closed loop: the next after the
    last completes), each timed from its drop (this process's clock just before the
    rename: one taken after it can come late, when this process loses the CPU at the
    rename and the daemon, woken, starts first; its first steps then fell out of the
    window, and the medians of the rest came from the slow drops only) to its claim line
    in the journal; per step, the median start from the drop and the median duration,
    and the share of jobs that had the step.
``cycle``
    jobs dropped at once and drained by one daemon with one slot (``--slots``: more); per
    step, its mean time per cycle (consecutive complete lines, the middle third of the
    run), by thread
    (``main`` the loop, ``slot`` the job's thread, ``helper`` a group-commit fsync).

The daemon is this checkout's, or the one under ``--src`` (wrapped functions missing
there are skipped), so two trees can be compared in the same minute::

    tools/timeline.py                                 # both measures on /var/tmp
    tools/timeline.py --measure cycle --jobs 600 --dir /mnt/j --src /tmp/before
"""

from __future__ import annotations

import argparse
import bisect
import collections
import functools
import importlib
import itertools
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

#: (module, attribute) wrapped in the daemon: ``Class.method`` or a module's function.
#: Callers that imported a function by name are pointed at the wrapper too (below).
WRAPPED = (
    ("spoold.daemon", "Daemon._accept"),
    ("spoold.daemon", "Daemon._fill_slots"),
    ("spoold.daemon", "Daemon._claim_batch"),
    ("spoold.daemon", "Daemon._start_claimed"),
    ("spoold.daemon", "Daemon._take_events"),
    ("spool.queue.accept", "accept_incoming"),
    ("spool.queue.accept", "take_batch"),
    ("spool.queue.accept", "Batch.release_lines"),
    ("spool.queue.accept", "_accept_batch"),
    ("spool.queue.accept", "_read_submission"),
    ("spool.queue.accept", "build_job"),
    ("spool.queue.accept", "_reserve"),
    ("spool.queue.accept", "write_atomic"),
    ("spool.queue.accept", "keep_submission"),
    ("spool.queue.claim", "claim"),
    ("spool.queue.execute", "load_claimed"),
    ("spool.queue.execute", "open_claimed"),
    ("spool.queue.execute", "started"),
    ("spool.queue.execute", "run_to_ready"),
    ("spool.queue.publish", "prepare"),
    ("spool.queue.publish", "_stored"),
    ("spool.queue.publish", "_manifest"),
    ("spool.queue.publish", "Prepared"),
    ("spool.disk.store", "put"),
    ("spool.queue.execute", "gate"),
    ("spool.kinds.noop", "Noop.produce"),
    ("spool.queue.publish", "commit"),
    ("spool.queue.publish", "_index_batch"),
    ("spool.queue.publish", "complete"),
    ("spool.library.segments", "write"),
    ("spool.queue.events", "Journal.record"),
)


# -- inside the daemon ---------------------------------------------------------------------


def _install(out: Path) -> list[tuple[float, float, str, str]]:
    """Wrap ``os.fsync`` and :data:`WRAPPED`; the records go to ``out`` at exit."""
    import atexit

    records: list[tuple[float, float, str, str]] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        try:
            path = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            path = "?"
        t0 = time.time()
        try:
            real_fsync(fd)
        finally:
            records.append((t0, time.time(), threading.current_thread().name, path))

    os.fsync = fsync  # type: ignore[assignment]
    for modname, attr in WRAPPED:
        try:
            mod = importlib.import_module(modname)
        except ImportError:
            continue
        owner: Any = mod
        *outer, name = attr.split(".")
        for part in outer:
            owner = getattr(owner, part, None)
        if owner is None or not hasattr(owner, name):
            continue  # an older tree (--src) without it
        real = getattr(owner, name)
        wrapper = _timed(real, f"{modname.rsplit('.', 1)[-1]}.{attr}", records)
        setattr(owner, name, wrapper)
        if not outer and getattr(real, "__module__", None) == modname:
            # Its own module's function: callers that imported it by name see the wrapper
            # too (a function imported from elsewhere is timed only where it is named here).
            for other in list(sys.modules.values()):
                ours = getattr(other, "__name__", "").startswith(("spool", "spoold"))
                if ours and getattr(other, name, None) is real:
                    setattr(other, name, wrapper)
    atexit.register(lambda: out.write_text(json.dumps(records)))
    return records


def _timed(real: Any, label: str, records: list[tuple[float, float, str, str]]) -> Any:
    @functools.wraps(real)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        t0 = time.time()
        try:
            return real(*args, **kwargs)
        finally:
            records.append((t0, time.time(), threading.current_thread().name, "F " + label))

    return wrapper


def as_daemon(out: Path, argv: list[str]) -> int:
    """Run ``spoold`` with the wrappers installed (this is the daemon's process)."""
    from spoold import main as spoold_main  # imports the job path's modules first

    _install(out)
    sys.argv = ["spoold", *argv]
    try:
        return int(spoold_main.main() or 0)
    except SystemExit as exc:
        return int(exc.code or 0)


# -- the driver ------------------------------------------------------------------------------


def _label(path: str) -> str:
    """A record's label with the job's own names folded (one row per step, not per job)."""
    path = re.sub(r".*/spool(/|$)", "S/", path) if not path.startswith("F ") else path
    path = re.sub(r"#\d+( \(deleted\))?", "#new", path)
    path = re.sub(r"noop-\d+(@1)?", "J", path)
    return re.sub(r"sha256/[0-9a-f]{2}", "sha256/aa", path)


def _thread(name: str) -> str:
    return "main" if name == "MainThread" else "helper" if name.startswith("fsync") else "slot"


def _daemon(src: Path, root: Path, out: Path, *args: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": f"{src}{os.pathsep}{ROOT / 'tools'}"}
    argv = [sys.executable, str(Path(__file__).resolve()), "--as-daemon", str(out), "--"]
    argv += ["run", "--spool", str(root), "--worker", "t0", "--log-level", "warning", *args]
    return subprocess.Popen(argv, env=env, cwd=src)


def _journal(root: Path) -> dict[str, dict[str, float]]:
    from benchlib.common import events

    by: dict[str, dict[str, float]] = {}
    for e in events(root):
        by.setdefault(e["job"], {})[str(e.get("to"))] = e["t"]
    return by


def _drop(root: Path, name: str, data: bytes) -> float:
    """A Maildir-style drop; the time just before its rename (see the module docstring)."""
    tmp = root / "incoming" / f".{name}.json.tmp"
    tmp.write_bytes(data)
    t = time.time()
    os.rename(tmp, root / "incoming" / f"{name}.json")
    return t


def drop_to_claim(src: Path, where: Path, jobs: int) -> list[str]:
    from benchlib.common import make_spool, noop_settings, noop_submission

    root = make_spool(where / "spool", noop_settings(limits={"max_active": 1}), fmt=2)
    out = where / "timeline.json"
    proc = _daemon(src, root, out)
    try:
        heartbeat = root / "workers"
        deadline = time.monotonic() + 60
        while not any(heartbeat.glob("*.json")) and time.monotonic() < deadline:
            time.sleep(0.05)
        dropped: dict[str, float] = {}
        for i in range(jobs):
            name = f"noop-{i:06d}"
            dropped[f"{name}@1"] = _drop(root, name, noop_submission(name))
            done = root / "complete" / f"{name}@1.json"
            deadline = time.monotonic() + 60
            while not done.exists():
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError(f"{name} did not complete; the daemon's log is its stderr")
                time.sleep(0.001)
            time.sleep(0.005 + (i % 7) * 0.002)  # the next drop at a different moment
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=120)
    by = _journal(root)
    records = sorted(json.loads(out.read_text()))
    starts = [r[0] for r in records]
    steps: dict[tuple[str, str], list[tuple[float, float]]] = collections.defaultdict(list)
    for job, t0 in dropped.items():
        end = by[job]["running"]
        seen: set[tuple[str, str]] = set()
        for a, b, thread, path in records[bisect.bisect_left(starts, t0) :]:
            if a > end:
                break
            key = (_thread(thread), _label(path))
            if key not in seen:  # the first of each step in the window
                seen.add(key)
                steps[key].append(((a - t0) * 1000, (b - a) * 1000))
    claim = statistics.median((by[j]["running"] - t) * 1000 for j, t in dropped.items())
    accept = statistics.median((by[j]["pending"] - t) * 1000 for j, t in dropped.items())
    lines = [
        f"drop-to-claim: {jobs} jobs one at a time; median drop -> accepted {accept:.2f} ms, "
        f"-> claimed {claim:.2f} ms",
        f"  {'start':>7} {'takes':>6} {'jobs':>5}  thread  step (median ms from the drop)",
    ]
    rows = sorted(steps.items(), key=lambda kv: statistics.median(x[0] for x in kv[1]))
    for (thread, label), v in rows:
        if len(v) >= 0.3 * jobs:
            start = statistics.median(x[0] for x in v)
            takes = statistics.median(x[1] for x in v)
            lines.append(f"  {start:7.2f} {takes:6.2f} {len(v) / jobs:5.2f}  {thread:6s}  {label}")
    return lines


def cycle(src: Path, where: Path, jobs: int, slots: int = 1) -> list[str]:
    from benchlib.common import drop, make_spool, noop_settings, noop_submission

    root = make_spool(where / "spool", noop_settings(limits={"max_active": slots}), fmt=2)
    for i in range(jobs):
        drop(root, f"noop-{i:06d}", noop_submission(f"noop-{i:06d}"))
    out = where / "timeline.json"
    proc = _daemon(src, root, out, "--drain")
    if proc.wait(timeout=600) != 0:
        raise RuntimeError(f"the draining daemon exited with {proc.returncode}")
    done = sorted(v["complete"] for v in _journal(root).values() if "complete" in v)
    if len(done) != jobs:
        raise RuntimeError(f"{len(done)} of {jobs} jobs completed")
    records = sorted(json.loads(out.read_text()))
    starts = [r[0] for r in records]
    third = done[jobs // 3 : 2 * jobs // 3 + 1]
    cycles = list(itertools.pairwise(third))
    per: collections.Counter[tuple[str, str]] = collections.Counter()
    for a0, a1 in cycles:
        for a, b, thread, path in records[bisect.bisect_left(starts, a0) : bisect.bisect_left(starts, a1)]:
            per[(_thread(thread), _label(path))] += (b - a) * 1000
    median_cycle = statistics.median((b - a) * 1000 for a, b in cycles)
    mean_cycle = (third[-1] - third[0]) * 1000 / len(cycles)  # with slots > 1: a batch's jobs end together
    lines = [
        f"cycle: {jobs} jobs drained by 1 daemon x {slots} slot(s); median cycle {median_cycle:.2f} ms, "
        f"mean {mean_cycle:.2f} ms ({len(cycles)} cycles, the middle third)",
        f"  {'ms':>6}  thread  step (mean time per cycle)",
    ]
    for (thread, label), total in per.most_common():
        if total / len(cycles) >= 0.02:
            lines.append(f"  {total / len(cycles):6.2f}  {thread:6s}  {label}")
    return lines


def main() -> int:
    if len(sys.argv) > 2 and sys.argv[1] == "--as-daemon":
        rest = sys.argv[3:]
        return as_daemon(Path(sys.argv[2]), rest[1:] if rest[:1] == ["--"] else rest)
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--measure", choices=("drop-to-claim", "cycle", "both"), default="both")
    ap.add_argument("--jobs", type=int, default=0, help="jobs (default: 150 drop-to-claim, 600 cycle)")
    ap.add_argument("--dir", type=Path, default=Path("/var/tmp"), help="where the scratch spool goes")
    ap.add_argument("--src", type=Path, default=ROOT, help="the source tree whose daemon runs")
    ap.add_argument("--slots", type=int, default=1, help="the cycle's daemon's max_active (default 1)")
    args = ap.parse_args()
    measures = ("drop-to-claim", "cycle") if args.measure == "both" else (args.measure,)
    scratch: list[Path] = []
    try:
        for name in measures:
            where = Path(tempfile.mkdtemp(prefix="spool-timeline-", dir=args.dir))
            scratch.append(where)
            if name == "drop-to-claim":
                out = drop_to_claim(args.src.resolve(), where, args.jobs or 150)
            else:
                out = cycle(args.src.resolve(), where, args.jobs or 600, args.slots)
            print("\n".join(out), flush=True)
    finally:
        # Removed only at the end: on a disk mounted with -o discard, removing thousands of
        # files slowed the runs right after it up to 3x (docs/benchmarks.md).
        for where in scratch:
            shutil.rmtree(where, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
