"""The mount that holds a path, read from ``/proc/self/mountinfo``, and what kind of filesystem it is."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

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
#: mkdir exclusivity in the simulation (docs/research/nas.md, sections 1 and 4.9).
SYNC_DRIVE_FS = frozenset(
    {
        "fuse.rclone", "rclone", "fuse.s3fs", "fuse.gcsfuse", "fuse.goofys", "fuse.geesefs",
        "fuse.mountpoint-s3", "fuse.onedriver", "fuse.google-drive-ocamlfuse", "fuse.dropbox",
        "fuse.davfs2", "davfs", "fuse.juicefs", "fuse.blobfuse", "fuse.blobfuse2", "fuse.s3backer",
    }
)  # fmt: skip


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
