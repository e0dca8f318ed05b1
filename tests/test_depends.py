"""Jobs whose sources are other jobs (SPEC 11.12): waiting visibly, frozen to the upstream's
exact store object, held with the reason when the upstream fails, is cancelled or is
superseded; cycles and unknown names rejected with the path of names."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any

import invariants
import pytest
from conftest import TAGS, minimal, run_cli, wait_for
from libhelp import publish

from spool.core.config import Config
from spool.core.errors import InvalidInput
from spool.core.faults import OTHER_POINTS
from spool.disk.tree import Tree
from spool.observe.eventlog import history
from spool.queue import accept, claim, depends, execute, intent
from spool.queue.context import Context
from spool.queue.events import Journal
from spool.repair import fsck


def upstream(assets: Path, name: str = "master", **over: Any) -> dict[str, Any]:
    return minimal(
        assets,
        name=name,
        steps=[{"op": "trim", "duration": 1.0}, {"op": "encode", "preset": "ultrafast"}],
        **over,
    )


def dependent(name: str, ref: dict[str, str], **over: Any) -> dict[str, Any]:
    sub: dict[str, Any] = {
        "name": name,
        "sources": {"clip": ref},
        "recipe": {
            "input": "clip",
            "steps": [
                {"op": "fit", "width": 96, "height": 96, "mode": "crop"},
                {"op": "text", "text": "Hi", "size": 12, "box": True, "fit": "shrink"},
                {"op": "encode", "preset": "ultrafast"},
            ],
        },
        "tags": dict(TAGS),
    }
    sub.update(over)
    return sub


def accept_sub(tree: Tree, cfg: Config, sub: dict[str, Any]) -> str:
    return accept.accept_bytes(tree, cfg, json.dumps(sub).encode(), "tester").job_id


def state(tree: Tree, jid: str) -> str | None:
    from spool.queue.status import locate

    loc = locate(tree, jid)
    return loc.state if loc else None


def job_file(tree: Tree, jid: str) -> dict[str, Any]:
    from spool.queue.status import locate

    loc = locate(tree, jid)
    assert loc is not None
    return json.loads(loc.path.read_text())


def settle(tree: Tree, cfg: Config, journal: Journal, *changed: str) -> depends.Settled:
    """What the daemon does after its own transitions (and its sweep when ``changed`` is empty)."""
    return depends.settle(tree, cfg, journal, changed=list(changed) if changed else None)


def run(tree: Tree, cfg: Config, jid: str) -> str:
    assert claim.claim(tree, "w1", jid)
    ctx = Context(tree, cfg, "w1", Journal(tree, "w1"), threading.Event())
    return execute.execute(ctx, jid)


# -- invariant 12 through a real daemon ----------------------------------------------------------


def test_a_dependent_waits_visibly_then_renders_from_the_upstreams_exact_bytes(tree, cfg, assets, daemons):
    accept_sub(tree, cfg, upstream(assets))
    jid = accept_sub(tree, cfg, dependent("cut", {"job": "master"}))
    assert state(tree, jid) == "waiting"
    assert (tree.deps / "master" / jid).exists()
    st = json.loads(run_cli("status", "--json", spool=tree, check=True).stdout)
    assert st["counts"]["waiting"] == 1 and st["counts"]["pending"] == 1
    shown = json.loads(run_cli("show", jid, "--json", spool=tree, check=True).stdout)
    assert shown["state"] == "waiting"
    assert shown["upstream"] == [
        {"role": "clip", "ref": "master", "job": "master@1", "state": "pending", "sha256": None}
    ]
    assert "waits for master@1 (pending)" in shown["waiting_reason"]

    daemons(tree, drain=True).wait()

    assert state(tree, jid) == "complete"
    job = job_file(tree, jid)
    m = json.loads(tree.manifest_file("master@1").read_text())
    up = job["upstreams"][0]
    assert up["job"] == "master@1" and up["sha256"] == m["output"]["sha256"]
    clip = next(s for s in job["sources"] if s["role"] == "clip")
    assert clip["sha256"] == m["output"]["sha256"] and clip["path"] == str(
        tree.root / m["output"]["store_path"]
    )
    mine = json.loads(tree.manifest_file(jid).read_text())
    assert {s["role"]: s["sha256"] for s in mine["sources"]}["clip"] == m["output"]["sha256"]
    lines = [(e.from_, e.to) for e in history(tree, jid)]
    assert lines[0] == ("waiting", "pending")  # (accepted in-process: acceptance's line is submit's)
    down = json.loads(run_cli("show", "master@1", "--json", spool=tree, check=True).stdout)["downstream"]
    assert down == [{"job": jid, "role": "clip", "state": "complete", "frozen": True}]
    assert invariants.check(tree.root) == []
    assert [p for p in fsck.check(tree, repair=False) if p.open] == []


def test_the_folders_a_change_concerns_are_listed_again_only_when_deps_changed(tree, monkeypatch):
    # The daemon asks after nearly every step; deps/ is listed again only when it changed
    # (a stat otherwise), and a ref folder another process makes is seen at the next ask.
    # A listing in the second of a change is not kept (spool.disk.kept's racy rule).
    tree.deps.mkdir(exist_ok=True)
    _changed_a_minute_ago(tree.deps)
    listed: list[str] = []
    real = depends.os.listdir
    monkeypatch.setattr(depends.os, "listdir", lambda p: listed.append(str(p)) or real(p))
    assert depends.affected(tree, ["mug@1"]) == set()
    assert depends.affected(tree, ["mug@1", "logo@2"]) == set()
    assert listed == [str(tree.deps)]  # once: nothing changed in between
    (tree.deps / "mug").mkdir()  # another process's dependent of "mug"
    (tree.deps / "mug@1").mkdir()
    assert depends.affected(tree, ["mug@2"]) == {"mug", "mug@1"}
    assert depends.affected(tree, ["logo@1"]) == set()
    assert listed == [str(tree.deps)] * 3, "a listing in the second of a change is not kept"
    _changed_a_minute_ago(tree.deps)
    assert depends.affected(tree, ["logo@1"]) == set()
    assert depends.affected(tree, ["mug@2"]) == {"mug", "mug@1"}
    assert listed == [str(tree.deps)] * 4


def _changed_a_minute_ago(*folders: Path) -> None:
    """Folders as a daemon finds them between changes: their mtimes in the past, outside
    the racy window of spool.disk.kept (a test makes and looks in the same second)."""
    past = int((time.time() - 60) * 1e9)
    for f in folders:
        os.utime(f, ns=(past, past))


def test_the_recipe_hash_names_the_upstream_object(tree, cfg, assets):
    publish(tree, cfg, upstream(assets))
    jid = accept_sub(tree, cfg, dependent("cut", {"job": "master@1"}))
    assert state(tree, jid) == "pending"  # published already: frozen at once
    from spool import kinds

    job = kinds.decode_job(tree.job_file("pending", jid).read_bytes())
    kind = kinds.of(job)
    assert job.recipe_hash == kind.spec_hash(job)
    other = job.upstreams[0].__class__(role="clip", ref="master@1", job="master@1", sha256="0" * 64)
    import msgspec

    assert kind.spec_hash(msgspec.structs.replace(job, upstreams=[other])) != job.recipe_hash


# -- acceptance --------------------------------------------------------------------------------


def test_unknown_names_and_cycles_are_rejected_with_the_path_of_names(tree, cfg, assets):
    with pytest.raises(InvalidInput) as err:
        accept_sub(tree, cfg, dependent("cut", {"job": "nobody"}))
    assert err.value.field == "sources.clip.job" and "nobody" in str(err.value)
    with pytest.raises(InvalidInput) as err:
        accept_sub(tree, cfg, dependent("cut", {"job": "cut"}))
    assert "cycle: cut@1 -> cut@1" in str(err.value)
    accept_sub(tree, cfg, upstream(assets, "a"))
    accept_sub(tree, cfg, dependent("b", {"job": "a"}))
    with pytest.raises(InvalidInput) as err:  # a@2 would wait for b, which waits for a's newest: a@2
        accept_sub(tree, cfg, dependent("a", {"job": "b"}, revision=2, supersedes="a@1"))
    assert err.value.field == "sources.clip" and "cycle: a@2 -> b@1 -> a@2" in str(err.value)
    with pytest.raises(InvalidInput) as err:
        accept_sub(tree, cfg, dependent("c", {"job": "a", "asset": "x=y"}))
    assert err.value.field == "sources.clip"
    assert not any(tree.waiting.glob("a@2.json"))


def test_an_asset_query_names_exactly_one_published_asset(tree, cfg, assets):
    publish(tree, cfg, upstream(assets, "hero", tags={**TAGS, "asset_type": "master"}))
    publish(tree, cfg, upstream(assets, "alt1", tags={**TAGS, "asset_type": "alt"}))
    publish(tree, cfg, upstream(assets, "alt2", tags={**TAGS, "asset_type": "alt"}))
    jid = accept_sub(tree, cfg, dependent("cut", {"asset": "campaign=mug,asset_type=master"}))
    assert state(tree, jid) == "pending"
    assert job_file(tree, jid)["upstreams"][0]["job"] == "hero@1"
    with pytest.raises(InvalidInput, match="matches 2 assets"):
        accept_sub(tree, cfg, dependent("cut2", {"asset": "asset_type=alt"}))
    with pytest.raises(InvalidInput, match="matches no published asset"):
        accept_sub(tree, cfg, dependent("cut3", {"asset": "asset_type=nothing"}))


def test_a_kind_that_takes_no_source_refuses_one_from_a_job(tree, cfg, assets):
    accept_sub(tree, cfg, upstream(assets))
    sub = {"name": "g", "operation": "noop", "sources": {"clip": {"job": "master"}}, "tags": TAGS}
    with pytest.raises(InvalidInput) as err:
        accept_sub(tree, cfg, sub)
    assert err.value.field == "sources.clip"


# -- held, released, re-resolved ---------------------------------------------------------------


def test_a_failed_upstream_holds_its_dependents_until_released_after_a_retry(tree, cfg, assets, journal):
    up = accept_sub(tree, cfg, upstream(assets, output={"expect": {"width": 7}}))  # fails its gate
    jid = accept_sub(tree, cfg, dependent("cut", {"job": "master"}))
    assert run(tree, cfg, up) == "failed"
    done = settle(tree, cfg, journal, up)
    assert done.held == [jid] and state(tree, jid) == "held"
    rec = depends.hold_record(tree, jid)
    assert rec is not None and rec.cause == "failed" and rec.upstream == "master@1"
    assert "spool release" in rec.next_action
    with pytest.raises(InvalidInput, match=r"still|failed"):
        intent.release(tree, jid, "op", journal, cfg)
    # The fix: the upstream is retried (here: its file, no longer failing) and the dependent released.
    intent.retry_job(tree, up, "op", journal)
    assert intent.release(tree, jid, "op", journal, cfg) == "waiting"
    assert depends.hold_record(tree, jid) is None
    assert state(tree, jid) == "waiting"


def test_a_new_revision_of_a_failed_upstream_re_resolves_its_held_dependents(tree, cfg, assets, journal):
    up = accept_sub(tree, cfg, upstream(assets, output={"expect": {"width": 7}}))
    jid = accept_sub(tree, cfg, dependent("cut", {"job": "master"}))
    run(tree, cfg, up)
    settle(tree, cfg, journal, up)
    assert state(tree, jid) == "held"
    fixed = publish(tree, cfg, upstream(assets, revision=2, supersedes="master@1"))
    done = settle(tree, cfg, journal, fixed)
    assert done.waiting == [jid] and done.pending == [jid]
    assert job_file(tree, jid)["upstreams"][0]["job"] == "master@2"
    assert run(tree, cfg, jid) == "complete"
    assert invariants.check(tree.root) == []


def test_a_cancelled_upstream_holds_its_dependents_with_the_reason(tree, cfg, assets, journal):
    up = accept_sub(tree, cfg, upstream(assets))
    jid = accept_sub(tree, cfg, dependent("cut", {"job": "master"}))
    intent.cancel(tree, up, "op", journal)
    settle(tree, cfg, journal)  # the sweep: no event of this process told it
    rec = depends.hold_record(tree, jid)
    assert state(tree, jid) == "held" and rec is not None and rec.cause == "cancelled"
    assert any(e.to == "held" and "cancelled" in (e.reason or "") for e in history(tree, jid))


def test_a_pinned_upstream_superseded_before_it_published_holds_until_released(tree, cfg, assets, journal):
    accept_sub(tree, cfg, upstream(assets))
    jid = accept_sub(tree, cfg, dependent("cut", {"job": "master@1"}))
    accept_sub(tree, cfg, upstream(assets, revision=2, supersedes="master@1"))
    settle(tree, cfg, journal, "master@2")
    rec = depends.hold_record(tree, jid)
    assert state(tree, jid) == "held" and rec is not None and rec.cause == "superseded"
    assert "master@2" in rec.reason
    assert intent.release(tree, jid, "op", journal, cfg) == "waiting"  # wait for master@1 anyway
    assert run(tree, cfg, "master@1") == "complete"
    done = settle(tree, cfg, journal, "master@1")
    assert done.pending == [jid] and job_file(tree, jid)["upstreams"][0]["job"] == "master@1"


def test_a_name_ref_follows_a_new_revision_made_while_it_waits(tree, cfg, assets, journal):
    accept_sub(tree, cfg, upstream(assets))
    jid = accept_sub(tree, cfg, dependent("cut", {"job": "master"}))
    accept_sub(tree, cfg, upstream(assets, revision=2, supersedes="master@1"))
    assert run(tree, cfg, "master@1") == "complete"
    assert not settle(tree, cfg, journal, "master@1")  # it waits for master@2, the newest
    assert run(tree, cfg, "master@2") == "complete"
    assert settle(tree, cfg, journal, "master@2").pending == [jid]
    assert job_file(tree, jid)["upstreams"][0]["job"] == "master@2"


@pytest.mark.parametrize("fmt", ["2", "1"])
def test_a_dependent_frozen_on_release_has_a_frozen_copy_of_what_runs(
    tree, cfg, assets, journal, monkeypatch, fmt
):
    """The copy fsck restores a lost job file from is the job file that runs (its upstreams
    pinned), not the one that waited."""
    monkeypatch.setenv("SPOOL_WRITE_FORMAT", fmt)
    accept_sub(tree, cfg, upstream(assets))
    jid = accept_sub(tree, cfg, dependent("cut", {"job": "master"}))
    copy = tree.job_attempts(jid) / "job.json"
    waited = copy.read_bytes()
    assert run(tree, cfg, "master@1") == "complete"
    assert settle(tree, cfg, journal, "master@1").pending == [jid]
    assert copy.read_bytes() == tree.job_file("pending", jid).read_bytes() != waited
    if fmt == "1":
        assert copy.stat().st_mode & 0o222 == 0  # a read-only copy of its own
    else:
        assert copy.stat().st_ino == tree.job_file("pending", jid).stat().st_ino  # its second name


def test_a_chain_of_three_settles_link_by_link(tree, cfg, assets, journal):
    accept_sub(tree, cfg, upstream(assets, "a"))
    b = accept_sub(tree, cfg, dependent("b", {"job": "a"}))
    c = accept_sub(tree, cfg, dependent("c", {"job": "b"}))
    run(tree, cfg, "a@1")
    assert settle(tree, cfg, journal, "a@1").pending == [b]
    assert state(tree, c) == "waiting"
    run(tree, cfg, b)
    assert settle(tree, cfg, journal, b).pending == [c]
    assert run(tree, cfg, c) == "complete"
    assert invariants.check(tree.root) == []


def test_a_source_changed_since_acceptance_holds_the_dependent(tree, cfg, assets, journal):
    accept_sub(tree, cfg, upstream(assets))
    sub = dependent("cut", {"job": "master"})
    sub["sources"]["logo"] = str(assets / "logo.png")
    sub["recipe"]["steps"].insert(1, {"op": "overlay", "source": "logo", "scale": 0.2})
    jid = accept_sub(tree, cfg, sub)
    run(tree, cfg, "master@1")
    (assets / "logo.png").write_bytes((assets / "logo.png").read_bytes() + b"\0")
    assert settle(tree, cfg, journal, "master@1").held == [jid]
    rec = depends.hold_record(tree, jid)
    assert rec is not None and rec.cause == "unusable" and "changed since submission" in rec.reason


# -- crashes -------------------------------------------------------------------------------------


@pytest.mark.parametrize("point", ["after_resolve_write", "after_hold_record"])
def test_a_daemon_killed_while_it_settles_dependents_loses_none(tree, cfg, assets, daemons, point):
    assert point in OTHER_POINTS
    fails = point == "after_hold_record"
    accept_sub(tree, cfg, upstream(assets, output={"expect": {"width": 7}} if fails else {}))
    jid = accept_sub(tree, cfg, dependent("cut", {"job": "master"}))
    d = daemons(tree, env={"SPOOL_CRASH_AT": point})
    assert d.wait() == -9
    assert state(tree, jid) == "waiting"  # killed between the record (or frozen file) and the move
    if not fails:
        assert job_file(tree, jid)["upstreams"][0]["sha256"] is not None  # frozen in waiting/
        problems = [p for p in fsck.check(tree, repair=False) if p.invariant == 12]
        assert problems and "waits although" in problems[0].problem
    daemons(tree, drain=True).wait()
    assert state(tree, jid) == ("held" if fails else "complete")
    assert invariants.check(tree.root) == []


def test_fsck_settles_a_dependent_left_waiting_on_a_published_upstream(tree, cfg, assets):
    jid = "cut@1"
    # As a daemon killed between the upstream's publish and its settle leaves it: the job was
    # accepted while the upstream ran, and nobody settled it since.
    accept_sub(tree, cfg, upstream(assets, "other"))
    sub = dependent("cut", {"job": "other"})
    accept_sub(tree, cfg, sub)
    run(tree, cfg, "other@1")
    assert state(tree, jid) == "waiting"
    assert any("waits although" in p for p in invariants.check(tree.root))
    found = [p for p in fsck.check(tree, repair=True) if p.invariant == 12]
    assert found and all(p.repaired for p in found)
    assert state(tree, jid) == "pending"
    assert invariants.check(tree.root) == []


def test_the_daemon_sweep_settles_what_another_process_published(tree, cfg, assets, daemons):
    up = accept_sub(tree, cfg, upstream(assets))
    assert claim.claim(tree, "w0", up)  # this process runs the upstream, not the daemon
    jid = accept_sub(tree, cfg, dependent("cut", {"job": "master"}))
    d = daemons(tree)
    ctx = Context(tree, cfg, "w0", Journal(tree, "w0"), threading.Event())
    assert execute.execute(ctx, up) == "complete"
    wait_for(lambda: state(tree, jid) == "complete", timeout=60)  # its sweep saw the publish
    d.signal(15)
    assert d.wait() == 0


def test_a_dependent_another_daemon_moved_on_meanwhile_is_not_brought_back(
    tree, cfg, assets, journal, monkeypatch
):
    """Two daemons settle the same dependent: while this one freezes it, the other moves it
    to pending/ and a worker claims it. Writing the frozen file back under waiting/ (and
    moving it to pending/ again) would put the job in two states and render it twice."""
    accept_sub(tree, cfg, upstream(assets))
    accept_sub(tree, cfg, dependent("cut", {"job": "master"}))
    assert state(tree, "cut@1") == "waiting" and run(tree, cfg, "master@1") == "complete"
    from spool.disk import tree as tree_mod

    real = depends.freeze

    def raced(*args: Any, **kw: Any) -> Any:
        frozen = real(*args, **kw)
        from spool.core.model import encode
        from spool.disk.tree import write_atomic

        write_atomic(tree.job_file("waiting", "cut@1"), encode(frozen))  # the other daemon's settle
        assert tree_mod.transfer(tree.job_file("waiting", "cut@1"), tree.job_file("pending", "cut@1"))
        assert claim.claim(tree, "w2", "cut@1")
        return frozen

    monkeypatch.setattr(depends, "freeze", raced)
    done = settle(tree, cfg, journal, "master@1")
    assert done.pending == []
    assert state(tree, "cut@1") == "running"
    assert not tree.job_file("waiting", "cut@1").exists() and not tree.job_file("pending", "cut@1").exists()
    assert [p.name for p in tree.waiting.iterdir()] == []  # no temp file left either
    assert invariants.check(tree.root, settled=False) == []


@pytest.mark.parametrize("exchange", [True, False], ids=["renameat2-exchange", "fallback"])
def test_replace_existing_never_brings_back_a_name_that_is_gone(tmp_path, monkeypatch, exchange):
    from spool.disk import durable

    if not exchange:
        monkeypatch.setattr(durable, "_renameat2", False)  # a filesystem without exchanges
    new, old = tmp_path / ".new.tmp", tmp_path / "job.json"
    new.write_text("frozen")
    assert durable.replace_existing(new, old) is False
    assert not old.exists() and new.read_text() == "frozen"
    old.write_text("waiting")
    assert durable.replace_existing(new, old) is True
    assert old.read_text() == "frozen" and not new.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["job.json"]


def test_a_sweep_starts_from_the_live_dependents_not_from_every_past_upstream(
    tree, cfg, assets, journal, monkeypatch
):
    """The reverse index keeps a folder for every upstream ever waited for (spool show draws
    them): a sweep that listed each one grew with the history (over a NAS, four round trips
    a folder every 2 s). It reads the waiting and held job files instead, once each."""
    accept_sub(tree, cfg, upstream(assets))
    jid = accept_sub(tree, cfg, dependent("cut", {"job": "master"}))
    for i in range(50):  # upstreams of dependents long gone
        (tree.deps / f"old-{i}").mkdir()
        (tree.deps / f"old-{i}" / f"old-dep-{i}@1").touch()
    assert state(tree, jid) == "waiting" and run(tree, cfg, "master@1") == "complete"
    _changed_a_minute_ago(tree.deps, tree.complete, tree.failed)
    listed: list[str] = []
    real = os.listdir
    monkeypatch.setattr(os, "listdir", lambda p=".": listed.append(os.fspath(p)) or real(p))
    assert settle(tree, cfg, journal).pending == [jid]  # a sweep: another process published
    assert not [p for p in listed if p.startswith(os.fspath(tree.deps) + os.sep)], listed
    assert listed.count(os.fspath(tree.deps)) <= 1  # whether any job ever waited
    listed.clear()
    assert settle(tree, cfg, journal).pending == []  # nothing waits now: two listings
    assert len(listed) == 2, listed


def test_a_sweep_keeps_the_end_states_listings_and_moves_a_dependent_only_on_a_fresh_look(
    tree, cfg, assets, journal, monkeypatch
):
    """``complete/`` grows with the history: a sweep (every 2 s while a job waits) keeps its
    listing while a stat shows the folder unchanged. Over a NAS whose folder times are too
    coarse to show a publish, that listing can be stale: it may make the sweep wait
    longer, never move a dependent wrongly (here: hold it as if its upstream were gone)."""
    accept_sub(tree, cfg, upstream(assets))
    jid = accept_sub(tree, cfg, dependent("cut", {"job": "master"}))
    _changed_a_minute_ago(tree.deps, tree.complete, tree.failed)
    listed: list[str] = []
    real = os.listdir
    monkeypatch.setattr(os, "listdir", lambda p=".": listed.append(os.fspath(p)) or real(p))
    for _ in range(3):  # the upstream is pending: the dependent waits
        assert not settle(tree, cfg, journal)
    assert listed.count(os.fspath(tree.complete)) == 1 and listed.count(os.fspath(tree.pending)) == 3
    before = {os.fspath(f): real(f) for f in (tree.complete, tree.failed, tree.deps)}
    monkeypatch.setattr(depends.kept, "names", lambda folder: before[os.fspath(folder)])
    assert run(tree, cfg, "master@1") == "complete"  # unseen in the kept listing
    got = settle(tree, cfg, journal)
    assert (got.pending, got.held) == ([jid], [])
    assert state(tree, jid) == "pending"


def test_a_sweep_where_no_job_ever_waited_lists_deps_once(tree, cfg, journal, monkeypatch):
    """Most spools have no dependencies: every daemon's sweep (every 2 s) then looks at
    ``deps/`` by a stat, listing it again only when it changed (or 30 s on)."""
    _changed_a_minute_ago(tree.deps)
    listed: list[str] = []
    real = os.listdir
    monkeypatch.setattr(os, "listdir", lambda p=".": listed.append(os.fspath(p)) or real(p))
    for _ in range(3):
        assert not settle(tree, cfg, journal)
    assert listed == [os.fspath(tree.deps)]


def test_a_sweep_leaves_a_held_dependent_unread_until_a_newer_revision_appears(
    tree, cfg, assets, journal, monkeypatch
):
    """A dependent held on a failed upstream may wait days for an operator: each sweep (every
    2 s) read its hold record and job file and looked at every state folder afresh. The
    sweep now reads the record once and looks afresh only once a newer revision is there."""
    up = accept_sub(tree, cfg, upstream(assets, output={"expect": {"width": 7}}))
    jid = accept_sub(tree, cfg, dependent("cut", {"job": "master"}))
    run(tree, cfg, up)
    settle(tree, cfg, journal, up)
    assert state(tree, jid) == "held"
    _changed_a_minute_ago(tree.deps, tree.complete, tree.failed)
    listed: list[str] = []
    records: list[str] = []
    real_list, real_read = os.listdir, depends.hold_record
    monkeypatch.setattr(os, "listdir", lambda p=".": listed.append(os.fspath(p)) or real_list(p))
    monkeypatch.setattr(depends, "hold_record", lambda t, j: records.append(j) or real_read(t, j))
    for _ in range(3):
        assert not settle(tree, cfg, journal)
    assert records == [jid] and listed.count(os.fspath(tree.complete)) <= 1
    fixed = publish(tree, cfg, upstream(assets, revision=2, supersedes="master@1"))  # not settled by it
    done = settle(tree, cfg, journal)
    assert done.waiting == [jid] and done.pending == [jid]
    assert job_file(tree, jid)["upstreams"][0]["job"] == fixed
