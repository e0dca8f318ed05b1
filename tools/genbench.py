#!/usr/bin/env python3
"""genbench: N generations in flight in one real daemon against the provider simulator.

Makes a fresh spool in ``--dir``, starts tools/provsim.py in-process, drops N
generation jobs into ``incoming/`` and runs ``spoold run`` with an
``in_flight`` allowance of N. ``--complete K`` of them finish at the provider
(each after a random ``--work-min``..``--work-max`` seconds from its create);
the others never finish, so N stay in flight for the whole run. Once the K
are indexed (or ``--max-seconds`` pass) the daemon is stopped with SIGTERM.

Side by side in the same run, a naive poller (a thread of this process, with
spool's own HTTP client) polls the K finishing provider jobs at a fixed
``--interval``, from their create until it sees them final.

Printed (one JSON object): create requests the provider received (must be
N), the time to admit all N, peak generations waiting at the provider, the
daemon's peak threads and peak RSS (VmHWM), its CPU per poll (all of its CPU
while it polls, divided by its polls), polls per completed job against the
minimum the backoff allows (one poll at ``first``, then one per ``ceiling``
until the completion), and provider-completion -> seen / -> indexed latency
(median, p99); for the naive poller: polls per job, CPU per poll, completion
-> seen, and the request rate it would need for all N.

    .venv/bin/python tools/genbench.py --jobs 10000 --complete 400
"""

from __future__ import annotations

import argparse
import heapq
import json
import math
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from provsim import ProviderSim

from spool.kinds.generate.providers import ProviderError, open_provider, parse_provider

BIN = Path(sys.executable).parent
TOKEN = "genbench-token-5d1e"
WORKER = "bench"


def q(values: list[float], p: float) -> float:
    if not values:
        return -1.0
    values = sorted(values)
    return round(values[min(len(values) - 1, int(p * len(values)))], 2)


def proc_cpu(pid: int) -> float:
    """User + system CPU seconds of a process (not its children)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Naive:
    """A fixed-interval poller of the finishing provider jobs (a thread of this process)."""

    def __init__(self, sim: ProviderSim, interval: float) -> None:
        self.sim = sim
        self.interval = interval
        cfg = parse_provider("sim", {"kind": "replicate", "base_url": sim.url, "token_env": "T"})
        self.client = open_provider(cfg, env={"T": TOKEN})
        self.polls = 0
        self.cpu = 0.0
        self.per: dict[str, int] = {}  # polls of each job not yet seen final
        self.done_polls = 0  # polls of the jobs seen final
        self.seen: list[float] = []  # provider completion -> seen, seconds
        self.jobs = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="naive", daemon=True)

    def start(self) -> Naive:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)
        self.client.close()

    def _run(self) -> None:
        st = self.sim.state
        known = 0
        heap: list[tuple[float, str]] = []
        while not self._stop.is_set():
            with st.lock:
                fresh = st.order[known:]
                known = len(st.order)
                news = [(j.created, j.id, j.work) for i in fresh if "never" not in (j := st.jobs[i]).faults]
            for created, jid, _work in news:
                heapq.heappush(heap, (created + self.interval, jid))
                self.jobs += 1
            now = time.time()
            while heap and heap[0][0] <= now and not self._stop.is_set():
                due, jid = heapq.heappop(heap)
                c0 = time.thread_time()
                try:
                    job = self.client.get(jid)
                except ProviderError:
                    job = None
                self.cpu += time.thread_time() - c0
                self.polls += 1
                self.per[jid] = self.per.get(jid, 0) + 1
                if job is not None and job.final:
                    self.done_polls += self.per.pop(jid)
                    sj = st.jobs[jid]
                    self.seen.append(max(0.0, time.time() - (sj.created + sj.work)))
                else:
                    heapq.heappush(heap, (due + self.interval, jid))
                now = time.time()
            self._stop.wait(0.05)


def heartbeat_pool(root: Path) -> int:
    try:
        beat = json.loads(next((root / "workers").glob(f"*-{WORKER}.json")).read_text())
        return int(beat.get("pools", {}).get("provider:sim", {}).get("active", 0))
    except (OSError, ValueError, StopIteration):
        return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=1000, help="generations in flight (N)")
    ap.add_argument("--complete", type=int, default=100, help="of them, how many finish (K)")
    ap.add_argument("--work-min", type=float, default=120.0)
    ap.add_argument("--work-max", type=float, default=480.0)
    ap.add_argument("--first", type=float, default=60.0, help="polling.first")
    ap.add_argument("--ceiling", type=float, default=60.0, help="polling.ceiling")
    ap.add_argument("--interval", type=float, default=10.0, help="the naive poller's fixed interval")
    ap.add_argument("--max-seconds", type=float, default=1200.0)
    ap.add_argument("--dir", type=Path, default=Path("/tmp/genbench"))
    args = ap.parse_args(argv)
    n, k = args.jobs, min(args.complete, args.jobs)
    root = args.dir / "spool"
    shutil.rmtree(root, ignore_errors=True)
    args.dir.mkdir(parents=True, exist_ok=True)
    subprocess.run([str(BIN / "spool"), "init", str(root)], check=True, capture_output=True)
    sim = ProviderSim(token=TOKEN, work=args.work_max).start()
    with open(root / "spool.toml", "a") as f:
        f.write(
            f'\n[providers.sim]\nkind = "replicate"\nbase_url = "{sim.url}"\ntoken_env = "GENBENCH_TOKEN"\n'
            f'in_flight = {n}\ndeadline = "2h"\n'
            f"[providers.sim.spending]\nper_hour = {n}\nper_day = {n}\n"
            f"[providers.sim.polling]\nfirst = {args.first}\nbase = 2\nfactor = 2\nceiling = {args.ceiling}\n"
        )
    tags = {"campaign": "bench", "locale": "en", "asset_type": "ad", "visibility": "internal"}
    rng = random.Random(1)
    finishing = set(rng.sample(range(n), k))
    for i in range(n):
        fault = f"work:{rng.uniform(args.work_min, args.work_max):.3f}" if i in finishing else "never"
        sub = {
            "name": f"g{i:05d}",
            "operation": "generate",
            "generate": {
                "provider": "sim",
                "model": "acme/video-1",
                "input": {"prompt": f"clip {i} #fault={fault}"},
            },
            "tags": tags,
        }
        (root / "incoming" / f"g{i}.json").write_text(json.dumps(sub))
    naive = Naive(sim, args.interval).start()
    started = time.monotonic()
    admitted_s = -1.0
    cpu_from = cpu_to = 0.0
    polls_from = polls_to = 0
    threads = hwm = waiting = 0
    with open(args.dir / "spoold.log", "w") as logf:
        proc = subprocess.Popen(
            [str(BIN / "spoold"), "run", "--spool", str(root), "--worker", WORKER],
            env={**os.environ, "GENBENCH_TOKEN": TOKEN},
            stdout=logf,
            stderr=subprocess.STDOUT,
        )
        done = 0
        while proc.poll() is None:
            try:
                status = Path(f"/proc/{proc.pid}/status").read_text()
                threads = max(threads, int(status.split("Threads:")[1].split()[0]))
                hwm = max(hwm, int(status.split("VmHWM:")[1].split()[0]))
            except (OSError, IndexError, ValueError):
                pass
            waiting = max(waiting, heartbeat_pool(root))
            if admitted_s < 0 and sim.stats().get("create", 0) >= n:
                admitted_s = time.monotonic() - started
                cpu_from, polls_from = proc_cpu(proc.pid), sim.stats().get("get", 0) - naive.polls
            done = sum(1 for _ in os.scandir(root / "complete"))
            if done >= k or time.monotonic() - started > args.max_seconds:
                cpu_to = proc_cpu(proc.pid) if admitted_s >= 0 else 0.0
                polls_to = sim.stats().get("get", 0) - naive.polls
                proc.send_signal(signal.SIGTERM)
                proc.wait(timeout=300)
                break
            time.sleep(1.0)
    wall = time.monotonic() - started
    naive.stop()
    stats = sim.stats()
    sim_jobs = {j.id: j for j in sim.state.jobs.values()}
    sim.stop()
    polls, minimum, seen, indexed = 0, 0, [], []
    for rec in root.glob("attempts/*/*/gen/5-indexed.json"):
        r = json.loads(rec.read_text())
        sj = sim_jobs[r["provider_job_id"]]
        done_at = sj.created + sj.work
        gen = rec.parent
        ret = json.loads((gen / "3-retrieving.json").read_text())
        seen.append(datetime.fromisoformat(ret["at"]).timestamp() - done_at)
        indexed.append(datetime.fromisoformat(r["at"]).timestamp() - done_at)
        polls += json.loads((gen / "progress.json").read_text())["polls"]
        minimum += 1 + max(0, math.ceil((sj.work - args.first) / args.ceiling))
    completed = len(indexed)
    driver = re.findall(
        r"driver: (\d+) steps; CPU ([0-9.]+) s in steps, ([0-9.]+) s on the scheduling thread",
        (args.dir / "spoold.log").read_text(),
    )
    thread_polls, thread_cpu = (
        (int(driver[-1][0]), float(driver[-1][1]) + float(driver[-1][2])) if driver else (0, 0.0)
    )
    daemon_polls = polls_to - polls_from
    print(
        json.dumps(
            {
                "jobs_in_flight": n,
                "completed": completed,
                "creates": stats.get("create", 0),
                "admitted_all_s": round(admitted_s, 1),
                "peak_waiting_at_provider": waiting,
                "peak_threads": threads,
                "peak_rss_mib": round(hwm / 1024, 1),
                "daemon_polls_while_measured": daemon_polls,
                "daemon_cpu_ms_per_poll": round((cpu_to - cpu_from) / max(1, daemon_polls) * 1e3, 3),
                "driver_cpu_ms_per_step": round(thread_cpu / max(1, thread_polls) * 1e3, 3),
                "polls_per_completed_job": round(polls / max(1, completed), 2),
                "min_polls_per_completed_job": round(minimum / max(1, completed), 2),
                "completion_to_seen_p50_p99_s": [q(seen, 0.5), q(seen, 0.99)],
                "completion_to_indexed_p50_p99_s": [q(indexed, 0.5), q(indexed, 0.99)],
                "naive_interval_s": args.interval,
                "naive_jobs": naive.jobs,
                "naive_polls_per_job": round(naive.done_polls / max(1, len(naive.seen)), 2),
                "naive_cpu_ms_per_poll": round(naive.cpu / max(1, naive.polls) * 1e3, 3),
                "naive_completion_to_seen_p50_p99_s": [q(naive.seen, 0.5), q(naive.seen, 0.99)],
                "naive_requests_per_s_for_all_n": round(n / args.interval, 1),
                "wall_s": round(wall, 1),
            }
        )
    )
    return 0 if stats.get("create", 0) == n else 1


if __name__ == "__main__":
    raise SystemExit(main())
