"""The daemon's policies as parts (spoold/policies.py): each part's decision on a real
daemon object over a real spool (not run: the parts are called as the loop calls them),
the composition every daemon runs with, and the named surface they act through."""

from __future__ import annotations

import errno
import json
import logging
import re
from pathlib import Path

import pytest

from spool.core import config, settings
from spool.repair import recover
from spoold import policies
from spoold.daemon import Daemon
from spoold.hooks import Hook
from spoold.notify import SystemdNotify
from spoold.observers import Metrics, Thumbnails

POLICIES = [
    policies.LeftoverSweep,
    policies.HostQuarantine,
    policies.Backoff,
    policies.ConfigReload,
    policies.OrphanRecovery,
    policies.IndexTidy,
    policies.AutoRecover,
]


def _daemon(tree, *hooks: Hook) -> tuple[Daemon, list[tuple[float, str]]]:
    """A daemon whose pauses are recorded, not slept (the loop's own pause is a wait on
    its waker; what a part asks for is what is checked)."""
    d = Daemon(tree, config.load(tree.config_file), "probe", hooks=list(hooks))
    paused: list[tuple[float, str]] = []

    def pause(seconds: float, why: str) -> bool:
        paused.append((seconds, why))
        return True

    d.pause = pause  # type: ignore[method-assign]
    return d, paused


def _beat(tree) -> dict:
    return json.loads(tree.worker_file("probe").read_text())


def _raised(exc: Exception) -> Exception:
    """``exc`` as the loop catches it: raised, with its traceback."""
    try:
        raise exc
    except Exception as caught:
        return caught


def test_every_daemon_composes_each_policy_once_before_its_observers(tree):
    d = Daemon(tree, config.load(tree.config_file), "probe")
    names = [type(h).__name__ for h in d.hooks]
    assert names == [p.__name__ for p in POLICIES] + ["SystemdNotify", "Metrics", "Thumbnails"]
    assert [type(h) for h in policies.policies(tree, d.cfg)] == POLICIES
    assert isinstance(d.hooks[-3], SystemdNotify) and isinstance(d.hooks[-2], Metrics)
    assert isinstance(d.hooks[-1], Thumbnails)


def test_parts_use_the_daemons_named_surface_never_a_private_attribute():
    here = Path(policies.__file__).parent
    for module in ("policies.py", "observers.py", "notify.py"):
        text = (here / module).read_text()
        assert not re.findall(r"daemon\._\w+", text), module


def test_a_full_disk_in_the_loop_is_a_state_said_once_and_ends_with_a_written_heartbeat(tree, caplog):
    backoff = policies.Backoff(config.load(tree.config_file))
    d, paused = _daemon(tree, backoff)
    full = _raised(OSError(errno.ENOSPC, "No space left on device", str(tree.pending / "x")))
    with caplog.at_level(logging.INFO, logger="spoold"):
        backoff.step_failed(d, "loop", full)
        backoff.step_failed(d, "loop", full)
    assert d.disk_full_since is not None and _beat(tree)["state"] == "disk_full"
    poll = d.cfg.daemon.poll_interval
    assert [s for s, _ in paused] == [poll, poll * 2]
    assert paused[0][1].startswith("disk full: No space left on device writing")
    assert caplog.text.count("disk is full") == 1

    d.beat_written = False  # a step that wrote nothing proves nothing
    backoff.step_done(d, "loop")
    assert d.disk_full_since is not None and backoff.backoff.failures == 2
    d.beat_written = True
    with caplog.at_level(logging.INFO, logger="spoold"):
        backoff.step_done(d, "loop")
    assert d.disk_full_since is None and backoff.backoff.failures == 0
    assert "has space again after" in caplog.text


def test_another_failing_step_is_a_traceback_once_then_one_line_with_a_growing_wait(tree, caplog):
    backoff = policies.Backoff(config.load(tree.config_file))
    d, paused = _daemon(tree, backoff)
    with caplog.at_level(logging.INFO, logger="spoold"):
        for _ in range(3):
            backoff.step_failed(d, "loop", _raised(RuntimeError("NAS hiccup")))
    assert caplog.text.count("Traceback") == 1 and caplog.text.count("loop step failed again") == 2
    poll = d.cfg.daemon.poll_interval
    assert paused == [(poll * k, "retrying after: RuntimeError: NAS hiccup") for k in (1, 2, 4)]
    assert d.disk_full_since is None


def test_a_full_disk_at_start_is_said_once_and_space_again_once(tree, caplog):
    backoff = policies.Backoff(config.load(tree.config_file))
    d, paused = _daemon(tree, backoff)
    with caplog.at_level(logging.INFO, logger="spoold"):
        for _ in range(3):
            backoff.step_failed(d, "start", OSError(errno.EDQUOT, "Disk quota exceeded"))
        backoff.step_done(d, "start")
    assert caplog.text.count("cannot start: the spool's disk is full (Disk quota exceeded)") == 1
    assert caplog.text.count("has space again; going on") == 1
    assert [why for _, why in paused] == ["disk full: waiting for space to start"] * 3
    assert backoff.backoff.failures == 0 and d.disk_full_since is None  # a start is not the loop's state


def test_a_changed_spool_toml_is_applied_and_a_hangup_forces_a_reread(tree, caplog):
    d, _ = _daemon(tree)
    cfg = d.cfg
    reload = policies.ConfigReload(tree, cfg)
    now = [0.0]
    reload.reloader = config.Reloader(tree.config_file, cfg, clock=lambda: now[0])
    d.hooks = [reload]
    reload.before_step(d)
    assert d.cfg is cfg, "nothing changed, nothing applied"

    settings.write(tree.config_file, {"limits": {"max_active": 5}, "daemon": {"incoming_quiet": 3.0}})
    d.stopping = True
    reload.before_step(d)
    assert d.cfg is cfg, "a stopping daemon reloads nothing"
    d.stopping = False
    d._wake_in = None
    reload.before_step(d)
    assert d.cfg is cfg, "an edit just seen may be half-written: not applied yet"
    assert d._wake_in == config.SETTLE, "the loop looks again once it has settled"
    now[0] += config.SETTLE
    reload.before_step(d)
    assert d.cfg.limits.max_active == 5 and d.ctx.cfg is d.cfg
    assert d.heartbeat.rec.max_active == 5 and d.arrivals.quiet == 3.0
    assert d.pools.capacity["render"] == 5

    with caplog.at_level(logging.INFO, logger="spoold"):
        reload.before_step(d)  # unchanged, not asked: not even read
        assert caplog.text == ""
        d.hangups += 1
        reload.before_step(d)
    assert "nothing changed" in caplog.text


def test_orphans_are_recovered_when_due_and_a_failed_try_waits_twice_as_long(tree, monkeypatch):
    orphans = policies.Orphans()
    orphans.add("a@1")
    orphans.add("b@1", after=60.0)
    assert orphans and [j for j, _ in orphans.due(1e12)] == ["a@1", "b@1"]
    d, _ = _daemon(tree, policies.OrphanRecovery())
    d.orphans = orphans
    tried: list[str] = []

    def failing(ctx, job_id, **kw):
        tried.append(job_id)
        raise OSError(errno.EIO, "the NAS went away")

    monkeypatch.setattr(recover, "recover", failing)
    d.hooks[0].before_step(d)
    assert tried == ["a@1"], "b@1 is not due yet"
    assert "a@1" in orphans and orphans.due(1e12)[0] == ("a@1", 2.0)
    d.hooks[0].before_step(d)
    assert tried == ["a@1"], "a failed try waits (2 s) before the next"

    monkeypatch.setattr(recover, "recover", lambda ctx, job_id, **kw: None)  # gone meanwhile
    orphans.add("a@1")
    d.hooks[0].before_step(d)
    assert "a@1" not in orphans and "b@1" in orphans


def test_the_index_is_not_tidied_in_format_1(tree, monkeypatch):
    (tree.root / "FORMAT").unlink(missing_ok=True)
    tidy = policies.IndexTidy()
    d, _ = _daemon(tree, tidy)
    monkeypatch.setattr(policies.segments, "due", lambda *a: pytest.fail("format 1 has no segments"))
    tidy.tick(d)
    assert tidy.thread is None
