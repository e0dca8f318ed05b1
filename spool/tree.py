"""The spool tree: where every file lives, and how bytes reach the disk durably.

The on-disk protocol is the design, so it lives here, in one place:

* A new file is written under a hidden, unique temporary name *in its final
  folder*, flushed with fsync, renamed to its visible name, and then the folder
  itself is fsynced. A reader never sees a partial file under a visible name,
  and after a crash the file is either wholly there or not there at all.
* A state transition is one ``os.rename`` between two folders of the same
  filesystem, followed by an fsync of both folders (destination first, so the
  new name is durable before the old one's disappearance is).
* Temporary names carry host, pid and a random token: writers on different
  hosts that share a spool over a NAS never collide (joblib#1610), and every
  name starting with ``.`` is invisible to scanners, ``ls`` and submitters'
  Maildir-style drop convention alike.

Only this module and :mod:`spool.store` decide how bytes reach the disk.
"""

from __future__ import annotations

import errno
import os
import re
import stat
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

#: The queue states that are folders of job files (``held`` is pending, set aside
#: by an operator; ``running`` holds one folder per worker).
STATES = ("pending", "held", "running", "complete", "failed")
#: The states whose job files sit directly in ``SPOOL/<state>/``.
FLAT_STATES = ("pending", "held", "complete", "failed")

#: Every top-level folder of a spool, in the order ``spool init`` creates them.
FOLDERS = (
    "incoming",
    "pending",
    "held",
    "running",
    "complete",
    "failed",
    "rejected",
    "attempts",
    "store",
    "manifests",
    "workers",
    "events",
    "approvals",
    "quarantine",
)

#: Errors that mean "this name is not (or no longer) there" on some filesystem.
#: Network filesystems report lost races with odd errnos (sshfs: EPERM, fuse-nfs:
#: EFAULT/ESTALE), so callers classify by this set rather than by ENOENT alone.
VANISHED = frozenset({errno.ENOENT, errno.ESTALE, errno.EPERM, errno.EFAULT, errno.EIO})


#: Errors a reader gets, on some network filesystems, from a file that another client
#: is replacing at that moment (NFS: ESTALE, EFAULT; SMB: EIO; sshfs: EPERM). They
#: pass within milliseconds, so a reader of records other hosts write retries them.
TRANSIENT = frozenset({errno.ESTALE, errno.EFAULT, errno.EIO, errno.EPERM})
#: Pauses between the retries of :func:`read_retrying`, seconds (about 0.3 s in all).
READ_RETRY_PAUSES = (0.01, 0.03, 0.1, 0.2)


def read_retrying(path: Path) -> bytes:
    """The bytes of a file that another host may be replacing right now.

    A transient errno (:data:`TRANSIENT`) is retried after a short pause; the
    last one is raised. ``FileNotFoundError`` is an answer, never retried: the
    file is not there (replacement is a rename, so a reader on a trustworthy
    filesystem never sees a gap).
    """
    for pause in (*READ_RETRY_PAUSES, None):
        try:
            with open(path, "rb") as f:
                return f.read()
        except OSError as exc:
            if exc.errno not in TRANSIENT or pause is None:
                raise
            time.sleep(pause)
    raise AssertionError("unreachable")


class NotRegular(OSError):
    """A name in the queue that is not a regular file (a FIFO, a device, a folder, a link)."""


def read_regular(path: Path) -> bytes:
    """The bytes of a regular file, without following a symbolic link and without
    ever blocking on a FIFO or device: whatever somebody drops into a queue
    folder, reading it cannot hang a daemon. Raises :class:`NotRegular` for
    anything else."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_NOCTTY)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotRegular(errno.EINVAL, "not a regular file", str(path))
        chunks = []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def host_name() -> str:
    """The short host name, made safe to use inside file names."""
    raw = os.uname().nodename.split(".")[0] or "host"  # = socket.gethostname(), without its import
    return "".join(c if c.isalnum() or c in "-_" else "-" for c in raw)


HOST = host_name()


def boot_id() -> str:
    """The kernel's boot id: it changes on every reboot, so a pid is only
    meaningful together with it."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return "unknown"


def temp_name(final_name: str) -> str:
    """A hidden name for a file being written, unique across hosts and processes."""
    return f".{final_name}.{HOST}.{os.getpid()}.{os.urandom(4).hex()}.tmp"


_TEMP = re.compile(r"^\.(?P<final>.+)\.(?P<host>[A-Za-z0-9_-]+)\.(?P<pid>\d+)\.[0-9a-f]{8}(?:\.tmp)?$")


def writer_gone(name: str) -> bool:
    """Whether a hidden temp file or staging folder was left by a process of this
    host that no longer exists (its name says which: ``.<x>.<host>.<pid>.<rand>``).
    Such leftovers can be removed at once; other hosts' only after a grace period."""
    m = _TEMP.match(name)
    if m is None or m.group("host") != HOST:
        return False
    try:
        os.kill(int(m.group("pid")), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def is_visible(name: str) -> bool:
    """Scanners only look at visible, finished names (Maildir convention)."""
    return not name.startswith(".") and not name.endswith(".tmp")


#: What must be durable before any folder of the tree is fsynced: this process's journal
#: files with lines not yet fsynced (:mod:`spool.events` adds one when it writes a line
#: and takes it off once it is durable), so a journal line is never older than the last
#: fsync of the tree and still lost in a power cut.
_riders: set[Any] = set()


def ride_folder_fsyncs(rider: Any) -> None:
    """Have ``rider.commit()`` called before the next folder fsync of this process (and by
    :func:`commit_riders`), until :func:`stop_riding` takes it off."""
    _riders.add(rider)


def stop_riding(rider: Any) -> None:
    _riders.discard(rider)


def commit_riders() -> None:
    """Make every rider's writes durable now (a command's end, a daemon's heartbeat or stop)."""
    for rider in list(_riders):
        rider.commit()


def fsync_dir(path: Path, after: Path | None = None) -> None:
    """Make a folder's entries (new names, renames, removals) durable.

    The riders (this process's journals) are made durable first: the journal's
    group commit rides on the tree's. Then through :mod:`spool.groupcommit`: a
    plain fsync, unless a daemon installed a coalescer (threads share one fsync
    of a folder) or this thread is in a ``together()`` batch (done when the
    batch ends, before anything is told). Neither can be so unless that module
    was imported, so a command that never imports it (the lean CLI) does not
    pay for it (threading, its lock). ``after``: a folder a batch must fsync first
    (see :func:`spool.groupcommit.sync_folder`)."""
    if _riders:
        commit_riders()
    gc = sys.modules.get("spool.groupcommit")
    if gc is not None:
        gc.sync_folder(path, after)
        return
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(
    path: Path,
    data: bytes,
    *,
    mode: int | None = None,
    durable: bool = True,
    replace: bool = True,
    folder_later: bool = False,
) -> None:
    """Write ``data`` to ``path`` so that readers see all of it or nothing.

    Order: write a hidden temp file in the same folder, fsync it, then
    rename it to its final name (``replace=True``) or hard-link it there
    (``replace=False``: fails with ``FileExistsError`` instead of replacing),
    then fsync the folder. ``durable=False`` skips the fsyncs for files that
    are only hints (progress), never for records the invariants depend on.
    ``mode`` is set exactly (0o444 for what must stay read-only); without it
    the process umask decides, as ``[permissions] umask`` configures.
    ``folder_later=True``: the file is fsynced but not its folder, which the
    caller's next step fsyncs anyway (the name is not relied on before then).
    """
    folder = path.parent
    tmp = folder / temp_name(path.name)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666 if mode is None else mode)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        if mode is not None:
            os.chmod(tmp, mode)  # the umask may have narrowed it
        if replace:
            os.replace(tmp, path)
        else:
            link_no_replace(tmp, path)
            os.unlink(tmp)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    if durable and not folder_later:
        fsync_dir(folder)


def link_no_replace(src: Path, dst: Path) -> None:
    """Give ``src`` the extra name ``dst``, failing if ``dst`` exists.

    ``os.link`` is exclusive on local disks, sshfs and NFS. Where a filesystem
    has no hard links, fall back to check-then-rename, which is only
    exclusive between processes that do not race (documented in nas.md).
    """
    try:
        os.link(src, dst)
    except FileExistsError:
        raise
    except OSError as exc:
        if exc.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EIO, errno.EXDEV):
            raise
        if os.path.lexists(dst):
            raise FileExistsError(errno.EEXIST, "file exists", str(dst)) from exc
        # Copy the name, not the content: rename a second temp name into place.
        tmp2 = dst.parent / temp_name(dst.name)
        with open(src, "rb") as fin, open(tmp2, "xb") as fout:
            while chunk := fin.read(1 << 20):
                fout.write(chunk)
            fout.flush()
            os.fsync(fout.fileno())
        os.rename(tmp2, dst)


def rename_durable(src: Path, dst: Path) -> None:
    """One state transition: rename, then fsync the destination and source folders."""
    os.rename(src, dst)
    fsync_dir(dst.parent)
    if src.parent != dst.parent:
        fsync_dir(src.parent, after=dst.parent)


def transfer(src: Path, dst: Path) -> bool:
    """Move a job file from one state folder to another: the one way spool does it.

    Claim, return to pending, takeover, hold, release, cancel, complete and fail
    all come here, so the NAS argument lives in one place:

    * ``os.rename`` is the whole transition; of several racing renames of one
      source exactly one wins on every filesystem spool trusts.
    * A missing destination folder (a worker's first claim) is created and the
      rename tried once more.
    * An error whose errno is in :data:`VANISHED` means "the source is not
      there": either somebody else moved it (we lost), or the reply to our own
      rename was lost and the client retransmitted it (nas.md section 4). We
      tell them apart by looking: if the file is at ``dst`` and no longer at
      ``src``, the rename landed and it is ours.
    * Any other error (EACCES, EROFS, ENOSPC...) is raised: it is located, not
      a lost race, and a caller that swallowed it would spin on it silently.

    Returns ``True`` when the file is now at ``dst`` (durable: the destination
    folder, then the source folder, are fsynced), ``False`` when it was not
    ours to move.
    """
    try:
        os.rename(src, dst)
    except FileNotFoundError:
        if not dst.parent.is_dir() and src.exists():
            make_dirs(dst.parent)
            return transfer(src, dst)
        if not _landed(src, dst):
            return False
    except OSError as exc:
        if exc.errno not in VANISHED:
            raise
        if not _landed(src, dst):
            return False
    fsync_dir(dst.parent)
    if src.parent != dst.parent:
        fsync_dir(src.parent, after=dst.parent)
    return True


def _landed(src: Path, dst: Path) -> bool:
    """After a failed rename: did it happen anyway (a lost reply on a NAS)?"""
    return dst.exists() and not src.exists()


def make_dirs(path: Path) -> None:
    """Create ``path`` and its missing parents, fsyncing each parent that changed."""
    missing: list[Path] = []
    p = path
    while not p.exists():
        missing.append(p)
        p = p.parent
    for d in reversed(missing):
        try:
            os.mkdir(d)
        except FileExistsError:
            continue
        fsync_dir(d.parent)


def visible_names(folder: Path, suffix: str = ".json") -> Iterator[str]:
    """Names of finished files in ``folder`` (no dotfiles, no temp files).

    A directory scan, never a parse: counting 100,000 jobs costs ~40 ms.
    A missing folder is an empty one.
    """
    try:
        it = os.scandir(folder)
    except FileNotFoundError:
        return
    with it:
        for entry in it:
            name = entry.name
            if name.endswith(suffix) and is_visible(name):
                yield name


class Value:
    """A small immutable value: what ``@dataclass(frozen=True)`` gives (equality and
    hash by fields, a repr, no assignment), without importing :mod:`dataclasses`,
    whose import of :mod:`inspect` cost ``spool ls`` a fifth of its start-up.
    A subclass names its fields in ``__match_args__`` and sets them in
    ``__init__`` with :meth:`_set`."""

    __match_args__: tuple[str, ...] = ()

    def _set(self, **fields: Any) -> None:
        for name, value in fields.items():
            object.__setattr__(self, name, value)

    def _key(self) -> tuple[Any, ...]:
        return tuple(getattr(self, name) for name in self.__match_args__)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"cannot assign to field {name!r}")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"cannot delete field {name!r}")

    def __eq__(self, other: object) -> bool:
        if other.__class__ is self.__class__:
            return self._key() == other._key()
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        fields = ", ".join(f"{name}={getattr(self, name)!r}" for name in self.__match_args__)
        return f"{type(self).__name__}({fields})"


class Tree(Value):
    """Paths of one spool. Path arithmetic: nothing here touches the disk except
    :meth:`create`, :meth:`share_with_group` and the :meth:`attempt_numbers` listing."""

    __match_args__ = ("root",)
    root: Path

    def __init__(self, root: Path) -> None:
        self._set(root=root)

    @classmethod
    def at(cls, root: str | os.PathLike[str]) -> Tree:
        return cls(Path(root).absolute())

    # -- folders -----------------------------------------------------------
    @property
    def config_file(self) -> Path:
        return self.root / "spool.toml"

    @property
    def incoming(self) -> Path:
        return self.root / "incoming"

    @property
    def pending(self) -> Path:
        return self.root / "pending"

    @property
    def running(self) -> Path:
        return self.root / "running"

    @property
    def complete(self) -> Path:
        return self.root / "complete"

    @property
    def failed(self) -> Path:
        return self.root / "failed"

    @property
    def rejected(self) -> Path:
        return self.root / "rejected"

    @property
    def attempts(self) -> Path:
        return self.root / "attempts"

    @property
    def held(self) -> Path:
        return self.root / "held"

    @property
    def quarantine(self) -> Path:
        return self.root / "quarantine"

    @property
    def approvals(self) -> Path:
        return self.root / "approvals"

    @property
    def store(self) -> Path:
        return self.root / "store"

    @property
    def manifests(self) -> Path:
        return self.root / "manifests"

    @property
    def workers(self) -> Path:
        return self.root / "workers"

    @property
    def events(self) -> Path:
        return self.root / "events"

    # -- files -------------------------------------------------------------
    def running_dir(self, worker: str) -> Path:
        return self.running / worker

    def job_file(self, state: str, job_id: str, worker: str | None = None) -> Path:
        """Where ``job_id`` lives when it is in ``state`` (running needs a worker)."""
        if state == "running":
            if worker is None:
                raise ValueError("a running job's path needs its worker")
            return self.running / worker / f"{job_id}.json"
        return self.root / state / f"{job_id}.json"

    def job_attempts(self, job_id: str) -> Path:
        return self.attempts / job_id

    def attempt_dir(self, job_id: str, n: int) -> Path:
        return self.attempts / job_id / str(n)

    def attempt_numbers(self, job_id: str) -> list[int]:
        """The job's attempt numbers, ascending (a listing of ``attempts/J/``)."""
        try:
            with os.scandir(self.job_attempts(job_id)) as it:
                return sorted(int(e.name) for e in it if e.name.isdigit())
        except FileNotFoundError:
            return []

    def manifest_file(self, job_id: str) -> Path:
        return self.manifests / f"{job_id}.json"

    def store_file(self, digest: str, ext: str) -> Path:
        """``store/sha256/<aa>/<hash><.ext>``: the content names the file."""
        return self.store / "sha256" / digest[:2] / f"{digest}{ext}"

    def digest_file(self, folder: str, digest: str, suffix: str) -> Path:
        """``<folder>/<sha256><suffix>``: what spool keeps per content hash (poster
        frames, enrichment). The digest is checked, so no caller's string becomes a path."""
        if len(digest) != 64 or digest.strip("0123456789abcdef"):
            raise ValueError(f"{digest!r} is not a sha256 in hex")
        return self.root / folder / f"{digest}{suffix}"

    def worker_file(self, worker: str) -> Path:
        return self.workers / f"{worker}.json"

    def worker_lock(self, worker: str) -> Path:
        return self.workers / f".{worker}.lock"

    def relative(self, path: Path) -> str:
        """A path as recorded in manifests: relative to the spool root."""
        return str(path.relative_to(self.root))

    def create(self) -> None:
        """Create every folder of the tree (idempotent). A new tree gets the newest
        format (``FORMAT``: :mod:`spool.formats`); an existing one keeps its own."""
        from . import formats

        fresh = not (self.root / "pending").is_dir() and not formats.path(self.root).exists()
        make_dirs(self.root)
        for name in FOLDERS:
            make_dirs(self.root / name)
        make_dirs(self.store / "sha256")
        self._make_shards()
        if fresh:
            formats.write(self.root, formats.CURRENT)

    def _make_shards(self) -> None:
        """The store's 256 shard folders ``store/sha256/<aa>/``, made once with one fsync
        (else the first object of each shard pays an fsync of ``store/sha256/``)."""
        base = self.store / "sha256"
        made = False
        for i in range(256):
            try:
                os.mkdir(base / f"{i:02x}")
                made = True
            except FileExistsError:
                pass
        if made:
            fsync_dir(base)

    def share_with_group(self, gid: int) -> None:
        """Let a studio group share the spool: every folder (and the config) is
        owned by the group, group-writable, and setgid, so what anyone creates
        later belongs to the group too. Idempotent."""
        shards = self.store / "sha256"
        paths = [self.root, *(self.root / name for name in FOLDERS), shards]
        paths += sorted(p for p in shards.iterdir() if len(p.name) == 2 and p.is_dir())
        for p in paths:
            os.chown(p, -1, gid)
            os.chmod(p, 0o2775)
        if self.config_file.exists():
            os.chown(self.config_file, -1, gid)
            os.chmod(self.config_file, 0o664)

    def is_spool(self) -> bool:
        return self.config_file.is_file() and self.pending.is_dir()


def server_now(tree: Tree) -> float:
    """The file server's idea of now: the mtime it gives a file we just wrote
    (a hidden probe in ``workers/``, removed at once). Liveness ages heartbeats by
    it, and the overview its ages: on a NAS, the hosts' clocks may disagree."""
    probe = tree.workers / f".clock.{HOST}.{os.getpid()}"
    write_atomic(probe, b"", durable=False)
    try:
        return probe.stat().st_mtime
    finally:
        try:
            probe.unlink()
        except OSError:
            pass
