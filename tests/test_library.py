"""Versions, search, get and visibility: through the real CLI where scripts would use it."""

from __future__ import annotations

import hashlib
import json
import os
import random
import subprocess
import time

import pytest
from conftest import SPOOL, minimal, run_cli, write_json
from libhelp import allow_noop, as_format_1, noop_sub, publish, tags_for
from test_nas import nas  # noqa: F401  (the two-mount fixture)

from spool.core import families
from spool.disk import store
from spool.library import catalog, segments
from spool.media import samples
from spool.queue import accept


def search(tree, *terms):
    res = run_cli("search", "--json", *terms, spool=tree)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def test_revisions_published_in_random_order_end_with_the_highest_current(tree, daemons):
    cfg = allow_noop(tree)
    order = [1, 2, 3, 4, 5]
    random.Random(7).shuffle(order)
    for rev in order:
        accept.accept_bytes(tree, cfg, noop_sub("spot", rev), "t")
    a, b = daemons(tree, "a", drain=True), daemons(tree, "b", drain=True)
    assert a.wait(timeout=60) == 0 and b.wait(timeout=60) == 0
    assert catalog.current_revision(tree, "spot") == 5
    [hit] = search(tree, "campaign=c0")["results"]
    assert (hit["job"], hit["current"]) == ("spot@5", True)
    assert [h["revision"] for h in search(tree, "campaign=c0", "--all-versions")["results"]] == [
        1,
        2,
        3,
        4,
        5,
    ]
    shown = json.loads(run_cli("show", "spot", "--json", spool=tree).stdout)
    assert shown["current"] == "spot@5" and [v["state"] for v in shown["versions"]] == ["complete"] * 5


def test_an_older_revision_completing_later_never_becomes_current(tree):
    cfg = allow_noop(tree)
    publish(tree, cfg, noop_sub("spot", 2))
    publish(tree, cfg, noop_sub("spot", 1))  # completes after revision 2
    assert catalog.current_revision(tree, "spot") == 2
    assert [h["job"] for h in search(tree, "campaign=c0")["results"]] == ["spot@2"]
    assert (
        run_cli("get", "spot", spool=tree)
        .stdout.strip()
        .endswith(json.loads(tree.manifest_file("spot@2").read_text())["output"]["store_path"])
    )
    text = run_cli("show", "spot", spool=tree).stdout
    assert "spot@2" in text and "* current" in text.splitlines()[1]


def test_a_hit_carries_what_a_marketer_needs_and_its_file_hashes_right(tree, cfg, assets):
    jid = publish(tree, cfg, minimal(assets, name="mug"))
    [hit] = search(tree, "campaign=mug", "locale=en-GB")["results"]
    assert hit["job"] == jid and hit["name"] == "mug" and hit["revision"] == 1
    assert hit["resolution"] and hit["duration"] == hit["duration"] and hit["duration"] > 0
    assert store.sha256_file(tree.root / hit["path"])[0] == hit["sha256"]
    assert hit["tags"]["campaign"] == "mug" and "thumbnail" in hit
    assert search(tree, "campaign=mug", "locale=fr-FR")["results"] == []


def test_visibility_fails_closed_and_widens_on_request(tree):
    cfg = allow_noop(tree)
    publish(tree, cfg, noop_sub("open", tags=tags_for(0, visibility="public")))
    publish(tree, cfg, noop_sub("secret", tags=tags_for(0, visibility="private")))
    assert [h["job"] for h in search(tree, "campaign=c0")["results"]] == ["open@1"]
    assert [h["job"] for h in search(tree, "campaign=c0", "--visibility", "private")["results"]] == [
        "open@1",
        "secret@1",
    ]
    assert search(tree, "visibility=private")["results"] == []  # asking for it is not enough
    # An asset without any visibility tag is never listed.
    cfg = allow_noop(tree, acceptance={"required_tags": ["campaign", "locale", "asset_type"]})
    publish(tree, cfg, noop_sub("bare", tags={"campaign": "c0", "locale": "en-GB", "asset_type": "ad"}))
    assert "bare@1" not in {
        h["job"] for h in search(tree, "campaign=c0", "--visibility", "private")["results"]
    }


def test_a_hit_whose_object_is_missing_is_never_printed_and_fsck_reports_it(tree):
    cfg = allow_noop(tree)
    jid = publish(tree, cfg, noop_sub("gone"))
    obj = tree.root / json.loads(tree.manifest_file(jid).read_text())["output"]["store_path"]
    os.chmod(obj.parent, 0o755)
    obj.unlink()
    assert search(tree, "campaign=c0")["results"] == []
    out = json.loads(run_cli("fsck", "--json", spool=tree).stdout)
    assert any("is missing" in p["problem"] for p in out["problems"])


def test_get_prints_or_copies_the_verified_file(tree, tmp_path):
    cfg = allow_noop(tree)
    jid = publish(tree, cfg, noop_sub("spot"))
    m = json.loads(tree.manifest_file(jid).read_text())
    path = tree.root / m["output"]["store_path"]
    for ref in (jid, "spot", m["output"]["sha256"]):
        res = run_cli("get", ref, spool=tree)
        assert (res.returncode, res.stdout.strip()) == (0, str(path)), res.stderr
    dest = tmp_path / "out"
    dest.mkdir()
    res = run_cli("get", "spot", "--to", str(dest), spool=tree)
    assert res.returncode == 0 and res.stdout.strip() == str(dest / m["output"]["file"])
    assert store.sha256_file(dest / m["output"]["file"])[0] == m["output"]["sha256"]
    (dest / m["output"]["file"]).chmod(0o644)
    (dest / m["output"]["file"]).write_bytes(b"other")
    assert run_cli("get", "spot", "--to", str(dest), spool=tree).returncode == 1  # never replaced


def test_get_is_not_ready_while_pending_and_unknown_is_4(tree):
    cfg = allow_noop(tree)
    accept.accept_bytes(tree, cfg, noop_sub("later"), "t")
    for ref in ("later", "later@1"):
        res = run_cli("get", ref, spool=tree)
        assert res.returncode == 3 and "not" in res.stderr, res.stderr
    for ref in ("nosuch", "nosuch@1", "0" * 64):
        assert run_cli("get", ref, spool=tree).returncode == 4


@pytest.mark.parametrize("fmt", [1, 2])
def test_get_of_a_complete_job_that_is_not_indexed_is_not_ready(tree, fmt):
    if fmt == 1:
        as_format_1(tree)
    cfg = allow_noop(tree)
    jid = publish(tree, cfg, noop_sub("spot"))
    # As a spool from before the library: format 1's version record, format 2's segment line.
    if fmt == 1:
        (tree.root / "library" / "spot" / "1").unlink()
    else:
        [seg] = segments.listed(tree)
        (tree.root / "index" / "_segments" / seg).unlink()
    res = run_cli("get", jid, spool=tree)
    assert res.returncode == 3 and "not yet indexed" in res.stderr
    assert run_cli("index", "--rebuild", spool=tree).returncode == 0
    assert run_cli("get", jid, spool=tree).returncode == 0


@pytest.mark.system
def test_get_keeps_working_during_enrichment(tree, cfg, assets):
    samples.clip(assets / "long.mp4", seconds=20.0, size="320x240", rate=25)  # enrichment takes a while
    sub = minimal(assets, name="mug", sources={"clip": str(assets / "long.mp4")}, steps=[{"op": "encode"}])
    publish(tree, cfg, sub)
    expected = run_cli("get", "mug", spool=tree, check=True).stdout.strip()
    during = 0
    for _ in range(5):  # until a get has surely overlapped an enrichment
        proc = subprocess.Popen(
            [SPOOL, "enrich", "--force", "mug", "--spool", str(tree.root)], stdout=subprocess.PIPE
        )
        while proc.poll() is None:
            res = run_cli("get", "mug", spool=tree)
            if proc.poll() is None:
                during += 1
                assert (res.returncode, res.stdout.strip()) == (0, expected)
        assert proc.wait() == 0
        if during:
            break
    assert during >= 1


def test_bad_arguments_exit_with_the_readme_codes(tree):
    allow_noop(tree)
    cases = [
        (["search", "campaign"], 2),  # no operator
        (["search", "loudness<loud"], 2),  # a number is needed
        (["search", "director=bob"], 2),  # not an indexed tag
        (["search", "campaign>x"], 2),  # tags compare with = only
        (["search", "--limit", "0", "campaign=c0"], 2),
        (["get", "Not A Name"], 2),
        (["get"], 2),
        (["show", "nosuch"], 4),
        (["enrich", "nosuch"], 4),
        (["enrich", "bad name"], 2),
        (["enrich", "--field", "nope"], 2),
        (["index", "--bogus"], 2),
    ]
    for args, code in cases:
        res = run_cli(*args, spool=tree)
        assert res.returncode == code, (args, res.returncode, res.stderr)
    res = run_cli("search", "--json", "director=bob", spool=tree)
    assert json.loads(res.stdout)["exit_code"] == 2 and "director" in json.loads(res.stdout)["error"]


def test_search_with_no_terms_lists_every_current_asset(tree):
    cfg = allow_noop(tree)
    for i in range(3):
        publish(tree, cfg, noop_sub(f"a{i}", tags=tags_for(i)))
    assert [h["job"] for h in search(tree)["results"]] == ["a0@1", "a1@1", "a2@1"]
    assert len(search(tree, "--limit", "2")["results"]) == 2
    write_json(tree.root.parent / "x.json", {})  # unrelated files never confuse it


def test_status_index_and_metrics_show_the_library(tree):
    cfg = allow_noop(tree)
    for i in range(2):
        publish(tree, cfg, noop_sub(f"a{i}", tags=tags_for(i)))
    lib = json.loads(run_cli("status", "--json", spool=tree, check=True).stdout)["library"]
    assert lib == {"assets": 2, "enriched_objects": 0, "enrichment_backlog": 2}
    out = json.loads(run_cli("index", "--json", spool=tree, check=True).stdout)
    assert (out["tag_entries"], out["versions"]) == (8, 2)
    assert 0 <= out["index_delay_seconds"]["median"] <= out["index_delay_seconds"]["max"] < 5
    from spool.observe import metrics

    fams = {f.name: f for f in metrics.queue_families(tree, "w1", time.time())}
    text = families.exposition(fams.values())
    assert 'spool_library_assets{worker="w1"} 2' in text
    assert 'spool_library_index_delay_seconds{worker="w1",stat="max"}' in text
    assert 'spool_library_enrichment_backlog{worker="w1"} 2' in text


# -- the library on the status page ------------------------------------------------------

SCRIPT_TAG = "<script>window.__pwned=1</script>"
IMG_TAG = "<img src=x onerror=window.__pwned=2>"


def test_status_page_searches_the_library_and_shows_tags_as_text(tree, assets, daemons):
    import urllib.error
    import urllib.request

    import pytest
    import webdriver
    from conftest import TAGS
    from test_web import Server

    evil = dict(TAGS, campaign=SCRIPT_TAG, locale=IMG_TAG)
    for name, tags, trim in (("evil", evil, 0.6), ("plain", dict(TAGS), 0.8)):  # two different outputs
        sub = minimal(
            assets, name=name, tags=tags, steps=[{"op": "trim", "duration": trim}, {"op": "encode"}]
        )
        run_cli("submit", str(write_json(tree.root.parent / f"{name}.json", sub)), spool=tree, check=True)
    assert daemons(tree, "seed", drain=True).wait() == 0
    from conftest import wait_for

    wait_for(lambda: len(list((tree.root / "thumbs").glob("*.jpg"))) == 2, timeout=30)
    server = Server(tree)
    try:
        q = urllib.parse.quote(f"campaign={SCRIPT_TAG}")
        [hit] = server.json(f"/api/library?t={q}")["results"]
        assert hit["job"] == "evil@1" and hit["tags"]["locale"] == IMG_TAG
        with pytest.raises(urllib.error.HTTPError) as bad:
            server.json("/api/library?t=director%3Dbob")
        assert bad.value.code == 400
        status, headers, body = server.raw("GET", f"/download/{hit['sha256']}")
        assert status == 200 and hashlib.sha256(body).hexdigest() == hit["sha256"]
        assert headers["content-disposition"] == f'attachment; filename="{hit["file"]}"'
        assert server.raw("GET", "/download/" + "0" * 64)[0] == 404
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
            typed = json.dumps(f'locale="{IMG_TAG}"')  # quotes keep the spaces in one term
            b.script(f"document.getElementById('lib-q').value = {typed};")
            b.script("document.getElementById('lib-form').requestSubmit();")
            b.wait("return document.body.dataset.librarySearches === '2'")
            grid = b.text("#lib-grid")
            assert SCRIPT_TAG in grid and IMG_TAG in grid and "plain@1" not in grid
            links = b.script(
                "return [...document.querySelectorAll('#lib-grid a.download')]"
                ".map(a => a.getAttribute('href'))"
            )
            assert links == [f"/download/{hit['sha256']}"]
            assert b.script("return window.__pwned === undefined && document.scripts.length === 1")
            assert (
                b.script(
                    "return document.querySelectorAll('#lib-grid script, #lib-grid img[onerror]').length"
                )
                == 0
            )
        finally:
            b.close()
    finally:
        server.stop()


def test_two_mounts_publishing_revisions_1_to_5_in_random_order_end_with_5_current(nas, daemons):  # noqa: F811
    """Two daemons, each on its own sshfs mount of one export (tools/multimount)."""
    server, a, b = nas.spool("library")
    cfg = allow_noop(server)
    order = [1, 2, 3, 4, 5]
    random.Random(11).shuffle(order)
    for rev in order:
        accept.accept_bytes(server, cfg, noop_sub("spot", rev), "t")
    da = daemons(a, "lib-a", drain=True, log=nas.export.parent / "spoold-lib-a.log")
    db = daemons(b, "lib-b", drain=True, log=nas.export.parent / "spoold-lib-b.log")
    assert da.wait(timeout=300) == 0, da.output()
    assert db.wait(timeout=300) == 0, db.output()
    for view in (server, a, b):
        assert catalog.current_revision(view, "spot") == 5
    [hit] = catalog.search(b, cfg, catalog.parse_terms(["campaign=c0"])).results
    assert hit.job == "spot@5" and store.sha256_file(b.root / hit.path)[0] == hit.sha256
    assert [
        h.revision
        for h in catalog.search(a, cfg, catalog.parse_terms(["campaign=c0"]), all_versions=True).results
    ] == [1, 2, 3, 4, 5]
