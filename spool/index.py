"""The library index: required tags and versions as files, inside the publish boundary.

Layout (all under the spool root, readable from a shell)::

    index/<tag>/<value>/<job_id>     one empty file per required tag of a published job
    index/_sha256/<sha256>/<job_id>  one empty file per published job, by its output's hash
    library/<name>/<revision>        one small JSON record per published revision

The ``_sha256`` entries index jobs by the object they publish (a tag key
never starts with ``_``, so it cannot collide with a tag): ``spool get SHA``,
``/download/<sha256>`` and ``/thumbs/<sha256>.jpg`` find the jobs of an
object there to ask whether one of them is visible (:mod:`spool.visibility`).

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
"""

from __future__ import annotations

import hashlib
import os
import re
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from .faults import crashpoint
from .model import JOB_ID_RE, Manifest, MediaInfo, Record, decode, encode, now
from .problems import Problem
from .tree import Tree, fsync_dir, make_dirs, visible_names, write_atomic

#: Top-level folders of the library.
INDEX = "index"
LIBRARY = "library"
#: Longest encoded value kept whole; longer ones end in ``~<hash>``.
MAX_NAME = 200

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


_SAFE = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-.")
_ESCAPE = re.compile(r"%([0-9A-F]{2})")


class VersionEntry(Record, kw_only=True):
    """``library/<name>/<revision>``: one published revision of an asset."""

    job_id: str
    name: str
    revision: int
    sha256: str
    store_path: str
    published_at: datetime
    indexed_at: datetime
    #: What the gate measured of the output (the manifest's ``validation.media``).
    media: MediaInfo | None = None


def encode_value(value: str) -> str:
    """A tag value as a file name (see the module docstring); pure and injective."""
    out = []
    for i, b in enumerate(value.encode("utf-8")):
        if b in _SAFE and not (i == 0 and b == ord(".")):
            out.append(chr(b))
        else:
            out.append(f"%{b:02X}")
    name = "".join(out)
    if len(name) <= MAX_NAME:
        return name
    cut = name[: MAX_NAME - 33]
    if "%" in cut[-2:]:  # never split an escape
        cut = cut[: cut.rindex("%")]
    return cut + "~" + hashlib.sha256(value.encode("utf-8")).hexdigest()[:32]


def decode_value(name: str) -> str | None:
    """The value a name encodes, or ``None`` for a hashed (shortened) one."""
    if "~" in name:
        return None
    return _ESCAPE.sub(lambda m: chr(int(m.group(1), 16)), name).encode("latin-1").decode("utf-8")


def index_root(tree: Tree) -> Path:
    return tree.root / INDEX


def library_root(tree: Tree) -> Path:
    return tree.root / LIBRARY


def tag_dir(tree: Tree, tag: str, value: str) -> Path:
    return tree.root / INDEX / tag / encode_value(value)


def version_file(tree: Tree, name: str, revision: int) -> Path:
    return tree.root / LIBRARY / name / str(revision)


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


def index_job(tree: Tree, manifest: Manifest, required_tags: list[str]) -> None:
    """Create every index entry of a published job that is missing; durable on return.

    Idempotent: the publish path, recovery and fsck all call it.
    """
    from .groupcommit import together  # here: search and get import this module, never this

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


def is_indexed(tree: Tree, job_id: str) -> bool:
    name, rev = split_job_id(job_id)
    return version_file(tree, name, rev).exists()


def revisions(tree: Tree, name: str) -> list[int]:
    """Every indexed revision of a name, ascending (names only, no parsing)."""
    try:
        names = os.listdir(f"{tree.root}/{LIBRARY}/{name}")  # a str path: hot in search
    except (FileNotFoundError, NotADirectoryError):
        return []
    return sorted(int(n) for n in names if n.isdigit())


def read_version(tree: Tree, name: str, revision: int) -> VersionEntry | None:
    try:
        return decode(version_file(tree, name, revision).read_bytes(), VersionEntry)
    except (OSError, ValueError):
        return None


def entries(tree: Tree, tag: str, value: str) -> set[str]:
    """Names indexed under ``tag=value`` (one directory listing; entries are created
    in place, never under a temp name, and callers match names against job IDs)."""
    try:
        return set(os.listdir(tag_dir(tree, tag, value)))
    except (FileNotFoundError, NotADirectoryError):
        return set()


def names(tree: Tree) -> list[str]:
    """Every asset name that has at least one indexed revision."""
    try:
        return sorted(n for n in os.listdir(library_root(tree)) if not n.startswith("."))
    except FileNotFoundError:
        return []


def _all_tag_entries(tree: Tree) -> Iterator[tuple[str, str, str]]:
    """(tag, encoded value, job_id) of every tag entry on disk."""
    root = index_root(tree)
    for tag in sorted(os.listdir(root)) if root.is_dir() else []:
        tdir = root / tag
        if not tdir.is_dir():
            continue
        for val in sorted(os.listdir(tdir)):
            vdir = tdir / val
            if vdir.is_dir():
                for jid in sorted(os.listdir(vdir)):
                    if not jid.startswith("."):
                        yield tag, val, jid


def delays(tree: Tree) -> list[float]:
    """Stored -> indexed delay (seconds) of every version record (a full scan)."""
    out = []
    for name in names(tree):
        for rev in revisions(tree, name):
            v = read_version(tree, name, rev)
            if v is not None:
                out.append(max(0.0, (v.indexed_at - v.published_at).total_seconds()))
    return out


def size(tree: Tree) -> tuple[int, int]:
    """(tag entries, version records) on disk: the index size for status and metrics
    (the ``_sha256`` object entries, one per version, are not tag entries)."""
    tags = sum(1 for t, _, _ in _all_tag_entries(tree) if t != OBJECT_TAG)
    versions = sum(len(revisions(tree, n)) for n in names(tree))
    return tags, versions


# -- checking and rebuilding (spool fsck, spool index --rebuild) -------------------------


@dataclass
class Finding:
    path: str
    problem: str
    repair: str
    repaired: bool = False


def _manifests(tree: Tree) -> dict[str, Manifest]:
    from .records import read

    out = {}
    for fname in visible_names(tree.manifests):
        m = read(tree.manifests / fname, Manifest)
        if m is not None:
            out[m.job_id] = m
    return out


def check(tree: Tree, required_tags: list[str], *, repair: bool = True) -> list[Finding]:
    """Compare the index with the manifests (the source of truth) and repair it.

    Missing: an entry or version record a manifest calls for (created). Stray:
    an entry no manifest justifies (removed). A manifest whose store file is
    missing keeps its entries (search never prints it) and is reported here.
    Safe while daemons publish: a publisher writes its manifest before its
    entries, so nothing it is about to index is ever judged stray.
    """
    manifests = _manifests(tree)
    expected: set[tuple[str, str, str]] = set()
    for m in manifests.values():
        for tag, value in wanted(m, required_tags):
            expected.add((tag, encode_value(value), m.job_id))
    out: list[Finding] = []
    # Missing entries and version records.
    for jid, m in sorted(manifests.items()):
        missing = [(t, v) for t, v in wanted(m, required_tags) if not (tag_dir(tree, t, v) / jid).exists()]
        absent_version = not is_indexed(tree, jid)
        if missing or absent_version:
            what = ", ".join(f"index/{t}/{encode_value(v)}/{jid}" for t, v in missing)
            if absent_version:
                name, rev = split_job_id(jid)
                what = ", ".join(filter(None, [what, f"{LIBRARY}/{name}/{rev}"]))
            f = Finding(what, "missing library index entries", "create them from the manifest")
            if repair:
                index_job(tree, m, required_tags)
                f.repaired = True
            out.append(f)
        if not (tree.root / m.output.store_path).is_file():
            out.append(
                Finding(f"manifests/{jid}.json", f"indexed object {m.output.store_path} is missing", "")
            )
    # Stray tag entries: no manifest, or the manifest says another value. A manifest
    # is re-read before removing: one written after the scan above precedes its entries.
    for tag, val, jid in list(_all_tag_entries(tree)):
        if (tag, val, jid) in expected or _justified(tree, required_tags, tag, val, jid):
            continue
        entry = index_root(tree) / tag / val / jid
        out.append(_stray(tree, entry, "index entry (no manifest names it)", repair))
    # Stray version records.
    for name in names(tree):
        for rev in revisions(tree, name):
            jid = f"{name}@{rev}"
            if jid in manifests or tree.manifest_file(jid).exists():
                continue
            out.append(_stray(tree, version_file(tree, name, rev), "version record (no manifest)", repair))
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
    from .records import read

    m = read(tree.manifest_file(jid), Manifest)
    return m is not None and (tag, val) in {(t, encode_value(v)) for t, v in wanted(m, required_tags)}


def fsck_problems(tree: Tree, *, repair: bool) -> list[Problem]:
    """The index's findings as ``spool fsck`` problems (the one call fsck makes)."""
    from .config import load

    try:
        tags = load(tree.config_file).acceptance.required_tags
    except Exception:  # fsck of a spool with a broken config still checks the rest
        return []
    return [
        Problem(3, f.path, f.problem, f.repair or None, f.repaired) for f in check(tree, tags, repair=repair)
    ]
