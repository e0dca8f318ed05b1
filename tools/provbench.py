#!/usr/bin/env python3
"""provbench: spool's poll scheduler against a naive fixed-interval poller, on tools/provsim.py.

Both pollers watch the same kind of load in the same run: N generations
created on the simulator (real HTTP on 127.0.0.1), each taking a random
``--work-min``..``--work-max`` seconds, polled by one thread until final.
Printed per poller: polls per generation (the floor is 1: one poll right at
completion), client CPU per poll (HTTP included), and the delay from the provider's completion to the
poll that saw it (median, p99), and the process's peak RSS (simulator
included; it only grows, so the second row is an upper bound). The
scheduler's own memory for 10,000 generations is bounded in tests/test_polling.py.

    python tools/provbench.py --jobs 10000 --work-min 5 --work-max 30

This measures the polling policy only; the daemon's benchmark adds claims,
downloads and publishing.
"""

from __future__ import annotations

import argparse
import random
import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from provsim import ProviderSim

from spool.polling import PollScheduler
from spool.providers import ProviderError, open_provider, parse_provider
from spool.providers.config import Polling

TOKEN = "provbench-token-0123456789"


def run(mode: str, jobs: int, wmin: float, wmax: float, interval: float, policy: Polling) -> dict[str, float]:
    with ProviderSim(token=TOKEN) as sim:
        cfg = parse_provider("sim", {"kind": "replicate", "base_url": sim.url, "token_env": "T"})
        p = open_provider(cfg, env={"T": TOKEN})
        rng = random.Random(1)
        s = PollScheduler({"sim": policy}, clock=time.monotonic, rng=random.Random(2))
        done_at: dict[str, float] = {}
        polls, lat = 0, []
        cpu = 0.0

        def poll_pass(limit: int) -> None:
            nonlocal polls, cpu
            c0 = time.process_time()
            for d in s.pop_due(limit=limit):
                polls += 1
                try:
                    job = p.get(d.key)
                except ProviderError as exc:
                    s.report(d.key, exc.poll_outcome, retry_after=exc.retry_after)  # type: ignore[arg-type]
                    continue
                if job.final:
                    lat.append(max(0.0, time.monotonic() - done_at[d.key]))
                    s.report(d.key, "done")
                elif mode == "backoff":
                    s.report(d.key, "pending")
                else:
                    s.discard(d.key)
                    s.add(d.key, "sim", due=time.monotonic() + interval)
            cpu += time.process_time() - c0

        for i in range(jobs):
            w = rng.uniform(wmin, wmax)
            job = p.create("acme/video-1", {"prompt": f"job {i} #fault=work:{w:.3f}"}, key=f"b{i}")
            done_at[job.id] = time.monotonic() + w
            s.add(job.id, "sim", due=None if mode == "backoff" else time.monotonic() + interval)
            if i % 20 == 19:
                poll_pass(200)  # polls go on while submissions arrive, as in a daemon
        while len(s):
            nd = s.next_due()
            if nd is not None and nd > time.monotonic():
                time.sleep(min(0.05, nd - time.monotonic()))
            poll_pass(1000)
        p.close()
    lat.sort()
    return {
        "polls_per_job": polls / jobs,
        "cpu_us_per_poll": cpu / max(polls, 1) * 1e6,
        "maxrss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "p50_s": lat[len(lat) // 2],
        "p99_s": lat[min(len(lat) - 1, int(len(lat) * 0.99))],
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--jobs", type=int, default=2000)
    ap.add_argument("--work-min", type=float, default=5.0)
    ap.add_argument("--work-max", type=float, default=30.0)
    ap.add_argument("--interval", type=float, default=2.0, help="the naive poller's fixed interval")
    ap.add_argument("--ceiling", type=float, default=8.0)
    args = ap.parse_args(argv)
    policy = Polling(first=args.work_min / 2, base=1.0, factor=2.0, ceiling=args.ceiling, floor=0.5)
    print(f"{args.jobs} generations of {args.work_min:g}-{args.work_max:g} s on provsim")
    print(f"{'poller':<22} {'polls/job':>9} {'cpu/poll':>9} {'RSS MiB':>9} {'p50 s':>6} {'p99 s':>6}")
    for mode, label in (
        ("backoff", f"spool (ceiling {args.ceiling:g} s)"),
        ("fixed", f"fixed {args.interval:g} s"),
    ):
        r = run(mode, args.jobs, args.work_min, args.work_max, args.interval, policy)
        print(
            f"{label:<22} {r['polls_per_job']:>9.2f} {r['cpu_us_per_poll']:>7.0f}us {r['maxrss_mib']:>9.0f} "
            f"{r['p50_s']:>6.2f} {r['p99_s']:>6.2f}",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
