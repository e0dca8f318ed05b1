"""The probe folder ``SPOOL/.doctor/<host>.<pid>.<token>/`` and the small tools the probes share."""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import shutil
import threading
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from spool.disk.tree import HOST, Tree, make_dirs
from spool.queue import liveness


class Lab:
    """``SPOOL/.doctor/<host>.<pid>.<token>/``, and the same folder through ``--peer``."""

    def __init__(self, tree: Tree, peer: Path | None) -> None:
        name = f"{HOST}.{os.getpid()}.{secrets.token_hex(3)}"
        self.dir = tree.root / ".doctor" / name
        self.peer = peer / ".doctor" / name if peer is not None else None
        self._n = 0

    def __enter__(self) -> Lab:
        for _ in range(5):
            try:
                make_dirs(self.dir)
                break
            except FileNotFoundError:
                continue  # another doctor removed the empty .doctor/ between our two mkdirs
        else:
            make_dirs(self.dir)
        self._sweep()
        return self

    def _sweep(self) -> None:
        """Remove labs that killed doctors of this host left (their pid is gone)."""
        for p in self.dir.parent.iterdir():
            host, _, rest = p.name.partition(".")
            pid = rest.partition(".")[0]
            if host == HOST and pid.isdigit() and not liveness.pid_alive(int(pid)):
                shutil.rmtree(p, ignore_errors=True)

    def __exit__(self, *exc: object) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)
        # .doctor/ goes too once no lab is left in it (another doctor's lab keeps it).
        with contextlib.suppress(OSError):
            os.rmdir(self.dir.parent)

    def fresh(self, stem: str) -> Path:
        """A new name in the lab (nothing exists there yet)."""
        self._n += 1
        return self.dir / f"{stem}-{self._n}"

    def via_peer(self, p: Path) -> Path:
        assert self.peer is not None
        return self.peer / p.relative_to(self.dir)


def errno_name(exc: OSError) -> str:
    return errno.errorcode.get(exc.errno or 0, str(exc.errno))


def write(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)


def read(path: Path) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def race(
    rounds: int,
    one: Callable[[int], None],
    two: Callable[[int], None],
    prep: Callable[[int], None] | None = None,
) -> tuple[Counter[str], int]:
    """Run ``one(i)`` and ``two(i)`` released together, ``rounds`` times (after
    ``prep(i)``). Returns the outcomes (``ok`` or the errno's name) and the number
    of rounds without exactly one ``ok``."""
    seen: Counter[str] = Counter()
    bad = 0
    for i in range(rounds):
        if prep is not None:
            prep(i)
        gate = threading.Barrier(2)
        results: list[str] = []

        def run(
            fn: Callable[[int], None],
            i: int = i,
            gate: threading.Barrier = gate,
            results: list[str] = results,
        ) -> None:
            gate.wait()
            try:
                fn(i)
                results.append("ok")
            except OSError as exc:
                results.append(errno_name(exc))

        ts = [threading.Thread(target=run, args=(fn,)) for fn in (one, two)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        seen.update(results)
        bad += results.count("ok") != 1
    return seen, bad
