"""The asset library: versions, search and get over the index (SPEC section 9).

A job ``name`` is an asset and each revision a version. The *current*
version is the highest revision that is indexed and whose job is in
``complete/``: decided from names on disk at read time, with no pointer to
update, so it never goes backwards and an older revision that completes late
never becomes current.

Search terms (``spool search``):

* ``TAG=VALUE`` (or ``tag:TAG=VALUE``): the asset's tag equals VALUE exactly,
  both in Unicode NFC (at least one tag term must name an indexed tag,
  ``[acceptance] required_tags``, unless the query has no tag terms at all,
  which lists every asset);
* ``FIELD<N``, ``FIELD<=N``, ``FIELD>N``, ``FIELD>=N``, ``FIELD=N``,
  ``FIELD!=N``: a numeric comparison on what the gate measured at publish
  (:data:`MEDIA_NUMBERS`: ``width>=1080``, ``duration<=15``), on an
  enrichment field (:data:`spool.library.enrich.FIELDS`) or a plug-in's
  ``name.key`` (``=``/``!=`` also compare text for plug-in values);
* ``FIELD=TEXT`` and ``FIELD!=TEXT`` for the gate's text fields
  (:data:`MEDIA_TEXT`: ``codec=h264``, ``container=mov``), case-insensitive.

A term is split at its first ``<``, ``>``, ``!`` or ``=``; field names win
over tag names (``tag:`` says a tag); a dotted name no plug-in provides is an
error naming the known fields.

All terms are ANDed. Hits are checked before they are returned: the job is
complete, its manifest has exactly the queried tags, its visibility is
allowed (:mod:`spool.library.visibility`), its store file exists with the manifest's
size, and every comparison holds for the values its manifest (the gate's
measurement of the verified object) or its enrichment record gives. An asset
neither can judge a comparison on is counted in ``partial`` by field, never
silently dropped and never a hit.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from spool import kinds
from spool.core.config import Config
from spool.core.errors import InvalidInput, NotFound, NotReady, SpoolError
from spool.core.families import Family
from spool.core.model import JOB_ID_RE, Manifest, MediaInfo
from spool.disk import store
from spool.disk.records import read
from spool.disk.tree import Tree, copy_verified, fsync_dir, link_no_replace, link_or_copy, temp_name
from spool.library import enrich, index, indexpaths
from spool.library import visibility as vis
from spool.library.index import NAME_RE, split_job_id
from spool.library.visibility import nfc
from spool.media import thumbs
from spool.queue.status import library_counts, locate, running_workers

_TERM = re.compile(
    r"^(?P<tag>tag:)?(?P<field>[a-z][a-z0-9_.-]{0,63})(?P<op><=|>=|!=|<|>|=)(?P<value>.*)$", re.S
)
_SHA = re.compile(r"^[0-9a-f]{64}$")

#: Numeric fields the gate measures at publish (:class:`spool.core.model.MediaInfo`), searchable at
#: once; for a version published before the gate recorded them, enrichment answers the same.
MEDIA_NUMBERS = {
    "duration": "duration",
    "width": "width",
    "height": "height",
    "fps": "fps",
    "channels": "audio_channels",
    "loudness": "loudness",
}
#: Text fields the gate measures, compared with ``=`` and ``!=`` (case-insensitively).
#: ``codec`` is the video codec, or the audio codec of a file without video.
MEDIA_TEXT = {
    "container": "container",
    "codec": "codec",
    "video_codec": "video_codec",
    "audio_codec": "audio_codec",
    "pix_fmt": "pix_fmt",
}


@dataclass(frozen=True)
class Comparison:
    field: str
    op: str
    value: float | str

    def test(self, actual: Any) -> bool:
        if isinstance(self.value, str) or isinstance(actual, str):
            a, b = str(actual), str(self.value)
            if self.field in MEDIA_TEXT:
                a, b = a.casefold(), b.casefold()
            return a == b if self.op == "=" else a != b if self.op == "!=" else False
        x, y = float(actual), self.value
        return {
            "<": x < y,
            "<=": x <= y,
            ">": x > y,
            ">=": x >= y,
            "=": x == y,
            "!=": x != y,
        }[self.op]


@dataclass(frozen=True)
class Query:
    tags: dict[str, str] = field(default_factory=dict)
    comparisons: list[Comparison] = field(default_factory=list)


def known_fields(plugin_names: Iterable[str] = ()) -> list[str]:
    """Every field a comparison may name (plug-ins as ``name.*``), for error messages."""
    fields = {*MEDIA_NUMBERS, *MEDIA_TEXT, *enrich.FIELDS}
    return sorted(fields) + [f"{p}.*" for p in sorted(plugin_names)]


def parse_terms(terms: Iterable[str], plugin_names: Iterable[str] = ()) -> Query:
    """Pure: search terms -> a query; a bad term raises :class:`InvalidInput` naming it.

    Values are compared in Unicode NFC, as tags are stored. A field name with a dot
    is a plug-in's (``classifier.label``): one no installed plug-in provides is an
    error naming the known fields, never a tag filter that silently matches
    nothing. ``tag:KEY=VALUE`` is always a tag (a tag named like a field, or with
    a dot in its name)."""
    plugin_names = list(plugin_names)
    tags: dict[str, str] = {}
    comps: list[Comparison] = []
    for term in terms:
        m = _TERM.match(term)
        if m is None:
            raise InvalidInput(
                term, "is not a search term (TAG=VALUE, or FIELD<N with one of < <= > >= = != )"
            )
        fld, op, raw = m.group("field"), m.group("op"), nfc(m.group("value"))
        if m.group("tag") is None and (fld in MEDIA_NUMBERS or fld in MEDIA_TEXT or fld in enrich.FIELDS):
            if fld in MEDIA_TEXT:
                if op not in ("=", "!="):
                    raise InvalidInput(term, f"{fld} is text and compares only with = or !=")
                if not raw:
                    raise InvalidInput(term, f"{fld} needs a value")
                comps.append(Comparison(fld, op, raw))
                continue
            try:
                comps.append(Comparison(fld, op, float(raw)))
            except ValueError:
                raise InvalidInput(term, f"{fld} compares with a number, not {raw!r}") from None
        elif m.group("tag") is None and "." in fld:
            if enrich.enricher_of(fld, plugin_names) is None:
                raise InvalidInput(
                    fld,
                    f"is not a known field: no enrichment plug-in provides {fld.partition('.')[0]}.* "
                    f"(known: {', '.join(known_fields(plugin_names))}; a tag is tag:{fld}=VALUE)",
                )
            num: float | str
            try:
                num = float(raw)
            except ValueError:
                if op not in ("=", "!="):
                    raise InvalidInput(term, f"{fld} compares with a number, not {raw!r}") from None
                num = raw
            comps.append(Comparison(fld, op, num))
        elif op == "=":
            if not raw:
                raise InvalidInput(term, f"tag {fld} needs a value")
            if fld in tags and tags[fld] != raw:
                raise InvalidInput(term, f"tag {fld} is asked for twice with different values")
            tags[fld] = raw
        else:
            raise InvalidInput(term, f"{fld} is not a known field, and tags only compare with =")
    return Query(tags, comps)


def field_value(m: Manifest, rec: enrich.Enrichment | None, fld: str) -> Any:
    """What a version says for a comparison's field, or :data:`spool.library.enrich.UNJUDGED`:
    the gate's measurement first (the manifest of the verified object), then enrichment."""
    media = m.validation.media
    if media is not None and (fld in MEDIA_NUMBERS or fld in MEDIA_TEXT):
        if fld == "codec":
            v: Any = media.video_codec or media.audio_codec
        else:
            v = getattr(media, MEDIA_NUMBERS.get(fld) or MEDIA_TEXT[fld])
        if v is not None:
            return v
    if fld in ("codec", "video_codec", "audio_codec"):
        facts = rec.facts if rec is not None else None
        if facts is None:
            return enrich.UNJUDGED
        v = facts.video_codec or facts.audio_codec if fld == "codec" else getattr(facts, fld)
        return enrich.UNJUDGED if v is None else v
    if fld in enrich.FIELDS or "." in fld:
        return enrich.value(rec, fld)
    return enrich.UNJUDGED  # container, pix_fmt, channels: only the gate records them


class Hit(msgspec.Struct, kw_only=True):
    """One search result: a complete, verified-present version of an asset."""

    job: str
    name: str
    revision: int
    current: bool
    sha256: str
    path: str  # the store file, relative to the spool root
    size: int
    file: str  # the output's own file name
    tags: dict[str, str]
    duration: float | None
    resolution: str | None
    thumbnail: str | None  # relative to the spool root, if one exists
    #: What the gate measured at publish (``None`` for versions published before it did).
    media: MediaInfo | None = None
    enrichment: dict[str, Any] = msgspec.field(default_factory=dict)


class Result(msgspec.Struct, kw_only=True):
    results: list[Hit]
    #: field -> count of matching assets the enrichment could not judge
    partial: dict[str, int]


def current_revision(tree: Tree, name: str, snap: index.Snapshot | None = None) -> int | None:
    """The highest indexed revision of ``name`` whose job is complete (``snap``: the
    caller's look at the index, when it asks about many names)."""
    complete = f"{tree.root}/complete/{name}@"  # str paths: this runs once per hit
    for rev in reversed((snap or index.Snapshot(tree)).revisions(name)):
        if os.path.exists(f"{complete}{rev}.json"):
            return rev
    return None


def _hit(tree: Tree, m: Manifest, current: bool, rec: enrich.Enrichment | None) -> Hit:
    name, rev = split_job_id(m.job_id)
    checks = {c.name: c.actual for c in m.validation.checks}
    media = m.validation.media
    measured = media is not None or (rec is not None and rec.facts is not None)
    duration = field_value(m, rec, "duration") if measured else checks.get("duration")
    w, h = (
        (field_value(m, rec, "width"), field_value(m, rec, "height"))
        if measured
        else (checks.get("width"), checks.get("height"))
    )
    duration, w, h = _num(duration), _num(w), _num(h)
    values = {}
    if rec is not None:
        for f in enrich.FIELDS:
            v = enrich.value(rec, f)
            if v is not enrich.UNJUDGED:
                values[f] = v
    return Hit(
        job=m.job_id,
        name=name,
        revision=rev,
        current=current,
        sha256=m.output.sha256,
        path=m.output.store_path,
        size=m.output.size,
        file=m.output.file,
        tags=m.tags,
        duration=duration,
        resolution=f"{w:g}x{h:g}" if w and h else None,
        thumbnail=_thumbnail(tree, m.output.sha256),
        media=media,
        enrichment=values,
    )


# The per-candidate reads of search use str paths and plain opens: at 100 hits,
# pathlib's object overhead was a quarter of a search's CPU time.
_MANIFEST = msgspec.json.Decoder(Manifest)
_ENRICHMENT = msgspec.json.Decoder(enrich.Enrichment)


def _manifest(tree: Tree, jid: str) -> Manifest | None:
    path = f"{tree.root}/manifests/{jid}.json"
    try:
        with open(path, "rb") as f:
            data = f.read()
        return _MANIFEST.decode(data)
    except FileNotFoundError:
        return None
    except (OSError, msgspec.DecodeError):
        return read(Path(path), Manifest)  # the careful reader: NAS retries, short reads


def _enrichment(tree: Tree, digest: str) -> enrich.Enrichment | None:
    if not _SHA.match(digest):  # a damaged manifest never steers a path
        return None
    try:
        with open(f"{tree.root}/{enrich.FOLDER}/{digest}.json", "rb") as f:
            return _ENRICHMENT.decode(f.read())
    except (OSError, msgspec.DecodeError):
        return None


def _thumbnail(tree: Tree, digest: str) -> str | None:
    if not _SHA.match(digest):
        return None
    rel = f"{thumbs.FOLDER}/{digest}.jpg"
    return rel if os.path.isfile(f"{tree.root}/{rel}") else None


def _num(x: Any) -> float | None:
    return float(x) if isinstance(x, int | float) and not isinstance(x, bool) else None


def _present(tree: Tree, m: Manifest) -> bool:
    """The store file is there with the manifest's size (cheap; get re-hashes)."""
    try:
        return os.stat(f"{tree.root}/{m.output.store_path}").st_size == m.output.size
    except OSError:
        return False


def search(
    tree: Tree,
    cfg: Config,
    query: Query,
    *,
    all_versions: bool = False,
    visibility: Iterable[str] = (),
    limit: int | None = None,
    rule: vis.Rule | None = None,
) -> Result:
    """Every asset version the query matches (current ones unless ``all_versions``),
    visible under ``rule`` (default: ``[library] visible`` widened by ``visibility``)."""
    required = cfg.acceptance.required_tags
    indexed = [(t, v) for t, v in query.tags.items() if t in required]
    if query.tags and not indexed:
        raise InvalidInput(
            next(iter(query.tags)), f"is not an indexed tag; search needs one of: {', '.join(required)}"
        )
    if rule is None:
        rule = vis.rule(cfg, visibility)
    snap = index.Snapshot(tree)  # the unmerged segments once, for every candidate
    candidates: Iterable[str]
    if indexed:
        candidates = sorted(_intersect(tree, indexed, snap), key=_order)
    else:  # every asset, lazily: a page asking for 60 reads about 60 names' versions
        candidates = (f"{n}@{r}" for n in snap.names() for r in snap.revisions(n))
    currents: dict[str, int | None] = {}
    hits: list[Hit] = []
    partial: dict[str, int] = {}
    for jid in candidates:
        if not JOB_ID_RE.match(jid):
            continue
        name, rev = split_job_id(jid)
        if name not in currents:
            currents[name] = current_revision(tree, name, snap)
        is_current = currents[name] == rev
        if not is_current and not (all_versions and tree.job_file("complete", jid).exists()):
            continue
        m = _manifest(tree, jid)
        if m is None or any(m.tags.get(t) != v for t, v in query.tags.items()):
            continue
        if not rule.admits(m.tags):
            continue  # fails closed: no visibility tag is not an allowed one
        if not _present(tree, m):
            continue  # never print a hit whose object is missing (fsck reports it)
        rec = _enrichment(tree, m.output.sha256)
        values = [field_value(m, rec, c.field) for c in query.comparisons]
        unjudged = [c.field for c, v in zip(query.comparisons, values, strict=True) if v is enrich.UNJUDGED]
        if unjudged:
            for f in unjudged:
                partial[f] = partial.get(f, 0) + 1
            continue
        if not all(c.test(v) for c, v in zip(query.comparisons, values, strict=True)):
            continue
        hits.append(_hit(tree, m, is_current, rec))
        if limit is not None and len(hits) >= limit:
            break
    return Result(results=hits, partial=partial)


def _intersect(tree: Tree, indexed: list[tuple[str, str]], snap: index.Snapshot) -> set[str]:
    """Names in every ``index/<tag>/<value>/`` asked for, and the jobs of the unmerged
    segments (``snap``, read first) that have every tag asked for.

    The smallest folder (by its size, a cheap proxy for its entry count) is
    listed; a folder at least four times larger is probed per name with a
    stat instead of being listed (measured: 1,000 stats cost about half of
    listing 10,000 names), a comparable one is listed and intersected.
    """
    recent = {x.job_id for x in snap.view.lines() if all(x.tags.get(t) == v for t, v in indexed)}
    return recent | _intersect_merged(tree, indexed)


def _intersect_merged(tree: Tree, indexed: list[tuple[str, str]]) -> set[str]:
    dirs = []
    for t, v in indexed:
        d = str(indexpaths.tag_dir(tree, t, v))
        try:
            dirs.append((os.stat(d).st_size, d))
        except (FileNotFoundError, NotADirectoryError):
            return set()  # a value nobody has
    dirs.sort()
    small_size, small = dirs[0]
    found = set(os.listdir(small))
    for size, d in dirs[1:]:
        if size >= 4 * small_size:
            found = {j for j in found if os.path.exists(f"{d}/{j}")}
        else:
            found &= set(os.listdir(d))
    return found


def _order(jid: str) -> tuple[str, int]:
    name, _, rev = jid.partition("@")
    return name, int(rev) if rev.isdigit() else 0


# -- versions --------------------------------------------------------------------


class Version(msgspec.Struct, kw_only=True):
    job: str
    revision: int
    state: str
    indexed: bool
    current: bool
    sha256: str | None = None


def _jobs_of_name(tree: Tree, name: str) -> set[int]:
    revs: set[int] = set()
    folders = [tree.pending, tree.held, tree.complete, tree.failed]
    folders += [tree.running_dir(w) for w in running_workers(tree)]
    for d in folders:
        for p in d.glob(f"{name}@*.json"):
            m = JOB_ID_RE.match(p.name[:-5])
            if m and m.group("name") == name:
                revs.add(int(m.group("rev")))
    return revs | set(index.revisions(tree, name))


def versions(tree: Tree, name: str, rule: vis.Rule | None = None) -> list[Version]:
    """Every revision of an asset with its state, only those visible under ``rule``
    when one is given; empty if the name is unknown (or nothing of it is visible)."""
    cur = current_revision(tree, name)
    out = []
    for rev in sorted(_jobs_of_name(tree, name)):
        jid = f"{name}@{rev}"
        if rule is not None and not admitted(tree, rule, jid):
            continue
        loc = locate(tree, jid)
        entry = index.read_version(tree, name, rev)
        out.append(
            Version(
                job=jid,
                revision=rev,
                state=loc.state if loc else "unknown",
                indexed=entry is not None,
                current=rev == cur,
                sha256=entry.sha256 if entry else None,
            )
        )
    return out


# -- visibility (spool.library.visibility: the one rule) ------------------------------------------


def job_tags(tree: Tree, jid: str) -> dict[str, str] | None:
    """A job's tags: from its manifest once published, else from its job file."""
    m = _manifest(tree, jid)
    if m is not None:
        return m.tags
    loc = locate(tree, jid)
    if loc is None:
        return None
    try:
        return kinds.decode_job(loc.path.read_bytes()).tags
    except (OSError, msgspec.DecodeError, msgspec.ValidationError):
        return None  # unreadable: fails closed


def admitted(tree: Tree, rule: vis.Rule, jid: str) -> bool:
    """Whether the job ``jid`` is visible under ``rule`` (an unknown job is not)."""
    return rule.admits(job_tags(tree, jid))


def visible_object(tree: Tree, rule: vis.Rule, digest: str) -> Manifest | None:
    """The manifest of a complete, indexed job that publishes the object ``digest`` and
    is visible under ``rule`` (the first by job ID), or ``None``: the object is then
    invisible to this reader, whether or not it exists."""
    if not _SHA.match(digest):
        return None
    for jid in sorted(index.object_jobs(tree, digest)):
        if not JOB_ID_RE.match(jid) or not os.path.exists(f"{tree.root}/complete/{jid}.json"):
            continue
        m = _manifest(tree, jid)
        if m is None or m.output.sha256 != digest or not rule.admits(m.tags):
            continue
        if index.is_indexed(tree, jid):
            return m
    return None


# -- get -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Got:
    job: str | None  # None when asked by sha256 with no manifest at hand
    sha256: str
    path: Path  # the verified store file
    file: str  # the name to give a copy


def _by_job(tree: Tree, jid: str) -> Got:
    loc = locate(tree, jid)
    if loc is None:
        raise NotFound(f"no job {jid}")
    if loc.state in ("pending", "held", "running"):
        raise NotReady(f"{jid} is not ready: it is {loc.state}")
    if loc.state == "failed":
        raise SpoolError(f"{jid} failed and has no output (spool show {jid})")
    if not index.is_indexed(tree, jid):
        raise NotReady(f"{jid} is not ready: complete but not yet indexed (spool fsck indexes it)")
    m = read(tree.manifest_file(jid), Manifest)
    if m is None:
        raise SpoolError(f"{jid} is complete but its manifest is unreadable (run spool fsck)")
    why = store.verify(tree, m)
    if why is not None:
        raise SpoolError(f"{jid}'s output does not verify: {why} (run spool fsck)")
    return Got(jid, m.output.sha256, tree.root / m.output.store_path, m.output.file)


def _by_sha(tree: Tree, digest: str, rule: vis.Rule | None = None) -> Got | None:
    if rule is not None:
        m = visible_object(tree, rule, digest)
        if m is None:
            return None
        path = tree.root / m.output.store_path
        if store.sha256_file(path)[0] != digest:
            raise SpoolError(f"store object {digest} does not hash to its name (run spool fsck)")
        return Got(m.job_id, digest, path, m.output.file)
    folder = tree.store / "sha256" / digest[:2]
    try:
        found = sorted(n for n in os.listdir(folder) if n.startswith(digest) and not n.startswith("."))
    except FileNotFoundError:
        return None
    if not found:
        return None
    path = folder / found[0]
    actual, _ = store.sha256_file(path)
    if actual != digest:
        raise SpoolError(f"store object {digest} does not hash to its name (run spool fsck)")
    return Got(None, digest, path, found[0])


def resolve(tree: Tree, ref: str, rule: vis.Rule | None = None) -> Got:
    """The verified file of a job (``name@rev``), of a name's current version, or of
    a sha256. Raises NotReady (exit 3), NotFound (exit 4), InvalidInput (exit 2).

    With a ``rule`` (:mod:`spool.library.visibility`), only what it admits is found: an
    invisible job, name or object is answered exactly as an unknown one."""
    if JOB_ID_RE.match(ref):
        if rule is not None and not admitted(tree, rule, ref):
            raise NotFound(f"no job {ref}")
        return _by_job(tree, ref)
    if _SHA.match(ref):
        got = _by_sha(tree, ref, rule)
        if got is not None:
            return got
    if NAME_RE.match(ref):
        cur = current_revision(tree, ref)
        if cur is not None and (rule is None or admitted(tree, rule, f"{ref}@{cur}")):
            return _by_job(tree, f"{ref}@{cur}")
        waiting = [
            v
            for v in versions(tree, ref, rule)
            if v.state in ("pending", "held", "running") or (v.state == "complete" and not v.indexed)
        ]
        if waiting:
            states = ", ".join(f"{v.job} {v.state}" for v in waiting)
            raise NotReady(f"{ref} is not ready: no published version yet ({states})")
        raise NotFound(f"no asset, job or object {ref}")
    raise InvalidInput(ref, "is not a job ID (name@revision), an asset name or a sha256")


def copy_to(got: Got, dest_dir: Path, *, link: bool = False) -> Path:
    """Put the file into ``dest_dir`` (hard link with ``link``, else a copy) and verify
    the sha256 of what was written. An existing different file is never replaced."""
    if not dest_dir.is_dir():
        raise InvalidInput("--to", f"{dest_dir} is not a folder")
    dest = dest_dir / got.file
    if dest.exists():
        if store.sha256_file(dest)[0] == got.sha256:
            return dest
        raise SpoolError(f"{dest} exists with other content; remove it or choose another --to")
    tmp = dest_dir / temp_name(got.file)
    try:
        if not link:
            copy_verified(got.path, tmp, got.sha256)  # hashed back from the disk
        elif (
            link_or_copy(got.path, tmp, got.sha256) == "link"  # the store's own inode: checked too
            and store.sha256_file(tmp)[0] != got.sha256
        ):
            raise SpoolError(f"the copy in {dest_dir} does not match sha256 {got.sha256}")
        try:
            link_no_replace(tmp, dest)
        except FileExistsError:
            raise SpoolError(f"{dest} appeared while copying; remove it or choose another --to") from None
    finally:
        try:
            os.unlink(tmp)
        except OSError:
            pass
    fsync_dir(dest_dir)
    return dest


# -- observability -------------------------------------------------------------------


def stats(tree: Tree) -> dict[str, Any]:
    """Cheap library figures for ``spool status``: :func:`spool.queue.status.library_counts`
    (which ``spool status`` calls without importing this module)."""
    return dict(library_counts(tree))


def families(worker: str, st: dict[str, Any]) -> list[Any]:
    """Metrics gauges: index size and enrichment backlog (from ``st``, :func:`stats`), and
    the stored -> indexed delay of this process's publishes (from memory)."""
    from statistics import median

    size = Family("spool_library_assets", "gauge", "Assets (names) with at least one indexed version.")
    size.add(st["assets"], worker=worker)
    backlog = Family(
        "spool_library_enrichment_backlog", "gauge", "Assets without an enrichment record (estimate)."
    )
    backlog.add(st["enrichment_backlog"], worker=worker)
    delay = Family(
        "spool_library_index_delay_seconds",
        "gauge",
        "Stored -> indexed delay of the jobs this worker published last (median and max of up to 100).",
    )
    recent = list(index.RECENT_DELAYS)
    delay.add(round(median(recent), 6) if recent else 0.0, worker=worker, stat="median")
    delay.add(round(max(recent), 6) if recent else 0.0, worker=worker, stat="max")
    return [size, backlog, delay]
