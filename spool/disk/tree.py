"""The spool tree: where every file lives (its folders and names, :class:`Tree`).

How bytes reach the disk is :mod:`spool.disk.durable`, the tree layer's toolkit; its names
are imported here, so ``from spool.disk.tree import write_atomic`` keeps working for
every module that writes to a spool.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from spool.disk import formats
from spool.disk.durable import (
    HOST,
    NO_LINKS,
    READ_RETRY_PAUSES,
    TRANSIENT,
    VANISHED,
    Listing,
    NotRegular,
    Prepared,
    apply_umask,
    boot_id,
    commit_riders,
    copy_verified,
    fsync_dir,
    fsync_folder_now,
    host_name,
    is_visible,
    link_no_replace,
    link_or_copy,
    list_folder,
    make_dirs,
    read_regular,
    read_retrying,
    rename_durable,
    replace_existing,
    ride_folder_fsyncs,
    riding,
    route_folder_fsyncs,
    stop_riding,
    temp_name,
    transfer,
    visible_names,
    write_atomic,
    write_unseen,
    writer_gone,
)

__all__ = [
    "FLAT_STATES",
    "FOLDERS",
    "HOST",
    "JOB_COPY",
    "NO_LINKS",
    "READ_RETRY_PAUSES",
    "STATES",
    "SUBMISSION",
    "TRANSIENT",
    "VANISHED",
    "Listing",
    "NotRegular",
    "Prepared",
    "Tree",
    "Value",
    "apply_umask",
    "boot_id",
    "commit_riders",
    "copy_verified",
    "fsync_dir",
    "fsync_folder_now",
    "host_name",
    "is_visible",
    "link_no_replace",
    "link_or_copy",
    "list_folder",
    "make_dirs",
    "read_regular",
    "read_retrying",
    "rename_durable",
    "replace_existing",
    "ride_folder_fsyncs",
    "riding",
    "route_folder_fsyncs",
    "server_now",
    "stop_riding",
    "temp_name",
    "transfer",
    "visible_names",
    "write_atomic",
    "write_unseen",
    "writer_gone",
]

#: The job's frozen copy in its reservation folder (``attempts/<job>/job.json``):
#: the same bytes as the job file, read-only (format 2: a hard link of the job file),
#: written by the acceptor whose job file won (and again when a dependent is frozen on
#: release). ``spool fsck`` restores a job file that went missing from every
#: state folder from it.
JOB_COPY = "job.json"
#: The accepted drop as it was submitted (``attempts/<job>/submission.json``, format 2):
#: moved out of ``incoming/`` once its job is durable, never fsynced, never read by spool.
SUBMISSION = "submission.json"

#: The queue states that are folders of job files (``held`` is pending, set aside
#: by an operator; ``running`` holds one folder per worker).
STATES = ("waiting", "pending", "held", "running", "complete", "failed")
#: The states whose job files sit directly in ``SPOOL/<state>/`` (``waiting``: a job whose
#: sources come from other jobs not yet published, spool.queue.depends).
FLAT_STATES = ("waiting", "pending", "held", "complete", "failed")

#: Every top-level folder of a spool, in the order ``spool init`` creates them.
FOLDERS = (
    "incoming",
    "waiting",
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
    "deps",
    "variants",
)


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
    # The folders (FOLDERS): plain attributes, joined once (a property joined a path at
    # every use, ~90 joins a job on the daemon's path).
    config_file: Path
    incoming: Path
    pending: Path
    running: Path
    complete: Path
    failed: Path
    rejected: Path
    attempts: Path
    waiting: Path
    deps: Path
    variants: Path
    held: Path
    quarantine: Path
    approvals: Path
    store: Path
    manifests: Path
    workers: Path
    events: Path

    def __init__(self, root: Path) -> None:
        self._set(root=root, config_file=root / "spool.toml", **{name: root / name for name in FOLDERS})

    @classmethod
    def at(cls, root: str | os.PathLike[str]) -> Tree:
        return cls(Path(root).absolute())

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

    def tidy_running(self, worker: str) -> None:
        """Remove ``running/<worker>/`` if it is empty: a command's brief holder
        (``<host>-cancel``, ``<host>-adopt``) leaves no folder that ``ls running`` shows
        as a worker. A holder that needs it again makes it again (``transfer`` does)."""
        try:
            os.rmdir(self.running / worker)
        except OSError:
            pass  # not empty (another holder on this host, an interrupted run's jobs), or gone

    def relative(self, path: Path) -> str:
        """A path as recorded in manifests: relative to the spool root."""
        return str(path.relative_to(self.root))

    def create(self) -> None:
        """Create every folder of the tree (idempotent). A new tree gets the newest
        format (``FORMAT``: :mod:`spool.disk.formats`); an existing one keeps its own."""
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
