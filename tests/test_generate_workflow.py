"""The generation workflow's step function, case by case (pure: no files, no network).

:func:`spool.kinds.generate.workflow.decide` is the whole policy of an attempt; the
daemon-driven tests (``test_generate.py``, ``test_generate_faults.py``) prove it is
the one production runs. Here each rule of the module docstring has its case.
"""

from __future__ import annotations

import random
from datetime import UTC, datetime
from typing import Any

import pytest

from spool.kinds.generate import workflow as wf
from spool.kinds.generate.providers.base import Lookup, ProviderError, RemoteJob
from spool.kinds.generate.retries import TABLE, RetryPolicy
from spool.kinds.generate.states import (
    Create,
    CreateRequest,
    CreateResult,
    Intent,
    Progress,
    StateRecord,
    View,
)

T0 = 1_800_000_000.0


def policy(**over: Any) -> wf.Policy:
    retries = {
        **TABLE,
        "poll": RetryPolicy(0.1, 2.0, 1.0, None, frozenset({"lost", "unauthorized"}), floor=0.05),
    }
    base = dict(
        provider="sim", deadline=60.0, queue_deadline=600.0, grace=30.0, retention=3600.0, settle=10.0,
        first_poll=1.0, retry_after_max=600.0, auto_retry_ambiguous=False, can_find=True, retries=retries,
    )  # fmt: skip
    base.update(over)
    return wf.Policy(**base)  # type: ignore[arg-type]


def intent(at: float = T0) -> Intent:
    return Intent(
        key="j@1/1", job="j@1", attempt=1, provider="sim", model="m/v", input_hash="h",
        intent_at=at, deadline_at=at + 60.0,
    )  # fmt: skip


def record(state: str, **kw: Any) -> StateRecord:
    return StateRecord(state=state, at=datetime.fromtimestamp(T0, UTC), by="w", intent=intent(), **kw)  # type: ignore[arg-type]


def create(k: int, outcome: str | None = None, at: float = T0, **kw: Any) -> Create:
    req = CreateRequest(k=k, key="j@1/1", sent_at=at, request="POST /v1/models/m/v/predictions", by="w")
    out = CreateResult(k=k, outcome=outcome, at=at + 0.1, **kw) if outcome else None  # type: ignore[arg-type]
    return Create(req, out)


def view(
    state: str | None, creates: list[Create] | None = None, progress: Progress | None = None, **rec: Any
) -> View:
    r = record(state, **rec) if state else None
    return View(dir=None, state=state, record=r, marker="m", creates=creates or [], progress=progress)  # type: ignore[arg-type]


def facts(v: View, now: float = T0 + 1, evidence: Any = None, **kw: Any) -> wf.Facts:
    pol = kw.pop("policy", None) or policy()
    return wf.Facts(
        now=now, job_id="j@1", attempt=1, view=v, policy=pol, rng=random.Random(7), evidence=evidence, **kw
    )


def remote(
    id: str, created: float, status: str = "running", input: dict | None = None, **kw: Any
) -> RemoteJob:
    iso = datetime.fromtimestamp(created, UTC).isoformat().replace("+00:00", "Z")
    return RemoteJob(id=id, status=status, raw_status=status, created_at=iso, input=input, **kw)  # type: ignore[arg-type]


def found(
    *matches: RemoteJob, owners: dict | None = None, unknown: tuple = (), covered: bool = True
) -> wf.Found:
    look = Lookup(matches=list(matches), unknown=list(unknown), covered=covered, searched=len(matches))
    return wf.Found(1, look, owners or {}, clock_offset=0.0)


def err(code: str, outcome: str = "retryable", retry_after: float | None = None) -> ProviderError:
    return ProviderError("sim", "get", "failed", outcome=outcome, code=code, retry_after=retry_after)  # type: ignore[arg-type]


def effect(f: wf.Facts) -> Any:
    return wf.decide(f).effect


# -- begin and create -------------------------------------------------------------------------


def test_nothing_begun_begins_with_the_intent_or_inherits_the_previous_attempts_job():
    assert isinstance(effect(facts(view(None))), wf.Begin)
    inh = wf.Inherit(1, intent(), "p1")
    assert effect(facts(view(None), inheritable=inh)) is inh


def test_an_intent_that_records_an_inherited_job_finishes_the_inheritance_never_creates():
    # A crash between an heir's intent and its move to generating: even past the deadline,
    # with the provider asking to wait, the recorded provider job is taken over, not paid again.
    v = view("submitted", how="inherited", provider_job_id="p1", inherited_from=3)
    for f in (facts(v), facts(v, now=T0 + 999), facts(v, blocked_until=T0 + 5)):
        assert effect(f) == wf.Inherit(3, intent(), "p1")
    # Inherited creates (no provider job) are settled like this attempt's own.
    v = view("submitted", [create(1)], inherited_from=3)
    assert effect(facts(v)) == wf.Find(1, since=T0)


def test_a_submitted_attempt_sends_its_first_create_unless_the_provider_asked_to_wait():
    assert effect(facts(view("submitted"))) == wf.SendCreate(1)
    w = effect(facts(view("submitted"), blocked_until=T0 + 5))
    assert isinstance(w, wf.Wait) and w.until == T0 + 5


def test_a_create_whose_reply_is_unknown_is_looked_up_never_sent_again():
    for out in (None, "ambiguous"):
        assert effect(facts(view("submitted", [create(1, out)]))) == wf.Find(1, since=T0)


def test_a_made_create_is_adopted_as_created():
    assert effect(facts(view("submitted", [create(1, "made", provider_job_id="p1")]))) == wf.Adopt(
        "p1", "created"
    )


def test_a_refused_create_is_sent_again_after_its_backoff_and_never_after_the_deadline():
    v = view("submitted", [create(1, "refused", code="rate_limited", retry_after=5.0)])
    w = effect(facts(v, now=T0 + 1))
    assert isinstance(w, wf.Wait) and w.until == pytest.approx(T0 + 5.1)
    assert effect(facts(v, now=T0 + 6)) == wf.SendCreate(2)
    late = view("submitted", [create(1, "refused", code="rate_limited", retry_after=70.0)])
    f = effect(facts(late))
    assert isinstance(f, wf.Fail) and f.property == "provider.deadline" and f.retryable


def test_a_final_refusal_fails_at_once_and_an_unauthorized_one_is_the_hosts_fault():
    f = effect(
        facts(view("submitted", [create(1, "refused", code="invalid", final=True, problem="bad input")]))
    )
    assert isinstance(f, wf.Fail) and not f.retryable and f.fault == "job"
    f = effect(
        facts(view("submitted", [create(1, "refused", code="unauthorized", final=True, problem="401")]))
    )
    assert f.fault == "host"


def test_create_requests_per_attempt_are_bounded():
    refused = [create(k, "refused", code="connect") for k in range(1, 6)]
    f = effect(facts(view("submitted", refused), now=T0 + 30))
    assert isinstance(f, wf.Fail) and "refused 5 create requests" in f.message


def test_a_create_proven_unmade_is_sent_again_at_most_recreates_times():
    two = [create(1, "unmade"), create(2, "unmade")]
    assert effect(facts(view("submitted", two), now=T0 + 30)) == wf.SendCreate(3)
    three = [*two, create(3, "unmade")]
    f = effect(facts(view("submitted", three), now=T0 + 30))
    assert isinstance(f, wf.Fail) and f.message.startswith("ambiguous create")


def test_no_create_is_sent_after_the_deadline():
    f = effect(facts(view("submitted"), now=T0 + 61))
    assert isinstance(f, wf.Fail) and f.property == "provider.deadline"


# -- the adoption rule --------------------------------------------------------------------------


def submitted_unknown() -> View:
    return view("submitted", [create(1, None)])


def test_the_only_candidate_made_after_the_intent_and_recorded_by_nobody_is_adopted():
    ev = found(remote("p1", T0 + 0.5, input={"prompt": "x"}))
    assert effect(facts(submitted_unknown(), evidence=ev)) == wf.Adopt("p1", "adopted")


def test_a_candidate_this_attempt_entered_in_the_ledger_is_ours():
    ev = found(remote("p1", T0 + 0.5), remote("p2", T0 + 0.6), owners={"p2": "self"})
    assert effect(facts(submitted_unknown(), evidence=ev)) == wf.Adopt("p2", "adopted")


def test_two_candidates_fail_as_ambiguous_naming_both():
    ev = found(remote("p1", T0 + 0.5), remote("p2", T0 + 0.6))
    f = effect(facts(submitted_unknown(), evidence=ev))
    assert isinstance(f, wf.Fail) and "p1, p2" in f.message and not f.retryable


def test_a_job_recorded_by_another_attempt_or_made_before_the_intent_is_no_candidate():
    ev = found(remote("p1", T0 + 0.5), remote("p0", T0 - 30), owners={"p1": "other@1 attempt 1"})
    step = wf.decide(facts(submitted_unknown(), now=T0 + 11, evidence=ev))
    assert step.effect == wf.Unmade(1) and "other@1" in step.why and "p0" in step.why


def test_nothing_found_is_proof_only_after_the_listing_settled():
    w = effect(facts(submitted_unknown(), now=T0 + 2, evidence=found()))
    assert isinstance(w, wf.Wait) and w.until == T0 + 10
    assert effect(facts(submitted_unknown(), now=T0 + 11, evidence=found())) == wf.Unmade(1)


def test_a_listing_that_hides_inputs_in_the_window_cannot_prove_anything():
    hidden = remote("p9", T0 + 0.5)
    f = effect(facts(submitted_unknown(), now=T0 + 11, evidence=found(unknown=(hidden,))))
    assert isinstance(f, wf.Fail) and "does not show the input" in f.message and "p9" in f.message
    old = remote("p8", T0 - 100)  # outside the window: not ours whatever it was
    assert effect(facts(submitted_unknown(), now=T0 + 11, evidence=found(unknown=(old,)))) == wf.Unmade(1)


def test_a_listing_that_did_not_reach_the_intent_cannot_prove_anything():
    f = effect(facts(submitted_unknown(), now=T0 + 11, evidence=found(covered=False)))
    assert isinstance(f, wf.Fail) and f.message.startswith("ambiguous create")


def test_past_the_providers_retention_nothing_is_looked_up():
    f = effect(facts(submitted_unknown(), now=T0 + 3601, policy=policy(retention=3600.0, deadline=7200.0)))
    assert isinstance(f, wf.Fail) and "retention" in f.message


def test_a_provider_without_a_listing_fails_as_ambiguous_unless_told_to_retry():
    f = effect(facts(submitted_unknown(), policy=policy(can_find=False)))
    assert isinstance(f, wf.Fail) and not f.retryable and "spool retry --yes" in f.next_action
    f = effect(facts(submitted_unknown(), policy=policy(can_find=False, auto_retry_ambiguous=True)))
    assert f.retryable


def test_a_failing_listing_is_looked_at_again_with_backoff_then_fails():
    ev = wf.FindFailed(1, err("server_error"))
    w = effect(facts(view("submitted", [create(1)], progress=Progress(tries=1)), evidence=ev))
    assert isinstance(w, wf.Wait) and w.pressure
    f = effect(facts(view("submitted", [create(1)], progress=Progress(tries=6)), evidence=ev))
    assert isinstance(f, wf.Fail) and "failed 6 times" in f.message


# -- generating ---------------------------------------------------------------------------------


def generating(progress: Progress | None = None) -> View:
    return view("generating", progress=progress, provider_job_id="p1")


def test_a_success_with_a_video_moves_to_retrieving_and_one_without_fails_once():
    ok = wf.Polled(remote("p1", T0, "succeeded", outputs=["https://x/v.mp4"]))
    assert effect(facts(generating(), evidence=ok)) == wf.ToRetrieving("https://x/v.mp4", "succeeded")
    empty = wf.Polled(remote("p1", T0, "succeeded", output_problem="the output is an empty list"))
    f = effect(facts(generating(), evidence=empty))
    assert isinstance(f, wf.Fail) and not f.retryable and "empty list" in f.message


def test_still_working_waits_with_backoff_but_never_past_the_deadline():
    run = wf.Polled(remote("p1", T0, "running"))
    w = effect(facts(generating(Progress(polls=3)), evidence=run))
    assert isinstance(w, wf.Wait) and T0 + 1 < w.until <= T0 + 2
    w = effect(facts(generating(Progress(polls=3)), now=T0 + 59.99, evidence=run))
    assert w.until <= T0 + 60


def test_an_unknown_status_is_polled_on_and_cancelled_at_the_deadline():
    weird = wf.Polled(remote("p1", T0, "unknown"))
    assert isinstance(effect(facts(generating(), evidence=weird)), wf.Wait)
    c = effect(facts(generating(), now=T0 + 61, evidence=weird))
    assert isinstance(c, wf.Cancel) and c.provider_job_id == "p1" and c.then.retryable


def test_the_providers_own_queue_time_extends_the_deadline_up_to_queue_deadline():
    run = wf.Polled(remote("p1", T0, "queued"))
    assert isinstance(
        effect(facts(generating(Progress(queued_seconds=30)), now=T0 + 80, evidence=run)), wf.Wait
    )
    pol = policy(queue_deadline=10.0)
    c = effect(facts(generating(Progress(queued_seconds=30)), now=T0 + 80, evidence=run, policy=pol))
    assert isinstance(c, wf.Cancel)


def test_at_the_deadline_there_is_one_last_look_before_giving_up():
    assert effect(facts(generating(), now=T0 + 61)) == wf.Poll("p1")


def test_a_lost_job_fails_and_a_5xx_waits_for_the_provider():
    f = effect(facts(generating(), evidence=wf.PollFailed(err("lost", "final"))))
    assert isinstance(f, wf.Fail) and "submits again" in f.next_action
    w = effect(
        facts(generating(Progress(tries=1)), evidence=wf.PollFailed(err("server_error", retry_after=3.0)))
    )
    assert isinstance(w, wf.Wait) and w.until == pytest.approx(T0 + 1 + 3.0) and w.pressure


def test_a_schedule_kept_in_the_files_is_honoured_after_a_restart():
    w = effect(facts(generating(Progress(next_at=T0 + 20)), now=T0 + 1))
    assert isinstance(w, wf.Wait) and w.until == T0 + 20


# -- retrieving -----------------------------------------------------------------------------------


def retrieving(state: str = "retrieving", downloads: int = 1) -> View:
    return view(state, progress=Progress(downloads=downloads), provider_job_id="p1", output_url="https://x/1")


def test_a_download_goes_to_the_gate_and_the_publish_path():
    assert effect(facts(retrieving(), evidence=wf.Downloaded(10))) == wf.Publish()
    assert effect(facts(retrieving())) == wf.Retrieve("https://x/1")


def test_a_refused_url_is_fetched_again_and_a_fresh_one_is_used():
    assert effect(facts(retrieving(), evidence=wf.DownloadFailed("expired", "403", False))) == wf.Refresh(
        "p1"
    )
    fresh = wf.Refreshed(remote("p1", T0, "succeeded", outputs=["https://x/2"]))
    assert effect(facts(retrieving(), evidence=fresh)) == wf.Retrieve("https://x/2")
    same = wf.Refreshed(remote("p1", T0, "succeeded", outputs=["https://x/1"]))
    assert isinstance(effect(facts(retrieving(), evidence=same)), wf.Wait)


def test_only_a_result_the_provider_no_longer_has_is_gone():
    f = effect(facts(retrieving(), evidence=wf.Refreshed(None, "the provider no longer knows the job")))
    assert isinstance(f, wf.Fail) and f.result == "gone" and "costs" in f.next_action


def test_a_failure_after_success_keeps_the_paid_result():
    for ev, n in (
        (wf.DownloadFailed("disk_full", "ENOSPC", True), 1),
        (wf.DownloadFailed("truncated", "cut", True), 4),
    ):
        f = effect(facts(retrieving(downloads=n), evidence=ev))
        assert (
            isinstance(f, wf.Fail)
            and f.result == "kept"
            and f.retryable
            and "no new generation" in f.next_action
        )


def test_a_retrieval_ends_by_the_deadline_plus_the_grace_but_verified_bytes_always_publish():
    f = effect(facts(retrieving(), now=T0 + 91))
    assert isinstance(f, wf.Fail) and f.result == "kept"
    assert effect(facts(retrieving("stored"), now=T0 + 91)) == wf.Retrieve("https://x/1")
