"""Watching the queue from a terminal: status, watch, show and events, on real spools
with real daemons and real renders."""

from __future__ import annotations

import json
import os
import pty
import select
import signal
import subprocess
import time
from pathlib import Path

import pytest
from conftest import SPOOL, minimal, run_cli, wait_for, write_json

from spool.core import families, settings
from spool.disk.tree import HOST, Tree
from spool.media import samples
from spool.queue import status
from spool.queue.events import Journal


def _submit(tree: Tree, assets: Path, name: str, **over: object) -> str:
    path = write_json(tree.root.parent / f"{name}.json", minimal(assets, name=name, **over))
    return run_cli("submit", str(path), spool=tree, check=True).stdout.strip()


def _status(tree: Tree) -> dict:
    return json.loads(run_cli("status", "--json", spool=tree, check=True).stdout)


def _set(tree: Tree, section: str, **values: object) -> None:
    settings.write(tree.config_file, {section: values})


@pytest.fixture()
def slow_job(tree: Tree, assets: Path) -> str:
    """A submitted job whose render takes several seconds (a long clip, scaled up, slow preset)."""
    samples.clip(assets / "long.mp4", seconds=12.0, size="320x240", rate=25)
    sub = minimal(
        assets,
        name="slow",
        sources={"clip": str(assets / "long.mp4")},
        steps=[
            {"op": "fit", "width": 1280, "height": 720},
            {"op": "encode", "preset": "slow", "crf": 18},
        ],
    )
    run_cli("submit", str(write_json(tree.root.parent / "slow.json", sub)), spool=tree, check=True)
    return "slow@1"


def test_status_shows_a_running_render_with_progress_worker_and_disk(tree, assets, daemons, slow_job):
    _submit(tree, assets, "waiting", priority=-5)
    _set(tree, "limits", max_active=1)
    daemons(tree, "w1")

    def rendering() -> dict | None:
        r = _status(tree)
        p = r["running"][0]["progress"] if r["running"] else None
        return r if p and p["percent"] and p["fps"] and p["speed"] else None

    prog = wait_for(rendering, timeout=60)
    row = prog["running"][0]
    assert row["job_id"] == slow_job and row["worker"] == f"{HOST}-w1" and row["attempt"] == 1
    p = row["progress"]
    assert 0 < p["percent"] < 100 and p["fps"] and p["speed"] and p["eta_seconds"] is not None
    assert prog["counts"]["running"] == 1 and prog["counts"]["pending"] == 1
    assert prog["oldest_age"]["pending"] is not None
    w = prog["workers"][0]
    assert w["worker"] == f"{HOST}-w1" and w["health"] == "alive" and w["max_active"] == 1
    wait_for(lambda: _status(tree)["workers"][0]["disk_used"] > 0, timeout=30)

    human = run_cli("status", spool=tree, check=True).stdout
    line = next(x for x in human.splitlines() if slow_job in x)
    assert f"{HOST}-w1" in line and "%" in line and "fps" in line and "ETA" in line and "x " in line
    assert "\nRunning" in human and "pending 1 (oldest" in human
    lines = human.splitlines()
    workers = lines[lines.index("Workers") + 1]
    assert f"{HOST}-w1" in workers and "alive" in workers and "1/1 slots" in workers and "disk " in workers


def test_counts_come_from_names_and_are_not_parsed(tree, assets):
    """5,000 files that are not even JSON: counted, never read (100,000 jobs stay cheap)."""
    for i in range(5000):
        (tree.pending / f"junk-{i}@1.json").write_bytes(b"\xff not json")
    (tree.pending / ".hidden.json.tmp").write_bytes(b"")
    (tree.pending / "ignored.txt").write_bytes(b"")
    t = time.monotonic()
    report = _status(tree)
    assert time.monotonic() - t < 5
    assert report["counts"]["pending"] == 5000
    assert report["counts"] == status.counts(tree)


def test_ages_are_time_in_state_not_time_since_acceptance(tree, assets):
    jid = _submit(tree, assets, "old")
    hour_ago = time.time() - 3600
    os.utime(tree.job_file("pending", jid), (hour_ago, hour_ago))  # accepted an hour ago...
    report = _status(tree)
    assert report["oldest_age"]["pending"] < 60  # ...but entered pending just now (a rename sets ctime)
    assert report["oldest_age"]["incoming"] is None and report["oldest_age"]["running"] is None


def test_needs_attention_names_dead_workers_failures_rejections_and_next_actions(tree, assets, daemons):
    _submit(tree, assets, "bad", output={"expect": {"width": 999}})
    d = daemons(tree, "gone")
    wait_for(lambda: _status(tree)["counts"]["failed"] == 1)
    d.kill()  # SIGKILL: the record still says running, the process is gone
    _submit(tree, assets, "stranded")
    broken = write_json(tree.root.parent / "broken.json", {"name": "broken"})
    assert run_cli("submit", str(broken), spool=tree).returncode == 2

    items = _status(tree)["attention"]
    kinds = [i["kind"] for i in items]
    assert kinds == ["worker", "queue", "failed", "rejected"], items
    dead, queue, failed, rejected = items
    assert dead["subject"] == f"{HOST}-gone" and dead["problem"].startswith("dead: process")
    assert "systemctl restart spoold@gone" in dead["next_action"]
    assert f"spool recover --worker {HOST}-gone" in dead["next_action"]
    assert queue["problem"] == "1 job(s) waiting and no worker is alive"
    assert (
        failed["subject"] == "bad@1" and "width" in failed["problem"] and "expected 999" in failed["problem"]
    )
    assert "spool revise" in failed["next_action"]
    assert rejected["subject"] == "broken.json" and rejected["next_action"].startswith("Fix the submission")

    human = run_cli("status", spool=tree, check=True).stdout
    attention = human[human.index("Needs attention") :]
    assert f"worker    {HOST}-gone: dead" in attention and "failed    bad@1" in attention
    assert attention.count("next: ") == 4
    assert "dead" in human[human.index("\nWorkers") :]


def test_show_tells_the_story_of_a_job(tree, assets, daemons):
    jid = _submit(tree, assets, "told", output={"expect": {"height": 7}})
    assert daemons(tree, "w1", drain=True).wait() == 0
    info = json.loads(run_cli("show", jid, "--json", spool=tree, check=True).stdout)
    steps = [(e.get("from"), e["to"]) for e in info["timeline"]]
    assert steps == [("submit", "pending"), ("pending", "running"), ("running", "failed")]
    assert info["timeline"][2]["property"] == "height" and info["approvals"] == []
    assert info["attempts"][0]["worker"] == f"{HOST}-w1" and info["thumbnail"] is None

    human = run_cli("show", jid, spool=tree, check=True).stdout
    for part in ("Timeline", "submit -> pending", "pending -> running  #1", "running -> failed  #1"):
        assert part in human, part
    assert f"1  {HOST}-w1  claimed" in human and "failed at validate" in human
    assert "validate: height: the output failed the height check" in human
    assert "expected 7, got 240" in human and "next: " in human
    assert human.rstrip().endswith("Approvals\n  none")

    # An approval record (of some earlier output) is shown, marked as not the current one.
    (tree.root / "approvals" / jid).mkdir(parents=True, exist_ok=True)
    write_json(tree.root / "approvals" / jid / f"{'ab' * 32}.dana.json",
               {"job_id": jid, "sha256": "ab" * 32, "store_path": "store/x", "by": "dana", "note": "",
                "at": "2026-11-29T20:00:00Z"})  # fmt: skip
    [a] = json.loads(run_cli("show", jid, "--json", spool=tree).stdout)["approvals"]
    assert a["by"] == "dana" and a["current"] is False
    assert "dana at " in run_cli("show", jid, spool=tree).stdout


def test_show_stays_quick_with_a_large_journal(tree, assets):
    jid = _submit(tree, assets, "needle")
    j = Journal(tree, "busy-writer")
    with open(j.path, "ab") as f:  # 60,000 other jobs' lines, written the way Journal writes them
        line = json.dumps({"ts": "2026-01-01T00:00:00Z", "job": "other@1", "to": "pending"}).encode()
        f.write((line.replace(b": ", b":").replace(b", ", b",") + b"\n") * 60000)
    j.record(jid, "running", from_="pending", attempt=1, reason="claimed")
    t = time.monotonic()
    info = json.loads(run_cli("show", jid, "--json", spool=tree, check=True).stdout)
    assert time.monotonic() - t < 5
    assert [e["to"] for e in info["timeline"]] == ["pending", "running"]


def _journals(tree: Tree) -> tuple[Journal, Journal]:
    return Journal(tree, "host-a-w1"), Journal(tree, "host-b-w1")


def test_events_merges_every_writer_in_time_order(tree):
    a, b = _journals(tree)
    a.record("one@1", "pending", from_="incoming")
    b.record("two@1", "pending", from_="incoming")
    a.record("two@1", "running", from_="pending", attempt=1)
    b.record("one@1", "running", from_="pending", attempt=1)
    with open(a.path, "ab") as f:
        f.write(b'{"ts":"2099-01-01T00:00:00Z","job":"torn@1","to":"runn')  # being written: not shown yet
    out = run_cli("events", "--json", spool=tree, check=True).stdout.splitlines()
    events = [json.loads(x) for x in out]
    assert [(e["job"], e["to"]) for e in events] == [
        ("one@1", "pending"),
        ("two@1", "pending"),
        ("two@1", "running"),
        ("one@1", "running"),
    ]
    assert out[0].encode() + b"\n" == a.path.read_bytes().splitlines(keepends=True)[0]  # the journal's bytes
    only = run_cli("events", "--job", "one@1", "--json", spool=tree, check=True).stdout.splitlines()
    assert [json.loads(x)["to"] for x in only] == ["pending", "running"]
    last = run_cli("events", "-n", "1", spool=tree, check=True).stdout
    assert "one@1  pending -> running  #1  host-b-w1" in last and len(last.splitlines()) == 1


def test_events_follow_picks_up_new_lines_and_new_writers(tree):
    a, _ = _journals(tree)
    a.record("one@1", "pending", from_="incoming")
    proc = subprocess.Popen(
        [SPOOL, "events", "-f", "--json", "--spool", str(tree.root)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert json.loads(proc.stdout.readline())["job"] == "one@1"
        a.record("one@1", "running", from_="pending", attempt=1)
        assert json.loads(proc.stdout.readline())["to"] == "running"
        Journal(tree, "late-host-w9").record("one@1", "complete", from_="running", attempt=1)
        line = json.loads(proc.stdout.readline())
        assert line["to"] == "complete" and line["worker"] == "late-host-w9"
    finally:
        proc.send_signal(signal.SIGINT)
        # A bound, not a measure (it exits in ~0.2 s). Started as a script's background
        # job, as a CI run may be, it inherits SIGINT ignored: the command restores it.
        assert proc.wait(timeout=60) == 0


def test_events_until_waits_for_a_job_to_finish(tree, assets, daemons):
    jid = _submit(tree, assets, "awaited")
    waiter = subprocess.Popen(
        [SPOOL, "events", "--job", jid, "--until", "complete,failed", "--json", "--spool", str(tree.root)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert waiter.stdout is not None
    assert select.select([waiter.stdout], [], [], 30)[0], "no history printed within 30 s"
    first = waiter.stdout.readline()  # the history so far is printed: now it waits
    assert json.loads(first)["to"] == "pending" and waiter.poll() is None
    daemons(tree, "w1", drain=True)
    out, _ = waiter.communicate(timeout=60)
    assert waiter.returncode == 0
    # A waiter that had ended at "pending" would miss the rest.
    assert [json.loads(x)["to"] for x in [first, *out.splitlines()]] == ["pending", "running", "complete"]
    # Already there: returns at once with the history.
    again = run_cli("events", "--job", jid, "--until", "complete", spool=tree, check=True)
    assert again.stdout.splitlines()[-1].split("  ")[2] == "running -> complete"


def test_events_follow_ends_when_its_reader_does(tree):
    Journal(tree, "w").record("x@1", "pending", from_="incoming")
    t = time.monotonic()
    res = subprocess.run(
        f"{SPOOL} events -f --spool {tree.root} | head -n 1",
        shell=True,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert "x@1" in res.stdout and time.monotonic() - t < 10


def test_watch_redraws_from_the_filesystem_until_ctrl_c(tree, assets):
    leader, follower = pty.openpty()
    env = {**os.environ, "COLUMNS": "120", "LINES": "40", "TERM": "xterm"}
    proc = subprocess.Popen(
        [SPOOL, "watch", "--interval", "0.3", "--spool", str(tree.root)],
        stdin=follower,
        stdout=follower,
        stderr=follower,
        env=env,
        start_new_session=True,
    )
    os.close(follower)
    seen = b""

    def read_until(marker: bytes, timeout: float = 20) -> None:
        nonlocal seen
        deadline = time.monotonic() + timeout
        while marker not in seen:
            assert time.monotonic() < deadline, seen[-2000:]
            if select.select([leader], [], [], 0.2)[0]:
                seen += os.read(leader, 65536)

    try:
        read_until(b"Needs attention")
        assert b"pending 0" in seen
        _submit(tree, assets, "appears")
        read_until(b"pending 1")
        os.kill(proc.pid, signal.SIGINT)
        assert proc.wait(timeout=60) == 0  # a bound, as above
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(leader)


def test_a_read_only_viewer_does_not_take_live_workers_for_dead(tree, daemons):
    """Without write access the identity lock cannot be probed; the pid still can."""
    from spool.observe import overview
    from spool.queue import liveness

    d = daemons(tree, "ro")
    wait_for(lambda: tree.worker_file(f"{HOST}-ro").exists())
    rec = status.read(tree.worker_file(f"{HOST}-ro"), liveness.WorkerRecord)
    as_seen = liveness.WorkerHealth(rec.worker, rec.host, "dead", "process is gone (same host)", None, rec)
    fixed = overview._readonly_view(as_seen)
    assert fixed.health == "alive" and str(d.proc.pid) in fixed.reason
    d.kill()
    assert overview._readonly_view(as_seen).health == "dead"


def test_status_the_page_and_the_metrics_count_the_same_folders_the_same(tree: Tree) -> None:
    """One listing (spool.disk.tree.list_folder) behind every reader: a drop a worker has taken
    but not accepted is incoming for all three; temp names and reasons count for none."""
    from spool.observe import metrics, overview

    (tree.incoming / "a.json").write_text("{}")
    (tree.incoming / ".accepting.w1.b.json").write_text("{}")  # taken, not yet accepted
    (tree.incoming / ".c.json.tmp").write_text("{")  # still being written
    (tree.rejected / "d.json").write_text("{}")
    (tree.rejected / "d.error.json").write_text("{}")
    (tree.failed / "e@1.json").write_text("{}")
    want = {"incoming": 2, "rejected": 1, "failed": 1, "pending": 0}
    by_status = status.counts(tree)
    by_page = overview.scan_queue(tree, time.time()).counts
    view = metrics.QueueView(tree)
    fams = view.families(metrics.Own(worker="w1", pending=(0, None), beat_age=0.0), time.time())
    text = families.exposition(fams)
    for state, n in want.items():
        assert by_status[state] == n == by_page[state], (state, by_status, by_page)
        assert f'spool_jobs{{worker="w1",state="{state}"}} {n}\n' in text, (state, text[:2000])
