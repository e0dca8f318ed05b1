"""How bytes reach the disk durably: the tree layer's toolkit for every write to a spool.

The on-disk protocol's write rules live here, in one place (ARCHITECTURE.md's table
names, for each file, which one it follows):

* A new file is written under a hidden, unique temporary name *in its final
  folder*, flushed with fsync, given its visible name (renamed, or linked where it
  must not replace), and then the folder itself is fsynced. A file that must not
  replace is, where the filesystem allows, written with no name at all and linked
  to its visible name (``O_TMPFILE``: no temp name to make, remove or sweep). A reader never sees a
  partial file under a visible name, and after a crash the file is either wholly
  there or not there at all (:func:`write_atomic`).
* A state transition is one ``os.rename`` between two folders of the same
  filesystem, followed by an fsync of both folders (destination first, so the new
  name is durable before the old one's disappearance is: :func:`transfer`).
* A second name for the same bytes is a hard link where the filesystem allows, else
  a copy hashed back from the disk (:func:`link_or_copy`, one errno set: ``NO_LINKS``).
* Folder fsyncs go through group commit only after an explicit act
  (:func:`route_folder_fsyncs`); a folder is listed by :func:`list_folder`.
* Temporary names carry host, pid and a random token: writers on different hosts
  that share a spool over a NAS never collide (joblib#1610), and every name starting
  with ``.`` is invisible to scanners, ``ls`` and submitters' Maildir-style drops.

:mod:`spool.disk.tree` says *where* each file lives and imports these names from here.
"""

from __future__ import annotations

import errno
import hashlib
import os
import re
import stat
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from spool.disk.mount import mount_of

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


_boot_id: str | None = None


def boot_id() -> str:
    """The kernel's boot id: it changes on every reboot, so a pid is only
    meaningful together with it. Read once per process (a reboot ends the process;
    every attempt record and beat carries it, so reading it each time cost an open and
    two stats a job)."""
    global _boot_id
    if _boot_id is None:
        try:
            _boot_id = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        except OSError:
            return "unknown"  # not cached: /proc may be mounted later (a container's start)
    return _boot_id


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
#: files with lines not yet fsynced (:mod:`spool.queue.events` adds one when it writes a line
#: and takes it off once it is durable), so a journal line is never older than the last
#: fsync of the tree and still lost in a power cut.
_riders: set[Any] = set()


def ride_folder_fsyncs(rider: Any) -> None:
    """Have ``rider.commit()`` called before the next folder fsync of this process (and by
    :func:`commit_riders`), until :func:`stop_riding` takes it off."""
    _riders.add(rider)


def stop_riding(rider: Any) -> None:
    _riders.discard(rider)


def riding() -> bool:
    """Whether any rider has writes waiting for the next folder fsync."""
    return bool(_riders)


def commit_riders() -> None:
    """Make every rider's writes durable now (a command's end, a daemon's heartbeat or stop)."""
    for rider in list(_riders):
        rider.commit()


#: Where this process's folder fsyncs go instead of a plain fsync: set (by
#: :mod:`spool.disk.groupcommit`) only by an explicit act, a daemon installing its coalescer
#: (threads share one fsync of a folder) or a thread beginning a ``together()`` batch
#: (done when the batch ends, before anything is told). Until then every folder fsync is
#: plain, and a command that does neither (the lean CLI) pays for nothing else.
_folder_router: Callable[[Path, Path | None], None] | None = None


def route_folder_fsyncs(router: Callable[[Path, Path | None], None] | None) -> None:
    """Send every later :func:`fsync_dir` of this process to ``router`` (``None``: plain)."""
    global _folder_router
    _folder_router = router


def fsync_dir(path: Path, after: Path | None = None) -> None:
    """Make a folder's entries (new names, renames, removals) durable.

    The riders (this process's journals) are made durable first: the journal's
    group commit rides on the tree's. Then a plain fsync, or the router's
    (:func:`route_folder_fsyncs`), which commits the riders itself (a batch does so
    beside its own folder fsyncs). ``after``: a folder a batch must fsync first
    (see :func:`spool.disk.groupcommit.sync_folder`)."""
    if _folder_router is not None:
        _folder_router(path, after)
        return
    if _riders:
        commit_riders()
    fsync_folder_now(path)


#: Filesystems where a folder's fsync reaches nothing: SFTP has no request that syncs a
#: folder (``fsync@openssh.com`` takes a file's handle), so sshfs answers it in the kernel
#: (FUSE, after its first ENOSYS) while the open and close around it are two round trips
#: (OPENDIR and CLOSE, counted with ``sshfs_debug``: 101 requests for 50 folder fsyncs).
#: There the folder's fsync is skipped; a file's fsync, the rename and the link are real.
NO_FOLDER_FSYNC_FS = frozenset({"fuse.sshfs"})
#: folder -> whether its fsync reaches its filesystem (asked once per folder; bounded).
_folder_fsync_in: dict[str, bool] = {}
#: device -> the same, for filesystems without a block device (major 0: FUSE, NFS, tmpfs,
#: btrfs, ZFS, overlayfs).
_folder_fsync_on: dict[int, bool] = {}


def _folder_fsync_reaches(folder: str) -> bool:
    """Whether a folder's fsync reaches its filesystem: one ``stat`` (not an open: over
    sshfs that is two round trips), then the mount table once per device. A block
    device's filesystem is never one of :data:`NO_FOLDER_FSYNC_FS`; the folders of any other
    mount share its device number, so each new folder there (a store shard, say: 256 on a
    fresh daemon) costs no read of the mount table (~0.4 ms)."""
    dev = os.stat(folder).st_dev
    if os.major(dev) != 0:
        return True
    reaches = _folder_fsync_on.get(dev)
    if reaches is None:
        reaches = _folder_fsync_on[dev] = mount_of(Path(folder)).fstype not in NO_FOLDER_FSYNC_FS
    return reaches


def fsync_folder_now(folder: str | Path) -> None:
    """One real ``fsync(2)`` of a folder (its entries: new names, renames, removals),
    except where the filesystem cannot sync a folder at all (:data:`NO_FOLDER_FSYNC_FS`)."""
    key = os.fspath(folder)
    reaches = _folder_fsync_in.get(key)
    if reaches is None:
        if len(_folder_fsync_in) >= 4096:
            _folder_fsync_in.clear()
        reaches = _folder_fsync_in[key] = _folder_fsync_reaches(key)
    if not reaches:
        return
    fd = os.open(key, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


#: The process umask as last set through :func:`apply_umask`; ``None`` while unknown (then
#: every exact mode is set by a chmod after the create, whatever the umask).
_umask: int | None = None


def apply_umask(bits: int) -> None:
    """Set the process umask (``[permissions] umask``) and remember it, so a file created
    with a mode the umask leaves whole needs no chmod after (on a NAS each is a round trip)."""
    global _umask
    os.umask(bits)
    _umask = bits


def needs_chmod(created: int, mode: int) -> bool:
    """Whether a file opened with the mode ``created`` may lack the exact ``mode``."""
    return _umask is None or (created & ~_umask) != mode


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
    then fsync the folder. Write-once (``replace=False``) is a :class:`Prepared` file,
    unnamed where the filesystem has unnamed files, linked to its name. ``durable=False``
    skips the fsyncs for files that are only hints (progress), never for records the
    invariants depend on.
    ``mode`` is set exactly (0o444 for what must stay read-only); without it
    the process umask decides, as ``[permissions] umask`` configures.
    ``folder_later=True``: the file is fsynced but not its folder, which the
    caller's next step fsyncs anyway (the name is not relied on before then).
    """
    folder = path.parent
    if not replace:
        prepared = Prepared(path, data, mode=mode, durable=durable)
        try:
            prepared.link()
        finally:
            prepared.discard()
        if durable and not folder_later:
            fsync_dir(folder)
        return
    tmp = folder / temp_name(path.name)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666 if mode is None else mode)
    try:
        try:
            _write_all(fd, data, durable)
        finally:
            os.close(fd)
        _take_name(tmp, path, mode, replace, created=0o666 if mode is None else mode)
    except BaseException:
        _drop(tmp)
        raise
    if durable and not folder_later:
        fsync_dir(folder)


def write_unseen(path: Path, data: bytes, *, durable: bool = True) -> None:
    """Write a file in place, in a folder no reader looks into yet (a hidden staging folder
    that is renamed into view only once its files are whole): no temp name is needed,
    since nobody can see the file half-written. Replaces an earlier version. The folder
    is not fsynced (the rename that reveals it is the caller's to make durable)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
    try:
        _write_all(fd, data, durable)
    finally:
        os.close(fd)


def _write_all(fd: int, data: bytes, durable: bool) -> None:
    """Every byte of ``data`` to ``fd`` (a write may take part of it), then fsync when
    ``durable``."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
    if durable:
        os.fsync(fd)


#: What opening an unnamed file (``O_TMPFILE``) raises where the filesystem has none:
#: NFS, SMB and most FUSE mounts (EOPNOTSUPP), kernels before 3.11 (EISDIR, EINVAL).
_NO_UNNAMED = frozenset({errno.EOPNOTSUPP, errno.ENOTSUP, errno.EISDIR, errno.EINVAL})
#: The filesystems whose unnamed files are trusted: local ones whose O_TMPFILE has been in
#: the kernel for a decade. Not FUSE: a FUSE mount may accept O_TMPFILE and then name an
#: empty file (JuiceFS 1.x: size 0, mode 0, mtime 1970, found by the torture run there).
UNNAMED_FS = frozenset({"ext4", "xfs", "btrfs", "tmpfs", "f2fs"})
#: folder -> whether its filesystem is in UNNAMED_FS (asked once per folder; bounded).
_unnamed_in: dict[str, bool] = {}
#: False once linking an unnamed file by its ``/proc/self/fd`` name failed for want of
#: ``/proc`` (a chroot without it): every write-once then takes the temp-name path.
_proc_links = True


def _take_over_empty(path: Path, flags: int, mode: int) -> int:
    """Create ``path`` again if it exists empty (a first name whose writer was killed
    between its create and its write); -1 if it holds bytes or cannot be taken."""
    try:
        if os.lstat(path).st_size != 0:
            return -1
        os.unlink(path)
        return os.open(path, flags, mode)
    except OSError:
        return -1


class Prepared:
    """A new file's bytes, written (and fsynced when ``durable``) in ``path``'s folder,
    waiting for a name: :meth:`link` gives it one without replacing, :meth:`discard`
    lets it go. Nobody can see it before its name, so nobody sees it half-written.

    Unnamed (``O_TMPFILE``, linked through its ``/proc/self/fd`` name) where the
    filesystem has unnamed files: no temp name is made or removed (two folder changes
    fewer, ~0.2 ms a file on ext4), and a crash before the link leaves nothing at all,
    the kernel frees it. Elsewhere (NFS, SMB, FUSE mounts refuse ``O_TMPFILE``) a hidden
    temp name in the final folder, linked by :func:`link_no_replace`; a crash leaves that
    temp name, which ``spool fsck`` removes once its writer is gone. The folder is never
    fsynced here: naming is the caller's step, and so is its folder's fsync.

    ``first_name``: the bytes are written there first (exclusive create) and keep that
    name after :meth:`link` gives them their second: a record of the writer's own, in a
    folder only it writes (an attempt's ``result.json``, whose second name is
    ``manifests/J.json``). Its readers must take a torn file for a missing one (a crash
    mid-write leaves one). No temp name is made or removed, on any filesystem. If it
    exists already, empty, it is a crash's leftover of the writer's own (a kill between
    its create and its write) and is written again; with bytes, the new bytes take the way
    above and it is kept."""

    __slots__ = ("_data", "_durable", "_fd", "_kept", "_mode", "_temp", "path")

    def __init__(
        self,
        path: Path,
        data: bytes,
        *,
        mode: int | None = None,
        durable: bool = True,
        first_name: Path | None = None,
    ) -> None:
        self.path = path
        self._data = data
        self._mode = mode
        self._durable = durable
        self._fd = -1  # the unnamed file, kept open: its only handle until it is linked
        self._temp: Path | None = None  # or the temp name (or first_name)
        self._kept = False  # _temp is first_name: a record, never removed here
        self._write(unnamed=first_name is None, first_name=first_name)

    def _write(self, *, unnamed: bool, first_name: Path | None = None) -> None:
        mode = self._mode
        create = os.O_WRONLY | os.O_CREAT | os.O_EXCL
        fd = _open_unnamed(self.path.parent, mode) if unnamed else -1
        if fd < 0 and first_name is not None:
            try:
                fd = os.open(first_name, create, 0o666 if mode is None else mode)
            except FileExistsError:
                fd = _take_over_empty(first_name, create, 0o666 if mode is None else mode)
            except FileNotFoundError:
                fd = -1  # its folder is gone: the bytes take the other way
            if fd >= 0:
                self._temp, self._kept = first_name, True
        if fd < 0:
            self._temp = self.path.parent / temp_name(self.path.name)
            fd = os.open(self._temp, create, 0o666 if mode is None else mode)
        try:
            _write_all(fd, self._data, self._durable)
            if mode is not None and needs_chmod(mode, mode):
                os.fchmod(fd, mode)  # the umask narrowed it
        except BaseException:
            os.close(fd)
            self._kept = False  # a first name half-written goes too
            self.discard()
            raise
        if self._temp is None:
            self._fd = fd
        else:
            os.close(fd)

    def link(self, dst: Path | None = None) -> None:
        """Give the bytes the name ``dst`` (default: the name they were prepared for),
        never replacing one: ``FileExistsError`` if it exists. Once only."""
        global _proc_links
        dst = self.path if dst is None else dst
        if self._fd >= 0:
            fd = self._fd
            try:
                _name_fd(fd, dst)
                return
            except FileExistsError:
                raise FileExistsError(errno.EEXIST, "file exists", str(dst)) from None
            except OSError as exc:
                if exc.errno == errno.ENOENT and not os.path.isdir("/proc/self/fd"):
                    _proc_links = False  # no /proc (a chroot): unnamed files cannot be named
                elif exc.errno not in NO_LINKS:
                    raise
            # Named the other way: the same bytes again, under a temp name.
            self.discard()
            self._write(unnamed=False)
        assert self._temp is not None
        link_no_replace(self._temp, dst)

    def replace(self, dst: Path) -> None:
        """Put the bytes in place of whatever ``dst`` is now (a record found damaged)."""
        if self._fd >= 0:
            self._temp = dst.parent / temp_name(dst.name)
            _name_fd(self._fd, self._temp)
            os.close(self._fd)
            self._fd = -1
        elif self._kept:
            assert self._temp is not None
            temp = dst.parent / temp_name(dst.name)
            link_no_replace(self._temp, temp)  # the first name stays
            self._temp, self._kept = temp, False
        assert self._temp is not None
        os.replace(self._temp, dst)
        self._temp = None

    def discard(self) -> None:
        """Let the bytes go (after :meth:`link` too: the temp name, if any, is removed;
        a first name stays); idempotent."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        if self._temp is not None and not self._kept:
            _drop(self._temp)
        self._temp = None
        self._kept = False


def _name_fd(fd: int, dst: Path) -> None:
    """Link an unnamed file, open as ``fd``, to ``dst`` (never replacing): linkat with
    AT_SYMLINK_FOLLOW of the descriptor's /proc name, the documented way to name an
    O_TMPFILE file without privileges. A src_dir_fd (ignored for an absolute path) makes
    os.link call linkat, not link(2), which would not follow the /proc link."""
    os.link(f"/proc/self/fd/{fd}", dst, src_dir_fd=fd, follow_symlinks=True)


def _open_unnamed(folder: Path, mode: int | None) -> int:
    """An unnamed file in ``folder`` open for writing, or -1 where there are none (or
    they are not trusted)."""
    if not _proc_links:
        return -1
    key = os.fspath(folder)
    trusted = _unnamed_in.get(key)
    if trusted is None:
        if len(_unnamed_in) >= 4096:
            _unnamed_in.clear()
        trusted = _unnamed_in[key] = mount_of(folder).fstype in UNNAMED_FS
    if not trusted:
        return -1
    try:
        return os.open(folder, os.O_TMPFILE | os.O_WRONLY, 0o666 if mode is None else mode)
    except OSError as exc:
        if exc.errno in _NO_UNNAMED:
            return -1
        raise


#: What ``os.link`` raises where a second name cannot be made: another filesystem
#: (EXDEV), a filesystem without hard links or refusing them (EPERM, ENOTSUP,
#: EOPNOTSUPP; FUSE mounts answer EIO), an inode with too many links (EMLINK). One set
#: for every link spool makes; each then falls back to a verified copy.
NO_LINKS = frozenset({errno.EXDEV, errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EIO, errno.EMLINK})

_COPY_CHUNK = 1 << 20


def copy_verified(
    src: Path,
    dst: Path,
    digest: str | None = None,
    *,
    mode: int | None = None,
    replace: bool = False,
    folder_later: bool = False,
    temp_dir: Path | None = None,
) -> None:
    """Copy ``src``'s bytes to ``dst`` so that ``dst`` is whole and checked, or absent.

    The bytes go to a hidden temp name beside ``dst`` (or in ``temp_dir``, a folder of
    the same filesystem: the store keeps its copies' temps in one folder, so a sweep for
    them lists one folder, not 256), are fsynced and hashed back from the disk; the
    sha256 must be ``digest`` (default: ``src``'s, read while copying). Only then does
    the copy take ``dst``'s name: without replacing (``FileExistsError``), or with
    ``replace=True`` where equal content is the point (a store object restored).
    ``mode`` is set on the copy first (0o444 for what must stay read-only). The folder
    is fsynced, unless ``folder_later`` (the caller fsyncs it before anything names the
    copy: a publish batch fsyncs its objects' folders at once)."""
    tmp = (temp_dir or dst.parent) / temp_name(dst.name)
    read = hashlib.sha256()
    try:
        with open(src, "rb") as fin, open(tmp, "xb") as fout:
            while chunk := fin.read(_COPY_CHUNK):
                read.update(chunk)
                fout.write(chunk)
            fout.flush()
            os.fsync(fout.fileno())
        want = digest or read.hexdigest()
        with open(tmp, "rb") as f:
            copied = hashlib.file_digest(f, "sha256").hexdigest()
        if copied != want:
            raise OSError(errno.EIO, f"the copy of {src.name} does not match sha256 {want}", str(dst))
        _take_name(tmp, dst, mode, replace, created=0o666)
    except BaseException:
        _drop(tmp)
        raise
    if not folder_later:
        fsync_dir(dst.parent)


def _take_name(tmp: Path, dst: Path, mode: int | None, replace: bool, *, created: int) -> None:
    """A finished temp file (opened with the mode ``created``) becomes ``dst``: its mode
    set first, then renamed over ``dst`` (``replace``) or linked to it without replacing
    (``FileExistsError``)."""
    if mode is not None and needs_chmod(created, mode):
        os.chmod(tmp, mode)
    if replace:
        os.replace(tmp, dst)
    else:
        link_no_replace(tmp, dst)
        os.unlink(tmp)


def _drop(tmp: Path) -> None:
    """Remove a writer's temp file after an error (it may never have been made)."""
    try:
        os.unlink(tmp)
    except OSError:
        pass


def link_or_copy(
    src: Path,
    dst: Path,
    digest: str | None = None,
    *,
    mode: int | None = None,
    folder_later: bool = False,
    temp_dir: Path | None = None,
) -> str:
    """Give ``dst`` the bytes of ``src``: a hard link where the filesystem allows (the same
    inode, nothing copied), else :func:`copy_verified` (with ``mode``, ``temp_dir``). Never replaces:
    ``FileExistsError`` if ``dst`` exists. The folder is fsynced (not with ``folder_later``,
    as :func:`copy_verified`). ``"link"`` or ``"copy"``."""
    try:
        os.link(src, dst)
    except FileExistsError:
        raise
    except OSError as exc:
        if exc.errno not in NO_LINKS:
            raise
        copy_verified(src, dst, digest, mode=mode, folder_later=folder_later, temp_dir=temp_dir)
        return "copy"
    if not folder_later:
        fsync_dir(dst.parent)
    return "link"


#: renameat2's flag that swaps two names atomically (Linux 3.15; local filesystems, some FUSE).
_RENAME_EXCHANGE = 2
_AT_FDCWD = -100
_renameat2: Any = None


def replace_existing(src: Path, dst: Path) -> bool:
    """Put ``src`` in place of ``dst`` only if ``dst`` still exists; ``False`` (``src``
    left as it was) when it does not.

    ``renameat2(RENAME_EXCHANGE)`` swaps the two names in one step, so a file another
    process renamed away a moment ago is never brought back to life under its old name
    (a plain ``os.replace`` would recreate it); the old content, now at ``src``'s name,
    is removed. Where the filesystem refuses exchanges (NFS, SMB, some FUSE), check then
    replace: exclusive only between processes that do not race, as
    :func:`link_no_replace`'s fallback is."""
    global _renameat2
    if _renameat2 is None:
        import ctypes  # here: only the rare replace without renameat2 loads ctypes (+~1.4 ms)

        try:
            fn = ctypes.CDLL(None, use_errno=True).renameat2
            fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
            _renameat2 = fn
        except (OSError, AttributeError):
            _renameat2 = False
    if _renameat2:
        import ctypes  # here: only the rare replace without renameat2 loads ctypes (+~1.4 ms)

        if _renameat2(_AT_FDCWD, os.fsencode(src), _AT_FDCWD, os.fsencode(dst), _RENAME_EXCHANGE) == 0:
            os.unlink(src)  # the old content, under the temp name now
            return True
        err = ctypes.get_errno()
        if err == errno.ENOENT:
            if not os.path.lexists(src):
                raise FileNotFoundError(err, os.strerror(err), str(src))
            return False
        if err not in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP, errno.EOPNOTSUPP):
            raise OSError(err, os.strerror(err), str(dst))
    if not os.path.lexists(dst):
        return False
    os.replace(src, dst)
    return True


def link_no_replace(src: Path, dst: Path) -> None:
    """Give ``src`` the extra name ``dst``, failing if ``dst`` exists.

    ``os.link`` is exclusive on local disks, sshfs and NFS. Where a filesystem
    has no hard links, fall back to check-then-rename, which is only
    exclusive between processes that do not race (documented in docs/research/nas.md).
    """
    try:
        os.link(src, dst)
    except FileExistsError:
        raise
    except OSError as exc:
        if exc.errno not in NO_LINKS:
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


def transfer(src: Path, dst: Path, *, _again: bool = True) -> bool:
    """Move a job file from one state folder to another: the one way spool does it.

    Claim, return to pending, takeover, hold, release, cancel, complete and fail
    all come here, so the NAS argument lives in one place:

    * ``os.rename`` is the whole transition; of several racing renames of one
      source exactly one wins on every filesystem spool trusts.
    * A missing destination folder (a worker's first claim) is created and the
      rename tried once more, also when another thread made the folder between our
      rename and our look (two first claims at once: the loser of that race is not
      the loser of the job).
    * An error whose errno is in :data:`VANISHED` means "the source is not
      there": either somebody else moved it (we lost), or the reply to our own
      rename was lost and the client retransmitted it (docs/research/nas.md section 4). We
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
        if _again and src.exists():
            make_dirs(dst.parent)  # missing when we renamed (made since by another thread: fine)
            return transfer(src, dst, _again=False)
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


class Listing:
    """What one listing of a folder found (:func:`list_folder`)."""

    __slots__ = ("count", "entries", "names", "oldest")

    def __init__(self) -> None:
        self.count = 0
        #: the visible names (without ``stat``); with ``stat``, ``entries`` instead
        self.names: list[str] = []
        #: (ctime, name) of each visible file, with ``stat``
        self.entries: list[tuple[float, str]] = []
        #: the oldest ctime, with ``stat``
        self.oldest: float | None = None


def list_folder(
    folder: Path, *, suffix: str = ".json", skip: str = "", stat: bool = False, taken: str = ""
) -> Listing:
    """One listing of ``folder``: its finished files ending in ``suffix`` (and not in
    ``skip``), counted; with ``stat``, each one's ctime too. Names starting with
    ``taken`` count as well, dotfiles included (drops a worker has taken but not yet
    accepted: ``.accepting.<worker>.<name>``). A missing folder is an empty one.

    The count, status and metrics readers all list through here. Without ``stat`` it is
    one ``os.listdir`` and a comprehension (no DirEntry per job: a third of the cost of
    scandir over 100,000 jobs); with ``stat`` a scandir, skipping files that moved on
    while it looked."""
    out = Listing()
    if not stat:
        try:
            names = os.listdir(folder)
        except (FileNotFoundError, NotADirectoryError):
            return out
        # is_visible, inlined (this runs once per job): a temp name starts with a dot.
        visible = [n for n in names if n.endswith(suffix) and n[0] != "." and not (skip and n.endswith(skip))]
        out.names = visible
        out.count = len(visible) + (sum(1 for n in names if n.startswith(taken)) if taken else 0)
        return out
    try:
        it = os.scandir(folder)
    except (FileNotFoundError, NotADirectoryError):
        return out
    with it:
        for e in it:
            name = e.name
            if taken and name.startswith(taken):
                out.count += 1
                continue
            if name[0] == "." or not name.endswith(suffix) or (skip and name.endswith(skip)):
                continue
            try:
                ct = e.stat().st_ctime
            except FileNotFoundError:
                continue  # moved on while we looked
            out.count += 1
            out.entries.append((ct, name))
            out.oldest = ct if out.oldest is None else min(out.oldest, ct)
    return out
