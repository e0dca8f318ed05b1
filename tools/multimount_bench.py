"""Figures for a spool shared through network mounts: claims per second with two hosts,
and the drop-to-claim latency under polling.

    tools/multimount up /tmp/nas            # or --cache default for sshfs's 20 s caches
    PYTHONPATH=tools .venv/bin/python tools/multimount_bench.py \\
        --mounts /tmp/nas/a,/tmp/nas/b --export /tmp/nas/export [--jobs 1000] [--drops 50]

* **claims**: ``--jobs`` noop jobs accepted on the file server's side, then one
  daemon per mount (``--drain``) races for them. Claims per second is the
  number of claims over the time from the first claim to the last, read from
  the journal; every job must be claimed and completed exactly once.
* **latency**: one daemon on the second mount (polling, as doctor chooses on a
  network mount, every ``--poll`` seconds); ``--drops`` jobs are dropped one at
  a time into ``incoming/`` through the first mount (write a hidden temp name,
  rename), at random points of the poll cycle. Latency is ``claimed_at`` in the
  attempt record minus the moment the rename returned (one machine, one clock).

Prints one line per figure, or ``--json``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import time
from collections import Counter
from datetime import datetime
from pathlib import Path

from spool.core import config, settings
from spool.disk.tree import Tree
from spool.queue import accept

BIN = Path(sys.executable).parent
TAGS = {"campaign": "bench", "locale": "en", "asset_type": "test", "visibility": "internal"}


def _spool(home: Path, name: str, poll: float, max_active: int) -> Tree:
    t = Tree.at(home / name)
    t.create()
    settings.write(
        t.config_file,
        {
            # a drop that only polling sees must stay unchanged for incoming_quiet: as short as a poll here
            "daemon": {"poll_interval": poll, "incoming_quiet": poll},
            "limits": {"max_active": max_active},
            "observe": {"metrics_dir": "", "thumbnail_width": 0},
            "acceptance": {"allow_noop": True},
        },
    )
    return t


def _daemon(spool: Path, name: str, log: Path, drain: bool) -> subprocess.Popen[bytes]:
    args = [str(BIN / "spoold"), "run", "--spool", str(spool), "--worker", name]
    with open(log, "ab") as f:
        return subprocess.Popen(
            [*args, "--drain"] if drain else args, stdout=f, stderr=subprocess.STDOUT, start_new_session=True
        )


def _ts(e: dict[str, object]) -> float:
    return datetime.fromisoformat(str(e["ts"]).replace("Z", "+00:00")).timestamp()


def claims(views: list[Path], server_home: Path, jobs: int, max_active: int, logs: Path) -> dict[str, object]:
    name = f"bench-claims-{os.getpid()}"
    server = _spool(server_home, name, 0.5, max_active)
    cfg = config.load(server.config_file)
    for i in range(jobs):
        sub = json.dumps({"name": f"c{i:05d}", "operation": "noop", "tags": TAGS}).encode()
        accept.accept_bytes(server, cfg, sub, "bench")
    t0 = time.monotonic()
    procs = [_daemon(v / name, f"bench{k}", logs / f"claims-{k}.log", True) for k, v in enumerate(views)]
    codes = [p.wait(timeout=3600) for p in procs]
    wall = time.monotonic() - t0
    events = [json.loads(x) for f in server.events.glob("*.jsonl") for x in f.read_text().splitlines()]
    claimed = [e for e in events if e["to"] == "running" and e.get("reason") == "claimed"]
    done = Counter(e["job"] for e in events if e["to"] == "complete")
    per_job = Counter(e["job"] for e in claimed)
    t = sorted(_ts(e) for e in claimed)
    out = {
        "jobs": jobs,
        "max_active": max_active,
        "exit_codes": codes,
        "claims": len(claimed),
        "claimed_twice": sum(1 for n in per_job.values() if n > 1),
        "completed": len(done),
        "completed_twice": sum(1 for n in done.values() if n > 1),
        "by_worker": dict(Counter(str(e["worker"]) for e in claimed)),
        "claims_per_second": round(len(t) / (t[-1] - t[0]), 1) if len(t) > 1 else None,
        "jobs_per_second_wall": round(jobs / wall, 1),
    }
    shutil.rmtree(server.root, ignore_errors=True)
    return out


def latency(views: list[Path], server_home: Path, drops: int, poll: float, logs: Path) -> dict[str, object]:
    name = f"bench-latency-{os.getpid()}"
    server = _spool(server_home, name, poll, 2)
    a, b = Tree.at(views[0] / name), Tree.at(views[-1] / name)
    d = _daemon(b.root, "bench-poll", logs / "latency.log", False)
    rng = random.Random(1)
    lat = []
    try:
        while "started on" not in (logs / "latency.log").read_text(errors="replace"):
            time.sleep(0.05)
        for i in range(drops):
            time.sleep(rng.uniform(0, poll))
            tmp = a.incoming / f".d{i}.json.tmp"
            tmp.write_bytes(json.dumps({"name": f"d{i:04d}", "operation": "noop", "tags": TAGS}).encode())
            os.rename(tmp, a.incoming / f"d{i:04d}.json")
            dropped = time.time()
            rec = server.attempt_dir(f"d{i:04d}@1", 1) / "attempt.json"
            deadline = time.monotonic() + 120
            while True:
                try:
                    claimed = datetime.fromisoformat(json.loads(rec.read_text())["claimed_at"]).timestamp()
                    break
                except (OSError, ValueError):
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"d{i:04d} was not claimed within 120 s") from None
                    time.sleep(0.005)
            lat.append(claimed - dropped)
    finally:
        d.send_signal(signal.SIGTERM)
        d.wait(timeout=60)
    lat.sort()
    shutil.rmtree(server.root, ignore_errors=True)
    return {
        "drops": drops,
        "poll_interval": poll,
        "median": round(statistics.median(lat), 3),
        "p99": round(lat[min(len(lat) - 1, round(0.99 * (len(lat) - 1)))], 3),
        "max": round(lat[-1], 3),
        "min": round(lat[0], 3),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mounts", required=True, help="comma-separated mounts of one shared folder")
    ap.add_argument(
        "--export", help="the same folder on the file server (setup and checks); default: first mount"
    )
    ap.add_argument("--jobs", type=int, default=1000)
    ap.add_argument("--max-active", type=int, default=2)
    ap.add_argument("--drops", type=int, default=50)
    ap.add_argument("--poll", type=float, default=2.0, help="poll_interval of the latency daemon, seconds")
    ap.add_argument("--only", choices=["claims", "latency"])
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    views = [Path(m).absolute() for m in args.mounts.split(",") if m]
    home = Path(args.export).absolute() if args.export else views[0]
    logs = Path(os.environ.get("TMPDIR", "/tmp")) / f"multimount-bench-{os.getpid()}"
    logs.mkdir(parents=True)
    out: dict[str, object] = {}
    if args.only in (None, "claims"):
        out["claims"] = claims(views, home, args.jobs, args.max_active, logs)
    if args.only in (None, "latency"):
        out["latency"] = latency(views, home, args.drops, args.poll, logs)
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        for key, fig in out.items():
            print(key, " ".join(f"{k}={v}" for k, v in fig.items()))  # type: ignore[attr-defined]
    c = out.get("claims")
    bad = isinstance(c, dict) and (c["claimed_twice"] or c["completed_twice"] or c["completed"] != c["jobs"])
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
