"""Generation jobs end to end: real HTTP to tools/provsim.py, real daemons, real FFmpeg.

The simulator counts every create request it receives, so "submit once" is
checked where it matters: at the provider. Each test states the simulator's
faults in the prompt (``#fault=<name>``) and asserts the job's end state, its
attempt's durable generation states, and what the provider saw.
"""

from __future__ import annotations

import json
import os
import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from conftest import minimal, run_cli, state_files, wait_for, write_json
from genhelp import (
    ENV,
    ENV_NAME,
    TOKEN,
    audit,
    configure,
    creates,
    failure,
    gen_sub,
    gen_view,
    provider_table,
    submit,
)
from provsim import ProviderSim

from spool import kinds
from spool.core import config, families, settings
from spool.core.errors import InvalidInput
from spool.core.faults import OTHER_POINTS
from spool.core.model import Failure, Manifest, encode
from spool.disk.records import read
from spool.disk.tree import Tree
from spool.kinds import KINDS, GenerateJob, decode_job
from spool.kinds.generate import states as generation


@pytest.fixture(scope="module")
def sim() -> Iterator[ProviderSim]:
    with ProviderSim(token=TOKEN, work=0.3) as s:
        yield s


@pytest.fixture()
def gtree(tree: Tree, sim: ProviderSim) -> Tree:
    """A spool with the simulator configured as provider ``sim``."""
    configure(tree, sim)
    return tree


def gtree_worker(d: Any) -> str:
    """The worker identity of a test daemon (``<host>-w1``)."""
    return next(p.name[:-5] for p in d.log.parent.glob("spool/workers/*.json"))


def drain(tree: Tree, daemons: Any, timeout: float = 90, **env: str) -> Any:
    """Run a daemon until nothing is left to do; it must exit cleanly."""
    d = daemons(tree, drain=True, env={**ENV, **env})
    assert d.wait(timeout=timeout) == 0, d.output()[-3000:]
    return d


# -- acceptance and the seam ----------------------------------------------------------


def test_a_generate_submission_freezes_with_its_provider_pool(gtree: Tree):
    jid = submit(gtree, gen_sub())
    data = gtree.job_file("pending", jid).read_bytes()
    job = decode_job(data)
    assert isinstance(job, GenerateJob)
    assert job.output.file == "gen-clip.mp4" and job.output.expect.video_streams == 1
    assert KINDS["generate"].pool(data) == "provider:sim"
    assert kinds.capacities(config.load(gtree.config_file))["provider:sim"] == 4


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"generate": {"provider": "nope", "model": "m", "input": {}}}, "generate.provider"),
        ({"generate": None}, "generate"),
        ({"output": {"file": "x.mov"}}, "output.file"),
        ({"generate": {"provider": "sim", "model": "m", "input": {}, "token": "x"}}, "generate.token"),
    ],
)
def test_a_bad_generate_submission_is_rejected_naming_the_field(gtree: Tree, change: dict, field: str):
    with pytest.raises(InvalidInput) as err:
        submit(gtree, gen_sub(**change))
    assert err.value.field.startswith(field)


def test_crash_points_of_the_generation_path_are_registered():
    assert {"after_gen_intent", "after_gen_generating", "after_gen_retrieving", "after_gen_stored"} <= set(
        OTHER_POINTS
    )


# -- faults, through a real daemon (the fault table is tests/test_generate_faults.py) -------------


def test_rate_limited_polls_are_honoured_and_the_job_completes(gtree, sim, daemons):
    prompt = "throttled #fault=ratelimit:2:0.2"
    jid = submit(gtree, gen_sub("gen-429", prompt))
    drain(gtree, daemons)
    view = gen_view(gtree, jid)
    assert view.state == "indexed" and view.progress is not None and view.progress.rate_limited == 2
    assert creates(sim, prompt) == 1


def test_truncated_downloads_are_retried_from_the_same_output_and_never_generate_again(gtree, sim, daemons):
    prompt = "cut short #fault=truncate"
    jid = submit(gtree, gen_sub("gen-trunc", prompt))
    drain(gtree, daemons)
    f = failure(gtree, jid)
    assert f.property == "provider.download" and f.stage == "retrieve"
    assert "downloads it again (no new generation)" in f.next_action
    assert creates(sim, prompt) == 1  # every attempt downloaded the one paid result again
    n = gtree.attempt_numbers(jid)
    assert len(n) == 3 and all(
        gen_view(gtree, jid, k).records["generating"].how == "inherited" for k in n[1:]
    )
    assert not (gtree.attempt_dir(jid, 1) / "work" / "gen-trunc.mp4").exists()
    assert gen_view(gtree, jid).record.result == "kept"
    assert audit(gtree, sim, jid, prompt).problems == []


def test_an_output_the_provider_no_longer_has_is_gone_and_a_retry_says_it_costs(gtree, sim, daemons):
    prompt = "gone soon #fault=file_401:99"
    jid = submit(gtree, gen_sub("gen-gone", prompt))
    d = daemons(gtree, env=ENV)
    job = wait_for(
        lambda: next(iter(j for j in list(sim.state.jobs.values()) if j.input["prompt"] == prompt), None)
    )
    wait_for(lambda: gen_view(gtree, jid).state == "retrieving", timeout=30)
    job.faults["retention"] = [0.0]  # the provider removes the output: a refetch shows none
    wait_for(lambda: gtree.job_file("failed", jid).exists(), timeout=60)
    d.signal(15)
    assert d.wait(timeout=30) == 0
    f = failure(gtree, jid)
    assert f.property == "provider.output" and "is gone" in f.message
    assert "generates again (and costs)" in f.next_action
    assert gen_view(gtree, jid).record.result == "gone"
    refused = run_cli("retry", jid, spool=gtree)
    assert refused.returncode == 2 and "--yes" in refused.stderr and "may cost" in refused.stderr
    assert creates(sim, prompt) == 1


def test_a_job_the_provider_loses_fails_with_submit_again_as_next_action(gtree, sim, daemons):
    prompt = "forgotten #fault=lose:1 #fault=work:5"
    jid = submit(gtree, gen_sub("gen-lost", prompt))
    drain(gtree, daemons)
    f = failure(gtree, jid)
    assert f.property == "provider.get" and "submits again" in f.next_action
    assert gen_view(gtree, jid).state == "failed" and creates(sim, prompt) == 1


def test_non_video_bytes_never_pass_the_gate(gtree, sim, daemons):
    jid = submit(gtree, gen_sub("gen-text", "words #fault=not_video"))
    drain(gtree, daemons)
    f = failure(gtree, jid)
    assert f.stage == "validate"
    assert not gtree.manifest_file(jid).exists()
    assert gen_view(gtree, jid).record.result == "none"  # bad bytes: nothing worth keeping


def test_a_duplicate_completion_is_retrieved_once(gtree, sim, daemons):
    prompt = "twice #fault=recomplete"
    jid = submit(gtree, gen_sub("gen-twice", prompt))
    drain(gtree, daemons)
    assert gtree.job_file("complete", jid).exists() and creates(sim, prompt) == 1
    names = sorted(p.name for p in generation.gen_dir(gtree.attempt_dir(jid, 1)).glob("*.json"))
    assert names == [
        "1-submitted.json", "2-generating.json", "3-retrieving.json", "4-stored.json",
        "5-indexed.json", "create-1.json", "create-1.made.json", "progress.json",
    ]  # fmt: skip


def test_a_rate_limited_create_is_sent_again_and_makes_one_job(gtree, sim, daemons):
    prompt = "queued behind a 429"
    jid = submit(gtree, gen_sub("gen-create-429", prompt))
    sim.control(ratelimit={"count": 1, "retry_after": 0.2})  # the next API request: the create
    drain(gtree, daemons)
    assert gtree.job_file("complete", jid).exists() and creates(sim, prompt) == 1
    assert [c.outcome.outcome for c in gen_view(gtree, jid).creates] == ["refused", "made"]


def test_a_create_whose_reply_is_lost_is_found_and_adopted_not_resent(gtree, sim, daemons):
    prompt = "made but answered 502 #fault=create_5xx_after"
    jid = submit(gtree, gen_sub("gen-ambiguous", prompt))
    drain(gtree, daemons)
    assert gtree.job_file("complete", jid).exists() and creates(sim, prompt) == 1
    events = "".join(p.read_text() for p in (gtree.root / "events").glob("*.jsonl"))
    assert "reply unknown" in events and "the only candidate" in events
    assert gen_view(gtree, jid).records["generating"].how == "adopted"
    assert audit(gtree, sim, jid, prompt).problems == []


def test_runway_generates_and_a_lost_create_reply_fails_with_check_the_provider(tree, sim, daemons):
    configure(tree, sim, "rw", kind="runway")
    spec = {"provider": "rw", "model": "gen4_turbo", "input": {"promptText": "a mug, runway style"}}
    ok = submit(tree, gen_sub("gen-runway", generate=spec))
    lost = {**spec, "input": {"promptText": "made, reply lost #fault=create_5xx_after"}}
    bad = submit(tree, gen_sub("gen-runway-lost", generate=lost))
    drain(tree, daemons)
    assert tree.job_file("complete", ok).exists()
    f = failure(tree, bad)
    assert f.message.startswith("ambiguous create: check the provider")
    assert "no listing" in f.message and "POST /v1/text_to_video" in f.message
    assert "spool retry --yes" in f.next_action and not f.retryable
    assert gen_view(tree, bad).state == "failed"


def test_the_spending_guard_keeps_a_job_waiting_with_the_reason_instead_of_failing_it(tree, sim, daemons):
    configure(tree, sim, **{"spending.per_hour": 1, "spending.per_day": 10})
    first = submit(tree, gen_sub("gen-spend-1", "paid once"))
    second = submit(tree, gen_sub("gen-spend-2", "paid twice", priority=-1))
    d = daemons(tree, env=ENV)
    wait_for(lambda: tree.job_file("complete", first).exists(), timeout=60)

    def waiting() -> str:
        out = run_cli("status", spool=tree, check=True).stdout
        return out if "spending.per_hour = 1" in out else ""

    out = wait_for(waiting, timeout=30)
    assert "the next is allowed at" in out
    assert tree.job_file("pending", second).exists()  # waiting, not failed
    assert creates(sim, "paid twice") == 0 and tree.attempt_numbers(second) == []
    d.signal(15)
    assert d.wait(timeout=30) == 0


def test_retrying_a_generation_job_needs_yes_and_says_what_it_costs(gtree, sim, daemons):
    prompt = "retry costs #fault=not_video"
    jid = submit(gtree, gen_sub("gen-retry", prompt))
    drain(gtree, daemons)
    assert state_files(gtree)["failed"] == [f"{jid}.json"]
    refused = run_cli("retry", jid, spool=gtree)
    assert refused.returncode == 2 and f"spool retry --yes {jid}" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1
    assert state_files(gtree)["failed"] == [f"{jid}.json"]
    done = run_cli("retry", jid, "--yes", "--json", spool=gtree)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["submits_again"] is True and "'sim'" in out["cost"] and out["state"] == "pending"
    assert "may cost" in done.stderr
    drain(gtree, daemons)
    assert creates(sim, prompt) == 2  # the retry was a new create request, as it warned


def test_retrying_a_job_whose_paid_result_was_kept_downloads_it_again_without_yes(gtree, sim, daemons):
    prompt = "download fails for a while #fault=file_401:4"
    settings.write(gtree.config_file, {"limits": {"max_attempts": 1}})
    jid = submit(gtree, gen_sub("gen-kept", prompt))
    drain(gtree, daemons)
    assert failure(gtree, jid).property == "provider.download"
    r = run_cli("retry", jid, "--json", spool=gtree)  # no --yes: it costs nothing
    assert r.returncode == 0, r.stderr
    assert "submits_again" not in json.loads(r.stdout)
    drain(gtree, daemons)
    assert gtree.job_file("complete", jid).exists() and creates(sim, prompt) == 1
    assert audit(gtree, sim, jid, prompt).problems == []


def test_spool_revise_of_a_generation_job_changes_its_prompt(gtree, sim, daemons):
    jid = submit(gtree, gen_sub("gen-revised", "first idea #fault=not_video"))
    drain(gtree, daemons)
    spec = gtree.root.parent / "spec.json"
    spec.write_text(json.dumps({"input": {"prompt": "second idea"}}))
    r = run_cli("revise", jid, "--spec", str(spec), "--json", spool=gtree)
    assert r.returncode == 0, r.stderr
    new = json.loads(r.stdout)["job_id"]
    assert new == "gen-revised@2"
    job = decode_job(gtree.job_file("pending", new).read_bytes())
    assert isinstance(job, GenerateJob) and job.generate.input == {"prompt": "second idea"}
    assert job.generate.model == "acme/video-1" and job.supersedes == jid
    drain(gtree, daemons)
    assert gtree.job_file("complete", new).exists()


def test_retrying_a_render_job_needs_no_yes(tree, assets):
    (tree.root / "failed").mkdir(exist_ok=True)
    jid = submit(tree, minimal(assets))
    os.rename(tree.job_file("pending", jid), tree.job_file("failed", jid))
    r = run_cli("retry", jid, "--json", spool=tree)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == {"job_id": jid, "state": "pending"} and r.stderr == ""


# -- the daemon ---------------------------------------------------------------------------


def test_a_generation_job_runs_end_to_end_under_the_daemon(gtree, sim, daemons):
    prompt = "a mug of coffee on a beach at dawn"
    jid = submit(gtree, gen_sub("gen-e2e", prompt))
    d = daemons(gtree, drain=True, env=ENV)
    assert d.wait(timeout=60) == 0, d.output()[-3000:]
    assert state_files(gtree)["complete"] == [f"{jid}.json"]
    m = read(gtree.manifest_file(jid), Manifest)
    assert m.attempt == 1 and m.output.size > 0
    view = gen_view(gtree, jid)
    assert view.state == "indexed" and view.record is not None and view.record.sha256 == m.output.sha256
    events = [
        json.loads(x) for p in (gtree.root / "events").rglob("*.jsonl") for x in p.read_text().splitlines()
    ]
    steps = [e["to"] for e in events if e["job"] == jid]
    assert steps.index("gen.submitted") < steps.index("gen.generating") < steps.index("gen.retrieving")
    assert steps.index("gen.retrieving") < steps.index("gen.stored") < steps.index("gen.indexed")
    assert steps.index("gen.indexed") < steps.index("complete")
    assert creates(sim, prompt) == 1


def test_a_waiting_generation_holds_no_render_slot(gtree, sim, assets, daemons):
    settings.write(gtree.config_file, {"limits": {"max_active": 1}})
    gen = submit(gtree, gen_sub("gen-slow", "slow one #fault=work:6", priority=10))
    d = daemons(gtree, env=ENV)
    wait_for(lambda: gen_view(gtree, gen).state == "generating", timeout=30)
    write_json(gtree.incoming / "r.json", minimal(assets, "plain-render"))
    wait_for(lambda: gtree.job_file("complete", "plain-render@1").exists(), timeout=30)
    assert gen_view(gtree, gen).state == "generating"  # still waiting at the provider
    wait_for(lambda: gtree.job_file("complete", gen).exists(), timeout=30)
    d.signal(15)
    assert d.wait(timeout=30) == 0


def _gen_metrics(tree: Tree) -> dict[tuple[str, str], float]:
    """``(family, state or provider) -> value`` of the generation series in the daemon's metrics file."""

    out = {}
    for path in (tree.root / "metrics").glob("spool-*.prom"):
        for fam in families.parse(path.read_text()):
            for smp in fam.samples:
                if smp.name.startswith("spool_generation_"):
                    out[(smp.name, smp.labels.get("state") or smp.labels.get("provider", ""))] = smp.value
    return out


def test_status_and_metrics_show_generations_by_state_and_the_drivers_counters(gtree, sim, daemons):
    settings.write(gtree.config_file, {"observe": {"metrics_interval": 0.2}})
    jid = submit(gtree, gen_sub("gen-watched", "watched #fault=work:3 #fault=ratelimit:2:0.1"))
    d = daemons(gtree, env=ENV)

    def status() -> dict[str, Any]:
        return json.loads(run_cli("status", "--json", spool=gtree, check=True).stdout)

    wait_for(lambda: status().get("generations") == {"generating": 1}, timeout=30)
    assert "generations: generating 1" in run_cli("status", spool=gtree, check=True).stdout
    wait_for(lambda: _gen_metrics(gtree).get(("spool_generation_attempts", "generating")) == 1, timeout=30)
    wait_for(lambda: gtree.job_file("complete", jid).exists(), timeout=30)
    assert "generations" not in status()  # nothing running: no block
    size = read(gtree.manifest_file(jid), Manifest).output.size

    def counted() -> bool:
        m = _gen_metrics(gtree)
        return m.get(("spool_generation_retrieved_bytes_total", "sim")) == size

    wait_for(counted, timeout=30)
    m = _gen_metrics(gtree)
    assert (
        m[("spool_generation_creates_total", "sim")]
        == 1
        == creates(sim, "watched #fault=work:3 #fault=ratelimit:2:0.1")
    )
    assert m[("spool_generation_rate_limited_total", "sim")] == 2
    assert m[("spool_generation_polls_total", "sim")] >= 3  # two 429s, then at least one answer
    assert m[("spool_generation_provider_errors_total", "sim")] >= 2
    assert m[("spool_generation_checksum_failures_total", "sim")] == 0
    assert m[("spool_generation_attempts", "generating")] == 0
    d.signal(15)
    assert d.wait(timeout=30) == 0


@pytest.mark.parametrize(
    "point",
    [
        "after_gen_intent",
        "after_gen_create",
        "after_gen_generating",
        "after_gen_retrieving",
        "after_gen_stored",
    ],
)
def test_kill_9_between_states_resumes_without_a_second_create(tree, sim, daemons, point):
    # after_gen_intent: nothing was sent, but only a listing that has settled (30 s) proves it.
    gtree = tree
    with open(tree.config_file, "a") as f:
        f.write(provider_table(sim).replace("deadline = 30", "deadline = 120"))
    prompt = f"crash at {point}"
    jid = submit(gtree, gen_sub(f"gen-{point.replace('_', '-')}", prompt))
    d = daemons(gtree, env={**ENV, "SPOOL_CRASH_AT": point})
    assert d.wait(timeout=60) == -9, d.output()[-3000:]
    assert state_files(gtree)["running"] == [f"{jid}.json"]
    d2 = daemons(gtree, drain=True, env=ENV)
    assert d2.wait(timeout=90) == 0, d2.output()[-3000:]
    assert state_files(gtree)["complete"] == [f"{jid}.json"]
    assert creates(sim, prompt) == 1
    assert gtree.attempt_numbers(jid) == [1]  # the same attempt carried on
    assert gen_view(gtree, jid).state == "indexed"


def test_spool_cancel_of_a_waiting_generation_cancels_at_the_provider(gtree, sim, daemons):
    prompt = "never ends #fault=never"
    jid = submit(gtree, gen_sub("gen-cancel", prompt))
    d = daemons(gtree, env=ENV)
    wait_for(lambda: gen_view(gtree, jid).state == "generating", timeout=30)
    r = run_cli("cancel", jid, "--by", "tester", spool=gtree)
    assert r.returncode == 0, r.stderr
    assert state_files(gtree)["failed"] == [f"{jid}.json"]
    pid = gen_view(gtree, jid).record.provider_job_id
    assert sim.job(pid).canceled_at is not None
    assert gen_view(gtree, jid).state == "failed"
    d.signal(15)
    d.wait(timeout=30)


def test_the_token_is_never_written_to_any_file(gtree, sim, daemons):
    jid = submit(gtree, gen_sub("gen-secret", f"leak {TOKEN} #fault=fail"))
    d = daemons(gtree, drain=True, env=ENV)
    d.wait(timeout=60)
    assert state_files(gtree)["failed"] == [f"{jid}.json"]
    # The job file (and its frozen copy) holds the submitter's own input verbatim: nothing else may.
    job_bytes = gtree.job_file("failed", jid).read_bytes()
    leaks = []
    for root, _dirs, files in os.walk(gtree.root.parent):
        for name in files:
            p = Path(root) / name
            if p.is_file() and not p.is_symlink():
                data = p.read_bytes()
                if TOKEN.encode() in data and data != job_bytes:
                    leaks.append(str(p))
    assert leaks == []


def test_a_late_completion_of_an_abandoned_attempt_is_recorded_and_never_published(tree, sim, daemons):
    settings.write(tree.config_file, {"recovery": {"backoff": 0.2}})
    with open(tree.config_file, "a") as f:
        f.write(provider_table(sim).replace("deadline = 30", "deadline = 1"))
    prompt = "late bloomer"
    jid = submit(tree, gen_sub("gen-late", prompt))
    sim.control(faults=["never", "late:0.5"])  # attempt 1's job: only "finishes" after its cancel
    try:
        d = daemons(tree, env=ENV)
        wait_for(lambda: gen_view(tree, jid).state == "generating", timeout=30)
        sim.control(faults=[])  # attempt 2 generates normally
        late = tree.attempt_dir(jid, 1) / "gen" / "late-completion.json"
        wait_for(lambda: tree.job_file("complete", jid).exists() and late.exists(), timeout=40)
    finally:
        sim.control(faults=[])
    m = read(tree.manifest_file(jid), Manifest)
    assert m.attempt == 2
    assert gen_view(tree, jid, 1).state == "failed" and gen_view(tree, jid, 2).state == "indexed"
    first = sim.job(gen_view(tree, jid, 1).record.provider_job_id)
    assert first.canceled_at is not None and first.succeeded_at is not None
    assert creates(sim, prompt) == 2  # one per attempt: the retry is a new generation
    d.signal(15)
    assert d.wait(timeout=30) == 0


def test_spool_recover_of_a_dead_workers_generation_never_creates_twice(gtree, sim, daemons):
    prompt = "recovered elsewhere"
    jid = submit(gtree, gen_sub("gen-recovered", prompt))
    d = daemons(gtree, env={**ENV, "SPOOL_CRASH_AT": "after_gen_generating"})
    assert d.wait(timeout=60) == -9
    r = run_cli("recover", spool=gtree)  # no driver in the CLI: the job goes back to pending
    assert r.returncode == 0, r.stderr
    d2 = daemons(gtree, "w2", drain=True, env=ENV)
    assert d2.wait(timeout=90) == 0, d2.output()[-3000:]
    assert state_files(gtree)["complete"] == [f"{jid}.json"]
    assert creates(sim, prompt) == 1
    n = read(gtree.manifest_file(jid), Manifest).attempt
    assert n > 1
    first, last = gen_view(gtree, jid, 1).record, gen_view(gtree, jid, n).record
    assert first.provider_job_id == last.provider_job_id


@pytest.mark.parametrize("point", ["after_gen_create_logged", "after_gen_create"])
def test_an_attempt_killed_before_it_began_never_orphans_the_create_before_it(tree, sim, daemons, point):
    # Attempt 1 dies with its create logged (sent or not: its fate unknown) or made
    # (only the create log knows the provider job); attempt 2 dies right after its
    # folder was opened, before its generation began. Attempt 3 must carry attempt 1's
    # create on, not send a new one beside a provider job nobody watches.
    settings.write(tree.config_file, {"recovery": {"backoff": 0.2}})
    with open(tree.config_file, "a") as f:
        f.write(provider_table(sim).replace("deadline = 30", "deadline = 120"))
    prompt = f"killed twice at {point}"
    jid = submit(tree, gen_sub(f"gen-twice-{point.replace('_', '-')}", prompt))
    for n, (who, crash) in enumerate([("w1", point), ("w2", "after_attempt_dir")], start=1):
        d = daemons(tree, who, env={**ENV, "SPOOL_CRASH_AT": crash})
        assert d.wait(timeout=60) == -9, d.output()[-3000:]
        assert tree.attempt_numbers(jid) == list(range(1, n + 1))
        assert run_cli("recover", spool=tree).returncode == 0
        wait_for(lambda: tree.job_file("pending", jid).exists(), timeout=10)
    assert gen_view(tree, jid, 2).state is None  # attempt 2 never began
    d3 = daemons(tree, "w3", drain=True, env=ENV)
    assert d3.wait(timeout=90) == 0, d3.output()[-3000:]
    assert state_files(tree)["complete"] == [f"{jid}.json"]
    assert creates(sim, prompt) == 1
    assert read(tree.manifest_file(jid), Manifest).attempt == 3
    carried = gen_view(tree, jid, 3)
    if point == "after_gen_create":  # the provider job attempt 1 made, downloaded by attempt 3
        got = carried.records["generating"]
        assert got.how == "inherited" and got.inherited_from == 1
        assert got.provider_job_id == gen_view(tree, jid, 1).creates[-1].outcome.provider_job_id
    else:  # the create of unknown fate, settled by attempt 3 (a listing: nothing made), then sent
        assert any("(sent by attempt 1)" in c.request.request for c in carried.creates)
    r = run_cli("fsck", "--json", spool=tree)
    assert r.returncode == 0 and json.loads(r.stdout)["problems"] == [], r.stdout


@pytest.mark.parametrize("first", ["after_gen_create", "after_gen_create_logged"])
@pytest.mark.parametrize("then", ["resumed", "recovered"])
def test_an_heir_killed_between_its_intent_and_generating_never_creates_again(
    tree, sim, daemons, first, then
):
    # Attempt 1 dies with its create made (only the create log knows the provider job) or
    # of unknown fate; attempt 2 inherits it and dies right after its intent, before the
    # move to generating. Whoever goes on (attempt 2 resumed by its worker, or attempt 3
    # after a recover) must finish that inheritance: a create here pays twice and leaves
    # attempt 1's provider job running with nobody watching it.
    settings.write(tree.config_file, {"recovery": {"backoff": 0.2}})
    with open(tree.config_file, "a") as f:
        f.write(provider_table(sim).replace("deadline = 30", "deadline = 120"))
    prompt = f"heir killed after {first}, {then}"
    jid = submit(tree, gen_sub(f"gen-heir-{first.replace('_', '-')}-{then}", prompt))
    d = daemons(tree, "w1", env={**ENV, "SPOOL_CRASH_AT": first})
    assert d.wait(timeout=60) == -9, d.output()[-3000:]
    assert run_cli("recover", spool=tree).returncode == 0
    wait_for(lambda: tree.job_file("pending", jid).exists(), timeout=10)
    d = daemons(tree, "w2", env={**ENV, "SPOOL_CRASH_AT": "after_gen_inherit_begin"})
    assert d.wait(timeout=60) == -9, d.output()[-3000:]
    heir = gen_view(tree, jid, 2)
    assert heir.state == "submitted" and heir.record.inherited_from == 1
    made = first == "after_gen_create"
    if made:  # the intent itself names the provider job it carries on with
        assert heir.record.how == "inherited"
        assert heir.record.provider_job_id == gen_view(tree, jid, 1).creates[-1].outcome.provider_job_id
    else:  # the create of unknown fate was copied before the intent
        assert any("(sent by attempt 1)" in c.request.request for c in heir.creates)
    if then == "recovered":
        assert run_cli("recover", spool=tree).returncode == 0
        wait_for(lambda: tree.job_file("pending", jid).exists(), timeout=10)
    d = daemons(tree, "w2" if then == "resumed" else "w3", drain=True, env=ENV)
    assert d.wait(timeout=90) == 0, d.output()[-3000:]
    assert state_files(tree)["complete"] == [f"{jid}.json"]
    assert creates(sim, prompt) == 1
    n = read(tree.manifest_file(jid), Manifest).attempt
    assert n == (2 if then == "resumed" else 3)
    if made:
        got = gen_view(tree, jid, n).records["generating"]
        assert got.how == "inherited" and got.inherited_from == (1 if then == "resumed" else 2)
        assert got.provider_job_id == heir.record.provider_job_id
    r = run_cli("fsck", "--json", spool=tree)
    assert r.returncode == 0 and json.loads(r.stdout)["problems"] == [], r.stdout


def test_generations_in_flight_never_exceed_the_providers_allowance(tree, sim, daemons):
    with open(tree.config_file, "a") as f:
        f.write(provider_table(sim).replace("in_flight = 4", "in_flight = 2"))
    jids = [submit(tree, gen_sub(f"gen-many-{i}", f"one of many {i} #fault=work:1")) for i in range(6)]
    d = daemons(tree, drain=True, env=ENV)
    peak = 0
    while d.alive():
        markers = tree.attempts.glob("*/*/gen/state.*")
        peak = max(peak, sum(1 for p in markers if not p.name.endswith(("indexed", "failed"))))
        time.sleep(0.02)
    assert d.wait(timeout=60) == 0
    assert state_files(tree)["complete"] == sorted(f"{j}.json" for j in jids)
    assert peak == 2  # the allowance was used, and never exceeded


def test_ten_thousand_queued_generations_never_exceed_the_in_flight_allowance(tree, sim, daemons):
    """10,000 job files in pending/ against a provider that never finishes: the daemon
    fills the allowance of 25 and not one more, at its claims and at the provider."""
    with open(tree.config_file, "a") as f:
        f.write(provider_table(sim).replace("in_flight = 4", "in_flight = 25"))
    prompt = "queued behind ten thousand #fault=never"
    first = decode_job(tree.job_file("pending", submit(tree, gen_sub("gen-q00000", prompt))).read_bytes())
    for i in range(1, 10_000):  # clones of an accepted job: accepting 10,000 would take minutes
        name = f"gen-q{i:05d}"
        job = msgspec.structs.replace(first, job_id=f"{name}@1", name=name)
        tree.job_file("pending", job.job_id).write_bytes(encode(job))
    assert len(os.listdir(tree.pending)) == 10_000
    d = daemons(tree, env=ENV)
    wait_for(lambda: creates(sim, prompt) >= 25, timeout=90)
    peak_claimed = peak_created = 0
    end = time.monotonic() + 3.0  # the allowance is full: watch that nothing more goes out
    while time.monotonic() < end:
        peak_claimed = max(peak_claimed, len(os.listdir(next(tree.running.iterdir()))))
        peak_created = max(peak_created, creates(sim, prompt))
        time.sleep(0.05)
    d.signal(15)
    assert d.wait(timeout=60) == 0, d.output()[-3000:]
    assert peak_claimed == 25 and peak_created == 25
    assert len(os.listdir(tree.pending)) == 10_000 - 25


def test_sighup_reloads_the_providers_allowance_polling_and_spending(tree, sim, daemons):
    table = provider_table(sim).replace("in_flight = 4", "in_flight = 1")
    with open(tree.config_file, "a") as f:
        f.write(table)
    prompts = ("hup one #fault=never", "hup two #fault=never")
    jids = [submit(tree, gen_sub(f"gen-hup-{i}", p)) for i, p in enumerate(prompts)]
    d = daemons(tree, env=ENV)

    def created() -> list[Any]:
        return [j for j in list(sim.state.jobs.values()) if j.input.get("prompt") in prompts]

    waiting = wait_for(lambda: next((j for j in created() if j.polls >= 3), None), timeout=30)
    assert len(created()) == 1  # in_flight = 1: the other job waits in pending/
    slow = "[providers.sim.polling]\nfirst = 60\nbase = 60\nceiling = 60\nfloor = 60\n"
    new = table.replace("in_flight = 1", "in_flight = 2\nspending = {per_hour = 1}")
    new = new[: new.index("[providers.sim.polling]")] + slow
    text = tree.config_file.read_text()
    # Replaced whole (temp + rename): the daemon also looks for changes every loop, and a
    # file caught half-written would be read as a different config.
    tmp = tree.config_file.with_name(".spool.toml.new")
    tmp.write_text(text[: text.index("[providers.sim]")] + new.lstrip())
    os.replace(tmp, tree.config_file)
    d.signal(signal.SIGHUP)
    wait_for(lambda: re.search(r"re-read .*: changed .*providers\.sim", d.output()), timeout=30)
    # The allowance grew, but the spending guard, now 1 an hour, keeps the other job waiting.
    other = jids[1 - prompts.index(waiting.input["prompt"])]

    def told() -> bool:
        return "spending.per_hour = 1" in run_cli("status", spool=tree, check=True).stdout

    wait_for(told, timeout=30)
    assert tree.job_file("pending", other).exists() and tree.attempt_numbers(other) == []
    assert len(created()) == 1
    # The polling policy changed: at most the poll already due under the old one, then none.
    time.sleep(0.5)
    before = waiting.polls
    time.sleep(2.0)
    assert waiting.polls - before <= 1
    d.signal(signal.SIGTERM)
    assert d.wait(timeout=60) == 0


def test_a_provider_slow_to_answer_one_poll_does_not_hold_up_the_others(gtree, sim, daemons):
    slow = "slow answers #fault=slow:1.8 #fault=never"  # every poll of it takes 1.8 s
    submit(gtree, gen_sub("gen-slow", slow))
    quick = submit(gtree, gen_sub("gen-quick", "quick answers #fault=work:2"))
    d = daemons(gtree, env=ENV)
    wait_for(lambda: (gtree.complete / f"{quick}.json").exists(), timeout=60)
    made = next(
        j for j in list(sim.state.jobs.values()) if j.input.get("prompt") == "quick answers #fault=work:2"
    )
    seen = gen_view(gtree, quick).records["retrieving"].at.timestamp()
    # Polled every 0.05-0.3 s while the slow job's polls keep one poll thread busy: its
    # success is seen soon after, not after the slow job's answer.
    assert seen - (made.created + made.work) < 1.2
    d.signal(15)
    assert d.wait(timeout=60) == 0


def test_a_daemon_without_the_token_moves_the_job_on_and_names_the_variable(gtree, sim, daemons):
    jid = submit(gtree, gen_sub("gen-no-token", "who am I"))
    d = daemons(gtree, drain=True, env={ENV_NAME: ""})
    assert d.wait(timeout=60) == 0, d.output()[-3000:]
    f = read(gtree.attempt_dir(jid, 1) / "failure.json", Failure)
    assert f.property == "providers.sim" and f.fault == "host"
    assert ENV_NAME in f.message
    assert (gtree.job_attempts(jid) / f"blocked-{gtree_worker(d)}.json").exists()
    assert creates(sim, "who am I") == 0


def test_a_stopped_daemon_leaves_its_generation_running_and_resumes_it(gtree, sim, daemons):
    prompt = "patient #fault=work:4"
    jid = submit(gtree, gen_sub("gen-stop", prompt))
    d = daemons(gtree, env=ENV)
    wait_for(lambda: gen_view(gtree, jid).state == "generating", timeout=30)
    d.signal(15)
    assert d.wait(timeout=30) == 0
    assert state_files(gtree)["running"] == [f"{jid}.json"]  # not returned to pending, not failed
    d2 = daemons(gtree, drain=True, env=ENV)
    assert d2.wait(timeout=60) == 0, d2.output()[-3000:]
    assert state_files(gtree)["complete"] == [f"{jid}.json"]
    assert creates(sim, prompt) == 1 and gtree.attempt_numbers(jid) == [1]
