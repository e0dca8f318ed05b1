"""``spool doctor``: what the spool's filesystem really does, and the strategies that follow.

A spool may live on a local disk, on tmpfs, or on a NAS that several hosts
mount. The queue's correctness never depends on the answer (claims are
renames, records are written once under unique names, see docs/research/nas.md), but two
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

The package: ``mount`` (which filesystem holds the spool), ``lab`` (the probe
folder), ``probes`` (what the filesystem does), ``strategy`` (the choices and
warnings that follow, pure functions), ``report`` (what is reported and its
rendering); this module runs them in order.
"""

from __future__ import annotations

import errno
import time
from collections.abc import Callable
from pathlib import Path

from spool.core.config import Config
from spool.disk.mount import (
    LOCAL_FS,
    MEMORY_FS,
    NETWORK_FS,
    SYNC_DRIVE_FS,
    Kind,
    Mount,
    classify,
    mount_of,
    parse_mountinfo,
)
from spool.disk.tree import HOST, Tree
from spool.doctor.lab import Lab, errno_name
from spool.doctor.probes import (
    probe_excl,
    probe_fsync,
    probe_inotify,
    probe_lag,
    probe_links,
    probe_locks,
    probe_mtime,
    probe_rename,
    probe_rename_race,
    probe_space,
)
from spool.doctor.report import LABELS, Choice, Finding, Report, render
from spool.doctor.strategy import Verdict, choose_publish, choose_watch, verdict, warnings

__all__ = [
    "FULL_ROUNDS",
    "LABELS",
    "LOCAL_FS",
    "MEMORY_FS",
    "NETWORK_FS",
    "QUICK_ROUNDS",
    "SYNC_DRIVE_FS",
    "Choice",
    "Finding",
    "Kind",
    "Mount",
    "PeerMismatch",
    "Report",
    "Verdict",
    "choose_publish",
    "choose_watch",
    "classify",
    "mount_of",
    "parse_mountinfo",
    "render",
    "run",
    "verdict",
    "warnings",
]

#: Rounds of each probe: the quick set the daemon runs at start, and the full set.
QUICK_ROUNDS = {"replace": 20, "race": 0}
FULL_ROUNDS = {"replace": 200, "race": 30}


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
    with Lab(tree, peer) as lab:
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
                findings[key] = Finding(None, f"the probe failed: {exc.strerror or exc} ({errno_name(exc)})")
    publish = choose_publish(cfg, findings["links"])
    watch = choose_watch(cfg, mount, findings["inotify"])
    judged = verdict(mount, findings)
    warns = warnings(cfg, mount, findings, publish, watch, judged)
    return Report(
        spool=str(tree.root),
        host=HOST,
        mount=mount,
        peer=str(peer) if peer is not None else None,
        findings=findings,
        publish=publish,
        watch=watch,
        poll_interval=cfg.daemon.poll_interval,
        warnings=warns,
        safe=judged.safe,
        verdict=judged,
        seconds=time.monotonic() - t0,
    )


class PeerMismatch(OSError):
    """``--peer`` does not show this spool's files."""


def _await_peer(lab: Lab, timeout: float) -> None:
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
