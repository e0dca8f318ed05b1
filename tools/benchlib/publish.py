"""Publish: ``spool.disk.store.put`` of a large output against ``sha256sum`` of the same file.

The output must be read once to be hashed, so ``sha256sum`` (coreutils, as an
operator would verify the store from a shell) is the floor. The candidate sits
where a render leaves it, in ``attempts/J/1/work/`` of a real spool tree on the
same filesystem as ``store/``; it is written and fsynced before timing, so
both sides read it from the page cache and publish's own fsync of the
candidate finds nothing dirty. Between spool runs the store entry is removed
and the candidate made writable again, so every run publishes for real (not
the "already stored" shortcut). Bytes copied: zero when the store file is
the candidate's own inode (``st_ino`` equal, ``st_nlink`` 2), else its size.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

from .common import ROOTS, Row, fs_type, interleave, log, median, pair_ratios, run_timed, scratch


def _sha256sum_impl() -> str:
    """Whether coreutils' sha256sum here uses OpenSSL (it decides the floor's speed)."""
    exe = shutil.which("sha256sum") or "sha256sum"
    try:
        out = subprocess.run(["ldd", exe], capture_output=True, text=True, check=False).stdout
    except OSError:
        return "linkage unknown"
    return "linked to OpenSSL" if "libcrypto" in out else "its own sha256, not linked to OpenSSL"


def _make_file(path: Path, size: int) -> None:
    block = os.urandom(1 << 24)
    with open(path, "wb") as f:
        written = 0
        k = 0
        while written < size:
            chunk = (k.to_bytes(8, "little") + block)[: min(len(block), size - written)]
            f.write(chunk)
            written += len(chunk)
            k += 1
        f.flush()
        os.fsync(f.fileno())


def _one(kind: str, size: int, rounds: int, label: str) -> list[Row]:
    from spool.disk import store
    from spool.disk.tree import Tree

    fs = fs_type(ROOTS[kind])
    copied: list[int] = []
    methods: list[str] = []
    with scratch(kind, "publish") as d:
        tree = Tree.at(d / "spool")
        tree.create()
        work = tree.attempt_dir("big@1", 1) / "work"
        work.mkdir(parents=True)
        cand = work / "big.mp4"
        log(f"publish: writing {label} on {kind} ({fs})")
        _make_file(cand, size)

        def spool_publish() -> float:
            for p in (tree.store / "sha256").glob("*/*"):
                p.unlink()
            os.chmod(cand, 0o644)
            t0 = time.perf_counter()
            stored = store.put(tree, cand, ".mp4")
            took = time.perf_counter() - t0
            a, b = os.stat(cand), os.stat(stored.path)
            same = (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino) and b.st_nlink >= 2
            copied.append(0 if same else b.st_size)
            methods.append(stored.method)
            return took

        def sha256sum() -> float:
            t = run_timed(["sha256sum", str(cand)])
            if t.returncode != 0:
                raise RuntimeError("sha256sum failed")
            return t.wall

        def hashlib_only() -> float:
            t0 = time.perf_counter()
            store.sha256_file(cand)
            return time.perf_counter() - t0

        log(f"publish: {rounds} rounds of store.put, sha256sum, store.sha256_file on {kind}")
        res = interleave(rounds, {"spool": spool_publish, "sha256sum": sha256sum, "hash": hashlib_only})
    ratio = median(pair_ratios(res["spool"], res["sha256sum"]))
    log(
        f"  publish {median(res['spool']):.3f} s, sha256sum {median(res['sha256sum']):.3f} s, "
        f"sha256_file {median(res['hash']):.3f} s, copied {max(copied)} B ({', '.join(set(methods))})"
    )
    return [
        Row(
            key=f"publish.{kind}.time",
            measure=f"publish {label}, {kind} ({fs})",
            unit="s",
            spool=median(res["spool"]),
            peer="sha256sum (floor)",
            peer_value=median(res["sha256sum"]),
            ratio=ratio,
            target="< 1.15x",
            met=ratio < 1.15,
            samples=dict(res),
        ),
        Row(
            key=f"publish.{kind}.hash",
            measure=f"  where: sha256 in spool (store.sha256_file), {kind}",
            unit="s",
            spool=median(res["hash"]),
            peer="sha256sum (floor)",
            peer_value=median(res["sha256sum"]),
            ratio=median(pair_ratios(res["hash"], res["sha256sum"])),
        ),
        Row(
            key=f"publish.{kind}.copied",
            measure=f"publish {label}, {kind}: bytes copied into the store",
            unit="B",
            spool=float(max(copied)),
            target="0 B (hard link)",
            met=max(copied) == 0,
            note=f"store method per run: {', '.join(methods)}",
        ),
    ]


def keys(mode: str) -> list[str]:
    """The rows this measure promises (the smoke test checks every one is printed)."""
    return [f"publish.{k}.{r}" for k in ("disk", "tmpfs") for r in ("time", "hash", "copied")]


def run(mode: str) -> tuple[list[Row], list[str]]:
    size, rounds = {"full": (1 << 30, 5), "quick": (64 << 20, 5), "smoke": (4 << 20, 1)}[mode]
    label = f"{size >> 30} GiB" if size >= 1 << 30 else f"{size >> 20} MiB"
    rows = [row for kind in ("disk", "tmpfs") for row in _one(kind, size, rounds, label)]
    notes = [
        f"publish: {label} candidate in attempts/J/1/work/, in the page cache, {rounds} rounds of "
        "[store.put, sha256sum, store.sha256_file] rotated; the store entry is removed before each "
        f"publish; sha256sum is coreutils ({_sha256sum_impl()}); spool hashes with hashlib (OpenSSL).",
    ]
    return rows, notes
