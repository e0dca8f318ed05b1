"""Intent: what an operator decides, kept apart from what recovery does.

Recovery and technical retries never change what a job is. These do, and
each one is an explicit, journaled act:

* ``retry``: a failed job goes back to pending, same job file, same recipe;
  the next claim opens a new attempt;
* ``revise``: a new editorial choice is a new job, ``name@N+1``, with
  ``supersedes`` pointing back; the old job stays as it was;
* ``cancel``: a pending or held job fails at once; a running one is asked
  to stop (``attempts/J/cancel.json``), and its worker records the attempt
  and fails the job with reason cancelled;
* ``approve``: a separate record, ``approvals/J/<sha256>.<by>.json``, keyed
  by the job and the output hash someone reviewed; it never edits a job;
* ``hold`` / ``release``: set a pending job aside in ``held/`` and back.
"""

from __future__ import annotations

import json
import os
import time
import unicodedata
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

from spool import kinds
from spool.core.config import Config
from spool.core.errors import InvalidInput, NotFound, NotReady
from spool.core.model import Approval, CancelRequest, Manifest, decode, encode, now
from spool.disk.tree import HOST, Tree, make_dirs, transfer, write_atomic
from spool.queue.attempt import open_attempt, write_failure
from spool.queue.cancel import cancelled_failure
from spool.queue.events import Journal
from spool.queue.status import job_ids, load_job, locate, read

if TYPE_CHECKING:
    from spool.kinds import Job

#: The worker folder through which ``spool cancel`` briefly holds a pending or
#: held job, so a claim racing it cannot also win. It is only the holder: the
#: attempt's ``reason`` and the failure's ``worker`` name who cancelled.
CANCELLER = f"{HOST}-cancel"
#: A person's name as ``--by`` takes it: letters and marks of any script,
#: digits, spaces and ``. _ @ + - '``. It becomes part of a file name, so no
#: ``/``, no control characters and no leading dot.
_PERSON_PUNCT = frozenset(" ._@+-'")
#: The longest name in UTF-8 bytes: ``<sha256>.<by>.json`` must fit in 255.
_PERSON_BYTES = 160


def person(by: str, field: str = "--by") -> str:
    """``by`` as a name to record (NFC, so the same name typed anywhere is one
    file), or :class:`InvalidInput` naming ``field``."""
    name = unicodedata.normalize("NFC", by)
    ok = (
        0 < len(name) <= 64
        and len(name.encode()) <= _PERSON_BYTES
        and name[0] not in ". "
        and name[-1] != " "
        and all(c in _PERSON_PUNCT or unicodedata.category(c)[0] in "LMN" for c in name)
    )
    if not ok:
        raise InvalidInput(
            field,
            f"{by!r} is not a name: up to 64 letters (any script), digits, spaces and . _ @ + - ', "
            "not starting with a dot",
        )
    return name


def _require(tree: Tree, job_id: str, *states: str) -> Any:
    loc = locate(tree, job_id)
    if loc is None:
        raise NotFound(f"no job {job_id} in {tree.root}")
    if loc.state not in states:
        raise InvalidInput(job_id, f"is {loc.state}; this needs a job that is {' or '.join(states)}")
    return loc


def _move(tree: Tree, job_id: str, src: str, dst: str, raced: str) -> None:
    """One intent's move of a job file (:func:`spool.disk.tree.transfer`); ``raced`` says
    what happened if the job was no longer where the command found it."""
    make_dirs(tree.root / dst)
    if not transfer(tree.job_file(src, job_id), tree.job_file(dst, job_id)):
        raise NotReady(f"{job_id} {raced}")


def resubmits_to(tree: Tree, job_id: str) -> str | None:
    """What a retry of ``job_id`` would spend beyond compute (a generation's new create
    request at its provider, which may cost), in words, or ``None``: the job's kind says."""
    found = load_job(tree, job_id)
    if found is None:
        return None
    return kinds.of(found[0]).retry_cost(tree, found[0])


def retry_job(tree: Tree, job_id: str, by: str, journal: Journal, *, resubmit: bool = False) -> None:
    """failed -> pending: same job file and recipe, a new attempt at the next claim.
    The workers blocked from it (host-class failures) may take it again: the
    operator says the hosts were fixed.

    A retry that would cost (a generation's new create request at its provider) is
    refused unless ``resubmit`` says the caller agreed (``--yes``); one that downloads
    a kept result again costs nothing and needs no ``--yes``."""
    from spool.queue import blocklist, retry  # here: `spool status` imports this module and needs neither

    _require(tree, job_id, "failed")
    cost = resubmits_to(tree, job_id)
    if cost is not None and not resubmit:
        raise InvalidInput(
            "--yes",
            f"a retry of {job_id} sends {cost}; run spool retry --yes {job_id} to retry it",
        )
    retry.mark_operator_retry(tree, job_id, by)
    clear_cancel(tree, job_id)
    blocklist.clear(tree, job_id)
    found = load_job(tree, job_id)
    to = "waiting" if found is not None and not found[0].resolved else "pending"  # its upstreams first
    _move(tree, job_id, "failed", to, "left failed/ a moment ago; look again (spool show)")
    journal.record(job_id, to, from_="failed", reason=f"retry by {by}")


def hold(tree: Tree, job_id: str, by: str, journal: Journal) -> None:
    loc = _require(tree, job_id, "pending", "waiting")
    _move(tree, job_id, loc.state, "held", "was claimed a moment ago; cancel it instead")
    journal.record(job_id, "held", from_=loc.state, reason=f"held by {by}")


def release(tree: Tree, job_id: str, by: str, journal: Journal, cfg: Config | None = None) -> str:
    """held -> pending; a job whose sources come from other jobs not yet frozen goes back to
    ``waiting/`` instead (and on at once if they are published, given ``cfg``), unless an
    upstream is still failed: that is refused, naming it. Releasing a dependent held because
    its pinned upstream was superseded records that it may wait for it anyway. Returns the
    state the job is in now."""
    from spool.queue import depends  # here: `spool status` imports this module

    loc = _require(tree, job_id, "held")
    found = load_job(tree, job_id)
    if found is None or found[0].resolved:
        _move(tree, job_id, "held", "pending", "left held/ a moment ago; look again (spool show)")
        depends.clear_hold(tree, job_id)
        journal.record(job_id, "pending", from_="held", reason=f"released by {by}")
        return "pending"
    job = found[0]
    verdict = depends.judge(tree, job, depends.Snapshot(tree))
    if verdict.action == "hold" and verdict.cause in ("failed", "cancelled", "missing"):
        raise InvalidInput(job_id, f"cannot be released: {verdict.reason}; retry or revise it first")
    if verdict.cause == "superseded":
        depends.acknowledge(tree, job_id)
    _move(tree, job_id, loc.state, "waiting", "left held/ a moment ago; look again (spool show)")
    depends.clear_hold(tree, job_id)
    journal.record(job_id, "waiting", from_="held", reason=f"released by {by}")
    if cfg is not None:
        done = depends.settle(tree, cfg, journal, jobs=[job_id], by=by)
        if job_id in done.pending:
            return "pending"
        if job_id in done.held:
            return "held"
    return "waiting"


def release_all(tree: Tree, ref: str, by: str, journal: Journal, cfg: Config | None = None) -> dict[str, str]:
    """:func:`release` of one job, or of every held variant of a fan-out's parent: job -> state."""
    variants = fanout_jobs(tree, ref)
    if variants is None:
        return {ref: release(tree, ref, by, journal, cfg)}
    out = {}
    for jid in variants:
        loc = locate(tree, jid)
        if loc is not None and loc.state == "held":
            out[jid] = release(tree, jid, by, journal, cfg)
    if not out:
        raise InvalidInput(ref, "has no held variant to release")
    return out


def fanout_jobs(tree: Tree, ref: str) -> list[str] | None:
    """The newest revision of each variant of the fan-out parent ``ref``, or ``None`` when
    ``ref`` is not one (a revised variant counts for its parent)."""
    # here: spool show of a job without a fan-out stays off it (+~12 ms)
    from spool.queue.fanout import FanOut

    if locate(tree, ref) is not None:
        return None
    fan = read(tree.variants / f"{ref}.json", FanOut)
    if fan is None:
        return None
    out = []
    for v in fan.jobs:
        name, _, rev = v.job.rpartition("@")
        newer = newer_revisions(tree, name, int(rev))
        out.append(f"{name}@{newer[-1][0]}" if newer else v.job)
    return out


def revise(
    tree: Tree,
    cfg: Config,
    job_id: str,
    spec: Any,
    by: str,
    journal: Journal,
    sources: dict[str, str] | None = None,
    *,
    force: bool = False,
) -> Job:
    """A new revision with a new spec (a render's recipe, a generation's ``generate``
    table); what the job's kind does not change carries over (tags, output name,
    stated expectations, priority; a render's sources, with ``sources`` adding or
    replacing roles). It goes through acceptance like any submission.

    Revisions form a line, not a tree: revising a job that already has a newer
    revision is refused, naming the newest, unless ``force`` (then the new
    revision still gets the next free number and supersedes ``job_id``)."""
    from spool.queue import accept  # here: spool show stays off acceptance (+~5-110 ms)

    found = load_job(tree, job_id)
    if found is None:
        raise NotFound(f"no job {job_id} in {tree.root}")
    old, _ = found
    fields = kinds.of(old).revision(old, spec, dict(sources or {}))
    for up in old.upstreams:  # a source from another job stays one: the revision waits for it again
        if isinstance(fields.get("sources"), dict) and up.role not in (sources or {}):
            asset = up.ref.removeprefix("asset:")
            fields["sources"][up.role] = {"asset": asset} if up.ref.startswith("asset:") else {"job": up.ref}
    newer = newer_revisions(tree, old.name, old.revision)
    if newer and not force:
        newest, state = newer[-1]
        raise InvalidInput(
            job_id,
            f"already has a newer revision {old.name}@{newest} ({state}); revise that one, "
            f"or pass --force to branch a new revision from {job_id}",
        )
    rev = max([old.revision, *(n for n, _ in newer)]) + 1
    while tree.job_attempts(f"{old.name}@{rev}").exists():
        rev += 1
    out_file = fields.pop("output_file")
    sub: dict[str, Any] = {
        "name": old.name,
        "revision": rev,
        "supersedes": job_id,
        "operation": old.operation,
        **fields,
        "output": {"expect": msgspec.to_builtins(old.output.stated), "file": out_file},
        "tags": old.tags,
        "priority": old.priority,
        "submitted_by": by,
    }
    data = json.dumps(sub).encode()
    job = accept.accept_bytes(tree, cfg, data, by)
    journal.record(job.job_id, accept.state_of(job), from_="revise", reason=f"revision of {job_id} by {by}")
    return job


def revise_fanout(tree: Tree, cfg: Config, parent: str, spec: Any, by: str, journal: Journal) -> list[Job]:
    """A new revision of a fan-out's parent with a new recipe: every variant again, each a
    new revision superseding the variant of ``parent`` (the matrix and overrides carry over)."""
    from spool.queue import accept  # here: spool show stays off acceptance (+~5-110 ms)
    from spool.queue.fanout import FanOut

    fan = read(tree.variants / f"{parent}.json", FanOut)
    if fan is None:
        raise NotFound(f"no job or fan-out {parent} in {tree.root}")
    rev = fan.revision + 1
    while (tree.variants / f"{fan.name}@{rev}.json").exists():
        rev += 1
    raw = json.loads(fan.request)
    raw.update(recipe=spec, revision=rev, supersedes=parent, submitted_by=by)
    jobs = accept.accept_all(tree, cfg, json.dumps(raw).encode(), by)
    for job in jobs:
        journal.record(
            job.job_id, accept.state_of(job), from_="revise", reason=f"revision of {parent} by {by}"
        )
    return jobs


def approve_all(
    tree: Tree, ref: str, by: str, note: str = "", sha256: str | None = None
) -> list[tuple[str, Approval | None, bool]]:
    """:func:`approve` of one job, or of every complete variant of a fan-out's parent:
    (job, record or ``None`` if not complete, newly written)."""
    variants = fanout_jobs(tree, ref)
    if variants is None:
        rec, new = approve(tree, ref, by, note, sha256)
        return [(ref, rec, new)]
    out: list[tuple[str, Approval | None, bool]] = []
    for jid in variants:
        loc = locate(tree, jid)
        if loc is None or loc.state != "complete":
            out.append((jid, None, False))
            continue
        rec, new = approve(tree, jid, by, note)
        out.append((jid, rec, new))
    return out


def newer_revisions(tree: Tree, name: str, revision: int) -> list[tuple[int, str]]:
    """(revision, state) of every job ``name@N`` with N > ``revision``, oldest first."""
    found = []
    for state in ("waiting", "pending", "held", "running", "complete", "failed"):
        for jid, _ in job_ids(tree, state):
            n, _, r = jid.rpartition("@")
            if n == name and r.isdigit() and int(r) > revision:
                found.append((int(r), state))
    return sorted(found)


def approve(
    tree: Tree, job_id: str, by: str, note: str = "", sha256: str | None = None
) -> tuple[Approval, bool]:
    """Record an approval of the job's current output; returns (record, newly written)."""
    _require(tree, job_id, "complete")
    m = read(tree.manifest_file(job_id), Manifest)
    if m is None:
        raise NotReady(f"{job_id} is complete but its manifest is missing; run spool fsck")
    if sha256 is not None and sha256 != m.output.sha256:
        raise InvalidInput(
            "--sha256",
            f"{job_id}'s output is now sha256 {m.output.sha256}, not the {sha256} you reviewed; "
            "review it again",
        )
    by = person(by)
    folder = tree.approvals / job_id
    make_dirs(folder)
    rec = Approval(
        job_id=job_id, sha256=m.output.sha256, store_path=m.output.store_path, by=by, note=note, at=now()
    )
    path = folder / f"{m.output.sha256}.{by}.json"
    try:
        write_atomic(path, encode(rec), mode=0o444, replace=False)
    except FileExistsError:
        return decode(path.read_bytes(), Approval), False
    return rec, True


def approvals(tree: Tree, job_id: str) -> list[Approval]:
    folder = tree.approvals / job_id
    out = []
    for p in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        a = read(p, Approval)
        if a is not None:
            out.append(a)
    return out


def cancel(
    tree: Tree, job_id: str, by: str, journal: Journal, *, wait: float = 30.0, reason: str = ""
) -> str:
    """Cancel a pending, held or running job. Returns the state the job ended in:
    ``failed`` (cancelled), or ``complete`` if a render finished before its
    worker saw the request."""
    by = person(by)  # it is recorded as who cancelled
    loc = _require(tree, job_id, "waiting", "pending", "held", "running")
    why = reason or f"cancelled by {by}"
    if loc.state in ("waiting", "pending", "held"):
        # Take it the way a worker would, so a claim racing us cannot also win.
        src, dst = tree.job_file(loc.state, job_id), tree.job_file("running", job_id, CANCELLER)
        if not transfer(src, dst):
            raise NotReady(f"{job_id} was claimed a moment ago; run spool cancel again")
        # The attempt's worker stays the holder (recovery reads it as this claim's
        # evidence if we die here); who cancelled is what the records say.
        att = open_attempt(tree, job_id, CANCELLER, reason=f"cancel by {by}")
        write_failure(att, cancelled_failure(job_id, att.n, f"{by} (spool cancel on {HOST})", why, loc.state))
        transfer(dst, tree.job_file("failed", job_id))
        tree.tidy_running(CANCELLER)
        _clear_hold(tree, job_id)
        journal.record(
            job_id, "failed", from_=loc.state, attempt=att.n, reason=why, stage="cancel", property="cancelled"
        )
        return "failed"
    request_cancel(tree, job_id, by, why)
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        now_loc = locate(tree, job_id)
        if now_loc is not None and now_loc.state != "running":
            clear_cancel(tree, job_id)
            return now_loc.state
        time.sleep(0.2)
    raise NotReady(
        f"{job_id} was asked to stop, but its worker {loc.worker} has not acted within {wait:g} s; "
        f"it will when it can (if the worker is dead: spool recover --worker {loc.worker}, then cancel again)"
    )


def _clear_hold(tree: Tree, job_id: str) -> None:
    # here: spool show of a job without dependencies stays off them (+~66 ms)
    from spool.queue.depends import clear_hold

    clear_hold(tree, job_id)


def request_cancel(tree: Tree, job_id: str, by: str, reason: str) -> Path:
    path = tree.job_attempts(job_id) / "cancel.json"
    write_atomic(path, encode(CancelRequest(job_id=job_id, by=by, reason=reason, at=now())))
    return path


def clear_cancel(tree: Tree, job_id: str) -> None:
    try:
        os.unlink(tree.job_attempts(job_id) / "cancel.json")
    except FileNotFoundError:
        pass
