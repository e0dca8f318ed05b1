"""Dependencies: from an upstream's publish to its dependents pending, spool against RQ's
``depends_on``, with 10,000 dependents waiting on 100 upstreams (issue 26).

* spool: one spool on the local disk; each upstream is a real render of a tiny clip,
  submitted in one brief with a fan-out of its dependents (one axis, D values: D ordinary
  render jobs whose clip is ``{"job": upstream}``), so all of them wait in ``waiting/``.
  Then, upstream by upstream: claimed and executed in this process (real FFmpeg, gate,
  store, manifest, ``complete/``), and at once the call the daemon makes on its own
  journal event, ``spool.queue.depends.settle(changed=[upstream])``: each dependent frozen to the
  upstream's store object (its sha256 in sources, ``upstreams`` and the recipe hash),
  renamed to ``pending/``, every folder fsynced once, the journal lines written. A
  dependent's figure is the time from the upstream's ``complete/`` rename to the end of
  that batch (when its move is durable): every dependent of one upstream has its batch's
  figure. The daemon's wake-up on the event is not in it.
* RQ 3.0 (redis-server on loopback, no persistence: not durable): each upstream a job
  (``benchlib.peers.noop``) on queue ``up``, its D dependents enqueued on queue ``down``
  with ``depends_on=upstream``; ``rq worker --burst -w SimpleWorker`` runs queue ``up``
  and, as it does after every success, enqueues each finished job's dependents. A
  dependent's figure is its ``enqueued_at`` less its upstream's ``ended_at`` (RQ's clocks).

One run of each (the percentiles are over the 10,000 dependents); the ratio is spool's
percentile over RQ's. Nothing is asserted: the machine is shared.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

from .common import BIN, TAGS, Row, log, make_spool, median, p99, redis_server, scratch, start, wait_all

SIZES = {"full": (100, 100), "quick": (20, 50), "smoke": (3, 5)}


def keys(mode: str) -> list[str]:
    """The rows this measure promises (the smoke test checks every one is printed)."""
    return ["depends.p50", "depends.p99", "depends.batches"]


def _upstream(name: str, clip: Path) -> dict[str, object]:
    return {
        "name": name,
        "sources": {"clip": str(clip)},
        "recipe": {
            "input": "clip",
            "steps": [
                {"op": "trim", "duration": 0.2},
                {"op": "fit", "width": 64, "height": 36},
                {"op": "encode", "preset": "ultrafast"},
            ],
        },
        "tags": TAGS,
    }


def _dependents(name: str, upstream: str, n: int) -> dict[str, object]:
    """A fan-out of ``n`` renders from the upstream's output (one axis, ``n`` values)."""
    return {
        "name": name,
        "sources": {"clip": {"job": upstream}},
        "recipe": {
            "input": "clip",
            "steps": [{"op": "fit", "width": 32, "height": 18}, {"op": "encode", "preset": "ultrafast"}],
        },
        "tags": TAGS,
        "variants": {"v": {f"{k:03d}": {} for k in range(n)}},
    }


def _spool(ups: int, per: int) -> tuple[list[float], int, float]:
    """Dependents' publish-to-pending seconds, upstreams released in one batch, accept time."""
    from spool.core import config
    from spool.disk.tree import Tree
    from spool.media import samples
    from spool.queue import accept, claim, depends, execute
    from spool.queue.context import Context
    from spool.queue.events import Journal

    with scratch("disk", "depends") as d:
        assets = d / "assets"
        assets.mkdir()
        clip = assets / "clip.mp4"
        samples.clip(clip, seconds=1.0, size="64x36")
        root = make_spool(d / "spool", {}, [str(assets)])
        tree = Tree.at(root)
        cfg = config.load(tree.config_file)
        log(f"depends: accepting {ups} upstreams with {per} dependents each ({ups * per:,} waiting)")
        t0 = time.perf_counter()
        for i in range(ups):
            brief = {
                "brief": f"b{i}",
                "jobs": [_upstream(f"up{i:03d}", clip), _dependents(f"dep{i:03d}", f"up{i:03d}", per)],
            }
            accept.accept_all(tree, cfg, json.dumps(brief).encode(), "bench")
        accepted = time.perf_counter() - t0
        waiting = sum(1 for _ in tree.waiting.glob("*.json"))
        if waiting != ups * per:
            raise RuntimeError(f"{waiting} jobs in waiting/, {ups * per} expected")
        journal = Journal(tree, "bench")
        ctx = Context(tree, cfg, "bench", journal, threading.Event())
        figures: list[float] = []
        one_batch = 0
        for i in range(ups):
            up = f"up{i:03d}@1"
            if not claim.claim(tree, "bench", up):
                raise RuntimeError(f"could not claim {up}")
            if execute.execute(ctx, up) != "complete":
                raise RuntimeError(f"{up} did not complete")
            published = time.perf_counter()  # execute returns right after the complete/ rename
            done = depends.settle(tree, cfg, journal, changed=[up], by="bench")
            took = time.perf_counter() - published
            figures += [took] * len(done.pending)
            one_batch += len(done.pending) == per
        left = sum(1 for _ in tree.waiting.glob("*.json"))
        if left:
            raise RuntimeError(f"{left} jobs still in waiting/ after every upstream published")
        return figures, one_batch, accepted


def _rq(url: str, ups: int, per: int) -> list[float]:
    from redis import Redis
    from rq import Queue
    from rq.job import Job

    conn = Redis.from_url(url)
    conn.flushall()
    q_up, q_down = Queue("up", connection=conn), Queue("down", connection=conn)
    upstreams = []
    dependents: dict[str, list[str]] = {}
    for i in range(ups):
        u = q_up.enqueue("benchlib.peers.noop", i)
        upstreams.append(u.id)
        dependents[u.id] = [q_down.enqueue("benchlib.peers.noop", k, depends_on=u).id for k in range(per)]
    if q_down.count:
        raise RuntimeError("RQ enqueued dependents before their upstream finished")
    argv = [str(BIN / "rq"), "worker", "--burst", "-w", "rq.worker.SimpleWorker", "-u", url, "up"]
    wait_all([start(argv)], timeout=600, what="rq worker")
    figures = []
    for uid in upstreams:
        u = Job.fetch(uid, connection=conn)
        if u.ended_at is None:
            raise RuntimeError(f"RQ upstream {uid} did not finish")
        for job in Job.fetch_many(dependents[uid], connection=conn):
            if job is None or job.enqueued_at is None:
                raise RuntimeError(f"an RQ dependent of {uid} was not enqueued")
            figures.append((job.enqueued_at - u.ended_at).total_seconds())
    if q_down.count != ups * per:
        raise RuntimeError(f"RQ queued {q_down.count} dependents, {ups * per} expected")
    conn.flushall()
    conn.close()
    return figures


def run(mode: str) -> tuple[list[Row], list[str]]:
    ups, per = SIZES[mode]
    n = ups * per
    spool_s, one_batch, accepted = _spool(ups, per)
    log(f"depends: RQ with {n:,} dependents on {ups} upstreams")
    with scratch("disk", "depends-redis") as d, redis_server(d) as url:
        rq_s = _rq(url, ups, per)
    s50, s99, r50, r99 = median(spool_s), p99(spool_s), median(rq_s), p99(rq_s)
    log(f"  spool p50 {s50 * 1e3:.1f} ms p99 {s99 * 1e3:.1f} ms")
    log(f"  RQ p50 {r50 * 1e3:.1f} ms p99 {r99 * 1e3:.1f} ms")
    label = f"{n:,} waiting on {ups} upstreams"
    rows = [
        Row(
            key="depends.p50",
            measure=f"upstream publish -> dependents pending, p50 ({label})",
            unit="ms",
            spool=s50 * 1e3,
            peer="RQ depends_on",
            peer_value=r50 * 1e3,
            ratio=s50 / r50 if r50 > 0 else None,
            samples={"spool": spool_s[:: max(1, per)], "rq": rq_s[:: max(1, per)]},
        ),
        Row(
            key="depends.p99",
            measure=f"upstream publish -> dependents pending, p99 ({label})",
            unit="ms",
            spool=s99 * 1e3,
            peer="RQ depends_on",
            peer_value=r99 * 1e3,
            ratio=s99 / r99 if r99 > 0 else None,
        ),
        Row(
            key="depends.batches",
            measure=f"upstreams whose {per} dependents moved in one batch",
            unit="count",
            spool=float(one_batch),
            target=f"{ups} of {ups}",
            met=one_batch == ups,
        ),
    ]
    notes = [
        f"depends: {ups} upstreams (real renders) x {per} dependents (a fan-out each, frozen to the "
        f"upstream's store object when it publishes); accepting them took {accepted:.1f} s. spool's "
        "figure runs from the upstream's complete/ rename to the end of its settle batch (every move "
        "durable, the journal written), the call spoold makes on its own event (its wake-up not "
        "included); RQ's from the upstream's ended_at to each dependent's enqueued_at, RQ 3.0 "
        "rq worker (SimpleWorker), redis-server without persistence (not durable).",
    ]
    return rows, notes
