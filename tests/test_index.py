"""The library index: safe names, written inside the publish boundary, consistent
under concurrent publishing and after kill -9, repaired by fsck, rebuilt from manifests."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from datetime import datetime

import invariants
import pytest
from conftest import run_cli, state_files, wait_for
from libhelp import allow_noop, as_format_1, noop_sub, publish, tags_for

from spool.core import config
from spool.core.model import Manifest, decode
from spool.library import catalog, index, segments
from spool.library.indexpaths import decode_value, encode_value
from spool.queue import accept

VALUES = [
    "en-GB",
    "mug",
    ".",
    "..",
    ".hidden",
    "a/b",
    "Été 2026",
    "100%",
    "~x",
    "\x00nul",
    "🎬" * 5,
    "x" * 256,
    "é" * 256,
]


def test_every_value_becomes_one_safe_file_name():
    names = [encode_value(v) for v in VALUES]
    assert len(set(names)) == len(VALUES)  # injective on these
    for v, n in zip(VALUES, names, strict=True):
        assert "/" not in n and "\x00" not in n and not n.startswith(".")
        assert len(n.encode()) <= 255
        assert decode_value(n) in (v, None)  # None only for hashed long values
    assert encode_value("en-GB") == "en-GB" and encode_value("Été 2026") == "%C3%89t%C3%A9%202026"
    assert decode_value(encode_value("x" * 256)) is None and decode_value(encode_value("a/b")) == "a/b"


def test_publish_writes_one_entry_per_required_tag_and_a_version_record(tree):
    """Format 1 (an original spool): every entry and the version record, durable at publish."""
    as_format_1(tree)
    cfg = allow_noop(tree)
    jid = publish(tree, cfg, noop_sub("spot", tags=tags_for(0, campaign="Été 2026")))
    for tag, value in tags_for(0, campaign="Été 2026").items():
        assert (tree.root / "index" / tag / encode_value(value) / jid).is_file()
    rec = json.loads((tree.root / "library" / "spot" / "1").read_text())
    m = json.loads(tree.manifest_file(jid).read_text())
    assert rec["sha256"] == m["output"]["sha256"] and rec["store_path"] == m["output"]["store_path"]
    assert not segments.listed(tree)
    assert index.check(tree, cfg.acceptance.required_tags, repair=False) == []
    # Idempotent: a second call (recovery, fsck) changes nothing.
    before = sorted((p, p.stat().st_mtime_ns) for p in (tree.root / "index").rglob("*"))
    index.index_job(
        tree, decode(tree.manifest_file(jid).read_bytes(), Manifest), cfg.acceptance.required_tags
    )
    assert sorted((p, p.stat().st_mtime_ns) for p in (tree.root / "index").rglob("*")) == before


def test_publish_writes_a_segment_line_that_a_merge_turns_into_shared_entries(tree):
    """Format 2: one segment line at publish (found at once), merged later into entries."""
    cfg = allow_noop(tree)
    tags = tags_for(0, campaign="Été 2026")
    jid = publish(tree, cfg, noop_sub("spot", tags=tags))
    m = json.loads(tree.manifest_file(jid).read_text())
    [seg] = segments.listed(tree)
    [line] = [json.loads(x) for x in (tree.root / "index" / "_segments" / seg).read_text().splitlines()]
    assert line["job_id"] == jid and line["tags"] == tags and line["sha256"] == m["output"]["sha256"]
    assert not (tree.root / "index" / "campaign").exists() and not (tree.root / "library" / "spot").exists()
    assert index.check(tree, cfg.acceptance.required_tags, repair=False) == []
    [hit] = catalog.search(tree, cfg, catalog.parse_terms(["campaign=Été 2026"])).results
    assert hit.job == jid
    # Idempotent: a second call (recovery, fsck) writes no second segment.
    index.index_job(
        tree, decode(tree.manifest_file(jid).read_bytes(), Manifest), cfg.acceptance.required_tags
    )
    assert segments.listed(tree) == [seg]
    segments.clear_cache()  # as another process sees it: the segment read from disk
    index.index_job(
        tree, decode(tree.manifest_file(jid).read_bytes(), Manifest), cfg.acceptance.required_tags
    )
    assert segments.listed(tree) == [seg]
    assert segments.merge(tree) == (1, 1)
    assert segments.listed(tree) == []
    # Merged: still indexed (its merged version entry), so again no segment.
    index.index_job(
        tree, decode(tree.manifest_file(jid).read_bytes(), Manifest), cfg.acceptance.required_tags
    )
    assert segments.listed(tree) == []
    for tag, value in tags.items():
        assert (tree.root / "index" / tag / encode_value(value) / jid).is_file()
    digest = m["output"]["sha256"]
    assert (tree.root / "index" / "_objects" / digest[:2] / f"{digest}.{jid}").is_file()
    assert segments.merged_version(tree, "spot", 1).is_file()
    assert (tree.root / "index" / "_names" / "spot").is_file()
    assert index.check(tree, cfg.acceptance.required_tags, repair=False) == []
    [hit] = catalog.search(tree, cfg, catalog.parse_terms(["campaign=Été 2026"])).results
    assert hit.job == jid
    v = index.read_version(tree, "spot", 1)
    assert v is not None and v.sha256 == digest and v.indexed_at == datetime.fromisoformat(line["indexed_at"])
    assert invariants.check(tree.root) == []


@pytest.mark.parametrize("point", ["after_manifest", "mid_index", "after_index"])
def test_kill_9_around_the_index_leaves_a_consistent_index_after_recovery(point, tree, daemons):
    cfg = allow_noop(tree)
    job = accept.accept_bytes(tree, cfg, noop_sub("crash", tags=tags_for(1)), "t")
    d = daemons(tree, "w1", env={"SPOOL_CRASH_AT": point})
    assert d.wait(timeout=60) == -signal.SIGKILL, d.output()
    # Not complete yet, so not a hit yet (and never an unreadable one).
    assert state_files(tree)["running"] == ["crash@1.json"]
    assert catalog.search(tree, cfg, catalog.parse_terms(["campaign=c1"])).results == []
    again = daemons(tree, "w1", drain=True)
    assert again.wait(timeout=60) == 0, again.output()
    assert state_files(tree)["complete"] == ["crash@1.json"]
    assert index.check(tree, cfg.acceptance.required_tags, repair=False) == []
    [hit] = catalog.search(tree, cfg, catalog.parse_terms(["campaign=c1", "locale=fr-FR"])).results
    assert hit.job == job.job_id
    assert invariants.check(tree.root) == []


@pytest.mark.parametrize("fmt", [1, 2])
def test_fsck_repairs_a_deleted_and_a_stray_entry(tree, fmt):
    if fmt == 1:
        as_format_1(tree)
    cfg = allow_noop(tree)
    a = publish(tree, cfg, noop_sub("one", tags=tags_for(0)))
    publish(tree, cfg, noop_sub("two", tags=tags_for(1)))
    if fmt == 2:
        segments.merge(tree)  # the entries fsck judges are the merged ones
    (tree.root / "index" / "locale" / "en-GB" / a).unlink()  # deleted
    version = tree.root / "library" / "one" / "1" if fmt == 1 else segments.merged_version(tree, "one", 1)
    version.unlink()
    stray = tree.root / "index" / "campaign" / "c3" / a  # a value the manifest does not have
    stray.parent.mkdir()
    stray.touch()
    ghost = tree.root / "index" / "campaign" / "ghost"
    ghost.mkdir()
    (ghost / "ghost@1").touch()  # no manifest at all
    if fmt == 2:
        ghost_version = segments.merged_version(tree, "ghost", 1)
        ghost_version.parent.mkdir(parents=True, exist_ok=True)
        ghost_version.touch()
    res = run_cli("fsck", "--json", spool=tree)
    out = json.loads(res.stdout)
    assert res.returncode == 0, out
    found = {p["problem"] for p in out["problems"]}
    assert "missing library index entries" in found
    assert "stray library index entry (no manifest names it)" in found
    if fmt == 2:
        assert "stray library version entry (no manifest)" in found
        assert not ghost_version.exists()
    assert all(p["repaired"] for p in out["problems"])
    if fmt == 2:
        segments.merge(tree)  # fsck's repair is a segment of the tree's format; merged, it is entries
    assert (tree.root / "index" / "locale" / "en-GB" / a).exists() and not stray.exists()
    assert version.exists()
    assert not (ghost / "ghost@1").exists()
    assert index.check(tree, cfg.acceptance.required_tags, repair=False) == []
    assert [h.job for h in catalog.search(tree, cfg, catalog.parse_terms(["locale=en-GB"])).results] == [a]


@pytest.mark.parametrize("fmt", [1, 2])
def test_index_rebuild_recreates_the_index_from_manifests_alone(tree, fmt):
    if fmt == 1:
        as_format_1(tree)
    cfg = allow_noop(tree)
    jobs = [publish(tree, cfg, noop_sub(f"r{i}", tags=tags_for(i))) for i in range(6)]
    if fmt == 2:
        assert run_cli("index", "--merge", spool=tree).returncode == 0

    def snapshot():
        return sorted(
            str(p.relative_to(tree.root)) for d in ("index", "library") for p in (tree.root / d).rglob("*")
        )

    before = snapshot()
    for d in ("index", "library"):
        subprocess.run(["rm", "-rf", str(tree.root / d)], check=True)
    assert run_cli("index", spool=tree).returncode == 1  # the check alone finds what is missing
    res = run_cli("index", "--rebuild", "--json", spool=tree)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["versions"] == len(jobs)
    if fmt == 2:  # rebuilt as one segment; merged, the same entries as before
        assert len(segments.listed(tree)) == 1
        assert run_cli("index", "--merge", spool=tree).returncode == 0
    assert snapshot() == before


SEARCHER = textwrap.dedent(
    """
    import json, os, sys, time
    from spool.core import config
    from spool.disk import store
    from spool.disk.tree import Tree
    from spool.library import catalog
    tree = Tree.at(sys.argv[1]); cfg = config.load(tree.config_file)
    stop = tree.root.parent / "stop"
    queries, bad_hash, missed, hits = 0, [], [], 0
    while not stop.exists():
        for i in range(4):
            for loc in ("en-GB", "fr-FR"):
                # Jobs complete before the query must all be found (names say their tags).
                before = {n[:-5] for n in os.listdir(tree.complete) if n.endswith(".json")}
                res = catalog.search(tree, cfg, catalog.parse_terms([f"campaign=c{i}", f"locale={loc}"]))
                queries += 1
                got = {h.job for h in res.results}
                for h in res.results:
                    hits += 1
                    digest, _ = store.sha256_file(tree.root / h.path)
                    if digest != h.sha256:
                        bad_hash.append(h.job)
                for jid in before:
                    k = int(jid.split("@")[0][1:])
                    if k % 4 == i and ["en-GB", "fr-FR"][k % 2] == loc and jid not in got:
                        missed.append(jid)
    print(json.dumps({"queries": queries, "hits": hits, "bad_hash": bad_hash, "missed": missed}))
    """
)


def test_no_false_hit_or_miss_while_two_daemons_publish(tree, daemons):
    cfg = allow_noop(tree)
    n = 200
    for i in range(n):
        accept.accept_bytes(tree, cfg, noop_sub(f"n{i:04d}", tags=tags_for(i)), "t")
    searcher = subprocess.Popen(
        [sys.executable, "-c", SEARCHER, str(tree.root)], stdout=subprocess.PIPE, text=True
    )
    try:
        a, b = daemons(tree, "a"), daemons(tree, "b")
        wait_for(lambda: len(os.listdir(tree.complete)) == n, timeout=120, interval=0.2)
    finally:
        (tree.root.parent / "stop").touch()
        out, _ = searcher.communicate(timeout=60)
    for d in (a, b):
        d.signal(signal.SIGTERM)
        assert d.wait(timeout=30) == 0
    report = json.loads(out)
    assert report["queries"] > 8 and report["hits"] > 0
    assert report["bad_hash"] == [] and report["missed"] == []
    # At rest: every job is found by each of its tags, once.
    for tag in ("campaign", "locale"):
        for value in {tags_for(i)[tag] for i in range(n)}:
            got = catalog.search(tree, cfg, catalog.parse_terms([f"{tag}={value}"])).results
            assert len(got) == sum(1 for i in range(n) if tags_for(i)[tag] == value)
    assert index.check(tree, config.load(tree.config_file).acceptance.required_tags, repair=False) == []


def _lines(prefix: str, n: int) -> list[segments.Line]:
    at = datetime.now().astimezone()
    return [
        segments.Line(
            job_id=f"{prefix}{i}@1", name=f"{prefix}{i}", revision=1, sha256="0" * 64,
            store_path="store/sha256/00/x", published_at=at, indexed_at=at,
        )
        for i in range(n)
    ]  # fmt: skip


def test_a_merge_is_due_by_a_look_at_the_listing_and_the_writers_own_segments(tree, monkeypatch):
    """``due`` reads no other writer's segment: one it has not read counts as one job,
    so the writer whose own segments fill the merge threshold sees the merge due."""
    monkeypatch.setattr(segments, "MERGE_JOBS", 6)
    monkeypatch.setattr(segments, "COMPACT_FILES", 3)
    segments.clear_cache()
    other = segments.write(tree, _lines("b", 10), "w2")
    segments.clear_cache()  # w2's segment, as another process wrote it: never read here
    segments.write(tree, _lines("a", 3), "w1")
    opened: list[str] = []
    real_open = open

    def spy(path, *a, **k):  # type: ignore[no-untyped-def]
        opened.append(str(path))
        return real_open(path, *a, **k)

    monkeypatch.setattr("builtins.open", spy)
    assert segments.due(tree, "w1") is None  # 3 own + 1 unread
    segments.write(tree, _lines("c", 2), "w1")
    assert segments.due(tree, "w1") == "merge"  # 5 own + 1 unread
    assert not any(other.name in p for p in opened)
    monkeypatch.setattr(segments, "MERGE_JOBS", 100)
    segments.write(tree, _lines("d", 1), "w1")
    assert segments.due(tree, "w1") == "compact" and segments.due(tree, "w2") is None


def test_the_segment_cache_is_safe_for_a_process_s_threads() -> None:
    """A daemon's slots and adopt's workers read and write segments at once: one thread
    forgetting merged segments while another remembers a new one must not break either
    (an adopt of 10,000 files died of "dictionary changed size during iteration")."""
    import threading

    segments.clear_cache()
    names = [f"{i:06d}.seg.jsonl" for i in range(5000)]
    for n in names:
        segments._remember(n, [])
    errors: list[BaseException] = []
    stop = threading.Event()

    def forget() -> None:
        try:
            while not stop.is_set():
                segments._forget_all_but(names)
        except BaseException as exc:
            errors.append(exc)

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as the interpreter can
    try:
        t = threading.Thread(target=forget)
        t.start()
        for k in range(20000):
            segments._remember(f"new-{k}.jsonl", [])
            if errors:
                break
        stop.set()
        t.join()
    finally:
        sys.setswitchinterval(old)
        segments.clear_cache()
    assert errors == []


def test_a_long_lived_reader_counts_assets_reading_each_segment_once(tree, monkeypatch):
    """A daemon's metrics count the library's assets every few seconds, segments included:
    each segment is read once (a segment never changes once named), a new one is read, and
    one merged away is forgotten with nothing missed (its names are in index/_names)."""
    from spool.queue import status

    cfg = allow_noop(tree)
    publish(tree, cfg, noop_sub("first"))
    publish(tree, cfg, noop_sub("second"))
    opened: list[str] = []
    real_open = open

    def counting_open(path, *a, **kw):
        opened.append(os.path.basename(path))
        return real_open(path, *a, **kw)

    monkeypatch.setattr(status, "open", counting_open, raising=False)
    assert status.library_counts(tree)["assets"] == 2
    first_look = len(opened)
    assert first_look == len(segments.listed(tree)) >= 1
    assert status.library_counts(tree)["assets"] == 2
    assert len(opened) == first_look  # nothing read again
    publish(tree, cfg, noop_sub("third"))
    assert status.library_counts(tree)["assets"] == 3
    assert len(opened) == first_look + 1  # only the new segment
    segments.merge(tree)
    assert segments.listed(tree) == []
    assert status.library_counts(tree)["assets"] == 3  # from index/_names now
    assert status._segment_cache == {}
