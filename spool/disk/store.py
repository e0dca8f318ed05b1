"""The content-addressed store and manifests (SPEC section 5).

Publish order for one validated candidate in ``attempts/J/<n>/work/``:

1. hash it (sha256, so ``sha256sum`` verifies it from a shell);
2. make it read-only and fsync it, so the bytes are durable before any final
   name points at them (a link to unflushed data could survive a power cut as
   a short file: the Nix "hard-linked before written" bug);
3. hard-link it to ``store/sha256/<aa>/<hash><ext>`` and fsync that folder.
   ``EEXIST`` means the same content is already published: a no-op. Where the
   filesystem has no hard links, :func:`spool.disk.tree.link_or_copy` copies to a
   hidden temp name in ``store/sha256/`` (:func:`temp_folder`: one folder for every
   copy's temp, which a daemon's leftover sweep lists instead of 256 shards), fsyncs
   it, hashes it back from the disk, then gives it the name (never replacing).

The manifest that names the store file is written after this (by
:mod:`spool.queue.execute`), so a manifest can never point at a missing file.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from spool.core.model import Manifest, PublishedFile
from spool.disk.tree import Tree, copy_verified, link_or_copy, make_dirs


def sha256_file(path: Path) -> tuple[str, int]:
    """(hex sha256, size in bytes) of a file, read once."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return _sha256_of(fd)
    finally:
        os.close(fd)


#: Bytes hashed per read (one buffer, reused: memory stays flat for any size).
_CHUNK = 1 << 20


def _sha256_of(fd: int) -> tuple[str, int]:
    """(hex sha256, size in bytes) of an open file, read from its start. The size is
    what was read (no ``fstat``: on a NAS each is a round trip, and a file is published
    with the size of the bytes its digest covers)."""
    h = hashlib.sha256()
    buf = bytearray(_CHUNK)
    view = memoryview(buf)
    size = 0
    while n := os.readv(fd, [buf]):
        h.update(view[:n])
        size += n
    return h.hexdigest(), size


@dataclass(frozen=True)
class Stored:
    digest: str
    size: int
    path: Path
    method: str  # "link", "copy" or "existing"


def put(
    tree: Tree, candidate: Path, ext: str, *, prefer_link: bool = True, folder_later: bool = False
) -> Stored:
    """Put a validated file into the store; idempotent for equal content.

    The store half of publishing (:mod:`spool.queue.publish` is the whole path).
    ``folder_later``: the store folder is not fsynced here; the caller fsyncs it
    (``stored.path.parent``) before anything names the object (a publish batch
    fsyncs its objects' folders at once)."""
    fd = os.open(candidate, os.O_RDONLY | os.O_CLOEXEC)  # hashed and fsynced through one open
    try:
        digest, size = _sha256_of(fd)
        final = tree.store_file(digest, ext)
        os.fchmod(fd, 0o444)
        os.fsync(fd)
    finally:
        os.close(fd)
    # No look first (is the shard there, is the object): the link answers both, and each
    # look is a round trip on a NAS. An object published already costs a needless fchmod
    # and fsync of the candidate, which is rare (equal outputs of different jobs).
    temps = temp_folder(tree)
    try:
        try:
            method = _place(candidate, final, digest, prefer_link, folder_later, temps)
        except FileNotFoundError:
            if final.parent.is_dir():
                raise  # the candidate is gone, not the shard
            make_dirs(final.parent)  # all 256 are made at spool init; one removed since
            method = _place(candidate, final, digest, prefer_link, folder_later, temps)
        return Stored(digest, size, final, method)
    except FileExistsError:  # published already (or meanwhile), by content: the same bytes
        return Stored(digest, size, final, "existing")


def _place(
    candidate: Path, final: Path, digest: str, prefer_link: bool, folder_later: bool, temps: Path
) -> str:
    """The candidate under its store name: linked (or copied, by way of a temp name in
    ``temps``, where links fail), or copied and verified; how (``link``, ``copy``).
    Raises ``FileExistsError``."""
    if prefer_link:
        return link_or_copy(candidate, final, digest, mode=0o444, folder_later=folder_later, temp_dir=temps)
    copy_verified(candidate, final, digest, mode=0o444, folder_later=folder_later, temp_dir=temps)
    return "copy"


def temp_folder(tree: Tree) -> Path:
    """Where copies into the store are written before they take their names: the shards'
    parent, ``store/sha256/`` (the same filesystem, so the name is taken by a link or a
    rename). Code before 2026-12-04 wrote them in the shard folders: only ``spool fsck``
    still looks there."""
    return tree.store / "sha256"


def objects(tree: Tree) -> Iterator[Path]:
    """Every published object in the store (temp files of publishes in flight skipped)."""
    base = tree.store / "sha256"
    for d in sorted(base.iterdir()) if base.is_dir() else []:
        if d.is_dir():
            yield from (f for f in sorted(d.iterdir()) if not f.name.startswith("."))


def published_file(tree: Tree, stored: Stored, file: str, container: str) -> PublishedFile:
    method = stored.method if stored.method in ("link", "copy") else "existing"
    return PublishedFile(
        file=file,
        sha256=stored.digest,
        size=stored.size,
        container=container,
        store_path=tree.relative(stored.path),
        method=method,  # type: ignore[arg-type]
    )


def verify(tree: Tree, manifest: Manifest) -> str | None:
    """Re-hash the store file a manifest names; ``None`` if it matches, else why not."""
    path = tree.root / manifest.output.store_path
    try:
        digest, size = sha256_file(path)
    except FileNotFoundError:
        return f"{manifest.output.store_path} is missing"
    if digest != manifest.output.sha256:
        return f"{manifest.output.store_path} has sha256 {digest}, manifest says {manifest.output.sha256}"
    if size != manifest.output.size:
        return f"{manifest.output.store_path} has {size} bytes, manifest says {manifest.output.size}"
    return None
