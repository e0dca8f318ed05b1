"""Worker liveness and recovery of other workers: certainty on this host, policy across hosts."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from datetime import UTC, datetime, timedelta

import invariants
from conftest import minimal, run_cli, state_files, wait_for
from libhelp import allow_noop, noop_sub

from spool.core import settings
from spool.core.model import WorkerRecord, encode
from spool.disk.tree import HOST, boot_id, write_atomic
from spool.queue import accept, liveness
from spool.queue.attempt import open_attempt


def _record(tree, worker, *, host, pid=999_999, boot=None, beat_age=0.0, beats=5, skew=0.0, device=None):
    """A worker record as a daemon writes it; ``device`` other than the spool's: written
    through another mount."""
    at = datetime.now(UTC) - timedelta(seconds=beat_age) + timedelta(seconds=skew)
    rec = WorkerRecord(
        worker=worker,
        host=host,
        pid=pid,
        boot_id=boot or boot_id(),
        started_at=at,
        heartbeat_at=at,
        beats=beats,
        max_active=2,
        device=os.stat(tree.root).st_dev if device is None else device,
    )
    path = tree.worker_file(worker)
    write_atomic(path, encode(rec))
    past = time.time() - beat_age
    os.utime(path, (past, past))  # the file server's clock says when it was last written
    return rec


def _stranded(tree, cfg, assets, worker, name="stranded"):
    """A job claimed by ``worker`` that died after its attempt started."""
    job = accept.accept_bytes(tree, cfg, json.dumps(minimal(assets, name=name)).encode(), "t")
    (tree.running / worker).mkdir(parents=True, exist_ok=True)
    os.rename(tree.job_file("pending", job.job_id), tree.job_file("running", job.job_id, worker))
    open_attempt(tree, job.job_id, worker)
    return job.job_id


def test_same_host_dead_pid_and_reboot_are_certain(tree):
    dead = _record(tree, f"{HOST}-gone", host=HOST)
    assert liveness.assess(tree, dead, 60).health == "dead"
    rebooted = _record(tree, f"{HOST}-old", host=HOST, pid=os.getpid(), boot="another-boot")
    h = liveness.assess(tree, rebooted, 60)
    assert h.health == "dead" and "rebooted" in h.reason
    # a live pid that does not hold the identity lock is a recycled pid, not the worker
    proc = subprocess.Popen(["sleep", "30"])
    try:
        recycled = _record(tree, f"{HOST}-recycled", host=HOST, pid=proc.pid)
        assert liveness.assess(tree, recycled, 60).health == "dead"
    finally:
        proc.kill()
        proc.wait()


def test_other_host_is_only_suspect_and_skew_does_not_matter(tree):
    fresh_but_skewed = _record(tree, "far-w1", host="far", beat_age=2, skew=-7200)  # clock 2 h behind
    assert liveness.assess(tree, fresh_but_skewed, 60).health == "alive"
    ahead = _record(tree, "far-w2", host="far", beat_age=2, skew=+7200)  # clock 2 h ahead
    assert liveness.assess(tree, ahead, 60).health == "alive"
    stale = _record(tree, "far-w3", host="far", beat_age=600)
    h = liveness.assess(tree, stale, 60)
    assert h.health == "suspect" and "not certain" in h.reason


def test_observer_measures_staleness_on_its_own_clock(tree):
    obs = liveness.Observer()
    rec = _record(tree, "far-w4", host="far", skew=+99999)  # wildly wrong clock
    assert liveness.assess(tree, rec, 0.2, observer=obs).health == "alive"
    time.sleep(0.3)
    assert liveness.assess(tree, rec, 0.2, observer=obs).health == "suspect"  # no new beat seen
    rec.beats += 1
    assert liveness.assess(tree, rec, 0.2, observer=obs).health == "alive"  # it advanced


def test_recover_acts_on_dead_workers_and_only_names_suspects(tree, cfg, assets, daemons):
    _record(tree, f"{HOST}-dead", host=HOST)
    _record(tree, "far-sleepy", host="far", beat_age=3600)
    a = _stranded(tree, cfg, assets, f"{HOST}-dead", "from-dead")
    b = _stranded(tree, cfg, assets, "far-sleepy", "from-suspect")

    dry = json.loads(run_cli("recover", "--dry-run", "--json", spool=tree, check=True).stdout)
    by = {w["worker"]: w for w in dry["workers"]}
    assert by[f"{HOST}-dead"]["health"] == "dead" and by[f"{HOST}-dead"]["act"]
    assert by["far-sleepy"]["health"] == "suspect" and not by["far-sleepy"]["act"]
    assert by["far-sleepy"]["jobs"][0]["decision"] == "retry"
    assert state_files(tree)["running"] == sorted([f"{a}.json", f"{b}.json"])  # dry run changed nothing

    run_cli("recover", spool=tree, check=True)
    assert state_files(tree)["pending"] == [f"{a}.json"]
    assert state_files(tree)["running"] == [f"{b}.json"]  # a suspect is left alone...
    out = run_cli("recover", "--worker", "far-sleepy", spool=tree, check=True).stdout
    assert "suspect" in out and "asked for by an operator" in out  # ...until an operator names it
    assert state_files(tree)["pending"] == sorted([f"{a}.json", f"{b}.json"])
    rec = json.loads(next(tree.job_attempts(b).glob("recovery-*.json")).read_text())
    assert rec["decision"] == "retry" and "suspect" in rec["worker_state"]
    assert rec["evidence"]["worker"] == "far-sleepy" and rec["evidence"]["attempt"] == 1

    d = daemons(tree, "w1", drain=True)
    assert d.wait(timeout=120) == 0
    assert state_files(tree)["complete"] == sorted([f"{a}.json", f"{b}.json"])
    assert invariants.check(tree.root) == []


def test_a_recoverer_killed_right_after_its_takeover_judges_the_dead_workers_attempt(tree, daemons):
    """The takeover (a rename into the recoverer's running/) is durable before any decision:
    killed there, the restarted recoverer finds the job in its own folder with the dead
    worker's attempt as the latest. That attempt is still this claim's: its valid output is
    published, not thrown away for a retry, which with one attempt allowed failed the job."""
    from spool import kinds

    cfg = allow_noop(tree, limits={"max_attempts": 1})
    job = accept.accept_bytes(tree, cfg, noop_sub("taken"), "t")
    dead = f"{HOST}-crashed"
    (tree.running / dead).mkdir(parents=True, exist_ok=True)
    os.rename(tree.job_file("pending", job.job_id), tree.job_file("running", job.job_id, dead))
    att = open_attempt(tree, job.job_id, dead)
    out = kinds.of(job).candidate(job, att.dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(job.job_id.encode())  # the dead worker finished its work; nothing judged it
    _record(tree, dead, host=HOST)

    d = daemons(tree, "w1", env={"SPOOL_CRASH_AT": "after_takeover"})
    assert d.wait(timeout=60) == -signal.SIGKILL
    me = f"{HOST}-w1"
    assert state_files(tree)["running"] == [f"{job.job_id}.json"]
    assert tree.job_file("running", job.job_id, me).exists()  # taken over, then killed

    d = daemons(tree, "w1", drain=True)
    assert d.wait(timeout=120) == 0
    assert state_files(tree)["complete"] == [f"{job.job_id}.json"]
    (rec,) = [json.loads(p.read_text()) for p in tree.job_attempts(job.job_id).glob("recovery-*.json")]
    assert rec["decision"] == "accept-candidate" and rec["evidence"]["attempt"] == 1
    assert invariants.check(tree.root) == []


def test_running_daemon_recovers_a_dead_same_host_worker_by_itself(tree, cfg, assets, daemons):
    jid = _stranded(tree, cfg, assets, f"{HOST}-crashed")
    _record(tree, f"{HOST}-crashed", host=HOST)
    d = daemons(tree, "w1")
    wait_for(lambda: (tree.complete / f"{jid}.json").exists(), timeout=60)
    assert d.alive()
    assert invariants.check(tree.root, settled=False) == []


def test_daemon_leaves_a_suspect_other_host_worker_alone_by_default(tree, cfg, assets, daemons):
    jid = _stranded(tree, cfg, assets, "far-quiet")
    _record(tree, "far-quiet", host="far", beat_age=3600)
    settings.write(tree.config_file, {"recovery": {"stale_after": 0.5}})
    d = daemons(tree, "w1")
    wait_for(lambda: "started on" in d.output(), timeout=30)  # 3 s of its loop, not of its start-up
    time.sleep(3)  # six times stale_after: a policy that took it over would have by now
    assert state_files(tree)["running"] == [f"{jid}.json"]
    d.signal(signal.SIGTERM)
    d.wait()
    # with auto_recover on, the same situation is taken over by policy
    settings.write(tree.config_file, {"recovery": {"auto_recover": True}})
    d = daemons(tree, "w2")
    wait_for(lambda: (tree.complete / f"{jid}.json").exists(), timeout=60)
    d.signal(signal.SIGTERM)
    d.wait()


def test_a_stopped_daemon_is_stalled_under_needs_attention_and_recovers_when_continued(tree, daemons):
    """A real daemon, really stopped with SIGSTOP: its pid lives, its heartbeat does not."""
    settings.write(tree.config_file, {"recovery": {"stale_after": 2.0}})
    d = daemons(tree)
    worker = f"{HOST}-w1"
    wait_for(lambda: tree.worker_file(worker).exists(), timeout=30)

    def health() -> tuple[str, list[dict]]:
        out = json.loads(run_cli("status", "--json", spool=tree, check=True).stdout)
        (w,) = [w for w in out["workers"] if w["worker"] == worker]
        return w["health"], [a for a in out["attention"] if a["subject"] == worker]

    assert health() == ("alive", [])
    d.signal(signal.SIGSTOP)
    try:
        time.sleep(3.0)
        state, items = health()
        assert state == "stalled"
        (item,) = items
        assert item["problem"].startswith("stalled: process ") and "stopped or hung" in item["problem"]
        assert f"kill -CONT {d.proc.pid}" in item["next_action"] and "--force" in item["next_action"]
        human = run_cli("status", spool=tree, check=True).stdout
        assert "stalled" in human and "Needs attention: nothing" not in human
    finally:
        d.signal(signal.SIGCONT)
    wait_for(lambda: health()[0] == "alive", timeout=30)
    assert d.alive()


# -- a worker gone while writing through another mount ------------------------------------


def test_a_death_seen_through_another_mount_settles_for_mount_lag(tree):
    """Dead is certain at once; what it wrote through another mount shows here only once
    that mount's caches let it: recovery waits mount_lag from the first sighting."""
    here = os.stat(tree.root).st_dev
    gone = liveness.Gone()
    same = _record(tree, f"{HOST}-here", host=HOST)
    assert liveness.assess(tree, same, 60).health == "dead"
    assert liveness.settles_in(tree, same, 0.3, gone) == 0.0
    other = _record(tree, f"{HOST}-there", host=HOST, device=here + 1)
    assert liveness.assess(tree, other, 60).health == "dead"
    assert liveness.settles_in(tree, other, 0.3, gone) == 0.3  # seen just now
    assert liveness.settles_in(tree, other, 0.3) == 0.3  # a one-shot look: just now as well
    time.sleep(0.15)
    assert 0.0 < liveness.settles_in(tree, other, 0.3, gone) < 0.2  # counted from the first sighting
    time.sleep(0.2)
    assert liveness.settles_in(tree, other, 0.3, gone) == 0.0
    # a record from a daemon that did not say its device: it may have been another mount
    assert liveness.settles_in(tree, _record(tree, f"{HOST}-older", host=HOST, device=0), 0.3, gone) == 0.3
    # after a reboot every cache here was filled after its last write
    rebooted = _record(tree, f"{HOST}-before", host=HOST, boot="another-boot", device=here + 1)
    assert liveness.settles_in(tree, rebooted, 0.3, gone) == 0.0
    # the same worker started again is a new process: its own wait
    again = _record(tree, f"{HOST}-there", host=HOST, pid=999_998, device=here + 1)
    assert liveness.settles_in(tree, again, 0.3, gone) == 0.3


def test_recovery_of_a_worker_gone_through_another_mount_waits_then_acts(tree, cfg, assets):
    from spool.queue.events import Journal
    from spool.queue.execute import Context
    from spool.repair import recover

    w = f"{HOST}-elsewhere"
    _record(tree, w, host=HOST, device=os.stat(tree.root).st_dev + 1)
    jid = _stranded(tree, cfg, assets, w)
    cfg.recovery.mount_lag = 0.5
    ctx = Context(tree, cfg, f"{HOST}-r", Journal(tree, f"{HOST}-r"), threading.Event())
    gone = liveness.Gone()
    [p] = recover.plan(ctx, gone=gone)
    assert p.health == "dead" and not p.act and 0.4 < p.wait <= 0.5
    assert "another mount" in p.why and "mount_lag" in p.why
    assert recover.execute_plan(ctx, [p]) == []  # a plan that waits does nothing
    assert state_files(tree)["running"] == [f"{jid}.json"]
    time.sleep(0.55)
    [p] = recover.plan(ctx, gone=gone)
    assert p.act and p.wait == 0.0
    [o] = recover.execute_plan(ctx, [p])
    assert o.job_id == jid and state_files(tree)["pending"] == [f"{jid}.json"]


def test_spool_recover_waits_out_mount_lag_before_it_acts(tree, cfg, assets):
    w = f"{HOST}-elsewhere"
    _record(tree, w, host=HOST, device=os.stat(tree.root).st_dev + 1)
    jid = _stranded(tree, cfg, assets, w)
    settings.write(tree.config_file, {"recovery": {"mount_lag": 1.0}})
    dry = json.loads(run_cli("recover", "--dry-run", "--json", spool=tree, check=True).stdout)
    assert not dry["workers"][0]["act"] and "mount_lag" in dry["workers"][0]["why"]
    t0 = time.monotonic()
    r = run_cli("recover", spool=tree, check=True)
    assert time.monotonic() - t0 >= 1.0
    assert "waiting 1 s" in r.stderr and f"recovered {jid}" in r.stdout
    assert state_files(tree)["pending"] == [f"{jid}.json"]


def test_running_daemon_recovers_a_worker_gone_through_another_mount_after_mount_lag(
    tree, cfg, assets, daemons
):
    jid = _stranded(tree, cfg, assets, f"{HOST}-far-mount")
    _record(tree, f"{HOST}-far-mount", host=HOST, device=os.stat(tree.root).st_dev + 1)
    settings.write(tree.config_file, {"recovery": {"mount_lag": 2.0}})
    d = daemons(tree, "w1")
    wait_for(lambda: (tree.complete / f"{jid}.json").exists(), timeout=60)
    started = json.loads(tree.worker_file(f"{HOST}-w1").read_text())["started_at"]
    lines = [json.loads(x) for f in tree.events.glob("*.jsonl") for x in f.read_text().splitlines()]
    [back] = [e for e in lines if e["job"] == jid and e["to"] == "pending"]
    assert "recovery" in back["reason"]
    # not before mount_lag from the first sighting, which came after the daemon started
    assert _epoch(back["ts"]) - _epoch(started) >= 2.0
    assert d.alive()
    assert invariants.check(tree.root, settled=False) == []


def _epoch(iso: str) -> float:
    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


def test_a_worker_restarted_on_another_mount_adopts_its_jobs_after_mount_lag(tree, cfg, assets, daemons):
    """The previous process of this very identity wrote through another mount: its own
    jobs wait as another worker's would."""
    jid = _stranded(tree, cfg, assets, f"{HOST}-w1")
    _record(tree, f"{HOST}-w1", host=HOST, device=os.stat(tree.root).st_dev + 1)
    settings.write(tree.config_file, {"recovery": {"mount_lag": 2.0}})
    d = daemons(tree, "w1")
    wait_for(lambda: (tree.complete / f"{jid}.json").exists(), timeout=60)
    assert "wrote through another mount: its jobs wait 2 s" in d.output()
    started = json.loads(tree.worker_file(f"{HOST}-w1").read_text())["started_at"]
    lines = [json.loads(x) for f in tree.events.glob("*.jsonl") for x in f.read_text().splitlines()]
    [back] = [e for e in lines if e["job"] == jid and e["to"] == "pending"]
    assert "recovery" in back["reason"] and _epoch(back["ts"]) - _epoch(started) >= 2.0


def test_a_daemons_recovery_policy_reads_nothing_of_a_live_workers_jobs(tree, cfg, assets, monkeypatch):
    """Every few seconds a daemon's AutoRecover plans for each other worker with jobs in
    running/. A live one is left alone, so its jobs are not judged: judging one reads its
    file, its attempts, records and manifest, a dozen requests each on a NAS (an OPENDIR
    of attempts/J for every job of every other live worker, every tick). ``spool recover``
    still reports what it would decide for them."""
    from types import SimpleNamespace

    from spool.queue.events import Journal
    from spool.queue.execute import Context
    from spool.repair import recover
    from spoold.policies import AutoRecover

    jid = _stranded(tree, cfg, assets, "far-busy")
    _record(tree, "far-busy", host="far")  # another host, its heartbeat fresh: alive
    ctx = Context(tree, cfg, f"{HOST}-r", Journal(tree, f"{HOST}-r"), threading.Event())
    [reported] = recover.plan(ctx, auto=True)
    assert reported.health == "alive" and not reported.act
    assert [o.job_id for o in reported.jobs] == [jid]  # the report judges each job

    judged: list[str] = []
    real = recover.recover
    monkeypatch.setattr(recover, "recover", lambda c, j, **kw: judged.append(j) or real(c, j, **kw))
    daemon = SimpleNamespace(ctx=ctx, cfg=cfg, stopping=False, carry_on=lambda o: None)
    AutoRecover().tick(daemon)
    assert judged == []
    assert state_files(tree)["running"] == [f"{jid}.json"]


def test_a_daemons_recovery_policy_lists_running_again_only_when_it_changed(tree, cfg, assets, monkeypatch):
    """AutoRecover plans every few seconds, and each plan listed ``running/`` (over a NAS
    six round trips, most finding the same worker folders): it is now kept while a stat
    shows the folder unchanged (spool.disk.kept). A worker that claims for the first time
    makes its folder, which changes ``running/``: its dead owner's jobs are still found."""
    from spool.queue.events import Journal
    from spool.queue.execute import Context
    from spool.repair import recover

    (tree.running / f"{HOST}-r").mkdir(parents=True, exist_ok=True)
    past = int((time.time() - 60) * 1e9)
    os.utime(tree.running, ns=(past, past))  # last changed a minute ago
    ctx = Context(tree, cfg, f"{HOST}-r", Journal(tree, f"{HOST}-r"), threading.Event())
    listed: list[str] = []
    real = os.scandir
    monkeypatch.setattr(os, "scandir", lambda p=".": listed.append(os.fspath(p)) or real(p))
    for _ in range(3):
        assert recover.plan(ctx, auto=True, report=False) == []
    assert listed.count(os.fspath(tree.running)) == 1
    jid = _stranded(tree, cfg, assets, f"{HOST}-gone")  # makes running/<worker>/
    _record(tree, f"{HOST}-gone", host=HOST)  # this host, its pid gone: dead
    [p] = recover.plan(ctx, auto=True, report=False)
    assert p.worker == f"{HOST}-gone" and p.act and [o.job_id for o in p.jobs] == [jid]
    assert listed.count(os.fspath(tree.running)) == 2
