"""The library index: required tags and versions as files, inside the publish boundary.

Layout (all under the spool root, readable from a shell)::

    index/<tag>/<value>/<job_id>     one empty file per required tag of a published job
    index/_sha256/<sha256>/<job_id>  one empty file per published job, by its output's hash
    library/<name>/<revision>        one small JSON record per published revision

The ``_sha256`` entries index jobs by the object they publish (a tag key
never starts with ``_``, so it cannot collide with a tag): ``spool get SHA``,
``/download/<sha256>`` and ``/thumbs/<sha256>.jpg`` find the jobs of an
object there to ask whether one of them is visible (:mod:`spool.library.visibility`).

``<value>`` is the tag value encoded by :func:`encode_value` so any Unicode
string is a safe file name: the bytes ``A-Z a-z 0-9 _ -`` (and ``.`` when not
first) stay as they are, every other UTF-8 byte becomes ``%XX`` (upper-case
hex). ``en-GB`` stays ``en-GB``; ``Été 2026`` becomes ``%C3%89t%C3%A9%202026``.
An encoding longer than :data:`MAX_NAME` bytes is cut at a ``%`` boundary and
ends in ``~`` plus 32 hex digits of the value's sha256 (``~`` never occurs
otherwise: a literal one is ``%7E``), so it still names exactly one value.

Order of writes for one job (the publish path calls :func:`index_job` after
the store file and ``manifests/J.json`` exist and before ``complete/J.json``):

1. every tag entry, each durable (its folder fsynced; the tag folders at once);
2. then the version record ``library/<name>/<revision>``, durable: it is the
   "indexed" mark.

So an entry never exists before its object is readable (no false positive:
the store file and manifest came first, and search re-checks both anyway),
and a job reaches ``complete/`` only with all its entries (no false negative).
Every step is idempotent: recovery and ``spool fsck`` call it again.

No pointer names the current version: the versions of a name are the names in
``library/<name>/``, and the current one is the highest whose job is complete,
so two hosts publishing different revisions at once never race on a file.

That is format 1. A format 2 tree (:mod:`spool.disk.formats`) indexes a publish batch
as one durable segment and merges segments later into entries in shared folders
(:mod:`spool.library.segments`): ``index/_objects/`` by object and ``index/_versions/``,
``index/_names/`` for versions, beside the same tag entries. The readers here read
both formats and the unmerged segments, segments first (see :class:`Snapshot`),
so a rolling upgrade (daemons of both formats on one spool) and a merge running
meanwhile are both invisible to them.
"""

from __future__ import annotations

import os
import re
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from spool.core.config import load
from spool.core.faults import crashpoint
from spool.core.model import JOB_ID_RE, Manifest, VersionEntry, decode, encode, now
from spool.core.problems import Problem
from spool.disk import formats
from spool.disk.records import read
from spool.disk.tree import HOST, Tree, fsync_dir, make_dirs, visible_names, write_atomic
from spool.library import segments
from spool.library.indexpaths import LIBRARY, encode_value, index_root, library_root, tag_dir, version_file

#: The pseudo-tag under which every published job is indexed by its output's sha256.
OBJECT_TAG = "_sha256"

#: An asset name (the ``name`` of a job ID).
NAME_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,95}$")


def split_job_id(jid: str) -> tuple[str, int]:
    """``name@rev`` -> (name, rev); ``ValueError`` for anything else."""
    m = JOB_ID_RE.match(jid)
    if not m:
        raise ValueError(f"{jid!r} is not a job ID of the form name@revision")
    return m.group("name"), int(m.group("rev"))


def wanted(manifest: Manifest, required_tags: list[str]) -> list[tuple[str, str]]:
    """(tag, value) pairs a manifest is indexed under: its required tags it has, and
    its output's sha256 under :data:`OBJECT_TAG`."""
    pairs = [(t, manifest.tags[t]) for t in required_tags if t in manifest.tags]
    return [*pairs, (OBJECT_TAG, manifest.output.sha256)]


def object_jobs(tree: Tree, digest: str) -> set[str]:
    """Job IDs indexed as publishing the object ``digest`` (one listing)."""
    return entries(tree, OBJECT_TAG, digest)


def _touch(path: Path) -> bool:
    """Create an empty entry durably; ``False`` if it was there already."""
    make_dirs(path.parent)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o444)
    except FileExistsError:
        return False
    os.close(fd)
    fsync_dir(path.parent)
    return True


#: Stored -> indexed delays (seconds) of the jobs this process indexed last: the daemon's
#: metrics read them (no I/O); ``spool index`` computes the same from the records.
RECENT_DELAYS: deque[float] = deque(maxlen=100)


def index_job(tree: Tree, manifest: Manifest, required_tags: list[str], *, writer: str = "") -> None:
    """Create every index entry of a published job that is missing; durable on return.

    Idempotent: the publish path, recovery and fsck all call it."""
    index_jobs(tree, [manifest], required_tags, writer=writer)


def index_jobs(
    tree: Tree,
    manifests: list[Manifest],
    required_tags: list[str],
    *,
    writer: str = "",
    fmt: int | None = None,
    force: bool = False,
) -> None:
    """Index published jobs, durably on return, in the format the tree is written in.

    Format 1: each job's entries, then its version record (:func:`_index_v1`).
    Format 2: one segment for all the jobs not indexed yet (``force``: for all, unasked:
    as fsck's repair of a merged job missing an entry does, and publish for manifests it
    has just linked, which no line can name yet), written by
    ``writer`` (a daemon's worker; the CLI's ``<host>-cli`` by default)."""
    if (fmt or formats.writing(tree.root)) == 1:
        for m in manifests:
            _index_v1(tree, m, required_tags)
        return
    if not force:
        manifests = unindexed(tree, manifests)
    if not manifests:
        return
    at = now()
    lines = [segments.line_of(m, dict(_tags_of(m, required_tags)), at) for m in manifests]
    crashpoint("mid_index")  # the manifests durable, the segment not yet written
    segments.write(tree, lines, writer or f"{HOST}-cli")
    for x in lines:
        RECENT_DELAYS.append(max(0.0, (x.indexed_at - x.published_at).total_seconds()))


def unindexed(tree: Tree, manifests: list[Manifest]) -> list[Manifest]:
    """The manifests whose job is not indexed yet: no segment line (asked first: a merge
    makes its entries before it removes its segments), no merged version entry, no format 1
    version record. A stat or two a job, whatever the size of the index."""
    in_segments = segments.indexed(tree, (m.job_id for m in manifests))
    out = []
    for m in manifests:
        if m.job_id in in_segments:
            continue
        name, rev = split_job_id(m.job_id)
        if segments.merged_version(tree, name, rev).exists() or version_file(tree, name, rev).exists():
            continue
        out.append(m)
    return out


def _tags_of(manifest: Manifest, required_tags: list[str]) -> list[tuple[str, str]]:
    """The (tag, value) pairs a job is found by: its required tags it has."""
    return [(t, manifest.tags[t]) for t in required_tags if t in manifest.tags]


def _index_v1(tree: Tree, manifest: Manifest, required_tags: list[str]) -> None:
    """Format 1: every tag entry durable, then the version record (idempotent)."""
    from spool.disk.groupcommit import together  # here: search and get import this module, never this

    # The tag folders' fsyncs need no order among themselves, only to be done before
    # the version record: issued at once, the filesystem commits them together.
    with together(at_once=True):
        for tag, value in wanted(manifest, required_tags):
            _touch(tag_dir(tree, tag, value) / manifest.job_id)
    crashpoint("mid_index")  # tag entries written, the version record not yet
    name, rev = split_job_id(manifest.job_id)
    vf = version_file(tree, name, rev)
    if vf.exists():
        return
    make_dirs(vf.parent)
    entry = VersionEntry(
        job_id=manifest.job_id,
        name=name,
        revision=rev,
        sha256=manifest.output.sha256,
        store_path=manifest.output.store_path,
        published_at=manifest.published_at,
        indexed_at=now(),
        media=manifest.validation.media,
    )
    try:
        write_atomic(vf, encode(entry), mode=0o444, replace=False)
    except FileExistsError:
        return  # a concurrent recovery or fsck wrote the same record
    RECENT_DELAYS.append(max(0.0, (entry.indexed_at - entry.published_at).total_seconds()))


class Snapshot:
    """One look at the whole index, for a caller asking many questions (a search):
    the unmerged segments read once, *then* the merged entries of both formats as
    asked (a merge creates its entries before it removes its segments, so in this
    order nothing published is ever missed), each version shard listed once."""

    def __init__(self, tree: Tree) -> None:
        self.tree = tree
        self.view = segments.View(tree)
        self._shards: dict[Path, list[str]] = {}

    def _shard(self, name: str) -> list[str]:
        d = segments.name_shard(self.tree, name)
        got = self._shards.get(d)
        if got is None:
            try:
                got = self._shards[d] = os.listdir(d)
            except (FileNotFoundError, NotADirectoryError):
                got = self._shards[d] = []
        return got

    def revisions(self, name: str) -> list[int]:
        # Format 1's records before the merged entries: spool migrate creates these, then
        # removes those (segments -> merged entries is the same order, kept by __init__).
        revs = set(self.view.revisions(name))
        try:
            v1 = os.listdir(f"{self.tree.root}/{LIBRARY}/{name}")  # a str path: hot in search
        except (FileNotFoundError, NotADirectoryError):
            v1 = []
        revs |= {int(n) for n in v1 if n.isdigit()}
        revs |= segments.merged_revisions(self.tree, name, self._shard(name))
        return sorted(revs)

    def is_indexed(self, job_id: str) -> bool:
        if job_id in self.view.by_job:
            return True
        name, rev = split_job_id(job_id)
        return version_file(self.tree, name, rev).exists() or f"{name}@{rev}" in self._shard(name)

    def entries(self, tag: str, value: str) -> set[str]:
        found = self.view.of_object(value) if tag == OBJECT_TAG else self.view.tagged(tag, value)
        try:
            found |= set(os.listdir(tag_dir(self.tree, tag, value)))
        except (FileNotFoundError, NotADirectoryError):
            pass
        if tag == OBJECT_TAG:  # merged last (see revisions())
            found |= segments.merged_object_jobs(self.tree, value)
        return found

    def names(self) -> list[str]:
        out = self.view.names()
        try:
            out |= {n for n in os.listdir(library_root(self.tree)) if not n.startswith(".")}
        except FileNotFoundError:
            pass
        return sorted(out | set(segments.merged_names(self.tree)))  # merged last: see revisions()

    def version(self, name: str, revision: int) -> VersionEntry | None:
        line = self.view.by_job.get(f"{name}@{revision}")
        if line is not None:
            return line.version()
        try:  # format 1's record before the merged entry (see revisions())
            return decode(version_file(self.tree, name, revision).read_bytes(), VersionEntry)
        except (OSError, ValueError):
            pass
        try:
            indexed = segments.merged_version(self.tree, name, revision).stat().st_mtime
        except OSError:
            return None

        m = read(self.tree.manifest_file(f"{name}@{revision}"), Manifest)
        if m is None:
            return None  # a version's facts are its manifest's (fsck reports one without)
        return VersionEntry(
            job_id=m.job_id, name=name, revision=revision, sha256=m.output.sha256,
            store_path=m.output.store_path, published_at=m.published_at,
            indexed_at=datetime.fromtimestamp(indexed, UTC), media=m.validation.media,
        )  # fmt: skip


def is_indexed(tree: Tree, job_id: str) -> bool:
    return Snapshot(tree).is_indexed(job_id)


def revisions(tree: Tree, name: str) -> list[int]:
    """Every indexed revision of a name, ascending (names only, no parsing of entries)."""
    return Snapshot(tree).revisions(name)


def read_version(tree: Tree, name: str, revision: int) -> VersionEntry | None:
    return Snapshot(tree).version(name, revision)


def entries(tree: Tree, tag: str, value: str) -> set[str]:
    """Names indexed under ``tag=value`` (a directory listing, and the unmerged segments;
    entries are created in place, never under a temp name, and callers match names
    against job IDs)."""
    return Snapshot(tree).entries(tag, value)


def names(tree: Tree) -> list[str]:
    """Every asset name that has at least one indexed revision."""
    return Snapshot(tree).names()


def watched(tree: Tree) -> tuple[Path, ...]:
    """Folders whose change may change the library's figures (for cached gauges)."""
    base = index_root(tree)
    return (library_root(tree), base / segments.NAMES, base / segments.SEGMENTS)


def _all_tag_entries(tree: Tree) -> Iterator[tuple[str, str, str]]:
    """(tag, encoded value, job_id) of every tag entry on disk (``_sha256``: format 1's
    entries by object, read as a tag)."""
    root = index_root(tree)
    for tag in sorted(os.listdir(root)) if root.is_dir() else []:
        tdir = root / tag
        if tag in segments.RESERVED or not tdir.is_dir():
            continue
        for val in sorted(os.listdir(tdir)):
            vdir = tdir / val
            if vdir.is_dir():
                for jid in sorted(os.listdir(vdir)):
                    if not jid.startswith("."):
                        yield tag, val, jid


def delays(tree: Tree) -> list[float]:
    """Stored -> indexed delay (seconds) of every version (a full scan)."""
    snap = Snapshot(tree)
    out = []
    for name in snap.names():
        for rev in snap.revisions(name):
            v = snap.version(name, rev)
            if v is not None:
                out.append(max(0.0, (v.indexed_at - v.published_at).total_seconds()))
    return out


def size(tree: Tree) -> tuple[int, int]:
    """(tag entries, versions) of the index: the index size for status and metrics
    (the entries by object, one per version, are not tag entries; a job whose
    segment a merge has not yet removed counts once)."""
    snap = Snapshot(tree)
    merged_tags = {(t, j) for t, _, j in _all_tag_entries(tree) if t != OBJECT_TAG}
    seg_tags = {(t, x.job_id) for x in snap.view.lines() for t in x.tags}
    versions = {f"{n}@{r}" for n in snap.names() for r in snap.revisions(n)}
    return len(merged_tags | seg_tags), len(versions)


# -- checking and rebuilding (spool fsck, spool index --rebuild) -------------------------


@dataclass
class Finding:
    path: str
    problem: str
    repair: str
    repaired: bool = False


def _manifests(tree: Tree) -> dict[str, Manifest]:
    out = {}
    for fname in visible_names(tree.manifests):
        m = read(tree.manifests / fname, Manifest)
        if m is not None:
            out[m.job_id] = m
    return out


def check(tree: Tree, required_tags: list[str], *, repair: bool = True) -> list[Finding]:
    """Compare the index with the manifests (the source of truth) and repair it.

    Missing: an entry or version a manifest calls for (created: format 1's entries
    for a job indexed in format 1, else a segment in the tree's format). Stray: an
    entry no manifest justifies (removed). A manifest whose store file is missing
    keeps its entries (search never prints it) and is reported here. Safe while
    daemons publish: a publisher writes its manifest before its entries (and
    segment), so nothing it is about to index is ever judged stray.
    """
    manifests = _manifests(tree)
    snap = Snapshot(tree)
    expected: set[tuple[str, str, str]] = set()
    for m in manifests.values():
        for tag, value in wanted(m, required_tags):
            expected.add((tag, encode_value(value), m.job_id))
    out: list[Finding] = []
    again: list[Manifest] = []
    # Missing entries and versions.
    for jid, m in sorted(manifests.items()):
        name, rev = split_job_id(jid)
        missing: list[str] = []
        if jid in snap.view.by_job:
            pass  # its segment line holds every entry until a merge makes them
        elif segments.merged_version(tree, name, rev).exists():
            line = segments.line_of(m, dict(_tags_of(m, required_tags)))
            paths = segments.entry_paths(tree, line)
            missing = [tree.relative(p) for p in paths if not p.exists()]
        elif version_file(tree, name, rev).exists():
            pairs = [(t, v) for t, v in wanted(m, required_tags) if not (tag_dir(tree, t, v) / jid).exists()]
            missing = [f"index/{t}/{encode_value(v)}/{jid}" for t, v in pairs]
            if missing and repair:
                _index_v1(tree, m, required_tags)
        else:
            missing = [f"its version ({name}@{rev} is in no segment and has no version entry)"]
        if missing:
            f = Finding(", ".join(missing), "missing library index entries", "create them from the manifest")
            f.repaired = repair
            if repair and not version_file(tree, name, rev).exists():
                again.append(m)
            out.append(f)
        if not (tree.root / m.output.store_path).is_file():
            out.append(
                Finding(f"manifests/{jid}.json", f"indexed object {m.output.store_path} is missing", "")
            )
    if again:
        index_jobs(tree, again, required_tags, force=True)
    # Stray tag entries: no manifest, or the manifest says another value. A manifest
    # is re-read before removing: one written after the scan above precedes its entries.
    for tag, val, jid in list(_all_tag_entries(tree)):
        if (tag, val, jid) in expected or _justified(tree, required_tags, tag, val, jid):
            continue
        entry = index_root(tree) / tag / val / jid
        out.append(_stray(tree, entry, "index entry (no manifest names it)", repair))
    # Stray format 1 version records.
    for name in sorted(_names_v1(tree)):
        for rev in sorted(int(n) for n in os.listdir(library_root(tree) / name) if n.isdigit()):
            jid = f"{name}@{rev}"
            if jid in manifests or tree.manifest_file(jid).exists():
                continue
            out.append(_stray(tree, version_file(tree, name, rev), "version record (no manifest)", repair))
    out += _stray_merged(tree, manifests, repair)
    return out


def _names_v1(tree: Tree) -> list[str]:
    try:
        return [n for n in os.listdir(library_root(tree)) if not n.startswith(".")]
    except FileNotFoundError:
        return []


def _stray_merged(tree: Tree, manifests: dict[str, Manifest], repair: bool) -> list[Finding]:
    """Format 2's merged entries by object, version and name that no manifest justifies."""
    out = []
    base = index_root(tree)
    for shard in sorted(segments._listdir(base / segments.OBJECTS)):
        for n in sorted(segments._listdir(base / segments.OBJECTS / shard)):
            if n.startswith(".") or len(n) < 66:
                continue
            digest, jid = n[:64], n[65:]
            m = manifests.get(jid) or read(tree.manifest_file(jid), Manifest)
            if m is None or m.output.sha256 != digest:
                path = base / segments.OBJECTS / shard / n
                out.append(_stray(tree, path, "entry by object (no manifest names it)", repair))
    for shard in sorted(segments._listdir(base / segments.VERSIONS)):
        for jid in sorted(segments._listdir(base / segments.VERSIONS / shard)):
            if jid.startswith(".") or jid in manifests or tree.manifest_file(jid).exists():
                continue
            path = base / segments.VERSIONS / shard / jid
            out.append(_stray(tree, path, "version entry (no manifest)", repair))
    named = {split_job_id(j)[0] for j in manifests}
    for name in sorted(segments.merged_names(tree)):
        if name in named or any(tree.manifests.glob(f"{name}@*.json")):
            continue
        out.append(_stray(tree, segments.names_folder(tree) / name, "name entry (no manifest)", repair))
    return out


def _stray(tree: Tree, path: Path, what: str, repair: bool) -> Finding:
    """A library file no manifest justifies; removed (durably) when repairing."""
    f = Finding(tree.relative(path), f"stray library {what}", "remove it")
    if repair:
        path.unlink(missing_ok=True)
        fsync_dir(path.parent)
        f.repaired = True
    return f


def _justified(tree: Tree, required_tags: list[str], tag: str, val: str, jid: str) -> bool:
    m = read(tree.manifest_file(jid), Manifest)
    return m is not None and (tag, val) in {(t, encode_value(v)) for t, v in wanted(m, required_tags)}


def fsck_problems(tree: Tree, *, repair: bool) -> list[Problem]:
    """The index's findings as ``spool fsck`` problems (the one call fsck makes)."""
    try:
        tags = load(tree.config_file).acceptance.required_tags
    except Exception:  # fsck of a spool with a broken config still checks the rest
        return []
    return [
        Problem(3, f.path, f.problem, f.repair or None, f.repaired) for f in check(tree, tags, repair=repair)
    ]
