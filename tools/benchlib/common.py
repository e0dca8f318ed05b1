"""What every measure of ``tools/bench`` shares: rows and the one table, medians and
pairwise ratios, interleaved runs, scratch folders on disk and tmpfs, spools
with benchmark settings, and child processes (timed, sampled, stopped by pid).

The rules every measure follows (they are the point of the harness):

* a figure is the median of several runs, never one run;
* a comparison is a ratio taken pair by pair in the same round (A B, A B, ...,
  with the order rotated each round so neither side always runs first), and
  the reported ratio is the median of those pairwise ratios;
* nothing here asserts a time: targets are reported as met or missed.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import math
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

from .peers import write_fsynced

REPO = Path(__file__).resolve().parents[2]
TOOLS = REPO / "tools"
BIN = Path(sys.executable).parent
PY = sys.executable
SPOOL = str(BIN / "spool")
SPOOLD = str(BIN / "spoold")

#: The tags spool requires by default; every benchmark job carries them.
TAGS = {"campaign": "bench", "locale": "en-GB", "asset_type": "ad", "visibility": "internal"}

T = TypeVar("T")

MODES = ("full", "quick", "smoke")


# -- rows and the table -----------------------------------------------------------------


@dataclass
class Row:
    """One line of the table: spool's figure, optionally a peer's, their ratio, a target."""

    key: str  # stable identifier (the smoke test checks every key is printed)
    measure: str
    unit: str
    spool: float | None
    peer: str = ""
    peer_value: float | None = None
    ratio: float | None = None
    target: str = ""
    met: bool | None = None
    note: str = ""
    samples: dict[str, Any] = field(default_factory=dict)

    def status(self) -> str:
        if self.met is None:
            return "reported" if not self.target else "n/a"
        return "met" if self.met else "MISSED"


def fmt(value: float | None, unit: str) -> str:
    """A figure with its unit, rounded for reading."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if unit in ("jobs/s", "B"):
        return f"{value:,.0f} {unit}"
    if unit == "ms":
        if value >= 100:
            return f"{value:,.0f} ms"
        return f"{value:.3g} ms" if value >= 1 else f"{value:.2f} ms"
    if unit == "s":
        if value < 1:
            return fmt(value * 1e3, "ms")
        return f"{value:.3g} s" if value < 100 else f"{value:,.0f} s"
    if unit == "MB":
        return f"{value:.1f} MB"
    if unit == "%":
        return f"{value:+.1f} %"
    if unit == "x":
        return f"{value:.2f}x"
    if unit == "count":
        return f"{value:,.0f}"
    if unit == "exp":
        return f"{value:.2f}"
    if unit == "bool":
        return "yes" if value else "no"
    return f"{value:.3g} {unit}".strip()


def ratio_text(r: float | None) -> str:
    return "-" if r is None or math.isnan(r) else f"{r:.2f}x"


COLUMNS = ("measure", "spool", "peer", "peer figure", "ratio", "target", "result")


def _cells(row: Row) -> list[str]:
    return [
        row.measure,
        fmt(row.spool, row.unit),
        row.peer or "-",
        fmt(row.peer_value, row.unit) if row.peer else "-",
        ratio_text(row.ratio),
        row.target or "-",
        row.status(),
    ]


def table(rows: Sequence[Row], markdown: bool = False) -> str:
    """The one table, as aligned text (or a Markdown table for the README)."""
    body = [_cells(r) for r in rows]
    if markdown:
        right = {1, 3, 4}
        lines = ["| " + " | ".join(COLUMNS) + " |"]
        lines.append("|" + "|".join("---:" if i in right else "---" for i in range(len(COLUMNS))) + "|")
        lines += ["| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |" for cells in body]
        return "\n".join(lines)
    widths = [max(len(c[i]) for c in [list(COLUMNS), *body]) for i in range(len(COLUMNS))]

    def line(cells: Sequence[str]) -> str:
        out = []
        for i, c in enumerate(cells):
            out.append(c.rjust(widths[i]) if i in (1, 3, 4) else c.ljust(widths[i]))
        return "  ".join(out).rstrip()

    sep = "  ".join("-" * w for w in widths)
    return "\n".join([line(COLUMNS), sep, *(line(c) for c in body)])


def notes(rows: Sequence[Row]) -> str:
    """The notes under the table: how each figure was taken."""
    seen: dict[str, int] = {}
    out = []
    for r in rows:
        if r.note and r.note not in seen:
            seen[r.note] = len(seen) + 1
            out.append(f"  [{r.key}] {r.note}")
    return "\n".join(out)


def rows_json(rows: Sequence[Row]) -> list[dict[str, Any]]:
    return [asdict(r) | {"result": r.status()} for r in rows]


# -- statistics -------------------------------------------------------------------------


def median(xs: Sequence[float]) -> float:
    return float(statistics.median(xs)) if xs else math.nan


def p99(xs: Sequence[float]) -> float:
    """Nearest-rank 99th percentile."""
    if not xs:
        return math.nan
    s = sorted(xs)
    return float(s[max(0, math.ceil(0.99 * len(s)) - 1)])


def pair_ratios(a: Sequence[float], b: Sequence[float]) -> list[float]:
    """a[i] / b[i] for runs taken in the same round."""
    return [x / y for x, y in zip(a, b, strict=True) if y > 0]


def create_probe(folder: Path, n: int = 40) -> tuple[float, float]:
    """What a new inode costs on ``folder``'s filesystem right now, in us: the medians of
    ``n`` file creations (``O_CREAT|O_EXCL``, then close) and of ``n`` mkdirs, in a fresh
    folder (removed after). On the VM these benchmarks were made on, one cost 13-450 us
    from one minute to the next, up to three fsyncs; a job makes several (tools/bench
    syscalls counts them), so a ratio against a floor that makes one moves with it."""
    scratch = Path(tempfile.mkdtemp(prefix=".create-probe-", dir=folder))
    files, dirs = [], []
    try:
        for i in range(n):
            t0 = time.perf_counter()
            os.close(os.open(scratch / f"f{i}", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
            files.append((time.perf_counter() - t0) * 1e6)
            t0 = time.perf_counter()
            os.mkdir(scratch / f"d{i}")
            dirs.append((time.perf_counter() - t0) * 1e6)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return statistics.median(files), statistics.median(dirs)


def fsync_probe(folder: Path, n: int = 9) -> float:
    """The filesystem's fsync latency right now, in ms: the median of ``n`` rounds of
    (write a small file, fsync it, fsync its folder) in ``folder``. Taken before each run
    of a disk-bound measure, so a pair of runs can be judged comparable: the machines
    are shared, and another engineer's suite can make every fsync 10x slower for a while,
    which slows a system that does nothing but fsync (the raw limit, huey) far more
    than one that is bound by other work."""
    times = []
    path = folder / ".fsync-probe"
    dfd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(n):
            t0 = time.perf_counter()
            write_fsynced(path, b"probe", os.O_TRUNC)
            os.fsync(dfd)
            times.append((time.perf_counter() - t0) * 1000)
    finally:
        os.close(dfd)
        path.unlink(missing_ok=True)
    return statistics.median(times)


#: Two runs whose fsync probes differ by more than this factor are not compared.
PROBE_SPREAD = 2.0


def comparable_ratios(
    a: Sequence[float], b: Sequence[float], probe_a: Sequence[float], probe_b: Sequence[float]
) -> tuple[list[float], int]:
    """a[i] / b[i] for the rounds whose two runs saw the same fsync latency (probes within
    :data:`PROBE_SPREAD` of each other), and how many rounds were left out. When no round
    qualifies every pair is returned (and the count says so): a row is never empty."""
    keep = [
        x / y
        for x, y, p, q in zip(a, b, probe_a, probe_b, strict=True)
        if y > 0 and max(p, q) <= PROBE_SPREAD * min(p, q)
    ]
    if not keep:
        return pair_ratios(a, b), len(a)
    return keep, len(a) - len(keep)


def interleave(rounds: int, runners: dict[str, Callable[[], T]]) -> dict[str, list[T]]:
    """Run every runner once per round (A B C, B C A, C A B, ...): pairs share a round."""
    names = list(runners)
    out: dict[str, list[T]] = {n: [] for n in names}
    for r in range(rounds):
        k = r % len(names)
        for n in names[k:] + names[:k]:
            out[n].append(runners[n]())
    return out


# -- progress ------------------------------------------------------------------------------

_T0 = time.monotonic()
QUIET = False


def log(msg: str) -> None:
    """Progress on stderr (the table goes to stdout)."""
    if not QUIET:
        print(f"[bench {time.monotonic() - _T0:6.1f}s] {msg}", file=sys.stderr, flush=True)


# -- scratch folders ------------------------------------------------------------------------

#: Where scratch folders go per filesystem kind (``--disk-dir`` / ``--tmpfs-dir``).
ROOTS: dict[str, Path] = {"disk": Path("/var/tmp"), "tmpfs": Path("/dev/shm")}


def fs_type(path: Path) -> str:
    """The filesystem type of ``path`` as /proc/mounts names it (longest mount prefix), with
    ``, no journal`` for an ext3/ext4 made without one (this VM's own disk): its fsyncs cost
    about half a journalled ext4's and two daemons gain less over one there, so every
    figure on it reads differently (docs/benchmarks.md has both side by side)."""
    best, kind = "", "?"
    real = str(path.resolve())
    with open("/proc/mounts") as f:
        for line in f:
            parts = line.split()
            mnt, typ = parts[1], parts[2]
            if (real == mnt or real.startswith(mnt.rstrip("/") + "/")) and len(mnt) >= len(best):
                best, kind = mnt, typ
    device = _block_device_name(best) if kind in ("ext3", "ext4") else None
    if device is not None:
        journals = os.listdir("/proc/fs/jbd2") if os.path.isdir("/proc/fs/jbd2") else []
        if not any(j.startswith(f"{device}-") for j in journals):
            kind += ", no journal"  # jbd2 lists each journal as <device>-<inode>
    return kind


def _block_device_name(mountpoint: str) -> str | None:
    """The kernel's name of the block device mounted at ``mountpoint`` (``vda``, ``loop0``),
    from sysfs (``/proc/mounts`` may say ``/dev/root``), or ``None`` when sysfs does not say."""
    try:
        dev = os.stat(mountpoint).st_dev
        uevent = Path(f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}/uevent").read_text()
    except OSError:
        return None
    return next((ln.split("=", 1)[1] for ln in uevent.splitlines() if ln.startswith("DEVNAME=")), None)


@contextlib.contextmanager
def scratch(kind: str, prefix: str, *, defer: bool = False) -> Iterator[Path]:
    """A fresh folder on the local disk or on tmpfs, removed afterwards.

    ``defer``: removed when the bench exits instead, for runs compared back to back.
    ext4 without a journal (this VM's disk) does not reuse an inode freed in the last
    ~30 s (``recently_deleted`` in ``fs/ext4/ialloc.c``), and every later file created
    in that block group first steps over each such inode: removing the previous run's
    thousands of files just before the next run made that run's every create pay for
    them (2,000 no-op jobs: 5.5 s of system time on a fresh filesystem, 15 s right
    after the last run's removal). Which system paid depended on the order, and the
    more files a system creates, the more it paid.
    """
    base = ROOTS[kind]
    base.mkdir(parents=True, exist_ok=True)
    d = Path(tempfile.mkdtemp(prefix=f"spool-bench-{prefix}-", dir=base))
    try:
        yield d
    finally:
        if defer:
            _DEFERRED.append(d)
        else:
            rmtree(d)


#: Scratch folders left for the end of the bench (:func:`scratch` ``defer``).
_DEFERRED: list[Path] = []


@atexit.register
def remove_deferred() -> None:
    while _DEFERRED:
        rmtree(_DEFERRED.pop())


def rmtree(path: Path) -> None:
    """Remove a scratch tree (read-only files in writable folders go too)."""
    shutil.rmtree(path, ignore_errors=True)


# -- spools ----------------------------------------------------------------------------------


def make_spool(
    root: Path, settings: dict[str, dict[str, object]], asset_roots: Sequence[str] = (), *, fmt: int = 2
) -> Path:
    """A fresh spool at ``root`` whose spool.toml has the defaults plus ``settings``; ``fmt=1``
    makes it a spool of the original layout (no ``FORMAT`` file), written in format 1."""
    from spool.core import settings as spool_settings
    from spool.disk import formats
    from spool.disk.tree import Tree

    tree = Tree.at(root)
    tree.create()
    if fmt == 1:
        formats.path(root).unlink()
    # Every section and key is checked against spool's typed Config: a bad setting fails here.
    spool_settings.write(tree.config_file, {"assets": {"roots": list(asset_roots)}, **settings})
    return root


def noop_settings(**sections: dict[str, object]) -> dict[str, dict[str, object]]:
    """spool.toml settings for no-op benchmarks: no-op jobs accepted, and no poster frames
    (the thumbnail hook would run ffprobe on every no-op output, a text file)."""
    out: dict[str, dict[str, object]] = {
        "acceptance": {"allow_noop": True},
        "observe": {"thumbnail_width": 0},
    }
    for name, kv in sections.items():
        out.setdefault(name, {}).update(kv)
    return out


def noop_job(name: str, tags: dict[str, str], submitted_at: datetime) -> Any:
    """An accepted no-op job (revision 1), as the benchmarks write straight into a
    tree (``pending/``, ``complete/``) without going through acceptance."""
    import hashlib

    from spool.core.model import Expect, Output
    from spool.kinds import NoopJob

    return NoopJob(
        job_id=f"{name}@1",
        name=name,
        revision=1,
        recipe_hash=hashlib.sha256(b"null").hexdigest(),
        sources=[],
        output=Output(file=f"{name}.txt", container="txt", expect=Expect()),
        tags=tags,
        submitted_at=submitted_at,
        submitted_by="bench",
    )


def noop_submission(name: str) -> bytes:
    return json.dumps({"name": name, "operation": "noop", "tags": TAGS}).encode()


def drop(spool: Path, name: str, data: bytes) -> float:
    """Drop a submission Maildir-style (hidden temp name, then rename); returns the
    wall-clock time of the rename."""
    incoming = spool / "incoming"
    tmp = incoming / f".{name}.json.tmp"
    with open(tmp, "wb") as f:
        f.write(data)
    os.rename(tmp, incoming / f"{name}.json")
    return time.time()


def events(spool: Path) -> list[dict[str, Any]]:
    """Every journal line of every writer (``ts`` as epoch seconds)."""
    from datetime import datetime

    out = []
    for p in sorted((spool / "events").glob("*.jsonl")):
        for line in p.read_bytes().splitlines():
            try:
                ev = json.loads(line)
            except ValueError:
                continue
            ev["t"] = datetime.fromisoformat(ev["ts"].replace("Z", "+00:00")).timestamp()
            out.append(ev)
    return out


def count_json(folder: Path) -> int:
    try:
        return sum(1 for e in os.scandir(folder) if e.name.endswith(".json") and not e.name.startswith("."))
    except FileNotFoundError:
        return 0


# -- processes --------------------------------------------------------------------------------


def child_env(**extra: str) -> dict[str, str]:
    """The environment for child processes: ``tools/`` importable (peer task modules)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(TOOLS), env.get("PYTHONPATH", "")]))
    env.pop("SPOOL_DIR", None)
    env.update(extra)
    return env


def start(argv: Sequence[str], *, log_path: Path | None = None, env: dict[str, str] | None = None) -> Any:
    """Start a child in a session of its own (stopped by its pid's group, never by name)."""
    out: Any = open(log_path, "ab") if log_path else subprocess.DEVNULL  # noqa: SIM115
    try:
        return subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env or child_env(),
            start_new_session=True,
        )
    finally:
        if log_path:
            out.close()


def stop(proc: subprocess.Popen[Any], sig: int = signal.SIGTERM, timeout: float = 10.0) -> int | None:
    """Signal a child's process group, then SIGKILL it if it lingers."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return proc.returncode


def wait_all(procs: Sequence[subprocess.Popen[Any]], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    for p in procs:
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for q in procs:
                stop(q, signal.SIGKILL)
            raise RuntimeError(f"{what} did not finish within {timeout:.0f} s") from None


@dataclass(frozen=True)
class Timed:
    wall: float  # seconds
    cpu: float  # user + system seconds of the child
    returncode: int
    stdout: bytes


def run_timed(argv: Sequence[str], *, env: dict[str, str] | None = None, cwd: Path | None = None) -> Timed:
    """Run a command to the end: wall time and the child's own CPU time (os.wait4)."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        list(argv),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=env or child_env(),
        cwd=cwd,
    )
    assert proc.stdout is not None
    chunks = []
    while chunk := proc.stdout.read(1 << 16):
        chunks.append(chunk)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    proc.stdout.close()
    return Timed(wall, usage.ru_utime + usage.ru_stime, proc.returncode, b"".join(chunks))


def proc_status(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM (kB) of a live process, from /proc."""
    out = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(("VmRSS:", "VmHWM:")):
                    k, v = line.split(":", 1)
                    out[k] = int(v.split()[0])
    except FileNotFoundError:
        pass
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def redis_server(folder: Path) -> Iterator[str]:
    """A private redis-server on a loopback port, in ``folder``, without persistence
    (RQ's fastest configuration). Yields its URL; stopped by its pid afterwards."""
    exe = shutil.which("redis-server") or "/usr/bin/redis-server"
    port = free_port()
    argv = [
        exe,
        "--port",
        str(port),
        "--bind",
        "127.0.0.1",
        "--dir",
        str(folder),
        "--save",
        "",
        "--appendonly",
        "no",
        "--protected-mode",
        "yes",
        "--daemonize",
        "no",
        "--loglevel",
        "warning",
    ]
    proc = start(argv, log_path=folder / "redis.log")
    url = f"redis://127.0.0.1:{port}/0"
    try:
        import redis

        client = redis.Redis.from_url(url)
        deadline = time.monotonic() + 10
        while True:
            try:
                client.ping()
                break
            except redis.exceptions.ConnectionError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError(f"redis-server did not start (see {folder / 'redis.log'})") from None
                time.sleep(0.02)
        client.close()
        yield url
    finally:
        stop(proc)
