"""Build a large spool from records written directly, then time what people look at.

    .venv/bin/python tools/observe_scale.py /tmp/big --jobs 100000

Job files are real ``Job`` records of the noop kind (no media), spread over the
states the way a busy queue looks: mostly complete or pending, some failed
(each with its attempt and failure record), some rejected; every complete job
has its manifest and every job a few journal lines. Then it times
``spool status``, ``spool status --json``, ``spool show`` of one job, and the
status page's ``/api/status`` served by a real ``spool serve``.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import subprocess
import sys
import time
import urllib.request
from datetime import UTC, datetime, timedelta
from pathlib import Path

from spool.core import settings
from spool.core.model import (
    AttemptRecord,
    Check,
    Event,
    Expect,
    Failure,
    Manifest,
    Output,
    PublishedFile,
    Rejection,
    ValidationReport,
    encode,
    encode_line,
)
from spool.disk.tree import HOST, Tree
from spool.kinds import NoopJob as Job

BIN = Path(sys.executable).parent
TAGS = {"campaign": "scale", "locale": "en-GB", "asset_type": "ad", "visibility": "internal"}


def build(root: Path, jobs: int, all_pending: bool = False) -> dict[str, int]:
    tree = Tree.at(root)
    tree.create()
    settings.write(tree.config_file, {"acceptance": {"allow_noop": True}})
    split = {
        "complete": 0 if all_pending else jobs * 45 // 100,
        "failed": 0 if all_pending else jobs * 4 // 100,
        "rejected": 0 if all_pending else jobs // 100,
    }
    split["pending"] = jobs - sum(split.values())
    t0 = datetime.now(UTC) - timedelta(days=2)
    lines: list[bytes] = []
    n = 0
    for state, k in split.items():
        for _ in range(k):
            n += 1
            jid = f"job-{n:06d}@1"
            at = t0 + timedelta(seconds=n)
            if state == "rejected":
                name = f"drop-{n:06d}"
                (tree.rejected / f"{name}.json").write_bytes(b"{}")
                rej = Rejection(
                    file=f"{name}.json",
                    field="name",
                    reason="name: is required but missing",
                    rejected_at=at,
                    rejected_by="scale",
                )
                (tree.rejected / f"{name}.error.json").write_bytes(encode(rej))
                lines.append(encode_line(Event(ts=at, job=f"{name}.json", to="rejected", from_="incoming")))
                continue
            job = Job(
                job_id=jid,
                name=jid.split("@")[0],
                revision=1,
                recipe_hash=hashlib.sha256(b"null").hexdigest(),
                sources=[],
                output=Output(file=f"{jid.split('@')[0]}.txt", container="txt", expect=Expect()),
                tags=TAGS,
                submitted_at=at,
                submitted_by="scale",
            )
            (root / state / f"{jid}.json").write_bytes(encode(job))
            lines.append(
                encode_line(Event(ts=at, job=jid, to="pending", from_="incoming", reason="accepted"))
            )
            if state == "pending":
                continue
            att = tree.attempt_dir(jid, 1)
            att.mkdir(parents=True)
            (att / "attempt.json").write_bytes(
                encode(
                    AttemptRecord(
                        job_id=jid, n=1, worker="scale-w1", host="scale", pid=1, boot_id="x", claimed_at=at
                    )
                )
            )
            lines.append(encode_line(Event(ts=at, job=jid, to="running", from_="pending", attempt=1)))
            if state == "failed":
                f = Failure(
                    job_id=jid,
                    attempt=1,
                    stage="validate",
                    property="noop",
                    message="the output failed the noop check",
                    next_action="Submit a new revision.",
                    worker="scale-w1",
                    failed_at=at,
                )
                (att / "failure.json").write_bytes(encode(f))
                lines.append(encode_line(Event(ts=at, job=jid, to="failed", from_="running", attempt=1)))
                continue
            digest = f"{n:064x}"
            m = Manifest(
                job_id=jid,
                attempt=1,
                recipe_hash=hashlib.sha256(b"null").hexdigest(),
                output=PublishedFile(
                    file=job.output.file,
                    sha256=digest,
                    size=6,
                    container="txt",
                    store_path=f"store/sha256/{digest[:2]}/{digest}.txt",
                    method="link",
                ),
                sources=[],
                validation=ValidationReport(
                    ok=True,
                    decode_check="none",
                    checks=[Check(name="noop", expected=1, actual=1, ok=True)],
                    seconds=0,
                ),
                tags=TAGS,
                worker="scale-w1",
                claimed_at=at,
                render_seconds=0.0,
                validate_seconds=0.0,
                published_at=at,
            )
            tree.manifest_file(jid).write_bytes(encode(m))
            lines.append(encode_line(Event(ts=at, job=jid, to="complete", from_="running", attempt=1)))
    (tree.events / "scale-w1.jsonl").write_bytes(b"".join(lines))
    return split


def timed(args: list[str], repeat: int = 3) -> tuple[float, str]:
    best = float("inf")
    out = ""
    for _ in range(repeat):
        t = time.perf_counter()
        proc = subprocess.run(args, capture_output=True, text=True, check=True)
        best = min(best, time.perf_counter() - t)
        out = proc.stdout
    return best, out


def time_cli_and_page(root: Path) -> None:
    spool = ["--spool", str(root)]
    base, _ = timed([str(BIN / "python"), "-c", "import spool.cli"])
    print(f"python start + import spool.cli: {base * 1000:.0f} ms")
    for args in (["status"], ["status", "--json"], ["show", "job-000001@1"], ["ls", "pending", "--json"]):
        secs, _ = timed([str(BIN / "spool"), *args, *spool])
        print(f"spool {' '.join(args)}: {secs * 1000:.0f} ms")
    serve = subprocess.Popen(
        [str(BIN / "spool"), "serve", "--bind", "127.0.0.1:0", *spool], stdout=subprocess.PIPE, text=True
    )
    try:
        assert serve.stdout is not None
        url = re.search(r"http://\S+/", serve.stdout.readline())
        assert url, "spool serve printed no URL"
        for path in ("api/status", "api/jobs/job-000001@1"):
            best = float("inf")
            for _ in range(3):
                time.sleep(1.1)  # past the server's one-second cache: a fresh computation
                t = time.perf_counter()
                with urllib.request.urlopen(url.group(0) + path, timeout=60) as r:
                    size = len(r.read())
                best = min(best, time.perf_counter() - t)
            print(f"GET /{path}: {best * 1000:.0f} ms ({size} bytes)")
    finally:
        serve.terminate()
        serve.wait()


def daemon_memory(root: Path) -> None:
    """Resident memory of a daemon whose pending/ holds the spool's jobs (noop, one slot)."""
    settings.write(root / "spool.toml", {"limits": {"max_active": 1}, "observe": {"metrics_interval": 2.0}})
    d = subprocess.Popen(
        [str(BIN / "spoold"), "run", "--spool", str(root), "--worker", "rss"],
        stderr=subprocess.DEVNULL,
    )
    try:
        t = time.perf_counter()
        metrics = root / "metrics" / f"spool-{HOST}-rss.prom"
        while not metrics.exists():
            time.sleep(0.1)
        print(f"daemon ready (pending index built) in {time.perf_counter() - t:.1f} s")
        for _ in range(3):
            time.sleep(5)
            status = Path(f"/proc/{d.pid}/status").read_text()
            rss = re.search(r"VmRSS:\s+(\d+) kB", status)
            hwm = re.search(r"VmHWM:\s+(\d+) kB", status)
            pending = sum(1 for _ in os.scandir(root / "pending"))
            assert rss and hwm
            mib, peak = int(rss.group(1)) / 1024, int(hwm.group(1)) / 1024
            print(f"daemon RSS {mib:.0f} MiB (peak {peak:.0f} MiB), {pending} pending")
    finally:
        d.terminate()
        d.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("root", type=Path)
    ap.add_argument("--jobs", type=int, default=100_000)
    ap.add_argument("--all-pending", action="store_true", help="every job pending; then measure the daemon")
    a = ap.parse_args()
    if not (a.root / "pending").exists():
        t = time.perf_counter()
        split = build(a.root, a.jobs, a.all_pending)
        print(f"built {a.jobs} jobs {split} in {time.perf_counter() - t:.1f} s")
    time_cli_and_page(a.root)
    if a.all_pending:
        daemon_memory(a.root)


if __name__ == "__main__":
    main()
