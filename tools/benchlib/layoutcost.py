"""What a tree layout costs a file server: one job's file operations alone, counted.

A daemon's requests a job (``tools/bench nasdispatch``) mix the layout's own file
operations with the daemon's loop (listings, the journal, heartbeats, the library's
segments). This module replays only the former, in one process, for a layout given as
a sequence of operations, on a traced sshfs mount (``tools/multimount --trace``), and
counts the SFTP requests they send: deterministic to a tenth of a request, so two
layouts can be compared before either is built (docs/benchmarks.md, 2026-12-04).

:data:`LAYOUTS` holds format 2 as it is written today and a leaner one (issue 25's
format 3 direction): the drop read before its claim and claimed straight into its job
folder, the job written once as its frozen copy and linked into ``pending/``, the
attempt folder made in place with the output beside its record (no staging folder, no
``work/``). :func:`floor` is the least
SPEC's tree allows: the ceiling the others are held against. Usage::

    python -m benchlib.layoutcost MOUNT_BASE JOBS                  # requests a job, traced mount
    python -m benchlib.layoutcost rate MOUNT JOBS THREADS LAYOUT... # jobs/s of the operations alone
"""

from __future__ import annotations

import hashlib
import os
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from benchlib.nas import sftp_log, sftp_requests

SUBMISSION = b'{"name": "x", "operation": "noop"}'
JOB = b'{"job_id": "x@1", "operation": "noop", "padding": "' + b"p" * 600 + b'"}'
OUTPUT = b"noop output\n"
MANIFEST = b'{"manifest": "' + b"m" * 1500 + b'"}'


def _new(path: Path, data: bytes, *, sync: bool = True, mode: int | None = None) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        os.write(fd, data)
        if mode is not None:
            os.fchmod(fd, mode)
        if sync:
            os.fsync(fd)
    finally:
        os.close(fd)


def _read(path: Path) -> bytes:
    with open(path, "rb", buffering=0) as f:
        return f.read()


def _seal(path: Path) -> None:
    """What ``store.put`` does to a candidate through one open: read it (the hash), make it
    read-only and fsync it."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.read(fd, 1 << 16)
        os.fchmod(fd, 0o444)
        os.fsync(fd)
    finally:
        os.close(fd)


def _object(spool: Path, i: int) -> Path:
    h = hashlib.sha256(b"%d" % i).hexdigest()
    return spool / "store" / "sha256" / h[:2] / f"{h}.txt"


def make(spool: Path, jobs: int) -> None:
    """The folders a layout needs and ``jobs`` drops in ``incoming/`` (not counted)."""
    for d in ("incoming", "pending", "running/w", "complete", "attempts", "manifests"):
        (spool / d).mkdir(parents=True)
    for k in range(256):
        (spool / "store" / "sha256" / f"{k:02x}").mkdir(parents=True)
    for i in range(jobs):
        (spool / "incoming" / f"d{i}.json").write_bytes(SUBMISSION)


def format2(spool: Path, i: int) -> None:
    """Format 2 as written today, over FUSE (no unnamed files: temp names)."""
    inc, jid = spool / "incoming", f"j{i}@1"
    claimed = inc / f".accepting.w.d{i}.json"
    os.rename(inc / f"d{i}.json", claimed)
    _read(claimed)
    jobs = spool / "attempts" / jid
    os.mkdir(jobs)
    temp = spool / "pending" / f".{jid}.json.h.1.tmp"
    _new(temp, JOB)
    os.link(temp, spool / "pending" / f"{jid}.json")
    os.unlink(temp)
    os.link(spool / "pending" / f"{jid}.json", jobs / "job.json")
    os.rename(claimed, jobs / "submission.json")
    running = spool / "running" / "w" / f"{jid}.json"
    os.rename(spool / "pending" / f"{jid}.json", running)
    _read(running)
    (jobs / "cancel.json").exists()
    staging = jobs / ".new.h.1.x"
    os.mkdir(staging)
    os.mkdir(staging / "work")
    _new(staging / "attempt.json", b"{}", sync=False)
    os.rename(staging, jobs / "1")
    out = jobs / "1" / "work" / f"{jid}.txt"
    _new(out, OUTPUT, sync=False)
    _read(out)  # the gate
    _seal(out)  # store.put
    os.link(out, _object(spool, i))
    _new(jobs / "1" / "result.json", MANIFEST, mode=0o444)
    (jobs / "cancel.json").exists()
    os.link(jobs / "1" / "result.json", spool / "manifests" / f"{jid}.json")
    os.rename(running, spool / "complete" / f"{jid}.json")


def leaner(spool: Path, i: int) -> None:
    """Fewer names a job: see the module docstring."""
    inc, jid = spool / "incoming", f"j{i}@1"
    _read(inc / f"d{i}.json")  # read before the claim, which names the job folder
    jobs = spool / "attempts" / jid
    os.mkdir(jobs)
    os.rename(inc / f"d{i}.json", jobs / "submission.json")
    _new(jobs / "job.json", JOB, mode=0o444)
    os.link(jobs / "job.json", spool / "pending" / f"{jid}.json")
    running = spool / "running" / "w" / f"{jid}.json"
    os.rename(spool / "pending" / f"{jid}.json", running)
    os.mkdir(jobs / "1")
    _new(jobs / "1" / "attempt.json", b"{}", sync=False)
    out = jobs / "1" / f"{jid}.txt"
    _new(out, OUTPUT, mode=0o444)  # hashed as it is written
    _read(out)  # the gate
    os.link(out, _object(spool, i))
    _new(jobs / "1" / "result.json", MANIFEST, mode=0o444)
    os.link(jobs / "1" / "result.json", spool / "manifests" / f"{jid}.json")
    os.rename(running, spool / "complete" / f"{jid}.json")


def floor(spool: Path, i: int) -> None:
    """The least any layout keeping SPEC's tree can do for one job: each name SPEC
    sections 1, 3 and 5 require, made once, under its final name, and nothing else
    (no temp name, no staging folder, no frozen copy or kept submission, no
    ``result.json`` beside the manifest, the claimed file not read back: the acceptor
    has the job in hand). The drop is read where it lies and removed; the job file is
    written once into ``pending/`` and fsynced; the candidate is read once (the gate
    and the hash in one read) and fsynced before its store link; the manifest is
    fsynced before the move to ``complete/``. What a batch shares (folder fsyncs, the
    journal's lines, the library's segment) is left out: it can be spread over many
    jobs. Not a layout anyone should ship (a power cut may lose a claim or leave a
    torn job file unnoticed): a floor to hold the others against."""
    inc, jid = spool / "incoming", f"j{i}@1"
    _read(inc / f"d{i}.json")
    os.unlink(inc / f"d{i}.json")
    _new(spool / "pending" / f"{jid}.json", JOB)
    running = spool / "running" / "w" / f"{jid}.json"
    os.rename(spool / "pending" / f"{jid}.json", running)
    jobs = spool / "attempts" / jid
    os.mkdir(jobs)
    os.mkdir(jobs / "1")
    _new(jobs / "1" / "attempt.json", b"{}", sync=False)
    os.mkdir(jobs / "1" / "work")
    out = jobs / "1" / "work" / f"{jid}.txt"
    _new(out, OUTPUT, sync=False)
    _seal(out)  # the gate and the hash in the same read
    os.link(out, _object(spool, i))
    _new(spool / "manifests" / f"{jid}.json", MANIFEST, mode=0o444)
    os.rename(running, spool / "complete" / f"{jid}.json")


LAYOUTS: dict[str, Callable[[Path, int], None]] = {"format 2": format2, "leaner": leaner, "floor": floor}


def count(base: Path, layout: str, jobs: int, settle: float = 2.5) -> Counter[str]:
    """SFTP requests, by type, that ``jobs`` jobs of ``layout`` send through the traced
    instance at ``base`` (its mount ``base/a``); the setup is not counted, and FUSE's
    one-second caches expire before the first job, as a daemon's would between jobs."""
    spool = base / "a" / f"layout-{layout.replace(' ', '')}-{time.time_ns()}"
    make(spool, jobs)
    time.sleep(settle)
    log = sftp_log(base)
    before = sftp_requests(log)
    step = LAYOUTS[layout]
    for i in range(jobs):
        step(spool, i)
    time.sleep(1.5)  # FUSE sends a closed file's CLOSE after close(2) returns
    return sftp_requests(log) - before


def rate(mount: Path, layout: str, jobs: int, threads: int) -> float:
    """Jobs a second that ``threads`` threads reach replaying ``layout`` alone over
    ``mount`` (each thread whole jobs, one after another): what the file operations
    cost in time with no daemon around them, the ceiling of any daemon writing that
    layout on that mount with that much concurrency."""
    spool = mount / f"rate-{layout.replace(' ', '')}-{time.time_ns()}"
    make(spool, jobs)
    time.sleep(2.5)  # FUSE's one-second caches expire, as between a daemon's jobs
    step = LAYOUTS[layout]
    todo = iter(range(jobs))
    lock = threading.Lock()

    def work() -> None:
        while True:
            with lock:
                i = next(todo, None)
            if i is None:
                return
            step(spool, i)

    t0 = time.perf_counter()
    pool = [threading.Thread(target=work) for _ in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    return jobs / (time.perf_counter() - t0)


def main(argv: list[str]) -> int:
    if argv[0] == "rate":  # rate MOUNT JOBS THREADS LAYOUT...
        mount, jobs, threads = Path(argv[1]), int(argv[2]), int(argv[3])
        for name in argv[4:]:
            print(f"{name}: {rate(mount, name, jobs, threads):.1f} jobs/s with {threads} thread(s)")
        return 0
    base, jobs = Path(argv[0]), int(argv[1])
    for name in LAYOUTS:
        got = count(base, name, jobs)
        kinds = ", ".join(f"{k} {v / jobs:.1f}" for k, v in got.most_common())
        print(f"{name}: {sum(got.values()) / jobs:.1f} requests a job ({kinds})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
