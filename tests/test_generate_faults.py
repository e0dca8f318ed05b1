"""Paid generation under the provider faults real services show every day (SPEC 11, invariant 10).

Each test drives a real ``spoold`` against ``tools/provsim.py`` misbehaving one way,
then audits the job from both sides (:func:`genhelp.audit`): at most one prediction
made and at most ``CREATE_BOUND`` create requests per attempt, no create after an
attempt's deadline, every attempt ended by its deadline plus the stated grace, and
a published output that is the selected attempt's own prediction. The README's
fault table is these tests.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest
from conftest import run_cli, wait_for
from genhelp import (
    ENV,
    audit,
    configure,
    failure,
    gen_sub,
    gen_view,
    job_state,
    made_for,
    submit,
)
from provsim import ProviderSim

from spool.core import settings
from spool.disk.tree import Tree

TOKEN = ENV["SPOOL_TEST_GEN_TOKEN"]


@pytest.fixture()
def sim() -> Iterator[ProviderSim]:
    """One simulator per test: a provider's listing is the whole account, and one test's
    jobs must not be candidates in another's lookup."""
    with ProviderSim(token=TOKEN, work=0.3) as s:
        yield s


def drain(tree: Tree, daemons: Any, timeout: float = 120) -> Any:
    d = daemons(tree, drain=True, env=ENV)
    assert d.wait(timeout=timeout) == 0, d.output()[-4000:]
    return d


def clean(tree: Tree, sim: ProviderSim, jid: str, prompt: str, **kw: Any) -> Any:
    a = audit(tree, sim, jid, prompt, **kw)
    assert a.problems == [], a.problems
    return a


# -- the create: submit once ----------------------------------------------------------------


def test_a_create_answered_5xx_is_looked_up_proven_unmade_and_sent_again_a_bounded_number_of_times(
    tree, sim, daemons
):
    configure(tree, sim)
    prompt = "always 503 #fault=create_5xx"
    jid = submit(tree, gen_sub("gen-503", prompt))
    other = submit(tree, gen_sub("gen-fine", "an unrelated job", priority=-1))
    drain(tree, daemons)
    a = clean(tree, sim, jid, prompt)
    assert a.state == "failed" and a.predictions == 0
    assert a.requests == 3  # the first, then twice after the listing proved it made nothing
    f = failure(tree, jid)
    assert f.message.startswith("ambiguous create: check the provider") and "3 create requests" in f.message
    assert [c.outcome.outcome for c in gen_view(tree, jid).creates] == ["unmade", "unmade", "unmade"]
    assert job_state(tree, other) == "complete"  # the spending guard was not used up by it


def test_a_create_5xx_that_made_nothing_is_sent_again_after_the_listing_proves_it(tree, sim, daemons):
    configure(tree, sim)
    prompt = "one 503 then fine"
    jid = submit(tree, gen_sub("gen-503-once", prompt))
    sim.control(down=1)  # the next API request (the create) answers 503 and makes nothing
    drain(tree, daemons)
    a = clean(tree, sim, jid, prompt)
    assert a.state == "complete" and a.predictions == 1 and a.requests == 2


def test_a_job_made_then_answered_502_whose_input_the_listing_hides_fails_ambiguous_not_paid_twice(
    tree, sim, daemons
):
    configure(tree, sim)
    prompt = "made, 502, input hidden #fault=create_5xx_after #fault=retention:0"
    jid = submit(tree, gen_sub("gen-502-hidden", prompt))
    drain(tree, daemons)
    a = clean(tree, sim, jid, prompt)
    assert a.state == "failed" and a.predictions == 1 and a.requests == 1
    f = failure(tree, jid)
    made = made_for(sim, prompt)[0].id
    assert "ambiguous create: check the provider" in f.message and made in f.message
    assert "POST /v1/models/acme/video-1/predictions" in f.message and " UTC and " in f.message
    assert not f.retryable  # only an operator's retry creates again


def test_a_stalled_create_reply_is_adopted_when_the_listing_shows_it(tree, sim, daemons):
    configure(tree, sim, request_timeout=1.0)
    prompt = "stalled reply #fault=create_timeout:3"
    jid = submit(tree, gen_sub("gen-stall", prompt))
    drain(tree, daemons)
    a = clean(tree, sim, jid, prompt)
    assert a.state == "complete" and a.predictions == 1 and a.requests == 1
    assert gen_view(tree, jid).records["generating"].how == "adopted"


def test_a_stalled_create_reply_with_the_input_gone_from_the_listing_is_never_created_again(
    tree, sim, daemons
):
    configure(tree, sim, request_timeout=1.0)
    prompt = "stalled, input hidden #fault=create_timeout:3 #fault=retention:0"
    jid = submit(tree, gen_sub("gen-stall-hidden", prompt))
    drain(tree, daemons)
    a = clean(tree, sim, jid, prompt)
    assert a.state == "failed" and a.predictions == 1 and a.requests == 1


def test_a_failing_listing_ends_the_lookup_as_ambiguous_within_the_deadline(tree, sim, daemons):
    configure(tree, sim, deadline=20)
    prompt = "made, 502, listing down #fault=create_5xx_after"
    jid = submit(tree, gen_sub("gen-list-down", prompt))
    sim.control(list_fail=-1)
    drain(tree, daemons)
    a = clean(tree, sim, jid, prompt)
    assert a.state == "failed" and a.predictions == 1 and a.requests == 1
    f = failure(tree, jid)
    assert "listing failed 6 times" in f.message
    assert a.attempts[0].ended_at < a.attempts[0].deadline_at  # the retry policy, not the deadline


def test_an_intent_older_than_the_providers_retention_is_never_created_again(tree, sim, daemons):
    configure(tree, sim, retention=0.3, request_timeout=1.0)
    prompt = "made, reply lost, looked up too late #fault=create_5xx_after"
    jid = submit(tree, gen_sub("gen-retention", prompt))
    sim.control(list_fail=1)  # the first lookup fails; the next waits the find policy's 0.5 s floor
    drain(tree, daemons)
    a = clean(tree, sim, jid, prompt)
    assert a.state == "failed" and a.requests == 1
    assert "older than the provider's retention" in failure(tree, jid).message


def test_a_create_refused_with_429_past_the_deadline_is_never_sent_after_it(tree, sim, daemons):
    configure(tree, sim, deadline=6)
    settings.write(tree.config_file, {"recovery": {"backoff": 0.5}})
    prompt = "throttled for 40 s"
    jid = submit(tree, gen_sub("gen-429-long", prompt))
    sim.control(create_429={"count": 1000, "retry_after": 40})
    drain(tree, daemons)
    a = clean(tree, sim, jid, prompt)
    assert a.state == "failed" and a.predictions == 0
    assert all(len(r.requests) <= 1 for r in a.attempts)  # one refused request each, then no waiting
    assert "passed before a create" in failure(tree, jid).message or "after the deadline" in str(
        gen_view(tree, jid).records
    )


def test_retry_after_ms_is_honoured(tree, sim, daemons):
    configure(tree, sim)
    prompt = "429 in milliseconds"
    jid = submit(tree, gen_sub("gen-429-ms", prompt))
    sim.control(create_429={"count": 1, "retry_after": 0.8, "ms": True})
    drain(tree, daemons)
    a = clean(tree, sim, jid, prompt)
    assert a.state == "complete" and a.requests == 2
    first, second = sorted(a.attempts[0].requests)
    assert 0.8 <= second - first < 3.0


# -- adopt only what is ours -----------------------------------------------------------------


def test_a_late_result_of_an_abandoned_attempt_is_never_adopted_by_the_next_ones_ambiguous_create(
    tree, sim, daemons
):
    configure(tree, sim, deadline=2)
    settings.write(tree.config_file, {"recovery": {"backoff": 0.2}})
    prompt = "late bloomer, then a lost reply"
    jid = submit(tree, gen_sub("gen-late-adopt", prompt))
    sim.control(faults=["never", "late:0.5"])  # attempt 1's job finishes only after its cancel
    d = daemons(tree, env=ENV)
    wait_for(lambda: gen_view(tree, jid).state == "generating", timeout=30)
    sim.control(faults=["create_5xx_after"])  # attempt 2: made, then a 502
    wait_for(lambda: job_state(tree, jid) in ("complete", "failed"), timeout=60)
    wait_for(lambda: (tree.attempt_dir(jid, 1) / "gen" / "late-completion.json").exists(), timeout=30)
    sim.control(faults=[])
    d.signal(15)
    assert d.wait(timeout=30) == 0
    a = clean(tree, sim, jid, prompt, grace=5)
    assert a.state == "complete"
    first = gen_view(tree, jid, 1).records["generating"].provider_job_id
    second = gen_view(tree, jid, 2).records["generating"]
    assert second.how == "adopted" and second.provider_job_id != first


def test_two_jobs_with_one_prompt_never_publish_the_same_prediction(tree, sim, daemons):
    configure(tree, sim)
    prompt = "the same prompt twice"
    first = submit(tree, gen_sub("gen-twin-a", prompt))
    drain(tree, daemons)
    sim.control(faults=["create_5xx_after"])
    second = submit(tree, gen_sub("gen-twin-b", prompt))
    drain(tree, daemons)
    sim.control(faults=[])
    assert job_state(tree, first) == job_state(tree, second) == "complete"
    a, b = (json.loads(tree.manifest_file(j).read_text())["output"]["sha256"] for j in (first, second))
    assert a != b
    pa = gen_view(tree, first).records["generating"].provider_job_id
    pb = gen_view(tree, second).records["generating"].provider_job_id
    assert pa != pb and gen_view(tree, second).records["generating"].how == "adopted"


# -- every state has a deadline ---------------------------------------------------------------


def test_an_undocumented_status_is_polled_until_the_job_finishes(tree, sim, daemons):
    configure(tree, sim)
    prompt = "says queued #fault=weird_status #fault=work:1"
    jid = submit(tree, gen_sub("gen-weird", prompt))
    drain(tree, daemons)
    a = clean(tree, sim, jid, prompt)
    assert a.state == "complete" and gen_view(tree, jid).records["retrieving"].provider_status == "succeeded"


def test_an_undocumented_status_forever_ends_at_the_deadline_even_across_a_restart(tree, sim, daemons):
    configure(tree, sim, deadline=4)
    settings.write(tree.config_file, {"limits": {"max_attempts": 1}})
    prompt = "queued forever #fault=weird_status #fault=never"
    jid = submit(tree, gen_sub("gen-weird-never", prompt))
    d = daemons(tree, env=ENV)
    wait_for(lambda: gen_view(tree, jid).state == "generating", timeout=30)
    d.kill()
    d2 = daemons(tree, drain=True, env=ENV)
    assert d2.wait(timeout=60) == 0, d2.output()[-3000:]
    a = clean(tree, sim, jid, prompt, grace=0)
    assert a.state == "failed" and failure(tree, jid).property == "provider.deadline"
    assert sim.job(a.attempts[0].provider_job_id).canceled_at is not None
    assert "was cancelled at the provider" in failure(tree, jid).message


def test_a_trickling_download_is_cut_off_and_never_holds_up_another_job(tree, sim, daemons):
    configure(tree, sim, **{"download.timeout": 5, "download.stall": 2, "download.min_rate": 1024})
    settings.write(tree.config_file, {"limits": {"max_attempts": 1}})
    slow = "64 bytes every second #fault=trickle:64:1"
    slow2 = "another trickle #fault=trickle:64:1"
    fast = "a normal job #fault=work:1.5"
    jids = [submit(tree, gen_sub(f"gen-trickle-{i}", p)) for i, p in enumerate((slow, slow2, fast))]
    drain(tree, daemons)
    for jid, prompt in zip(jids[:2], (slow, slow2), strict=True):
        a = clean(tree, sim, jid, prompt)
        assert a.state == "failed" and a.predictions == 1
        f = failure(tree, jid)
        assert (f.stage == "retrieve" and "min_rate" in f.message) or "stall" in f.message
        assert gen_view(tree, jid).record.result == "kept"
    done = clean(tree, sim, jids[2], fast)
    assert done.state == "complete"
    made = made_for(sim, fast)[0]
    published = gen_view(tree, jids[2]).records["indexed"].at.timestamp()
    assert published - (made.created + made.work) < 3.0  # not behind the trickles


def test_spool_cancel_stops_a_download_within_a_second(tree, sim, daemons):
    configure(tree, sim, **{"download.min_rate": 1, "download.stall": 30})
    prompt = "a very slow download #fault=trickle:16:0.5"
    jid = submit(tree, gen_sub("gen-cancel-download", prompt))
    d = daemons(tree, env=ENV)
    wait_for(lambda: gen_view(tree, jid).state == "retrieving", timeout=30)
    # the transfer is under way: the answer came and its partial file is open
    wait_for(lambda: any(tree.attempt_dir(jid, 1).glob("work/.*.part")), timeout=30)
    asked = time.time()
    assert run_cli("cancel", jid, "--by", "tester", spool=tree).returncode == 0
    wait_for(lambda: job_state(tree, jid) == "failed", timeout=10, interval=0.02)
    took = failure(tree, jid).failed_at.timestamp() - asked
    assert failure(tree, jid).stage == "cancel" and took < 2.0
    d.signal(15)
    assert d.wait(timeout=30) == 0


def test_provider_queue_time_does_not_count_against_the_deadline(tree, sim, daemons):
    configure(tree, sim, "rw", kind="runway", deadline=2, queue_deadline=60)
    spec = {
        "provider": "rw",
        "model": "gen4_turbo",
        "input": {"promptText": "queued at runway #fault=throttled:4"},
    }
    jid = submit(tree, gen_sub("gen-throttled", generate=spec))
    drain(tree, daemons)
    assert job_state(tree, jid) == "complete"
    assert gen_view(tree, jid).progress.queued_seconds >= 3.0


# -- retries re-download, never regenerate ------------------------------------------------------


def test_a_download_refused_401_is_fetched_again_never_generated_again(tree, sim, daemons):
    configure(tree, sim)
    prompt = "401 twice on the file #fault=file_401:2"
    jid = submit(tree, gen_sub("gen-401", prompt))
    drain(tree, daemons)
    a = clean(tree, sim, jid, prompt)
    assert a.state == "complete" and a.predictions == 1 and tree.attempt_numbers(jid) == [1]


def test_runway_signs_a_fresh_url_when_the_task_is_fetched_again(tree, sim, daemons):
    configure(tree, sim, "rw", kind="runway")
    spec = {"provider": "rw", "model": "gen4_turbo", "input": {"promptText": "expired url #fault=file_401:1"}}
    jid = submit(tree, gen_sub("gen-rw-refresh", generate=spec))
    drain(tree, daemons)
    assert job_state(tree, jid) == "complete"
    events = "".join(p.read_text() for p in (tree.root / "events").glob("*.jsonl"))
    assert "download 1 failed (expired)" in events


def test_a_full_disk_during_the_download_keeps_the_paid_result_for_the_next_attempt(
    tmp_path, sim, daemons, assets
):
    mnt = tmp_path / "small"
    mnt.mkdir()
    if (
        os.geteuid() != 0
        or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=24m", "tmpfs", str(mnt)]).returncode
    ):
        pytest.skip("mounting a small tmpfs needs root")
    try:
        tree = Tree.at(mnt / "spool")
        tree.create()
        settings.write(
            tree.config_file,
            {"assets": {"roots": [str(assets)]}, "daemon": {"poll_interval": 0.2, "heartbeat_interval": 0.5},
             "recovery": {"backoff": 0.2}},
        )  # fmt: skip
        configure(tree, sim, **{"download.min_rate": 1})
        prompt = "a slow download #fault=trickle:2048:0.2"
        jid = submit(tree, gen_sub("gen-enospc", prompt))
        d = daemons(tree, env=ENV, log=tmp_path / "spoold.log")
        wait_for(lambda: gen_view(tree, jid).state == "retrieving", timeout=30)
        filler = mnt / "filler"
        subprocess.run(["fallocate", "-l", str(shutil.disk_usage(mnt).free), str(filler)], check=False)
        wait_for(lambda: "filled up during the download" in d.output(), timeout=30)
        filler.unlink()
        wait_for(lambda: job_state(tree, jid) == "complete", timeout=60)
        d.signal(15)
        assert d.wait(timeout=30) == 0
        a = clean(tree, sim, jid, prompt)
        assert a.predictions == 1 and a.requests == 1  # downloaded again, never generated again
        assert made_for(sim, prompt)[0].downloads >= 2
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


# -- real provider semantics ----------------------------------------------------------------------


def test_an_object_output_without_output_key_fails_once_and_is_not_polled_on(tree, sim, daemons):
    configure(tree, sim)
    prompt = "returns an object #fault=output_object"
    jid = submit(tree, gen_sub("gen-object", prompt))
    drain(tree, daemons)
    a = clean(tree, sim, jid, prompt)
    assert a.state == "failed" and tree.attempt_numbers(jid) == [1] and a.predictions == 1
    f = failure(tree, jid)
    assert "succeeded without a video" in f.message and "output_key" in f.next_action


def test_an_object_output_with_output_key_is_published(tree, sim, daemons):
    configure(tree, sim, output_key="video")
    prompt = "returns an object, key known #fault=output_object"
    jid = submit(tree, gen_sub("gen-object-key", prompt))
    drain(tree, daemons)
    assert clean(tree, sim, jid, prompt).state == "complete"


def test_an_empty_output_is_a_final_failure(tree, sim, daemons):
    configure(tree, sim)
    prompt = "returns nothing #fault=output_empty"
    jid = submit(tree, gen_sub("gen-empty", prompt))
    drain(tree, daemons)
    a = clean(tree, sim, jid, prompt)
    assert a.state == "failed" and tree.attempt_numbers(jid) == [1]
    assert "empty list" in failure(tree, jid).message


def test_runways_daily_quota_keeps_jobs_queued_until_it_resets(tree, sim, daemons):
    configure(tree, sim, "rw", kind="runway")
    spec = {"provider": "rw", "model": "gen4_turbo", "input": {"promptText": "after the quota"}}
    jid = submit(tree, gen_sub("gen-quota", generate=spec))
    sim.control(create_429={"count": 1, "retry_after": 2})
    d = daemons(tree, env=ENV)

    def told() -> bool:
        return (
            "daily" in run_cli("status", spool=tree).stdout
            or (tree.root / "providers/rw/paused.json").exists()
        )

    wait_for(told, timeout=30)
    assert job_state(tree, jid) in ("pending", "running")  # waiting, never failed
    wait_for(lambda: job_state(tree, jid) == "complete", timeout=60)
    d.signal(15)
    assert d.wait(timeout=30) == 0
    n = tree.attempt_numbers(jid)
    first = json.loads((tree.attempt_dir(jid, n[0]) / "interrupted.json").read_text())
    assert first["deferred"] is True
    assert sim.stats().get("deleted_succeeded", 0) == 0


def test_a_deadline_never_deletes_a_runway_task_that_finished(tree, sim, daemons):
    configure(tree, sim, "rw", kind="runway", deadline=2)
    settings.write(tree.config_file, {"limits": {"max_attempts": 1}})
    spec = {"provider": "rw", "model": "gen4_turbo", "input": {"promptText": "running forever #fault=never"}}
    jid = submit(tree, gen_sub("gen-rw-deadline", generate=spec))
    drain(tree, daemons)
    assert job_state(tree, jid) == "failed"
    stats = sim.stats()
    assert stats.get("cancel", 0) == 1 and stats.get("deleted_succeeded", 0) == 0


# -- what the operator sees ------------------------------------------------------------------------


def test_a_generation_the_provider_says_nothing_about_needs_attention_with_its_age(tree, sim, daemons):
    configure(tree, sim, request_timeout=0.5)
    prompt = "silent provider #fault=slow:2 #fault=never"
    jid = submit(tree, gen_sub("gen-silent", prompt))
    d = daemons(tree, env=ENV)

    def flagged() -> Any:
        st = json.loads(run_cli("status", "--json", spool=tree, check=True).stdout)
        items = [a for a in st["attention"] if a["kind"] == "generation" and a["subject"] == jid]
        return (items, st) if items else None

    items, st = wait_for(flagged, timeout=30)
    assert "no answer from provider 'sim'" in items[0]["problem"] and "generating for" in items[0]["problem"]
    assert st["generation_ages"]["generating"] >= 0.9 and st["generations"] == {"generating": 1}
    human = run_cli("status", spool=tree, check=True).stdout
    assert "no answer from provider" in human and "starting" not in human
    d.signal(15)
    assert d.wait(timeout=30) == 0


def test_fsck_names_a_generation_left_running_at_the_provider_by_a_failed_job(tree, sim, daemons):
    configure(tree, sim)
    settings.write(tree.config_file, {"limits": {"max_attempts": 1}})
    prompt = "left behind #fault=never"
    jid = submit(tree, gen_sub("gen-left", prompt))
    d = daemons(tree, env=ENV)
    wait_for(lambda: gen_view(tree, jid).state == "generating", timeout=30)
    d.kill()
    r = run_cli("recover", "--force", spool=tree)  # no driver here; attempts used up: it fails
    assert r.returncode == 0, r.stderr
    assert job_state(tree, jid) == "failed"
    pid = gen_view(tree, jid).record.provider_job_id
    out = run_cli("fsck", "--json", spool=tree)
    assert out.returncode != 0
    found = [p for p in json.loads(out.stdout)["problems"] if p["invariant"] == 10]
    assert len(found) == 1 and pid in found[0]["problem"] and "cancel" in found[0]["repair"]
