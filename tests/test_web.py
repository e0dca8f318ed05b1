"""The status page: a real ``spool serve`` over a spool seeded by real renders,
read over HTTP and in a real headless chromium."""

from __future__ import annotations

import hashlib
import http.client
import json
import re
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import webdriver
from conftest import SPOOL, Daemon, minimal, run_cli, wait_for, write_json

from spool.core import settings
from spool.disk.tree import Tree
from spool.media import samples

ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts"
#: Markup that must stay text wherever the page shows it.
SCRIPT_TAG = "<script>window.__pwned=1</script>"
IMG_FILE = "<img src=x onerror=window.__pwned=2>.json"


class Server:
    """A real ``spool serve`` process on a free port."""

    def __init__(self, tree: Tree) -> None:
        self.proc = subprocess.Popen(
            [SPOOL, "serve", "--bind", "127.0.0.1:0", "--spool", str(tree.root)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        m = re.search(r"http://127\.0\.0\.1:(\d+)/", line)
        assert m, line
        self.url, self.port = m.group(0), int(m.group(1))

    def raw(self, method: str, path: str) -> tuple[int, dict[str, str], bytes]:
        """A request with the path exactly as given (no client-side normalising)."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            conn.putrequest(method, path, skip_accept_encoding=True)
            conn.endheaders()
            r = conn.getresponse()
            return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
        finally:
            conn.close()

    def json(self, path: str) -> dict:
        with urllib.request.urlopen(self.url + path.lstrip("/"), timeout=30) as r:
            return json.load(r)

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture(scope="module")
def seeded(tmp_path_factory: pytest.TempPathFactory, media: dict[str, Path]) -> Tree:
    """A spool after real renders: two outputs with poster frames, a failure, a rejection,
    a pending job; one worker (max_active 1) has stopped."""
    root = tmp_path_factory.mktemp("web")
    assets = root / "assets"
    assets.mkdir()
    for p in media.values():
        shutil.copyfile(p, assets / p.name)
    samples.clip(assets / "long.mp4", seconds=20.0, size="320x240", rate=25)
    tree = Tree.at(root / "spool")
    tree.create()
    settings.write(
        tree.config_file,
        {
            "assets": {"roots": [str(assets)]},
            "daemon": {"poll_interval": 0.2, "heartbeat_interval": 0.5, "stop_grace": 0.5},
            "observe": {"page_refresh": 0.5},
            "limits": {"max_active": 1},
        },
    )

    def submit(name: str, sub: dict) -> None:
        run_cli("submit", str(write_json(root / f"{name}.json", sub)), spool=tree, check=True)

    tags = {"campaign": SCRIPT_TAG, "locale": "en-GB", "asset_type": "ad", "visibility": "internal"}
    submit("first", minimal(assets, name="first", tags=tags))
    submit("second", minimal(assets, name="second", steps=[{"op": "trim", "start": 0.5, "duration": 0.5}]))
    submit("wide", minimal(assets, name="wide", output={"expect": {"width": 999}}))
    evil = write_json(root / IMG_FILE, {"name": "x"})
    assert run_cli("submit", str(evil), spool=tree).returncode == 2
    d = Daemon(tree, "seed", drain=True)
    assert d.wait() == 0, d.output()
    wait_for(lambda: len(list((tree.root / "thumbs").glob("*.jpg"))) == 2, timeout=30)
    submit("waiting", minimal(assets, name="waiting", priority=-1))
    return tree


@pytest.fixture(scope="module")
def server(seeded: Tree) -> Iterator[Server]:
    s = Server(seeded)
    yield s
    s.stop()


def test_api_status_has_what_the_page_shows(server):
    d = server.json("/api/status")
    assert d["counts"] == {
        "incoming": 0,
        "waiting": 0,
        "pending": 1,
        "held": 0,
        "running": 0,
        "complete": 2,
        "failed": 1,
        "rejected": 1,
        "quarantine": 0,
    }
    assert d["refresh_seconds"] == 0.5
    assert [r["job_id"] for r in d["recent"]] == ["second@1", "first@1"]
    for r in d["recent"]:
        assert re.fullmatch(r"[0-9a-f]{64}", r["sha256"]) and r["thumbnail"] == f"thumbs/{r['sha256']}.jpg"
    kinds = {a["kind"]: a for a in d["attention"]}
    assert kinds["failed"]["subject"] == "wide@1" and "spool revise" in kinds["failed"]["next_action"]
    assert kinds["rejected"]["subject"] == IMG_FILE
    assert d["workers"][0]["health"] == "stopped"


def test_api_job_has_timeline_manifest_and_thumbnail(server, seeded):
    d = server.json("/api/jobs/first@1")
    assert d["state"] == "complete" and d["job"]["tags"]["campaign"] == SCRIPT_TAG
    assert [e["to"] for e in d["timeline"]] == ["pending", "running", "complete"]
    store = seeded.root / d["manifest"]["output"]["store_path"]
    assert hashlib.sha256(store.read_bytes()).hexdigest() == d["manifest"]["output"]["sha256"]
    assert d["thumbnail"] == f"thumbs/{d['manifest']['output']['sha256']}.jpg" and d["approvals"] == []
    status, headers, body = server.raw("GET", "/" + d["thumbnail"])
    assert status == 200 and headers["content-type"] == "image/jpeg" and body.startswith(b"\xff\xd8")
    assert body == (seeded.root / d["thumbnail"]).read_bytes() and "immutable" in headers["cache-control"]
    for missing in (
        "/api/jobs/nope@1",
        "/api/jobs/not-a-job-id",
        "/jobs/not-a-job-id",
        "/thumbs/" + "0" * 64 + ".jpg",
    ):
        assert server.raw("GET", missing)[0] == 404, missing


def test_nothing_outside_the_spool_is_served(server, seeded, tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("TOP SECRET")
    thumbs = seeded.root / "thumbs"
    planted = "f" * 64
    (thumbs / f"{planted}.jpg").symlink_to(secret)
    outside = tmp_path / "outside-thumbs"
    outside.mkdir()
    (outside / f"{planted}.jpg").write_bytes(b"\xff\xd8 outside")
    probes = [
        "/../spool.toml",
        "/thumbs/../spool.toml",
        "/%2e%2e/spool.toml",
        "/thumbs/%2e%2e/spool.toml",
        "/thumbs/%2E%2E%2Fspool.toml",
        "/static/..%2fspool.toml",
        "/static/%2e%2e%2f%2e%2e%2f%2e%2e%2fetc%2fpasswd",
        "/jobs/..%2f..%2fspool.toml",
        "/api/jobs/%2e%2e%2fspool.toml",
        "/api/status/../../spool.toml",
        "//etc/passwd",
        "/thumbs/%00.jpg",
        f"/thumbs/{planted}.jpg%00",
        f"/thumbs/{planted}.jpg/..",
        "/%ff%fe",
        f"/thumbs/{planted}.jpg",  # the planted symlink
        f"/{secret}",
    ]
    try:
        for path in probes:
            status, _, body = server.raw("GET", path)
            assert status in (400, 404), (path, status)
            assert b"SECRET" not in body and b"[assets]" not in body and b"root:" not in body, path
        # thumbs/ itself swapped for a symlink to a folder outside the spool
        thumbs.rename(seeded.root / "thumbs.real")
        thumbs.symlink_to(outside)
        assert server.raw("GET", f"/thumbs/{planted}.jpg")[0] == 404
    finally:
        if thumbs.is_symlink():
            thumbs.unlink()
            (seeded.root / "thumbs.real").rename(thumbs)
        (thumbs / f"{planted}.jpg").unlink()
    before = sorted(p.name for p in seeded.root.iterdir())
    for method in ("POST", "PUT", "DELETE", "PATCH"):
        assert server.raw(method, "/api/status")[0] == 405
    assert sorted(p.name for p in seeded.root.iterdir()) == before
    status, headers, _ = server.raw("GET", "/")
    assert status == 200 and "script-src 'self'" in headers["content-security-policy"]
    assert headers["x-content-type-options"] == "nosniff"


@pytest.fixture(scope="module")
def browser() -> Iterator[webdriver.Browser]:
    if not webdriver.available():
        pytest.skip("chromium and chromedriver are not installed (tools/setup installs them)")
    b = webdriver.Browser()
    yield b
    b.close()


def _api_fetches(b: webdriver.Browser, path: str) -> int:
    return int(
        b.script(
            f"return performance.getEntriesByType('resource').filter(e => e.name.endsWith('{path}')).length"
        )
    )


def test_page_in_a_browser_shows_counts_progress_thumbnails_and_escapes(server, seeded, browser):
    """The acceptance check: counts, a live progress bar, poster frames, nothing executed."""
    assets = seeded.root.parent / "assets"
    slow = minimal(
        assets,
        name="slow",
        priority=10,
        sources={"clip": str(assets / "long.mp4")},
        steps=[{"op": "fit", "width": 1280, "height": 720}, {"op": "encode", "preset": "slow", "crf": 18}],
    )
    run_cli("submit", str(write_json(seeded.root.parent / "slow.json", slow)), spool=seeded, check=True)
    browser.get(server.url)
    # The server computes the status at most once a second for all viewers, and an
    # earlier test may have asked within that second: wait for the page's next update
    # to show the submission just made (the page is live), then read the rest.
    browser.wait("return document.querySelector('#count-pending').textContent === '2'")
    assert browser.text("#count-complete") == "2" and browser.text("#count-failed") == "1"
    assert browser.text("#count-rejected") == "1"
    attention = browser.text("#attention")
    assert "wide@1" in attention and "next:" in attention and IMG_FILE in attention  # shown as text

    worker = Daemon(seeded, "live")
    try:
        first = browser.wait(
            "const p = document.querySelector('#running progress'); return p && p.value > 0 && p.value",
            timeout=60,
        )
        assert "slow@1" in browser.text("#running") and "fps" in browser.text("#running")
        bar = "const p = document.querySelector('#running progress');"
        later = browser.wait(f"{bar} return p && p.value > {first} && p.value", timeout=30)
        assert later > first  # live: the bar moved without a reload
        assert (
            browser.wait(
                "const imgs = [...document.querySelectorAll('#recent img')];"
                "return imgs.every(i => i.complete && i.naturalWidth > 0) && imgs.length"
            )
            == 2
        )
        shot = browser.screenshot(ARTIFACTS / "status-page.png")
        print(f"\nstatus page screenshot: {shot}")
    finally:
        worker.signal(signal.SIGTERM)
        worker.wait()

    assert browser.script("return performance.getEntriesByType('navigation').length") == 1
    assert browser.script("return window.__pwned === undefined")
    assert browser.script("return document.scripts.length") == 1
    imgs = browser.script("return [...document.images].map(i => i.getAttribute('src'))")
    assert imgs and all(re.fullmatch(r"/thumbs/[0-9a-f]{64}\.jpg", s) for s in imgs), imgs

    browser.get(server.url + "jobs/first@1")
    browser.wait("return document.body.dataset.updates")
    body = browser.text("#job-body")
    assert SCRIPT_TAG in body and "TIMELINE" in body.upper()
    assert browser.script("return window.__pwned === undefined && document.scripts.length === 1")
    assert browser.wait(
        "const i = document.querySelector('img.poster'); return i && i.complete && i.naturalWidth"
    )
    print(f"job page screenshot: {browser.screenshot(ARTIFACTS / 'job-page.png')}")


def test_page_polls_gently_and_backs_off_when_the_server_goes(seeded, browser):
    s = Server(seeded)
    try:
        browser.get(s.url)
        browser.wait("return document.body.dataset.updates")
        # Three more polls come (it polls), and they take at least 2 x the 0.5 s period
        # between them (one at a time, not a storm): waited for, not slept for.
        n0 = _api_fetches(browser, "/api/status")
        t0 = time.monotonic()
        browser.wait(f"return performance.getEntriesByType('resource').filter("
                     f"e => e.name.endsWith('/api/status')).length >= {n0 + 3}", timeout=15)  # fmt: skip
        assert time.monotonic() - t0 >= 1.0
    finally:
        s.stop()
    time.sleep(3.0)
    failures = int(browser.script("return document.body.dataset.failures || 0"))
    assert 1 <= failures <= 3, failures  # then 1 s, 2 s, 4 s later: not 6 tries in 3 s
    assert "retrying in" in browser.text("#conn")
    assert browser.script("return performance.getEntriesByType('navigation').length") == 1
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(s.url, timeout=2)


def test_a_campaign_page_shows_its_variants_as_a_grid_of_posters_and_states(tree, assets, browser):
    """A fan-out's parent: one card per visible variant, its poster frame once published, its
    state; a variant the rule hides is left out (and a parent with none answers 404)."""
    fan = minimal(
        assets,
        name="mug-ad",
        variants={
            "aspect": {"16x9": {}, "1x1": {"steps": {"trim": {"duration": 0.4}}}},
            "locale": {"en-GB": {}, "de-DE": {"tags": {"locale": "de-DE", "visibility": "secret"}}},
        },
    )
    run_cli("submit", str(write_json(tree.root.parent / "fan.json", fan)), spool=tree, check=True)
    d = Daemon(tree, "grid", drain=True)
    assert d.wait() == 0, d.output()
    # each locale's variant of an aspect is the same bytes here (no text): one object, one poster
    wait_for(lambda: len(list((tree.root / "thumbs").glob("*.jpg"))) == 2, timeout=30)
    s = Server(tree)
    try:
        api = s.json("/api/jobs/mug-ad@1")
        assert [v["job"] for v in api["variants"]] == ["mug-ad.16x9.en-gb@1", "mug-ad.1x1.en-gb@1"]
        assert api["counts"] == {"complete": 2} and all(v["thumbnail"] for v in api["variants"])
        browser.get(s.url + "jobs/mug-ad@1")
        browser.wait("return document.body.dataset.updates")
        cards = browser.script(
            "return [...document.querySelectorAll('#job-body .card.variant')].map(c => c.textContent)"
        )
        assert len(cards) == 2 and all("complete" in c for c in cards), cards
        assert "mug-ad.1x1.en-gb@1" in cards[1] and "de-de" not in " ".join(cards)
        assert browser.wait(
            "const imgs = [...document.querySelectorAll('#job-body .card.variant img')];"
            "return imgs.length === 2 && imgs.every(i => i.complete && i.naturalWidth > 0)"
        )
        assert browser.script("return window.__pwned === undefined && document.scripts.length === 1")
        print(f"campaign page screenshot: {browser.screenshot(ARTIFACTS / 'campaign-page.png')}")
        assert s.raw("GET", "/api/jobs/mug-ad@2")[0] == 404
    finally:
        s.stop()
