"""``spool doctor``: what the spool's filesystem really does, and the strategies that follow.

A spool may live on a local disk, on tmpfs, or on a NAS that several hosts
mount. The queue's correctness never depends on the answer (claims are
renames, records are written once under unique names, see nas.md), but two
strategies do:

* **publish**: ``link`` (hard-link the validated file into the store) where
  hard links work and linking onto an existing name fails instead of
  replacing it; ``copy`` (copy, fsync, re-hash, rename) everywhere else.
* **watch**: ``inotify`` wake-ups (plus the rescan timer) where every writer
  goes through this host's kernel, so inotify sees every change; ``poll``
  (the rescan every ``[daemon] poll_interval`` seconds) on network mounts,
  where inotify never sees another host's drops or claims.

``[filesystem] publish`` and ``[daemon] watch`` pin a strategy; ``auto``
lets the probes decide. The daemon runs the quick probes at every start
(well under a second on a local disk) and logs the choices.

Invariants:

* probes touch nothing but ``SPOOL/.doctor/<host>.<pid>.<token>/`` (a hidden
  folder, so no scanner, ``ls`` user or drop convention sees it), and remove
  it afterwards, even when a probe fails;
* a probe never raises: it reports what it saw, or that it could not tell;
* what only a second client can show (locks, inotify and listing lag across
  mounts, racing renames and links) is measured through ``--peer PATH``, the
  same spool seen through another mount of the same export, and is reported
  as "cannot tell from one mount" without it.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import os
import re
import secrets
import select
import shutil
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from . import liveness
from .config import Config
from .tree import HOST, Tree, make_dirs

Kind = Literal["local", "memory", "network", "sync-drive", "fuse", "other"]

#: Filesystems of one machine's own disks: every change goes through this kernel.
LOCAL_FS = frozenset(
    {
        "ext2", "ext3", "ext4", "xfs", "btrfs", "zfs", "f2fs", "jfs", "reiserfs", "bcachefs",
        "nilfs2", "hfsplus", "apfs", "ntfs3", "fuseblk", "vfat", "exfat", "overlay",
    }
)  # fmt: skip
MEMORY_FS = frozenset({"tmpfs", "ramfs"})
#: Filesystems that several machines share: other clients' changes bypass this kernel.
NETWORK_FS = frozenset(
    {
        "nfs", "nfs4", "cifs", "smb3", "smbfs", "9p", "ceph", "fuse.ceph", "fuse.cephfs",
        "glusterfs", "fuse.glusterfs", "lustre", "afs", "gpfs", "beegfs", "ocfs2", "gfs2",
        "fuse.sshfs", "sshfs", "fuse.nfs", "fuse.fuse-nfs", "virtiofs",
    }
)  # fmt: skip
#: Cloud and sync-drive mounts: a VFS layer of their own that broke rename, O_EXCL and
#: mkdir exclusivity in the simulation (nas.md, sections 1 and 4.9).
SYNC_DRIVE_FS = frozenset(
    {
        "fuse.rclone", "rclone", "fuse.s3fs", "fuse.gcsfuse", "fuse.goofys", "fuse.geesefs",
        "fuse.mountpoint-s3", "fuse.onedriver", "fuse.google-drive-ocamlfuse", "fuse.dropbox",
        "fuse.davfs2", "davfs", "fuse.juicefs", "fuse.blobfuse", "fuse.blobfuse2", "fuse.s3backer",
    }
)  # fmt: skip

#: Rounds of each probe: the quick set the daemon runs at start, and the full set.
QUICK_ROUNDS = {"replace": 20, "race": 0}
FULL_ROUNDS = {"replace": 200, "race": 30}


# -- what the report holds -------------------------------------------------------------


@dataclass(frozen=True)
class Mount:
    """One line of ``/proc/self/mountinfo``: the mount that holds a path."""

    mountpoint: str
    fstype: str
    source: str
    options: str

    @property
    def kind(self) -> Kind:
        return classify(self.fstype)


@dataclass
class Finding:
    """One probe's result: ``ok`` is ``None`` when it could not tell."""

    ok: bool | None
    summary: str
    facts: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Choice:
    value: str
    why: str
    pinned: bool


@dataclass
class Report:
    spool: str
    host: str
    mount: Mount
    peer: str | None
    findings: dict[str, Finding]
    publish: Choice
    watch: Choice
    poll_interval: float
    warnings: list[str]
    safe: bool
    seconds: float

    def to_json(self) -> dict[str, Any]:
        return {
            "spool": self.spool,
            "host": self.host,
            "peer": self.peer,
            "mount": {
                "fstype": self.mount.fstype,
                "kind": self.mount.kind,
                "source": self.mount.source,
                "mountpoint": self.mount.mountpoint,
            },
            "probes": {k: {"ok": f.ok, "summary": f.summary, **f.facts} for k, f in self.findings.items()},
            "choices": {
                "publish": {
                    "value": self.publish.value,
                    "why": self.publish.why,
                    "pinned": self.publish.pinned,
                },
                "watch": {
                    "value": self.watch.value,
                    "why": self.watch.why,
                    "pinned": self.watch.pinned,
                    "poll_interval": self.poll_interval,
                },
            },
            "warnings": self.warnings,
            "safe": self.safe,
            "seconds": round(self.seconds, 3),
        }


# -- the mount -------------------------------------------------------------------------


def classify(fstype: str) -> Kind:
    if fstype in SYNC_DRIVE_FS or "rclone" in fstype:
        return "sync-drive"
    if fstype in NETWORK_FS:
        return "network"
    if fstype in MEMORY_FS:
        return "memory"
    if fstype in LOCAL_FS:
        return "local"
    if fstype.startswith("fuse"):
        return "fuse"
    return "other"


def _unescape(field_: str) -> str:
    """mountinfo escapes space, tab, newline and backslash as octal (``\\040``)."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field_)


def parse_mountinfo(text: str) -> list[Mount]:
    """The mounts of ``/proc/self/mountinfo`` text, in mount order."""
    out = []
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        if not sep:
            continue
        lf, rf = left.split(), right.split()
        if len(lf) < 6 or len(rf) < 2:
            continue
        out.append(Mount(_unescape(lf[4]), rf[0], _unescape(rf[1]), lf[5]))
    return out


def mount_of(path: Path, mountinfo: str | None = None) -> Mount:
    """The mount that holds ``path`` (the longest mount point above it; the
    last one mounted wins where mounts are stacked)."""
    if mountinfo is None:
        try:
            mountinfo = Path("/proc/self/mountinfo").read_text()
        except OSError:
            mountinfo = ""
    real = os.path.realpath(path)
    best: Mount | None = None
    for m in parse_mountinfo(mountinfo):
        mp = m.mountpoint.rstrip("/") or "/"
        inside = real == mp or real.startswith(mp + "/") or mp == "/"
        if inside and (best is None or len(mp) >= len(best.mountpoint.rstrip("/") or "/")):
            best = m
    return best or Mount("/", "unknown", "unknown", "")


# -- the probe folder ------------------------------------------------------------------


class _Lab:
    """``SPOOL/.doctor/<host>.<pid>.<token>/``, and the same folder through ``--peer``."""

    def __init__(self, tree: Tree, peer: Path | None) -> None:
        name = f"{HOST}.{os.getpid()}.{secrets.token_hex(3)}"
        self.dir = tree.root / ".doctor" / name
        self.peer = peer / ".doctor" / name if peer is not None else None
        self._n = 0

    def __enter__(self) -> _Lab:
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

    def fresh(self, stem: str) -> Path:
        """A new name in the lab (nothing exists there yet)."""
        self._n += 1
        return self.dir / f"{stem}-{self._n}"

    def via_peer(self, p: Path) -> Path:
        assert self.peer is not None
        return self.peer / p.relative_to(self.dir)


def _name(exc: OSError) -> str:
    return errno.errorcode.get(exc.errno or 0, str(exc.errno))


def _write(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)


def _read(path: Path) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def _race(
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
                results.append(_name(exc))

        ts = [threading.Thread(target=run, args=(fn,)) for fn in (one, two)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        seen.update(results)
        bad += results.count("ok") != 1
    return seen, bad


# -- the probes ------------------------------------------------------------------------


def probe_rename(lab: _Lab, rounds: int) -> Finding:
    """A rename replaces an existing name, and readers never find the name missing.

    This process replaces a file ``rounds`` times (each time with another length)
    while reader threads keep reading it: first on this mount only, then (with
    ``--peer``) on the peer only, then on both. A gap seen only on this mount is
    the client's doing (sshfs answers ENOENT to a reader racing a replace on the
    writer's own mount); a gap through the peer means the server replaces by
    delete-then-move (rclone); a gap through the peer only while this mount has
    the file open means the client hides the open file by a rename of its own
    before replacing it (sshfs's ``.fuse_hidden`` files).
    """
    target = lab.fresh("rename")
    try:
        _write(target, b"one")
        tmp = lab.fresh(".rename")
        _write(tmp, b"two!")
        os.rename(tmp, target)
        replaces = _read(target) == b"two!"
    except OSError as exc:
        return Finding(False, f"renaming onto an existing file fails with {_name(exc)}", {"replaces": False})
    if not replaces:
        return Finding(False, "renaming onto an existing file leaves the old content", {"replaces": False})
    here = _replace_while_reading(lab, target, rounds, [("here", target)])["here"]
    facts: dict[str, Any] = {"replaces": True, "rounds": rounds, "here": dict(here)}
    summary = f"replaces an existing file ({rounds} replacements)"
    ok = True
    if lab.peer is not None:
        peer = _replace_while_reading(lab, target, rounds, [("peer", lab.via_peer(target))])["peer"]
        both = _replace_while_reading(lab, target, rounds, [("here", target), ("peer", lab.via_peer(target))])
        facts["peer"], facts["peer_while_open_here"] = dict(peer), dict(both["peer"])
        if peer["missing"]:
            ok = False
            summary += f"; NOT atomically: the peer found the name missing {peer['missing']} times"
        else:
            summary += "; atomic as the peer sees it"
            if both["peer"]["missing"]:
                summary += (
                    f", except while the file is open on this mount (missing {both['peer']['missing']} "
                    "times: the client hides an open file before replacing it)"
                )
    if here["missing"]:
        summary += f"; a reader on this mount found the name missing {here['missing']} times (readers retry)"
    else:
        summary += "; never missing for a reader on this mount"
    short = sum(c.get("short", 0) for k, c in facts.items() if isinstance(c, dict))
    if short:
        summary += f"; {short} reads were short (readers retry)"
    return Finding(ok, summary, facts)


def _replace_while_reading(
    lab: _Lab, target: Path, rounds: int, readers: list[tuple[str, Path]]
) -> dict[str, Counter[str]]:
    """Replace ``target`` ``rounds`` times while the readers read it; what each saw."""
    versions = {b"two!"} | {b"v" * (1 + k % 97) + b"." for k in range(rounds)}
    done = threading.Event()
    seen: dict[str, Counter[str]] = {where: Counter(reads=0, missing=0, short=0) for where, _ in readers}

    def reader(where: str, path: Path) -> None:
        c = seen[where]
        while not done.is_set():
            try:
                data = _read(path)
            except OSError:
                c["missing"] += 1
                continue
            c["reads"] += 1
            c["short"] += data not in versions

    threads = [threading.Thread(target=reader, args=r, daemon=True) for r in readers]
    for t in threads:
        t.start()
    try:
        for k in range(rounds):
            tmp = lab.fresh(".rename")
            _write(tmp, b"v" * (1 + k % 97) + b".")
            os.replace(tmp, target)
    finally:
        done.set()
        for t in threads:
            t.join()
    return seen


def probe_rename_race(lab: _Lab, rounds: int) -> Finding:
    """Two clients rename the same file into two folders at once: exactly one may win."""
    if lab.peer is None or rounds == 0:
        return Finding(None, "cannot tell from one mount (pass --peer PATH)")
    a, b = lab.fresh("race-a"), lab.fresh("race-b")
    os.mkdir(a)
    os.mkdir(b)
    src = lab.fresh("race-src")
    os.mkdir(src)

    def prep(i: int) -> None:
        _write(src / f"j{i}", b"job")

    def mine(i: int) -> None:
        os.rename(src / f"j{i}", a / f"j{i}")

    def theirs(i: int) -> None:
        os.rename(lab.via_peer(src) / f"j{i}", lab.via_peer(b) / f"j{i}")

    seen, bad = _race(rounds, mine, theirs, prep)
    landed = sum(1 for i in range(rounds) for d in (a, b) if (d / f"j{i}").exists())
    losers = sorted(k for k in seen if k != "ok")
    facts = {"rounds": rounds, "not_exactly_one": bad, "landed": landed, "loser_errnos": losers}
    if bad:
        return Finding(False, f"DOUBLE OR NO WINS in {bad} of {rounds} rename races", facts)
    return Finding(
        True, f"exactly one winner in {rounds} of {rounds} races; the loser gets {'/'.join(losers)}", facts
    )


def probe_links(lab: _Lab, rounds: int) -> Finding:
    """Hard links exist, share content, and never replace an existing name."""
    src, dst, other = lab.fresh("link-src"), lab.fresh("link-dst"), lab.fresh("link-taken")
    _write(src, b"content")
    _write(other, b"taken")
    try:
        os.link(src, dst)
    except OSError as exc:
        return Finding(False, f"no hard links here (link fails with {_name(exc)})", {"links": False})
    if _read(dst) != b"content":
        return Finding(False, "a hard link does not show the same content", {"links": False})
    nlink = os.stat(src).st_nlink
    try:
        os.link(src, other)
        return Finding(
            False, "linking onto an existing name replaced it", {"links": True, "exclusive": False}
        )
    except OSError as exc:
        onto = _name(exc)
    facts: dict[str, Any] = {"links": True, "exclusive": True, "existing_errno": onto, "nlink_seen": nlink}
    summary = f"yes; linking onto an existing name fails with {onto}"
    if nlink != 2:
        summary += f" (link count shows {nlink}, stale)"
    if lab.peer is not None and rounds:
        race_dir = lab.fresh("link-race")
        os.mkdir(race_dir)

        def mine(i: int) -> None:
            os.link(src, race_dir / f"n{i}")

        def theirs(i: int) -> None:
            os.link(lab.via_peer(src), lab.via_peer(race_dir) / f"n{i}")

        seen, bad = _race(rounds, mine, theirs)
        losers = sorted(k for k in seen if k != "ok")
        facts.update(race_rounds=rounds, race_not_exactly_one=bad, race_loser_errnos=losers)
        if bad:
            facts["exclusive"] = False
            return Finding(False, summary + f"; BUT {bad} of {rounds} link races had two winners", facts)
        summary += f"; in a race through another mount the loser gets {'/'.join(losers)}"
    return Finding(True, summary, facts)


def probe_excl(lab: _Lab, rounds: int) -> Finding:
    """``O_CREAT|O_EXCL`` refuses an existing name (spool never relies on it across hosts)."""
    p = lab.fresh("excl")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL
    os.close(os.open(p, flags, 0o644))
    try:
        os.close(os.open(p, flags, 0o644))
        return Finding(False, "O_EXCL opened an existing file", {"exclusive": False})
    except OSError as exc:
        again = _name(exc)
    facts: dict[str, Any] = {"exclusive": True, "existing_errno": again}
    summary = f"exclusive on this mount; an existing name fails with {again}"
    if lab.peer is not None and rounds:
        d = lab.fresh("excl-race")
        os.mkdir(d)

        def mine(i: int) -> None:
            os.close(os.open(d / f"x{i}", flags, 0o644))

        def theirs(i: int) -> None:
            os.close(os.open(lab.via_peer(d) / f"x{i}", flags, 0o644))

        seen, bad = _race(rounds, mine, theirs)
        losers = sorted(k for k in seen if k != "ok")
        facts.update(race_rounds=rounds, race_not_exactly_one=bad, race_loser_errnos=losers)
        if bad:
            facts["exclusive"] = False
            return Finding(
                False, f"NOT exclusive across mounts: {bad} of {rounds} races had two winners", facts
            )
        summary += f"; across mounts exact in {rounds} races, the loser gets {'/'.join(losers)}"
    return Finding(True, summary, facts)


def probe_locks(lab: _Lab) -> Finding:
    """flock between two opens on this mount (what the worker identity needs), and
    whether a lock taken here is seen through the peer mount (nothing relies on it)."""
    p = lab.fresh("lock")
    _write(p, b"")
    held = os.open(p, os.O_RDONLY)
    try:
        try:
            fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            return Finding(False, f"flock fails here ({_name(exc)})", {"local": False})
        local = _tries_lock(p)
        facts: dict[str, Any] = {"local": not local}
        if local:
            return Finding(False, "a second open on this mount can take a held lock", facts)
        if lab.peer is None:
            return Finding(
                None,
                "cannot tell from one mount (pass --peer PATH); locks work between processes here",
                facts,
            )
        across = not _tries_lock(lab.via_peer(p))
        facts["across_mounts"] = across
        if across:
            return Finding(True, "seen across mounts (spool still relies on none)", facts)
        return Finding(True, "local to each client: a lock held here is not seen through the peer", facts)
    finally:
        os.close(held)


def _tries_lock(p: Path) -> bool:
    """Whether a new open of ``p`` can take an exclusive flock (then drops it)."""
    fd = os.open(p, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


_IN_MODIFY, _IN_CLOSE_WRITE, _IN_MOVED_FROM, _IN_MOVED_TO = 0x2, 0x8, 0x40, 0x80
_IN_CREATE, _IN_DELETE = 0x100, 0x200
_IN_MASK = _IN_MODIFY | _IN_CLOSE_WRITE | _IN_MOVED_FROM | _IN_MOVED_TO | _IN_CREATE | _IN_DELETE


@contextlib.contextmanager
def _inotify(folder: Path) -> Iterator[int | None]:
    """An inotify fd watching ``folder`` (``None`` where inotify is unavailable)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
    except (OSError, AttributeError):
        yield None
        return
    if fd < 0:
        yield None
        return
    try:
        if libc.inotify_add_watch(fd, os.fsencode(folder), _IN_MASK) < 0:
            yield None
        else:
            yield fd
    finally:
        os.close(fd)


def _fires(folder: Path, change: Callable[[], None], timeout: float) -> float | None:
    """Seconds until an inotify event on ``folder`` after ``change()``; ``None``: no event."""
    with _inotify(folder) as fd:
        if fd is None:
            return None
        t0 = time.monotonic()
        change()
        ready, _, _ = select.select([fd], [], [], timeout)
        return time.monotonic() - t0 if ready else None


def probe_inotify(lab: _Lab, timeout: float) -> Finding:
    """Does an event fire for a drop made through this mount, and (with --peer) for
    one made through the other mount?"""
    d = lab.fresh("watch")
    os.mkdir(d)

    def drop_here() -> None:
        _write(d / ".drop.tmp", b"{}")
        os.rename(d / ".drop.tmp", d / "drop.json")

    here = _fires(d, drop_here, timeout)
    facts: dict[str, Any] = {"this_mount": here is not None}
    if here is None:
        return Finding(False, f"no event within {timeout:g} s for a change made through this mount", facts)
    summary = "fires for changes made through this mount"
    if lab.peer is None:
        return Finding(True, summary + "; other mounts: cannot tell from one mount (pass --peer PATH)", facts)
    peer_dir = lab.via_peer(d)

    def drop_there() -> None:
        _write(peer_dir / ".drop2.tmp", b"{}")
        os.rename(peer_dir / ".drop2.tmp", peer_dir / "drop2.json")

    there = _fires(d, drop_there, max(timeout, 2.0))
    facts["other_mount"] = there is not None
    if there is None:
        return Finding(True, summary + "; NOT for changes made through another mount", facts)
    return Finding(True, summary + " and through another mount", facts)


def probe_lag(lab: _Lab, timeout: float) -> Finding:
    """How long the peer mount takes to list a new name, and to stop finding a renamed one.

    The peer first lists the folder and stats the old name, so its caches hold
    the state before the change (as a daemon's would).
    """
    if lab.peer is None:
        return Finding(None, "cannot tell from one mount (pass --peer PATH)")
    d = lab.fresh("lag")
    os.mkdir(d)
    old = d / "old.json"
    _write(old, b"{}")
    pd = lab.via_peer(d)
    deadline = time.monotonic() + timeout
    while "old.json" not in os.listdir(pd):  # the peer sees the folder as it is now
        if time.monotonic() > deadline:
            return Finding(None, f"the peer never listed {old.name} within {timeout:g} s", {})
        time.sleep(0.05)
    os.stat(pd / "old.json")
    t0 = time.monotonic()
    tmp = d / ".new.json.tmp"
    _write(tmp, b"{}")
    os.rename(tmp, d / "new.json")
    os.rename(old, d / "moved.json")
    listed = gone = None
    while time.monotonic() - t0 < timeout and (listed is None or gone is None):
        now = time.monotonic() - t0
        if listed is None and "new.json" in os.listdir(pd):
            listed = now
        if gone is None and not os.path.exists(pd / "old.json"):
            gone = now
        time.sleep(0.02)
    facts = {"listing_seconds": _r(listed), "stale_stat_seconds": _r(gone), "timeout": timeout}
    if listed is None or gone is None:
        return Finding(False, f"the peer still showed the old folder after {timeout:g} s", facts)
    return Finding(
        True,
        f"a new name is listed through the peer after {listed:.1f} s; "
        f"a renamed file still stats there for {gone:.1f} s",
        facts,
    )


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 3)


def probe_mtime(lab: _Lab) -> Finding:
    """The granularity of modification times, and the file server's clock against ours."""
    p = lab.fresh("mtime")
    before = time.time()
    _write(p, b"")
    after = time.time()
    written = os.stat(p).st_mtime
    offset = 0.0 if before - 1 <= written <= after + 1 else written - (before + after) / 2
    asked = 1_700_000_000_123_456_789
    os.utime(p, ns=(asked, asked))
    got = os.stat(p).st_mtime_ns
    gran = next((10**k for k in range(10) if asked - asked % 10**k == got), None)
    if gran is None and got == asked - asked % 2_000_000_000:
        gran = 2_000_000_000
    facts: dict[str, Any] = {"granularity_ns": gran, "server_clock_offset": round(offset, 3)}
    text = _granularity(gran)
    clock = (
        f"server clock {offset:+.1f} s from this host's" if offset else "server clock agrees with this host's"
    )
    return Finding(True, f"{text}; {clock}", facts)


def _granularity(ns: int | None) -> str:
    if ns is None:
        return "granularity unknown (times set are not read back)"
    for unit, size in (("s", 10**9), ("ms", 10**6), ("µs", 10**3), ("ns", 1)):
        if ns >= size:
            return f"{ns / size:g} {unit} granularity"
    return f"{ns} ns granularity"


def probe_space(tree: Tree, cfg: Config) -> Finding:
    st = os.statvfs(tree.root)
    free = st.f_bavail * st.f_frsize
    want = cfg.limits.temp_disk_bytes
    facts = {"free_bytes": free, "temp_disk_bytes": want}
    text = f"{_size(free)} free"
    if free < want:
        return Finding(False, f"{text}, less than limits.temp_disk ({_size(want)})", facts)
    return Finding(True, f"{text} (limits.temp_disk {_size(want)})", facts)


def _size(n: int) -> str:
    for unit, k in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= k:
            return f"{n / k:.1f} {unit}"
    return f"{n} B"


def probe_fsync(lab: _Lab) -> Finding:
    p = lab.fresh("fsync")
    try:
        with open(p, "wb") as f:
            f.write(b"x")
            f.flush()
            os.fsync(f.fileno())
        fd = os.open(lab.dir, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as exc:
        return Finding(False, f"fsync fails with {_name(exc)}", {})
    return Finding(True, "files and folders fsync without error", {})


# -- decisions -------------------------------------------------------------------------


def choose_publish(cfg: Config, links: Finding) -> Choice:
    pinned = cfg.filesystem.publish
    if pinned != "auto":
        return Choice(pinned, "pinned in spool.toml ([filesystem] publish)", True)
    if links.ok:
        return Choice("link", "hard links work and never replace an existing name", False)
    return Choice("copy", f"hard links cannot be trusted here ({links.summary}): copy, fsync, re-hash", False)


def choose_watch(cfg: Config, mount: Mount, inotify: Finding) -> Choice:
    pinned = cfg.daemon.watch
    if pinned != "auto":
        return Choice(pinned, "pinned in spool.toml ([daemon] watch)", True)
    every = f"rescan every {cfg.daemon.poll_interval:g} s"
    if not inotify.facts.get("this_mount"):
        return Choice("poll", f"inotify gives no events here; {every}", False)
    if "other_mount" in inotify.facts:
        if inotify.facts["other_mount"]:
            return Choice("inotify", "inotify sees changes made through other mounts too", False)
        return Choice("poll", f"inotify misses changes made through other mounts; {every}", False)
    if mount.kind in ("local", "memory"):
        return Choice("inotify", f"a {mount.kind} filesystem: every change goes through this kernel", False)
    return Choice(
        "poll", f"{mount.fstype} is shared: inotify never sees other hosts' changes; {every}", False
    )


def _warnings(cfg: Config, mount: Mount, f: dict[str, Finding], publish: Choice, watch: Choice) -> list[str]:
    out = []
    if mount.kind == "sync-drive":
        out.append(
            f"UNSAFE: the spool is on {mount.fstype}, a cloud or sync-drive mount. Such mounts broke "
            "rename (two winners), replace (delete then move), O_EXCL and mkdir in tests; do not "
            "share a spool through it: use NFS, SMB or sshfs."
        )
    elif mount.kind in ("fuse", "other"):
        out.append(f"{mount.fstype} is not a filesystem spool knows; treated as shared (polling).")
    if f["rename_race"].ok is False:
        out.append(f"UNSAFE: {f['rename_race'].summary}; claims by rename cannot be trusted here.")
    if not f["rename"].facts.get("replaces", True):
        out.append(f"UNSAFE: {f['rename'].summary}; records cannot be rewritten in place here.")
    elif f["rename"].ok is False:
        out.append(f"{f['rename'].summary}: rewritten records (heartbeats) can be missing for a moment.")
    if f["fsync"].ok is False:
        out.append(f"{f['fsync'].summary}: records may not survive a crash of the file server.")
    if f["locks"].ok is False:
        out.append(f"{f['locks'].summary}: two daemons of one identity on this host are not kept apart.")
    if f["space"].ok is False:
        out.append(f["space"].summary + ".")
    if publish.pinned and publish.value == "link" and not f["links"].ok:
        out.append(
            f'[filesystem] publish = "link" is pinned, but {f["links"].summary}; the store copies instead.'
        )
    shared = mount.kind not in ("local", "memory")
    if watch.pinned and watch.value == "inotify" and shared:
        out.append(
            f'[daemon] watch = "inotify" on a shared {mount.fstype}: other hosts\' drops are still '
            f"only seen by the rescan every {cfg.daemon.poll_interval:g} s."
        )
    lag = f["lag"].facts.get("listing_seconds")
    if shared and cfg.recovery.stale_after < max(60.0, 3 * (lag or 0)):
        out.append(
            f"[recovery] stale_after = {cfg.recovery.stale_after:g} s is short for a shared mount"
            + (f" whose listings lag {lag:.0f} s" if lag else "")
            + ": use at least 60 s (nas.md 4.5)."
        )
    return out


# -- running it ------------------------------------------------------------------------


def run(
    tree: Tree,
    cfg: Config,
    *,
    peer: Path | None = None,
    quick: bool = False,
    lag_timeout: float = 40.0,
    mountinfo: str | None = None,
) -> Report:
    """Probe the spool's filesystem and choose the strategies.

    ``quick`` is the daemon's start-up set (no peer, few rounds). ``peer`` is
    the same spool through another mount of the same export.
    """
    t0 = time.monotonic()
    rounds = QUICK_ROUNDS if quick else FULL_ROUNDS
    mount = mount_of(tree.root, mountinfo)
    if peer is not None:
        peer = Path(peer).absolute()
    findings: dict[str, Finding] = {}
    with _Lab(tree, peer) as lab:
        if lab.peer is not None:
            _await_peer(lab, lag_timeout)
        probes: list[tuple[str, Callable[[], Finding]]] = [
            ("rename", lambda: probe_rename(lab, rounds["replace"])),
            ("rename_race", lambda: probe_rename_race(lab, rounds["race"])),
            ("links", lambda: probe_links(lab, rounds["race"])),
            ("o_excl", lambda: probe_excl(lab, rounds["race"])),
            ("locks", lambda: probe_locks(lab)),
            ("inotify", lambda: probe_inotify(lab, 0.5)),
            ("lag", lambda: probe_lag(lab, lag_timeout)),
            ("mtime", lambda: probe_mtime(lab)),
            ("space", lambda: probe_space(tree, cfg)),
            ("fsync", lambda: probe_fsync(lab)),
        ]
        for key, probe in probes:
            try:
                findings[key] = probe()
            except OSError as exc:
                findings[key] = Finding(None, f"the probe failed: {exc.strerror or exc} ({_name(exc)})")
    publish = choose_publish(cfg, findings["links"])
    watch = choose_watch(cfg, mount, findings["inotify"])
    warnings = _warnings(cfg, mount, findings, publish, watch)
    safe = (
        mount.kind != "sync-drive"
        and findings["rename"].facts.get("replaces", True)
        and findings["rename_race"].ok is not False
    )
    return Report(
        spool=str(tree.root),
        host=HOST,
        mount=mount,
        peer=str(peer) if peer is not None else None,
        findings=findings,
        publish=publish,
        watch=watch,
        poll_interval=cfg.daemon.poll_interval,
        warnings=warnings,
        safe=safe,
        seconds=time.monotonic() - t0,
    )


class PeerMismatch(OSError):
    """``--peer`` does not show this spool's files."""


def _await_peer(lab: _Lab, timeout: float) -> None:
    """The lab folder must appear through the peer path: else it is another folder."""
    assert lab.peer is not None
    deadline = time.monotonic() + timeout
    while not lab.peer.is_dir():
        if time.monotonic() > deadline:
            raise PeerMismatch(
                errno.ENOENT,
                f"{lab.peer.parent.parent} does not show this spool's files within {timeout:g} s; "
                "--peer must be the same spool folder seen through another mount",
            )
        time.sleep(0.05)


#: Probe names as people read them, in report order.
LABELS = {
    "rename": "rename",
    "rename_race": "rename race",
    "links": "hard links",
    "o_excl": "O_EXCL",
    "locks": "locks",
    "inotify": "inotify",
    "lag": "listing lag",
    "mtime": "mtime",
    "space": "free space",
    "fsync": "fsync",
}


def render(report: Report) -> str:
    """The report for a terminal: one line per probe, then the choices and warnings."""
    m = report.mount
    lines = [
        f"spool doctor: {report.spool} on {HOST}" + (f" (peer: {report.peer})" if report.peer else ""),
        f"  {'filesystem':<12} {m.fstype} ({m.kind}) {m.source} on {m.mountpoint}",
    ]
    for key, f in report.findings.items():
        mark = {True: " ", False: "!", None: "?"}[f.ok]
        lines.append(f"{mark} {LABELS.get(key, key):<12} {f.summary}")
    for name, c in (("publish", report.publish), ("watch", report.watch)):
        value = c.value + (f" (every {report.poll_interval:g} s)" if c.value == "poll" else "")
        lines.append(f"=> {name:<10} {value}: {c.why}")
    lines += [f"WARNING: {w}" for w in report.warnings]
    lines.append(f"({report.seconds:.2f} s)")
    return "\n".join(lines)
