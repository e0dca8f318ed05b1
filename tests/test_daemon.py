"""The real daemon, as real processes: claiming once, draining, stopping well."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest
from conftest import minimal, renders_at_once, run_cli, state_files, wait_for, write_json

from spool.core import config, settings
from spool.disk.tree import HOST, Tree
from spool.media import samples


def _events(tree: Tree) -> list[dict]:
    out = []
    for f in sorted(tree.events.glob("*.jsonl")):
        out += [json.loads(line) for line in f.read_text().splitlines()]
    return sorted(out, key=lambda e: e["ts"])


def _set(tree: Tree, section: str, **values: object) -> None:
    settings.write(tree.config_file, {section: values})


def test_two_daemons_started_together_make_exactly_one_attempt(tree, assets, daemons):
    run_cli(
        "submit",
        str(write_json(tree.root.parent / "one.json", minimal(assets, name="one"))),
        spool=tree,
        check=True,
    )
    a = daemons(tree, "a", drain=True)
    b = daemons(tree, "b", drain=True)
    assert a.wait() == 0 and b.wait() == 0
    attempts = sorted(p.name for p in tree.job_attempts("one@1").iterdir() if p.name.isdigit())
    assert attempts == ["1"]
    assert state_files(tree) == {"pending": [], "complete": ["one@1.json"], "failed": [], "running": []}
    claims = [e for e in _events(tree) if e["to"] == "running"]
    assert len(claims) == 1


def test_drain_runs_everything_within_max_active(tree, assets, daemons):
    assert config.load(tree.config_file).limits.max_active == 2
    for i in range(5):
        write_json(tree.incoming / f"job-{i}.json", minimal(assets, name=f"job-{i}"))
    d = daemons(tree, "w1", drain=True)
    assert d.wait() == 0, d.output()
    assert len(state_files(tree)["complete"]) == 5
    # max_active bounds the renders (SPEC 7), not the publishes waiting for a batch.
    assert renders_at_once(d.output()) == 2, "two slots were never used at once, or more were"
    # A prepared publish waits for the loop's next batch while the freed slot renders the
    # next job: so the jobs in running/ are at most the renders plus one batch in hand.
    running = in_running = 0
    for e in _events(tree):
        if e["to"] == "running":
            running += 1
        elif e.get("from") == "running":
            running -= 1
        in_running = max(in_running, running)
    assert 2 <= in_running <= 4


def test_priority_decides_what_runs_first(tree, assets, daemons):
    _set(tree, "limits", max_active=1)
    for name, prio in [("later", 0), ("sooner", 100), ("last", -100), ("middle", 10)]:
        run_cli(
            "submit",
            str(write_json(tree.root.parent / f"{name}.json", minimal(assets, name=name, priority=prio))),
            spool=tree,
            check=True,
        )
    d = daemons(tree, "w1", drain=True)
    assert d.wait() == 0
    order = [e["job"] for e in _events(tree) if e["to"] == "running"]
    assert order == ["sooner@1", "middle@1", "later@1", "last@1"]


def test_a_worker_identity_runs_once_per_host(tree, daemons):
    first = daemons(tree, "same")
    wait_for(lambda: tree.worker_file(f"{_host()}-same").exists())
    second = daemons(tree, "same")
    assert second.wait(timeout=30) != 0
    assert "already running" in second.output()
    assert first.alive()
    first.signal(signal.SIGTERM)
    assert first.wait() == 0


def _host() -> str:
    from spool.disk.tree import HOST

    return HOST


def test_heartbeat_and_worker_record(tree, daemons):
    d = daemons(tree, "hb")
    wf = tree.worker_file(f"{_host()}-hb")
    first = wait_for(lambda: wf.exists() and json.loads(wf.read_text()))
    second = wait_for(lambda: (r := json.loads(wf.read_text()))["beats"] > first["beats"] + 1 and r)
    assert second["pid"] == d.proc.pid and second["boot_id"] and second["host"] == _host()
    assert second["heartbeat_at"] > first["heartbeat_at"]
    d.signal(signal.SIGTERM)
    assert d.wait() == 0
    assert json.loads(wf.read_text())["state"] == "stopped"


@pytest.fixture()
def long_clip(assets: Path) -> Path:
    """A source long enough that a render is still running when the test acts."""
    return samples.clip(assets / "long.mp4", seconds=30.0, size="640x360", rate=25)


def _slow(assets: Path, name: str, seconds: float = 30.0) -> dict:
    return minimal(
        assets,
        name=name,
        sources={"clip": str(assets / "long.mp4")},
        steps=[
            {"op": "trim", "duration": seconds},
            {"op": "fit", "width": 1920, "height": 1080},
            {"op": "encode", "preset": "slow", "crf": 18},
        ],
    )


def _wait_rendering(tree: Tree, jid: str) -> None:
    prog = tree.attempt_dir(jid, 1) / "progress.json"
    wait_for(lambda: prog.exists() and (json.loads(prog.read_text())["percent"] or 0) > 0, timeout=60)


def test_sigterm_lets_a_render_finish_within_the_grace_period(tree, assets, long_clip, daemons):
    _set(tree, "daemon", stop_grace=120.0)
    run_cli(
        "submit",
        str(write_json(tree.root.parent / "s.json", _slow(assets, "graceful", seconds=3.0))),
        spool=tree,
        check=True,
    )
    d = daemons(tree, "w1")
    _wait_rendering(tree, "graceful@1")
    d.signal(signal.SIGTERM)
    assert d.wait(timeout=180) == 0
    assert state_files(tree)["complete"] == ["graceful@1.json"]


def test_grace_over_interrupts_records_and_returns_the_job(tree, assets, long_clip, daemons):
    _set(tree, "daemon", stop_grace=0.5)
    run_cli(
        "submit",
        str(write_json(tree.root.parent / "s.json", _slow(assets, "cut-short"))),
        spool=tree,
        check=True,
    )
    d = daemons(tree, "w1")
    _wait_rendering(tree, "cut-short@1")
    t0 = time.monotonic()
    d.signal(signal.SIGTERM)
    assert d.wait(timeout=60) == 0
    assert time.monotonic() - t0 < 15
    assert state_files(tree)["pending"] == ["cut-short@1.json"]
    att = tree.attempt_dir("cut-short@1", 1)
    assert json.loads((att / "interrupted.json").read_text())["reason"]
    assert (att / "attempt.json").exists() and (att / "ffmpeg.log").exists()
    assert not tree.manifest_file("cut-short@1").exists()
    assert not any(p.is_file() for p in tree.store.rglob("*"))


def test_second_sigterm_interrupts_at_once(tree, assets, long_clip, daemons):
    _set(tree, "daemon", stop_grace=600.0)
    run_cli(
        "submit", str(write_json(tree.root.parent / "s.json", _slow(assets, "twice"))), spool=tree, check=True
    )
    d = daemons(tree, "w1")
    _wait_rendering(tree, "twice@1")
    d.signal(signal.SIGTERM)
    # The first signal has been taken (the worker record says so), and the render goes on.
    record = tree.worker_file(f"{_host()}-w1")
    wait_for(lambda: json.loads(record.read_text())["state"] == "stopping", timeout=30)
    assert d.alive()
    d.signal(signal.SIGTERM)
    assert d.wait(timeout=30) == 0
    assert state_files(tree)["pending"] == ["twice@1.json"]
    assert (tree.attempt_dir("twice@1", 1) / "interrupted.json").exists()


def _drop(tree: Tree, name: str, value: dict) -> None:
    tmp = tree.incoming / f".{name}.json"
    tmp.write_text(json.dumps(value))
    tmp.rename(tree.incoming / f"{name}.json")


def test_the_daemon_and_submit_apply_the_same_required_tags_after_an_edit(tree, assets, daemons):
    """A daemon that kept its start-up config accepted what ``spool submit`` refused."""
    d = daemons(tree)
    wait_for(lambda: "started on" in d.output(), timeout=30)
    _set(tree, "acceptance", required_tags=["shot"])
    sub = minimal(assets, name="untagged")
    by_cli = run_cli("submit", str(write_json(tree.root.parent / "u.json", sub)), spool=tree)
    assert by_cli.returncode == 2 and "tags.shot" in by_cli.stderr
    wait_for(lambda: "changed acceptance.required_tags" in d.output(), timeout=30)
    _drop(tree, "dropped", minimal(assets, name="untagged2"))
    wait_for(lambda: (tree.rejected / "dropped.error.json").exists(), timeout=30)
    assert "tags.shot" in json.loads((tree.rejected / "dropped.error.json").read_text())["reason"]
    assert d.alive()


def test_sighup_rereads_spool_toml_and_a_bad_file_keeps_the_old_config(tree, assets, daemons):
    d = daemons(tree)
    wait_for(lambda: "started on" in d.output(), timeout=30)
    good = tree.config_file.read_text()
    tree.config_file.write_text(good + '\n[limits]\nmax_active = "zero"\n')  # refused: keep the old
    d.signal(signal.SIGHUP)
    wait_for(lambda: "keeping the configuration loaded before" in d.output(), timeout=30)
    # More loops (a drop accepted after the refusal proves them): said once, not every poll.
    _drop(tree, "after-refusal", minimal(assets, name="after-refusal"))
    wait_for(lambda: not (tree.incoming / "after-refusal.json").exists(), timeout=30)
    assert not (tree.rejected / "after-refusal.json").exists()  # judged by the config kept
    assert d.output().count("keeping the configuration loaded before") == 1
    assert d.alive()
    record = json.loads(tree.worker_file(f"{HOST}-w1").read_text())
    assert record["state"] == "running" and record["max_active"] == 2

    tree.config_file.write_text(good)
    _set(tree, "limits", max_active=3)
    d.signal(signal.SIGHUP)
    wait_for(lambda: "changed limits.max_active" in d.output(), timeout=30)
    wait_for(lambda: json.loads(tree.worker_file(f"{HOST}-w1").read_text())["max_active"] == 3)

    tree.config_file.unlink()
    wait_for(lambda: "is gone; keeping the configuration" in d.output(), timeout=30)
    _drop(tree, "still", minimal(assets, name="still"))  # the kept config still accepts
    wait_for(lambda: not (tree.incoming / "still.json").exists(), timeout=30)
    assert d.output().count("is gone") == 1  # loops have run since: said once
    assert not (tree.rejected / "still.json").exists()
    d.signal(signal.SIGTERM)
    assert d.wait() == 0
    assert json.loads(tree.worker_file(f"{HOST}-w1").read_text())["state"] == "stopped"
