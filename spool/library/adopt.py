"""Adopting an existing media library without re-rendering (``spool library adopt``).

Every media file of a folder becomes a version of an asset, published by the
one publish path exactly as a render is: an ``adopt`` job
(:mod:`spool.kinds.adopt`) is accepted (probed and hashed), claimed by this
process under the worker identity ``<host>-adopt``, its file linked (or
copied) into the store, its manifest written and its tags indexed inside the
publish boundary, and the job moved to ``complete/``.

Tags come from a CSV (``--tags FILE``: a ``path`` column relative to the
folder, an optional ``name`` column, one column per tag; cells are trimmed)
or from a sidecar ``<file>.tags.json`` (an object of tag -> value, optionally
``"name"``), the CSV winning. A file without every required tag is listed
with what it lacks and not adopted.

**Names.** A file's asset name is its path below the folder without the
extension, each folder and the file name lower-cased with every run of other
characters than ``a-z 0-9 . _`` made one ``-``, joined by ``--``
(``Summer/Spot 01.MP4`` -> ``summer--spot-01``). When that changed anything,
or is longer than 96 characters, 8 hex digits of the path's sha256 are
appended (``summer--spot-01-3fa2c1d0``), so two files never share a name.
``name`` in the CSV or sidecar overrides it.

**Once only.** A file whose name's current version already has its sha256 is
skipped; a changed file becomes the name's next revision; a job of this name
and content left pending or running by an interrupted run is finished, not
made again (the submission bytes are deterministic, so even an acceptance cut
short is recognised). A second run adopts nothing; a run killed at any point
(crash point ``mid_adopt``, between acceptance and claim, or any of the
publish path's) and run again leaves the same library as a run never killed.

**Files** taken: ``.mp4``, ``.m4v``, ``.mov``, ``.webm`` (other media
extensions are reported as unsupported; hidden files and folders, and
sidecars, are skipped). The folder must be inside ``[assets] roots``.
"""

from __future__ import annotations

import csv
import hashlib
import json
import os
import re
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from spool.core.config import Config
from spool.core.errors import InvalidInput, SpoolError
from spool.core.faults import crashpoint
from spool.core.model import JOB_ID_RE, Failure, Manifest
from spool.disk import groupcommit
from spool.disk.records import read
from spool.disk.store import sha256_file
from spool.disk.tree import Tree, visible_names
from spool.kinds.adopt import CONTAINERS, ROLE, AdoptJob, output_name
from spool.library.catalog import current_revision
from spool.library.index import NAME_RE, read_version
from spool.library.visibility import nfc
from spool.queue import accept, claim, execute, retry
from spool.queue.context import Context
from spool.queue.events import Journal
from spool.queue.status import running_workers
from spool.queue.workers import Heartbeat, Identity, IdentityTaken, worker_id
from spool.repair import recover
from spool.repair.fsck import sweep_leftovers

#: The worker name adoption runs under (``<host>-adopt``).
WORKER_NAME = "adopt"
#: Media extensions spool does not publish: reported, never silently ignored.
UNSUPPORTED = frozenset({".mkv", ".mxf", ".avi", ".mts", ".m2ts", ".ts", ".mpg", ".mpeg", ".wmv", ".flv"})
SIDECAR = ".tags.json"
_SLUG = re.compile(r"[^a-z0-9._]+")


# -- what the folder holds ---------------------------------------------------------------


@dataclass(frozen=True)
class Found:
    """One file of the folder adoption takes."""

    path: Path
    rel: str  # below the folder, with /
    size: int


def scan(root: Path) -> tuple[list[Found], list[str]]:
    """Media files below ``root`` (sorted by path), and those in containers spool
    does not publish. Hidden files and folders are skipped; symbolic links are not followed."""
    found: list[Found] = []
    unsupported: list[str] = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in sorted(files):
            if name.startswith(".") or name.endswith(SIDECAR):
                continue
            path = Path(folder) / name
            rel = path.relative_to(root).as_posix()
            ext = path.suffix.lower()
            if ext in UNSUPPORTED:
                unsupported.append(rel)
            elif ext in CONTAINERS:
                try:
                    st = path.lstat()
                except OSError:
                    continue
                if st.st_mode & 0o170000 == 0o100000:  # a regular file, not a link
                    found.append(Found(path, rel, st.st_size))
    found.sort(key=lambda f: f.rel)
    return found, sorted(unsupported)


def asset_name(rel: str) -> str:
    """The asset name of a file below the folder (see the module docstring)."""
    parts = rel.split("/")
    stem, dot, _ext = parts[-1].rpartition(".")
    parts[-1] = stem if dot else parts[-1]
    slugs = [_SLUG.sub("-", p.lower()).strip("-.") for p in parts]
    slugs = [re.sub(r"-{2,}", "-", s) for s in slugs]
    name = "--".join(s for s in slugs if s) or "asset"
    exact = all(s == p for s, p in zip(slugs, parts, strict=True)) and len(name) <= 96
    if exact and NAME_RE.match(name):
        return name
    tail = hashlib.sha256(rel.encode("utf-8")).hexdigest()[:8]
    head = name[:87].rstrip("-.") or "asset"
    return f"{head}-{tail}" if NAME_RE.match(f"{head}-{tail}") else f"asset-{tail}"


def read_tags_csv(csv_path: Path, root: Path) -> dict[str, dict[str, str]]:
    """``--tags FILE``: path (relative to ``root``) -> its row (tags, and ``name`` if given)."""
    try:
        text = csv_path.read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidInput("--tags", f"{csv_path} cannot be read ({exc})") from None
    reader = csv.DictReader(text.splitlines())
    if reader.fieldnames is None or "path" not in reader.fieldnames:
        raise InvalidInput("--tags", f"{csv_path} has no 'path' column (path,name,campaign,locale,...)")
    rows: dict[str, dict[str, str]] = {}
    for n, row in enumerate(reader, start=2):
        raw = (row.get("path") or "").strip()
        if not raw:
            continue
        p = Path(raw)
        rel = p.relative_to(root).as_posix() if p.is_absolute() and p.is_relative_to(root) else p.as_posix()
        if rel in rows:
            raise InvalidInput("--tags", f"{csv_path} line {n}: {rel} is listed twice")
        rows[rel] = {
            k.strip(): v.strip()
            for k, v in row.items()
            if k is not None and k.strip() and k != "path" and isinstance(v, str) and v.strip()
        }
    return rows


def read_sidecar(path: Path) -> dict[str, str] | None:
    """``<file>.tags.json`` as a row, ``None`` if there is none; a broken one raises."""
    side = path.with_name(path.name + SIDECAR)
    try:
        data = side.read_bytes()
    except FileNotFoundError:
        return None
    try:
        value = json.loads(data)
    except ValueError:
        raise InvalidInput(side.name, "is not valid JSON") from None
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise InvalidInput(side.name, 'must be a JSON object of strings ({"campaign": "...", ...})')
    return {str(k): v for k, v in value.items()}


# -- what each file becomes -----------------------------------------------------------------


@dataclass
class Item:
    """What adoption did (or, with ``dry_run``, would do) with one file."""

    path: str  # below the folder
    name: str
    outcome: str  # adopted, already, resumed, planned, untagged, invalid, failed, busy
    job: str | None = None
    sha256: str | None = None
    missing: list[str] = field(default_factory=list)
    reason: str = ""
    bytes: int = 0


#: Outcomes that leave a file adopted (or, in a dry run, about to be).
DONE = frozenset({"adopted", "already", "resumed", "planned"})


@dataclass
class Report:
    items: list[Item]
    unsupported: list[str]
    dry_run: bool
    seconds: float = 0.0

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for it in self.items:
            out[it.outcome] = out.get(it.outcome, 0) + 1
        if self.unsupported:
            out["unsupported"] = len(self.unsupported)
        return out

    @property
    def complete(self) -> bool:
        """Every file adopted (or already), none left out."""
        return not self.unsupported and all(it.outcome in DONE for it in self.items)


#: Called after each file: (files done, files, bytes done, bytes).
Progress = Callable[[int, int, int, int], None]


@dataclass
class _Known:
    """The jobs of one name on disk when a file is planned."""

    states: dict[int, str]  # revision -> state ("reserved": a reservation with no job)


def _name_states(tree: Tree) -> dict[str, dict[int, str]]:
    """name -> {revision: state} of every job and reservation, from listings only."""
    out: dict[str, dict[int, str]] = {}

    def note(jid: str, state: str) -> None:
        m = JOB_ID_RE.match(jid)
        if m:
            out.setdefault(m.group("name"), {})[int(m.group("rev"))] = state

    for n in visible_names(tree.attempts):
        note(n, "reserved")
    for state in ("pending", "held", "failed", "complete"):
        for n in visible_names(tree.root / state, ".json"):
            note(n[:-5], state)
    for w in running_workers(tree):
        for n in visible_names(tree.running_dir(w), ".json"):
            note(n[:-5], f"running:{w}")
    return out


class Adoption:
    """One run of ``spool library adopt`` over a folder."""

    def __init__(
        self,
        tree: Tree,
        cfg: Config,
        root: Path,
        rows: dict[str, dict[str, str]] | None = None,
        *,
        dry_run: bool = False,
        jobs: int = 4,
        user: str = "adopt",
        progress: Progress | None = None,
    ) -> None:
        self.tree, self.cfg, self.dry_run, self.user = tree, cfg, dry_run, user
        self.root = inside_roots(root, cfg.asset_roots(tree.root))
        self.rows = rows or {}
        self.jobs = max(1, jobs)
        self.progress = progress

        self.worker = worker_id(WORKER_NAME)
        self._lock = threading.Lock()
        self._states: dict[str, dict[int, str]] = {}

    # -- the run -------------------------------------------------------------------------

    def run(self) -> Report:
        started = time.monotonic()
        found, unsupported = scan(self.root)
        items: list[Item | None] = [None] * len(found)
        planned = self._tagged(found, items)
        if self.dry_run:
            self._states = _name_states(self.tree)
            for i, f, name, tags in planned:
                items[i] = self._decide(f, name, tags)
            return Report([it for it in items if it], unsupported, True, time.monotonic() - started)

        identity = Identity(self.tree, self.worker)
        try:
            identity.acquire()
        except IdentityTaken:
            raise SpoolError(
                f"another spool library adopt is running on this host ({self.worker}); wait for it"
            ) from None

        before = groupcommit.installed()  # threads share folder fsyncs, as a daemon's slots do
        groupcommit.install(before or groupcommit.Coalescer())
        beat = Heartbeat(self.tree, self.worker, self.jobs, 0)
        beat.beat(state="running")
        self.ctx = Context(
            self.tree, self.cfg, self.worker, Journal(self.tree, self.worker), threading.Event()
        )
        try:
            sweep_leftovers(self.tree)  # temp files a killed run (a dead process of this host) left
            recover.adopt(self.ctx)  # finish what an interrupted run left in running/<host>-adopt/
            self._states = _name_states(self.tree)
            total = sum(f.size for f in found)
            done = [
                sum(1 for it in items if it),
                sum(f.size for f, it in zip(found, items, strict=True) if it),
            ]
            last = [time.monotonic()]

            def one(job: tuple[int, Found, str, dict[str, str]]) -> None:
                i, f, name, tags = job
                try:
                    items[i] = self._adopt(f, name, tags)
                except SpoolError as exc:
                    items[i] = Item(f.rel, name, "invalid", reason=str(exc))
                except OSError as exc:
                    items[i] = Item(f.rel, name, "failed", reason=f"{exc.strerror or exc}")
                with self._lock:
                    done[0] += 1
                    done[1] += f.size
                    if time.monotonic() - last[0] >= 1.0:
                        last[0] = time.monotonic()
                        beat.beat(state="running")  # the process lives: no one takes its jobs
                    if self.progress:
                        self.progress(done[0], len(found), done[1], total)

            if self.progress:
                self.progress(done[0], len(found), done[1], total)
            with ThreadPoolExecutor(self.jobs, thread_name_prefix="adopt") as pool:
                list(pool.map(one, planned))
        finally:
            beat.beat(state="stopped")
            self.tree.tidy_running(self.worker)  # kept while an interrupted run's jobs are in it
            identity.release()
            groupcommit.install(before)
        return Report([it for it in items if it], unsupported, False, time.monotonic() - started)

    def _tagged(
        self, found: list[Found], items: list[Item | None]
    ) -> list[tuple[int, Found, str, dict[str, str]]]:
        """Tags and name of each file; the untagged and invalid are settled here."""
        required = self.cfg.acceptance.required_tags
        out = []
        names: dict[str, str] = {}
        for i, f in enumerate(found):
            try:
                row = self.rows.get(f.rel)
                if row is None:
                    row = read_sidecar(f.path)
                row = dict(row or {})
                name = row.pop("name", "") or asset_name(f.rel)
                if not NAME_RE.match(name):
                    raise InvalidInput("name", f"{name!r} is not an asset name (a-z 0-9 . _ -, at most 96)")
                missing = [t for t in required if not row.get(t, "").strip()]
                if missing:
                    items[i] = Item(
                        f.rel, name, "untagged", missing=missing, reason="missing " + ", ".join(missing)
                    )
                    continue
                tags = accept.check_tags(row, required)
                if name in names:
                    raise InvalidInput("name", f"{name} is also the name of {names[name]}")
                names[name] = f.rel
            except InvalidInput as exc:
                items[i] = Item(f.rel, asset_name(f.rel), "invalid", reason=str(exc))
                continue
            out.append((i, f, name, tags))
        return out

    # -- one file ------------------------------------------------------------------------------

    def _decide(self, f: Found, name: str, tags: dict[str, str]) -> Item:
        """What to do with one file, judged against the jobs of its name on disk:
        ``already`` / ``busy`` / ``failed`` (nothing to do), ``resumed`` (a job of this
        content waits: its ID), or ``planned`` (a new revision: its ID)."""
        states = dict(self._states.get(name, {}))
        digest: str | None = None
        if states:
            digest = sha256_file(f.path)[0]  # only a name with history needs the hash now
            cur = _current(self.tree, name, states)
            if cur is not None:
                entry = read_version(self.tree, name, cur)
                if entry is not None and entry.sha256 == digest:
                    why = _tags_differ(self.tree, f"{name}@{cur}", tags, self.cfg.acceptance.required_tags)
                    return Item(
                        f.rel, name, "already", job=f"{name}@{cur}", sha256=digest, reason=why, bytes=f.size
                    )
            for rev in sorted(states, reverse=True):
                state = states[rev]
                if state in ("complete", "reserved"):
                    continue
                jid = f"{name}@{rev}"
                if _source_sha(self.tree, jid, state, self.worker) != digest:
                    continue
                if state == "pending":
                    return Item(f.rel, name, "resumed", job=jid, sha256=digest, bytes=f.size)
                if state == "failed":
                    why = _failure(self.tree, jid)
                    return Item(f.rel, name, "failed", job=jid, sha256=digest, reason=why, bytes=f.size)
                return Item(
                    f.rel, name, "busy", job=jid, sha256=digest, reason=f"it is {state}", bytes=f.size
                )
        rev = _next_revision(self.tree, name, states)
        return Item(f.rel, name, "planned", job=f"{name}@{rev}", sha256=digest, bytes=f.size)

    def _adopt(self, f: Found, name: str, tags: dict[str, str]) -> Item:
        item = self._decide(f, name, tags)
        if item.outcome not in ("planned", "resumed"):
            return item
        assert item.job is not None
        jid = item.job
        if item.outcome == "planned":
            rev = int(jid.rpartition("@")[2])
            data = submission(name, rev, f, tags)
            try:
                accept.accept_bytes(self.tree, self.cfg, data, self.user)
            except InvalidInput as exc:
                if "already exists" not in str(exc):
                    return Item(f.rel, name, "invalid", job=None, reason=str(exc), bytes=f.size)
                with self._lock:  # another adopter took this revision meanwhile: look again, once
                    self._states[name] = _name_states_of(self.tree, name)
                return self._adopt_once_more(f, name, tags)
            crashpoint("mid_adopt")  # accepted, not claimed: the next run finds it pending
        else:
            # An earlier run's acceptance may have died before the job's frozen copy (another
            # of its threads hit a crash point, or a kill): make it before taking the job on.
            accept.restore_copy(self.tree, jid)
        if not claim.claim(self.tree, self.worker, jid):
            return Item(f.rel, name, "busy", job=jid, reason="another process claimed it", bytes=f.size)
        outcome = self._execute(jid)
        if outcome == "complete":
            m = read_version(self.tree, name, int(jid.rpartition("@")[2]))
            word = "adopted" if item.outcome == "planned" else "resumed"
            return Item(f.rel, name, word, job=jid, sha256=m.sha256 if m else item.sha256, bytes=f.size)
        return Item(f.rel, name, "failed", job=jid, reason=_failure(self.tree, jid) or outcome, bytes=f.size)

    def _adopt_once_more(self, f: Found, name: str, tags: dict[str, str]) -> Item:
        """The revision planned was taken (another adopter, or a reservation holding
        another submission): judge again; a new version goes one past every revision."""
        item = self._decide(f, name, tags)
        if item.outcome == "resumed":
            return self._adopt(f, name, tags)
        if item.outcome != "planned":
            return item
        with self._lock:
            rev = max(self._states.get(name, {0: ""})) + 1
            self._states.setdefault(name, {})[rev] = "reserved"
        jid = f"{name}@{rev}"
        try:
            accept.accept_bytes(self.tree, self.cfg, submission(name, rev, f, tags), self.user)
        except InvalidInput as exc:
            return Item(f.rel, name, "busy" if "already exists" in str(exc) else "invalid", reason=str(exc))
        if not claim.claim(self.tree, self.worker, jid):
            return Item(f.rel, name, "busy", job=jid, reason="another process claimed it", bytes=f.size)
        outcome = self._execute(jid)
        if outcome == "complete":
            return Item(f.rel, name, "adopted", job=jid, sha256=item.sha256, bytes=f.size)
        return Item(f.rel, name, "failed", job=jid, reason=_failure(self.tree, jid) or outcome, bytes=f.size)

    def _execute(self, jid: str) -> str:
        """Run a claimed adopt job; a retryable failure (a probe or decode check cut short
        on a loaded host) is run again after its backoff, as a daemon would, until it
        publishes, fails for good or the retry policy gives up: the command finishes what
        it can instead of leaving the job pending for the next run. A job still in its
        backoff (``early``: given back untouched, such as one a killed run left and this
        run's recovery returned with a delay) is run once its backoff is over, the same way."""
        outcome = execute.execute(self.ctx, jid)
        while outcome in ("retry", "early") and not self.ctx.stop.is_set():
            at = retry.not_before(self.tree, jid)
            if at is not None and self.ctx.stop.wait(max(0.0, at - time.time())):
                break
            if not claim.claim(self.tree, self.worker, jid):
                return "busy"
            outcome = execute.execute(self.ctx, jid)
        return outcome


def submission(name: str, rev: int, f: Found, tags: dict[str, str]) -> bytes:
    """The adopt job's submission: the same bytes for the same file, name and revision on
    every run (no time, no user), so an acceptance cut short is recognised."""
    sub: dict[str, Any] = {
        "name": name,
        "revision": rev,
        "operation": "adopt",
        "sources": {ROLE: str(f.path)},
        "output": {"file": output_name(f.path.name)},
        "tags": tags,
    }
    return json.dumps(sub, sort_keys=True, ensure_ascii=False).encode("utf-8")


def inside_roots(root: Path, roots: list[Path]) -> Path:
    try:
        real = root.resolve(strict=True)
    except OSError as exc:
        raise InvalidInput("DIR", f"{root} cannot be read ({exc.strerror})") from None
    if not real.is_dir():
        raise InvalidInput("DIR", f"{root} is not a folder")
    if not any(real == r or r in real.parents for r in roots):
        raise InvalidInput(
            "DIR", f"{root} is outside [assets] roots; add it (or a folder above it) to spool.toml"
        )
    return real


def _name_states_of(tree: Tree, name: str) -> dict[int, str]:
    return _name_states(tree).get(name, {})


def _current(tree: Tree, name: str, states: dict[int, str]) -> int | None:
    """The name's current version: the highest complete revision that is indexed."""
    for rev in sorted((r for r, s in states.items() if s == "complete"), reverse=True):
        if read_version(tree, name, rev) is not None:
            return rev
    return None


def _source_sha(tree: Tree, jid: str, state: str, worker: str) -> str | None:
    folder = tree.running_dir(state.partition(":")[2]) if state.startswith("running:") else tree.root / state
    job = read(folder / f"{jid}.json", AdoptJob) if state != "reserved" else None
    if job is None or not job.sources:
        return None
    return job.sources[0].sha256


def _next_revision(tree: Tree, name: str, states: dict[int, str]) -> int:
    """The revision a new version of ``name`` gets: one past the highest that holds a job;
    a reservation above it (an acceptance cut short) is taken up again."""
    taken = [r for r, s in states.items() if s != "reserved"]
    return (max(taken) if taken else 0) + 1


def _tags_differ(tree: Tree, jid: str, tags: dict[str, str], required: list[str]) -> str:
    """Why an adopted version's required tags are not the ones given now ("" if they are):
    the same bytes under the same name are one version, never adopted twice."""
    m = read(tree.manifest_file(jid), Manifest)
    if m is None:
        return ""
    diff = [
        f"{t} is {m.tags.get(t)!r}, given {tags.get(t)!r}" for t in required if m.tags.get(t) != tags.get(t)
    ]
    return ("published with other tags: " + "; ".join(diff)) if diff else ""


def _failure(tree: Tree, jid: str) -> str:
    nums = tree.attempt_numbers(jid)
    if not nums:
        return ""
    f = read(tree.attempt_dir(jid, nums[-1]) / "failure.json", Failure)
    return f"{f.property}: {f.message}" if f else ""


def plain_line(it: Item) -> str:
    """One tab-separated line for humans and scripts (fields escaped by the caller)."""
    what = it.job or it.name
    detail = it.reason or (it.sha256 or "")[:12]
    return "\t".join([it.outcome, what, it.path, detail])


def summary(rep: Report) -> str:
    counts = rep.counts()
    order = [
        "adopted",
        "resumed",
        "planned",
        "already",
        "untagged",
        "invalid",
        "failed",
        "busy",
        "unsupported",
    ]
    said = ", ".join(f"{counts[k]:,} {k}" for k in order if counts.get(k))
    return f"adopt: {said or 'nothing to adopt'} in {rep.seconds:.1f} s"


# -- shadow: compare a catalogue export, change nothing --------------------------------------


@dataclass(frozen=True)
class Difference:
    path: str
    kind: str  # missing-file, uncatalogued, id-content, id-split, duplicate, tag-missing,
    #            tag-differs, library-differs
    detail: str


def read_catalogue(csv_path: Path, root: Path) -> dict[str, tuple[str, dict[str, str]]]:
    """A catalogue export: path -> (its id, its tags). Columns ``path`` and ``id``, then
    one column per tag, or a ``tags`` column of ``key=value`` pairs joined by ``;``."""
    rows = read_tags_csv(csv_path, root)
    out = {}
    for rel, row in rows.items():
        ident = row.pop("id", "")
        packed = row.pop("tags", "")
        for pair in filter(None, (x.strip() for x in packed.split(";"))):
            k, eq, v = pair.partition("=")
            if eq and k.strip() and v.strip():
                row.setdefault(k.strip(), v.strip())
        out[rel] = (ident, row)
    return out


def shadow(
    tree: Tree,
    cfg: Config,
    root: Path,
    catalogue: dict[str, tuple[str, dict[str, str]]],
    rows: dict[str, dict[str, str]] | None = None,
    jobs: int = 4,
) -> list[Difference]:
    """Every difference in object identity and required tags between a catalogue export
    and what adoption would index (and what the library already holds); writes nothing."""

    root = inside_roots(root, cfg.asset_roots(tree.root))
    required = cfg.acceptance.required_tags
    found, _unsupported = scan(root)
    by_rel = {f.rel: f for f in found}
    with ThreadPoolExecutor(max(1, jobs)) as pool:
        digests = dict(zip(by_rel, pool.map(lambda f: sha256_file(f.path)[0], found), strict=True))
    out: list[Difference] = []
    for rel, (ident, _tags) in sorted(catalogue.items()):
        if rel not in by_rel:
            out.append(
                Difference(rel, "missing-file", f"catalogue id {ident or '-'} names no media file here")
            )
    by_id: dict[str, set[str]] = {}
    ids_of: dict[str, set[str]] = {}
    for rel in sorted(by_rel):
        digest = digests[rel]
        if rel not in catalogue:
            out.append(Difference(rel, "uncatalogued", f"sha256 {digest} is in no catalogue row"))
            continue
        ident, cat_tags = catalogue[rel]
        if ident:
            by_id.setdefault(ident, set()).add(digest)
            ids_of.setdefault(digest, set()).add(ident)
        if re.fullmatch(r"[0-9a-fA-F]{64}", ident) and ident.lower() != digest:
            out.append(
                Difference(rel, "id-content", f"catalogue object {ident.lower()}, the file is {digest}")
            )
        want = dict((rows or {}).get(rel) or read_sidecar(by_rel[rel].path) or {})
        name = want.pop("name", "") or asset_name(rel)
        for t in required:
            have = nfc(cat_tags.get(t, ""))
            if not have:
                out.append(Difference(rel, "tag-missing", f"the catalogue has no {t}"))
            elif want and nfc(want.get(t, "")) != have:
                out.append(
                    Difference(rel, "tag-differs", f"{t}: catalogue {have!r}, tags {want.get(t, '')!r}")
                )
        cur = current_revision(tree, name) if NAME_RE.match(name) else None
        entry = read_version(tree, name, cur) if cur is not None else None
        if entry is not None and entry.sha256 != digest:
            out.append(
                Difference(
                    rel, "library-differs", f"{name}@{cur} is sha256 {entry.sha256}, the file {digest}"
                )
            )
    for ident, objs in sorted(by_id.items()):
        if len(objs) > 1:
            out.append(Difference(ident, "id-split", f"one catalogue id names {len(objs)} different objects"))
    for digest, ids in sorted(ids_of.items()):
        if len(ids) > 1:
            out.append(
                Difference(digest, "duplicate", f"one object under catalogue ids {', '.join(sorted(ids))}")
            )
    return out
