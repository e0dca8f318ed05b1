"""The tree layer's durable-write toolkit (spool/disk/tree.py): one link-or-copy with one errno
set, and a copy that is whole and checked or absent. Exercised on real filesystems: a link
within the test's folder, and across filesystems (ext4 -> tmpfs at /dev/shm), where the
kernel itself answers EXDEV."""

from __future__ import annotations

import errno
import hashlib
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from spool.disk.tree import NO_LINKS, copy_verified, link_or_copy


@pytest.fixture()
def other_fs(tmp_path: Path) -> Iterator[Path]:
    shm = Path("/dev/shm")
    if not shm.is_dir() or os.stat(shm).st_dev == os.stat(tmp_path).st_dev:
        pytest.skip("no second filesystem at /dev/shm")
    d = Path(
        subprocess.check_output(["mktemp", "-d", "-p", str(shm), "spool-durable.XXXX"], text=True).strip()
    )
    yield d
    shutil.rmtree(d, ignore_errors=True)


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
