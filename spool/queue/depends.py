"""Dependencies: jobs whose sources are other jobs' published outputs (SPEC 11.12).

A source may name a job instead of a path:

* ``{"job": "mug-gen"}``: the newest revision of that name (a new revision made while
  the dependent waits is the one it waits for);
* ``{"job": "mug-gen@2"}``: exactly that revision;
* ``{"asset": "campaign=morning-mug,asset_type=master"}``: a library query that must
  name exactly one published asset at acceptance (its current version, pinned then).

Acceptance (:func:`plan`) names the upstream of each such source, and rejects an
unknown name and a cycle with the path of names; the job's kind keeps what it can
check without the upstream media (``Kind.waiting``). A job whose upstreams are all
published is frozen at once; otherwise it is accepted into ``waiting/``.

The reverse index ``deps/<ref>/<dependent job>`` (empty files, made durable before the
dependent's job file is) finds the dependents of a publish without reading job files:
``<ref>`` is a name (``deps/mug-gen/``: waits for its newest revision) or a pinned
revision (``deps/mug-gen@2/``). Entries stay: they are the downstream ``spool show``
draws. ``deps/_held/<job>.json`` says why a dependent is held; ``deps/_acked/<job>``
records that an operator released it knowing its pinned upstream was superseded.

:func:`settle` moves dependents, one batch per call (group commit: every file and
rename, then each folder fsynced once, then the journal lines):

* every upstream published: its kind freezes the job's submission again with each
  upstream source being that job's store object (its sha256 in the source manifest, in
  ``upstreams`` and so in ``recipe_hash``); the frozen file replaces the waiting one in
  ``waiting/`` and is renamed to ``pending/``: one transition. A source that is not an
  upstream must still hash as it did at acceptance;
* an upstream failed or was cancelled, is gone, or (a pinned revision) was superseded
  before it published, or its output cannot be used by the recipe: the hold record is
  written, then the job moves to ``held/``;
* a held dependent of a name whose newer revision has appeared goes back to ``waiting/``
  (and on, if that revision is published).

Crash table. Entries without a job file: an acceptance that never committed (its drop
is taken again). A frozen file still in ``waiting/`` (crash point
``after_resolve_write``): the next settle moves it as it is. A hold record without the
move (``after_hold_record``): the next settle decides again. The daemon settles on its
own journal's events and sweeps every :data:`SWEEP` seconds (another host's publish,
a recovery by the CLI); ``spool fsck`` reports and settles a job left waiting on a
published upstream.
"""

from __future__ import annotations

import logging
import os
import re
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import msgspec

from spool import kinds
from spool.core.config import Assets, Config
from spool.core.errors import InvalidInput
from spool.core.faults import crashpoint
from spool.core.model import JOB_ID_RE, Failure, HoldRecord, Manifest, Upstream, encode, now
from spool.core.sourceref import refs
from spool.disk import formats, groupcommit, kept
from spool.disk.records import read
from spool.disk.tree import (
    JOB_COPY,
    Tree,
    fsync_dir,
    link_or_copy,
    make_dirs,
    replace_existing,
    temp_name,
    transfer,
    write_atomic,
)
from spool.kinds import Job, decode_job
from spool.media import sources
from spool.queue.events import Journal, cli_writer
from spool.queue.status import last_failure, locate, running_workers

log = logging.getLogger("spool.queue.depends")

#: Seconds between a daemon's sweeps of ``deps/`` (a publish it did not journal itself).
SWEEP = 2.0
#: Hold records and release acknowledgements live beside the reverse index, under names
#: no job name can have (a job name starts with a letter or digit).
HELD, ACKED = "_held", "_acked"
#: A job name (the part of a job ID before ``@``).
NAME_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,95}$")

#: States a job waits through (its upstream will still publish or fail).
IN_FLIGHT = frozenset({"waiting", "pending", "held", "running"})


# -- what exists: one listing per state folder ----------------------------------------------


#: The end states, whose folders grow with the spool's history.
ENDED = ("complete", "failed")


class Snapshot:
    """Every job ID in a state folder, by name: which revisions exist and in which state.
    One listing of each state folder (names only); jobs a batch makes are added as it goes.

    ``sweep``: for the daemon's sweep every :data:`SWEEP` s while a job waits, which uses
    it only to find that every dependent still waits (:func:`settle` looks again afresh
    before it moves any): the end states' listings are kept while a stat shows their
    folder unchanged (:func:`spool.disk.kept.names`), and the live states, listed afresh, are read
    after them, so a job that left an end state (a failed upstream retried) is seen where
    it is now."""

    def __init__(self, tree: Tree, *, sweep: bool = False) -> None:
        self.tree = tree
        self.states: dict[str, str] = {}
        self.revs: dict[str, dict[int, str]] = {}
        live = [(s, tree.root / s) for s in ("waiting", "pending", "held")]
        ended = [(s, tree.root / s) for s in ENDED]
        folders = ended + live if sweep else live + ended
        folders += [("running", tree.running_dir(w)) for w in running_workers(tree)]
        for state, folder in folders:
            for n in kept.names(folder) if sweep and state in ENDED else kept.listdir(folder):
                if n.endswith(".json") and n[0] != ".":
                    self.add(n[:-5], state)

    def add(self, jid: str, state: str) -> None:
        name, _, rev = jid.rpartition("@")
        if not rev.isdigit():
            return
        self.states[jid] = state
        self.revs.setdefault(name, {})[int(rev)] = state

    def state(self, jid: str) -> str | None:
        return self.states.get(jid)

    def newest(self, name: str) -> str | None:
        revs = self.revs.get(name)
        return f"{name}@{max(revs)}" if revs else None


def target(ref: str, snap: Snapshot) -> str | None:
    """The job a ref waits for now: a pinned revision, or the newest revision of a name."""
    return ref if "@" in ref else snap.newest(ref)


def _ref_folder(up: Upstream) -> str:
    """What an upstream waits for (or was frozen to): its job, else the name's newest revision."""
    return up.job if up.job is not None else up.ref


def _entry_folder(up: Upstream) -> str:
    """The reverse index folder of an upstream: the ref as written (a name, or a pinned
    revision), or for a library query the job it named at acceptance."""
    return (up.job or "") if up.ref.startswith("asset:") else up.ref


# -- acceptance -----------------------------------------------------------------------------


def plan(
    tree: Tree,
    cfg: Config,
    sources: Mapping[str, object],
    own: str,
    snap: Snapshot,
    prefix: str = "",
) -> list[Upstream]:
    """The upstreams of a submission's job ``own``: each ref checked (a known job, a query
    naming one asset) and no cycle through ``own``. Raises :class:`InvalidInput`."""
    ups: list[Upstream] = []
    snap.add(own, "accepting")  # a ref to its own name is a cycle, not an unknown name
    try:
        return _plan(tree, cfg, sources, own, snap, prefix, ups)
    finally:
        _forget(snap, own)


def _plan(
    tree: Tree,
    cfg: Config,
    sources: Mapping[str, object],
    own: str,
    snap: Snapshot,
    prefix: str,
    ups: list[Upstream],
) -> list[Upstream]:
    for role, ref in sorted(refs(sources).items()):
        at = f"{prefix}sources.{role}"
        if (ref.job is None) == (ref.asset is None):
            raise InvalidInput(at, 'must give either "job" (a job name or ID) or "asset" (a library query)')
        if ref.job is not None:
            text = ref.job
            if not (JOB_ID_RE.match(text) or NAME_RE.match(text)):
                raise InvalidInput(f"{at}.job", f"{text!r} is not a job name or ID (name or name@revision)")
            if target(text, snap) is None:
                raise InvalidInput(f"{at}.job", f"names {text}, which is not a job in this spool")
            ups.append(Upstream(role=role, ref=text, job=text if "@" in text else None))
        else:
            assert ref.asset is not None
            ups.append(
                Upstream(role=role, ref=f"asset:{ref.asset}", job=_asset(tree, cfg, ref.asset, f"{at}.asset"))
            )
    for up in ups:
        path = _cycle(tree, snap, own, _ref_folder(up), [own])
        if path is not None:
            raise InvalidInput(f"{prefix}sources.{up.role}", f"makes a cycle: {' -> '.join(path)}")
    return ups


def _forget(snap: Snapshot, jid: str) -> None:
    if snap.states.get(jid) == "accepting":
        del snap.states[jid]
        name, _, rev = jid.rpartition("@")
        snap.revs.get(name, {}).pop(int(rev), None)
        if not snap.revs.get(name):
            snap.revs.pop(name, None)


def _asset(tree: Tree, cfg: Config, query: str, at: str) -> str:
    """The one published asset a library query names (its current version's job ID)."""
    # here: submit stays off the library unless a job depends on an asset (+~6 ms)
    from spool.library import catalog

    terms = [t.strip() for t in query.split(",") if t.strip()]
    if not terms:
        raise InvalidInput(at, "is an empty query; write tag=value pairs separated by commas")
    q = catalog.parse_terms(terms)
    hits = catalog.search(tree, cfg, q).results
    names = sorted({h.name for h in hits})
    if not names:
        raise InvalidInput(
            at,
            f"{query!r} matches no published asset; name the job instead "
            '({"job": NAME}) to wait for one not yet published',
        )
    if len(names) > 1:
        shown = ", ".join(names[:5]) + (", ..." if len(names) > 5 else "")
        raise InvalidInput(at, f"{query!r} matches {len(names)} assets ({shown}); narrow the query")
    return next(h.job for h in hits if h.name == names[0])


def _cycle(tree: Tree, snap: Snapshot, own: str, ref: str, path: list[str]) -> list[str] | None:
    """The path of names back to ``own`` through the upstreams of ``ref``'s target, if any."""
    seen: set[str] = set()

    def walk(ref: str, path: list[str]) -> list[str] | None:
        t = target(ref, snap)
        if t is None:
            return None
        if t == own:
            return [*path, t]
        if t in seen:
            return None
        seen.add(t)
        job = _load(tree, t, snap.state(t))
        for up in job.upstreams if job is not None else []:
            found = walk(up.job or _ref_folder(up), [*path, t])
            if found is not None:
                return found
        return None

    return walk(ref, path)


def _load(tree: Tree, jid: str, state: str | None) -> Job | None:

    if state is None or state == "accepting":
        return None
    if state == "running":
        loc = locate(tree, jid)
        path = loc.path if loc is not None else None
    else:
        path = tree.job_file(state, jid)
    if path is None:
        return None
    try:
        return decode_job(path.read_bytes())
    except (OSError, msgspec.DecodeError, msgspec.ValidationError):
        return None


def write_entries(tree: Tree, job: Job) -> None:
    """The reverse index entries of a dependent (durable before its job file is written;
    in an acceptance batch the folder fsyncs are the batch's)."""
    for up in job.upstreams:
        folder = tree.deps / _entry_folder(up)
        if not folder.is_dir():
            make_dirs(folder)
            kept.forget(tree.deps)  # this process's own change: list again
        entry = folder / job.job_id
        if not entry.exists():
            with open(entry, "xb"):
                pass
            fsync_dir(folder)


def dependents(tree: Tree, ref: str) -> list[str]:
    """Job IDs with an entry under ``deps/<ref>/`` (waiting, held or long frozen)."""
    try:
        return sorted(n for n in os.listdir(tree.deps / ref) if n[0] != ".")
    except (FileNotFoundError, NotADirectoryError):
        return []


def ref_folders(tree: Tree) -> list[str]:
    try:
        return sorted(n for n in os.listdir(tree.deps) if n[0] not in "._")
    except FileNotFoundError:
        return []


def _ref_folders_known(tree: Tree) -> list[str]:
    """:func:`ref_folders`, listed again only when ``deps/`` changed (:func:`spool.disk.kept.names`):
    a new ref folder changes the folder's times and (on most filesystems) its link count.
    The daemon asks at nearly every step, and at each sweep, and most answers are the same;
    a stat instead of a listing (on a NAS one round trip where a listing is six). What
    this can miss, another host's new ref folder behind a NAS client's attribute cache,
    is seen at the relisting (30 s on); this process's own new ref folders drop the kept
    listing (:func:`write_entries`)."""
    return sorted(n for n in kept.names(tree.deps) if n[0] not in "._")


# -- judging a dependent --------------------------------------------------------------------

Action = Literal["ready", "wait", "hold"]


@dataclass
class Verdict:
    """What a waiting dependent should do now, and why (which upstream, in which state)."""

    action: Action
    reason: str = ""
    upstream: str | None = None
    cause: str | None = None  # hold: failed, cancelled, superseded, missing, unusable
    targets: dict[str, str] = field(default_factory=dict)  # ready: role -> upstream job


def judge(tree: Tree, job: Job, snap: Snapshot) -> Verdict:
    """Pure but for reading a failed upstream's failure record and the release acknowledgement."""
    waits: list[str] = []
    targets: dict[str, str] = {}
    for up in job.upstreams:
        if up.sha256 is not None:
            targets[up.role] = up.job or ""
            continue
        t = target(up.job or up.ref, snap)
        if t is None:
            return Verdict("hold", f"upstream {up.ref} no longer exists in any state", up.ref, "missing")
        state = snap.state(t)
        if state == "complete":
            targets[up.role] = t
            continue
        if state is None:
            return Verdict("hold", f"upstream {t} is in no state (quarantined or removed)", t, "missing")
        if state == "failed":
            f = _failure(tree, t)
            cancelled = f is not None and f.stage == "cancel"
            how = "was cancelled" if cancelled else f"failed ({f.stage}: {f.message})" if f else "failed"
            return Verdict("hold", f"upstream {t} {how}", t, "cancelled" if cancelled else "failed")
        if up.job is not None and "@" in up.ref:
            newest = snap.newest(up.ref.rpartition("@")[0])
            if newest is not None and newest != t and not acked(tree, job.job_id):
                return Verdict(
                    "hold", f"upstream {t} ({state}) was superseded by {newest} before it published",
                    t, "superseded",
                )  # fmt: skip
        waits.append(f"{t} ({state})")
    if waits:
        return Verdict("wait", "waits for " + ", ".join(waits), waits[0].split(" ")[0])
    return Verdict("ready", targets=targets)


def _failure(tree: Tree, jid: str) -> Failure | None:
    return last_failure(tree, jid)


def acked(tree: Tree, jid: str) -> bool:
    return (tree.deps / ACKED / jid).exists()


def hold_record(tree: Tree, jid: str) -> HoldRecord | None:
    rec: HoldRecord | None = read(tree.deps / HELD / f"{jid}.json", HoldRecord)
    return rec


# -- freezing a dependent -------------------------------------------------------------------


class Unusable(Exception):
    """The upstream published, but the dependent cannot be frozen from it (one sentence)."""


def freeze(tree: Tree, cfg: Config, job: Job, targets: Mapping[str, str]) -> Job:
    """The waiting ``job`` frozen with each upstream source being its target's store object.

    Its kind freezes the kept submission again (``Kind.resolve``); the store is an asset
    root for this freeze only. Raises :class:`Unusable` when it cannot be done."""

    if job.request is None:
        raise Unusable("the waiting job kept no submission to freeze (written by another version?)")
    pins: list[Upstream] = []
    paths: dict[str, str] = {}
    for up in job.upstreams:
        t = targets[up.role]
        m = read(tree.manifest_file(t), Manifest)
        if m is None:
            raise Unusable(f"upstream {t} is complete but its manifest cannot be read (run spool fsck)")
        paths[up.role] = str(tree.root / m.output.store_path)
        pins.append(Upstream(role=up.role, ref=up.ref, job=t, sha256=m.output.sha256))
    raw = dict(job.request)
    raw["sources"] = {**raw.get("sources", {}), **paths}
    try:
        sub = kinds.parse_submission(raw)
        kind = kinds.of(job)
        roots = [*cfg.assets.roots, str(tree.store / "sha256")]
        with_store = msgspec.structs.replace(cfg, assets=Assets(roots=roots))
        frozen = kind.resolve(tree, with_store, job, sub, common(job))
    except InvalidInput as exc:
        raise Unusable(f"its recipe cannot use the upstream output: {exc}") from None
    before = {s.role: s.sha256 for s in job.sources}
    for s in frozen.sources:
        if s.role in before and s.sha256 != before[s.role]:
            raise Unusable(
                f"source {s.role} ({s.path}) changed since submission (sha256 now {s.sha256[:16]}...)"
            )
    got = {s.role: s.sha256 for s in frozen.sources}
    for p in pins:
        if got.get(p.role) != p.sha256:
            raise Unusable(f"the store object of {p.job} does not hash as its manifest says (run spool fsck)")
    frozen = msgspec.structs.replace(
        frozen,
        upstreams=pins,
        request=None,
        submission_sha256=job.submission_sha256,
        parent=job.parent,
        variant=job.variant,
    )
    frozen.recipe_hash = kind.spec_hash(frozen)
    return frozen


def common(job: Job) -> dict[str, Any]:
    """The fields every job has, as acceptance passed them to the kind."""
    return dict(
        job_id=job.job_id,
        name=job.name,
        revision=job.revision,
        supersedes=job.supersedes,
        tags=job.tags,
        priority=job.priority,
        submitted_at=job.submitted_at,
        submitted_by=job.submitted_by,
    )


# -- settling: one batch ----------------------------------------------------------------------


@dataclass
class Settled:
    """What one :func:`settle` did: job IDs by where they went."""

    pending: list[str] = field(default_factory=list)
    held: list[str] = field(default_factory=list)
    waiting: list[str] = field(default_factory=list)  # back from held/ (a newer upstream revision)

    def __bool__(self) -> bool:
        return bool(self.pending or self.held or self.waiting)


def affected(tree: Tree, names: Iterable[str]) -> set[str]:
    """Reverse index folders a change to jobs of ``names`` (job IDs or names) may concern."""
    out: set[str] = set()
    wanted = {n.rpartition("@")[0] if "@" in n else n for n in names}
    if not wanted:
        return out
    for ref in _ref_folders_known(tree):  # a name's folder, and its pinned revisions' (superseded)
        if ref.partition("@")[0] in wanted:
            out.add(ref)
    return out


def settle(
    tree: Tree,
    cfg: Config,
    journal: Journal,
    *,
    changed: Iterable[str] | None = None,
    jobs: Iterable[str] | None = None,
    by: str | None = None,
) -> Settled:
    """Move the dependents that can move now (module docstring), as one batch.

    ``changed``: job IDs (or names) whose state changed: only their dependents are
    looked at. ``jobs``: these dependents. Neither: a sweep, over every dependent in
    ``waiting/`` and ``held/`` by the refs its job file names (:func:`live_refs`), read only
    where the target is no longer in flight."""
    done = Settled()
    # The reverse index first when only some jobs changed: most changes concern no
    # dependent, and that answer is one listing (deps/), not two (waiting/, held/; on a
    # NAS each listing is a round trip, and the daemon settles after nearly every step).
    folders: set[str] | None = (
        set() if jobs is not None else affected(tree, changed) if changed is not None else None
    )
    if folders is not None and jobs is None and not folders:
        return done
    if folders is None and not _ref_folders_known(tree):
        return done  # a sweep where no job ever waited: a stat of deps/
    waiting = _listing(tree.waiting)
    held = _listing(tree.held)
    if not waiting and not held:
        return done
    candidates: list[str] = []
    # A sweep starts from the live dependents, not from deps/: its ref folders stay after
    # their dependents moved on (spool show draws them), so a listing of each grew with
    # the history (3,000 listings every 2 s with 3,000 past upstreams; over a NAS four
    # round trips each).
    live = live_refs(tree, waiting, held) if folders is None else None
    if jobs is not None:
        snap = Snapshot(tree)
        candidates = sorted(set(jobs))
    elif live is not None:
        # A sweep looks with the end states' listings kept (Snapshot's ``sweep``), which can
        # only tell it to wait; where some dependent may move, it looks again afresh.
        snap = Snapshot(tree, sweep=True)
        if _movable(live, waiting, held, snap, tree, sweep=True):
            snap = Snapshot(tree)
            candidates = _movable(live, waiting, held, snap, tree)
    else:
        snap = Snapshot(tree)
        entries = {ref: dependents(tree, ref) for ref in sorted(folders or ())}
        candidates = _movable(entries, waiting, held, snap, tree)
    moves: list[tuple[str, str, str, str]] = []  # (job, from, to, reason)
    # one probe and hash per file per batch: the upstream's object and the shared logo, music
    # of its dependents (a file changed in between has another key: its times, size or inode)
    with groupcommit.together(), sources.memoized():
        frozen: list[Job] = []
        for jid in dict.fromkeys(candidates):
            try:
                got = _settle_one(tree, cfg, jid, snap, jid in waiting, jid in held, moves, by)
            except OSError as exc:
                log.warning("%s: could not settle its dependencies now (%s)", jid, exc)
            else:
                if got is not None:
                    frozen.append(got)
        _commit_frozen(tree, frozen, snap, moves)
    for jid, src, dst, why in moves:
        journal.record(jid, dst, from_=src, reason=why)
        getattr(done, dst).append(jid)
    return done


#: (spool root, job ID) -> the reverse index folders its upstreams name: a job ID's
#: upstreams are fixed at acceptance (a freeze only adds their objects), so a sweep reads
#: each waiting or held job file once per process, not at every sweep.
_refs_of: dict[tuple[str, str], tuple[str, ...]] = {}


def live_refs(tree: Tree, waiting: set[str], held: set[str]) -> dict[str, list[str]]:
    """Ref folder -> the dependents in ``waiting`` or ``held`` whose upstreams name it: the
    reverse index's live entries, from the job files (what :func:`write_entries` wrote
    them from). A job file that cannot be read now (moved on meanwhile, or damaged: fsck's
    business) is left for the next sweep."""
    out: dict[str, list[str]] = {}
    root = os.fspath(tree.root)
    if len(_refs_of) > 100_000:
        _refs_of.clear()
    for jid in sorted(waiting | held):
        refs = _refs_of.get((root, jid))
        if refs is None:
            job = _load(tree, jid, "waiting" if jid in waiting else "held")
            if job is None:
                continue
            refs = tuple(dict.fromkeys(_entry_folder(up) for up in job.upstreams))
            _refs_of[(root, jid)] = refs
        for ref in refs:
            out.setdefault(ref, []).append(jid)
    return out


def _movable(
    entries_of: Mapping[str, list[str]],
    waiting: set[str],
    held: set[str],
    snap: Snapshot,
    tree: Tree,
    *,
    sweep: bool = False,
) -> list[str]:
    """The dependents (``entries_of``: ref folder -> its dependents) that may move now: a
    target no longer in flight, a pinned revision superseded, or a held dependent that may
    go back. ``sweep``: the sweep's first, cheap look, where a held
    dependent counts only if a newer revision than the one it was held on has appeared
    (:func:`_held_on`; else every held dependent made every sweep read its files again)."""
    out: list[str] = []
    for ref, entries in sorted(entries_of.items()):
        if not any(e in waiting or e in held for e in entries):
            continue
        t = target(ref, snap)
        state = snap.state(t) if t is not None else None
        pinned_superseded = "@" in ref and snap.newest(ref.rpartition("@")[0]) != ref
        if sweep:
            # A held dependent moves only back to waiting/ (_back_to_waiting), and only
            # once a newer revision is there; a waiting one only once its target is not.
            settled = state in IN_FLIGHT and not pinned_superseded
            if not any(e in held and _may_go_back(tree, e, ref, t) for e in entries) and (
                settled or not any(e in waiting for e in entries)
            ):
                continue
        elif state in IN_FLIGHT and not pinned_superseded and not any(e in held for e in entries):
            continue  # they still wait, and nothing in held/ could go back
        out += [e for e in entries if e in waiting or e in held]
    return out


#: (spool root, held job ID) -> (cause, upstream) of its hold record: see :func:`_held_on`.
_holds: dict[tuple[str, str], tuple[str, str]] = {}


def _may_go_back(tree: Tree, jid: str, ref: str, now_target: str | None) -> bool:
    """Whether :func:`_back_to_waiting` could move held ``jid`` (waiting on ``ref``, whose
    target is ``now_target``): held on a name's revision that failed, was cancelled or is
    gone, and a newer revision is there now. When in doubt (no record read), ``True``."""
    held_on = _held_on(tree, jid)
    if held_on is None:
        return True
    cause, upstream = held_on
    if cause not in ("failed", "cancelled", "missing") or "@" in ref:
        return False
    return now_target is not None and now_target != upstream


def _held_on(tree: Tree, jid: str) -> tuple[str, str] | None:
    """A held job's hold record's cause and upstream, read once a process: the record is
    written once when the job is held (a job held again has left ``held/`` between, and a
    stale answer names an older revision, which only makes the sweep look afresh)."""
    key = (os.fspath(tree.root), jid)
    got = _holds.get(key)
    if got is None:
        rec = hold_record(tree, jid)
        if rec is None:
            return None
        if len(_holds) > 100_000:
            _holds.clear()
        got = _holds[key] = (rec.cause, rec.upstream)
    return got


def _listing(folder: Path) -> set[str]:
    try:
        return {n[:-5] for n in os.listdir(folder) if n.endswith(".json") and n[0] != "."}
    except FileNotFoundError:
        return set()


def _settle_one(
    tree: Tree,
    cfg: Config,
    jid: str,
    snap: Snapshot,
    in_waiting: bool,
    in_held: bool,
    moves: list[tuple[str, str, str, str]],
    by: str | None,
) -> Job | None:
    """Moves ``jid`` if it must be held or sent back to waiting; returns it frozen if it is
    ready (:func:`_commit_frozen` writes it with the batch's others)."""
    if in_held:
        if not _back_to_waiting(tree, jid, snap, moves):
            return None
        in_waiting = True
    if not in_waiting:
        return None
    job = _load(tree, jid, "waiting")
    if job is None:
        return None  # moved on (another daemon), or damaged: fsck quarantines it
    if job.resolved and job.upstreams:  # frozen before a crash: only the move is left
        _to_pending(tree, job, moves, "frozen before a crash")
        snap.add(jid, "pending")
        return None
    v = judge(tree, job, snap)
    if v.action == "wait":
        return None
    if v.action == "ready":
        try:
            return freeze(tree, cfg, job, v.targets)  # written and moved with the batch's others
        except Unusable as exc:
            up = next(iter(v.targets.values()), None)
            v = Verdict("hold", str(exc), up, "unusable")
    _hold(tree, job, v, moves, by)
    snap.add(jid, "held")
    return None


def _commit_frozen(
    tree: Tree, frozen: list[Job], snap: Snapshot, moves: list[tuple[str, str, str, str]]
) -> None:
    """Each frozen dependent of a batch over its waiting file, then to ``pending/``.

    Every file's bytes are durable before its name is (as :func:`write_atomic` does), but
    all are written before any is fsynced: on a journaling filesystem the first fsync's
    commit carries the others' data, so a batch of 100 costs about one fsync, not 100.
    A frozen file takes the waiting one's place only if it is still there
    (:func:`spool.disk.tree.replace_existing`): another daemon settling the same job may have
    moved it on (and a worker claimed it) since it was read, and bringing it back under
    ``waiting/`` would put the job in two states and render it twice."""
    staged: list[tuple[Job, Path, bytes]] = []
    for job in frozen:
        path = tree.job_file("waiting", job.job_id)
        tmp = path.parent / temp_name(path.name)
        data = encode(job)
        try:
            with open(tmp, "xb") as f:
                f.write(data)
        except OSError as exc:
            _drop(tmp)
            log.warning("%s: could not write it frozen now (%s)", job.job_id, exc)
            continue
        staged.append((job, tmp, data))
    for job, tmp, data in staged:
        path = tree.job_file("waiting", job.job_id)
        try:
            fd = os.open(tmp, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            if not replace_existing(tmp, path):  # another settler moved it on meanwhile
                _drop(tmp)
                continue
            fsync_dir(path.parent)
            _refresh_copy(tree, job.job_id, path, data)
        except OSError as exc:
            _drop(tmp)
            log.warning("%s: could not write it frozen now (%s)", job.job_id, exc)
            continue
        crashpoint("after_resolve_write")
        pins = ", ".join(f"{u.job} sha256:{(u.sha256 or '')[:16]}" for u in job.upstreams)
        try:
            _to_pending(tree, job, moves, f"upstream published: {pins}")
        except OSError as exc:  # frozen in waiting/: the next settle moves it as it is
            log.warning("%s: could not move it to pending/ now (%s)", job.job_id, exc)
            continue
        snap.add(job.job_id, "pending")


def _refresh_copy(tree: Tree, jid: str, job_file: Path, data: bytes) -> None:
    """The frozen copy again, for a dependent whose job file was just rewritten frozen
    (its upstreams pinned): what fsck would restore is what runs, not what waited.
    Format 2 links the new file over the copy; format 1 writes a copy. Its folder is
    not fsynced here (as at acceptance: with the next durable record in it): a cut may
    bring back the copy that waited, which is what there was before; an fsync a dependent
    slowed a release (the depends bench's p50, 50 dependents an upstream: 175 / 190 ms
    without the copy, 195 / 198 ms with it fsynced, 159 / 189 ms as here)."""
    copy = tree.job_attempts(jid) / JOB_COPY
    if formats.writing(tree.root) < 2:
        write_atomic(copy, data, mode=0o444, folder_later=True)
        return
    tmp = copy.parent / temp_name(JOB_COPY)
    try:
        link_or_copy(job_file, tmp, mode=0o444, folder_later=True)
    except FileNotFoundError:
        return  # moved on meanwhile: whoever moved it owns it now
    os.replace(tmp, copy)


def _drop(tmp: Path) -> None:
    try:
        os.unlink(tmp)
    except FileNotFoundError:
        pass


def _to_pending(tree: Tree, job: Job, moves: list[tuple[str, str, str, str]], why: str) -> None:
    if transfer(tree.job_file("waiting", job.job_id), tree.job_file("pending", job.job_id)):
        moves.append((job.job_id, "waiting", "pending", why))


NEXT = {
    "failed": "Fix the upstream and spool retry it (or revise it), then spool release {job}",
    "cancelled": "Retry or revise the upstream, then spool release {job}; or spool cancel {job}",
    "superseded": "spool release {job} to wait for {upstream} anyway, or revise {job} to use the newer one",
    "missing": "Submit the upstream again, then revise {job}; or spool cancel {job}",
    "unusable": "Revise {job} (its recipe) or the upstream, then spool release {job}; or spool cancel {job}",
}


def _hold(tree: Tree, job: Job, v: Verdict, moves: list[tuple[str, str, str, str]], by: str | None) -> None:
    cause = v.cause or "failed"
    rec = HoldRecord(
        job_id=job.job_id,
        upstream=v.upstream or "",
        cause=cause,
        reason=v.reason,
        next_action=NEXT[cause].format(job=job.job_id, upstream=v.upstream),
        at=now(),
        by=by or "spool",
    )
    make_dirs(tree.deps / HELD)
    write_atomic(tree.deps / HELD / f"{job.job_id}.json", encode(rec))
    crashpoint("after_hold_record")
    if transfer(tree.job_file("waiting", job.job_id), tree.job_file("held", job.job_id)):
        moves.append((job.job_id, "waiting", "held", v.reason))


def _back_to_waiting(tree: Tree, jid: str, snap: Snapshot, moves: list[tuple[str, str, str, str]]) -> bool:
    """A dependent held because its upstream failed, was cancelled or is gone goes back to
    ``waiting/`` when a newer revision of that name has appeared (a name ref waits for it)."""
    rec = hold_record(tree, jid)
    if rec is None or rec.cause not in ("failed", "cancelled", "missing"):
        return False
    job = _load(tree, jid, "held")
    if job is None:
        return False
    name = rec.upstream.rpartition("@")[0]
    up = next((u for u in job.upstreams if u.sha256 is None and u.job is None and u.ref == name), None)
    t = target(up.ref, snap) if up is not None else None
    if t is None or t == rec.upstream:
        return False
    if not transfer(tree.job_file("held", jid), tree.job_file("waiting", jid)):
        return False
    clear_hold(tree, jid)
    moves.append((jid, "held", "waiting", f"upstream {rec.upstream} has a newer revision {t}: waits for it"))
    snap.add(jid, "waiting")
    return True


def clear_hold(tree: Tree, jid: str) -> None:
    try:
        os.unlink(tree.deps / HELD / f"{jid}.json")
    except FileNotFoundError:
        pass


def acknowledge(tree: Tree, jid: str) -> None:
    """An operator released ``jid`` knowing its pinned upstream was superseded: it waits anyway."""
    make_dirs(tree.deps / ACKED)
    try:
        with open(tree.deps / ACKED / jid, "xb"):
            pass
        fsync_dir(tree.deps / ACKED)
    except FileExistsError:
        pass


# -- what show draws ---------------------------------------------------------------------------


def upstream_rows(tree: Tree, job: Job) -> list[dict[str, Any]]:
    """Each upstream of a job: its ref, the job it resolved (or waits for), state, sha256."""
    if not job.upstreams:
        return []
    snap = Snapshot(tree)
    rows = []
    for up in job.upstreams:
        t = up.job if up.sha256 is not None else target(up.job or up.ref, snap)
        rows.append(
            {
                "role": up.role,
                "ref": up.ref,
                "job": t,
                "state": snap.state(t) if t else None,
                "sha256": up.sha256,
            }
        )
    return rows


def downstream_rows(tree: Tree, jid: str) -> list[dict[str, Any]]:
    """The jobs that take a source from ``jid`` (frozen to it) or wait for it."""
    name = jid.rpartition("@")[0]
    snap: Snapshot | None = None
    rows = []
    for ref in (name, jid):
        for dep in dependents(tree, ref):
            snap = snap or Snapshot(tree)
            state = snap.state(dep)
            job = _load(tree, dep, state)
            if job is None:
                continue
            for up in job.upstreams:
                if _entry_folder(up) != ref:
                    continue
                frozen_to = up.job if up.sha256 is not None else None
                waits_for = target(up.job or up.ref, snap) if up.sha256 is None else None
                if jid in (frozen_to, waits_for):
                    rows.append(
                        {"job": dep, "role": up.role, "state": state, "frozen": frozen_to is not None}
                    )
    return sorted(rows, key=lambda r: r["job"])


def iter_waiting(tree: Tree) -> Iterator[str]:
    yield from sorted(_listing(tree.waiting))


def sweep_due(last: float, now_: float | None = None) -> bool:
    return (now_ if now_ is not None else time.monotonic()) - last >= SWEEP


# -- fsck ------------------------------------------------------------------------------------


@dataclass
class Finding:
    """One break of SPEC 11.12 ``spool fsck`` found, and the repair done (or that would be)."""

    path: str
    problem: str
    repair: str | None = None
    repaired: bool = False


def check(tree: Tree, cfg: Config, *, repair: bool) -> list[Finding]:
    """Every dependent against invariant 12: a frozen one names its upstream's published
    object in its source manifest, upstreams and (complete) manifest; none is left in a
    queue state unfrozen; none waits on a published or failed upstream (repair: settle it);
    a waiting or held one is in the reverse index (repair: write the entry)."""
    out: list[Finding] = []
    seen: set[str] = set()
    for ref in ref_folders(tree):
        seen |= set(dependents(tree, ref))
    seen |= _listing(tree.waiting)
    snap = Snapshot(tree)
    stuck: list[str] = []
    for jid in sorted(seen):
        state = snap.state(jid)
        job = _load(tree, jid, state)
        if job is None or not job.upstreams:
            continue
        where = f"{state}/{jid}.json" if state != "running" else f"running/{jid}.json"
        if state in ("waiting", "held"):
            for up in job.upstreams:
                if up.sha256 is None and not (tree.deps / _entry_folder(up) / jid).exists():
                    f = Finding(
                        where, f"is not in the reverse index deps/{_entry_folder(up)}/", "write the entry"
                    )
                    if repair:
                        write_entries(tree, job)
                        f.repaired = True
                    out.append(f)
            if state == "waiting" and (job.resolved or judge(tree, job, snap).action != "wait"):
                stuck.append(jid)
            continue
        if not job.resolved:
            out.append(
                Finding(where, "is in a queue state but its sources from other jobs were never frozen")
            )
            continue
        out += [Finding(where, why) for why in _pins_broken(tree, job, state)]
    if stuck:
        late = [
            Finding(f"waiting/{j}.json", "waits although its upstreams published or failed", "settle it")
            for j in stuck
        ]
        if repair:
            done = settle(tree, cfg, Journal(tree, cli_writer()), jobs=stuck, by="fsck")
            for x in late:
                jid = x.path[len("waiting/") : -len(".json")]
                x.repaired = jid in done.pending or jid in done.held
        out += late
    return out


def _pins_broken(tree: Tree, job: Job, state: str | None) -> list[str]:
    """Why a frozen dependent does not render (or did not render) its upstreams' exact bytes."""
    out = []
    src = {s.role: s.sha256 for s in job.sources}
    for up in job.upstreams:
        m = read(tree.manifest_file(up.job or ""), Manifest)
        if m is None or m.output.sha256 != up.sha256:
            out.append(
                f"source {up.role} is pinned to {up.job} sha256 {str(up.sha256)[:16]}..., "
                "not what that job published"
            )
        if src.get(up.role) != up.sha256:
            out.append(f"source {up.role}'s sha256 in the source manifest is not its upstream's {up.job}")
    if state == "complete":
        mine = read(tree.manifest_file(job.job_id), Manifest)
        used = {s.role: s.sha256 for s in mine.sources} if mine is not None else {}
        for up in job.upstreams:
            if mine is not None and used.get(up.role) != up.sha256:
                out.append(
                    f"was published from {up.role} sha256 {str(used.get(up.role))[:16]}..., not {up.job}'s"
                )
    return out
