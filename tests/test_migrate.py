"""Tree formats (issue 25): ``spool migrate`` from format 1 to 2, killed at its crash point
and run again; a daemon refusing a newer tree; a rolling upgrade with an old-format and a
new-format daemon on one spool, torture-style invariants clean."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import invariants
import pytest
from conftest import run_cli, state_files, wait_for
from libhelp import allow_noop, as_format_1, noop_sub, publish, tags_for

from spool.disk import formats
from spool.disk.tree import Tree
from spool.library import catalog, index, segments


def _library_view(tree: Tree, cfg) -> dict[str, object]:
    """What readers see of the library: every hit of a search and each version's facts."""
    hits = catalog.search(tree, cfg, catalog.parse_terms(["visibility=internal"]), all_versions=True).results
    out: dict[str, object] = {}
    for h in hits:
        name, rev = h.job.rsplit("@", 1)
        v = index.read_version(tree, name, int(rev))
        assert v is not None, h.job
        out[h.job] = (v.sha256, v.store_path, v.published_at, round(v.indexed_at.timestamp(), 3))
    return out


def _format_1_spool(tree: Tree, n: int = 4):
    as_format_1(tree)
    cfg = allow_noop(tree)
    jobs = [publish(tree, cfg, noop_sub(f"m{i}", tags=tags_for(i))) for i in range(n)]
    assert formats.read(tree.root) == 1 and not segments.listed(tree)
    assert sorted(os.listdir(tree.root / "library")) == [f"m{i}" for i in range(n)]
    return cfg, jobs


def test_migrate_converts_a_format_1_library_in_place_and_a_second_run_does_nothing(tree):
    cfg, jobs = _format_1_spool(tree)
    before = _library_view(tree, cfg)
    assert sorted(before) == sorted(jobs)
    dry = json.loads(run_cli("migrate", "--dry-run", "--json", spool=tree, check=True).stdout)
    assert (dry["was"], dry["versions"]) == (1, 4) and formats.read(tree.root) == 1  # nothing written
    out = json.loads(run_cli("migrate", "--json", spool=tree, check=True).stdout)
    assert (out["was"], out["now"], out["versions"], out["objects"]) == (1, 2, 4, 4)
    assert formats.read(tree.root) == 2
    assert os.listdir(tree.root / "library") == [] and not (tree.root / "index" / "_sha256").exists()
    for jid in jobs:
        name, rev = jid.rsplit("@", 1)
        assert segments.merged_version(tree, name, int(rev)).is_file()
    assert _library_view(tree, cfg) == before  # the same hits and facts, indexed_at kept
    assert index.check(tree, cfg.acceptance.required_tags, repair=False) == []
    assert invariants.check(tree.root) == []
    again = json.loads(run_cli("migrate", "--json", spool=tree, check=True).stdout)
    assert (again["was"], again["now"], again["versions"]) == (2, 2, 0)
    assert json.loads(run_cli("fsck", "--json", spool=tree).stdout) == {"clean": True, "problems": []}


def test_a_migrate_killed_at_its_crash_point_leaves_a_whole_tree_and_runs_again(tree):
    cfg, jobs = _format_1_spool(tree)
    before = _library_view(tree, cfg)
    r = run_cli("migrate", spool=tree, env={"SPOOL_CRASH_AT": "mid_migrate"})
    assert r.returncode == -signal.SIGKILL, r.stderr
    # Both layouts' records now: the tree still says format 1, readers join them.
    assert formats.read(tree.root) == 1
    assert all((tree.root / "library" / j.rsplit("@")[0] / "1").is_file() for j in jobs)
    assert all(segments.merged_version(tree, j.rsplit("@")[0], 1).is_file() for j in jobs)
    assert _library_view(tree, cfg) == before
    assert invariants.check(tree.root) == []
    out = json.loads(run_cli("migrate", "--json", spool=tree, check=True).stdout)
    assert (out["now"], out["versions"]) == (2, 4)
    assert _library_view(tree, cfg) == before
    assert invariants.check(tree.root) == []
    assert json.loads(run_cli("fsck", "--json", spool=tree).stdout) == {"clean": True, "problems": []}


def test_a_version_record_no_manifest_justifies_is_left_for_fsck(tree):
    _, jobs = _format_1_spool(tree, 2)
    tree.manifest_file(jobs[0]).unlink()  # an operator's doing
    out = json.loads(run_cli("migrate", "--json", spool=tree, check=True).stdout)
    assert out["versions"] == 1 and out["left"] == [f"library/{jobs[0].split('@')[0]}/1"]
    assert not segments.merged_version(tree, jobs[0].split("@")[0], 1).exists()  # never a false hit


def test_a_daemon_and_the_cli_refuse_a_tree_of_a_newer_format_untouched(tree, daemons):
    formats.path(tree.root).write_text("3\nspool tree format 3\n")
    before = sorted(str(p.relative_to(tree.root)) for p in tree.root.rglob("*"))
    d = daemons(tree, "w1")
    assert d.wait(30) != 0
    [said] = [ln for ln in d.output().splitlines() if "format" in ln]
    assert "tree format 3, newer than the format 2" in said and "upgrade spool on this host" in said
    for args in (["status"], ["migrate"], ["ls"]):
        r = run_cli(*args, spool=tree)
        assert r.returncode != 0 and len(r.stderr.strip().splitlines()) == 1, (args, r.stderr)
        assert "newer than the format 2" in r.stderr
    assert sorted(str(p.relative_to(tree.root)) for p in tree.root.rglob("*")) == before


def test_an_unreadable_format_file_is_named_in_one_sentence(tree):
    formats.path(tree.root).write_text("two\n")
    r = run_cli("status", spool=tree)
    assert r.returncode != 0 and "FORMAT does not name a format" in r.stderr


def _running_as(tree: Tree, worker: str, pid: int) -> bool:
    """Whether the daemon ``worker`` has started as process ``pid`` (its record says so)."""
    from spool.core.model import WorkerRecord
    from spool.disk.records import read
    from spool.disk.tree import HOST

    rec = read(tree.worker_file(f"{HOST}-{worker}"), WorkerRecord, replaced=True)
    return rec is not None and rec.pid == pid and rec.state == "running"


def _drop(tree: Tree, names: list[str]) -> None:
    for n in names:
        tmp = tree.incoming / f".{n}.tmp"
        tmp.write_bytes(noop_sub(n, tags=tags_for(len(n))))
        os.rename(tmp, tree.incoming / f"{n}.json")


def test_old_and_new_format_daemons_share_one_spool_during_a_rolling_upgrade(tree, daemons, tmp_path: Path):
    """An old-format daemon (SPOOL_WRITE_FORMAT=1: what the old code writes) and a new one on
    one spool, one of them SIGKILLed mid-run and started again; then the upgrade ends with
    spool migrate. Every job complete once; invariants, fsck and the readers agree."""
    cfg = allow_noop(tree, limits={"max_active": 4})
    old = {"SPOOL_WRITE_FORMAT": "1"}
    names = [f"ru{i:03d}" for i in range(60)]
    a = daemons(tree, "old", env=old)
    b = daemons(tree, "new")
    _drop(tree, names[:30])
    wait_for(lambda: len(state_files(tree)["complete"]) >= 10, timeout=60)
    b.signal(signal.SIGKILL)
    b.wait(30)
    b = daemons(tree, "new")
    # Up before the rest arrive (the old daemon alone could drain them while the new one
    # still starts, and the SIGTERM below would then meet it before its handler exists).
    wait_for(lambda: _running_as(tree, "new", b.proc.pid), timeout=60)
    _drop(tree, names[30:])
    wait_for(lambda: len(state_files(tree)["complete"]) == len(names), timeout=120)
    for d in (a, b):
        d.signal(signal.SIGTERM)
        assert d.wait(60) == 0, d.output()[-3000:]
    assert run_cli("recover", spool=tree).returncode == 0
    assert state_files(tree)["complete"] == [f"{n}@1.json" for n in names]
    # Both formats were written: format 1's records and result.json, format 2's segments.
    published_by: dict[str, int] = {"old": 0, "new": 0}
    for n in names:
        m = json.loads(tree.manifest_file(f"{n}@1").read_text())
        published_by[m["worker"].rpartition("-")[2]] += 1  # <host>-old, <host>-new
    assert published_by["old"] > 0 and published_by["new"] > 0, published_by
    assert os.listdir(tree.root / "library") and segments.listed(tree)
    assert invariants.check(tree.root) == []
    assert json.loads(run_cli("fsck", "--json", spool=tree).stdout)["clean"]
    hits = {h.job for h in catalog.search(tree, cfg, catalog.parse_terms(["visibility=internal"])).results}
    assert hits == {f"{n}@1" for n in names}
    for args in (
        ["status", "--json"],
        ["ls", "--json"],
        ["show", "ru000@1", "--json"],
        ["show", f"{names[-1]}@1"],
    ):
        r = run_cli(*args, spool=tree)
        assert r.returncode == 0 and "Traceback" not in r.stderr, (args, r.stderr)
    shown = [
        json.loads(run_cli("show", f"{n}@1", "--json", spool=tree, check=True).stdout) for n in names[:10]
    ]
    for s in shown:
        m = s["manifest"]
        assert next(x for x in s["attempts"] if x["n"] == m["attempt"])["outcome"] == "published"
    # The last old daemon stopped: the upgrade ends, and nothing a reader sees changes.
    before = _library_view(tree, cfg)
    out = json.loads(run_cli("migrate", "--json", spool=tree, check=True).stdout)
    assert out["now"] == 2 and out["versions"] == published_by["old"]
    assert _library_view(tree, cfg) == before
    assert invariants.check(tree.root) == []
    assert json.loads(run_cli("fsck", "--json", spool=tree).stdout)["clean"]


def test_a_writer_looks_at_format_by_a_stat_and_reads_it_again_only_when_replaced(tree, monkeypatch):
    """After its first read, a writer's look at ``FORMAT`` is a stat (one round trip over a
    NAS where a read is three); a ``FORMAT`` replaced by another process (a migration) is
    read again at the next look."""
    formats.write(tree.root, 2)
    monkeypatch.setattr(formats, "RECHECK", 0.0)  # every call looks
    reads: list[Path] = []
    real_read = formats.read
    monkeypatch.setattr(formats, "read", lambda root: reads.append(root) or real_read(root))
    assert [formats.writing(tree.root) for _ in range(5)] == [2] * 5
    assert len(reads) == 1
    # Another process replaces it (no in-process cache drop, as formats.write would do).
    tmp = tree.root / ".FORMAT.other"
    tmp.write_text("3\nspool tree format 3: a newer spool\n")
    os.replace(tmp, formats.path(tree.root))
    with pytest.raises(formats.TooNew):
        formats.writing(tree.root)
    assert len(reads) == 2
