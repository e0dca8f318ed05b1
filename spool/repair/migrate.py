"""``spool migrate``: move a tree to the newest format in place (:mod:`spool.disk.formats`).

Format 1 -> 2 changes one thing on disk that readers would otherwise read in two
places for ever: the library's per-job records. Each format 1 version record
(``library/<name>/<rev>``) and entry by object (``index/_sha256/<sha256>/<job>``)
becomes format 2's merged entries (``index/_versions/``, ``index/_names/``,
``index/_objects/``: :mod:`spool.library.segments`); tag entries are the same in both.
Everything else stays as it is: every reader reads both formats (attempt records
with ``result.json``, frozen copies of their own), and old daemons may still be
writing format 1 into the spool during a rolling upgrade.

The order, each step durable before the next, so a crash anywhere leaves a tree
every reader reads whole and a second run finishes the job (idempotent):

1. create the merged entries of every format 1 record whose job has a manifest,
   each folder fsynced once (a record without one is left to ``spool fsck``:
   migrating never makes a hit the manifests do not justify);
2. crash point ``mid_migrate``; then remove those format 1 records and fsync their
   folders (readers read format 1 before the merged entries, so a job is never
   missed between the two);
3. write ``FORMAT`` (the last step: a tree says format 2 only once it is).

Run it again after the last old daemon stopped: it converts what they wrote
meanwhile, and finds nothing to do after that.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from spool.core.faults import crashpoint
from spool.core.model import Manifest, VersionEntry, decode
from spool.disk import formats
from spool.disk.groupcommit import together
from spool.disk.records import read
from spool.disk.tree import Tree, fsync_dir
from spool.library import segments
from spool.library.index import OBJECT_TAG
from spool.library.indexpaths import index_root, library_root, tag_dir, version_file


@dataclass
class Report:
    """What one run did (``spool migrate --json`` prints it)."""

    was: int
    now: int
    versions: int = 0  # format 1 version records converted
    objects: int = 0  # format 1 entries by object removed with them
    left: list[str] = field(default_factory=list)  # kept: no manifest justifies them (fsck judges)


def _listdir(path: Path) -> list[str]:
    try:
        return sorted(n for n in os.listdir(path) if not n.startswith("."))
    except (FileNotFoundError, NotADirectoryError):
        return []


def _v1_versions(tree: Tree) -> list[tuple[str, int]]:
    out = []
    for name in _listdir(library_root(tree)):
        out += [(name, int(r)) for r in _listdir(library_root(tree) / name) if r.isdigit()]
    return out


def migrate(tree: Tree, required_tags: list[str], *, dry_run: bool = False) -> Report:
    """Move ``tree`` to :data:`spool.disk.formats.CURRENT` (see the module docstring).
    Raises :class:`spool.disk.formats.TooNew` for a tree newer than this code."""
    was = formats.check(tree.root)
    rep = Report(was=was, now=was)
    todo: list[tuple[Path, Path, datetime | None]] = []  # (v1 record, its v1 entry by object, when)
    with together(at_once=True, threads=segments.SYNC_THREADS):  # each folder fsynced once, at the end
        for name, rev in _v1_versions(tree):
            jid = f"{name}@{rev}"
            record = version_file(tree, name, rev)
            m = read(tree.manifest_file(jid), Manifest)
            if m is None:
                rep.left.append(tree.relative(record))
                continue
            try:
                when: datetime | None = decode(record.read_bytes(), VersionEntry).indexed_at
            except (OSError, ValueError):
                when = None  # an empty record (a cut): the time is lost, the version is not
            todo.append((record, tag_dir(tree, OBJECT_TAG, m.output.sha256) / jid, when))
            if not dry_run:
                line = segments.line_of(m, {t: m.tags[t] for t in required_tags if t in m.tags})
                for p in segments.entry_paths(tree, line):
                    segments.touch(p)
    rep.versions = len(todo)
    if dry_run:
        rep.now = formats.CURRENT
        return rep
    for record, _, when in todo:  # when indexed: the merged version entry's mtime, as a merge keeps it
        if when is not None:
            ts = when.timestamp()
            try:
                os.utime(segments.merged_version(tree, record.parent.name, int(record.name)), (ts, ts))
            except OSError:
                pass
    crashpoint("mid_migrate")  # the merged entries durable, the format 1 records not yet removed
    with together(at_once=True, threads=segments.SYNC_THREADS):
        for record, obj, _ in todo:
            for p in (record, obj):
                try:
                    os.unlink(p)
                except FileNotFoundError:
                    continue  # a run cut short removed it already
                fsync_dir(p.parent)
                rep.objects += p is obj
    for folder in [library_root(tree), index_root(tree) / OBJECT_TAG]:
        for sub in _listdir(folder):  # empty folders of the old layout (a second name list)
            try:
                os.rmdir(folder / sub)
            except OSError:
                pass  # not empty: a record left for fsck, or an old daemon's new one
    try:
        os.rmdir(index_root(tree) / OBJECT_TAG)  # format 2 has no such pseudo-tag
    except OSError:
        pass
    if was < formats.CURRENT:
        formats.write(tree.root, formats.CURRENT)
        rep.now = formats.CURRENT
    return rep
