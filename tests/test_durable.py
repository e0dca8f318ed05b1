"""The tree layer's durable-write toolkit (spool/disk/tree.py): one link-or-copy with one errno
set, and a copy that is whole and checked or absent. Exercised on real filesystems: a link
within the test's folder, and across filesystems (ext4 -> tmpfs at /dev/shm), where the
kernel itself answers EXDEV."""

from __future__ import annotations

import errno
import hashlib
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from spool.disk import durable
from spool.disk.mount import Mount
from spool.disk.tree import NO_LINKS, copy_verified, link_or_copy, write_atomic


def _src(tmp_path: Path) -> tuple[Path, str]:
    src = tmp_path / "src.bin"
    data = os.urandom(3 << 20)
    src.write_bytes(data)
    return src, hashlib.sha256(data).hexdigest()


def test_a_link_within_a_filesystem_shares_the_inode(tmp_path: Path) -> None:
    src, digest = _src(tmp_path)
    dst = tmp_path / "dst.bin"
    assert link_or_copy(src, dst, digest) == "link"
    assert os.stat(dst).st_ino == os.stat(src).st_ino
    with pytest.raises(FileExistsError):
        link_or_copy(src, dst, digest)  # never replaces


def test_across_filesystems_the_kernel_refuses_the_link_and_a_checked_copy_is_made(
    tmp_path: Path, other_fs: Path
) -> None:
    src, digest = _src(tmp_path)
    with pytest.raises(OSError) as refused:
        os.link(src, other_fs / "probe")
    assert refused.value.errno in NO_LINKS  # EXDEV, from the kernel
    dst = other_fs / "dst.bin"
    assert link_or_copy(src, dst, digest, mode=0o444) == "copy"
    assert hashlib.sha256(dst.read_bytes()).hexdigest() == digest
    assert dst.stat().st_mode & 0o777 == 0o444
    assert sorted(p.name for p in other_fs.iterdir()) == ["dst.bin"]  # no temp left


def test_a_copy_that_does_not_match_leaves_nothing(tmp_path: Path, other_fs: Path) -> None:
    src, _ = _src(tmp_path)
    with pytest.raises(OSError) as err:
        copy_verified(src, other_fs / "dst.bin", "0" * 64)
    assert err.value.errno == errno.EIO and "does not match sha256" in str(err.value)
    assert list(other_fs.iterdir()) == []


def test_a_copy_replaces_only_when_asked(tmp_path: Path) -> None:
    src, digest = _src(tmp_path)
    dst = tmp_path / "dst.bin"
    dst.write_bytes(b"damaged")
    with pytest.raises(FileExistsError):
        copy_verified(src, dst, digest)
    assert dst.read_bytes() == b"damaged"
    copy_verified(src, dst, digest, replace=True)  # a damaged store object restored
    assert hashlib.sha256(dst.read_bytes()).hexdigest() == digest


# -- write-once: an unnamed file linked to its name -----------------------------------------


def test_write_once_makes_no_temp_name_where_the_filesystem_has_unnamed_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a local filesystem the file is written unnamed and linked: a temp name is never
    asked for (a crash can leave none), the mode is exact and a second write is refused."""

    def no_temp(name: str) -> str:
        raise AssertionError(f"a temp name was made for {name}")

    monkeypatch.setattr(durable, "temp_name", no_temp)
    target = tmp_path / "a.json"
    write_atomic(target, b'{"a": 1}', mode=0o444, replace=False)
    assert target.read_bytes() == b'{"a": 1}'
    assert stat.S_IMODE(target.stat().st_mode) == 0o444
    assert os.listdir(tmp_path) == ["a.json"]
    with pytest.raises(FileExistsError) as err:
        write_atomic(target, b"other", replace=False)
    assert str(target) in str(err.value) and "/proc" not in str(err.value)
    assert target.read_bytes() == b'{"a": 1}' and os.listdir(tmp_path) == ["a.json"]


def test_write_once_falls_back_to_a_temp_name_where_unnamed_files_are_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """NFS, SMB and FUSE mounts refuse O_TMPFILE (EOPNOTSUPP): the same promise through a
    temp name, which is gone afterwards."""
    real_open = os.open
    refused: list[int] = []

    def open_(path, flags, *a, **k):  # type: ignore[no-untyped-def]
        if flags & os.O_TMPFILE == os.O_TMPFILE:
            refused.append(flags)
            raise OSError(errno.EOPNOTSUPP, "Operation not supported")
        return real_open(path, flags, *a, **k)

    monkeypatch.setattr(durable.os, "open", open_)
    target = tmp_path / "b.json"
    write_atomic(target, b"whole", mode=0o444, replace=False)
    assert refused and target.read_bytes() == b"whole"
    assert stat.S_IMODE(target.stat().st_mode) == 0o444
    assert os.listdir(tmp_path) == ["b.json"]
    with pytest.raises(FileExistsError):
        write_atomic(target, b"other", replace=False)
    assert os.listdir(tmp_path) == ["b.json"]


def test_write_once_trusts_unnamed_files_only_on_local_filesystems(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A FUSE mount may accept O_TMPFILE and then name an empty file (JuiceFS did): only
    the local filesystems of UNNAMED_FS get unnamed files, any other takes a temp name."""
    made: list[str] = []
    real_temp_name = durable.temp_name

    def temp_name(name: str) -> str:
        made.append(name)
        return real_temp_name(name)

    monkeypatch.setattr(durable, "temp_name", temp_name)
    monkeypatch.setattr(durable, "_unnamed_in", {})
    monkeypatch.setattr(durable, "mount_of", lambda p: Mount("/", "fuse.juicefs", "JuiceFS:x", "rw"))
    write_atomic(tmp_path / "c.json", b"whole", replace=False)
    assert made == ["c.json"] and (tmp_path / "c.json").read_bytes() == b"whole"
    assert os.listdir(tmp_path) == ["c.json"]


@pytest.fixture
def restore_umask() -> Iterator[None]:
    before = os.umask(0o022)
    os.umask(before)
    known = durable._umask
    yield
    os.umask(before)
    durable._umask = known


@pytest.mark.parametrize("umask, chmods", [(0o022, 1), (0o002, 1), (0o077, 3)])
def test_exact_modes_need_a_chmod_only_where_the_umask_narrows_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, restore_umask: None, umask: int, chmods: int
) -> None:
    """A read-only record is created with its mode: the umask a spool process applied
    (``[permissions] umask``) decides whether a chmod must follow (on a NAS each chmod is
    a round trip). Either way the records end with exactly the mode asked for."""
    calls: list[str] = []
    real_fchmod, real_chmod = os.fchmod, os.chmod
    monkeypatch.setattr(os, "fchmod", lambda fd, m: (calls.append("fchmod"), real_fchmod(fd, m))[1])
    monkeypatch.setattr(os, "chmod", lambda p, m, **kw: (calls.append("chmod"), real_chmod(p, m, **kw))[1])
    durable.apply_umask(umask)
    once, replaced, copied = tmp_path / "once.json", tmp_path / "replaced.json", tmp_path / "copied.json"
    write_atomic(once, b"{}", mode=0o444, replace=False)
    write_atomic(replaced, b"{}", mode=0o444)
    copy_verified(once, copied)
    copy_verified(once, tmp_path / "read-only.json", mode=0o444)
    for f in (once, replaced, tmp_path / "read-only.json"):
        assert stat.S_IMODE(f.stat().st_mode) == 0o444, f
    assert stat.S_IMODE(copied.stat().st_mode) == 0o666 & ~umask
    # a read-only copy's temp file (made 0o666) always needs one; the others only under 0o077
    assert len(calls) == chmods, calls


def test_an_unknown_umask_is_never_trusted(tmp_path: Path, restore_umask: None) -> None:
    """Until a process applied its umask through the spool, every exact mode is set."""
    durable._umask = None
    os.umask(0o277)
    target = tmp_path / "r.json"
    write_atomic(target, b"{}", mode=0o444, replace=False)
    assert stat.S_IMODE(target.stat().st_mode) == 0o444


def test_a_first_claim_wins_though_another_thread_made_the_worker_folder_meanwhile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two first claims of one worker at once (spool library adopt's threads): the rename
    of one finds no running/<worker>/ (ENOENT), the other thread makes it before the
    first looks. The first must still move its own job, not report it taken by somebody
    else (seen once in CI as an adopted file reported "busy")."""
    pending, dst = tmp_path / "pending", tmp_path / "running" / "w" / "j@1.json"
    pending.mkdir()
    src = pending / "j@1.json"
    src.write_bytes(b"{}")
    real_rename = os.rename
    raced: list[str] = []

    def rename(a: object, b: object) -> None:
        if not raced:
            raced.append("the other thread made the folder")
            dst.parent.mkdir(parents=True)
            raise FileNotFoundError(errno.ENOENT, "No such file or directory", str(b))
        real_rename(a, b)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "rename", rename)
    assert durable.transfer(src, dst)
    assert raced and dst.read_bytes() == b"{}" and not src.exists()


def test_prepared_bytes_keep_their_first_name_after_their_second(tmp_path: Path) -> None:
    """Prepared(first_name=): written once under the writer's own name (an attempt's
    result.json), linked to the final name (manifests/J.json), never a temp name; the
    first name stays after the link, after discard, and after a replace."""
    own, final = tmp_path / "attempt", tmp_path / "manifests"
    own.mkdir()
    final.mkdir()
    p = durable.Prepared(final / "j.json", b"manifest", mode=0o444, first_name=own / "result.json")
    assert (own / "result.json").read_bytes() == b"manifest" and os.listdir(final) == []
    p.link()
    p.discard()
    assert os.path.samefile(own / "result.json", final / "j.json") and os.listdir(final) == ["j.json"]
    assert stat.S_IMODE(os.stat(final / "j.json").st_mode) == 0o444
    # A damaged manifest in place: the bytes replace it through a temp name of their own.
    (final / "k.json").write_bytes(b"torn")
    q = durable.Prepared(final / "k.json", b"other", mode=0o444, first_name=own / "result-k.json")
    with pytest.raises(FileExistsError):
        q.link()
    q.replace(final / "k.json")
    q.discard()
    assert os.path.samefile(own / "result-k.json", final / "k.json")
    assert sorted(os.listdir(final)) == ["j.json", "k.json"]


def test_prepared_bytes_take_a_temp_name_when_the_first_name_is_taken(tmp_path: Path) -> None:
    own, final = tmp_path / "attempt", tmp_path / "manifests"
    own.mkdir()
    final.mkdir()
    (own / "result.json").write_bytes(b"an earlier one")
    p = durable.Prepared(final / "j.json", b"manifest", first_name=own / "result.json")
    p.link()
    p.discard()
    assert (own / "result.json").read_bytes() == b"an earlier one"  # never replaced
    assert (final / "j.json").read_bytes() == b"manifest" and os.listdir(final) == ["j.json"]
    gone = durable.Prepared(final / "g.json", b"x", first_name=tmp_path / "no-such-folder" / "result.json")
    gone.link()
    gone.discard()
    assert (final / "g.json").read_bytes() == b"x"


def test_a_first_name_a_crash_left_empty_is_written_again(tmp_path: Path) -> None:
    """A kill between the first name's create and its write leaves it empty: the writer's
    next try takes the name over (bytes in it are never replaced: see the test above)."""
    own, final = tmp_path / "attempt", tmp_path / "manifests"
    own.mkdir()
    final.mkdir()
    (own / "result.json").write_bytes(b"")
    p = durable.Prepared(final / "j.json", b"manifest", mode=0o444, first_name=own / "result.json")
    p.link()
    p.discard()
    assert (own / "result.json").read_bytes() == b"manifest"
    assert os.path.samefile(own / "result.json", final / "j.json")
    assert sorted(os.listdir(own)) == ["result.json"] and os.listdir(final) == ["j.json"]


def test_a_first_name_half_written_is_removed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A write that fails (a full disk) leaves no short record under the first name."""
    own = tmp_path / "attempt"
    own.mkdir()

    def full(fd: int, data: bytes, durable_: bool) -> None:
        os.write(fd, data[:3])
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(durable, "_write_all", full)
    with pytest.raises(OSError):
        durable.Prepared(tmp_path / "j.json", b"manifest", first_name=own / "result.json")
    assert os.listdir(own) == []
