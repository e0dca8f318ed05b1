"""The content-addressed store's put: what it hashes, names and costs."""

from __future__ import annotations

import hashlib
import os
import stat

import pytest

from spool.disk import store
from spool.disk.tree import Tree


@pytest.mark.parametrize("size", [0, 1, store._CHUNK - 1, store._CHUNK, store._CHUNK + 1, 3 * store._CHUNK])
def test_put_names_the_object_by_the_digest_and_size_of_every_byte(tree: Tree, size: int):
    data = os.urandom(size)
    cand = tree.root / "cand.bin"
    cand.write_bytes(data)
    got = store.put(tree, cand, ".bin")
    want = hashlib.sha256(data).hexdigest()
    assert (got.digest, got.size, got.method) == (want, size, "link")
    assert got.path == tree.store_file(want, ".bin") and got.path.read_bytes() == data
    assert stat.S_IMODE(os.stat(got.path).st_mode) == 0o444
    assert store.sha256_file(got.path) == (want, size)
    again = tree.root / "again.bin"
    again.write_bytes(data)
    assert store.put(tree, again, ".bin").method == "existing"


def test_put_opens_the_candidate_once_and_asks_its_size_of_nobody(tree: Tree, monkeypatch):
    """On a NAS every open and fstat is a round trip: the candidate is hashed, made
    read-only and fsynced through one open, and its size is what the hash read."""
    cand = tree.root / "cand.bin"
    cand.write_bytes(b"x" * 5000)
    opens: list[str] = []
    fstats: list[int] = []
    real_open, real_fstat = os.open, os.fstat
    monkeypatch.setattr(os, "open", lambda p, *a, **k: opens.append(os.fspath(p)) or real_open(p, *a, **k))
    monkeypatch.setattr(os, "fstat", lambda fd: fstats.append(fd) or real_fstat(fd))
    got = store.put(tree, cand, ".bin")
    assert got.size == 5000
    assert opens.count(str(cand)) == 1 and fstats == []


def test_put_looks_at_nothing_before_its_link_and_makes_a_missing_shard(tree: Tree, monkeypatch):
    """The link answers whether the object is there and whether its shard is: no stat of
    either before it (a round trip each on a NAS). A shard removed since spool init is made."""
    calls: list[tuple[str, str]] = []
    real_stat, real_link = os.stat, os.link
    monkeypatch.setattr(
        os, "stat", lambda p, *a, **k: calls.append(("stat", os.fspath(p))) or real_stat(p, *a, **k)
    )
    monkeypatch.setattr(
        os, "link", lambda s, d, *a, **k: calls.append(("link", os.fspath(d))) or real_link(s, d, *a, **k)
    )
    for name, data, remove_shard in (("cand.bin", b"y" * 100, True), ("other.bin", b"z" * 100, False)):
        cand = tree.root / name
        cand.write_bytes(data)
        final = tree.store_file(hashlib.sha256(data).hexdigest(), ".bin")
        if remove_shard:
            final.parent.rmdir()  # made empty at spool init
        calls.clear()
        got = store.put(tree, cand, ".bin")
        assert got.method == "link" and got.path == final and final.read_bytes() == data
        first_link = calls.index(("link", str(final)))
        assert ("stat", str(final)) not in calls  # the object is never looked at
        if not remove_shard:
            assert not [c for c in calls[:first_link] if c[0] == "stat"]  # nothing before the link


def test_a_copy_into_the_store_takes_its_temp_name_in_the_one_temp_folder(tree: Tree, other_fs, monkeypatch):
    """Where the kernel refuses the link (a candidate on another filesystem: EXDEV), the
    object is copied by way of a temp name in ``store/sha256/`` itself, never in a shard:
    a daemon's leftover sweep lists that one folder, not 256 (over a NAS, ~1,500 requests
    at each start)."""
    cand = other_fs / "cand.bin"
    cand.write_bytes(b"c" * 3000)
    links: list[tuple[str, str]] = []
    real_link = os.link
    monkeypatch.setattr(
        os,
        "link",
        lambda s, d, *a, **k: links.append((os.fspath(s), os.fspath(d))) or real_link(s, d, *a, **k),
    )
    got = store.put(tree, cand, ".bin")
    assert got.method == "copy" and got.path.read_bytes() == b"c" * 3000
    (refused, _), (temp, final) = links  # the candidate's link (EXDEV), then the copy's
    assert refused == str(cand) and final == str(got.path)
    assert os.path.dirname(temp) == str(store.temp_folder(tree)) == str(got.path.parent.parent)
    assert not os.path.exists(temp)  # the temp name went once the object had its own
    assert [p.name for p in store.temp_folder(tree).iterdir() if not p.is_dir()] == []
