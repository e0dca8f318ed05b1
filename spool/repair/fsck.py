"""``spool fsck``: check every invariant of SPEC section 11 over the whole tree.

Each finding is a :class:`Problem` with the invariant it breaks. A problem
with exactly one deterministic repair is repaired (unless ``repair=False``);
the rest are reported with what a human should do. The exit status is 0 only
when nothing unrepaired remains.

Deterministic repairs:

* a job file in two states, one of them ``complete`` with a verified
  manifest and the other copies byte-identical: keep ``complete``;
* ``complete/J.json`` without a manifest, while one of its attempts staged a
  result whose store file verifies: install that manifest;
* a store file that hashes to its name but is writable: make it read-only;
* hidden temp files and attempt staging folders left by a crash, older than
  ``grace`` seconds: remove them (they were never visible under a final name).

* a job in no state (its file deleted from every state folder) whose frozen
  copy ``attempts/<job>/job.json`` (written at acceptance, read-only, the same
  bytes as the job file) is intact: put the copy back where the evidence says
  the job ended. A manifest whose store file verifies: ``complete/``; else a
  failure record in its last attempt: ``failed/``; else no outcome at all:
  ``held/``, so that nothing renders again until an operator runs ``spool
  release``. Without an intact copy (jobs accepted before copies were kept)
  nothing else holds the recipe, so fsck reports the job and says to resubmit
  it as a new revision;
* a store object that does not hash to its name while an intact copy with the
  right hash exists (an attempt's ``work/`` candidate that was published by
  copy, or whose link was broken by a replacing write): copy it back, verified.

* what a power cut took (SPEC 11.9, :mod:`spool.repair.lostwrites`): a published
  attempt's empty ``result.json`` written again from its manifest; empty or
  torn hints (progress, heartbeats, enrichment, poster frames) set aside as
  ``.<name>.damaged``; a journal that does not tell a job's ``complete``,
  ``failed`` or acceptance gets a line marked ``rebuilt``; in a format 2 tree, the
  folder of the attempt a complete job's manifest names, lost with its name, made
  again with its record from the manifest, and a lost frozen copy linked again
  from the job file.

Everything else is reported: a manifest that does not match its store file,
a store object that does not hash to its name, a failed job without a
failure record, an attempt folder without ``attempt.json``, a running job of
a dead or unknown worker (run ``spool recover``).
"""

from __future__ import annotations

import os
import shutil
import stat
import time
from collections.abc import Callable
from pathlib import Path

from spool import kinds
from spool.core import config
from spool.core.model import Failure, Manifest, WorkerRecord
from spool.core.problems import Problem
from spool.disk import store
from spool.disk.tree import (
    FLAT_STATES,
    JOB_COPY,
    Tree,
    copy_verified,
    fsync_dir,
    visible_names,
    write_atomic,
    writer_gone,
)
from spool.kinds import views
from spool.library import index, segments
from spool.queue import depends, liveness, quarantine
from spool.queue.attempt import staged_result
from spool.queue.events import Journal, cli_writer
from spool.queue.publish import install_manifest
from spool.queue.status import Location, attempt_numbers, locate_all, read, running_workers
from spool.repair import lostwrites

#: Crash leftovers younger than this may belong to a writer still at work.
GRACE = 300.0


def _rel(tree: Tree, p: Path) -> str:
    return tree.relative(p)


def all_job_ids(tree: Tree) -> set[str]:
    ids = set()
    for state in FLAT_STATES:
        ids |= {n[:-5] for n in visible_names(tree.root / state)}
    for w in running_workers(tree):
        ids |= {n[:-5] for n in visible_names(tree.running_dir(w))}
    return ids


def check(
    tree: Tree,
    *,
    repair: bool = True,
    stale_after: float = 120.0,
    grace: float = GRACE,
    verify_hashes: bool = True,
    settle: float | None = None,
) -> list[Problem]:
    """Every problem found; repaired ones are marked so. ``settle``: seconds a record or
    job file must have been left alone to be judged lost to a crash (``None``: the
    default of :mod:`spool.repair.lostwrites`; 0 when no writer can be at work)."""
    problems: list[Problem] = []
    server = liveness.server_now(tree)
    for jid in sorted(all_job_ids(tree)):
        locs = locate_all(tree, jid)
        if len(locs) > 1:
            problems.append(_two_states(tree, jid, locs, repair))
            locs = locate_all(tree, jid)
        loc = locs[0] if locs else None
        if loc is None:
            continue
        if loc.state == "complete":
            p = _complete_has_manifest(tree, jid, repair, verify_hashes)
            if p:
                problems.append(p)
        elif loc.state == "failed" and not _has_failure(tree, jid):
            problems.append(Problem(6, _rel(tree, loc.path), "failed without a failure record", None))
        elif loc.state == "running" and loc.worker:
            p = _orphan(tree, loc, stale_after, server)
            if p:
                problems.append(p)
        if loc.state in ("complete", "failed"):
            problems += _generations_left(tree, jid)
        problems += _lost_names(tree, jid, loc, repair, settle)
        problems += _attempt_records(tree, jid)
    problems += _damaged(tree, repair)
    problems += _in_no_state(tree, repair, verify_hashes)
    problems += _store(tree, repair, verify_hashes)  # before _manifests: it may restore an object
    problems += _manifests(tree, verify_hashes)
    problems += _leftovers(tree, repair, grace)
    problems += index.fsck_problems(tree, repair=repair)  # the library index (SPEC 9)
    problems += _dependencies(tree, repair)  # jobs whose sources are other jobs (SPEC 11.12)
    problems += _lost_writes(tree, repair, settle)
    return problems


def _dependencies(tree: Tree, repair: bool) -> list[Problem]:
    if not tree.deps.is_dir() and not any(visible_names(tree.waiting)):
        return []
    found = depends.check(tree, config.load(tree.config_file), repair=repair)
    return [Problem(12, f.path, f.problem, f.repair, f.repaired) for f in found]


def _lost_writes(tree: Tree, repair: bool, settle: float | None) -> list[Problem]:
    """Records a power cut left empty or torn, and journal lines it took (SPEC 11.9):
    each reported; what the tree proves is mended (:mod:`spool.repair.lostwrites`)."""
    out = []
    wait = lostwrites.SETTLE if settle is None else settle
    for d in lostwrites.damaged_records(tree, wait):
        fix = {"rewrite": "write it again", "aside": f"set it aside as .{d.path.name}.damaged"}
        prob = Problem(9, _rel(tree, d.path), f"record is {d.how} ({d.why})", fix.get(d.action or ""))
        if repair and d.action is not None:
            lostwrites.mend(d)
            prob.repaired = True
        out.append(prob)
    gaps = lostwrites.journal_gaps(tree, wait)
    for g in gaps:
        said = f"its last state line says {g.last}" if g.last else "it has no line"
        out.append(
            Problem(9, f"events/ ({g.job_id})", f"the journal does not tell that it is {g.state}: {said}",
                    f"append a line marked rebuilt: {g.state}", repaired=repair)
        )  # fmt: skip
    if repair and gaps:
        lostwrites.rebuild(tree, gaps, Journal(tree, cli_writer()))
    return out


def _lost_names(tree: Tree, jid: str, loc: Location, repair: bool, settle: float | None) -> list[Problem]:
    """Names of ``attempts/J/`` a power cut took (format 2 does not fsync that folder at
    claim): made again from what the tree proves (:func:`lostwrites.lost_names`)."""
    wait = lostwrites.SETTLE if settle is None else settle
    out = []
    for lost in lostwrites.lost_names(tree, jid, loc.state, loc.path, wait):
        fix = (
            "make the folder again with its attempt.json written from the manifest"
            if lost.what == "attempt"
            else f"link it again from {_rel(tree, loc.path)}"
        )
        prob = Problem(9, _rel(tree, lost.path), f"missing: {lost.why}", fix)
        if repair:
            lostwrites.restore_name(lost)
            prob.repaired = True
        out.append(prob)
    return out


def _two_states(tree: Tree, jid: str, locs: list[Location], repair: bool) -> Problem:
    where = ", ".join(f"running/{loc.worker}" if loc.worker else loc.state for loc in locs)
    prob = Problem(1, jid, f"in {len(locs)} states at once: {where}")
    complete = next((loc for loc in locs if loc.state == "complete"), None)
    m = read(tree.manifest_file(jid), Manifest)
    if complete is None or m is None or store.verify(tree, m) is not None:
        prob.repair = None
        return prob
    data = complete.path.read_bytes()
    others = [loc for loc in locs if loc is not complete]
    if any(o.path.read_bytes() != data for o in others):
        return prob
    prob.repair = f"keep complete/ (verified manifest), remove the copies in {len(others)} other state(s)"
    if repair:
        for o in others:
            o.path.unlink()
            fsync_dir(o.path.parent)
        prob.repaired = True
    return prob


def _complete_has_manifest(tree: Tree, jid: str, repair: bool, verify_hashes: bool) -> Problem | None:
    mpath = tree.manifest_file(jid)
    m = read(mpath, Manifest)
    if m is not None:
        return None  # whether it matches its store file is checked in _manifests
    prob = Problem(3, _rel(tree, tree.job_file("complete", jid)), "complete without a manifest")
    for n in reversed(attempt_numbers(tree, jid)):
        staged = staged_result(tree.attempt_dir(jid, n))
        if staged is not None and store.verify(tree, staged) is None:
            prob.repair = f"install the verified result of attempt {n} as the manifest"
            if repair:
                install_manifest(tree, staged)
                prob.repaired = True
            return prob
    return prob


def _damaged(tree: Tree, repair: bool) -> list[Problem]:
    """Job files waiting in pending/ or held/ that can never run (unreadable, not a
    regular file, named for another job, or edited after acceptance): quarantined."""
    out = []
    for state in ("waiting", "pending", "held"):
        folder = tree.root / state
        for name in sorted(visible_names(folder)):
            try:
                quarantine.load(folder / name, unresolved_ok=state != "pending")
            except quarantine.Damaged as damage:
                prob = Problem(5, f"{state}/{name}", f"{damage.field}: {damage.reason}")
                prob.repair = f"move it to quarantine/{name} with the reason beside it"
                if repair:
                    prob.repaired = quarantine.quarantine(tree, folder / name, state, damage, "fsck")
                out.append(prob)
            except OSError:
                continue  # gone since the listing
    return out


def _has_failure(tree: Tree, jid: str) -> bool:
    return any(
        read(tree.attempt_dir(jid, n) / "failure.json", Failure) is not None
        for n in attempt_numbers(tree, jid)
    )


def _orphan(tree: Tree, loc: Location, stale_after: float, server: float) -> Problem | None:
    assert loc.worker is not None
    rec = read(tree.worker_file(loc.worker), WorkerRecord)
    if rec is None:
        health, why = "unknown", "it has no worker record"
    else:
        h = liveness.assess(tree, rec, stale_after, server_time=server)
        if h.health == "alive":
            return None
        health, why = h.health, h.reason
    return Problem(
        8,
        _rel(tree, loc.path),
        f"running on a worker that is {health} ({why})",
        f"spool recover --worker {loc.worker}" + (" --force" if health == "stalled" else ""),
    )


def _attempt_records(tree: Tree, jid: str) -> list[Problem]:
    out = []
    for n in attempt_numbers(tree, jid):
        d = tree.attempt_dir(jid, n)
        if not (d / "attempt.json").is_file():
            out.append(Problem(4, _rel(tree, d), "attempt folder without attempt.json"))
    return out


def _generations_left(tree: Tree, jid: str) -> list[Problem]:
    """A generation attempt no worker runs, whose provider job may still run (SPEC 11, 10)."""
    if not any((tree.attempt_dir(jid, n) / "gen").is_dir() for n in attempt_numbers(tree, jid)):
        return []

    return [
        Problem(10, _rel(tree, gen), why, "check the provider: cancel that job there if it still runs")
        for gen, why in views.left_behind(tree, jid)
    ]


def _manifests(tree: Tree, verify_hashes: bool) -> list[Problem]:
    out = []
    for name in visible_names(tree.manifests):
        path = tree.manifests / name
        m = read(path, Manifest)
        if m is None:
            out.append(Problem(3, _rel(tree, path), "manifest is unreadable"))
            continue
        if verify_hashes:
            why = store.verify(tree, m)
        else:
            why = None if (tree.root / m.output.store_path).is_file() else "its store file is missing"
        if why is not None:
            out.append(Problem(3, _rel(tree, path), f"does not match the store: {why}"))
    return out


def _job_copy(tree: Tree, jid: str) -> tuple[kinds.Job | None, bytes, str]:
    """The job's frozen copy: (job, its bytes, why not usable). It must pass the
    checks a queued job file passes (it decodes, names the job, matches its recipe_hash)."""
    path = tree.job_attempts(jid) / JOB_COPY
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None, b"", "no frozen copy of the job exists (accepted before copies were kept, or deleted)"
    except OSError as exc:
        return None, b"", f"its frozen copy {_rel(tree, path)} cannot be read ({exc.strerror})"
    try:
        job = quarantine.check(f"{jid}.json", data, unresolved_ok=True)
    except quarantine.Damaged as damage:
        return None, data, f"its frozen copy {_rel(tree, path)} is damaged ({damage})"
    return job, data, ""


def _in_no_state(tree: Tree, repair: bool, verify_hashes: bool) -> list[Problem]:
    """Jobs with a reservation, attempts or a manifest, but no job file in any state."""
    known = all_job_ids(tree)
    seen = {n for n in visible_names(tree.attempts, suffix="") if "@" in n}
    seen |= {n[:-5] for n in visible_names(tree.manifests) if n.endswith(".json")}
    out = []
    for jid in sorted(seen - known):
        if locate_all(tree, jid):
            continue  # it arrived in a state while we looked
        if (tree.quarantine / f"{jid}.json").exists():
            continue  # taken out of the queue on purpose, with its reason (spool.queue.quarantine)
        numbers = attempt_numbers(tree, jid)
        mpath = tree.manifest_file(jid)
        if not numbers and not mpath.exists() and not (tree.job_attempts(jid) / JOB_COPY).exists():
            continue  # an empty reservation: an acceptance at work, or one that crashed
        where = _rel(tree, tree.job_attempts(jid))
        prob = Problem(1, jid, f"in no state: no job file in any state folder, but {where} exists")
        job, data, why = _job_copy(tree, jid)
        if job is None:
            prob.problem += f"; {why}"
            prob.repair = None
            out.append(prob)
            continue
        m = read(mpath, Manifest)
        if m is not None and m.recipe_hash == job.recipe_hash and _stored(tree, m, verify_hashes):
            state, evidence = "complete", "its manifest's store file verifies"
        elif numbers and read(tree.attempt_dir(jid, numbers[-1]) / "failure.json", Failure) is not None:
            state, evidence = "failed", f"attempt {numbers[-1]} recorded a failure"
        elif not job.resolved:
            state, evidence = "waiting", "it waits for its upstreams, as accepted"
        else:
            state, evidence = "held", "no outcome is recorded; spool release runs it again"
        prob.repair = f"restore {state}/{jid}.json from its frozen copy ({evidence})"
        if repair:
            try:
                write_atomic(tree.job_file(state, jid), data, replace=False)
            except FileExistsError:
                pass  # restored by someone else meanwhile
            prob.repaired = True
        out.append(prob)
    return out


def _stored(tree: Tree, m: Manifest, verify_hashes: bool) -> bool:
    if verify_hashes:
        return store.verify(tree, m) is None
    return (tree.root / m.output.store_path).is_file()


def _intact_copy(tree: Tree, digest: str, damaged: Path) -> Path | None:
    """A file with the right sha256 to restore a damaged store object from: the
    work/ candidates of the attempts whose manifest or result names ``digest``."""
    try:
        bad = damaged.stat()
    except FileNotFoundError:
        return None
    sizes: set[int] = set()
    folders: list[Path] = []
    for name in visible_names(tree.manifests):
        m = read(tree.manifests / name, Manifest)
        if m is not None and m.output.sha256 == digest:
            sizes.add(m.output.size)
            folders.append(tree.attempt_dir(m.job_id, m.attempt) / "work")
    for folder in folders:
        for dirpath, _dirs, files in os.walk(folder):
            for fname in sorted(files):
                cand = Path(dirpath) / fname
                try:
                    st = cand.lstat()
                except OSError:
                    continue
                if not stat.S_ISREG(st.st_mode) or st.st_ino == bad.st_ino or st.st_size not in sizes:
                    continue
                if store.sha256_file(cand)[0] == digest:
                    return cand
    return None


def _store(tree: Tree, repair: bool, verify_hashes: bool) -> list[Problem]:
    out = []
    for f in store.objects(tree):  # temp files are _leftovers' business
        digest = f.name.split(".")[0]
        if verify_hashes:
            actual, _ = store.sha256_file(f)
            if actual != digest:
                prob = Problem(2, _rel(tree, f), f"does not hash to its name (sha256 {actual})")
                source = _intact_copy(tree, digest, f)
                if source is None:
                    prob.problem += "; no intact copy with that hash was found in the attempts' work/ folders"
                else:
                    prob.repair = f"restore it from {_rel(tree, source)}, which has the right sha256"
                    if repair:
                        copy_verified(
                            source, f, digest, mode=0o444, replace=True, temp_dir=store.temp_folder(tree)
                        )
                        prob.repaired = True
                out.append(prob)
                continue
        mode = f.stat().st_mode
        if mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH):
            prob = Problem(2, _rel(tree, f), "store file is writable", "make it read-only")
            if repair:
                os.chmod(f, stat.S_IMODE(mode) & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))
                prob.repaired = True
            out.append(prob)
    return out


def _is_temp(name: str) -> bool:
    return name.startswith(".") and name.endswith(".tmp")


def _entries(folder: str | os.PathLike[str]) -> list[os.DirEntry[str]]:
    """A folder's entries (none if it is gone or not a folder)."""
    try:
        with os.scandir(folder) as it:
            return list(it)
    except (FileNotFoundError, NotADirectoryError):
        return []


def _subfolders(folder: Path) -> list[str]:
    return [e.path for e in _entries(folder) if e.is_dir(follow_symlinks=False)]


def sweep_leftovers(
    tree: Tree, stop: Callable[[], bool] | None = None, *, attempts: bool = True
) -> list[Problem]:
    """Remove what interrupted writes of dead processes of this host left behind (a
    daemon does this on a thread of its own once it has started: spoold.policies'
    LeftoverSweep). Nothing waits for it: a leftover has a hidden name no reader takes
    and no writer reuses, and a live process's are never touched. ``stop`` is asked
    between job folders: what was found so far is removed, the rest waits.
    ``attempts=False``: the shared folders only, not every job folder in ``attempts/``
    (:func:`spool.queue.workers.walk_owed` says when a daemon walks them)."""
    return _leftovers(tree, repair=True, grace=float("inf"), stop=stop, shards=False, attempts=attempts)


def _leftovers(
    tree: Tree,
    repair: bool,
    grace: float,
    stop: Callable[[], bool] | None = None,
    shards: bool = True,
    attempts: bool = True,
) -> list[Problem]:
    """Hidden temp files and attempt staging folders whose writer is a dead
    process of this host, or that are older than ``grace``. ``shards``: also in the
    store's 256 shard folders, where code before 2026-12-04 wrote its copies' temps
    (``store.temp_folder``); a daemon's sweep leaves that to fsck: over a NAS it was
    ~1,500 requests at each start, for leftovers only a copy (no hard links) killed
    by old code can leave."""
    out = []
    now = time.time()
    # Every folder a write by temp name goes to (write_atomic, link_or_copy: on a NFS,
    # SMB or FUSE mount, where write-once files have no unnamed form, and for atomic
    # replaces everywhere), down to the attempt folders' records.
    folders = [
        tree.waiting,
        tree.pending,
        tree.held,
        tree.complete,
        tree.failed,
        tree.manifests,
        tree.workers,
        tree.rejected,
        tree.quarantine,
        tree.variants,
        tree.approvals,
        tree.deps / "_held",
        segments.folder(tree),
    ]
    folders += [tree.running_dir(w) for w in running_workers(tree)]
    folders.append(store.temp_folder(tree))
    if shards:
        folders += [Path(d) for d in _subfolders(store.temp_folder(tree))]
    candidates: list[Path] = []
    for folder in folders:
        candidates += [p for p in folder.glob(".*.tmp")]
    # One listing a job folder and one an attempt folder, each read once for every kind of
    # leftover it may hold: with 50,000 finished jobs this walk takes a daemon's sweep
    # thread minutes over a NAS (four round trips a listing).
    for jdir in _subfolders(tree.attempts) if attempts else []:
        if stop is not None and stop():
            break
        for entry in _entries(jdir):
            name = entry.name
            if name.startswith(".new.") or _is_temp(name):
                candidates.append(Path(entry.path))
            elif name.isdigit() and entry.is_dir(follow_symlinks=False):
                candidates += [Path(e.path) for e in _entries(entry.path) if _is_temp(e.name)]
    for p in candidates:
        try:
            age = now - p.lstat().st_mtime
        except FileNotFoundError:
            continue
        gone = writer_gone(p.name)
        if age < grace and not gone:
            continue
        why = "its writer, a process of this host, is gone" if gone else f"{age:.0f} s old"
        prob = Problem(2, _rel(tree, p), f"leftover of an interrupted write ({why})", "remove it")
        if repair:
            if p.is_dir():
                shutil.rmtree(p, ignore_errors=True)
            else:
                p.unlink(missing_ok=True)
            prob.repaired = True
        out.append(prob)
    return out
