"""Dispatch: no-op jobs through each system's whole durable life, jobs per second.

Every run of every system has two timed parts, and the figure is
``N / (enqueue + work)``:

* **enqueue**: the producer hands the system N jobs, with no worker running.
  spool: N submissions dropped into ``incoming/`` Maildir-style (a temp name,
  then a rename; durability comes later, at acceptance). raw: N job files
  written durably into ``pending/``. dirq: ``QueueSimple.add``. huey: N task
  calls (each an fsynced SQLite insert). RQ: N ``Queue.enqueue`` calls.
* **work**: from the first job taken to the last job done, by the system's own
  records: spool's journal (first acceptance to last ``complete``; acceptance,
  claim, attempt records, the store, the manifest and the move to complete all
  happen in here), the timestamps huey's tasks return, RQ's ``started_at`` /
  ``ended_at``, the raw and dirq workers' own clocks. Process start-up is left
  out for every system alike (it is in the JSON output as ``wall``).

spool runs as it is deployed: real ``spoold run --drain`` processes, one per
worker (``max_active = 1`` each, so N workers run N jobs at once, like huey's
``-w N`` and N RQ workers, like for like); an extra row per filesystem runs
the 2 daemons with ``max_active = 4`` each: no-op jobs spend their time
waiting on fsync, and slots overlap those waits. Systems run interleaved, order rotated each round; the
ratio is the median of the per-round ratios.
"""

from __future__ import annotations

import json
import signal
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from .common import (
    BIN,
    PY,
    ROOTS,
    SPOOLD,
    Row,
    child_env,
    comparable_ratios,
    count_json,
    events,
    fs_type,
    fsync_probe,
    interleave,
    log,
    make_spool,
    median,
    noop_settings,
    noop_submission,
    scratch,
    start,
    stop,
    wait_all,
)
from .common import (
    drop as drop_submission,
)
from .peers import raw_enqueue

PAYLOAD = b'{"name": "noop", "operation": "noop", "tags": {"campaign": "bench"}}'

#: Targets of issue 7 (2 workers, local disk: the fully durable case).
TARGETS = {"huey": 1.0, "rq": 3.0, "raw": 0.5}

PEERS = {
    "raw": "raw rename limit",
    "dirq": "dirq QueueSimple",
    "huey": "huey SqliteHuey",
    "rq": "RQ + redis-server",
}

#: The peer column of the side-by-side rows: the same spool on a tree of the old layout.
FORMAT1 = "spool, tree format 1"

PEER_NOTES = {
    "raw": "raw: rename(pending->running/W->done) with spool's fsyncs, per job and never shared "
    "(file + folder at enqueue, by one producer; both folders at each rename: 6 a job); no records, "
    "store or journal. A rate bound by fsync latency alone, so its ratio is only read from rounds "
    "whose runs saw the same latency (the fsync probe)",
    "dirq": "dirq 1.8 QueueSimple (add; lock+get+remove): it never fsyncs, so it is not durable",
    "huey": "huey 3.5 SqliteHuey, WAL + synchronous=FULL (fsync=True), results stored; "
    "huey_consumer -k process -w N",
    "format1": "spool, tree format 1: the same code on a spool without a FORMAT file (made before "
    "issue 25), which it writes in the old layout; spool's own column is format 2",
    "rq": "RQ 3.0, redis-server on loopback without persistence (not durable), results kept; "
    "N rq worker --burst -w SimpleWorker processes",
}


@dataclass
class Run:
    n: int
    enqueue: float
    work: float
    wall: float
    #: the filesystem's fsync latency (ms) just before the run (:func:`common.fsync_probe`)
    fsync_ms: float = 0.0

    @property
    def rate(self) -> float:
        return self.n / (self.enqueue + self.work)


def _spool(kind: str, workers: int, n: int, max_active: int = 1, fmt: int = 2) -> Run:
    """spool's run; ``fmt=1``: the tree of format 1 (no FORMAT file: a spool made before
    issue 25), which the daemons write in the old layout, for the side-by-side rows."""
    with scratch(kind, "dispatch-spool", defer=True) as d:
        return spool_at(d, workers, n, max_active, fmt)


def spool_at(d: Path, workers: int, n: int, max_active: int = 1, fmt: int = 2) -> Run:
    """One spool run in the empty folder ``d`` (a scratch folder, or one on a mount)."""
    root = make_spool(
        d / "spool",
        noop_settings(limits={"max_active": max_active}),
        fmt=fmt,
    )
    subs = [(f"noop-{i:06d}", noop_submission(f"noop-{i:06d}")) for i in range(n)]
    t0 = time.perf_counter()
    for name, data in subs:
        drop_submission(root, name, data)
    enqueue = time.perf_counter() - t0
    t1 = time.perf_counter()
    procs = [
        start(
            [SPOOLD, "run", "--spool", str(root), "--worker", f"bench{k}", "--drain"],
            log_path=d / f"spoold-{k}.log",
        )
        for k in range(workers)
    ]
    wait_all(procs, timeout=600, what="spoold --drain")
    wall = time.perf_counter() - t1
    done = count_json(root / "complete")
    if done != n or any(p.returncode for p in procs):
        tail = (d / "spoold-0.log").read_text(errors="replace")[-2000:]
        raise RuntimeError(f"spool completed {done} of {n} no-op jobs; spoold log ends:\n{tail}")
    evs = events(root)
    first = min(e["t"] for e in evs)
    last = max(e["t"] for e in evs if e.get("to") == "complete")
    return Run(n, enqueue, last - first, wall)


def _worker_window(outs: list[Path]) -> tuple[float, float, int]:
    reports = [json.loads(p.read_text().strip().splitlines()[-1]) for p in outs]
    firsts = [r["first"] for r in reports if r["first"] is not None]
    lasts = [r["last"] for r in reports if r["last"] is not None]
    return min(firsts), max(lasts), sum(r["count"] for r in reports)


def _raw(kind: str, workers: int, n: int) -> Run:
    with scratch(kind, "dispatch-raw", defer=True) as d:
        for sub in ("pending", "running", "done"):
            (d / sub).mkdir()
        names = [f"noop-{i:06d}.json" for i in range(n)]
        t0 = time.perf_counter()
        raw_enqueue(d, names, PAYLOAD)
        enqueue = time.perf_counter() - t0
        t1 = time.perf_counter()
        outs = [d / f"w{k}.out" for k in range(workers)]
        procs = [
            start([PY, "-m", "benchlib.peers", "raw", str(d), str(k), str(workers)], log_path=outs[k])
            for k in range(workers)
        ]
        wait_all(procs, timeout=600, what="raw workers")
        wall = time.perf_counter() - t1
        first, last, count = _worker_window(outs)
        if count != n or count_json(d / "done") != n:
            raise RuntimeError(f"raw workers finished {count} of {n}")
        return Run(n, enqueue, last - first, wall)


def _dirq(kind: str, workers: int, n: int) -> Run:
    from dirq.QueueSimple import QueueSimple

    with scratch(kind, "dispatch-dirq", defer=True) as d:
        q = QueueSimple(str(d / "dirq"))
        t0 = time.perf_counter()
        for _ in range(n):
            q.add(PAYLOAD)
        enqueue = time.perf_counter() - t0
        t1 = time.perf_counter()
        outs = [d / f"w{k}.out" for k in range(workers)]
        procs = [
            start([PY, "-m", "benchlib.peers", "dirq", str(d)], log_path=outs[k]) for k in range(workers)
        ]
        wait_all(procs, timeout=600, what="dirq workers")
        wall = time.perf_counter() - t1
        first, last, count = _worker_window(outs)
        if count != n:
            raise RuntimeError(f"dirq workers finished {count} of {n}")
        return Run(n, enqueue, last - first, wall)


def _huey(kind: str, workers: int, n: int) -> Run:
    from .hueyapp import make

    with scratch(kind, "dispatch-huey", defer=True) as d:
        db = d / "huey.db"
        h, task = make(str(db))
        t0 = time.perf_counter()
        for i in range(n):
            task(i)
        enqueue = time.perf_counter() - t0
        t1 = time.perf_counter()
        consumer = start(
            [str(BIN / "huey_consumer"), "benchlib.hueyapp.huey", "-w", str(workers), "-k", "process"],
            log_path=d / "consumer.log",
            env=child_env(BENCH_HUEY_DB=str(db)),
        )
        deadline = time.monotonic() + 600
        try:
            while h.storage.result_store_size() < n:
                if consumer.poll() is not None or time.monotonic() > deadline:
                    tail = (d / "consumer.log").read_text(errors="replace")[-2000:]
                    raise RuntimeError(f"huey consumer stopped early; its log ends:\n{tail}")
                time.sleep(0.02)
            wall = time.perf_counter() - t1
        finally:
            stop(consumer, signal.SIGINT)
        times = [float(h.serializer.deserialize(v)) for v in h.storage.result_items().values()]
        # A task returns when it ran; the dequeue before it and the result write after
        # it are each one SQLite commit (well under a millisecond): the window is
        # first task run to last task run.
        return Run(n, enqueue, max(times) - min(times), wall)


def _epoch(t: datetime) -> float:
    return (t if t.tzinfo else t.replace(tzinfo=UTC)).timestamp()


def _rq(url: str, workers: int, n: int) -> Run:
    import redis
    from rq import Queue
    from rq.job import Job

    r = redis.Redis.from_url(url)
    r.flushall()
    q = Queue("bench", connection=r)
    t0 = time.perf_counter()
    ids = [q.enqueue("benchlib.peers.noop", i).id for i in range(n)]
    enqueue = time.perf_counter() - t0
    t1 = time.perf_counter()
    argv = [str(BIN / "rq"), "worker", "--burst", "-w", "rq.worker.SimpleWorker", "-u", url, "bench"]
    procs = [start(argv) for _ in range(workers)]
    wait_all(procs, timeout=600, what="rq workers")
    wall = time.perf_counter() - t1
    jobs = [j for j in Job.fetch_many(ids, connection=r) if j is not None]
    done = [j for j in jobs if j.ended_at is not None and j.started_at is not None]
    if len(done) != n:
        raise RuntimeError(f"RQ finished {len(done)} of {n}")
    first = min(_epoch(j.started_at) for j in done if j.started_at)
    last = max(_epoch(j.ended_at) for j in done if j.ended_at)
    r.flushall()
    r.close()
    return Run(n, enqueue, last - first, wall)


def _probed(kind: str, runner: Any) -> Any:
    """``runner`` run just after an fsync probe of its filesystem, the probe kept in its Run."""

    def run() -> Run:
        ROOTS[kind].mkdir(parents=True, exist_ok=True)
        ms = fsync_probe(ROOTS[kind])
        out: Run = runner()
        out.fsync_ms = ms
        return out

    return run


def _probe_note(spool: list[float], peer: list[float], left_out: int) -> str:
    """What the fsync probes say about a row's pairs (empty when every pair was comparable)."""
    if not left_out:
        return ""

    def ms(xs: list[float]) -> str:
        return ", ".join(f"{p:.2f}" for p in xs)

    seen = f"fsync probe (ms) spool {ms(spool)}, peer {ms(peer)}"
    if left_out == len(spool):
        return f"no round's two runs saw the same fsync latency (within 2x): all pairs, unreliable; {seen}"
    return f"{left_out} of {len(spool)} rounds left out: fsync latency differed more than 2x; {seen}"


def keys(mode: str) -> list[str]:
    """The rows this measure promises (the smoke test checks every one is printed)."""
    out = [f"dispatch.{k}.w{w}.{p}" for k in ("disk", "tmpfs") for w in (1, 2) for p in (*PEERS, "format1")]
    return [*out, *(f"dispatch.{k}.w2x4.{p}" for k in ("disk", "tmpfs") for p in ("huey", "format1"))]


def run(mode: str, redis_url: str) -> tuple[list[Row], list[str]]:
    n, rounds = {"full": (500, 5), "quick": (200, 3), "smoke": (25, 1)}[mode]
    rows: list[Row] = []
    for kind in ("disk", "tmpfs"):
        fs = fs_type(ROOTS[kind])
        for workers in (1, 2):
            log(f"dispatch: {kind} ({fs}), {workers} worker(s), {n} jobs x {rounds} rounds")
            runners: dict[str, Any] = {
                "spool": lambda k=kind, w=workers: _spool(k, w, n),
                "raw": lambda k=kind, w=workers: _raw(k, w, n),
                "dirq": lambda k=kind, w=workers: _dirq(k, w, n),
                "huey": lambda k=kind, w=workers: _huey(k, w, n),
                "rq": lambda w=workers: _rq(redis_url, w, n),
            }
            runners["spool_f1"] = lambda k=kind, w=workers: _spool(k, w, n, fmt=1)
            extra = workers == 2
            if extra:
                runners["spool2x4"] = lambda k=kind: _spool(k, 2, n, max_active=4)
                runners["spool2x4_f1"] = lambda k=kind: _spool(k, 2, n, max_active=4, fmt=1)
            runners = {name: _probed(kind, fn) for name, fn in runners.items()}
            res: dict[str, list[Run]] = interleave(rounds, runners)
            probes = {name: [r.fsync_ms for r in runs] for name, runs in res.items()}
            rates = {name: [r.rate for r in runs] for name, runs in res.items()}
            for name, runs in res.items():
                enq, work, wall = (median([getattr(r, a) for r in runs]) for a in ("enqueue", "work", "wall"))
                log(
                    f"  {name:8} {median(rates[name]):8.0f} jobs/s"
                    f"  (enqueue {enq:.3f} s, work {work:.3f} s, wall {wall:.2f} s,"
                    f" fsync probe {', '.join(f'{p:.2f}' for p in probes[name])} ms)"
                )
            label = f"dispatch {workers}w {kind} ({fs})"
            for peer, peer_label in PEERS.items():
                target = TARGETS.get(peer) if (kind == "disk" and workers == 2) else None
                pairs, left_out = comparable_ratios(
                    rates["spool"], rates[peer], probes["spool"], probes[peer]
                )
                ratio = median(pairs)
                rows.append(
                    Row(
                        key=f"dispatch.{kind}.w{workers}.{peer}",
                        measure=label,
                        unit="jobs/s",
                        spool=median(rates["spool"]),
                        peer=peer_label,
                        peer_value=median(rates[peer]),
                        ratio=ratio,
                        target=f">= {target:g}x" if target is not None else "",
                        met=(ratio >= target) if target is not None else None,
                        note=_probe_note(probes["spool"], probes[peer], left_out),
                        samples={k: [r.__dict__ for r in v] for k, v in res.items() if k in ("spool", peer)},
                    )
                )
            rows.append(
                Row(
                    key=f"dispatch.{kind}.w{workers}.format1",
                    measure=label,
                    unit="jobs/s",
                    spool=median(rates["spool"]),
                    peer=FORMAT1,
                    peer_value=median(rates["spool_f1"]),
                    ratio=median(
                        comparable_ratios(
                            rates["spool"], rates["spool_f1"], probes["spool"], probes["spool_f1"]
                        )[0]
                    ),
                    samples={k: [r.__dict__ for r in res[k]] for k in ("spool", "spool_f1")},
                )
            )
            if extra:
                rows.append(
                    Row(
                        key=f"dispatch.{kind}.w2x4.format1",
                        measure=f"dispatch 2w x max_active 4 {kind} ({fs})",
                        unit="jobs/s",
                        spool=median(rates["spool2x4"]),
                        peer=FORMAT1,
                        peer_value=median(rates["spool2x4_f1"]),
                        ratio=median(
                            comparable_ratios(
                                rates["spool2x4"],
                                rates["spool2x4_f1"],
                                probes["spool2x4"],
                                probes["spool2x4_f1"],
                            )[0]
                        ),
                        samples={k: [r.__dict__ for r in res[k]] for k in ("spool2x4", "spool2x4_f1")},
                    )
                )
                rows.append(
                    Row(
                        key=f"dispatch.{kind}.w2x4.huey",
                        measure=f"dispatch 2w x max_active 4 {kind} ({fs})",
                        unit="jobs/s",
                        spool=median(rates["spool2x4"]),
                        peer=PEERS["huey"],
                        peer_value=median(rates["huey"]),
                        ratio=median(
                            comparable_ratios(
                                rates["spool2x4"], rates["huey"], probes["spool2x4"], probes["huey"]
                            )[0]
                        ),
                        samples={k: [r.__dict__ for r in res[k]] for k in ("spool2x4", "huey")},
                    )
                )
    notes = [
        f"dispatch: {n} no-op jobs per run, {rounds} rounds interleaved; jobs/s = N / (enqueue + work), "
        "work = first job taken to last job done by the system's own records, process start-up excluded "
        "for every system; spool's figure includes acceptance (its enqueue is a non-durable drop).",
        "dispatch: spool = N spoold run --drain processes with max_active = 1 each "
        "(the 'x max_active 4' rows: 4 slots per daemon); targets apply to 2 workers on the local disk.",
        "dispatch: before each run, an fsync probe (median of 9 x write + fsync a file + fsync its "
        "folder) on the run's filesystem; a pair of runs is compared only when their probes agree within "
        "2x (a row's note says when rounds were left out). A peer that only fsyncs (raw, huey) slows "
        "with the disk's latency far more than spool does, so a pair taken across a busy moment of "
        "the shared disk reads several times off.",
        *PEER_NOTES.values(),
    ]
    return rows, notes
