#!/usr/bin/env python3
"""genbench: N generation jobs through one real daemon against the provider simulator.

Makes a fresh spool in ``--dir``, starts tools/provsim.py in-process (every
generation takes ``--work`` seconds), drops N generation jobs into
``incoming/`` and runs ``spoold run --drain`` with an ``in_flight`` allowance
of N, sampling the daemon's threads and RSS from /proc. Prints one JSON line:
create requests the provider received (must equal N), peak threads, peak RSS,
peak generations waiting at once, polls per job, and the handoff latency
(provider success seen -> indexed) from the journal.

    .venv/bin/python tools/genbench.py --jobs 300 --work 20
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

from provsim import ProviderSim  # tools/ is this script's folder

BIN = Path(sys.executable).parent
TOKEN = "genbench-token-5d1e"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=100)
    ap.add_argument("--work", type=float, default=20.0, help="seconds each generation takes")
    ap.add_argument("--dir", type=Path, default=Path("/tmp/genbench"))
    args = ap.parse_args(argv)
    n = args.jobs
    root = args.dir / "spool"
    shutil.rmtree(root, ignore_errors=True)
    args.dir.mkdir(parents=True, exist_ok=True)
    subprocess.run([str(BIN / "spool"), "init", str(root)], check=True, capture_output=True)
    sim = ProviderSim(token=TOKEN, work=args.work).start()
    with open(root / "spool.toml", "a") as f:
        f.write(
            f'\n[providers.sim]\nkind = "replicate"\nbase_url = "{sim.url}"\ntoken_env = "GENBENCH_TOKEN"\n'
            f'in_flight = {n}\ndeadline = "1h"\n'
            f"[providers.sim.spending]\nper_hour = {n}\nper_day = {n}\n"
            "[providers.sim.polling]\nfirst = 5\nbase = 1\nceiling = 5\n"
        )
    tags = {"campaign": "bench", "locale": "en", "asset_type": "ad", "visibility": "internal"}
    for i in range(n):
        sub = {
            "name": f"g{i:05d}",
            "operation": "generate",
            "generate": {"provider": "sim", "model": "acme/video-1", "input": {"prompt": f"clip {i}"}},
            "tags": tags,
        }
        (root / "incoming" / f"g{i}.json").write_text(json.dumps(sub))
    started = time.monotonic()
    with open(args.dir / "spoold.log", "w") as logf:
        proc = subprocess.Popen(
            [str(BIN / "spoold"), "run", "--spool", str(root), "--worker", "bench", "--drain"],
            env={**os.environ, "GENBENCH_TOKEN": TOKEN},
            stdout=logf,
            stderr=subprocess.STDOUT,
        )
        threads = rss = waiting = 0
        while proc.poll() is None:
            try:
                status = Path(f"/proc/{proc.pid}/status").read_text()
                threads = max(threads, int(status.split("Threads:")[1].split()[0]))
                rss = max(rss, int(status.split("VmRSS:")[1].split()[0]))
            except (OSError, IndexError, ValueError):
                pass
            waiting = max(waiting, sum(1 for _ in root.glob("attempts/*/*/gen/state.2-generating")))
            time.sleep(0.5)
    wall = time.monotonic() - started
    stats = sim.stats()
    sim.stop()
    polls = [json.loads(p.read_text())["polls"] for p in root.glob("attempts/*/*/gen/poll.json")]
    seen: dict[str, dict[str, float]] = {}
    for f in root.glob("events/**/*.jsonl"):
        for line in f.read_text().splitlines():
            e = json.loads(line)
            seen.setdefault(e["job"], {})[e["to"]] = datetime.fromisoformat(e["ts"]).timestamp()
    handoff = sorted(v["gen.indexed"] - v["gen.retrieving"] for v in seen.values() if "gen.indexed" in v)

    def q(p: float) -> float:
        return round(handoff[min(len(handoff) - 1, int(p * len(handoff)))], 2) if handoff else -1.0

    print(
        json.dumps(
            {
                "jobs": n,
                "work_s": args.work,
                "complete": sum(1 for _ in (root / "complete").glob("*.json")),
                "creates": stats.get("create", 0),
                "polls_per_job": round(sum(polls) / max(1, len(polls)), 2),
                "peak_threads": threads,
                "peak_rss_mib": round(rss / 1024, 1),
                "peak_waiting_at_provider": waiting,
                "handoff_p50_s": q(0.5),
                "handoff_p99_s": q(0.99),
                "wall_s": round(wall, 1),
            }
        )
    )
    return 0 if stats.get("create", 0) == n else 1


if __name__ == "__main__":
    raise SystemExit(main())
