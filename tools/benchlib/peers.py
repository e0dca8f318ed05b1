"""The other side of the dispatch comparison: worker programs and task functions.

Run as ``python -m benchlib.peers raw DIR ME N`` or ``python -m benchlib.peers
dirq DIR``; each worker prints one JSON line: when it took its first job, when
it finished its last, and how many it did. RQ workers import :func:`noop`.
Imports stay minimal so a worker starts in the time Python itself takes.

The raw limit is spool's on-disk protocol with nothing else: a job file
written durably into ``pending/`` (temp name, fsync the file, rename, fsync
the folder), claimed by ``rename(pending/J, running/W/J)`` and finished by
``rename(running/W/J, done/J)``, each rename followed by an fsync of both
folders, exactly the fsyncs SPEC promises for a transition. No attempt
records, no store, no manifest, no journal: the floor under any durable
rename queue on this filesystem.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path


def noop(i: int) -> int:
    """The RQ (and huey) task: nothing, returned as a result the queue stores."""
    return i


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_fsynced(path: Path, data: bytes, flag: int = os.O_EXCL) -> None:
    """Write ``data`` to ``path`` (created; ``flag``: ``O_EXCL`` or ``O_TRUNC``) and fsync it."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | flag, 0o644)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


def raw_enqueue(root: Path, names: list[str], payload: bytes) -> None:
    """Durable writes into ``pending/``: temp, fsync file, rename, fsync folder."""
    pending = root / "pending"
    for name in names:
        tmp = pending / f".{name}.tmp"
        write_fsynced(tmp, payload)
        os.rename(tmp, pending / name)
        fsync_dir(pending)


def raw_worker(root: Path, me: int, workers: int) -> dict[str, float | int | None]:
    pending, done = root / "pending", root / "done"
    running = root / "running" / f"w{me}"
    running.mkdir(parents=True, exist_ok=True)
    first = last = None
    n = 0
    while True:
        names = sorted(x for x in os.listdir(pending) if not x.startswith("."))
        if not names:
            break
        k = len(names) * me // workers  # start at my share: the best case for the limit
        for name in names[k:] + names[:k]:
            src, mine = pending / name, running / name
            try:
                os.rename(src, mine)
            except FileNotFoundError:
                continue  # another worker won it
            if first is None:
                first = time.time()
            fsync_dir(running)
            fsync_dir(pending)
            with open(mine, "rb") as f:  # the "job": read it
                f.read()
            os.rename(mine, done / name)
            fsync_dir(done)
            fsync_dir(running)
            n += 1
            last = time.time()
    return {"first": first, "last": last, "count": n}


def dirq_worker(root: Path) -> dict[str, float | int | None]:
    from dirq.QueueSimple import QueueSimple

    q = QueueSimple(str(root / "dirq"))
    first = last = None
    n = 0
    while q.count():
        for name in q:
            if not q.lock(name):
                continue
            if first is None:
                first = time.time()
            q.get(name)
            q.remove(name)
            n += 1
            last = time.time()
    return {"first": first, "last": last, "count": n}


def main(argv: list[str]) -> int:
    kind, root = argv[0], Path(argv[1])
    if kind == "raw":
        out = raw_worker(root, int(argv[2]), int(argv[3]))
    elif kind == "dirq":
        out = dirq_worker(root)
    else:
        print(f"unknown worker kind {kind!r}", file=sys.stderr)
        return 2
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
