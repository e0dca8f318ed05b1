"""Latency: a job file renamed into ``incoming/`` -> its claim, median and p99.

The claim time is the worker's journal line that tells the claim (``to:
running``): written once the claim is durable, the claim batch's folder fsyncs
done, as the floor below counts them (``claimed_at`` in ``attempt.json``, read
before 2026-12-02, is stamped before those fsyncs in format 2 and flattered spool
by ~0.5 ms on ext4); the drop time
is the harness's clock right after its rename into ``incoming/``. Both are
this host's wall clock. Between them: the watcher's wake-up (or the next
poll), acceptance (parse, check, reserve the ID, the durable job file, removal
of the drop) and the durable claim.

* inotify (``[daemon] watch = "auto"``): closed loop. Drop one job, wait until
  it is complete, then run one iteration of the *durable floor* beside it (the
  least any durable drop-to-claim can do on this filesystem: write + fsync the
  job file, rename it into ``pending/``, fsync that folder, rename it into
  ``running/``, fsync both folders), then a random pause of 5-20 ms. So each
  spool sample has a floor sample from the same moment of the disk's life, and
  the ratio is taken pair by pair. Also on tmpfs, where fsync costs nothing:
  that is the daemon's own cost.
* polling (``watch = "poll"``, ``poll_interval`` 0.05 s and 1.0 s): open loop,
  jobs dropped at random (Poisson) times so the drop falls anywhere in the poll
  period. A polling daemon cannot see a writer close a file, so a drop is
  taken only after it stayed unchanged for ``[daemon] incoming_quiet`` (2 s,
  issue 11's fix for half-written drops): the expected median is the quiet
  period plus about half the interval, and the peer figure is that bound
  (quiet + interval).
"""

from __future__ import annotations

import os
import random
import signal
import time
from pathlib import Path

from spool.core import config

from .common import (
    ROOTS,
    SPOOLD,
    Row,
    count_json,
    create_probe,
    drop,
    events,
    fs_type,
    log,
    make_spool,
    median,
    noop_settings,
    noop_submission,
    p99,
    pair_ratios,
    scratch,
    start,
    stop,
)
from .peers import fsync_dir, write_fsynced


def _claimed_at(root: Path, job: str) -> float:
    """When the claim of ``job`` was told: durable (see the module docstring)."""
    told = [e["t"] for e in events(root) if e.get("job") == job and e.get("to") == "running"]
    if not told:
        raise RuntimeError(f"{job} completed but no journal line tells its claim")
    return min(told)


def _wait(pred: object, timeout: float, what: str, interval: float = 0.002) -> None:
    deadline = time.monotonic() + timeout
    while not pred():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


def _floor_once(folder: Path, i: int) -> float:
    """The durable floor of drop-to-claim: 4 fsyncs and 2 renames."""
    pending, running = folder / "pending", folder / "running"
    name = f"f{i}.json"
    t0 = time.perf_counter()
    tmp = pending / f".{name}.tmp"
    write_fsynced(tmp, b'{"job": "floor"}')
    os.rename(tmp, pending / name)
    fsync_dir(pending)
    os.rename(pending / name, running / name)
    fsync_dir(running)
    fsync_dir(pending)
    return time.perf_counter() - t0


class _Daemon:
    def __init__(self, root: Path, log_path: Path) -> None:
        self.root = root
        self.proc = start(
            [SPOOLD, "run", "--spool", str(root), "--worker", "lat"],
            log_path=log_path,
        )
        self.log_path = log_path

    def __enter__(self) -> _Daemon:
        return self

    def __exit__(self, *exc: object) -> None:
        stop(self.proc, signal.SIGTERM)


def _spool(d: Path, watch: str, poll: float) -> Path:
    settings = noop_settings(limits={"max_active": 8}, daemon={"watch": watch, "poll_interval": poll})
    return make_spool(d / "spool", settings)


#: Jobs run before measuring (the first claims pay for imports and cold caches).
WARM_UP = 2

#: ``[daemon] incoming_quiet``, the default the benchmark's spools keep: how long a
#: polling daemon waits for a drop to stay unchanged before it takes it.
QUIET: float = config.Daemon().incoming_quiet


def _warm_up(root: Path, k: int = WARM_UP) -> None:
    for i in range(k):
        drop(root, f"warm-{i}", noop_submission(f"warm-{i}"))
    _wait(lambda: count_json(root / "complete") >= k, 60, "the warm-up jobs")


def closed_loop(
    kind: str, watch: str, poll: float, n: int, pause: tuple[float, float], rng: random.Random, floor: bool
) -> tuple[list[float], list[float]]:
    """Drop one job, wait until it is complete, (run one floor iteration,) pause, again.

    Returns (spool latencies, floor times) in seconds; the floor list is empty
    when ``floor`` is false.
    """
    with scratch(kind, "latency", defer=True) as d:
        root = _spool(d, watch, poll)
        (d / "floor" / "pending").mkdir(parents=True)
        (d / "floor" / "running").mkdir()
        lat, flo = [], []
        with _Daemon(root, d / "spoold.log"):
            _warm_up(root)
            for i in range(n):
                name = f"lat-{i:04d}"
                t = drop(root, name, noop_submission(name))
                done = root / "complete" / f"{name}@1.json"
                _wait(done.exists, 60 + 2 * poll, f"{name} to complete")
                lat.append(_claimed_at(root, f"{name}@1") - t)
                if floor:
                    flo.append(_floor_once(d / "floor", i))
                time.sleep(rng.uniform(*pause))
        return lat, flo


def keys(mode: str) -> list[str]:
    """The rows this measure promises (the smoke test checks every one is printed)."""
    stats = ("median", "p99")
    return [f"latency.inotify.{k}.{s}" for k in ("disk", "tmpfs") for s in stats] + [
        f"latency.poll{p:g}.{s}" for p in (0.05, 1.0) for s in stats
    ]


def run(mode: str) -> tuple[list[Row], list[str]]:
    n, n_poll1 = {"full": (200, 60), "quick": (60, 15), "smoke": (6, 3)}[mode]
    rng = random.Random(7)
    rows: list[Row] = []
    fs = {k: fs_type(ROOTS[k]) for k in ROOTS}

    for kind in ("disk", "tmpfs"):
        log(f"latency: inotify on {kind} ({fs[kind]}), {n} jobs, the durable floor beside each")
        before = create_probe(ROOTS[kind])
        lat, flo = closed_loop(kind, "auto", 2.0, n, (0.005, 0.02), rng, floor=True)
        after = create_probe(ROOTS[kind])
        ms = [x * 1e3 for x in lat]
        fms = [x * 1e3 for x in flo]
        # Drop-to-claim makes five new inodes where the floor makes one: their cost, taken
        # before and after the run, says how far the ratio moved with it.
        inodes = (
            f"a new file / folder cost {before[0]:.0f} / {before[1]:.0f} us before the run, "
            f"{after[0]:.0f} / {after[1]:.0f} us after"
        )
        log(f"  median {median(ms):.2f} ms, p99 {p99(ms):.2f} ms; floor median {median(fms):.2f} ms")
        log(f"  {inodes}")
        target = kind == "disk"
        rows.append(
            Row(
                key=f"latency.inotify.{kind}.median",
                measure=f"drop-to-claim, inotify, {kind} ({fs[kind]}), median",
                unit="ms",
                spool=median(ms),
                peer="durable floor (4 fsyncs)",
                peer_value=median(fms),
                ratio=median(pair_ratios(ms, fms)),
                target="< 5 ms" if target else "",
                met=median(ms) < 5 if target else None,
                note=inodes,
                samples={"spool_ms": ms, "floor_ms": fms, "create_us": [before, after]},
            )
        )
        rows.append(
            Row(
                key=f"latency.inotify.{kind}.p99",
                measure=f"drop-to-claim, inotify, {kind} ({fs[kind]}), p99",
                unit="ms",
                spool=p99(ms),
                peer="durable floor (4 fsyncs)",
                peer_value=p99(fms),
            )
        )
    for poll, count in ((0.05, n), (1.0, n_poll1)):
        log(f"latency: polling every {poll:g} s on disk, {count} jobs, random phase")
        ms = [x * 1e3 for x in closed_loop("disk", "poll", poll, count, (0.0, poll), rng, floor=False)[0]]
        log(f"  median {median(ms):.1f} ms, p99 {p99(ms):.1f} ms")
        for stat, value in (("median", median(ms)), ("p99", p99(ms))):
            rows.append(
                Row(
                    key=f"latency.poll{poll:g}.{stat}",
                    measure=f"drop-to-claim, poll {poll:g} s, disk, {stat} of {count}",
                    unit="ms",
                    spool=value,
                    peer="incoming_quiet + poll interval",
                    peer_value=(QUIET + poll) * 1e3,
                    ratio=value / ((QUIET + poll) * 1e3),
                    samples={"spool_ms": ms} if stat == "median" else {},
                )
            )
    notes = [
        f"latency: closed loop per job (drop, wait until complete, pause, next), after {WARM_UP} warm-up "
        "jobs; claim time = the worker's journal line telling the claim (written once the claim is durable).",
        f"latency: inotify: {n} jobs per filesystem, pause 5-20 ms, one floor iteration after each job "
        "(write+fsync a job file, rename into pending/ + fsync, rename into running/ + fsync both folders); "
        "ratio = median of per-job spool/floor ratios.",
        'latency: polling (watch = "poll"): pause uniform in [0, interval] so a drop falls anywhere in the '
        f"period; a polling daemon takes a drop once it is unchanged for incoming_quiet ({QUIET:g} s), so "
        f"expect about quiet + half the interval; {n} jobs at 0.05 s, {n_poll1} at 1.0 s.",
    ]
    return rows, notes
