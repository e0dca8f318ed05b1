"""SPEC 11 invariant 11, visibility on every door: search, get, show, the page
(listings, its JSON, downloads, poster frames) and the metrics apply one rule,
fed by ``[library] visible``; an invisible asset is unlisted and unfetchable
(exit 4, HTTP 404), a visible one works. Real renders by a real daemon, a real
``spool serve`` read over plain HTTP and in headless chromium."""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
import webdriver
from conftest import TAGS, Daemon, minimal, run_cli, wait_for, write_json
from test_web import Server

from spool.core import settings
from spool.disk.tree import Tree
from spool.media import samples

OPEN = dict(TAGS, campaign="open-campaign")
SECRET = dict(TAGS, campaign="secret-campaign", visibility="restricted")
#: A visibility that differs from an allowed one only by case: still invisible.
CASED = dict(TAGS, campaign="cased-campaign", visibility="Internal")


@pytest.fixture(scope="module")
def lib(tmp_path_factory: pytest.TempPathFactory, media: dict[str, Path]) -> Tree:
    """Three rendered assets (internal, restricted, "Internal") with poster frames, a
    restricted job still pending, and a restricted job publishing the very same
    object as a visible one; metrics on."""
    root = tmp_path_factory.mktemp("vis")
    assets = root / "assets"
    assets.mkdir()
    for p in media.values():
        shutil.copyfile(p, assets / p.name)
    tree = Tree.at(root / "spool")
    tree.create()
    settings.write(
        tree.config_file,
        {
            "assets": {"roots": [str(assets)]},
            "daemon": {"poll_interval": 0.2, "heartbeat_interval": 0.5, "stop_grace": 0.5},
            "observe": {"page_refresh": 0.5, "metrics_dir": "metrics"},
        },
    )

    def submit(name: str, tags: dict[str, str], trim: float, **over: object) -> None:
        steps = [{"op": "trim", "duration": trim}, {"op": "encode"}]
        sub = minimal(assets, name=name, tags=tags, steps=steps, **over)
        run_cli("submit", str(write_json(root / f"{name}.json", sub)), spool=tree, check=True)

    submit("open", OPEN, 0.6)
    submit("secret", SECRET, 0.8)
    submit("cased", CASED, 0.7)
    submit("twin-secret", SECRET, 0.5)  # the same output as twin-open: one store object
    submit("twin-open", OPEN, 0.5)
    d = Daemon(tree, "seed", drain=True)
    assert d.wait() == 0, d.output()
    wait_for(lambda: len(list((tree.root / "thumbs").glob("*.jpg"))) == 4, timeout=30)
    submit("secret-waiting", SECRET, 0.4)
    return tree


def sha_of(tree: Tree, job: str) -> str:
    return json.loads((tree.root / "manifests" / f"{job}.json").read_bytes())["output"]["sha256"]


@pytest.fixture(scope="module")
def server(lib: Tree) -> Iterator[Server]:
    s = Server(lib)
    yield s
    s.stop()


def test_the_twins_share_one_object(lib):
    assert sha_of(lib, "twin-open@1") == sha_of(lib, "twin-secret@1")


def test_search_lists_only_visible_assets_unless_widened(lib):
    out = run_cli("search", "--json", spool=lib, check=True)
    assert sorted(h["job"] for h in json.loads(out.stdout)["results"]) == ["open@1", "twin-open@1"]
    hidden = run_cli("search", "campaign=secret-campaign", spool=lib, check=True)
    assert hidden.stdout == ""
    wide = run_cli("search", "campaign=secret-campaign", "--visibility", "restricted", "--json", spool=lib)
    assert sorted(h["job"] for h in json.loads(wide.stdout)["results"]) == ["secret@1", "twin-secret@1"]


@pytest.mark.parametrize("ref", ["secret@1", "secret", "cased@1", "cased", "secret-waiting", "nothing@1"])
def test_get_answers_an_invisible_asset_as_an_unknown_one(lib, ref):
    got = run_cli("get", ref, spool=lib)
    assert got.returncode == 4, got.stderr
    assert "secret-campaign" not in got.stderr and got.stdout == ""


def test_get_by_hash_needs_one_visible_publisher(lib):
    secret = sha_of(lib, "secret@1")
    assert run_cli("get", secret, spool=lib).returncode == 4
    wide = run_cli("get", secret, "--visibility", "restricted", "--json", spool=lib, check=True)
    assert json.loads(wide.stdout)["job"] == "secret@1"
    twin = run_cli("get", sha_of(lib, "twin-secret@1"), "--json", spool=lib, check=True)
    assert json.loads(twin.stdout)["job"] == "twin-open@1"  # found through the visible job only
    path = Path(json.loads(run_cli("get", "open", "--json", spool=lib, check=True).stdout)["path"])
    assert hashlib.sha256(path.read_bytes()).hexdigest() == sha_of(lib, "open@1")


def test_show_of_an_invisible_asset_is_not_found(lib):
    assert run_cli("show", "secret", spool=lib).returncode == 4
    assert run_cli("show", "cased", "--json", spool=lib).returncode == 4
    wide = run_cli("show", "secret", "--visibility", "restricted", "--json", spool=lib, check=True)
    assert json.loads(wide.stdout)["current"] == "secret@1"
    assert "open@1" in run_cli("show", "open", spool=lib, check=True).stdout


def test_metrics_name_no_asset(lib):
    text = run_cli("metrics", spool=lib, check=True).stdout
    assert "spool_library_assets" in text
    for leak in ("secret", "open-campaign", "restricted", sha_of(lib, "secret@1")):
        assert leak not in text


def test_page_json_lists_and_serves_only_visible_assets(lib, server):
    d = server.json("/api/status")
    assert d["counts"]["complete"] == 5 and d["counts"]["pending"] == 1  # numbers name nothing
    assert sorted(r["job_id"] for r in d["recent"]) == ["open@1", "twin-open@1"]
    assert "secret" not in json.dumps(d) and "cased" not in json.dumps(d)
    for job in ("secret@1", "cased@1", "secret-waiting@1", "twin-secret@1"):
        status, _, body = server.raw("GET", f"/api/jobs/{job}")
        assert status == 404 and body == b'{"error":"no such job"}', job
    assert server.raw("GET", "/api/jobs/open@1")[0] == 200
    for terms in ("campaign=secret-campaign", "visibility=restricted", "campaign=cased-campaign"):
        assert server.json(f"/api/library?t={terms}")["results"] == []
    assert sorted(h["job"] for h in server.json("/api/library")["results"]) == ["open@1", "twin-open@1"]


@pytest.mark.parametrize("method", ["GET", "HEAD"])
def test_downloads_and_poster_frames_of_invisible_objects_are_404(lib, server, method):
    for job in ("secret@1", "cased@1"):
        digest = sha_of(lib, job)
        assert (lib.root / "thumbs" / f"{digest}.jpg").is_file()  # it exists, and is refused
        for path in (f"/download/{digest}", f"/thumbs/{digest}.jpg"):
            status, _, body = server.raw(method, path)
            assert status == 404 and body in (b"", b"not found\n"), path
    for job in ("open@1", "twin-secret@1"):  # the twin's object is published by a visible job too
        digest = sha_of(lib, job)
        status, headers, body = server.raw(method, f"/download/{digest}")
        stored = json.loads((lib.root / "manifests" / f"{job}.json").read_bytes())["output"]["size"]
        assert status == 200 and int(headers["content-length"]) == stored
        if method == "GET":
            assert hashlib.sha256(body).hexdigest() == digest
        assert server.raw(method, f"/thumbs/{digest}.jpg")[0] == 200


@pytest.mark.system
def test_the_page_in_chromium_shows_no_invisible_asset(lib, server):
    if not webdriver.available():
        pytest.skip("chromium and chromedriver are not installed (tools/setup installs them)")
    b = webdriver.Browser()
    try:
        b.get(server.url)
        b.wait("return document.body.dataset.librarySearches")
        assert b.wait(
            "const i = [...document.querySelectorAll('#lib-grid img')];"
            "return i.length === 2 && i.every(x => x.complete && x.naturalWidth > 0)"
        )
        b.wait("return document.getElementById('recent').querySelectorAll('.card').length === 2")
        text = b.text("body")
        assert "open@1" in text and "twin-open@1" in text
        assert "secret" not in text and "cased" not in text
        srcs = b.script("return [...document.images].map(i => i.getAttribute('src'))")
        for job in ("secret@1", "cased@1"):
            assert not any(sha_of(lib, job) in (s or "") for s in srcs)
        b.get(server.url + "jobs/secret@1")
        b.wait("return document.getElementById('job-body').textContent.includes('no such job')")
        assert "secret-campaign" not in b.text("body")
    finally:
        b.close()


def test_an_object_with_no_visible_publisher_is_unknown_even_to_a_guess(lib, server):
    """A stray store object (no job publishes it) is not served either."""
    stray = samples.clip(lib.root.parent / "stray.mp4", seconds=0.5, size="64x48", rate=10)
    digest = hashlib.sha256(stray.read_bytes()).hexdigest()
    shard = lib.root / "store" / "sha256" / digest[:2]
    shutil.copyfile(stray, shard / f"{digest}.mp4")
    try:
        assert server.raw("GET", f"/download/{digest}")[0] == 404
        assert run_cli("get", digest, spool=lib).returncode == 4
    finally:
        (shard / f"{digest}.mp4").unlink()


@pytest.mark.parametrize("fmt", [1, 2])
def test_objects_published_before_the_object_index_are_found_after_a_rebuild(tree, fmt):
    """A spool upgraded from before the index by object (format 1: ``index/_sha256/``;
    format 2: its merged ``index/_objects/``, after the segment was merged): downloads by
    hash fail closed until ``spool index --rebuild`` (or fsck) adds the entries; ``spool
    index`` says so."""
    from libhelp import allow_noop, as_format_1, noop_sub, publish

    from spool.library import segments

    if fmt == 1:
        as_format_1(tree)
    cfg = allow_noop(tree)
    jid = publish(tree, cfg, noop_sub("old"))
    digest = sha_of(tree, jid)
    if fmt == 1:
        shutil.rmtree(tree.root / "index" / "_sha256")
        missing = f"index/_sha256/{digest}/{jid}"
    else:
        assert segments.merge(tree) == (1, 1)
        shutil.rmtree(tree.root / "index" / "_objects")
        missing = f"index/_objects/{digest[:2]}/{digest}.{jid}"
    assert run_cli("get", digest, spool=tree).returncode == 4
    check = run_cli("index", spool=tree)
    assert check.returncode == 1 and missing in check.stdout
    assert run_cli("index", "--rebuild", spool=tree).returncode == 0
    got = json.loads(run_cli("get", digest, "--json", spool=tree, check=True).stdout)
    assert got["job"] == jid and got["sha256"] == digest
