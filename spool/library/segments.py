"""Format 2's library index: one durable segment per publish batch, merged later.

Format 1 made every library entry of a job durable on its own before the job
reached ``complete/``: four tag entries, an entry by object and a version
record, each in a folder of its own job's (about five fsyncs a job). Format 2
writes the facts of all the jobs a daemon publishes together into one file, the
*segment*, made durable once (the file, then its folder), and merges segments
later, many jobs at once, into entries that live in folders many jobs share::

    index/_segments/<stamp>.<rand>.<writer>.jsonl   a line per job of one batch (JSON)
    index/<tag>/<value>/<job>                       merged: tag entries (as in format 1)
    index/_objects/<aa>/<sha256>.<job>              merged: a job by its object (aa: its first 2 hex)
    index/_versions/<aa>/<name>@<rev>               merged: a published version (aa: of the name's sha256)
    index/_names/<name>                             merged: every name with a published version

``cat index/_segments/*`` shows what was published lately, one job a line; ``ls``
of the merged folders shows the rest. A segment line is the job's "indexed" mark:
it is durable before ``complete/`` (:mod:`spool.queue.publish`). Readers
(:mod:`spool.library.index`) take the segments first and the merged entries after, so a
merge running meanwhile (entries created, *then* its segments removed) never
hides a job from them. The merged entries are empty files; a version's facts are
its manifest's (sha256, store path, the gate's measurement, when published), and
when it was indexed is its entry's mtime.

**Merging** (:func:`merge`) creates every entry of the segments it takes, then
fsyncs each folder it touched once (all at once: they need no order among
them), then removes those segments: a crash in between leaves entries *and*
segments, which is only duplication (readers join them). Its fsyncs are one per
distinct tag value, object shard and version shard touched, however many jobs:
at most ~520 for any number of jobs. **Compacting** (:func:`compact`) writes a
writer's segments as one (durable) and then removes them: three fsyncs. A daemon
compacts its own segments once it has :data:`COMPACT_FILES` of them and merges
all once they hold :data:`MERGE_JOBS` jobs, on a thread of its own, off the job
path; ``spool index --merge`` merges all. Search reads the unmerged segments, so
both keep that part small; neither is needed for correctness.
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
from collections.abc import Iterable, Iterator
from datetime import datetime
from pathlib import Path

import msgspec

from spool.core.faults import crashpoint
from spool.core.model import Manifest, VersionEntry, now
from spool.disk.tree import Tree, fsync_dir, make_dirs, write_atomic
from spool.library.indexpaths import tag_dir

#: The folder of segments, and of the merged entries by object, by version and by name.
SEGMENTS = "_segments"
OBJECTS = "_objects"
VERSIONS = "_versions"
NAMES = "_names"
#: index/ folders that are not tags (a tag key never starts with ``_``; ``_sha256`` is
#: format 1's pseudo-tag for objects and is read as a tag).
RESERVED = frozenset({SEGMENTS, OBJECTS, VERSIONS, NAMES})

#: A daemon compacts its own segments into one once it has this many (a segment per
#: publish batch: search opens each unmerged one)...
COMPACT_FILES = 64
#: ... and merges every segment once they hold this many jobs (the merge's fsyncs are
#: bounded by the folders it touches, ~520 at most: spread over this many jobs).
MERGE_JOBS = 4096
#: Folders fsynced at once at the end of a merge, at most (threads).
SYNC_THREADS = 16


class Line(VersionEntry, kw_only=True):
    """One published job in a segment: what format 1's version record said, and its
    indexed tags (the required tags it has)."""

    tags: dict[str, str] = msgspec.field(default_factory=dict)

    def version(self) -> VersionEntry:
        """The version record this line stands for (without the tags)."""
        return VersionEntry(**{f: getattr(self, f) for f in VersionEntry.__struct_fields__})


_encoder = msgspec.json.Encoder(order="deterministic")
_decoder = msgspec.json.Decoder(Line)


def folder(tree: Tree) -> Path:
    return tree.root / "index" / SEGMENTS


def object_shard(tree: Tree, digest: str) -> Path:
    return tree.root / "index" / OBJECTS / digest[:2]


def name_shard(tree: Tree, name: str) -> Path:
    return tree.root / "index" / VERSIONS / hashlib.sha256(name.encode()).hexdigest()[:2]


def names_folder(tree: Tree) -> Path:
    return tree.root / "index" / NAMES


def line_of(manifest: Manifest, tags: dict[str, str], indexed_at: datetime | None = None) -> Line:
    name, _, rev = manifest.job_id.rpartition("@")
    return Line(
        job_id=manifest.job_id,
        name=name,
        revision=int(rev),
        sha256=manifest.output.sha256,
        store_path=manifest.output.store_path,
        published_at=manifest.published_at,
        indexed_at=indexed_at or now(),
        tags=tags,
        media=manifest.validation.media,
    )


def _name(writer: str) -> str:
    return f"{time.time_ns() // 1000:017d}.{os.urandom(4).hex()}.{writer}.jsonl"


def writer_of(fname: str) -> str:
    """The writer a segment's file name names (``""`` for a name that is not a segment's)."""
    parts = fname.split(".", 2)
    if len(parts) != 3 or not parts[2].endswith(".jsonl"):
        return ""
    return parts[2][: -len(".jsonl")]


def write(tree: Tree, lines: list[Line], writer: str) -> Path:
    """One segment holding ``lines``, durable on return (the file, then its folder:
    inside a :func:`spool.disk.groupcommit.together` batch, at the batch's end)."""
    d = folder(tree)
    data = b"".join(_encoder.encode(x) + b"\n" for x in lines)
    path = d / _name(writer)
    try:
        write_atomic(path, data, mode=0o444, replace=False)
    except FileNotFoundError:  # the spool's first segment: made here, not looked for each time
        make_dirs(d)
        write_atomic(path, data, mode=0o444, replace=False)
    _remember(path.name, list(lines))  # what it holds is known: no read back
    return path


def listed(tree: Tree) -> list[str]:
    """The segments' file names, oldest first."""
    try:
        return sorted(n for n in os.listdir(folder(tree)) if n.endswith(".jsonl") and n[0] != ".")
    except (FileNotFoundError, NotADirectoryError):
        return []


#: file name -> (its lines, the jobs it has lines of): a segment never changes once it has
#: its name. Shared by a process's threads (a daemon's slots, adopt's workers, each reading
#: and writing segments), so every access holds :data:`_cache_lock`: iterating it while
#: another thread added a segment raised "dictionary changed size during iteration" (an
#: adopt of 10,000 files died of it).
_cache: dict[str, tuple[list[Line], frozenset[str]]] = {}
_cache_lock = threading.Lock()


def _remember(fname: str, lines: list[Line]) -> tuple[list[Line], frozenset[str]]:
    got = (lines, frozenset(x.job_id for x in lines))
    with _cache_lock:
        _cache[fname] = got
    return got


def _forget(fname: str) -> None:
    with _cache_lock:
        _cache.pop(fname, None)


def _forget_all_but(names: list[str]) -> None:
    """Forget the segments not in ``names`` (merged and removed: bounded memory)."""
    keep = set(names)
    with _cache_lock:
        for stale in [k for k in _cache if k not in keep]:
            del _cache[stale]


def _cached(fname: str) -> tuple[list[Line], frozenset[str]] | None:
    with _cache_lock:
        return _cache.get(fname)


def _load(tree: Tree, fname: str) -> tuple[list[Line], frozenset[str]] | None:
    """A segment's lines and jobs: remembered, or read once (``None``: merged meanwhile)."""
    got = _cached(fname)
    if got is not None:
        return got
    try:
        with open(folder(tree) / fname, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return None  # merged meanwhile: its entries are there now
    out = []
    for raw in data.splitlines():
        try:
            out.append(_decoder.decode(raw))
        except msgspec.DecodeError:
            continue  # a torn line (never written whole): nothing to index
    return _remember(fname, out)


def _read(tree: Tree, fname: str) -> list[Line] | None:
    got = _load(tree, fname)
    return None if got is None else got[0]


def indexed(tree: Tree, job_ids: Iterable[str]) -> set[str]:
    """Which of ``job_ids`` have a line in an unmerged segment: one listing, and per
    segment a set lookup (each segment is read once a process), however many lines the
    segments hold. The publish path asks this for every batch."""
    want = set(job_ids)
    found: set[str] = set()
    names = listed(tree)
    _forget_all_but(names)
    for fname in names:
        got = _load(tree, fname) if want else None
        if got is not None:
            found |= want & got[1]
    return found


class View:
    """Every unmerged segment line, looked up by job, name, object and tag: read once
    (a snapshot; :mod:`spool.library.index` reads it before the merged entries)."""

    def __init__(self, tree: Tree) -> None:
        names = listed(tree)
        _forget_all_but(names)
        self.files: dict[str, list[Line]] = {}
        for fname in names:
            lines = _read(tree, fname)
            if lines is not None:
                self.files[fname] = lines
        self.by_job: dict[str, Line] = {}
        for lines in self.files.values():
            for x in lines:
                self.by_job.setdefault(x.job_id, x)
        self._by_name: dict[str, set[int]] | None = None

    def __len__(self) -> int:
        return len(self.by_job)

    def lines(self) -> Iterator[Line]:
        return iter(self.by_job.values())

    def revisions(self, name: str) -> set[int]:
        if self._by_name is None:
            self._by_name = {}
            for x in self.by_job.values():
                self._by_name.setdefault(x.name, set()).add(x.revision)
        return self._by_name.get(name, set())

    def names(self) -> set[str]:
        return {x.name for x in self.by_job.values()}

    def tagged(self, tag: str, value: str) -> set[str]:
        return {x.job_id for x in self.by_job.values() if x.tags.get(tag) == value}

    def of_object(self, digest: str) -> set[str]:
        return {x.job_id for x in self.by_job.values() if x.sha256 == digest}


# -- merged entries ------------------------------------------------------------------------


def _listdir(path: Path) -> list[str]:
    try:
        return os.listdir(path)
    except (FileNotFoundError, NotADirectoryError):
        return []


def merged_revisions(tree: Tree, name: str, shard: list[str] | None = None) -> set[int]:
    """Revisions of ``name`` with a merged version entry (``shard``: its folder's listing,
    when the caller has it)."""
    prefix = name + "@"
    names = _listdir(name_shard(tree, name)) if shard is None else shard
    return {int(n[len(prefix) :]) for n in names if n.startswith(prefix) and n[len(prefix) :].isdigit()}


def merged_names(tree: Tree) -> list[str]:
    return [n for n in _listdir(names_folder(tree)) if n[0] != "."]


def merged_object_jobs(tree: Tree, digest: str) -> set[str]:
    prefix = digest + "."
    return {n[len(prefix) :] for n in _listdir(object_shard(tree, digest)) if n.startswith(prefix)}


def merged_version(tree: Tree, name: str, rev: int) -> Path:
    return name_shard(tree, name) / f"{name}@{rev}"


def merged_entries(tree: Tree) -> Iterator[tuple[str, str]]:
    """(kind, job) of every merged object and version entry: ``objects`` yields
    ``<sha256>.<job>`` names' jobs, ``versions`` the ``<name>@<rev>`` ones."""
    base = tree.root / "index"
    for shard in sorted(_listdir(base / OBJECTS)):
        for n in _listdir(base / OBJECTS / shard):
            if n[0] != "." and len(n) > 65:
                yield "objects", n[65:]
    for shard in sorted(_listdir(base / VERSIONS)):
        for n in _listdir(base / VERSIONS / shard):
            if n[0] != ".":
                yield "versions", n


def touch(path: Path) -> None:
    """An empty entry; its folder's fsync is recorded (inside a group-commit batch, as
    :func:`merge` and :mod:`spool.repair.migrate` call it, done once at the batch's end)."""
    make_dirs(path.parent)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o444)
    except FileExistsError:
        return
    os.close(fd)
    fsync_dir(path.parent)  # inside merge's batch: recorded, done once at its end


def entry_paths(tree: Tree, x: Line) -> list[Path]:
    """Every merged entry of one line."""
    out = [tag_dir(tree, t, v) / x.job_id for t, v in sorted(x.tags.items())]
    out.append(object_shard(tree, x.sha256) / f"{x.sha256}.{x.job_id}")
    out.append(merged_version(tree, x.name, x.revision))
    out.append(names_folder(tree) / x.name)
    return out


def merge(
    tree: Tree, *, writers: Iterable[str] | None = None, manifests_only: bool = True
) -> tuple[int, int]:
    """Merge segments (of ``writers`` only, when given) into the merged entries, then
    remove them. Returns (segments merged, jobs merged). Idempotent; safe beside
    publishers, readers and other mergers (see the module docstring).

    A line whose job has no manifest any more (removed by an operator or by ``spool
    fsck``) is dropped, not merged (``manifests_only``)."""
    from spool.disk.groupcommit import together  # here: search reads the index and never commits (+~2 ms)

    wanted = set(writers) if writers is not None else None
    names = [n for n in listed(tree) if wanted is None or writer_of(n) in wanted]
    if not names:
        return 0, 0
    jobs: dict[str, Line] = {}
    for fname in names:
        for x in _read(tree, fname) or []:
            jobs.setdefault(x.job_id, x)
    with together(at_once=True, threads=SYNC_THREADS):
        for x in jobs.values():
            if manifests_only and not tree.manifest_file(x.job_id).exists():
                continue
            for p in entry_paths(tree, x):
                touch(p)
        for x in jobs.values():  # when indexed: the segment's time, kept as the entry's mtime
            ts = x.indexed_at.timestamp()
            try:
                os.utime(merged_version(tree, x.name, x.revision), (ts, ts))
            except OSError:
                pass
    crashpoint("mid_index_merge")  # entries durable, the segments not yet removed
    for fname in names:
        try:
            os.unlink(folder(tree) / fname)
        except FileNotFoundError:
            pass  # another merger took it
        _forget(fname)
    fsync_dir(folder(tree))
    return len(names), len(jobs)


def compact(tree: Tree, writer: str) -> int:
    """Write ``writer``'s segments as one, durably, then remove them (a crash between
    leaves both: duplication, which readers join). Returns how many it replaced."""
    names = [n for n in listed(tree) if writer_of(n) == writer]
    if len(names) < 2:
        return 0
    jobs: dict[str, Line] = {}
    for fname in names:
        for x in _read(tree, fname) or []:
            jobs.setdefault(x.job_id, x)
    write(tree, list(jobs.values()), writer)
    crashpoint("mid_index_compact")  # the compacted segment durable, the old ones not yet removed
    for fname in names:
        try:
            os.unlink(folder(tree) / fname)
        except FileNotFoundError:
            pass
        _forget(fname)
    fsync_dir(folder(tree))
    return len(names)


def due(tree: Tree, writer: str) -> str | None:
    """What a daemon should do about the segments now: ``"merge"`` (they hold
    :data:`MERGE_JOBS` jobs), ``"compact"`` (``writer`` has :data:`COMPACT_FILES`), or
    nothing. One listing: a segment this process has not read counts as one job, unread
    (each daemon knows its own segments' sizes, so one of them sees a merge due; reading
    every other writer's new segments at each look cost a daemon a read per job)."""
    names = listed(tree)
    _forget_all_but(names)
    jobs = sum(len(got[1]) if (got := _cached(n)) is not None else 1 for n in names)
    if jobs >= MERGE_JOBS:
        return "merge"
    if sum(1 for n in names if writer_of(n) == writer) >= COMPACT_FILES:
        return "compact"
    return None


def pending_of(tree: Tree, writer: str) -> tuple[int, int]:
    """(segments, lines) ``writer`` has not merged yet (a listing and the reads)."""
    files = [n for n in listed(tree) if writer_of(n) == writer]
    return len(files), sum(len(_read(tree, n) or []) for n in files)


def clear_cache() -> None:
    with _cache_lock:
        _cache.clear()


__all__ = [
    "COMPACT_FILES",
    "MERGE_JOBS",
    "Line",
    "View",
    "compact",
    "due",
    "indexed",
    "line_of",
    "merge",
    "write",
]
