"""Running FFmpeg for one attempt: limits, log, live progress; stop, timeout and
cancel through :func:`spool.queue.supervise.supervise`.

FFmpeg runs as a child process with an argument list (never a shell), in the
attempt's ``work/`` folder, with stderr going to the attempt's ``ffmpeg.log``
and ``-progress`` on stdout parsed into ``progress.json``. The child is in a
process group of its own, gets niceness and resource limits from the
operator's config before it executes, and is killed if the daemon dies
(``PR_SET_PDEATHSIG``), so an orphaned FFmpeg never keeps writing into an
attempt that recovery is inspecting.
"""

from __future__ import annotations

import ctypes
import os
import platform
import resource
import selectors
import shlex
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import BinaryIO

from spool.core.config import Limits
from spool.core.model import Progress, now
from spool.core.secrets import child_env, redact_bytes
from spool.kinds.render.ffcommand import Command
from spool.queue.attempt import Attempt
from spool.queue.supervise import Stopped, supervise

_PR_SET_PDEATHSIG = 1
_prctl: Callable[..., int] | None
try:
    _prctl = ctypes.CDLL(None, use_errno=True).prctl
except (OSError, AttributeError):  # not Linux
    _prctl = None

#: How often ``progress.json`` is rewritten while FFmpeg runs.
PROGRESS_EVERY = 0.5


@dataclass(frozen=True)
class RenderOutcome:
    returncode: int | None
    seconds: float
    stopped: Stopped | None
    log_tail: list[str]


#: ioprio_set(2) system call numbers (no libc wrapper exists).
_IOPRIO_SET = {"x86_64": 251, "aarch64": 30, "i686": 289, "armv7l": 314}.get(platform.machine())
_IOPRIO_CLASS_BE = 2


def _child_setup(nice: int, ionice: int, memory: int, file_size: int) -> Callable[[], None]:
    """Runs in the forked child before exec: only plain system calls, no locks."""
    syscall = ctypes.CDLL(None, use_errno=True).syscall if _IOPRIO_SET is not None else None

    def setup() -> None:
        if _prctl is not None:
            _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        if nice:
            os.nice(nice)
        if syscall is not None:
            # IOPRIO_WHO_PROCESS (1), this process (0), best-effort class at the given level
            syscall(_IOPRIO_SET, 1, 0, (_IOPRIO_CLASS_BE << 13) | ionice)
        if memory:
            resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
        if file_size:
            resource.setrlimit(resource.RLIMIT_FSIZE, (file_size, file_size))

    return setup


def parse_progress(block: dict[str, str], duration: float | None, started: float) -> Progress:
    """One ``-progress`` block (key=value lines up to ``progress=...``) -> Progress."""

    def num(key: str) -> float | None:
        v = block.get(key, "").strip().rstrip("x")
        try:
            return float(v)
        except ValueError:
            return None

    out_us = num("out_time_us") or num("out_time_ms") or 0.0
    out_time = max(out_us / 1e6, 0.0)
    speed = num("speed")
    percent = eta = None
    if duration:
        percent = round(min(100.0, 100.0 * out_time / duration), 1)
        if speed and speed > 0:
            eta = round(max(duration - out_time, 0.0) / speed, 1)
        elif out_time > 0:
            elapsed = time.monotonic() - started
            eta = round(elapsed * (duration - out_time) / out_time, 1)
    return Progress(
        percent=percent,
        frame=int(num("frame") or 0),
        fps=num("fps"),
        speed=speed,
        out_time=round(out_time, 3),
        eta_seconds=eta,
        updated_at=now(),
        done=block.get("progress") == "end",
    )


def run(
    cmd: Command,
    attempt: Attempt,
    limits: Limits,
    *,
    stop: threading.Event | None = None,
    on_progress: Callable[[Progress], None] | None = None,
    cancelled: Callable[[], bool] | None = None,
) -> RenderOutcome:
    """Run FFmpeg to completion, a timeout, ``stop`` being set, or ``cancelled()``
    turning true (checked twice a second; see :mod:`spool.queue.supervise`).

    FFmpeg's stderr reaches ``ffmpeg.log`` line by line through
    :func:`spool.core.secrets.redact` (it echoes input metadata, which may carry
    anything); its ``-progress`` stream on stdout becomes ``progress.json``.
    """
    for name, data in cmd.files.items():
        (attempt.work / name).write_bytes(data)
    started = time.monotonic()
    stopped: Stopped | None = None
    with open(attempt.tool_log, "ab") as log:
        log.write(redact_bytes(f"$ {shlex.join(cmd.argv)}\n".encode()))
        log.flush()
        proc = _start(cmd, attempt, limits)
        streams = _Streams(proc, log, attempt, cmd.duration, started, on_progress)
        try:
            stopped = supervise(
                streams.pump, deadline=started + limits.job_timeout, stop=stop, cancelled=cancelled
            )
        finally:
            streams.close()
            if stopped is not None or proc.poll() is None:
                _kill(proc)
            proc.wait()
            streams.close_pipes()
        if stopped:
            log.write(f"\n[spool] render stopped: {stopped}\n".encode())
    return RenderOutcome(
        returncode=proc.returncode,
        seconds=round(time.monotonic() - started, 3),
        stopped=stopped,
        log_tail=tail(attempt.tool_log),
    )


def _start(cmd: Command, attempt: Attempt, limits: Limits) -> subprocess.Popen[bytes]:
    """FFmpeg in ``work/``, in a process group of its own, with the operator's limits."""
    return subprocess.Popen(
        cmd.argv,
        cwd=attempt.work,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        process_group=0,
        env=child_env(),
        preexec_fn=_child_setup(limits.nice, limits.ionice, limits.memory_bytes, limits.output_size_bytes),
    )


class _Streams:
    """FFmpeg's two pipes: stderr lines to ``ffmpeg.log`` (redacted), ``-progress``
    blocks on stdout to ``progress.json`` (at most every PROGRESS_EVERY s, and the last)."""

    def __init__(
        self,
        proc: subprocess.Popen[bytes],
        log: BinaryIO,
        attempt: Attempt,
        duration: float | None,
        started: float,
        on_progress: Callable[[Progress], None] | None,
    ) -> None:
        assert proc.stdout is not None and proc.stderr is not None
        self.proc, self.log, self.attempt = proc, log, attempt
        self.duration, self.started, self.on_progress = duration, started, on_progress
        self.sel = selectors.DefaultSelector()
        self.sel.register(proc.stdout, selectors.EVENT_READ, "progress")
        self.sel.register(proc.stderr, selectors.EVENT_READ, "log")
        self.bufs = {"progress": b"", "log": b""}
        self.block: dict[str, str] = {}
        self.last_write = 0.0

    def pump(self, wait: float) -> bool:
        """Read what the pipes hold within ``wait`` seconds; False once both are closed."""
        for key, _ in self.sel.select(timeout=wait):
            stream = key.data
            chunk = os.read(key.fd, 65536)
            if not chunk:
                self.sel.unregister(key.fileobj)
                chunk = b"\n" if self.bufs[stream] else b""  # flush a last unterminated line
            self.bufs[stream] += chunk
            *lines, self.bufs[stream] = self.bufs[stream].split(b"\n")
            if stream == "log":
                self._log(lines)
            else:
                self._progress(lines)
        return bool(self.sel.get_map())

    def _log(self, lines: list[bytes]) -> None:
        if lines:
            self.log.write(redact_bytes(b"\n".join(lines) + b"\n"))
            self.log.flush()

    def _progress(self, lines: list[bytes]) -> None:
        for raw in lines:
            name, _, value = raw.decode("utf-8", "replace").partition("=")
            self.block[name.strip()] = value.strip()
            if name.strip() != "progress":
                continue
            prog = parse_progress(self.block, self.duration, self.started)
            self.block = {}
            t = time.monotonic()
            if prog.done or t - self.last_write >= PROGRESS_EVERY:
                self.attempt.record("progress.json", prog, durable=False)
                self.last_write = t
            if self.on_progress is not None:
                self.on_progress(prog)

    def close(self) -> None:
        self.sel.close()

    def close_pipes(self) -> None:
        assert self.proc.stdout is not None and self.proc.stderr is not None
        self.proc.stdout.close()
        self.proc.stderr.close()


def _kill(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def tail(path: os.PathLike[str] | str, lines: int = 12) -> list[str]:
    """The last lines of a log worth showing a human (FFmpeg's banner skipped)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 16384))
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return []
    keep = [ln.rstrip() for ln in text.splitlines() if ln.strip() and not ln.startswith("$ ")]
    return keep[-lines:]
