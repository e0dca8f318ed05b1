"""The probes: what the spool's filesystem really does, each measured in the lab folder.

A probe never raises for what it finds: it returns a :class:`Finding` (``ok``
is ``None`` when it could not tell). What only a second client can show is
measured through the lab's peer path, and reported as "cannot tell from one
mount" without it.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import os
import select
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from spool.core.config import Config
from spool.disk.tree import Tree
from spool.doctor.lab import Lab, errno_name, race, read, write
from spool.doctor.report import Finding


def probe_rename(lab: Lab, rounds: int) -> Finding:
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
        write(target, b"one")
        tmp = lab.fresh(".rename")
        write(tmp, b"two!")
        os.rename(tmp, target)
        replaces = read(target) == b"two!"
    except OSError as exc:
        return Finding(
            False, f"renaming onto an existing file fails with {errno_name(exc)}", {"replaces": False}
        )
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
    lab: Lab, target: Path, rounds: int, readers: list[tuple[str, Path]]
) -> dict[str, Counter[str]]:
    """Replace ``target`` ``rounds`` times while the readers read it; what each saw."""
    versions = {b"two!"} | {b"v" * (1 + k % 97) + b"." for k in range(rounds)}
    done = threading.Event()
    seen: dict[str, Counter[str]] = {where: Counter(reads=0, missing=0, short=0) for where, _ in readers}

    def reader(where: str, path: Path) -> None:
        c = seen[where]
        while not done.is_set():
            try:
                data = read(path)
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
            write(tmp, b"v" * (1 + k % 97) + b".")
            os.replace(tmp, target)
    finally:
        done.set()
        for t in threads:
            t.join()
    return seen


def probe_rename_race(lab: Lab, rounds: int) -> Finding:
    """Two clients rename the same file into two folders at once: exactly one may win."""
    if lab.peer is None or rounds == 0:
        return Finding(None, "cannot tell from one mount (pass --peer PATH)")
    a, b = lab.fresh("race-a"), lab.fresh("race-b")
    os.mkdir(a)
    os.mkdir(b)
    src = lab.fresh("race-src")
    os.mkdir(src)

    def prep(i: int) -> None:
        write(src / f"j{i}", b"job")

    def mine(i: int) -> None:
        os.rename(src / f"j{i}", a / f"j{i}")

    def theirs(i: int) -> None:
        os.rename(lab.via_peer(src) / f"j{i}", lab.via_peer(b) / f"j{i}")

    seen, bad = race(rounds, mine, theirs, prep)
    landed = sum(1 for i in range(rounds) for d in (a, b) if (d / f"j{i}").exists())
    losers = sorted(k for k in seen if k != "ok")
    facts = {"rounds": rounds, "not_exactly_one": bad, "landed": landed, "loser_errnos": losers}
    if bad:
        return Finding(False, f"DOUBLE OR NO WINS in {bad} of {rounds} rename races", facts)
    return Finding(
        True, f"exactly one winner in {rounds} of {rounds} races; the loser gets {'/'.join(losers)}", facts
    )


def probe_links(lab: Lab, rounds: int) -> Finding:
    """Hard links exist, share content, and never replace an existing name."""
    src, dst, other = lab.fresh("link-src"), lab.fresh("link-dst"), lab.fresh("link-taken")
    write(src, b"content")
    write(other, b"taken")
    try:
        os.link(src, dst)
    except OSError as exc:
        return Finding(False, f"no hard links here (link fails with {errno_name(exc)})", {"links": False})
    if read(dst) != b"content":
        return Finding(False, "a hard link does not show the same content", {"links": False})
    nlink = os.stat(src).st_nlink
    try:
        os.link(src, other)
        return Finding(
            False, "linking onto an existing name replaced it", {"links": True, "exclusive": False}
        )
    except OSError as exc:
        onto = errno_name(exc)
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

        seen, bad = race(rounds, mine, theirs)
        losers = sorted(k for k in seen if k != "ok")
        facts.update(race_rounds=rounds, race_not_exactly_one=bad, race_loser_errnos=losers)
        if bad:
            facts["exclusive"] = False
            return Finding(False, summary + f"; BUT {bad} of {rounds} link races had two winners", facts)
        summary += f"; in a race through another mount the loser gets {'/'.join(losers)}"
    return Finding(True, summary, facts)


def probe_excl(lab: Lab, rounds: int) -> Finding:
    """``O_CREAT|O_EXCL`` refuses an existing name (spool never relies on it across hosts)."""
    p = lab.fresh("excl")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL
    os.close(os.open(p, flags, 0o644))
    try:
        os.close(os.open(p, flags, 0o644))
        return Finding(False, "O_EXCL opened an existing file", {"exclusive": False})
    except OSError as exc:
        again = errno_name(exc)
    facts: dict[str, Any] = {"exclusive": True, "existing_errno": again}
    summary = f"exclusive on this mount; an existing name fails with {again}"
    if lab.peer is not None and rounds:
        d = lab.fresh("excl-race")
        os.mkdir(d)

        def mine(i: int) -> None:
            os.close(os.open(d / f"x{i}", flags, 0o644))

        def theirs(i: int) -> None:
            os.close(os.open(lab.via_peer(d) / f"x{i}", flags, 0o644))

        seen, bad = race(rounds, mine, theirs)
        losers = sorted(k for k in seen if k != "ok")
        facts.update(race_rounds=rounds, race_not_exactly_one=bad, race_loser_errnos=losers)
        if bad:
            facts["exclusive"] = False
            return Finding(
                False, f"NOT exclusive across mounts: {bad} of {rounds} races had two winners", facts
            )
        summary += f"; across mounts exact in {rounds} races, the loser gets {'/'.join(losers)}"
    return Finding(True, summary, facts)


def probe_locks(lab: Lab) -> Finding:
    """flock between two opens on this mount (what the worker identity needs), and
    whether a lock taken here is seen through the peer mount (nothing relies on it)."""
    p = lab.fresh("lock")
    write(p, b"")
    held = os.open(p, os.O_RDONLY)
    try:
        try:
            fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            return Finding(False, f"flock fails here ({errno_name(exc)})", {"local": False})
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


def probe_inotify(lab: Lab, timeout: float) -> Finding:
    """Does an event fire for a drop made through this mount, and (with --peer) for
    one made through the other mount?"""
    d = lab.fresh("watch")
    os.mkdir(d)

    def drop_here() -> None:
        write(d / ".drop.tmp", b"{}")
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
        write(peer_dir / ".drop2.tmp", b"{}")
        os.rename(peer_dir / ".drop2.tmp", peer_dir / "drop2.json")

    there = _fires(d, drop_there, max(timeout, 2.0))
    facts["other_mount"] = there is not None
    if there is None:
        return Finding(True, summary + "; NOT for changes made through another mount", facts)
    return Finding(True, summary + " and through another mount", facts)


def probe_lag(lab: Lab, timeout: float) -> Finding:
    """How long the peer mount takes to list a new name, and to stop finding a renamed one.

    The peer first lists the folder and stats the old name, so its caches hold
    the state before the change (as a daemon's would).
    """
    if lab.peer is None:
        return Finding(None, "cannot tell from one mount (pass --peer PATH)")
    d = lab.fresh("lag")
    os.mkdir(d)
    old = d / "old.json"
    write(old, b"{}")
    pd = lab.via_peer(d)
    deadline = time.monotonic() + timeout
    while "old.json" not in os.listdir(pd):  # the peer sees the folder as it is now
        if time.monotonic() > deadline:
            return Finding(None, f"the peer never listed {old.name} within {timeout:g} s", {})
        time.sleep(0.05)
    os.stat(pd / "old.json")
    t0 = time.monotonic()
    tmp = d / ".new.json.tmp"
    write(tmp, b"{}")
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


def probe_mtime(lab: Lab) -> Finding:
    """The granularity of modification times, and the file server's clock against ours."""
    p = lab.fresh("mtime")
    before = time.time()
    write(p, b"")
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


def probe_fsync(lab: Lab) -> Finding:
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
        return Finding(False, f"fsync fails with {errno_name(exc)}", {})
    return Finding(True, "files and folders fsync without error", {})
