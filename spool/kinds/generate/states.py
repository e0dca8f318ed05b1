"""The durable states of a generation attempt, each move a compare-and-set.

A generation attempt (SPEC section 8) moves forward only::

    submitted -> generating -> retrieving -> stored -> indexed
         \\____________\\_____________\\__________\\______> failed

Everything lives in ``attempts/<job>/<n>/gen/`` and is legible with ``ls``::

    1-submitted.json      the intent: idempotency key, provider, model, input hash, deadline
                          (and the attempt it carries on from, with that provider job)
    2-generating.json     the provider's job ID (made or adopted or inherited), and how
    3-retrieving.json     the output URL the provider gave
    4-stored.json         sha256 and size of the verified file in the store
    5-indexed.json        the asset index has it
    6-failed.json         why, the next action, and whether the paid result is kept
    state.3-retrieving    the marker: exactly one, naming the current state
    create-1.json         create request 1, durable BEFORE it is sent (the create log)
    create-1.made.json    ... and its outcome: made (the provider's ID), refused (certainly
                          nothing made), ambiguous (may have made one), unmade (the provider
                          proved that an ambiguous one made nothing); no outcome file: unknown
    progress.json         polls, last status, next eligible step time, queue time (a hint)
    late-completion.json  a provider result that arrived after the attempt was abandoned

Each transition is a compare-and-set that exactly one contender wins, on one
host or across NAS clients, built from two exclusive operations:

1. *write ahead*: the contender's record for the new state is written whole
   under a hidden name and hard-linked to ``<k>-<state>.json``; the link fails
   (EEXIST) if that state's record exists, so at most one record per state;
2. *the marker*: ``state.<current>`` is renamed to ``state.<new>``; only one
   rename of a name can succeed (the others find it gone), so exactly one
   transition out of each state wins. A loser removes its record.

Callers pass ``expect=``, the state their decision was based on, so a
decision made on a stale view (a second "succeeded" for an attempt already
retrieving) loses instead of applying to a later state.

A record whose transition never completed (its writer lost the rename, or
died between the link and the rename) is recognisable: its ``from_state`` is
not the current state. It is ignored and removed by the next contender that
needs its name. A record whose ``from_state`` *is* the current state is a
decided-but-unfinished transition; :func:`read` reports it as ``pending`` so
the workflow finishes it first (that is how a provider job ID written just
before a crash is never lost). Each record carries forward the fields of the
one before, so the current state's record holds everything.

The create log is how "submit once" survives any crash or power cut: a create
request's record is durable before the request is sent, so after a restart an
attempt knows every create it may have sent, and one without an outcome is
treated as possibly made (looked up, never sent again blindly).

``progress.json`` is rewritten on every step without fsync: a hint for
scheduling and observing (losing it only means an earlier look), never
evidence for a transition.
"""

from __future__ import annotations

import hashlib
import os
import re
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

import msgspec

from spool.core.errors import SpoolError
from spool.core.model import Record, canonical_json, decode, encode, now
from spool.disk.tree import VANISHED, Tree, fsync_dir, link_no_replace, make_dirs, read_retrying, write_atomic

GenState = Literal["submitted", "generating", "retrieving", "stored", "indexed", "failed"]
#: The states in order; the ordinal prefixes file names so ``ls`` sorts them.
ORDER: tuple[GenState, ...] = ("submitted", "generating", "retrieving", "stored", "indexed", "failed")
ORDINAL: dict[str, int] = {s: i + 1 for i, s in enumerate(ORDER)}
#: Allowed transitions: forward along the chain, or to failed from any non-final state.
NEXT: dict[str, frozenset[str]] = {
    "submitted": frozenset({"generating", "failed"}),
    "generating": frozenset({"retrieving", "failed"}),
    "retrieving": frozenset({"stored", "failed"}),
    "stored": frozenset({"indexed", "failed"}),
    "indexed": frozenset(),
    "failed": frozenset(),
}
FINAL_STATES = frozenset({"indexed", "failed"})

MARKER = "state."
_RECORD = re.compile(r"^(?P<k>[1-6])-(?P<state>[a-z]+)\.json$")
_MARKER = re.compile(r"^state\.(?P<k>[1-6])-(?P<state>[a-z]+)$")


class Conflict(SpoolError):
    """Another contender won this transition (or it is not allowed from the current state)."""

    def __init__(self, *args: object) -> None:
        global _conflicts
        with _conflicts_lock:
            _conflicts += 1
        super().__init__(*args)


#: Compare-and-set conflicts this process has met (each :class:`Conflict`), for metrics.
_conflicts = 0
_conflicts_lock = threading.Lock()


def conflicts() -> int:
    """Compare-and-set conflicts this process has met since it started."""
    with _conflicts_lock:
        return _conflicts


class Intent(Record, kw_only=True):
    """What the attempt is about to ask for; durable before any create request."""

    #: The idempotency key: ``<job id>/<attempt>`` (unique per attempt, stable across restarts).
    key: str
    job: str
    attempt: int
    provider: str
    model: str
    #: sha256 of the canonical JSON of the frozen input (the input itself stays in the job file).
    input_hash: str
    #: Unix time of the intent, and the attempt's deadline.
    intent_at: float
    deadline_at: float
    #: The provider's clock minus ours when the intent was made (from its ``Date`` header;
    #: ``None``: not measured yet): how far a provider timestamp may be from ours.
    clock_offset: float | None = None


#: What a failed attempt leaves of a result the provider reported ready: ``kept`` (the
#: next attempt downloads it again), ``gone`` (expired for good: the next one generates
#: again), ``none`` (there was none, or its bytes failed the gate).
Result = Literal["none", "kept", "gone"]


class StateRecord(Record, kw_only=True):
    """The record of entering a state; carries forward everything known so far."""

    state: GenState
    from_state: GenState | None = None
    at: datetime
    #: Worker identity that made the transition.
    by: str
    intent: Intent
    provider_job_id: str | None = None
    #: How the provider job became this attempt's: ``created``, ``adopted`` (found by a
    #: lookup after a lost reply) or ``inherited`` (from attempt ``inherited_from``; already
    #: in ``submitted``, where the inheritance is recorded before the move to ``generating``).
    how: str | None = None
    #: The attempt this one carried on from: its provider job, or its creates to settle.
    inherited_from: int | None = None
    provider_status: str | None = None
    output_url: str | None = None
    sha256: str | None = None
    bytes_retrieved: int = 0
    reason: str | None = None
    next_action: str | None = None
    #: Only in ``failed``: see :data:`Result`.
    result: Result = "none"


class Progress(Record, kw_only=True):
    """Per-step bookkeeping (a hint: rewritten on every step without fsync)."""

    polls: int = 0
    last_provider_status: str | None = None
    #: Unix time of the next eligible step (the driver's schedule is rebuilt from these).
    next_at: float | None = None
    #: Unix time of the provider's last answer about the job (new evidence).
    evidence_at: float | None = None
    #: Seconds the provider reported the job in its own queue (Runway ``THROTTLED``).
    queued_seconds: float = 0.0
    queued_since: float | None = None
    bytes_retrieved: int = 0
    rate_limited: int = 0
    errors: int = 0
    #: Consecutive failed tries of the current operation (lookups, downloads, cancels).
    tries: int = 0
    finds: int = 0
    downloads: int = 0
    #: A fresher output URL than the retrieving record's (signed URLs expire; a refetch renews).
    output_url: str | None = None
    updated_at: float | None = None


CreateOutcome = Literal["made", "refused", "ambiguous", "unmade"]


class CreateRequest(Record, kw_only=True):
    """``create-<k>.json``: create request ``k`` of the attempt, durable before it is sent."""

    k: int
    key: str
    sent_at: float
    #: What was sent, for the operator (``POST /v1/models/acme/video-1/predictions``).
    request: str
    by: str


class CreateResult(Record, kw_only=True):
    """``create-<k>.<outcome>.json``: what became of create request ``k``."""

    k: int
    outcome: CreateOutcome
    at: float
    provider_job_id: str | None = None
    #: The provider error's tag (``rate_limited``, ``timeout``, ...) and HTTP status.
    code: str | None = None
    http_status: int | None = None
    retry_after: float | None = None
    problem: str | None = None
    #: A refusal no retry can help (a 4xx other than 429): the attempt fails.
    final: bool = False


@dataclass
class Create:
    """One create request of the attempt and its outcome (``None``: unknown, possibly made)."""

    request: CreateRequest
    outcome: CreateResult | None = None

    @property
    def k(self) -> int:
        return self.request.k


class LateCompletion(Record, kw_only=True):
    """A provider result for an attempt that had already been abandoned: audit only."""

    provider_job_id: str
    provider_status: str
    outputs: list[str] = msgspec.field(default_factory=list)
    seen_at: datetime
    attempt_state: GenState


@dataclass
class View:
    """What ``gen/`` says now (see :func:`read`)."""

    dir: Path
    #: The current state, or ``None`` when the attempt never began.
    state: GenState | None
    #: The current state's record (``None`` only when not begun).
    record: StateRecord | None
    #: The marker's file name (``None`` if a crash left the begin half done).
    marker: str | None
    #: Decided-but-unfinished transitions out of the current state (``{state: record}``).
    pending: dict[str, StateRecord] = field(default_factory=dict)
    #: Records whose transition lost or never completed (``from_state`` is not current).
    orphans: list[str] = field(default_factory=list)
    progress: Progress | None = None
    #: Every record on disk by state (history, for ``spool show``).
    records: dict[str, StateRecord] = field(default_factory=dict)
    #: The create log, oldest first.
    creates: list[Create] = field(default_factory=list)

    @property
    def intent(self) -> Intent | None:
        return self.record.intent if self.record else None

    @property
    def final(self) -> bool:
        return self.state in FINAL_STATES


#: What this process last wrote or read of each generation attempt, by job ID:
#: (attempt, state, since when). The metrics gauge counts the daemon's own generations from it
#: instead of a listing of ``attempts/J/`` and a file check of ``gen/`` each at
#: every write (10,000 in flight cost 0.3 s of CPU per write on a local disk, and
#: seconds of round trips on a NAS). Terminal states leave it, so it holds at most
#: the generations in flight. It lags only a move made by another process (a
#: contender on another host), until this one next reads the attempt.
_known: dict[str, tuple[int, str, float]] = {}
_known_lock = threading.Lock()


def _note(gen: Path, state: str | None) -> None:
    """Remember the state of the attempt whose ``gen/`` this is, and since when this
    process has seen it in it (see :data:`_known`)."""
    attempt_dir = gen.parent
    try:
        n = int(attempt_dir.name)
    except ValueError:
        return
    jid = attempt_dir.parent.name
    with _known_lock:
        had = _known.get(jid)
        if had is not None and had[0] > n:
            return  # an older attempt (a late-completion audit): the newer one is current
        if state is None or state in ("indexed", "failed"):
            _known.pop(jid, None)
        elif had is None or had[:2] != (n, state):
            _known[jid] = (n, state, time.time())


def known_state(job_id: str) -> tuple[int, str] | None:
    """(attempt, state) of a generation this process is moving, from memory; ``None``
    if it moves none for this job (ask the files: :func:`current_state`)."""
    got = _known.get(job_id)
    return None if got is None else (got[0], got[1])


def known_since(job_id: str) -> float | None:
    """Since when (epoch seconds) this process has seen the job's attempt in its state."""
    got = _known.get(job_id)
    return None if got is None else got[2]


def gen_dir(attempt_dir: Path) -> Path:
    return Path(attempt_dir) / "gen"


def last_begun(tree: Tree, job_id: str, before: int | None = None) -> tuple[int, View] | None:
    """The latest attempt of the job (below ``before``) whose generation began, with its
    full view; ``None`` if none did. An attempt that never began sent nothing (the intent
    is durable before any create), so the one before it is what a new attempt carries
    on: a worker killed between opening an attempt and beginning it must not orphan an
    earlier attempt's provider job or its create of unknown fate."""
    for n in reversed(tree.attempt_numbers(job_id)):
        if before is not None and n >= before:
            continue
        view = read(gen_dir(tree.attempt_dir(job_id, n)), full=True)
        if view.state is not None and view.record is not None:
            return n, view
    return None


def record_name(state: str) -> str:
    return f"{ORDINAL[state]}-{state}.json"


def marker_name(state: str) -> str:
    return f"{MARKER}{ORDINAL[state]}-{state}"


# -- reading -------------------------------------------------------------------------


def _load(path: Path) -> StateRecord | None:
    try:
        return decode(read_retrying(path), StateRecord)
    except FileNotFoundError:
        return None
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None  # a half-written record cannot be visible (link of a whole file); ignore junk


_GENERATING = f"{MARKER}{ORDINAL['generating']}-generating"


def current_state(gen: Path) -> str | None:
    """The attempt's state from one listing of ``gen/`` (markers only; no record is
    read): cheap enough to call for every running job. ``None``: not a generation
    attempt, or one that never began."""
    # Nearly every generation in flight is waiting at its provider: one stat says so.
    # Sound because a transition renames the marker away, and a second marker is
    # only ever ``state.1-submitted`` (a begin rolled forward), never a lower one.
    try:
        os.stat(os.path.join(gen, _GENERATING))
        return "generating"
    except (FileNotFoundError, NotADirectoryError):
        pass
    try:
        names = os.listdir(gen)
    except (FileNotFoundError, NotADirectoryError):
        return None
    markers = sorted(
        ((int(m.group("k")), m.group("state")) for n in names if (m := _MARKER.match(n))), reverse=True
    )
    if markers:
        return markers[0][1]
    return "submitted" if record_name("submitted") in names else None


_CREATE = re.compile(r"^create-(?P<k>[0-9]+)\.json$")
_CREATE_OUT = re.compile(r"^create-(?P<k>[0-9]+)\.(?P<outcome>made|refused|ambiguous|unmade)\.json$")
#: Which outcome of a create request stands when several were recorded (an ambiguous
#: one later proven unmade; a crash's refusal followed by a found job).
_PRECEDENCE = {"made": 3, "unmade": 2, "refused": 1, "ambiguous": 0}


def _creates(gen: Path, names: list[str]) -> list[Create]:
    requests: dict[int, CreateRequest] = {}
    outcomes: dict[int, CreateResult] = {}
    for n in names:
        if m := _CREATE.match(n):
            try:
                requests[int(m.group("k"))] = decode(read_retrying(gen / n), CreateRequest)
            except (FileNotFoundError, msgspec.DecodeError, msgspec.ValidationError):
                continue  # written whole before it is visible; junk is not a request
        elif m := _CREATE_OUT.match(n):
            try:
                res = decode(read_retrying(gen / n), CreateResult)
            except (FileNotFoundError, msgspec.DecodeError, msgspec.ValidationError):
                continue
            have = outcomes.get(res.k)
            if have is None or _PRECEDENCE[res.outcome] > _PRECEDENCE[have.outcome]:
                outcomes[res.k] = res
    return [Create(req, outcomes.get(k)) for k, req in sorted(requests.items())]


def read(gen: Path, *, full: bool = False) -> View:
    """The attempt's state from its files; pure reading, no repair.

    Reads the current state's record, any decided-but-unfinished transition out of
    it, the progress hint and (while a create may still be sent or looked up) the
    create log; ``full`` also reads the history (every record and the create log)
    for ``spool show``.
    """
    try:
        names = os.listdir(gen)
    except FileNotFoundError:
        return View(dir=gen, state=None, record=None, marker=None)
    markers = sorted(
        ((int(m.group("k")), m.group("state"), n) for n in names if (m := _MARKER.match(n))),
        reverse=True,
    )
    present = {m.group("state"): n for n in names if (m := _RECORD.match(n)) and m.group("state") in ORDINAL}
    progress = None
    if "progress.json" in names:
        try:
            progress = decode(read_retrying(gen / "progress.json"), Progress)
        except (FileNotFoundError, msgspec.DecodeError, msgspec.ValidationError):
            pass
    if markers:
        # More than one marker only if a begin was rolled forward late; the highest is current.
        _, state, marker = markers[0]
    elif "submitted" in present:
        state, marker = "submitted", None  # a crash between the intent record and its marker
    else:
        creates = _creates(gen, names)
        return View(dir=gen, state=None, record=None, marker=None, progress=progress, creates=creates)
    current: GenState = state  # type: ignore[assignment]
    wanted = set(present) if full else ({current} | NEXT[current]) & set(present)
    records: dict[str, StateRecord] = {}
    for st in wanted:
        rec = _load(gen / present[st])
        if rec is not None:
            records[rec.state] = rec
    _note(gen, current)
    pending = {s: r for s, r in records.items() if r.from_state == current and s in NEXT[current]}
    orphans = []
    if full:
        orphans = [
            record_name(s)
            for s, r in records.items()
            if s != current and s not in pending and not _on_path(records, current, s)
        ]
    creates = _creates(gen, names) if full or current == "submitted" else []
    return View(
        dir=gen,
        state=current,
        record=records.get(current),
        marker=marker,
        pending=pending,
        orphans=orphans,
        progress=progress,
        records=records,
        creates=creates,
    )


def _on_path(records: dict[str, StateRecord], current: str, state: str) -> bool:
    """Whether ``state`` is in the chain of ``from_state`` links that leads to ``current``."""
    seen = current
    for _ in range(len(ORDER)):
        rec = records.get(seen)
        if rec is None or rec.from_state is None:
            return False
        if rec.from_state == state:
            return True
        seen = rec.from_state
    return False


# -- writing --------------------------------------------------------------------------


def _unlink(path: Path) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def begin(
    gen: Path, intent: Intent, by: str, *, inherited_from: int | None = None,
    provider_job_id: str | None = None,
) -> StateRecord:  # fmt: skip
    """Make the intent durable (state ``submitted``) BEFORE any create request.

    An attempt that carries on from attempt ``inherited_from`` records that here, with
    the provider job it takes over if there is one: the inheritance is then durable in
    the same write as the intent, so a crash before the move to ``generating`` resumes
    it, never a create beside a paid job nobody watches. Exclusive: a second ``begin``
    of the same attempt raises :class:`Conflict`.
    """
    make_dirs(gen)
    rec = StateRecord(
        state="submitted", at=now(), by=by, intent=intent, provider_job_id=provider_job_id,
        how="inherited" if provider_job_id is not None else None, inherited_from=inherited_from,
    )  # fmt: skip
    try:
        # The folder's fsync follows the marker's link, below: one for both names.
        write_atomic(gen / record_name("submitted"), encode(rec), replace=False, folder_later=True)
    except FileExistsError:
        raise Conflict(f"{gen}: this attempt was already submitted (1-submitted.json exists)") from None
    try:
        link_no_replace(gen / record_name("submitted"), gen / marker_name("submitted"))
    except FileExistsError:
        pass
    fsync_dir(gen)
    _note(gen, "submitted")
    return rec


def _ensure_marker(gen: Path, view: View) -> str:
    """The current marker's name; rolls a half-done begin forward (see module docstring)."""
    if view.marker is not None:
        return view.marker
    if view.state != "submitted":
        raise Conflict(f"{gen}: the attempt has no state to move from")
    name = marker_name("submitted")
    try:
        link_no_replace(gen / record_name("submitted"), gen / name)
    except FileExistsError:
        return name
    except FileNotFoundError:
        raise Conflict(f"{gen}: the intent record vanished") from None
    # If someone moved past "submitted" before our link, its marker exists now: back out.
    if any(_MARKER.match(n) and n != name for n in os.listdir(gen)):
        _unlink(gen / name)
        raise Conflict(f"{gen}: the attempt moved on while its marker was restored")
    fsync_dir(gen)
    return name


def transition(
    gen: Path, to: GenState, by: str, *, expect: GenState | None = None, **fields: Any
) -> StateRecord:
    """Move the attempt from ``expect`` to ``to`` (compare-and-set); :class:`Conflict` if another won.

    ``expect`` is the state the caller's decision was based on (``None``: whatever
    is current now). ``fields`` update the record (``provider_job_id=...``,
    ``reason=...``); everything else carries forward from the current record.
    """
    view = read(gen)
    cur = view.state
    if cur is None or view.record is None:
        raise Conflict(f"{gen}: the attempt has not begun")
    if expect is not None and cur != expect:
        raise Conflict(f"{gen}: the attempt is {cur}, not {expect}: another contender moved it first")
    if to not in NEXT[cur]:
        raise Conflict(f"{gen}: cannot move from {cur} to {to} (forward only)")
    base = msgspec.structs.asdict(view.record)
    base.update(fields)
    base.update(state=to, from_state=cur, at=now(), by=by)
    rec = msgspec.convert(base, StateRecord, from_attributes=True)
    name = record_name(to)
    data = encode(rec)
    try:
        write_atomic(gen / name, data, replace=False, folder_later=True)
    except FileExistsError:
        other = _load(gen / name)
        if other is not None and other.from_state == cur:
            raise Conflict(f"{gen}: another contender is moving this attempt to {to}") from None
        # An orphan of a transition that lost or never completed: its name is free to take.
        _unlink(gen / name)
        try:
            write_atomic(gen / name, data, replace=False, folder_later=True)
        except FileExistsError:
            raise Conflict(f"{gen}: another contender is moving this attempt to {to}") from None
    try:
        src = _ensure_marker(gen, view)
        os.rename(gen / src, gen / marker_name(to))
    except Conflict:
        _unlink(gen / name)
        raise
    except OSError as exc:
        if exc.errno not in VANISHED:
            raise
        _unlink(gen / name)
        raise Conflict(f"{gen}: another contender moved this attempt out of {cur} first") from None
    fsync_dir(gen)
    _note(gen, to)
    return rec


def finish_pending(gen: Path, view: View) -> StateRecord | None:
    """Complete a decided transition whose writer died between its record and the marker.

    Returns the record now current, or ``None`` if nothing was pending (or another contender
    finished it first).
    """
    if not view.pending or view.state is None:
        return None
    # At most two can be pending (the next state and failed); failure is the safer choice.
    target = "failed" if "failed" in view.pending else next(iter(view.pending))
    try:
        src = _ensure_marker(gen, view)
        os.rename(gen / src, gen / marker_name(target))
    except Conflict:
        return None
    except OSError as exc:
        if exc.errno not in VANISHED:
            raise
        return None
    fsync_dir(gen)
    return view.pending[target]


def save_progress(gen: Path, progress: Progress) -> None:
    """Rewrite ``progress.json`` (not fsynced: a hint; see the module docstring)."""
    write_atomic(gen / "progress.json", encode(progress), durable=False)


def log_create(gen: Path, request: CreateRequest) -> None:
    """Make create request ``k`` durable BEFORE it is sent; :class:`Conflict` if ``k`` was
    taken (another contender is sending it: the loser sends nothing)."""
    make_dirs(gen)
    try:
        write_atomic(gen / f"create-{request.k}.json", encode(request), replace=False)
    except FileExistsError:
        raise Conflict(f"{gen}: create request {request.k} was logged by another contender") from None


def log_create_result(gen: Path, result: CreateResult) -> None:
    """What became of create request ``k`` (durable: the workflow's evidence after a crash)."""
    try:
        write_atomic(gen / f"create-{result.k}.{result.outcome}.json", encode(result), replace=False)
    except FileExistsError:
        pass  # the same outcome, recorded before a crash: once is enough


def record_late(gen: Path, late: LateCompletion) -> bool:
    """Keep a late provider result for audit (first one wins); never a transition."""
    try:
        write_atomic(gen / "late-completion.json", encode(late), replace=False)
    except FileExistsError:
        return False
    return True


def input_hash(input: dict[str, Any]) -> str:
    """sha256 of the frozen input's canonical JSON (recorded in the intent)."""
    return hashlib.sha256(canonical_json(input)).hexdigest()
