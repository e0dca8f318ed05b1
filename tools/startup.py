#!/usr/bin/env python3
"""What the commands scripts call in loops cost to start, and ``spoold run``: the median
wall time of several real runs on a small spool, the import time Python reports for one
(``python -X importtime``), and which heavy modules each one loads.

An import placed inside a function says why with a figure (``# here: ...``); this is
where the figure comes from. Give ``--src`` twice (say a ``git archive`` of the commit
before and the work tree) and the runs alternate between the two, so both are measured
in the same minute on the same machine:

    tools/startup.py                          # this checkout, 15 runs a command
    tools/startup.py --src /tmp/before --src . --runs 21 --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
#: Modules a lean command should not need; a row names the ones it loaded.
HEAVY = (
    "typer",
    "click",
    "rich",
    "msgspec",
    "httpx",
    "PIL",
    "ffmpeg",
    "opentimelineio",
    "portalocker",
    "watchdog",
    "spool.kinds.registry",
    "spool.core.config",
    "spool.library.catalog",
    "spool.queue.accept",
)


#: Submission files made (each names another job, so every ``spool submit`` is accepted).
SUBMISSIONS = 400


def small_spool(where: Path, python: str) -> tuple[Path, list[Path], str]:
    """A spool with three pending render jobs: (spool, the submission files not yet
    submitted, a job ID)."""
    code = f"""
import json, sys
from pathlib import Path
from spool.core import settings
from spool.disk.tree import Tree
from spool.media import samples
where = Path({str(where)!r})
(where / "assets").mkdir(parents=True)
samples.clip(where / "assets" / "clip.mp4", seconds=1.0, size="160x120", rate=25)
t = Tree.at(where / "spool")
t.create()
settings.write(t.config_file, {{"assets": {{"roots": [str(where / "assets")]}}}})
sub = {{"name": "bench", "sources": {{"clip": str(where / "assets" / "clip.mp4")}},
        "recipe": {{"input": "clip", "steps": [{{"op": "trim", "duration": 0.5}},
                                              {{"op": "encode", "preset": "ultrafast"}}]}},
        "tags": {{"campaign": "mug", "locale": "en-GB", "asset_type": "ad", "visibility": "internal"}}}}
for i in range({SUBMISSIONS}):
    sub["name"] = f"bench{{i}}"
    (where / f"sub{{i}}.json").write_text(json.dumps(sub))
"""
    subprocess.run([python, "-c", code], check=True, cwd=ROOT)
    spool = where / "spool"
    subs = [where / f"sub{i}.json" for i in range(SUBMISSIONS)]
    job = ""
    for sub in subs[:3]:
        job = _spool(python, ROOT, ["submit", str(sub), "--spool", str(spool)]).stdout.strip()
    return spool, subs[3:], job


def _spool(
    python: str, src: Path, args: list[str], importtime: bool = False
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(src)}
    flags = ["-X", "importtime"] if importtime else []
    code = "import sys; sys.argv[0] = 'spool'; from spool.cli import main; sys.exit(main())"
    return subprocess.run(
        [python, *flags, "-c", code, *args], capture_output=True, text=True, env=env, cwd=src, check=False
    )


def _spoold(
    python: str, src: Path, args: list[str], importtime: bool = False
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(src)}
    flags = ["-X", "importtime"] if importtime else []
    code = "import sys; sys.argv[0] = 'spoold'; from spoold.main import main; sys.exit(main())"
    return subprocess.run(
        [python, *flags, "-c", code, *args], capture_output=True, text=True, env=env, cwd=src, check=False
    )


def imported(stderr: str) -> tuple[int, set[str]]:
    """(total cumulative import microseconds of the top-level imports, every module name)."""
    total, names = 0, set()
    for line in stderr.splitlines():
        if not line.startswith("import time:") or "|" not in line or "cumulative" in line:
            continue
        _, _self, cumulative, name = line.split("|", 1)[0], *line.split("|")
        name = name.rstrip()
        names.add(name.strip())
        if not name.startswith("  "):  # a top-level import: its cumulative time holds its children
            total += int(cumulative)
    return total, names


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--src", action="append", type=Path, help="a source tree (repeat to compare)")
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--json", type=Path, help="also write the rows here")
    args = ap.parse_args()
    python = sys.executable
    srcs = [s.resolve() for s in (args.src or [ROOT])]
    for s in srcs:
        where = subprocess.run(
            [python, "-c", "import spool.cli; print(spool.cli.__file__)"],
            capture_output=True,
            text=True,
            env={**os.environ, "PYTHONPATH": str(s)},
            cwd=s,
            check=True,
        ).stdout.strip()
        if not where.startswith(str(s)):
            raise SystemExit(f"{s}: python imports spool from {where}, not from the tree given")
        # Bytecode compiled up front, as an installed package has it: a tree whose .pyc are
        # stale (or never written: PYTHONDONTWRITEBYTECODE) would be compiled on every run.
        subprocess.run(
            [python, "-m", "compileall", "-q", str(s / "spool"), str(s / "spoold")],
            check=True,
            env={k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"},
        )
    tmp = Path(tempfile.mkdtemp(prefix="spool-startup-"))
    try:
        spool, subs, job = small_spool(tmp / "small", python)
        empty = tmp / "empty"
        shutil.copytree(spool, empty)  # for spoold: nothing pending, so --drain exits after start-up
        for state in ("pending",):
            for f in (empty / state).iterdir():
                f.unlink()
        at = ["--spool", str(spool)]
        commands: dict[str, tuple[Any, list[str]]] = {
            "spool status --json": (_spool, ["status", "--json", *at]),
            "spool ls pending": (_spool, ["ls", "pending", *at]),
            "spool show J": (_spool, ["show", job, *at]),
            "spool show J --json": (_spool, ["show", job, "--json", *at]),
            "spool submit F": (_spool, ["submit", "{next submission}", *at]),
            "spool events": (_spool, ["events", "--json", *at]),
            "spoold run --drain (empty)": (_spoold, ["run", "--spool", str(empty), "--drain"]),
        }
        rows = []
        for label, (run, argv0) in commands.items():
            times: dict[Path, list[float]] = {s: [] for s in srcs}
            for i in range(args.runs):
                # alternate, and swap which goes first, so load on the machine falls on both alike
                for s in srcs if i % 2 == 0 else srcs[::-1]:
                    argv = [str(subs.pop()) if a == "{next submission}" else a for a in argv0]
                    t0 = time.perf_counter()
                    proc = run(python, s, argv)
                    times[s].append(time.perf_counter() - t0)
                    if proc.returncode != 0:
                        raise SystemExit(f"{label} ({s}) exited {proc.returncode}: {proc.stderr[-2000:]}")
            for s in srcs:
                itimes = []
                for _ in range(3):
                    argv = [str(subs.pop()) if a == "{next submission}" else a for a in argv0]
                    total, names = imported(run(python, s, argv, importtime=True).stderr)
                    itimes.append(total)
                heavy = sorted(h for h in HEAVY if h in names)
                rows.append(
                    {
                        "command": label,
                        "src": str(s),
                        "wall_ms": round(statistics.median(times[s]) * 1000, 1),
                        "import_ms": round(statistics.median(itimes) / 1000, 1),
                        "modules": len(names),
                        "heavy": heavy,
                    }
                )
                r = rows[-1]
                print(
                    f"{label:<28} {s.name:<10} wall {r['wall_ms']:7.1f} ms  "
                    f"imports {r['import_ms']:6.1f} ms  {r['modules']:4d} modules  {' '.join(heavy)}",
                    flush=True,
                )
        if args.json:
            args.json.write_text(json.dumps({"runs": args.runs, "rows": rows}, indent=1))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
