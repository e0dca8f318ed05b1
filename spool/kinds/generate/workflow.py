"""The generation workflow: one step function, ``(state, evidence) -> (effect, next state)``.

:func:`decide` is the whole policy of a generation attempt, and it is pure: it
reads the attempt's durable state (:mod:`.states`: the current record, the
create log, the progress hint), the evidence of the effect just performed (a
create's reply, a lookup, a poll, a download), and the provider's policy, and
returns the one effect to perform next. :mod:`.runner` performs effects and
feeds their evidence back. After a crash or a restart there is no evidence in
hand, and the same function decides from what the files recorded: recovery is
this function, not a second table.

How an attempt reads, top to bottom::

    begin         the intent is durable before any create (or: inherit the previous
                  attempt's provider job, whose paid result is kept; the intent records
                  the inheritance, so a crash before generating finishes it, never creates)
    create        create request k is durable in the create log, the spending guard
                  reserves it, then it is sent; at most one create the provider may have
                  acted on: after an ambiguous reply (timeout, 5xx, malformed, lost) the
                  attempt looks the job up and never sends again unless the provider
                  proves the request made nothing (then with backoff, at most RECREATES
                  times, before the deadline); a refused request (429, connection
                  refused) is sent again with backoff, all requests bounded by the
                  create policy's attempts and the deadline
    adopt         a job found by the lookup is adopted only if it is the only candidate,
                  made after the intent (clock skew allowed) and no other attempt of any
                  job in this spool recorded it (the ledger); otherwise the attempt fails
                  as "ambiguous create: check the provider", naming the window, the request
                  and the candidates
    poll          until the provider says succeeded (with a video), failed or canceled, with
                  full-jitter backoff; every status counts against the deadline except the
                  provider's own queue (Runway THROTTLED, up to queue_deadline)
    deadline      at the deadline one last look: a success is taken; anything else is
                  cancelled at the provider (never a finished job) and the attempt fails
    retrieve      download (whole-transfer limit, minimum rate, abortable), refresh an
                  expired URL by fetching the job again, the validation gate, publish;
                  within the deadline plus the download grace; a failure after the provider
                  reported success keeps the paid result for the next attempt

Effects are a closed set of small records (:data:`Effect`); each names what the
runner does. A :class:`Wait` never runs past the deadline: the attempt is woken
at the deadline to end it.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Literal

from spool.kinds.generate.retries import RECREATES, RetryPolicy
from spool.kinds.generate.states import Create, Intent, Result, View

if TYPE_CHECKING:  # the HTTP side (httpx) loads only where a provider is called
    from spool.kinds.generate.providers.base import Lookup, ProviderError, RemoteJob

#: The next action of an attempt whose create may have made a job spool cannot identify.
CHECK_PROVIDER = (
    "Check the provider's dashboard for a job made in that window; if there is none, "
    "spool retry --yes submits again (and may cost); if there is one, cancel it there or wait for it"
)
#: Clock skew allowed between spool's intent time and a provider's ``created_at`` when the
#: provider's clock was never measured (its replies carry no ``Date``); measured: 2 s.
SKEW_UNMEASURED = 300.0
SKEW_MEASURED = 2.0


# -- the provider's policy, as the workflow needs it ---------------------------------------


@dataclass(frozen=True)
class Policy:
    """A provider's settings and retry table (from ``[providers.<name>]``)."""

    provider: str
    deadline: float
    queue_deadline: float
    grace: float
    retention: float | None
    settle: float
    first_poll: float
    retry_after_max: float
    auto_retry_ambiguous: bool
    can_find: bool
    retries: dict[str, RetryPolicy]


# -- evidence: what the effect just performed returned --------------------------------------


@dataclass(frozen=True)
class Found:
    """A lookup's answer for create ``k``: the listing, and who (per the ledger) already
    recorded each match (``None``: nobody; ``"self"``: this attempt)."""

    k: int
    lookup: Lookup
    owners: dict[str, str | None]
    #: The provider's clock minus ours, measured on the listing's replies.
    clock_offset: float | None


@dataclass(frozen=True)
class FindFailed:
    k: int
    error: ProviderError


@dataclass(frozen=True)
class Polled:
    job: RemoteJob


@dataclass(frozen=True)
class PollFailed:
    error: ProviderError


@dataclass(frozen=True)
class Cancelled:
    """A cancel was asked (or skipped, ``why``) before the attempt fails with ``then``."""

    then: Fail
    why: str = ""


@dataclass(frozen=True)
class DownloadFailed:
    code: str
    problem: str
    retryable: bool
    retry_after: float | None = None


@dataclass(frozen=True)
class Refreshed:
    """The provider job fetched again for a fresh output URL (``job`` ``None``: it is gone)."""

    job: RemoteJob | None
    problem: str = ""


@dataclass(frozen=True)
class Downloaded:
    """The output is in ``work/``, hashed and fsynced."""

    size: int


Evidence = Found | FindFailed | Polled | PollFailed | Cancelled | DownloadFailed | Refreshed | Downloaded


# -- effects: what to do next ----------------------------------------------------------------


@dataclass(frozen=True)
class Begin:
    """Make the intent durable (state ``submitted``)."""


@dataclass(frozen=True)
class Inherit:
    """Begin with the previous attempt's provider job (``generating``), or its create log."""

    from_attempt: int
    intent: Intent
    provider_job_id: str | None
    creates: tuple[Create, ...] = ()


@dataclass(frozen=True)
class SendCreate:
    """Log create request ``k`` durably, reserve it with the spending guard, send it."""

    k: int


@dataclass(frozen=True)
class Find:
    """List the provider's jobs since the intent, for create request ``k``."""

    k: int
    since: float


@dataclass(frozen=True)
class Adopt:
    """Enter ``provider_job_id`` in the ledger and move to ``generating`` with it."""

    provider_job_id: str
    how: Literal["created", "adopted"]


@dataclass(frozen=True)
class Unmade:
    """Record that the provider proved create request ``k`` made nothing."""

    k: int


@dataclass(frozen=True)
class Poll:
    provider_job_id: str


@dataclass(frozen=True)
class Cancel:
    """Cancel the provider job where that is safe (never one seen finished), then fail."""

    provider_job_id: str
    then: Fail
    #: The last status seen; ``None``: look first.
    seen: str | None = None


@dataclass(frozen=True)
class ToRetrieving:
    output_url: str
    provider_status: str


@dataclass(frozen=True)
class Retrieve:
    """Download the output (a transfer: the driver runs it on a transfer thread)."""

    url: str


@dataclass(frozen=True)
class Refresh:
    """Fetch the provider job again for a fresh output URL."""

    provider_job_id: str


@dataclass(frozen=True)
class Publish:
    """The validation gate, then the one publish path (``stored``, ``indexed``, ``complete/``)."""


@dataclass(frozen=True)
class Wait:
    until: float
    #: What the attempt waits for (the progress hint and the journal say it).
    why: str
    #: The provider answered with 429/5xx: the whole provider waits (back-pressure).
    pressure: bool = False


@dataclass(frozen=True)
class Defer:
    """End the attempt without any create: the job waits in ``pending/`` until ``until``
    (the provider's quota, the spending guard lost a race); ``pause`` closes the
    provider's pool until then."""

    until: float
    reason: str
    pause: bool = False


@dataclass(frozen=True)
class Fail:
    """End the attempt with a located failure (``stage`` and ``property`` as in SPEC 6)."""

    stage: str
    property: str
    message: str
    next_action: str
    expected: str | None = None
    actual: str | None = None
    retryable: bool = False
    #: What is left of a result the provider reported ready (see :data:`.states.Result`).
    result: Result = "none"
    fault: Literal["job", "host"] = "job"


Effect = (
    Begin | Inherit | SendCreate | Find | Adopt | Unmade | Poll | Cancel | ToRetrieving | Retrieve
    | Refresh | Publish | Wait | Defer | Fail
)  # fmt: skip


@dataclass(frozen=True)
class Step:
    effect: Effect
    #: Why, in a phrase (the journal's reason for a transition).
    why: str = ""


@dataclass
class Facts:
    """Everything :func:`decide` may look at."""

    now: float
    job_id: str
    attempt: int
    view: View
    policy: Policy
    rng: random.Random
    evidence: Evidence | None = None
    #: When the state is ``None``: what the previous attempt leaves this one (see :class:`Inherit`).
    inheritable: Inherit | None = None
    #: The provider's back-pressure: none of its requests before this time.
    blocked_until: float | None = None
    #: The current output URL (a refreshed one, else the retrieving record's).
    output_url: str | None = None
    extras: dict[str, object] = field(default_factory=dict)


# -- the step function -----------------------------------------------------------------------


def decide(f: Facts) -> Step:
    """The next effect for the attempt in ``f`` (see the module docstring). Pure."""
    v = f.view
    if v.state is None:
        if f.inheritable is not None:
            return Step(f.inheritable, f"carry on with attempt {f.inheritable.from_attempt}'s provider job")
        return Step(Begin(), "the intent is made durable before any create request")
    rec = v.record
    assert rec is not None
    if v.state == "failed":
        return Step(_from_record(rec.reason, rec.next_action), "the attempt had already failed")
    due = v.progress.next_at if v.progress else None
    if f.evidence is None and due is not None and f.now < due:
        return Step(Wait(due, "not due yet"), "")  # the schedule the files keep, after a restart
    if v.state == "submitted":
        return _submitted(f)
    if v.state == "generating":
        return _generating(f)
    return _retrieving(f)  # retrieving, stored, indexed (a crash before complete/: publish again)


def _submitted(f: Facts) -> Step:
    v = f.view
    assert v.record is not None
    rec = v.record
    if rec.how == "inherited" and rec.provider_job_id is not None and rec.inherited_from is not None:
        # The intent recorded the previous attempt's provider job: a crash came before the
        # move to generating. Finish that inheritance; a create here would pay twice.
        inherit = Inherit(rec.inherited_from, rec.intent, rec.provider_job_id)
        return Step(inherit, f"finish carrying on with attempt {rec.inherited_from}'s provider job")
    intent = rec.intent
    creates = v.creates
    last = creates[-1] if creates else None
    if last is not None and last.outcome is not None and last.outcome.outcome == "made":
        pid = last.outcome.provider_job_id
        assert pid is not None
        return Step(Adopt(pid, "created"), f"create request {last.k} made provider job {pid}")
    if last is not None and (last.outcome is None or last.outcome.outcome == "ambiguous"):
        return _settle(f, last)
    # Nothing this attempt sent may have made a job: it may send (again).
    create = f.policy.retries["create"]
    if create.exhausted(len(creates)):
        return _fail_create_refused(f, creates)
    if sum(1 for c in creates if c.outcome is not None and c.outcome.outcome == "unmade") > RECREATES:
        return Step(_ambiguous(f, last, f"{RECREATES + 1} create requests got no clear answer"), "")
    if f.now >= intent.deadline_at:
        return Step(_deadline_before_create(f), "the deadline passed before a create could be sent")
    if last is not None and last.outcome is not None and last.outcome.final:
        return Step(_create_refused_final(f, last), "")
    at = f.now
    if last is not None and last.outcome is not None:  # refused, or proven unmade: back off first
        wait = create.wait(len(creates) - 1, f.rng, last.outcome.retry_after, f.policy.retry_after_max)
        at = max(at, last.outcome.at + wait)
    if f.blocked_until is not None:
        at = max(at, f.blocked_until)
    if at >= intent.deadline_at:
        return Step(_deadline_before_create(f), "the next create could only be sent after the deadline")
    if at > f.now:
        return Step(Wait(at, f"create request {len(creates) + 1} is sent at its backoff"), "")
    return Step(SendCreate(len(creates) + 1), f"create request {len(creates) + 1}")


def _settle(f: Facts, last: Create) -> Step:
    """Create ``last`` may have made a job: find it, adopt it, prove it unmade, or fail."""
    v = f.view
    assert v.record is not None
    intent = v.record.intent
    k = last.k
    if not f.policy.can_find:
        return Step(_ambiguous(f, last, "the provider offers no listing to look the job up"), "")
    age = f.now - last.request.sent_at
    if f.policy.retention is not None and age >= f.policy.retention:
        return Step(
            _ambiguous(
                f, last, f"the request is older than the provider's retention ({f.policy.retention:g} s): "
                "its listing no longer shows inputs that old"
            ),
            "",
        )  # fmt: skip
    ev = f.evidence
    if isinstance(ev, Found) and ev.k == k:
        return _judge(f, last, ev)
    if isinstance(ev, FindFailed) and ev.k == k:
        tries = v.progress.tries if v.progress else 1  # the runner counted this failure
        find = f.policy.retries["find"]
        if ev.error.code in find.final or find.exhausted(tries):
            why = (
                f"the provider's listing failed {tries} time{'s' if tries != 1 else ''} ({ev.error.problem})"
            )
            return Step(_ambiguous(f, last, why), "")
        at = f.now + find.wait(tries, f.rng, ev.error.retry_after, f.policy.retry_after_max)
        if at >= intent.deadline_at:
            return Step(
                _ambiguous(f, last, f"the listing failed until the deadline ({ev.error.problem})"), ""
            )
        return Step(
            Wait(at, f"the listing failed ({ev.error.code}); looking again", ev.error.back_pressure), ""
        )
    if f.now >= intent.deadline_at:
        return Step(_ambiguous(f, last, "the deadline passed before the provider could tell"), "")
    if f.blocked_until is not None and f.blocked_until > f.now:
        return Step(Wait(min(f.blocked_until, intent.deadline_at), "the provider asked to wait"), "")
    return Step(Find(k, since=intent.intent_at), f"create request {k} may have made a job: look it up")


def skew(clock_offset: float | None) -> float:
    """How far a provider's timestamp may sit before ours and still be "after the intent"."""
    return SKEW_UNMEASURED if clock_offset is None else SKEW_MEASURED


def _judge(f: Facts, last: Create, ev: Found) -> Step:
    """The adoption rule on a lookup's answer."""
    v = f.view
    assert v.record is not None
    intent = v.record.intent
    look = ev.lookup
    if not look.supported:
        return Step(_ambiguous(f, last, look.why or "the provider cannot list its jobs"), "")
    offset = ev.clock_offset or 0.0
    earliest = intent.intent_at - skew(ev.clock_offset)
    ours = [m.id for m in look.matches if ev.owners.get(m.id) == "self"]
    if ours:  # entered in the ledger by this attempt before a crash: it is ours
        return Step(Adopt(ours[0], "adopted"), f"provider job {ours[0]} is in the ledger for this attempt")

    def since_intent(job: RemoteJob) -> bool:
        made = _epoch(job.created_at)
        return made is not None and made - offset >= earliest

    candidates, elsewhere, older = [], [], []
    for m in look.matches:
        if ev.owners.get(m.id):
            elsewhere.append(f"{m.id} ({ev.owners[m.id]})")
        elif not since_intent(m):
            older.append(m.id)
        else:
            candidates.append(m.id)
    if not look.covered:
        why = look.why or "the listing did not reach back to the intent"
        return Step(_ambiguous(f, last, why, candidates), "")
    unknown = [u.id for u in look.unknown if since_intent(u)]
    if unknown:
        shown = ", ".join(unknown[:5]) + (" ..." if len(unknown) > 5 else "")
        why = f"the listing does not show the input of {len(unknown)} job(s) made since the intent: {shown}"
        return Step(_ambiguous(f, last, why, candidates), "")
    if len(candidates) == 1:
        return Step(Adopt(candidates[0], "adopted"), f"provider job {candidates[0]} is the only candidate")
    if candidates:
        return Step(_ambiguous(f, last, f"{len(candidates)} jobs match the frozen input", candidates), "")
    # Proven: the listing covered the window, shows every input, and none is ours.
    settle_at = last.request.sent_at + f.policy.settle
    if f.now < settle_at:
        return Step(Wait(min(settle_at, intent.deadline_at), "the listing may lag a fresh create"), "")
    notes = []
    if elsewhere:
        notes.append(f"recorded by other attempts: {', '.join(elsewhere)}")
    if older:
        notes.append(f"made before the intent: {', '.join(older)}")
    extra = f" ({'; '.join(notes)})" if notes else ""
    return Step(Unmade(last.k), f"the provider's listing proves create request {last.k} made nothing{extra}")


def _generating(f: Facts) -> Step:
    v = f.view
    rec = v.record
    assert rec is not None and rec.provider_job_id is not None
    pid = rec.provider_job_id
    prog = v.progress
    queued = min(prog.queued_seconds if prog else 0.0, f.policy.queue_deadline)
    deadline = rec.intent.deadline_at + queued
    ev = f.evidence
    if isinstance(ev, Cancelled):
        return Step(ev.then, ev.why)
    if isinstance(ev, Polled):
        job = ev.job
        if job.status == "succeeded":
            if job.outputs:
                return Step(
                    ToRetrieving(job.outputs[0], job.raw_status), f"provider job {pid} {job.raw_status}"
                )
            return Step(_no_video(f, pid, job.output_problem or "no output"), "")
        if job.status in ("failed", "canceled"):
            return Step(_provider_failed(f, pid, job), "")
        if f.now >= deadline:
            return Step(Cancel(pid, _deadline(f, job.raw_status), seen=job.raw_status), "the deadline passed")
        wait = f.policy.retries["poll"].wait(prog.polls if prog else 1, f.rng)
        return Step(Wait(min(f.now + wait, deadline), f"provider says {job.raw_status}"), "")
    if isinstance(ev, PollFailed):
        e = ev.error
        if e.code in f.policy.retries["poll"].final:
            return Step(_lost(f, pid, e), "")
        if f.now >= deadline:
            return Step(Cancel(pid, _deadline(f, f"unanswered ({e.code})")), "the deadline passed")
        tries = prog.tries if prog else 1  # consecutive failed polls, counted by the runner
        at = f.now + f.policy.retries["poll"].wait(tries, f.rng, e.retry_after, f.policy.retry_after_max)
        if f.blocked_until is not None:
            at = max(at, f.blocked_until)
        return Step(Wait(min(at, deadline), f"the poll failed ({e.code})", e.back_pressure), "")
    if f.blocked_until is not None and f.blocked_until > f.now and f.now < deadline:
        return Step(Wait(min(f.blocked_until, deadline), "the provider asked to wait"), "")
    return Step(Poll(pid), "")  # at the deadline too: one last look before giving up


def _retrieving(f: Facts) -> Step:
    v = f.view
    rec = v.record
    assert rec is not None
    pid = rec.provider_job_id or "?"
    url = f.output_url or rec.output_url
    ends = rec.intent.deadline_at + f.policy.grace
    ev = f.evidence
    prog = v.progress
    tries = prog.downloads if prog else 0
    if isinstance(ev, Downloaded):
        return Step(Publish(), f"{ev.size} bytes downloaded and hashed")
    dl = f.policy.retries["download"]
    if isinstance(ev, Refreshed):
        if ev.job is None or not ev.job.outputs:
            # Provably gone: the provider no longer has the job, or its output was removed.
            return Step(_gone(f, pid, ev.problem or "the provider's job has no output any more"), "")
        fresh = ev.job.outputs[0]
        if fresh != url:
            return Step(Retrieve(fresh), "a fresh output URL from the provider")
        # The same URL: not proof it is gone (a 401 may pass); try it again after a backoff.
        at = f.now + dl.wait(tries, f.rng)
        if at >= ends:
            return Step(_kept(f, "provider.download", "the output URL is refused; no time is left"), "")
        return Step(Wait(at, "the output URL was refused; the provider gives the same one"), "")
    if isinstance(ev, DownloadFailed):
        if ev.code == "disk_full":
            return Step(_kept(f, "disk_space", f"the disk filled up during the download ({ev.problem})"), "")
        if dl.exhausted(tries):
            return Step(_kept(f, "provider.download", f"{ev.problem} ({tries} tries)"), "")
        if ev.code == "expired":
            return Step(Refresh(pid), f"the output URL was refused ({ev.problem}): fetch the job again")
        if not ev.retryable or ev.code in dl.final:
            return Step(_kept(f, "provider.download", ev.problem, retryable=ev.code != "too_large"), "")
        at = f.now + dl.wait(tries, f.rng, ev.retry_after, f.policy.retry_after_max)
        if at >= ends:
            return Step(_kept(f, "provider.download", f"{ev.problem}; no time is left for another try"), "")
        return Step(Wait(at, f"download {tries} failed ({ev.code}); again from the same output"), "")
    if f.now >= ends and v.state == "retrieving":  # stored, indexed: verified bytes, finish at once
        why = f"the output was not retrieved within the deadline and download.grace ({f.policy.grace:g} s)"
        return Step(_kept(f, "provider.deadline", why), "")
    if not url:
        return Step(Refresh(pid), "no output URL is recorded")
    return Step(Retrieve(url), "")


# -- failures, located ------------------------------------------------------------------------


def _when(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _ambiguous(f: Facts, last: Create | None, why: str, candidates: list[str] | None = None) -> Fail:
    """The create's fate cannot be told: the located failure an operator acts on."""
    v = f.view
    assert v.record is not None
    if last is None:
        window = f"since {_when(v.record.intent.intent_at)}"
        request = "the create requests"
    else:
        window = f"between {_when(last.request.sent_at)} and {_when(f.now)}"
        request = f"create request {last.k} ({last.request.request}, key {last.request.key})"
    named = f"; candidates: {', '.join(candidates)}" if candidates else ""
    auto = f.policy.auto_retry_ambiguous
    return Fail(
        stage="submit",
        property="provider.create",
        message=f"ambiguous create: check the provider: {request} may have made a job {window}, "
        f"and {why}{named}",
        expected="one provider job for this attempt, or proof of none",
        actual=why,
        next_action=CHECK_PROVIDER
        + ("; auto_retry_ambiguous is on, so spool submits again by itself." if auto else "."),
        retryable=auto,
    )


def _fail_create_refused(f: Facts, creates: list[Create]) -> Step:
    last = creates[-1].outcome if creates else None
    what = (
        f"{last.code} (HTTP {last.http_status})"
        if last and last.http_status
        else (last.code if last else "?")
    )
    return Step(
        Fail(
            stage="submit",
            property="provider.create",
            message=f"the provider refused {len(creates)} create requests (last: {what}); none made a job",
            expected="a create request the provider accepts",
            actual=str(what),
            next_action="Check the provider's status page; spool retries the job by itself while "
            "attempts remain.",
            retryable=True,
        ),
        "",
    )


def _create_refused_final(f: Facts, last: Create) -> Fail:
    out = last.outcome
    assert out is not None
    unauthorized = out.code == "unauthorized"
    return Fail(
        stage="submit",
        property="provider.create",
        message=f"the provider refused the create request ({out.problem}); nothing was made",
        expected="a create request the provider accepts",
        actual=f"HTTP {out.http_status}" if out.http_status else str(out.code),
        next_action=(
            "Check the token this daemon has (the provider's table names its variable)."
            if unauthorized
            else "Read the provider's message; fix the input in a new revision (spool revise)."
        ),
        fault="host" if unauthorized else "job",
    )


def _deadline_before_create(f: Facts) -> Fail:
    return Fail(
        stage="submit",
        property="provider.deadline",
        message=f"the attempt's deadline ([providers.{f.policy.provider}] deadline = "
        f"{f.policy.deadline:g} s) passed before a create request could be sent; nothing was made",
        expected=f"a create within {f.policy.deadline:g} s",
        actual="the provider kept refusing or asking to wait",
        next_action="A longer deadline may help ([providers] deadline).",
        retryable=True,
    )


def _deadline(f: Facts, status: str) -> Fail:
    return Fail(
        stage="generate",
        property="provider.deadline",
        message=f"the generation did not finish within [providers.{f.policy.provider}] deadline "
        f"({f.policy.deadline:g} s); it was cancelled at the provider",
        expected=f"<= {f.policy.deadline:g} s",
        actual=f"still {status}",
        next_action="A longer deadline may help ([providers] deadline).",
        retryable=True,
    )


def _no_video(f: Facts, pid: str, problem: str) -> Fail:
    return Fail(
        stage="generate",
        property="provider.output",
        message=f"provider job {pid} succeeded without a video: {problem}",
        expected="a video URL in the output",
        actual=problem,
        next_action="Set output_key in the provider's table if the model returns an object, then "
        "spool retry --yes (it generates again, and costs); or submit a new revision (spool revise).",
    )


def _provider_failed(f: Facts, pid: str, job: RemoteJob) -> Fail:
    return Fail(
        stage="generate",
        property="provider.status",
        message=f"provider job {pid} ended {job.raw_status}" + (f": {job.error}" if job.error else ""),
        expected="succeeded",
        actual=job.raw_status,
        next_action="Read the provider's message; change the input in a new revision (spool revise), "
        "or spool retry --yes if the cause was temporary (it generates again, and costs).",
    )


def _lost(f: Facts, pid: str, e: ProviderError) -> Fail:
    lost = e.code == "lost"
    return Fail(
        stage="generate",
        property="provider.get",
        message=f"polling provider job {pid} failed: {e.problem}",
        expected="an answer about the job",
        actual=e.code,
        next_action=(
            "The provider does not know this job; spool retry --yes submits again (and costs)."
            if lost
            else f"{(e.next_action or 'Check the provider.').capitalize()}; then spool retry the job."
        ),
        fault="job" if lost else "host",
    )


def _kept(f: Facts, prop: str, why: str, *, retryable: bool = True) -> Fail:
    """A failure after the provider reported success: the paid result is kept."""
    return Fail(
        stage="retrieve",
        property=prop,
        message=f"retrieving the output failed: {why}",
        expected="the output downloaded and verified",
        actual=why,
        next_action="The provider's result is kept: the next attempt downloads it again (no new generation)."
        + (
            ""
            if retryable
            else " Raise [providers] download.max_bytes if the file is expected; then spool retry."
        ),
        retryable=retryable,
        result="kept",
    )


def _gone(f: Facts, pid: str, why: str) -> Fail:
    return Fail(
        stage="retrieve",
        property="provider.output",
        message=f"the output of provider job {pid} is gone: {why}",
        expected="a downloadable output",
        actual="expired",
        next_action="The provider no longer serves it: spool retry --yes generates again (and costs).",
        result="gone",
    )


def _from_record(reason: str | None, next_action: str | None) -> Fail:
    return Fail(
        stage="generate",
        property="generation",
        message=reason or "the generation attempt failed",
        next_action=next_action or "spool retry --yes the job (it generates again).",
    )


def _epoch(value: str | None) -> float | None:
    if not value:
        return None
    try:
        when = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return (when if when.tzinfo else when.replace(tzinfo=UTC)).timestamp()
