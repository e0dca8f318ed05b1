"""The ``generate`` kind: a clip from a hosted video model, published like a render.

A generation job names a ``[providers.<name>]`` table, a model and the input
passed to it verbatim (SPEC section 8). Its attempt is not one blocking call
but a few steps the daemon's generation driver (``spoold.generations``) runs
between polls, so a waiting generation holds no thread and no render slot:

* :func:`advance` looks at the attempt's durable state (:mod:`spool.generation`)
  and takes the one step it calls for: make the intent durable and send the
  create (under the spending guard); look a lost create up; poll the provider
  job; cancel it past its deadline. It returns what the driver should do next
  (poll again, retrieve, wait);
* :func:`retrieve` downloads the output into ``work/`` while hashing (retried
  from the same URL, never a new generation), runs the validation gate and the
  one publish path, which records ``stored`` and ``indexed`` on the way;
* :func:`abandon` moves the attempt to ``failed`` before the failure is recorded
  the usual way (:func:`spool.execute.end_attempt`), so a provider result that
  arrives later can only be kept for audit (``late-completion.json``).

:meth:`Generate.produce` strings the same steps together with sleeps, for a
caller that has no driver.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal, Protocol

import msgspec

from .. import (
    generation,
    intent,
    providers,  # its HTTP side (httpx, which imports click and rich) loads on first use
    spending,
    store,
)
from ..decoding import convert
from ..errors import Failed, Interrupted, InvalidInput
from ..faults import crashpoint
from ..model import JobBase, Output, Record, ValidationReport, now
from ..polling import PollScheduler
from ..providers.config import pool_name
from ..tree import fsync_dir, write_atomic
from ..validate import validate
from .base import Kind, Produced

if TYPE_CHECKING:
    from ..accept import Submission
    from ..attempt import Attempt
    from ..config import Config
    from ..context import Context
    from ..providers import Provider, ProviderError
    from ..tree import Tree

ProviderName = Annotated[str, msgspec.Meta(pattern=r"^[a-z0-9][a-z0-9_-]{0,63}$")]
ModelName = Annotated[str, msgspec.Meta(min_length=1, max_length=256)]

#: Downloads of one output URL before the attempt fails (each from the same URL).
DOWNLOAD_TRIES = 3
#: Seconds before a ``submitted`` attempt whose create's fate is unknown looks again.
FIND_AGAIN = 5.0
#: In ``gen/``: the last create certainly never reached the provider (connection refused, 429).
UNSENT = "create-not-sent"


class GenerateSpec(Record, forbid_unknown_fields=True, kw_only=True):
    """What to ask which provider for; frozen with the job and hashed as ``recipe_hash``."""

    #: A ``[providers.<name>]`` table of ``spool.toml`` (a job never carries a URL or a token).
    provider: ProviderName
    #: The provider's model: ``owner/name`` or ``owner/name:<version>`` (replicate),
    #: ``gen4_turbo`` or ``<endpoint>:<model>`` (runway).
    model: ModelName
    #: Passed to the provider verbatim (prompt, duration, ratio, ...).
    input: dict[str, Any]


class GenerateJob(JobBase, tag="generate"):
    """A generation job file: the frozen provider request."""

    generate: GenerateSpec


class _Peek(msgspec.Struct):
    provider: str = ""


class _PeekJob(msgspec.Struct):
    generate: _Peek = msgspec.field(default_factory=_Peek)


_peek = msgspec.json.Decoder(_PeekJob)


class Driver(Protocol):
    """The daemon's generation driver, as recovery hands it a job in flight."""

    def resume(self, job_id: str, attempt: int, pool: str) -> None: ...


#: The driver of this process (a daemon registers its own); ``None`` in the CLI.
_driver: Driver | None = None


def set_driver(driver: Driver | None) -> None:
    global _driver
    _driver = driver


class Generate(Kind[GenerateJob]):
    name = "generate"
    job_type = GenerateJob
    #: Run by the daemon's generation driver between polls, not by a slot thread.
    driven: ClassVar[bool] = True

    def pool(self, data: bytes) -> str:
        try:
            return pool_name(_peek.decode(data).generate.provider)
        except (msgspec.DecodeError, msgspec.ValidationError):
            return pool_name("")  # no such pool: never claimed; claiming judges the file anyway

    def freeze(self, tree: Tree, cfg: Config, sub: Submission, common: dict[str, Any]) -> GenerateJob:
        if sub.generate is None:
            raise InvalidInput("generate", "is required but missing (provider, model and input)")
        # The submission carries it untyped (acceptance knows no kind's spec); the kind
        # checks it here, every problem named by its field (generate.model, ...).
        spec = convert(sub.generate, GenerateSpec, prefix="generate")
        if sub.recipe is not None:
            raise InvalidInput("recipe", "a generate job takes none (generate.input is its spec); remove it")
        if sub.sources:
            raise InvalidInput("sources", "a generate job takes none; remove it")
        known = cfg.provider_configs
        if spec.provider not in known:
            have = ", ".join(sorted(known)) or "none"
            raise InvalidInput(
                "generate.provider",
                f"names no [providers.{spec.provider}] table in spool.toml (configured: {have})",
            )
        out_file = sub.output.file or f"{sub.name}.mp4"
        if not out_file.endswith(".mp4"):
            raise InvalidInput("output.file", "must end with .mp4: a generated clip is published as MP4")
        stated = sub.output.expect
        # Only what the submitter states is checked, plus one decodable video stream.
        expect = msgspec.structs.replace(
            stated, video_streams=1 if stated.video_streams is None else stated.video_streams
        )
        job = GenerateJob(
            **common,
            generate=spec,
            recipe_hash="",
            sources=[],
            output=Output(file=out_file, container="mp4", expect=expect, stated=stated),
        )
        job.recipe_hash = self.spec_hash(job)
        return job

    def spec(self, job: GenerateJob) -> object:
        return job.generate

    def check(self, cfg: Config, job: GenerateJob, candidate: Path, log: Path) -> ValidationReport:
        return validate(candidate, job.output.container, job.output.expect, cfg, log)

    def stages(
        self, ctx: Context, job: GenerateJob, attempt: Attempt, candidate: Path
    ) -> Callable[[str], None] | None:
        return on_stage(ctx, job, attempt, candidate)

    def resume(self, ctx: Context, job: GenerateJob, attempt_dir: Path) -> bool:
        """A generation in flight keeps going in the same attempt: the driver polls
        the same provider job (never a new create). A final or never-begun attempt
        is left to the usual evidence (manifest, failure record, retry)."""
        view = generation.read(generation.gen_dir(attempt_dir))
        if view.state is None or view.state == "failed" or _driver is None:
            return False
        _driver.resume(job.job_id, int(attempt_dir.name), pool_name(job.generate.provider))
        return True

    def produce(self, ctx: Context, job: GenerateJob, attempt: Attempt) -> Produced:
        """Without a driver: the same steps on this thread, sleeping until each poll is due."""
        provider = open_for(ctx.cfg, job.generate.provider)
        inherit(ctx, job, attempt)
        sched = PollScheduler(
            {job.generate.provider: ctx.cfg.provider_configs[job.generate.provider].polling}, clock=time.time
        )
        key = key_of(job.job_id, attempt.n)
        try:
            nxt = advance(ctx, job, attempt, provider)
            while nxt.action != "retrieve":
                schedule(sched, key, job.generate.provider, nxt)
                while (due := sched.next_due()) is not None and due > time.time():
                    if ctx.stop.wait(min(0.2, due - time.time())):
                        raise Interrupted()  # the next attempt inherits the provider job
                    intent.raise_if_cancelled(ctx.tree, job.job_id, attempt.n, ctx.worker)
                sched.pop_due()
                nxt = advance(ctx, job, attempt, provider)
            return fetch(ctx, job, attempt, provider)
        except Failed as f:
            cancel(ctx, job, attempt, provider)
            abandon(ctx, job, attempt, f)
            raise
        finally:
            provider.close()


KIND = Generate()


def open_for(cfg: Config, name: str) -> Provider:
    """A live client of ``[providers.<name>]`` (the token comes from the environment now)."""
    return providers.open_provider(cfg.provider_configs[name])


# -- the steps -------------------------------------------------------------------------


@dataclass(frozen=True)
class Next:
    """What the driver does after a step: poll again (``outcome`` for the scheduler,
    ``retry_after`` when the provider asked), look again after ``wait`` seconds, or retrieve."""

    action: Literal["poll", "wait", "retrieve"]
    outcome: str = "pending"
    retry_after: float | None = None
    wait: float | None = None


def schedule(sched: PollScheduler, key: str, provider: str, nxt: Next) -> None:
    """Put a generation's next look into the scheduler by what its last step said."""
    if nxt.action == "wait":
        sched.add(key, provider, due=time.time() + (nxt.wait or 0.0))
    elif nxt.outcome == "new" or key not in sched:
        sched.add(key, provider)
    else:
        sched.report(key, nxt.outcome, retry_after=nxt.retry_after)  # type: ignore[arg-type]


def key_of(job_id: str, n: int) -> str:
    """The idempotency key of an attempt (and its key in the poll scheduler)."""
    return f"{job_id}/{n}"


def _gen(attempt: Attempt) -> Path:
    return generation.gen_dir(attempt.dir)


def _event(ctx: Context, job: JobBase, attempt: Attempt, to: str, frm: str | None, reason: str) -> None:
    ctx.journal.record(
        job.job_id, f"gen.{to}", from_=f"gen.{frm}" if frm else None, attempt=attempt.n, reason=reason
    )


def _provider_failure(e: ProviderError, what: str) -> Failed:
    return Failed(
        "render",
        f"provider.{e.operation}",
        f"{what} (provider {e.provider!r}: {e.operation} {e.problem})",
        expected="an answer from the provider",
        actual=e.code,
        next_action=e.next_action or "Check the provider's status page, then spool retry the job.",
    )


def begin(ctx: Context, job: GenerateJob, attempt: Attempt) -> None:
    """The intent, durable before any create request (state ``submitted``)."""
    cfgp = ctx.cfg.provider_configs[job.generate.provider]
    t = time.time()
    it = generation.Intent(
        key=key_of(job.job_id, attempt.n),
        job=job.job_id,
        attempt=attempt.n,
        provider=cfgp.name,
        model=job.generate.model,
        input_hash=generation.input_hash(job.generate.input),
        intent_at=t,
        deadline_at=t + cfgp.deadline_seconds,
    )
    generation.begin(_gen(attempt), it, ctx.worker)
    _event(ctx, job, attempt, "submitted", None, f"intent {it.key} recorded before the create")
    crashpoint("after_gen_intent")


def inherit(ctx: Context, job: GenerateJob, attempt: Attempt) -> bool:
    """A new attempt after one that was still in flight (its worker died and recovery
    without a driver, such as ``spool recover`` on another host, sent the job back):
    carry on with the same provider job instead of a second create. The old attempt
    is left as it was; this one's records say where the provider job came from."""
    if attempt.n < 2:
        return False
    prev_dir = attempt.tree.attempt_dir(job.job_id, attempt.n - 1)
    if (prev_dir / "failure.json").exists():
        return False  # it ended with a located failure: a retry generates again
    prev = generation.read(generation.gen_dir(prev_dir))
    rec = prev.record
    if prev.state not in ("submitted", "generating", "retrieving", "stored") or rec is None:
        return False
    gen = _gen(attempt)
    # The same key and intent time: a lookup of a lost create must search from then.
    generation.begin(gen, msgspec.structs.replace(rec.intent, attempt=attempt.n), ctx.worker)
    came = f"attempt {attempt.n - 1}"
    _event(ctx, job, attempt, "submitted", None, f"intent {rec.intent.key} carried over from {came}")
    if rec.provider_job_id is None:
        return True  # its create's fate is unknown: settle it here (find, never a blind resubmit)
    generation.transition(
        gen, "generating", ctx.worker, expect="submitted", provider_job_id=rec.provider_job_id
    )
    _event(ctx, job, attempt, "generating", "submitted", f"provider job {rec.provider_job_id} of {came}")
    if prev.state != "generating" and rec.output_url:
        generation.transition(gen, "retrieving", ctx.worker, expect="generating", output_url=rec.output_url)
        _event(ctx, job, attempt, "retrieving", "generating", f"output of {came}, downloaded again")
    return True


def create(ctx: Context, job: GenerateJob, attempt: Attempt, provider: Provider) -> Next:
    """Send the create of a ``submitted`` attempt under the spending guard."""
    cfgp = ctx.cfg.provider_configs[job.generate.provider]
    key = key_of(job.job_id, attempt.n)

    def reserve() -> Path:
        return spending.reserve(
            ctx.tree.root, cfgp.name, cfgp.spending.per_hour, cfgp.spending.per_day, job=job.job_id, key=key
        )

    try:
        rec = generation.submit(
            _gen(attempt), provider, job.generate.input, ctx.worker, reserve=reserve, release=spending.release
        )
    except spending.SpendingRefused as r:
        field = "per_hour" if "per_hour" in r.reason else "per_day"
        raise Failed(
            "prepare",
            f"providers.{cfgp.name}.spending.{field}",
            r.reason,
            expected="a create request within the spending guard",
            actual="refused (nothing was sent)",
            next_action=f"Wait, then spool retry {job.job_id}; or raise [providers.{cfgp.name}] "
            "spending in spool.toml if the volume is intended.",
        ) from None
    except providers.ProviderError as e:
        if e.outcome == "ambiguous":
            # The create may have reached the provider: look it up, never resubmit blindly.
            _event(ctx, job, attempt, "submitted", "submitted", f"create reply lost ({e.code}); finding it")
            return Next("wait", wait=0.0)
        if e.outcome == "retryable":
            # Certainly never arrived (refused, 429): the intent stays; send it again later
            # without a lookup. A crash loses nothing: without this note, the lookup decides.
            write_atomic(_gen(attempt) / UNSENT, f"{e.code}\n".encode())
            _event(
                ctx, job, attempt, "submitted", "submitted", f"create not accepted ({e.code}); again later"
            )
            return Next("wait", wait=min(60.0, max(0.5, e.retry_after or FIND_AGAIN)))
        raise _provider_failure(e, "the create request was refused") from None
    except generation.Conflict:
        return Next("wait", wait=0.0)  # someone else moved it: look at the state again
    _event(ctx, job, attempt, "generating", "submitted", f"provider job {rec.provider_job_id}")
    crashpoint("after_gen_generating")
    return Next("poll", outcome="new")


def settle_submitted(
    ctx: Context, job: GenerateJob, attempt: Attempt, provider: Provider, view: generation.View
) -> Next:
    """A ``submitted`` attempt whose create's fate is unknown: find, adopt, create or fail."""
    rec = view.record
    assert rec is not None
    unsent = _gen(attempt) / UNSENT
    if unsent.exists():
        unsent.unlink()  # durably gone before the create is sent again (a crash then: look it up)
        fsync_dir(unsent.parent)
        return create(ctx, job, attempt, provider)
    lookup = None
    if provider.can_find:
        since = rec.at if rec.at.tzinfo else rec.at.replace(tzinfo=now().tzinfo)
        try:
            lookup = provider.find(job.generate.model, job.generate.input, rec.intent.key, since)
        except providers.ProviderError as e:
            if e.retryable:
                return Next("wait", wait=max(FIND_AGAIN, e.retry_after or 0.0))
            raise _provider_failure(e, "looking up the job a lost create made failed") from None
    d = generation.after_crash(view, now=time.time(), can_find=provider.can_find, lookup=lookup)
    if d.action == "create":
        return create(ctx, job, attempt, provider)
    if d.action == "adopt" and d.provider_job_id:
        try:
            generation.transition(
                _gen(attempt), "generating", ctx.worker, expect="submitted", provider_job_id=d.provider_job_id
            )
        except generation.Conflict:
            return Next("wait", wait=0.0)
        _event(ctx, job, attempt, "generating", "submitted", f"adopted provider job {d.provider_job_id}")
        return Next("poll", outcome="new")
    if d.action == "wait" or d.action == "find":
        return Next("wait", wait=FIND_AGAIN)
    raise Failed(
        "render",
        "provider.create",
        f"the create request's fate cannot be told: {d.reason}",
        expected="one provider job for this attempt",
        actual=d.reason,
        next_action=(d.next_action or providers.CHECK_PROVIDER).capitalize() + ".",
    )


def poll(ctx: Context, job: GenerateJob, attempt: Attempt, provider: Provider, view: generation.View) -> Next:
    """Ask the provider about a ``generating`` attempt once; move it on if it finished."""
    rec = view.record
    assert rec is not None and rec.provider_job_id is not None
    gen = _gen(attempt)
    progress = view.poll or generation.PollProgress()
    if time.time() >= rec.intent.deadline_at:
        _cancel_at_provider(provider, rec.provider_job_id)
        cfgp = ctx.cfg.provider_configs[job.generate.provider]
        raise Failed(
            "render",
            "provider.deadline",
            f"the generation did not finish within [providers.{cfgp.name}] deadline "
            f"({cfgp.deadline_seconds:g} s); it was cancelled at the provider",
            expected=f"<= {cfgp.deadline_seconds:g} s",
            actual=f"still {progress.last_provider_status or 'waiting'}",
            next_action="A longer deadline may help ([providers] deadline).",
            retryable=True,
        )
    try:
        rj = provider.get(rec.provider_job_id)
    except providers.ProviderError as e:
        progress.polls += 1
        progress.errors += 1
        progress.rate_limited += e.code == "rate_limited"
        progress.updated_at = time.time()
        generation.save_poll(gen, progress)
        if e.outcome != "retryable":
            raise _provider_failure(e, f"polling provider job {rec.provider_job_id} failed") from None
        return Next("poll", outcome=e.poll_outcome, retry_after=e.retry_after)
    progress.polls += 1
    progress.last_provider_status = rj.raw_status
    progress.updated_at = time.time()
    generation.save_poll(gen, progress)
    if rj.status == "succeeded":
        try:
            generation.transition(
                gen, "retrieving", ctx.worker, expect="generating",
                output_url=rj.outputs[0], provider_status=rj.raw_status,
            )  # fmt: skip
        except generation.Conflict:
            return Next("wait", wait=0.0)  # a duplicate completion: the first one moved it on
        _event(ctx, job, attempt, "retrieving", "generating", f"provider job {rj.id} {rj.raw_status}")
        crashpoint("after_gen_retrieving")
        return Next("retrieve")
    if rj.status in ("failed", "canceled"):
        raise Failed(
            "render",
            "provider.status",
            f"provider job {rj.id} ended {rj.raw_status}" + (f": {rj.error}" if rj.error else ""),
            expected="succeeded",
            actual=rj.raw_status,
            next_action="Read the provider's message; change the input in a new revision (spool revise), "
            "or spool retry if the cause was temporary (a retry generates again, and costs).",
        )
    return Next("poll", outcome="pending")


def _cancel_at_provider(provider: Provider, provider_job_id: str) -> None:
    try:
        provider.cancel(provider_job_id)
    except providers.ProviderError:
        pass  # already final, or unreachable: the attempt is abandoned either way


def advance(ctx: Context, job: GenerateJob, attempt: Attempt, provider: Provider) -> Next:
    """Take the one step the attempt's durable state calls for (see the module docstring)."""
    gen = _gen(attempt)
    view = generation.read(gen)
    if view.pending:  # a decided transition cut off by a crash: finish it first
        generation.finish_pending(gen, view)
        view = generation.read(gen)
    if view.state is None:
        begin(ctx, job, attempt)
        return create(ctx, job, attempt, provider)
    if view.state == "submitted":
        return settle_submitted(ctx, job, attempt, provider, view)
    if view.state == "generating":
        return poll(ctx, job, attempt, provider, view)
    if view.state == "failed":
        rec = view.record
        raise Failed(
            "render",
            "generation",
            (rec.reason if rec else None) or "the generation attempt failed",
            next_action=(rec.next_action if rec else None)
            or "spool retry the job (a retry generates again).",
        )
    return Next("retrieve")  # retrieving, stored, indexed: the output's handoff


def cancel(ctx: Context, job: GenerateJob, attempt: Attempt, provider: Provider) -> None:
    """``spool cancel`` of a generation in flight: stop it at the provider too."""
    view = generation.read(_gen(attempt))
    if view.state == "generating" and view.record and view.record.provider_job_id:
        _cancel_at_provider(provider, view.record.provider_job_id)


def download(ctx: Context, job: GenerateJob, attempt: Attempt, provider: Provider) -> tuple[Path, int]:
    """The output of a ``retrieving`` (or later) attempt in ``work/``, verified; retried
    from the same URL. Returns the candidate and its size."""
    gen = _gen(attempt)
    view = generation.read(gen)
    rec = view.record
    assert rec is not None
    dest = attempt.work / job.output.file
    if rec.sha256 is not None and dest.is_file():
        # Only after a crash past "stored": the verified candidate is there already.
        digest, size = store.sha256_file(dest)
        if digest == rec.sha256:
            return dest, size
    url = rec.output_url
    if not url:
        raise Failed(
            "render", "provider.output", "the provider gave no output URL", next_action="spool retry"
        )
    for n in range(1, DOWNLOAD_TRIES + 1):
        try:
            got = provider.download(url, dest)
            break
        except providers.ProviderError as e:
            if e.outcome != "retryable" or n == DOWNLOAD_TRIES:
                f = _provider_failure(e, f"downloading the output failed (try {n} of {DOWNLOAD_TRIES})")
                f.property = "provider.download"
                f.next_action = (
                    "The provider no longer serves this output: spool retry generates again (and costs)."
                    if e.code == "expired"
                    else f"{e.next_action or 'Check the provider.'} Then spool retry generates again "
                    "(and costs)."
                    if e.outcome != "retryable"
                    else f"It failed {n} times from the same URL; check the network or the provider, "
                    "then spool retry generates again (and costs)."
                )
                raise f from None
            _event(ctx, job, attempt, "retrieving", "retrieving", f"download {n} failed ({e.code}); again")
            time.sleep(min(10.0, e.retry_after or 0.5 * 2**n))
    progress = view.poll or generation.PollProgress()
    progress.bytes_retrieved = got.size
    progress.updated_at = time.time()
    generation.save_poll(gen, progress)
    return dest, got.size


def fetch(ctx: Context, job: GenerateJob, attempt: Attempt, provider: Provider) -> Produced:
    """Download and return the candidate (for :meth:`Generate.produce`)."""
    started = time.monotonic()
    dest, _size = download(ctx, job, attempt, provider)
    return Produced(dest, time.monotonic() - started)


def on_stage(ctx: Context, job: JobBase, attempt: Attempt, candidate: Path) -> Callable[[str], None]:
    """The publish path's callback: record ``stored`` then ``indexed`` (each once)."""
    gen = _gen(attempt)

    def stage(name: str) -> None:
        frm: generation.GenState = "retrieving" if name == "stored" else "stored"
        to: generation.GenState = "stored" if name == "stored" else "indexed"
        fields: dict[str, Any] = {}
        if to == "stored":
            digest, size = store.sha256_file(candidate)
            fields = {"sha256": digest, "bytes_retrieved": size}
        try:
            generation.transition(gen, to, ctx.worker, expect=frm, **fields)
        except generation.Conflict:
            return  # recorded before a crash (or by a contender): once is enough
        _event(
            ctx, job, attempt, to, frm, "the output is " + ("in the store" if to == "stored" else "findable")
        )
        crashpoint(f"after_gen_{to}")

    return stage


def abandon(ctx: Context, job: JobBase, attempt: Attempt, f: Failed) -> None:
    """Move the attempt to ``failed`` (its reason and next action) before the failure is
    recorded: from here a provider result for it is audit only."""
    gen = _gen(attempt)
    view = generation.read(gen)
    if view.state is None or view.final:
        return
    try:
        generation.transition(
            gen, "failed", ctx.worker, reason=f"{f.property}: {f.message}", next_action=f.next_action
        )
    except generation.Conflict:
        return
    _event(ctx, job, attempt, "failed", view.state, f"{f.property}: {f.message}")


def was_sent(attempt: Attempt) -> bool:
    """Whether the attempt ever had a provider job (a result of it could still arrive)."""
    view = generation.read(_gen(attempt))
    return bool(view.record and view.record.provider_job_id)


def record_late(ctx: Context, attempt: Attempt, provider: Provider) -> bool:
    """Look once at an abandoned attempt's provider job; ``True`` once there is nothing more to see.

    A success is kept in ``late-completion.json`` for audit, never used: the attempt
    is ``failed``, so nothing moves it on and its output is never downloaded."""
    view = generation.read(_gen(attempt))
    pid = view.record.provider_job_id if view.record else None
    if view.state != "failed" or not pid:
        return True
    try:
        rj = provider.get(pid)
    except providers.ProviderError as e:
        return not e.retryable
    if rj.status == "succeeded":
        late = generation.LateCompletion(
            provider_job_id=pid,
            provider_status=rj.raw_status,
            outputs=rj.outputs,
            seen_at=now(),
            attempt_state="failed",
        )
        if generation.record_late(_gen(attempt), late):
            ctx.journal.record(
                attempt.job_id, "gen.late", from_="gen.failed", attempt=attempt.n,
                reason=f"provider job {pid} succeeded after attempt {attempt.n} was abandoned; "
                "recorded for audit, never published",
            )  # fmt: skip
    return rj.status in ("succeeded", "failed")  # "canceled" may still turn into a late success


__all__ = [
    "KIND",
    "Generate",
    "GenerateJob",
    "GenerateSpec",
    "Next",
    "abandon",
    "advance",
    "cancel",
    "download",
    "inherit",
    "on_stage",
    "open_for",
    "record_late",
    "schedule",
    "set_driver",
    "was_sent",
]
