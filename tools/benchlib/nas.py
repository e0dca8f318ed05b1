"""NAS: a big queue through a network mount (issue 17), each figure beside ``scandir``
of the same folder through the same mount.

tools/multimount serves a folder over SFTP from a private sshd on 127.0.0.1 and
mounts it with sshfs (``--cache low``: FUSE's 1 s caches only). The tree is
built on the server's side (valid no-op job files written straight into
``pending/``, as the ``scale`` measure does); everything timed goes through the
mount, where each stat, open or listing page is a round trip.

* ``spool status --json`` and ``spool ls pending`` run as real commands,
  interleaved per round with the floor: a Python process that counts
  ``pending/`` through the mount with ``os.scandir``. The target row is status
  against ls (within 2x at 20,000).
* ``spoold run`` on the mount (``max_active = 1``, no-op jobs): start to first
  claim (seen on the server's side), then its claim rate for a few seconds.
* at the largest size, a quarantined daemon (it indexes but claims nothing) is
  left to read its backlog, then its steady state is measured while jobs keep
  arriving (5 a second, on the server's side): CPU share over a window (from
  /proc), and listings, stats and opens per minute (``strace -c -f`` attached);
  once with its metrics file (the default), once without.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path

from .common import (
    PY,
    SPOOL,
    SPOOLD,
    TOOLS,
    Row,
    count_json,
    interleave,
    log,
    median,
    pair_ratios,
    run_timed,
    scratch,
    start,
    stop,
)
from .scale import build_tree

MULTIMOUNT = TOOLS / "multimount"
FLOOR = "import os, sys; print(sum(1 for e in os.scandir(sys.argv[1]) if e.name.endswith('.json')))"

#: mode -> (tree sizes, rounds, seconds the claim rate is sampled, steady-state window)
PLAN: dict[str, tuple[list[int], int, float, float]] = {
    "full": ([1_000, 20_000, 100_000], 3, 3.0, 60.0),
    "quick": ([1_000, 5_000], 3, 2.0, 10.0),
    "smoke": ([100, 300], 1, 0.5, 3.0),
}


#: mode -> JuiceFS tree sizes (three mounts of one volume: tools/juicefsmount)
JUICEFS_SIZES: dict[str, list[int]] = {"full": [1_000, 20_000], "quick": [1_000, 5_000], "smoke": [100, 300]}
JUICEFSMOUNT = TOOLS / "juicefsmount"


def keys(mode: str) -> list[str]:
    sizes = PLAN[mode][0]
    per = ["json", "ls", "first_claim", "claim_rate"]
    steady = [f"nas.rescan_{k}{s}" for s in ("", "_nometrics") for k in ("cpu", "calls")]
    jfs = [f"nas.juicefs.{k}.{n}" for n in JUICEFS_SIZES[mode] for k in ("json", "first_claim", "claim_rate")]
    return [*(f"nas.{k}.{n}" for n in sizes for k in per), *steady, *jfs]


@contextlib.contextmanager
def mounted(base: Path, *, trace: bool = False) -> Iterator[tuple[Path, Path]]:
    """(export, mount) of a fresh multimount instance under ``base``; down afterwards.
    ``trace``: sshfs logs every SFTP request (:func:`sftp_log`)."""
    up = subprocess.run(
        [str(MULTIMOUNT), "up", str(base), "--mounts", "1", "--cache", "low", *(["--trace"] * trace)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    if up.returncode != 0:
        raise RuntimeError(f"tools/multimount up failed: {up.stderr.strip()}")
    try:
        yield base / "export", base / "a"
    finally:
        subprocess.run([str(MULTIMOUNT), "down", str(base)], capture_output=True, timeout=120)


def sftp_log(base: Path) -> Path:
    """The request log of a traced instance's mount (``tools/multimount --trace``)."""
    return base / ".multimount" / "sshfs-a.log"


#: A request line of sshfs_debug: ``[<id>] <TYPE>`` (replies are indented).
_REQUEST = re.compile(r"^\[\d+\] ([A-Za-z_@.]+)", re.M)


def sftp_requests(log: Path) -> Counter[str]:
    """SFTP requests sent so far, by type, from a traced mount's log."""
    return Counter(_REQUEST.findall(log.read_text(errors="replace")))


def redis_commands(meta_url: str) -> Counter[str]:
    """Commands a redis-server has run so far, by command (``INFO commandstats``): for
    JuiceFS, whose metadata lives there, what a workload costs its metadata engine."""
    import redis  # the bench extra's client (RQ's too)

    client = redis.Redis.from_url(meta_url, socket_timeout=30)
    try:
        stats = client.info("commandstats")
    finally:
        client.close()
    out: Counter[str] = Counter()
    for key, row in stats.items():
        name = key.removeprefix("cmdstat_")
        if name != "info":  # this very question
            out[name] = int(row["calls"])
    return out


def _claimed(server: Path, worker: str) -> int:
    return count_json(server / "running" / worker) + count_json(server / "complete")


def first_claim(server: Path, mount: Path, window: float) -> tuple[float, float]:
    """Start spoold on the mount: seconds to its first claim, then claims per second."""
    worker = "nasbench"
    before = _claimed(server, worker)
    t0 = time.perf_counter()
    proc = start(
        [SPOOLD, "run", "--spool", str(mount), "--worker", worker], log_path=server.parent / "spoold.log"
    )
    try:
        deadline = time.monotonic() + 600
        while _claimed(server, worker) == before:
            if proc.poll() is not None:
                raise RuntimeError(f"spoold exited {proc.returncode}; see {server.parent / 'spoold.log'}")
            if time.monotonic() > deadline:
                raise RuntimeError("spoold made no claim within 600 s")
            time.sleep(0.01)
        first = time.perf_counter() - t0
        done0, t1 = count_json(server / "complete"), time.perf_counter()
        time.sleep(window)
        rate = (count_json(server / "complete") - done0) / (time.perf_counter() - t1)
    finally:
        stop(proc, signal.SIGTERM, timeout=60)
    return first, rate


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process and its threads so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


STRACE_ROW = re.compile(r"^\s*[\d.]+\s+[\d.]+\s+\d+\s+(\d+)\s+(?:\d+\s+)?(\w+)\s*$")


def steady_state(server: Path, mount: Path, window: float, *, metrics: bool = True) -> dict[str, float]:
    """A daemon that indexes but claims nothing (quarantined), once its backlog is read:
    its CPU share and calls per minute while 5 jobs a second arrive; with its metrics
    file (the default) or without (``[observe] metrics_dir = ""``)."""
    from spool.core import settings
    from spool.core.model import WorkerRecord
    from spool.disk.tree import Tree
    from spool.queue import health
    from spool.queue.status import read
    from spool.queue.workers import worker_id

    worker = worker_id("nasidle")
    tree = Tree.at(server)
    health.quarantine(tree, worker, "benchmark: index only", [])
    # Metrics on (the default): the hook takes pending/ from the index and stats the
    # other folders, listing one only when it changed; off: the index's cost alone.
    settings.write(tree.config_file, {"observe": {"metrics_dir": "metrics" if metrics else ""}})
    proc = start(
        [SPOOLD, "run", "--spool", str(mount), "--worker", "nasidle"], log_path=server.parent / "idle.log"
    )
    try:
        t0 = time.monotonic()
        while True:  # the backlog is read when the heartbeat reports an oldest pending job
            if proc.poll() is not None:
                raise RuntimeError(f"spoold exited {proc.returncode}")
            if time.monotonic() - t0 > 1200:
                raise RuntimeError("the index did not finish its first scan in 1200 s")
            rec = read(tree.worker_file(worker), WorkerRecord)
            if rec is not None and rec.oldest_pending_submitted is not None:
                break
            time.sleep(1.0)
        indexed = time.monotonic() - t0
        log(f"nas: idle daemon (metrics {'on' if metrics else 'off'}) indexed everything in {indexed:.0f} s")
        stop_arrivals = arrivals(server)
        try:
            c0, w0 = _cpu_seconds(proc.pid), time.monotonic()
            time.sleep(window)
            cpu = (_cpu_seconds(proc.pid) - c0) / (time.monotonic() - w0)
            calls = _strace_calls(proc.pid, window)
        finally:
            stop_arrivals()
    finally:
        stop(proc, signal.SIGTERM, timeout=60)
        (tree.workers / f"{worker}.quarantined").unlink(missing_ok=True)
        settings.write(tree.config_file, {"observe": {"metrics_dir": "metrics"}})
        for late in (server / "pending").glob("late-*.json"):  # the next daemon's queue as the first's
            late.unlink()
    per_min = 60.0 / window
    return {
        "indexed_s": indexed,
        "cpu_share": cpu,
        "listings_per_min": calls.get("getdents64", 0) * per_min,
        "stats_per_min": sum(v for k, v in calls.items() if "stat" in k) * per_min,
        "opens_per_min": (calls.get("openat", 0) + calls.get("open", 0)) * per_min,
        "arrivals_per_min": 5 * 60.0,
    }


def arrivals(server: Path) -> Callable[[], None]:
    """Write 5 new no-op jobs a second into pending/ (server side) until stopped."""
    import threading

    model = next((server / "pending").glob("*.json"))
    template, old = model.read_bytes(), model.name.split("@")[0].encode()
    done = threading.Event()

    def run() -> None:
        i = 0
        while not done.wait(0.2):
            name = f"late-{i:06d}"
            data = template.replace(old, name.encode())  # the same job shape, its own name
            (server / "pending" / f"{name}@1.json").write_bytes(data)
            i += 1

    t = threading.Thread(target=run, daemon=True)
    t.start()

    def stop_it() -> None:
        done.set()
        t.join()

    return stop_it


def _strace_calls(pid: int, seconds: float) -> dict[str, int]:
    """System calls of a running process and its threads over ``seconds`` (strace -c -f)."""
    if shutil.which("strace") is None:
        return {}
    with scratch("disk", "nas-strace") as d:
        out = d / "summary"
        p = subprocess.Popen(
            ["strace", "-c", "-f", "-qq", "-o", str(out), "-p", str(pid)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        time.sleep(seconds)
        p.send_signal(signal.SIGINT)
        p.wait(timeout=60)
        calls: dict[str, int] = {}
        for line in out.read_text(errors="replace").splitlines():
            m = STRACE_ROW.match(line)
            if m:
                calls[m.group(2)] = int(m.group(1))
        return calls


def run(mode: str) -> tuple[list[Row], list[str]]:
    sizes, rounds, window, steady_window = PLAN[mode]
    rows: list[Row] = []
    steady: dict[bool, dict[str, float]] = {}
    with scratch("disk", "nas") as base, mounted(base) as (export, mount):
        for n in sizes:
            server, client = export / f"s{n}", mount / f"s{n}"
            t0 = time.perf_counter()
            build_tree(server, n)
            log(f"nas: {n:,} jobs in pending/ (built on the server in {time.perf_counter() - t0:.1f} s)")
            argv = {
                "json": [SPOOL, "status", "--json", "--spool", str(client)],
                "ls": [SPOOL, "ls", "pending", "--spool", str(client)],
                "floor": [PY, "-c", FLOOR, str(client / "pending")],
            }

            def timed(a: list[str]) -> float:
                t = run_timed(a)
                if t.returncode != 0:
                    raise RuntimeError(f"{' '.join(a[:3])} exited {t.returncode}")
                return t.wall

            runners: dict[str, Callable[[], float]] = {k: partial(timed, a) for k, a in argv.items()}
            res = interleave(rounds, runners)
            first, rate = first_claim(server, client, window)
            floor = median(res["floor"])
            log(
                f"nas {n:,}: status --json {median(res['json']):.2f} s, ls {median(res['ls']):.2f} s, "
                f"scandir {floor:.2f} s; first claim {first:.2f} s, {rate:.1f} claims/s"
            )
            big20 = n == 20_000
            big100 = n == 100_000
            rows += [
                Row(
                    key=f"nas.json.{n}",
                    measure=f"NAS: spool status --json, {n:,} pending",
                    unit="s",
                    spool=median(res["json"]),
                    peer="spool ls pending",
                    peer_value=median(res["ls"]),
                    ratio=median(pair_ratios(res["json"], res["ls"])),
                    target="<= 2x ls" if big20 else "",
                    met=median(pair_ratios(res["json"], res["ls"])) <= 2.0 if big20 else None,
                    note=f"scandir through the mount: {floor:.2f} s",
                    samples={"json_s": res["json"], "ls_s": res["ls"], "floor_s": res["floor"]},
                ),
                Row(
                    key=f"nas.ls.{n}",
                    measure=f"NAS: spool ls pending, {n:,} pending",
                    unit="s",
                    spool=median(res["ls"]),
                    peer="python + scandir count",
                    peer_value=floor,
                    ratio=median(pair_ratios(res["ls"], res["floor"])),
                ),
                Row(
                    key=f"nas.first_claim.{n}",
                    measure=f"NAS: spoold start to first claim, {n:,} pending",
                    unit="s",
                    spool=first,
                    peer="python + scandir count",
                    peer_value=floor,
                    ratio=first / floor if floor else None,
                    target="< 3 s" if big20 else "< 10 s" if big100 else "",
                    met=(first < 3.0) if big20 else (first < 10.0) if big100 else None,
                ),
                Row(
                    key=f"nas.claim_rate.{n}",
                    measure=f"  NAS: spoold no-op claim rate, {n:,} pending (1 slot, first scan)",
                    unit="jobs/s",
                    spool=rate,
                ),
            ]
            if n == sizes[-1]:
                for on in (True, False):
                    steady[on] = steady_state(server, client, steady_window, metrics=on)
                    log(f"nas steady state at {n:,}, metrics {'on' if on else 'off'}: {steady[on]}")
    top = sizes[-1]
    for on, suffix, what in ((True, "", "metrics on"), (False, "_nometrics", "metrics off")):
        got = steady.get(on, {})
        rows += [
            Row(
                key=f"nas.rescan_cpu{suffix}",
                measure=f"NAS: indexed daemon's CPU, {what}, {top:,} pending, 5 new jobs/s",
                unit="%",
                spool=got.get("cpu_share", float("nan")) * 100,
                target="< 1 %" if on and top >= 100_000 else "",  # the default: metrics on
                met=got.get("cpu_share", 1.0) < 0.01 if on and top >= 100_000 else None,
                note=f"first scan of the whole queue took {got.get('indexed_s', float('nan')):.0f} s",
                samples=got,
            ),
            Row(
                key=f"nas.rescan_calls{suffix}",
                measure=f"  NAS: its opens per minute, {what} ({top:,} pending, 300 arrivals/min)",
                unit="/min",
                spool=got.get("opens_per_min"),
                peer="listing calls (getdents64) / stats per min",
                peer_value=got.get("listings_per_min"),
                note=f"stats per minute: {got.get('stats_per_min', float('nan')):.0f}",
                samples=got,
            ),
        ]
    jrows, jnote = juicefs_rows(mode, rounds, window)
    rows += jrows
    notes = [
        jnote,
        "nas: tools/multimount (sshfs on loopback, --cache low); sizes "
        f"{', '.join(f'{s:,}' for s in sizes)}, {rounds} rounds of [status --json, ls pending, "
        f"scandir] rotated; claim rate over {window:g} s after the first claim; steady state "
        f"over {steady_window:g} s (CPU from /proc, then calls by strace -c -f), metrics on then off.",
    ]
    return rows, notes


def juicefs_rows(mode: str, rounds: int, window: float) -> tuple[list[Row], str]:
    """The same figures on JuiceFS (tools/juicefsmount: metadata in a redis-server on
    loopback, ``--storage file``, JuiceFS's default 1 s caches): the tree is built
    through one mount and every timed command goes through another, as a second host's
    would. Skipped with a note where JuiceFS cannot run."""
    sizes = JUICEFS_SIZES[mode]
    rows: list[Row] = []
    with scratch("disk", "nas-juicefs") as base:
        up = subprocess.run(
            [str(JUICEFSMOUNT), "up", str(base), "--mounts", "2"], capture_output=True, text=True, timeout=600
        )
        if up.returncode != 0:
            return [], f"nas: JuiceFS rows skipped: tools/juicefsmount up said {up.stderr.strip()[-200:]}"
        try:
            for n in sizes:
                server, client = base / "a" / f"s{n}", base / "b" / f"s{n}"
                t0 = time.perf_counter()
                build_tree(server, n)
                built = time.perf_counter() - t0
                log(f"nas juicefs: {n:,} jobs in pending/ (built through mount a in {built:.1f} s)")
                argv = {
                    "json": [SPOOL, "status", "--json", "--spool", str(client)],
                    "ls": [SPOOL, "ls", "pending", "--spool", str(client)],
                }

                def timed(a: list[str]) -> float:
                    t = run_timed(a)
                    if t.returncode != 0:
                        raise RuntimeError(f"{' '.join(a[:3])} exited {t.returncode}")
                    return t.wall

                res = interleave(rounds, {k: partial(timed, a) for k, a in argv.items()})
                first, rate = first_claim(server, client, window)
                log(
                    f"nas juicefs {n:,}: status --json {median(res['json']):.2f} s, "
                    f"ls {median(res['ls']):.2f} s; first claim {first:.2f} s, {rate:.1f} claims/s"
                )
                rows += [
                    Row(
                        key=f"nas.juicefs.json.{n}",
                        measure=f"JuiceFS: spool status --json, {n:,} pending",
                        unit="s",
                        spool=median(res["json"]),
                        peer="spool ls pending",
                        peer_value=median(res["ls"]),
                        ratio=median(pair_ratios(res["json"], res["ls"])),
                        samples={"json_s": res["json"], "ls_s": res["ls"]},
                    ),
                    Row(
                        key=f"nas.juicefs.first_claim.{n}",
                        measure=f"JuiceFS: spoold start to first claim, {n:,} pending",
                        unit="s",
                        spool=first,
                    ),
                    Row(
                        key=f"nas.juicefs.claim_rate.{n}",
                        measure=f"  JuiceFS: spoold no-op claim rate, {n:,} pending (1 slot, first scan)",
                        unit="jobs/s",
                        spool=rate,
                    ),
                ]
        finally:
            subprocess.run([str(JUICEFSMOUNT), "down", str(base)], capture_output=True, timeout=120)
    note = (
        f"nas: JuiceFS rows: tools/juicefsmount (redis-server on loopback, --storage file, default 1 s "
        f"attr/entry/dir-entry caches), tree built through mount a, timed through mount b; sizes "
        f"{', '.join(f'{s:,}' for s in sizes)}, {rounds} rounds of [status --json, ls pending]."
    )
    return rows, note
