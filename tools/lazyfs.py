"""A LazyFS mount for power-cut tests: mount, cut (drop every write not fsynced), remount.

LazyFS (dsrhaslab/lazyfs, the FUSE filesystem Jepsen uses) keeps its own page
cache over a backing folder and writes a file's data to the backing folder
only when it is fsynced; metadata (create, rename, link, unlink, mkdir) goes
through at once. ``lazyfs::clear-cache`` written to its FIFO drops everything
not fsynced: what a machine that lost power keeps. Built offline by
``shared/tools/lazyfs/build`` (``tools/setup --test`` runs it when that folder
exists); upstream is a research prototype that has been seen to exit under
load, so :meth:`LazyFS.cut` always ends with a fresh mount (which also drops
the kernel's caches of the old one, as a reboot would).
"""

from __future__ import annotations

import os
import select
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

CONFIG = """\
[faults]
fifo_path="{fifo}"
fifo_path_completed="{done}"
[cache]
apply_eviction=false
[cache.simple]
custom_size="2gb"
blocks_per_page=1
[filesystem]
log_all_operations=false
logfile="{log}"
"""


def available() -> str | None:
    """Why LazyFS cannot run here, or ``None`` when it can."""
    if shutil.which("lazyfs") is None:
        return "lazyfs is not on PATH (tools/setup --test builds it from shared/tools/lazyfs)"
    if not os.path.exists("/dev/fuse"):
        return "/dev/fuse is missing"
    if shutil.which("fusermount3") is None:
        return "fusermount3 is missing (Debian package fuse3)"
    return None


class LazyFS:
    """One LazyFS mount of ``base/backing`` at ``base/mnt``; ``cut()`` is a power cut."""

    def __init__(self, base: Path) -> None:
        self.base = base.absolute()
        self.backing = self.base / "backing"
        self.mnt = self.base / "mnt"
        self.fifo = self.base / "faults.fifo"
        self.done = self.base / "done.fifo"
        self.config = self.base / "lazyfs.toml"
        self.log = self.base / "lazyfs.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self._done_fd: int | None = None
        #: Mounts made, and how many times LazyFS was found dead (restarted).
        self.mounts = 0
        self.died = 0

    def __enter__(self) -> LazyFS:
        self.mount()
        return self

    def __exit__(self, *exc: object) -> None:
        self.unmount()

    def mount(self) -> None:
        for d in (self.backing, self.mnt):
            d.mkdir(parents=True, exist_ok=True)
        for f in (self.fifo, self.done):
            if not f.exists():
                os.mkfifo(f)
        self.config.write_text(CONFIG.format(fifo=self.fifo, done=self.done, log=self.log))
        # LazyFS opens the "completed" FIFO for writing: hold a reader open first so it never blocks.
        if self._done_fd is None:
            self._done_fd = os.open(self.done, os.O_RDONLY | os.O_NONBLOCK)
        out = open(self.base / "lazyfs.out", "ab")  # noqa: SIM115 - owned by the child
        # The config path is given relative to the base: LazyFS ignores a --config-path
        # containing "-o" anywhere (say /tmp/pytest-of-root/...) and looks for its default.
        self.proc = subprocess.Popen(
            ["lazyfs", str(self.mnt), "--config-path", self.config.name, "-o", "allow_other",
             "-o", "modules=subdir", "-o", f"subdir={self.backing}", "-f"],  # -f: stays our child
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True, cwd=self.base,
        )  # fmt: skip
        out.close()
        deadline = time.monotonic() + 20
        while not self.mounted():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"lazyfs did not mount {self.mnt} (see {self.base / 'lazyfs.out'})")
            time.sleep(0.05)
        self.mounts += 1

    def mounted(self, timeout: float = 5.0) -> bool:
        """The mount is there and answers within ``timeout`` (a dead LazyFS leaves ENOTCONN
        behind; a hung one never answers: the stat is left waiting on a thread of its own,
        which ends once LazyFS is killed)."""
        if not self._listed():
            return False
        answer: list[bool] = []

        def look() -> None:
            try:
                os.stat(self.mnt)
                answer.append(True)
            except OSError:
                answer.append(False)

        t = threading.Thread(target=look, daemon=True)
        t.start()
        t.join(timeout)
        return bool(answer and answer[0])

    def exited(self) -> bool:
        """LazyFS is gone (not hung: a hung one is found by its callers' waits)."""
        return self.proc is None or self.proc.poll() is not None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None and self.mounted()

    def cut(self) -> bool:
        """Drop every write not fsynced, then mount afresh. ``False`` if LazyFS had died or
        hung (its cache dies with it: a cut all the same), ``True`` if it cut on command."""
        was_alive = self.alive()
        if was_alive:
            self._drain_done()
            try:
                fd = os.open(self.fifo, os.O_WRONLY | os.O_NONBLOCK)
                try:
                    os.write(fd, b"lazyfs::clear-cache\n")
                finally:
                    os.close(fd)
            except OSError:
                was_alive = False  # nobody reads the FIFO: it is gone
            if was_alive and not self._await_done(30.0):
                was_alive = False  # it died or hung on the way: its cache is gone all the same
        if not was_alive:
            self.died += 1
            self.kill()
        self.unmount()
        self.mount()
        return was_alive

    def kill(self) -> None:
        """SIGKILL LazyFS (our own child, by its id): every request waiting on it fails, so
        processes stuck in one (LazyFS has been seen to hang under concurrent reads and
        renames) can be killed and reaped. The mount is left for :meth:`unmount`."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def restart(self) -> None:
        """After a hang: kill LazyFS, then mount afresh (a cut as well)."""
        self.died += 1
        self.kill()
        self.unmount()
        self.mount()

    def unmount(self) -> None:
        if self.mounted() or self._listed():
            try:
                r = subprocess.run(["fusermount3", "-u", str(self.mnt)], capture_output=True, timeout=20)
                ok = r.returncode == 0
            except subprocess.TimeoutExpired:
                ok = False
            if not ok:
                self.kill()
                subprocess.run(["fusermount3", "-uz", str(self.mnt)], capture_output=True, timeout=20)
        if self.proc is not None:
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()
            self.proc = None

    def close(self) -> None:
        self.unmount()
        if self._done_fd is not None:
            os.close(self._done_fd)
            self._done_fd = None

    def _listed(self) -> bool:
        with open("/proc/self/mounts") as f:
            return any(line.split()[1] == str(self.mnt) for line in f)

    def _drain_done(self) -> None:
        assert self._done_fd is not None
        try:
            while os.read(self._done_fd, 4096):
                pass
        except BlockingIOError:
            pass

    def _await_done(self, timeout: float) -> bool:
        assert self._done_fd is not None
        deadline = time.monotonic() + timeout
        got = b""
        while b"finished::clear-cache" not in got:
            left = deadline - time.monotonic()
            if left <= 0 or (self.proc is not None and self.proc.poll() is not None):
                return False
            ready, _, _ = select.select([self._done_fd], [], [], min(left, 0.5))
            if ready:
                try:
                    chunk = os.read(self._done_fd, 4096)
                except BlockingIOError:
                    chunk = b""
                if not chunk:
                    time.sleep(0.05)  # no writer at the moment: EOF, not news
                got += chunk
        return True
