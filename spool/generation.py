"""The six durable states of a generation attempt, and what to do after a crash.

A generation attempt (SPEC section 8) moves forward only::

    submitted -> generating -> retrieving -> stored -> indexed
         \\____________\\_____________\\__________\\______> failed

Everything lives in ``attempts/<job>/<n>/gen/`` and is legible with ``ls``::

    1-submitted.json      the intent: idempotency key, provider, model, input hash, deadline
    2-generating.json     the provider's job ID, made durable right after the create
    3-retrieving.json     the output URL the provider gave
    4-stored.json         sha256 and size of the verified file in the store
    5-indexed.json        the asset index has it
    6-failed.json         why, and the next action
    state.3-retrieving    the marker: exactly one, naming the current state
    poll.json             poll count, last provider status, next poll time, bytes (a hint)
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
recovery can finish it (that is how a provider job ID written just before a
crash is never lost). Each record carries forward the fields of the one
before, so the current state's record holds everything.

The ``submitted`` record is the intent: it is durable *before* the create
request is sent (:func:`begin`), and the provider's ID is durable right after
it (the transition to ``generating``). :func:`after_crash` decides what a
resumed attempt does from what the files say: look the job up, adopt it,
poll it, download it again from the same URL, or fail with "check the
provider; spool retry submits again" -- never a blind resubmit.

``poll.json`` is rewritten on every poll without fsync: it is a hint for
scheduling and observing (losing it only means an earlier poll), never
evidence for a transition.
"""

from __future__ import annotations

import hashlib
import os
import re
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

import msgspec

from .errors import SpoolError
from .faults import crashpoint
from .model import Record, canonical_json, decode, encode, now
from .polling import Persisted
from .tree import VANISHED, fsync_dir, link_no_replace, make_dirs, read_retrying, temp_name, write_atomic

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

#: The next action when a create's fate cannot be told (SPEC section 8).
CHECK_PROVIDER = "check the provider; spool retry submits again"


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
    """What the attempt is about to ask for; durable before the create request."""

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


class StateRecord(Record, kw_only=True):
    """The record of entering a state; carries forward everything known so far."""

    state: GenState
    from_state: GenState | None = None
    at: datetime
    #: Worker identity that made the transition.
    by: str
    intent: Intent
    provider_job_id: str | None = None
    provider_status: str | None = None
    output_url: str | None = None
    sha256: str | None = None
    bytes_retrieved: int = 0
    reason: str | None = None
    next_action: str | None = None


class PollProgress(Record, kw_only=True):
    """Per-poll bookkeeping (a hint: rewritten on every poll without fsync)."""

    polls: int = 0
    last_provider_status: str | None = None
    #: Unix time of the next eligible poll (the scheduler is rebuilt from these).
    next_poll_at: float | None = None
    bytes_retrieved: int = 0
    rate_limited: int = 0
    errors: int = 0
    updated_at: float | None = None


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
    poll: PollProgress | None = None
    #: Every record on disk by state (history, for ``spool show``).
    records: dict[str, StateRecord] = field(default_factory=dict)

    @property
    def intent(self) -> Intent | None:
        return self.record.intent if self.record else None

    @property
    def final(self) -> bool:
        return self.state in FINAL_STATES


#: What this process last wrote or read of each generation attempt, by job ID:
#: (attempt, state). The metrics gauge counts the daemon's own generations from it
#: instead of a listing of ``attempts/J/`` and a file check of ``gen/`` each at
#: every write (10,000 in flight cost 0.3 s of CPU per write on a local disk, and
#: seconds of round trips on a NAS). Terminal states leave it, so it holds at most
#: the generations in flight. It lags only a move made by another process (a
#: contender on another host), until this one next reads the attempt.
_known: dict[str, tuple[int, str]] = {}
_known_lock = threading.Lock()


def _note(gen: Path, state: str | None) -> None:
    """Remember the state of the attempt whose ``gen/`` this is (see :data:`_known`)."""
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
        else:
            _known[jid] = (n, state)


def known_state(job_id: str) -> tuple[int, str] | None:
    """(attempt, state) of a generation this process is moving, from memory; ``None``
    if it moves none for this job (ask the files: :func:`current_state`)."""
    return _known.get(job_id)


def gen_dir(attempt_dir: Path) -> Path:
    return Path(attempt_dir) / "gen"


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


def read(gen: Path) -> View:
    """The attempt's state from its files; pure reading, no repair."""
    try:
        names = os.listdir(gen)
    except FileNotFoundError:
        return View(dir=gen, state=None, record=None, marker=None)
    markers = sorted(
        ((int(m.group("k")), m.group("state"), n) for n in names if (m := _MARKER.match(n))),
        reverse=True,
    )
    records: dict[str, StateRecord] = {}
    for n in names:
        m = _RECORD.match(n)
        if m and m.group("state") in ORDINAL:
            rec = _load(gen / n)
            if rec is not None:
                records[rec.state] = rec
    poll = None
    try:
        poll = decode(read_retrying(gen / "poll.json"), PollProgress)
    except (FileNotFoundError, msgspec.DecodeError, msgspec.ValidationError):
        pass
    if markers:
        # More than one marker only if a begin was rolled forward late; the highest is current.
        _, state, marker = markers[0]
    elif "submitted" in records:
        state, marker = "submitted", None  # a crash between the intent record and its marker
    else:
        return View(dir=gen, state=None, record=None, marker=None, poll=poll, records=records)
    current: GenState = state  # type: ignore[assignment]
    _note(gen, current)
    pending = {s: r for s, r in records.items() if r.from_state == current and s in NEXT[current]}
    orphans = [
        record_name(s)
        for s, r in records.items()
        if s != current and s not in pending and not _on_path(records, current, s)
    ]
    return View(
        dir=gen,
        state=current,
        record=records.get(current),
        marker=marker,
        pending=pending,
        orphans=orphans,
        poll=poll,
        records=records,
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


def _write_temp(gen: Path, name: str, data: bytes) -> Path:
    tmp = gen / temp_name(name)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)
    return tmp


def _link(src: Path, dst: Path) -> None:
    """``os.link`` that fails with ``FileExistsError`` when ``dst`` exists (tree's fallback included)."""
    link_no_replace(src, dst)


def _unlink(path: Path) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def begin(gen: Path, intent: Intent, by: str) -> StateRecord:
    """Make the intent durable (state ``submitted``) BEFORE the create request.

    Exclusive: a second ``begin`` of the same attempt raises :class:`Conflict`.
    """
    make_dirs(gen)
    rec = StateRecord(state="submitted", at=now(), by=by, intent=intent)
    tmp = _write_temp(gen, record_name("submitted"), encode(rec))
    try:
        try:
            _link(tmp, gen / record_name("submitted"))
        except FileExistsError:
            raise Conflict(f"{gen}: this attempt was already submitted (1-submitted.json exists)") from None
        try:
            _link(tmp, gen / marker_name("submitted"))
        except FileExistsError:
            pass
    finally:
        _unlink(tmp)
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
        _link(gen / record_name("submitted"), gen / name)
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
    tmp = _write_temp(gen, name, encode(rec))
    try:
        try:
            _link(tmp, gen / name)
        except FileExistsError:
            other = _load(gen / name)
            if other is not None and other.from_state == cur:
                raise Conflict(f"{gen}: another contender is moving this attempt to {to}") from None
            # An orphan of a transition that lost or never completed: its name is free to take.
            _unlink(gen / name)
            try:
                _link(tmp, gen / name)
            except FileExistsError:
                raise Conflict(f"{gen}: another contender is moving this attempt to {to}") from None
    finally:
        _unlink(tmp)
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


def save_poll(gen: Path, progress: PollProgress) -> None:
    """Rewrite ``poll.json`` (not fsynced: a hint; see the module docstring)."""
    write_atomic(gen / "poll.json", encode(progress), durable=False)


def record_late(gen: Path, late: LateCompletion) -> bool:
    """Keep a late provider result for audit (first one wins); never a transition."""
    try:
        write_atomic(gen / "late-completion.json", encode(late), replace=False)
    except FileExistsError:
        return False
    return True


# -- deciding --------------------------------------------------------------------------

Action = Literal[
    "begin", "find", "adopt", "create", "wait", "poll", "cancel", "download", "index", "done", "fail"
]


@dataclass(frozen=True)
class Decision:
    """What a resumed attempt does next, and why (for the journal and ``spool show``)."""

    action: Action
    reason: str
    provider_job_id: str | None = None
    next_action: str | None = None


def after_crash(
    view: View,
    *,
    now: float,
    can_find: bool,
    lookup: Any = None,
    settle: float = 30.0,
) -> Decision:
    """The next step for an attempt found in ``view`` after a restart or a takeover. Pure.

    ``lookup`` is the :class:`spool.providers.Lookup` of a ``find`` done for this
    view (``None`` when none was done yet). ``settle``: seconds a provider's
    listing may lag behind a create; "not found" sooner than that is not yet
    evidence.
    """
    state = view.state
    rec = view.record
    if state is None or rec is None:
        return Decision("begin", "nothing was submitted: the intent record does not exist")
    if state in FINAL_STATES:
        return Decision("done", f"the attempt is {state}")
    expired = now >= rec.intent.deadline_at
    if view.pending:
        target = "failed" if "failed" in view.pending else next(iter(view.pending))
        pend = view.pending[target]
        return Decision(
            "adopt" if target == "generating" else ("fail" if target == "failed" else _resume(target)),
            f"a transition to {target} was decided before the crash; finish it",
            provider_job_id=pend.provider_job_id,
            next_action=pend.next_action,
        )
    if state == "submitted":
        if lookup is None:
            if not can_find:
                return Decision(
                    "fail",
                    "the create request's reply was lost and the provider offers no way to find the job",
                    next_action=CHECK_PROVIDER,
                )
            return Decision("find", "the create request's reply was lost: look the job up first")
        outcome = getattr(lookup, "outcome", None)
        if outcome == "found":
            return Decision("adopt", "the provider has the job this attempt created", lookup.job.id)
        if outcome == "none":
            if now - rec.intent.intent_at < settle:
                return Decision("wait", "not listed yet; the provider's listing may lag a fresh create")
            if expired:
                return Decision(
                    "fail", "the deadline passed before the job was submitted", next_action="spool retry"
                )
            return Decision(
                "create", "the provider's listing since the intent has no such job: submit it now"
            )
        why = {
            "ambiguous": "more than one provider job matches the frozen input",
            "unsupported": "the provider offers no way to find the job",
        }.get(str(outcome), "the provider's answer could not tell")
        return Decision("fail", why, next_action=CHECK_PROVIDER)
    if state == "generating":
        if expired:
            return Decision("cancel", "the attempt's deadline has passed", rec.provider_job_id)
        return Decision("poll", "keep polling the same provider job (never resubmit)", rec.provider_job_id)
    return Decision(_resume(state), f"resume {state}", rec.provider_job_id)


def _resume(state: str) -> Action:
    return {"retrieving": "download", "stored": "index", "generating": "poll"}.get(state, "done")  # type: ignore[return-value]


def is_abandoned(view: View) -> bool:
    """Whether a provider result for this attempt may only be recorded, never used."""
    return view.state == "failed"


# -- submit once ------------------------------------------------------------------------


def input_hash(input: dict[str, Any]) -> str:
    """sha256 of the frozen input's canonical JSON (what ``find`` compares against)."""
    return hashlib.sha256(canonical_json(input)).hexdigest()


def submit(
    gen: Path,
    provider: Any,
    input: dict[str, Any],
    by: str,
    *,
    reserve: Any = None,
    release: Any = None,
) -> StateRecord:
    """Send the create of an attempt that is ``submitted`` and record the provider's ID.

    Order (the "submit once" rule): the intent is already durable (:func:`begin`);
    ``reserve()`` (the spending guard) is called and may refuse; the create is
    sent; the provider's ID is made durable by the transition to ``generating``.
    A :class:`spool.providers.ProviderError` propagates: ``retryable`` ones that
    certainly never reached the provider (``connect``, ``rate_limited``) give the
    reservation back via ``release(token)``; an ``ambiguous`` one leaves the
    attempt ``submitted`` for :func:`after_crash` (find, never resubmit).
    """
    view = read(gen)
    if view.state != "submitted" or view.record is None:
        raise Conflict(f"{gen}: only a submitted attempt sends its create (it is {view.state})")
    intent = view.record.intent
    token = reserve() if reserve is not None else None
    try:
        job = provider.create(intent.model, input, key=intent.key)
    except Exception as exc:
        if (
            release is not None
            and token is not None
            and getattr(exc, "code", None) in ("connect", "rate_limited")
        ):
            release(token)
        raise
    crashpoint("after_gen_create")  # the provider made the job; its ID is not durable yet
    return transition(
        gen, "generating", by, expect="submitted", provider_job_id=job.id, provider_status=job.raw_status
    )


# -- the poll schedule after a restart ----------------------------------------------------


def poll_entry(view: View, now: float) -> Persisted | None:
    """The scheduler entry of an attempt waiting at its provider, from its files.

    Only ``generating`` attempts are polled. Without a ``poll.json`` (lost with a
    crash: it is not fsynced) the attempt is due at once; the deadline comes
    from the intent.
    """
    if view.state != "generating" or view.record is None:
        return None
    intent = view.record.intent
    poll = view.poll or PollProgress()
    return Persisted(
        key=intent.key,
        provider=intent.provider,
        next_poll_at=poll.next_poll_at if poll.next_poll_at is not None else now,
        polls=poll.polls,
        deadline=intent.deadline_at,
    )


def poll_entries(gen_dirs: Iterable[Path], now: float) -> Iterator[Persisted]:
    """:func:`poll_entry` of each attempt (the daemon passes its running jobs' current attempts)."""
    for gen in gen_dirs:
        entry = poll_entry(read(gen), now)
        if entry is not None:
            yield entry
