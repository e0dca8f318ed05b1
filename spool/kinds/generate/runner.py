"""Performs the generate workflow's effects: provider calls and durable writes.

The daemon's driver calls :meth:`Runner.step` whenever an attempt is due and
:meth:`Runner.transfer` on a transfer thread; both run one loop::

    read the attempt's files -> workflow.decide -> perform the effect -> its evidence

until the effect is a wait (the driver comes back at its time), a retrieval
(handed to a transfer thread), the candidate for the publish path, or an
ending (raised: a :class:`GenFailed`, :class:`spool.core.errors.Deferred`). Every
decision is :func:`.workflow.decide`'s; this module only does what it says,
in the order of writes each effect needs (see each ``_effect`` method), and
records what happened as evidence for the next decision, in memory when the
loop goes on at once and on disk where a crash must not lose it.

One :class:`Runner` serves a process (the kind holds it): the provider clients
(one per ``[providers.<name>]`` table, replaced when the table changes), the
provider back-pressure and the late-completion audits are shared by every
generation the daemon runs.
"""

from __future__ import annotations

import errno
import logging
import random
import threading
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec

from spool.core.errors import ConfigError, Deferred, Failed, Interrupted
from spool.core.faults import crashpoint
from spool.core.model import JobBase, now
from spool.disk.store import sha256_file
from spool.kinds.base import Abort, Gate, Next, Produced
from spool.kinds.generate import admission, ledger, providers, spending, states, workflow
from spool.kinds.generate.providers.config import ProviderConfig
from spool.kinds.generate.providers.errors import FINAL, ProviderError
from spool.kinds.generate.retries import Backpressure, policies
from spool.kinds.generate.spec import GenerateJob
from spool.kinds.generate.states import CreateRequest, CreateResult, Progress, View
from spool.queue import cancel

if TYPE_CHECKING:
    from spool.core.config import Config
    from spool.kinds.generate.providers.base import Provider
    from spool.queue.attempt import Attempt
    from spool.queue.context import Context

log = logging.getLogger("spool.generate")

#: Effects one call performs at most before it must have waited or ended (a guard
#: against a decision that never settles; each effect changes the files or the evidence).
MAX_EFFECTS = 32
#: Looks at an abandoned attempt's provider job for a late completion (audit only):
#: at least this many, and for at least this many polling ceilings.
AUDIT_LOOKS = 5
AUDIT_CEILINGS = 2
#: Effects that only gather evidence (and the progress hint): the durable state is unchanged.
LIGHT = (workflow.Find, workflow.Poll, workflow.Cancel, workflow.Retrieve, workflow.Refresh)
#: Seconds a gate's spending count is reused (one listing of the provider's submissions).
GATE_CACHE = 1.0
#: The longest a deferred job waits before it is looked at again (a limit of 0 never frees).
DEFER_MAX = 86400.0


class GenFailed(Failed):
    """A generation attempt's located failure, with what is left of a paid result."""

    def __init__(self, fail: workflow.Fail, note: str = "", *, cancelled: bool = False) -> None:
        message = fail.message + (f" ({note})" if note else "")
        super().__init__(
            fail.stage, fail.property, message, expected=fail.expected, actual=fail.actual,
            next_action=fail.next_action, retryable=fail.retryable, fault=fail.fault,
        )  # fmt: skip
        self.result: states.Result = fail.result
        self.cancelled = cancelled


def _gen(attempt: Attempt) -> Path:
    return states.gen_dir(attempt.dir)


def key_of(job_id: str, n: int) -> str:
    """The idempotency key of an attempt."""
    return f"{job_id}/{n}"


class Runner:
    """The generate kind's effects, for every generation of this process."""

    def __init__(self) -> None:
        self.pressure = Backpressure()
        self.rng = random.Random()
        self._lock = threading.Lock()
        self._clients: dict[str, tuple[ProviderConfig, Provider]] = {}
        self._retired: list[Provider] = []
        self._carried: dict[str, Counter[str]] = {}
        #: provider -> job IDs whose current attempt holds a create reservation or a
        #: provider job (the gate counts the others against the spending allowance).
        self._admitted: dict[str, set[str]] = {}
        #: audit key -> (looks left, look until)
        self._audits: dict[str, tuple[int, float]] = {}
        #: provider -> (when counted, allowance, reservations made by then)
        self._allowance: dict[str, tuple[float, spending.Allowance, int]] = {}
        #: provider -> reservations this process made (the gate subtracts those since its count)
        self._reserves: Counter[str] = Counter()
        #: provider -> (the table, the workflow's policy made from it)
        self._policies: dict[str, tuple[ProviderConfig, workflow.Policy]] = {}
        #: job ID -> seconds its download took (the publish path's "render seconds")
        self._took: dict[str, float] = {}

    # -- clients ---------------------------------------------------------------------------
    def client(self, cfg: Config, name: str) -> Provider:
        """The live client of ``[providers.<name>]``; a changed table gets a new one (the old
        one is closed at :meth:`close`: a download may still stream through it)."""
        table = cfg.provider_configs.get(name)
        if table is None:
            raise ConfigError(f"[providers.{name}]", "is not in spool.toml")
        with self._lock:
            have = self._clients.get(name)
            if have is not None and have[0] == table:
                return have[1]
        fresh = providers.open_provider(table)
        with self._lock:
            have = self._clients.get(name)
            if have is not None and have[0] == table:
                fresh.close()
                return have[1]
            if have is not None:
                self._retired.append(have[1])
                self._carried.setdefault(name, Counter()).update(have[1].counted())
            self._clients[name] = (table, fresh)
        return fresh

    def counters(self) -> dict[str, dict[str, int]]:
        """What the clients did, per provider (requests by operation, errors by code, bytes)."""
        with self._lock:
            live = [(n, c) for n, (_, c) in self._clients.items()]
            out = {n: Counter(c) for n, c in self._carried.items()}
        for name, client in live:
            out.setdefault(name, Counter()).update(client.counted())
        return {n: dict(c) for n, c in out.items()}

    def close(self) -> None:
        with self._lock:
            clients = [c for _, c in self._clients.values()] + self._retired
            self._clients.clear()
            self._retired = []
        for c in clients:
            c.close()

    @staticmethod
    def _unusable(name: str, exc: ConfigError) -> GenFailed:
        """This daemon cannot speak to the provider (no table, no token): the host's fault,
        so the job moves on to a worker that can (:mod:`spool.queue.blocklist`)."""
        return GenFailed(
            workflow.Fail(
                stage="prepare",
                property=f"providers.{name}",
                message=f"this worker cannot use provider {name!r}: {exc}",
                expected=f"[providers.{name}] in spool.toml and its token_env in the daemon's environment",
                actual="missing",
                next_action=f"Configure [providers.{name}] and its token variable for this daemon; "
                "restart it.",
                fault="host",
            )
        )

    def policy(self, table: ProviderConfig, client: Provider) -> workflow.Policy:
        """The workflow's view of a provider's settings (made once per table)."""
        with self._lock:
            got = self._policies.get(table.name)
            if got is not None and got[0] is table:
                return got[1]
        made = workflow.Policy(
            provider=table.name,
            deadline=table.deadline_seconds,
            queue_deadline=table.queue_deadline_seconds,
            grace=table.download.grace,
            retention=table.retention_seconds,
            settle=table.listing_settle,
            first_poll=table.polling.first,
            retry_after_max=table.polling.retry_after_max,
            auto_retry_ambiguous=table.auto_retry_ambiguous,
            can_find=client.can_find,
            retries=policies(table),
        )
        with self._lock:
            self._policies[table.name] = (table, made)
        return made

    # -- the driver's entry points ------------------------------------------------------------
    def step(self, ctx: Context, job: GenerateJob, attempt: Attempt) -> Next:
        return self._run(ctx, job, attempt, None)

    def transfer(self, ctx: Context, job: GenerateJob, attempt: Attempt, abort: Abort) -> Next:
        return self._run(ctx, job, attempt, abort)

    def _run(self, ctx: Context, job: GenerateJob, attempt: Attempt, abort: Abort | None) -> Next:
        name = job.generate.provider
        try:
            client = self.client(ctx.cfg, name)
        except ConfigError as exc:
            raise self._unusable(name, exc) from None
        table = ctx.cfg.provider_configs[name]
        policy = self.policy(table, client)
        gen = _gen(attempt)
        evidence: workflow.Evidence | None = None
        view: View | None = None
        dirty = False  # progress changed in memory, not yet written (a hint: written once a step)
        for _ in range(MAX_EFFECTS):
            if view is None:
                view = states.read(gen)
                if view.pending:  # a decided transition cut off by a crash: finish it first
                    states.finish_pending(gen, view)
                    view = states.read(gen)
                if view.progress is None:
                    view.progress = Progress()
            t = time.time()
            facts = workflow.Facts(
                now=t,
                job_id=job.job_id,
                attempt=attempt.n,
                view=view,
                policy=policy,
                rng=self.rng,
                evidence=evidence,
                inheritable=self._inheritable(ctx, job, attempt, policy) if view.state is None else None,
                blocked_until=self.pressure.until(name, t),
                output_url=view.progress.output_url if view.progress else None,
            )
            step = workflow.decide(facts)
            evidence = None
            eff = step.effect
            if isinstance(eff, workflow.Wait):
                return self._wait(gen, view, eff)
            if isinstance(eff, workflow.Retrieve) and abort is None:
                self._save(gen, view, dirty)
                return Next("transfer")
            if isinstance(eff, workflow.Publish):
                self._save(gen, view, dirty)
                dest = attempt.work / job.output.file
                return Next("publish", produced=Produced(dest, self._took.pop(job.job_id, 0.0)))
            if isinstance(eff, workflow.Fail):
                raise GenFailed(eff)
            if isinstance(eff, workflow.Defer):
                if eff.pause:
                    admission.pause(ctx.tree.root, name, eff.until, eff.reason)
                raise Deferred(min(eff.until, t + DEFER_MAX), eff.reason)
            if isinstance(eff, LIGHT):
                # Evidence only: the durable state is as read, the progress changed in memory.
                evidence = self._perform(ctx, job, attempt, client, policy, view, step, abort)
                dirty = True
            else:
                self._save(gen, view, dirty)
                dirty = False
                evidence = self._perform(ctx, job, attempt, client, policy, view, step, abort)
                view = None  # the effect moved the durable state: read it again
        raise RuntimeError(f"{job.job_id}: the generation workflow did not settle in {MAX_EFFECTS} effects")

    @staticmethod
    def _save(gen: Path, view: View, dirty: bool) -> None:
        if dirty and view.progress is not None:
            view.progress.updated_at = time.time()
            states.save_progress(gen, view.progress)

    def _perform(
        self,
        ctx: Context,
        job: GenerateJob,
        attempt: Attempt,
        client: Provider,
        policy: workflow.Policy,
        view: View,
        step: workflow.Step,
        abort: Abort | None,
    ) -> workflow.Evidence | None:
        eff = step.effect
        gen = _gen(attempt)
        if isinstance(eff, workflow.Begin):
            self._begin(ctx, job, attempt, client, policy)
        elif isinstance(eff, workflow.Inherit):
            self._inherit(ctx, job, attempt, eff)
        elif isinstance(eff, workflow.SendCreate):
            self._send_create(ctx, job, attempt, client, policy, view, eff)
        elif isinstance(eff, workflow.Find):
            return self._find(ctx, job, attempt, client, policy, view, eff)
        elif isinstance(eff, workflow.Adopt):
            self._adopt(ctx, job, attempt, policy, view, eff, step.why)
        elif isinstance(eff, workflow.Unmade):
            states.log_create_result(gen, CreateResult(k=eff.k, outcome="unmade", at=time.time()))
            self._event(ctx, job, attempt, "submitted", "submitted", step.why)
        elif isinstance(eff, workflow.Poll):
            return self._poll(client, policy, gen, view, eff)
        elif isinstance(eff, workflow.Cancel):
            return self._cancel(client, eff)
        elif isinstance(eff, workflow.ToRetrieving):
            self._to_retrieving(ctx, job, attempt, view, eff, step.why)
        elif isinstance(eff, workflow.Retrieve):
            assert abort is not None
            return self._download(ctx, job, attempt, client, policy, view, eff, abort)
        elif isinstance(eff, workflow.Refresh):
            return self._refresh(client, gen, view, eff)
        else:  # pragma: no cover - decide returns only the effects above here
            raise AssertionError(f"unexpected effect {eff!r}")
        return None

    # -- effects ------------------------------------------------------------------------------
    def _event(
        self, ctx: Context, job: JobBase, attempt: Attempt, to: str, frm: str | None, reason: str
    ) -> None:
        ctx.journal.record(
            job.job_id, f"gen.{to}", from_=f"gen.{frm}" if frm else None, attempt=attempt.n, reason=reason
        )

    def _begin(
        self, ctx: Context, job: GenerateJob, attempt: Attempt, client: Provider, policy: workflow.Policy
    ) -> None:
        """The intent, durable before any create request (state ``submitted``)."""
        t = time.time()
        it = states.Intent(
            key=key_of(job.job_id, attempt.n),
            job=job.job_id,
            attempt=attempt.n,
            provider=policy.provider,
            model=job.generate.model,
            input_hash=states.input_hash(job.generate.input),
            intent_at=t,
            deadline_at=t + policy.deadline,
            clock_offset=client.clock_offset,
        )
        try:
            states.begin(_gen(attempt), it, ctx.worker)
        except states.Conflict:
            return  # another contender began it: look again
        self._event(ctx, job, attempt, "submitted", None, f"intent {it.key} recorded before any create")
        crashpoint("after_gen_intent")

    def _inheritable(
        self, ctx: Context, job: GenerateJob, attempt: Attempt, policy: workflow.Policy
    ) -> workflow.Inherit | None:
        """What the last attempt that began leaves this one: its provider job if it was in
        flight (its worker died) or its paid result was kept (a re-download, never a new
        create); its create log if a create of it may have made a job nobody identified
        yet. An attempt killed before it began is passed over (it sent nothing)."""
        if attempt.n < 2:
            return None
        found = states.last_begun(ctx.tree, job.job_id, before=attempt.n)
        if found is None:
            return None
        frm, prev = found
        rec = prev.record
        assert rec is not None
        t = time.time()
        fresh = msgspec.structs.replace(
            rec.intent, key=key_of(job.job_id, attempt.n), attempt=attempt.n, intent_at=t,
            deadline_at=t + policy.deadline,
        )  # fmt: skip
        if prev.state == "failed":
            if rec.result == "kept" and rec.provider_job_id:
                return workflow.Inherit(frm, fresh, rec.provider_job_id)
            return None
        if rec.provider_job_id:  # in flight when its worker stopped: the same provider job
            return workflow.Inherit(frm, fresh, rec.provider_job_id)
        last = prev.creates[-1] if prev.creates else None
        if last is not None and (last.outcome is None or last.outcome.outcome in ("ambiguous", "made")):
            if last.outcome is not None and last.outcome.provider_job_id:
                return workflow.Inherit(frm, fresh, last.outcome.provider_job_id)
            # Its fate is unknown: settle it here, over the same window (the same intent time).
            carried = msgspec.structs.replace(rec.intent, attempt=attempt.n, deadline_at=t + policy.deadline)
            return workflow.Inherit(frm, carried, None, tuple(prev.creates))
        return None

    def _inherit(self, ctx: Context, job: GenerateJob, attempt: Attempt, eff: workflow.Inherit) -> None:
        """Begin as the previous attempt's heir, in an order a crash anywhere resumes:

        1. its creates to settle are copied into this attempt's create log (idempotent;
           before the intent, which is the commit: a crash here leaves an attempt that
           never began, and the next decision inherits the same again);
        2. the intent, recording the attempt carried on from and its provider job;
        3. the move to ``generating`` with that job (a crash before it: the workflow reads
           the inheritance from the intent and comes back here, never to a create).
        """
        gen = _gen(attempt)
        came = f"attempt {eff.from_attempt}"
        for c in eff.creates:
            req = msgspec.structs.replace(c.request, request=f"{c.request.request} (sent by {came})")
            try:
                states.log_create(gen, req)
            except states.Conflict:
                pass  # copied before a crash: once is enough
            if c.outcome is not None:
                states.log_create_result(gen, c.outcome)
        try:
            states.begin(
                gen,
                eff.intent,
                ctx.worker,
                inherited_from=eff.from_attempt,
                provider_job_id=eff.provider_job_id,
            )
        except states.Conflict:
            rec = states.read(gen).record
            if (
                rec is None
                or rec.inherited_from != eff.from_attempt
                or rec.provider_job_id != eff.provider_job_id
            ):
                return  # another contender began it otherwise: look again
        else:
            self._event(
                ctx, job, attempt, "submitted", None, f"intent {eff.intent.key}, carrying on from {came}"
            )
            crashpoint("after_gen_inherit_begin")
        if eff.provider_job_id is None:
            return  # its create's fate is unknown: the workflow looks it up
        try:
            states.transition(
                gen, "generating", ctx.worker, expect="submitted", provider_job_id=eff.provider_job_id,
                how="inherited", inherited_from=eff.from_attempt,
            )  # fmt: skip
        except states.Conflict:
            return  # another contender moved it first: look again
        self._admit(job)
        self._event(
            ctx, job, attempt, "generating", "submitted",
            f"provider job {eff.provider_job_id} of {came} (downloaded again, never created again)",
        )  # fmt: skip

    def _admit(self, job: GenerateJob) -> None:
        with self._lock:
            self._admitted.setdefault(job.generate.provider, set()).add(job.job_id)

    def _send_create(
        self,
        ctx: Context,
        job: GenerateJob,
        attempt: Attempt,
        client: Provider,
        policy: workflow.Policy,
        view: View,
        eff: workflow.SendCreate,
    ) -> None:
        """Reserve (the spending guard), log create request ``k`` durably, send it, and
        record its outcome durably: the evidence a crash must not lose."""
        gen = _gen(attempt)
        rec = view.record
        assert rec is not None
        table = ctx.cfg.provider_configs[policy.provider]
        key = rec.intent.key
        try:
            token = spending.reserve(
                ctx.tree.root, policy.provider, table.spending.per_hour, table.spending.per_day,
                job=job.job_id, key=key,
            )  # fmt: skip
        except spending.SpendingRefused as r:
            # Another host took the allowance first: nothing was sent; wait like the queue does.
            raise Deferred(min(r.retry_at, time.time() + DEFER_MAX), r.reason) from None
        with self._lock:
            self._reserves[policy.provider] += 1
        what = client.describe_create(job.generate.model, job.generate.input)
        req = CreateRequest(k=eff.k, key=key, sent_at=time.time(), request=what, by=ctx.worker)
        try:
            states.log_create(gen, req)
        except states.Conflict:
            spending.release(token)
            return
        crashpoint("after_gen_create_logged")
        self._admit(job)
        try:
            made = client.create(job.generate.model, job.generate.input, key)
        except ProviderError as e:
            self._create_failed(ctx, job, attempt, policy, eff.k, e, token)
            return
        states.log_create_result(
            gen, CreateResult(k=eff.k, outcome="made", at=time.time(), provider_job_id=made.id)
        )
        self.pressure.ok(policy.provider)
        crashpoint("after_gen_create")  # the provider made the job; only the create log knows

    def _create_failed(
        self, ctx: Context, job: GenerateJob, attempt: Attempt, policy: workflow.Policy, k: int,
        e: ProviderError, token: Path,
    ) -> None:  # fmt: skip
        gen = _gen(attempt)
        t = time.time()
        if e.back_pressure:
            self.pressure.hit(
                policy.provider, t, e.retry_after, policy.retries["poll"], policy.retry_after_max
            )
        if e.outcome == "ambiguous":
            # It may have made a job (and cost): counted, looked up, never sent again blindly.
            states.log_create_result(
                gen,
                CreateResult(
                    k=k, outcome="ambiguous", at=t, code=e.code, http_status=e.http_status, problem=e.problem
                ),
            )
            self._event(
                ctx,
                job,
                attempt,
                "submitted",
                "submitted",
                f"create request {k}: reply unknown ({e.code}); looking it up",
            )
            return
        spending.release(token)  # certainly made nothing
        prog = states.read(gen).progress or Progress()
        prog.updated_at = prog.evidence_at = t  # a clear answer: the provider is not silent
        states.save_progress(gen, prog)
        states.log_create_result(
            gen,
            CreateResult(
                k=k, outcome="refused", at=t, code=e.code, http_status=e.http_status,
                retry_after=e.retry_after, problem=e.problem, final=e.outcome == "final",
            ),
        )  # fmt: skip
        if e.code == "quota":
            table = ctx.cfg.provider_configs[policy.provider]
            until = t + (e.retry_after if e.retry_after else table.quota_wait_seconds)
            reason = (
                f"provider {policy.provider!r} refused a create for its quota (HTTP 429: {e.problem}); "
                f"its jobs wait until {_when(until)}"
            )
            self._event(ctx, job, attempt, "submitted", "submitted", reason)
            admission.pause(ctx.tree.root, policy.provider, until, reason)
            raise Deferred(until, reason)
        self._event(
            ctx,
            job,
            attempt,
            "submitted",
            "submitted",
            f"create request {k} refused ({e.code}): nothing made",
        )

    def _find(
        self,
        ctx: Context,
        job: GenerateJob,
        attempt: Attempt,
        client: Provider,
        policy: workflow.Policy,
        view: View,
        eff: workflow.Find,
    ) -> workflow.Evidence:
        prog = view.progress or Progress()
        offset = client.clock_offset or 0.0
        since = datetime.fromtimestamp(eff.since + offset - workflow.SKEW_UNMEASURED, UTC)
        try:
            found = client.find(job.generate.model, job.generate.input, since)
        except ProviderError as e:
            prog.tries += 1
            prog.errors += 1
            if e.back_pressure:
                self.pressure.hit(
                    policy.provider,
                    time.time(),
                    e.retry_after,
                    policy.retries["poll"],
                    policy.retry_after_max,
                )
            return workflow.FindFailed(eff.k, e)
        owners: dict[str, str | None] = {}
        for m in found.matches:
            entry = ledger.owner(ctx.tree.root, policy.provider, m.id)
            if ledger.ours(entry, job.job_id, attempt.n):
                owners[m.id] = "self"
            else:
                owners[m.id] = f"{entry.job} attempt {entry.attempt}" if entry is not None else None
        prog.finds += 1
        prog.tries = 0
        prog.evidence_at = time.time()
        return workflow.Found(eff.k, found, owners, client.clock_offset)

    def _adopt(
        self,
        ctx: Context,
        job: GenerateJob,
        attempt: Attempt,
        policy: workflow.Policy,
        view: View,
        eff: workflow.Adopt,
        why: str,
    ) -> None:
        """Ledger first (one attempt per provider job), then ``generating`` (its ID durable)."""
        gen = _gen(attempt)
        entry = ledger.enter(
            ctx.tree.root, policy.provider, eff.provider_job_id, job.job_id, attempt.n, eff.how
        )
        if not ledger.ours(entry, job.job_id, attempt.n):
            raise GenFailed(
                workflow.Fail(
                    stage="submit",
                    property="provider.create",
                    message=f"ambiguous create: check the provider: provider job {eff.provider_job_id} is "
                    f"already recorded by {entry.job} attempt {entry.attempt}",
                    next_action=workflow.CHECK_PROVIDER + ".",
                )
            )
        crashpoint("after_gen_ledger")
        try:
            states.transition(
                gen,
                "generating",
                ctx.worker,
                expect="submitted",
                provider_job_id=eff.provider_job_id,
                how=eff.how,
            )
        except states.Conflict:
            return
        self._admit(job)
        prog = view.progress or Progress()
        t = time.time()
        prog.next_at = t + policy.first_poll + self.rng.uniform(0.0, policy.retries["poll"].initial)
        prog.tries = 0
        prog.updated_at = t
        states.save_progress(gen, prog)
        self._event(
            ctx, job, attempt, "generating", "submitted", f"provider job {eff.provider_job_id}: {why}"
        )
        crashpoint("after_gen_generating")

    def _poll(
        self, client: Provider, policy: workflow.Policy, gen: Path, view: View, eff: workflow.Poll
    ) -> workflow.Evidence:
        prog = view.progress or Progress()
        try:
            job = client.get(eff.provider_job_id)
        except ProviderError as e:
            prog.tries += 1
            prog.errors += 1
            prog.rate_limited += e.code == "rate_limited"
            if e.back_pressure:
                self.pressure.hit(
                    policy.provider,
                    time.time(),
                    e.retry_after,
                    policy.retries["poll"],
                    policy.retry_after_max,
                )
            return workflow.PollFailed(e)
        self.pressure.ok(policy.provider)
        t = time.time()
        if prog.queued_since is not None:
            prog.queued_seconds += t - prog.queued_since
        prog.queued_since = t if job.throttled else None
        prog.polls += 1
        prog.tries = 0
        prog.last_provider_status = job.raw_status
        prog.evidence_at = t
        return workflow.Polled(job)

    def _cancel(self, client: Provider, eff: workflow.Cancel) -> workflow.Evidence:
        return workflow.Cancelled(eff.then, self.safe_cancel(client, eff.provider_job_id, eff.seen))

    def safe_cancel(self, client: Provider, pid: str, seen: str | None = None) -> str:
        """Cancel a provider job where that is safe: never one seen finished (a ``DELETE``
        of a finished Runway task deletes the paid result); returns what was done."""
        if seen is None or client.cancel_deletes:
            try:
                now_ = client.get(pid)
            except ProviderError as e:
                if e.code == "lost":
                    return f"provider job {pid} is unknown to the provider"
                now_ = None
            if now_ is not None and now_.status in FINAL:
                return f"provider job {pid} was not cancelled: it had {now_.raw_status}"
        try:
            client.cancel(pid)
        except ProviderError as e:
            return f"cancelling provider job {pid} failed ({e.code}); check the provider"
        return f"provider job {pid} was cancelled at the provider"

    def _to_retrieving(
        self,
        ctx: Context,
        job: GenerateJob,
        attempt: Attempt,
        view: View,
        eff: workflow.ToRetrieving,
        why: str,
    ) -> None:
        gen = _gen(attempt)
        try:
            states.transition(
                gen, "retrieving", ctx.worker, expect="generating", output_url=eff.output_url,
                provider_status=eff.provider_status,
            )  # fmt: skip
        except states.Conflict:
            return  # a duplicate completion: the first one moved it on
        prog = view.progress or Progress()
        prog.output_url = None
        prog.downloads = 0
        prog.next_at = None
        states.save_progress(gen, prog)
        self._event(ctx, job, attempt, "retrieving", "generating", why)
        crashpoint("after_gen_retrieving")

    def _download(
        self,
        ctx: Context,
        job: GenerateJob,
        attempt: Attempt,
        client: Provider,
        policy: workflow.Policy,
        view: View,
        eff: workflow.Retrieve,
        abort: Abort,
    ) -> workflow.Evidence:
        rec = view.record
        assert rec is not None
        dest = attempt.work / job.output.file
        if rec.sha256 is not None and dest.is_file():
            # Past "stored" (a crash before complete/): the verified candidate is there already.
            digest, size = sha256_file(dest)
            if digest == rec.sha256:
                return workflow.Downloaded(size)
        prog = view.progress or Progress()
        prog.downloads += 1
        prog.next_at = None
        started = time.monotonic()
        try:
            got = client.download(eff.url, dest, abort=abort, until=rec.intent.deadline_at + policy.grace)
        except ProviderError as e:
            if e.code == "aborted":
                self._aborted(ctx, job, attempt, abort)
            self._event(
                ctx, job, attempt, "retrieving", "retrieving", f"download {prog.downloads} failed ({e.code})"
            )
            return workflow.DownloadFailed(e.code, e.problem, e.retryable, e.retry_after)
        except OSError as exc:
            if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            try:
                dest.unlink()
            except FileNotFoundError:
                pass
            log.warning("%s: the disk filled up during the download; the result is kept", job.job_id)
            return workflow.DownloadFailed("disk_full", exc.strerror or "no space left", True)
        self._took[job.job_id] = time.monotonic() - started
        prog.bytes_retrieved = got.size
        return workflow.Downloaded(got.size)

    def _aborted(self, ctx: Context, job: GenerateJob, attempt: Attempt, abort: Abort) -> None:
        """A download stopped from outside: the cancel it was for, or the daemon stopping."""
        cancel.raise_if_cancelled(ctx.tree, job.job_id, attempt.n, ctx.worker)
        raise Interrupted()

    def _refresh(self, client: Provider, gen: Path, view: View, eff: workflow.Refresh) -> workflow.Evidence:
        try:
            job = client.get(eff.provider_job_id)
        except ProviderError as e:
            if e.code == "lost":
                return workflow.Refreshed(None, "the provider no longer knows the job")
            return workflow.DownloadFailed(
                e.code, f"fetching the job again failed: {e.problem}", e.retryable, e.retry_after
            )
        if job.outputs:
            prog = view.progress or Progress()
            prog.output_url = job.outputs[0]
        return workflow.Refreshed(job, job.output_problem or "")

    def _wait(self, gen: Path, view: View, eff: workflow.Wait) -> Next:
        """Persist the next eligible step time (the schedule a restart rebuilds from)."""
        prog = view.progress or Progress()
        prog.next_at = eff.until
        prog.updated_at = time.time()
        states.save_progress(gen, prog)
        return Next("wait", at=eff.until)

    # -- endings ----------------------------------------------------------------------------
    def abandon(self, ctx: Context, job: GenerateJob, attempt: Attempt, exc: BaseException) -> float | None:
        """Move the attempt to ``failed`` before its failure is recorded the usual way, so a
        provider result that arrives later can only be kept for audit; stop a provider job
        still running (the cost). Returns when to look for a late completion."""
        gen = _gen(attempt)
        view = states.read(gen)
        rec = view.record
        if view.state is None or rec is None or view.final:
            return None
        result: states.Result = "none"
        if isinstance(exc, GenFailed):
            result = exc.result
        elif view.state in ("retrieving", "stored", "indexed") and not (
            isinstance(exc, Failed) and exc.stage == "validate" and not exc.retryable
        ):
            # The provider's result is fine (or not yet judged: a gate that could not run);
            # only this attempt's handoff failed.
            result = "kept"
        pid = rec.provider_job_id
        if view.state == "generating" and pid and not (isinstance(exc, GenFailed) and exc.cancelled):
            try:
                what = self.safe_cancel(self.client(ctx.cfg, job.generate.provider), pid)
            except Exception as e:  # a missing table or token: the attempt ends anyway
                what = f"provider job {pid} could not be cancelled ({type(e).__name__})"
            log.info("%s: %s", job.job_id, what)
        if isinstance(exc, Failed):
            reason, next_action = f"{exc.property}: {exc.message}", exc.next_action
        elif isinstance(exc, Deferred):
            reason, next_action = f"deferred: {exc.reason}", "Nothing: the job waits in pending/."
        else:
            reason, next_action = f"{type(exc).__name__}: {exc}", "spool retry the job."
        try:
            states.transition(
                gen, "failed", ctx.worker, reason=reason, next_action=next_action, result=result
            )
        except states.Conflict:
            return None
        self._event(ctx, job, attempt, "failed", view.state, reason)
        with self._lock:
            self._admitted.get(job.generate.provider, set()).discard(job.job_id)
            self._took.pop(job.job_id, None)
        if pid and view.state in ("submitted", "generating"):
            # The provider had not reported success: a success from now on is a late one.
            ceiling = ctx.cfg.provider_configs[job.generate.provider].polling.ceiling
            t = time.time()
            with self._lock:
                self._audits[key_of(job.job_id, attempt.n)] = (AUDIT_LOOKS, t + AUDIT_CEILINGS * ceiling)
            return t + self.rng.uniform(0.0, ceiling / 2)
        return None

    def audit(self, ctx: Context, job_id: str, n: int) -> float | None:
        """One look at an abandoned attempt's provider job: a success goes to
        ``late-completion.json`` and nowhere else (the attempt is ``failed``)."""
        key = key_of(job_id, n)
        with self._lock:
            looks, until = self._audits.pop(key, (0, 0.0))
        if looks <= 0:
            return None
        gen = states.gen_dir(ctx.tree.attempt_dir(job_id, n))
        view = states.read(gen)
        rec = view.record
        if view.state != "failed" or rec is None or not rec.provider_job_id:
            return None
        pid = rec.provider_job_id
        table = ctx.cfg.provider_configs.get(rec.intent.provider)
        if table is None:
            return None
        try:
            remote = self.client(ctx.cfg, table.name).get(pid)
        except ProviderError as e:
            if not e.retryable:
                return None
            remote = None
        if remote is not None and remote.status == "succeeded":
            late = states.LateCompletion(
                provider_job_id=pid, provider_status=remote.raw_status, outputs=remote.outputs, seen_at=now(),
                attempt_state="failed",
            )  # fmt: skip
            if states.record_late(gen, late):
                ctx.journal.record(
                    job_id, "gen.late", from_="gen.failed", attempt=n,
                    reason=f"provider job {pid} succeeded after attempt {n} was abandoned; "
                    "recorded for audit, never published",
                )  # fmt: skip
            return None
        if remote is not None and remote.status == "failed":
            return None  # final, and not a success ("canceled" may still turn into one)
        t = time.time()
        if looks <= 1 and t >= until:
            return None
        with self._lock:
            self._audits[key] = (max(1, looks - 1), until)
        return t + self.rng.uniform(table.polling.floor, table.polling.ceiling)

    # -- the gate in front of a provider's pool ------------------------------------------------
    def gate(self, ctx: Context, provider: str, held: set[str]) -> Gate:
        """How many more of the provider's jobs the daemon may claim: none while its quota is
        spent; no more than the spending windows allow, less the claimed jobs that have not
        sent their create yet."""
        table = ctx.cfg.provider_configs.get(provider)
        if table is None:
            return Gate()
        t = time.time()
        paused = admission.paused(ctx.tree.root, provider, t)
        if paused is not None:
            return Gate(room=0, until=paused.until, reason=paused.reason)
        with self._lock:
            cached = self._allowance.get(provider)
            admitted = self._admitted.setdefault(provider, set())
            admitted &= held  # jobs this daemon no longer holds are not waiting to send
            waiting = len(held - admitted)
            reserves = self._reserves[provider]
        limits = (table.spending.per_hour, table.spending.per_day)
        if cached is None or t - cached[0] > GATE_CACHE or cached[1].limits != limits:
            a = spending.allowance(
                ctx.tree.root, provider, table.spending.per_hour, table.spending.per_day, t
            )
            with self._lock:
                self._allowance[provider] = (t, a, reserves)
            since = 0
        else:
            a, since = cached[1], reserves - cached[2]
        room = a.room - since - waiting
        if room > 0:
            return Gate(room=room)
        if a.room > 0:
            return Gate(
                room=0,
                reason=f"{waiting} claimed job(s) of provider {provider!r} are about to send their create",
            )
        return Gate(room=0, until=a.frees_at, reason=a.reason)


def _when(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
