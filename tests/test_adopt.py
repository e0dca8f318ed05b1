"""``spool library adopt``: an existing folder of media becomes the library without
re-rendering (issue 22). Real files made by FFmpeg in a real folder layout, the
real CLI, real SIGKILLs; checked with spool fsck and tools/invariants.py.

The size of the big folder is ``SPOOL_ADOPT_FILES`` (default 200 here; the issue's
10,000 with ``pytest -m slow -k ten_thousand``)."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import invariants
import pytest
from conftest import SPOOL, TAGS, run_cli, wait_for
from test_nas import nas  # noqa: F401 - the sshfs mounts fixture

from spool.core import settings
from spool.disk import store
from spool.disk.tree import Tree
from spool.library import adopt, catalog

FILES = int(os.environ.get("SPOOL_ADOPT_FILES", "200"))
REQUIRED = ("campaign", "locale", "asset_type", "visibility")


def make_folder(root: Path, n: int) -> list[str]:
    """``n`` distinct short clips made by one FFmpeg run (the segment muxer), laid out
    like a real library: <campaign>/<locale>/<Spot name>.mp4 (a few .mov and odd names)."""
    flat = root.parent / f"{root.name}-segments"
    flat.mkdir(parents=True)
    subprocess.run(
        [
            "ffmpeg", "-v", "error", "-nostdin",
            "-f", "lavfi", "-i", "testsrc=size=32x18:rate=10",
            "-f", "lavfi", "-i", "sine=sample_rate=8000",
            "-t", f"{n * 0.2 + 0.1:.1f}",
            "-c:v", "libx264", "-preset", "ultrafast", "-g", "2", "-keyint_min", "2", "-sc_threshold", "0",
            "-c:a", "aac", "-b:a", "16k",
            "-f", "segment", "-segment_time", "0.2", "-reset_timestamps", "1", "-segment_format", "mp4",
            str(flat / "c%05d.mp4"),
        ],
        check=True,
        timeout=600,
    )  # fmt: skip
    rels = []
    for i, seg in enumerate(sorted(flat.iterdir())[:n]):
        campaign, locale = f"Campaign {i % 7}", ["en-GB", "fr-FR", "de-DE"][i % 3]
        name = f"Spot {i:05d}.mp4" if i % 11 else f"spot_{i:05d}.mov"
        rel = f"{campaign}/{locale}/{name}"
        dest = root / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        if name.endswith(".mov"):
            subprocess.run(
                ["ffmpeg", "-v", "error", "-nostdin", "-i", str(seg), "-c", "copy", "-f", "mov", str(dest)],
                check=True,
            )
            seg.unlink()
        else:
            os.rename(seg, dest)
        rels.append(rel)
    return rels


def write_tags(path: Path, rels: list[str], untagged_every: int = 33) -> tuple[set[str], set[str]]:
    """A CSV of tags; every ``untagged_every``-th file (3 %) lacks a required tag.
    Returns (tagged, untagged) paths."""
    tagged, untagged = set(), set()
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["path", *REQUIRED])
        for i, rel in enumerate(rels):
            campaign, locale = rel.split("/")[:2]
            row = [rel, campaign.lower().replace(" ", "-"), locale, "spot", "internal"]
            if i % untagged_every == untagged_every - 1:
                row[2] = ""  # no locale
                untagged.add(rel)
            else:
                tagged.add(rel)
            w.writerow(row)
    return tagged, untagged


def new_spool(at: Path, roots: list[Path]) -> Tree:
    tree = Tree.at(at)
    tree.create()
    settings.write(tree.config_file, {"assets": {"roots": [str(r) for r in roots]}})
    return tree


def adopt_cli(tree: Tree, folder: Path, *extra: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    argv = [SPOOL, "library", "adopt", str(folder), *extra, "--json", "--spool", str(tree.root)]
    res = subprocess.run(
        argv, capture_output=True, text=True, env={**os.environ, **(env or {})}, timeout=3600
    )
    assert res.returncode in (0, 1), res.stderr[-3000:]
    return json.loads(res.stdout)


def library_state(tree: Tree) -> dict[str, tuple[int, str, dict[str, str], str]]:
    """Every asset: (current revision, sha256, tags, output file) from the index and manifests."""
    from spool.library.index import names, read_version

    out = {}
    for name in names(tree):
        cur = catalog.current_revision(tree, name)
        assert cur is not None, name
        v = read_version(tree, name, cur)
        m = json.loads(tree.manifest_file(f"{name}@{cur}").read_text())
        assert v is not None and v.sha256 == m["output"]["sha256"]
        out[name] = (cur, v.sha256, m["tags"], m["output"]["file"])
    return out


def assert_sound(tree: Tree) -> None:
    fsck = run_cli("fsck", spool=tree)
    assert fsck.returncode == 0, fsck.stdout[-3000:]
    assert invariants.check(tree.root) == []
    assert run_cli("index", spool=tree).returncode == 0


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, set[str], set[str]]:
    base = tmp_path_factory.mktemp("adopt")
    lib = base / "library"
    rels = make_folder(lib, FILES)
    tagged, untagged = write_tags(base / "tags.csv", rels)
    return lib, base / "tags.csv", tagged, untagged


def check_adopted(tree: Tree, lib: Path, tags_csv: Path, tagged: set[str], untagged: set[str]) -> None:
    out = adopt_cli(tree, lib, "--tags", str(tags_csv))
    by = {it["path"]: it for it in out["items"]}
    others = [it for it in out["items"] if it["outcome"] not in ("adopted", "untagged")]
    assert out["counts"] == {"adopted": len(tagged), "untagged": len(untagged)}, others  # say why
    assert {p for p, it in by.items() if it["outcome"] == "untagged"} == untagged
    assert all(by[p]["missing"] == ["locale"] for p in untagged)
    found = run_cli("search", "asset_type=spot", "--json", spool=tree, check=True)
    hits = json.loads(found.stdout)["results"]
    assert sorted(h["job"] for h in hits) == sorted(by[p]["job"] for p in tagged)
    for h in hits[:25]:  # every hit is the very file, with the gate's (acceptance probe's) metadata
        rel = next(p for p in tagged if by[p]["job"] == h["job"])
        assert store.sha256_file(lib / rel)[0] == h["sha256"] == store.sha256_file(tree.root / h["path"])[0]
        assert (
            h["media"]["width"] == 32 and h["media"]["video_codec"] == "h264" and h["resolution"] == "32x18"
        )
    q = run_cli(
        "search", "campaign=campaign-3", "width<=32", "duration<=1", "codec=h264", "--json", spool=tree
    )
    assert len(json.loads(q.stdout)["results"]) == sum(1 for p in tagged if p.startswith("Campaign 3/"))
    assert_sound(tree)


@pytest.mark.system  # long: the system tier
def test_a_folder_is_adopted_once_and_untagged_files_are_reported(folder, tmp_path):
    lib, tags_csv, tagged, untagged = folder
    tree = new_spool(tmp_path / "spool", [lib])
    plan = adopt_cli(tree, lib, "--tags", str(tags_csv), "--dry-run")
    assert plan["counts"] == {"planned": len(tagged), "untagged": len(untagged)}
    assert (
        sorted(os.listdir(tree.root / "complete")) == [] and not (tree.root / "index").exists()
    ) or not any((tree.root / "index").iterdir())
    check_adopted(tree, lib, tags_csv, tagged, untagged)
    again = adopt_cli(tree, lib, "--tags", str(tags_csv))
    assert again["counts"] == {"already": len(tagged), "untagged": len(untagged)}
    assert len(os.listdir(tree.root / "complete")) == len(tagged)  # nothing adopted twice
    assert os.listdir(tree.root / "running") == []  # no empty <host>-adopt/ left as a worker


@pytest.mark.system
def test_a_run_killed_mid_way_and_run_again_leaves_the_library_of_a_clean_run(folder, tmp_path):
    lib, tags_csv, tagged, untagged = folder
    clean = new_spool(tmp_path / "clean", [lib])
    adopt_cli(clean, lib, "--tags", str(tags_csv))
    killed = new_spool(tmp_path / "killed", [lib])
    proc = subprocess.Popen(
        [SPOOL, "library", "adopt", str(lib), "--tags", str(tags_csv), "--spool", str(killed.root), "--json"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for(lambda: len(os.listdir(killed.root / "complete")) >= len(tagged) // 3, timeout=600)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert len(os.listdir(killed.root / "complete")) < len(tagged)  # it really was mid-way
    assert invariants.check(killed.root, settled=False) == []
    out = adopt_cli(killed, lib, "--tags", str(tags_csv))
    assert out["counts"].get("untagged") == len(untagged)
    assert library_state(killed) == library_state(clean)
    assert_sound(killed)
    assert adopt_cli(killed, lib, "--tags", str(tags_csv))["counts"] == {
        "already": len(tagged),
        "untagged": len(untagged),
    }


@pytest.fixture()
def small(tmp_path: Path) -> tuple[Tree, Path, Path]:
    lib = tmp_path / "lib"
    rels = make_folder(lib, 6)
    tags_csv = tmp_path / "tags.csv"
    write_tags(tags_csv, rels, untagged_every=1000)
    return new_spool(tmp_path / "spool", [lib]), lib, tags_csv


@pytest.mark.parametrize(
    "point",
    [
        "mid_adopt",
        "after_job_file",
        "after_attempt_dir",
        "after_store_link",
        "after_manifest",
        "mid_index",
        "before_complete_rename",
    ],
)
@pytest.mark.system
def test_a_crash_at_any_point_of_the_adopt_batch_is_finished_by_the_next_run(small, point):
    tree, lib, tags_csv = small
    res = run_cli(
        "library",
        "adopt",
        str(lib),
        "--tags",
        str(tags_csv),
        "-j",
        "1",
        spool=tree,
        env={"SPOOL_CRASH_AT": point},
    )
    assert res.returncode == -signal.SIGKILL
    assert invariants.check(tree.root, settled=False) == []
    out = adopt_cli(tree, lib, "--tags", str(tags_csv))
    assert set(out["counts"]) <= {"adopted", "already", "resumed"} and sum(out["counts"].values()) == 6
    state = library_state(tree)
    assert len(state) == 6 and all(rev == 1 for rev, *_ in state.values())  # never a second revision
    # Every job has its frozen copy before fsck (which would make a lost one again): a kill
    # is no power cut, so none may be missing.
    for done in tree.complete.glob("*.json"):
        assert (tree.job_attempts(done.stem) / "job.json").is_file(), done.stem
    assert_sound(tree)


def test_a_changed_file_becomes_the_next_version(small):
    tree, lib, tags_csv = small
    adopt_cli(tree, lib, "--tags", str(tags_csv))
    rel = "Campaign 1/fr-FR/Spot 00001.mp4"
    name = adopt.asset_name(rel)
    before = library_state(tree)[name]
    other = lib / "Campaign 2/de-DE/Spot 00002.mp4"
    replacement = lib / (rel + ".new")
    replacement.write_bytes(other.read_bytes())  # an editor saves a new file and renames it over
    os.rename(replacement, lib / rel)
    out = adopt_cli(tree, lib, "--tags", str(tags_csv))
    assert out["counts"] == {"adopted": 1, "already": 5}
    after = library_state(tree)[name]
    assert after[0] == 2 and after[1] == store.sha256_file(other)[0] != before[1]
    assert (
        store.sha256_file(
            tree.root / json.loads(tree.manifest_file(f"{name}@1").read_text())["output"]["store_path"]
        )[0]
        == before[1]
    )  # the old version is intact
    assert_sound(tree)


def test_adopted_files_share_the_store_inode_and_become_read_only(small):
    tree, lib, tags_csv = small
    adopt_cli(tree, lib, "--tags", str(tags_csv))
    rel = "Campaign 0/en-GB/spot_00000.mov"
    m = json.loads(tree.manifest_file(f"{adopt.asset_name(rel)}@1").read_text())
    assert m["output"]["container"] == "mov" and m["output"]["method"] == "link"
    assert os.stat(lib / rel).st_ino == os.stat(tree.root / m["output"]["store_path"]).st_ino
    assert os.stat(lib / rel).st_mode & 0o777 == 0o444


def test_sidecar_tags_and_names(tmp_path):
    lib = tmp_path / "lib"
    rels = make_folder(lib, 3)
    tree = new_spool(tmp_path / "spool", [lib])
    (lib / (rels[0] + ".tags.json")).write_text(json.dumps(dict(TAGS, name="hero-spot")))
    (lib / (rels[1] + ".tags.json")).write_text(json.dumps(dict(TAGS, campaign=" spaced")))
    out = adopt_cli(tree, lib)
    by = {it["path"]: it for it in out["items"]}
    assert by[rels[0]]["outcome"] == "adopted" and by[rels[0]]["job"] == "hero-spot@1"
    assert by[rels[1]]["outcome"] == "invalid" and "white space" in by[rels[1]]["reason"]
    assert by[rels[2]]["outcome"] == "untagged" and by[rels[2]]["missing"] == list(REQUIRED)
    res = run_cli("library", "adopt", str(lib), spool=tree)
    assert res.returncode == 1 and len(res.stdout.splitlines()) == 2  # the two not adopted, one line each


def test_asset_names_are_stable_readable_and_never_shared():
    assert adopt.asset_name("summer/spot-01.mp4") == "summer--spot-01"
    odd = adopt.asset_name("Summer/Spot 01.MP4")
    assert odd.startswith("summer--spot-01-") and len(odd) == len("summer--spot-01-") + 8
    assert adopt.asset_name("Summer/Spot 01.MP4") == odd  # the same on every run
    names = {adopt.asset_name(p) for p in ("a b.mp4", "a-b.mp4", "A-B.mp4", "a/b.mp4", "a--b.mp4", "é.mp4")}
    assert len(names) == 6
    long = adopt.asset_name("x" * 300 + ".mp4")
    assert len(long) <= 96 and catalog.NAME_RE.match(long)


def test_outside_the_asset_roots_is_refused(small, tmp_path):
    tree, _lib, _ = small
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    res = run_cli("library", "adopt", str(elsewhere), spool=tree)
    assert res.returncode == 2 and "outside [assets] roots" in res.stderr


def test_shadow_reports_every_difference_and_changes_nothing(small, tmp_path):
    tree, lib, tags_csv = small
    rels = sorted(p.relative_to(lib).as_posix() for p in lib.rglob("*.m*"))
    adopt_cli(tree, lib, "--tags", str(tags_csv))
    digest = {r: store.sha256_file(lib / r)[0] for r in rels}
    cat = tmp_path / "catalogue.csv"
    with open(cat, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["path", "id", "tags"])
        w.writerow(
            [rels[0], digest[rels[0]], "campaign=campaign-0;locale=en-GB;asset_type=spot;visibility=internal"]
        )
        w.writerow(
            [rels[1], "0" * 64, "campaign=campaign-1;locale=fr-FR;asset_type=spot;visibility=internal"]
        )
        w.writerow([rels[2], "MAM-7", "campaign=campaign-2;locale=de-DE;asset_type=spot"])
        w.writerow([rels[3], "MAM-7", "campaign=WRONG;locale=en-GB;asset_type=spot;visibility=internal"])
        w.writerow(["gone/missing.mp4", "MAM-9", "campaign=x"])
        # rels[4] and rels[5] are in no row
    before = sorted(str(p.relative_to(tree.root)) for p in tree.root.rglob("*") if "workers" not in p.parts)
    res = run_cli(
        "library", "adopt", str(lib), "--tags", str(tags_csv), "--shadow", str(cat), "--json", spool=tree
    )
    assert res.returncode == 1
    diffs = {(d["kind"], d["path"]) for d in json.loads(res.stdout)["differences"]}
    assert diffs == {
        ("id-content", rels[1]),
        ("tag-missing", rels[2]),
        ("tag-differs", rels[3]),
        ("id-split", "MAM-7"),
        ("missing-file", "gone/missing.mp4"),
        ("uncatalogued", rels[4]),
        ("uncatalogued", rels[5]),
    }
    after = sorted(str(p.relative_to(tree.root)) for p in tree.root.rglob("*") if "workers" not in p.parts)
    assert after == before


@pytest.mark.slow
def test_ten_thousand_files(tmp_path, request):
    """The issue's size: 10,000 files, 3 % untagged (minutes: pytest -m slow -k ten_thousand)."""
    if "slow" not in (request.config.option.markexpr or ""):
        pytest.skip("10,000 files take many minutes; run it with -m slow")
    lib = tmp_path / "lib"
    rels = make_folder(lib, 10_000)
    tagged, untagged = write_tags(tmp_path / "tags.csv", rels)
    tree = new_spool(tmp_path / "spool", [lib])
    started = time.monotonic()
    check_adopted(tree, lib, tmp_path / "tags.csv", tagged, untagged)
    print(f"10,000 files adopted in {time.monotonic() - started:.0f} s")
    assert adopt_cli(tree, lib, "--tags", str(tmp_path / "tags.csv"))["counts"] == {
        "already": len(tagged),
        "untagged": len(untagged),
    }


def test_adoption_across_a_nas_mount_copies_and_adopts_once(nas):  # noqa: F811
    """The spool on an sshfs mount (tools/multimount), the folder on the local disk: every
    file is copied (and verified) into the store, then a second run through the other
    mount adopts nothing."""
    server, a, b = nas.spool("adopt")
    lib = nas.export.parent / "assets" / "adopt-lib"
    rels = make_folder(lib, 12)
    tagged, untagged = write_tags(lib.parent / "adopt-tags.csv", rels, untagged_every=6)
    out = adopt_cli(a, lib, "--tags", str(lib.parent / "adopt-tags.csv"))
    assert out["counts"] == {"adopted": len(tagged), "untagged": len(untagged)}
    for it in out["items"]:
        if it["outcome"] == "adopted":
            m = json.loads(server.manifest_file(it["job"]).read_text())
            stored = server.root / m["output"]["store_path"]
            assert store.sha256_file(stored)[0] == it["sha256"]
            # another filesystem: a copy (the file keeps its own inode and its mode)
            assert os.stat(stored).st_ino != os.stat(lib / it["path"]).st_ino
            assert os.stat(lib / it["path"]).st_mode & 0o222
    again = adopt_cli(b, lib, "--tags", str(lib.parent / "adopt-tags.csv"))
    assert again["counts"] == {"already": len(tagged), "untagged": len(untagged)}
    assert_sound(server)


def test_a_tag_changed_for_unchanged_bytes_is_reported_not_adopted_twice(small):
    tree, lib, tags_csv = small
    first = adopt_cli(tree, lib, "--tags", str(tags_csv))
    assert first["counts"] == {"adopted": 6}, first["items"]
    text = tags_csv.read_text().replace("campaign-1,", "campaign-one,", 1)
    tags_csv.write_text(text)
    out = adopt_cli(tree, lib, "--tags", str(tags_csv))
    assert out["counts"] == {"already": 6}
    [changed] = [it for it in out["items"] if it["reason"]]
    assert "campaign is 'campaign-1', given 'campaign-one'" in changed["reason"]


def test_a_retryable_failure_is_run_again_by_the_same_adoption_run(small, monkeypatch):
    """A probe or copy cut short on a loaded host fails an attempt retryably: the run waits
    out the backoff and adopts the file, as a daemon would, instead of leaving it pending
    for the next run (seen under load: one adopt job left pending after a first run)."""
    from spool.core import config
    from spool.core.errors import Failed
    from spool.kinds.adopt import Adopt
    from spool.library import adopt

    tree, lib, tags_csv = small
    settings.write(
        tree.config_file, {"assets": {"roots": [str(lib)]}, "recovery": {"backoff": 0.2, "backoff_max": 0.2}}
    )
    cfg = config.load(tree.config_file)
    real = Adopt.produce
    failed: list[str] = []

    def flaky(self, ctx, job, attempt):  # type: ignore[no-untyped-def]
        if not failed:  # the first attempt of the first job: a retryable failure
            failed.append(job.job_id)
            raise Failed("produce", "copy", "cut short", next_action="retry", retryable=True)
        return real(self, ctx, job, attempt)

    monkeypatch.setattr(Adopt, "produce", flaky)
    rows = adopt.read_tags_csv(tags_csv, lib.resolve())
    rep = adopt.Adoption(tree, cfg, lib, rows, jobs=2).run()
    by = {it.job: it.outcome for it in rep.items}
    assert failed and by[failed[0]] == "adopted", by
    assert sorted(set(by.values())) == ["adopted"] and len(by) == 6
    assert sorted(tree.attempt_numbers(failed[0])) == [1, 2]  # the retry ran as a second attempt
    assert not any(tree.pending.iterdir())
    assert_sound(tree)
