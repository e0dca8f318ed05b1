"""tools/bench: spool side by side with the queues people would pick instead, and
with the machine's limits (issue 7). Run it through ``tools/bench``.

    tools/bench [all|dispatch|latency|render|publish|scale|library|syscalls|depends|nas|nasdispatch|nasfloor]
                [--quick|--smoke] [--json FILE] [--markdown] [--huge]

Prints ONE table: each measure, spool's figure, a peer's figure (or the
machine's floor), their ratio and the target, met or missed. Every figure is
the median of several runs, every ratio the median of ratios taken pair by pair
in the same round (runs interleaved, order rotated). It measures; it asserts
nothing: the machine is shared and noisy, so timings are reported, never tested.

``--quick`` is a shorter run with smaller sizes (CI's smoke test uses
``--smoke``, smaller still, which proves only that every row can be produced).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchlib import common
from benchlib.common import Row, log, notes, rows_json, table

MEASURES = ("dispatch", "latency", "render", "publish", "scale", "library", "syscalls", "depends")
#: Measures run only when named: ``nas`` needs root and FUSE (tools/multimount).
EXTRA = ("nas", "nasdispatch", "nasfloor")


def run_measure(name: str, mode: str) -> tuple[list[Row], list[str]]:
    if name == "dispatch":
        from benchlib import dispatch

        with common.scratch("disk", "redis") as d, common.redis_server(d) as url:
            return dispatch.run(mode, url)
    if name == "latency":
        from benchlib import latency

        return latency.run(mode)
    if name == "render":
        from benchlib import render

        return render.run(mode)
    if name == "publish":
        from benchlib import publish

        return publish.run(mode)
    if name == "scale":
        from benchlib import scale

        return scale.run(mode)
    if name == "syscalls":
        from benchlib import syscalls

        return syscalls.run(mode)
    if name == "nas":
        from benchlib import nas

        return nas.run(mode)
    if name == "depends":
        from benchlib import depends

        return depends.run(mode)
    if name == "nasdispatch":
        from benchlib import nasdispatch

        return nasdispatch.run(mode)
    if name == "nasfloor":
        from benchlib import nasfloor

        return nasfloor.run(mode)
    if name == "library":
        from benchlib import library

        return library.run(mode)
    raise ValueError(name)


def expected_keys(mode: str, measures: tuple[str, ...] = MEASURES) -> list[str]:
    """Every row key the chosen measures promise, in table order."""
    import importlib

    return [k for name in measures for k in importlib.import_module(f"benchlib.{name}").keys(mode)]


def machine() -> str:
    load = os.getloadavg()
    return (
        f"{platform.node()}: {os.cpu_count()} cores, Python {platform.python_version()}, "
        f"disk {common.ROOTS['disk']} ({common.fs_type(common.ROOTS['disk'])}), "
        f"tmpfs {common.ROOTS['tmpfs']} ({common.fs_type(common.ROOTS['tmpfs'])}), "
        f"load average at start {load[0]:.2f}"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="tools/bench", description=__doc__.split("\n\n")[0])
    ap.add_argument("measure", nargs="?", default="all", choices=("all", *MEASURES, *EXTRA))
    size = ap.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="smaller sizes and fewer rounds")
    size.add_argument("--smoke", action="store_true", help="tiny sizes: proves every row can be produced")
    ap.add_argument("--json", type=Path, help="also write rows, raw samples and notes to this file")
    ap.add_argument("--huge", action="store_true", help="scale: add 1,000,000 pending jobs (minutes, ~5 GB)")
    ap.add_argument("--markdown", action="store_true", help="print the table as Markdown")
    ap.add_argument("--disk-dir", type=Path, default=common.ROOTS["disk"], help="scratch on the local disk")
    ap.add_argument("--tmpfs-dir", type=Path, default=common.ROOTS["tmpfs"], help="scratch on tmpfs")
    args = ap.parse_args(argv)
    mode = "smoke" if args.smoke else "quick" if args.quick else "full"
    if args.huge:
        from benchlib import scale

        scale.HUGE = True
    common.ROOTS["disk"] = args.disk_dir
    common.ROOTS["tmpfs"] = args.tmpfs_dir
    chosen = MEASURES if args.measure == "all" else (args.measure,)

    started = time.monotonic()
    header = machine()
    log(f"{mode} run of {', '.join(chosen)} on {header}")
    results: dict[str, tuple[list[Row], list[str]] | Exception] = {}

    def one(name: str) -> None:
        t0 = time.monotonic()
        try:
            results[name] = run_measure(name, mode)
        except Exception as exc:  # one broken measure must not hide the others' rows
            log(f"{name}: FAILED: {exc!r}")
            results[name] = exc
            return
        log(f"{name}: done in {time.monotonic() - t0:.0f} s")

    if mode == "smoke":
        # Smoke figures mean nothing (they prove every row can be produced), so the
        # measures run side by side to keep CI's smoke test short. spool's modules are
        # imported here first: threads importing one package for the first time at
        # once can trip Python's import-lock deadlock detection (seen in CI).
        import spool.cli
        import spool.kinds
        import spool.kinds.generate.providers.base
        import spool.kinds.generate.providers.replicate
        import spool.kinds.generate.providers.runway  # noqa: F401

        with ThreadPoolExecutor(len(chosen)) as pool:
            list(pool.map(one, chosen))
    else:
        for name in chosen:
            one(name)
    rows: list[Row] = []
    all_notes: list[str] = []
    failed: list[str] = []
    for name in chosen:
        got = results[name]
        if isinstance(got, Exception):
            failed.append(f"{name}: {got}")
            rows.append(Row(key=f"{name}.error", measure=f"{name}: failed ({got})", unit="", spool=None))
        else:
            rows += got[0]
            all_notes += got[1]
    printed = {r.key for r in rows}
    for key in expected_keys(mode, tuple(n for n in chosen if not isinstance(results[n], Exception))):
        if key not in printed:
            failed.append(f"row {key} missing")
            rows.append(Row(key=key, measure=f"{key}: missing", unit="", spool=None))
    elapsed = time.monotonic() - started

    print(f"spool benchmark ({mode}), {header}; {elapsed:.0f} s\n")
    print(table(rows, markdown=args.markdown))
    row_notes = notes(rows)
    if all_notes or row_notes:
        print("\nHow each figure was taken:")
        for n in all_notes:
            print(f"  - {n}")
        if row_notes:
            print(row_notes)
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "mode": mode,
                    "machine": header,
                    "seconds": elapsed,
                    "rows": rows_json(rows),
                    "notes": all_notes,
                },
                indent=1,
                default=str,
            )
        )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
