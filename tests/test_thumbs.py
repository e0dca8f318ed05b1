"""Poster frames: made by the daemon after publish, named by the output's hash, and
never able to fail or hold up a job."""

from __future__ import annotations

import json
import subprocess

import pytest
from conftest import minimal, run_cli, state_files, wait_for, write_json

from spool.core import settings
from spool.media import thumbs


def _submit(tree, assets, name, **over):
    run_cli(
        "submit",
        str(write_json(tree.root.parent / f"{name}.json", minimal(assets, name=name, **over))),
        spool=tree,
        check=True,
    )


def _width(path) -> int:
    out = subprocess.run(
        ["ffprobe", "-v", "error", "-show_entries", "stream=width,codec_name", "-of", "json", str(path)],
        capture_output=True,
        check=True,
    )
    stream = json.loads(out.stdout)["streams"][0]
    assert stream["codec_name"] == "mjpeg"
    return int(stream["width"])


def test_poster_frame_is_made_after_publish_and_named_by_hash(tree, assets, daemons):
    settings.write(tree.config_file, {"observe": {"thumbnail_width": 160}})
    _submit(tree, assets, "pictured")
    assert daemons(tree, "w1", drain=True).wait() == 0
    manifest = json.loads(tree.manifest_file("pictured@1").read_text())
    thumb = tree.root / "thumbs" / f"{manifest['output']['sha256']}.jpg"
    wait_for(thumb.exists)
    assert thumb.read_bytes().startswith(b"\xff\xd8") and _width(thumb) == 160
    assert thumbs.url(tree, manifest["output"]["sha256"]) == f"thumbs/{thumb.name}"
    assert [p.name for p in (tree.root / "thumbs").iterdir()] == [thumb.name]  # no temp files left


def test_a_thumbnail_failure_never_fails_a_job(tree, assets, daemons):
    (tree.root / "thumbs").write_text("a file where the thumbs/ folder should be")
    _submit(tree, assets, "unpictured")
    d = daemons(tree, "w1", drain=True)
    assert d.wait() == 0
    assert state_files(tree)["complete"] == ["unpictured@1.json"]
    assert "unpictured@1: making the poster frame failed" in d.output()


def test_no_thumbnails_when_turned_off(tree, assets, daemons):
    settings.write(tree.config_file, {"observe": {"thumbnail_width": 0}})
    _submit(tree, assets, "plain")
    assert daemons(tree, "w1", drain=True).wait() == 0
    assert state_files(tree)["complete"] == ["plain@1.json"] and not (tree.root / "thumbs").exists()


def test_poster_time_is_a_third_in_and_at_most_ten_seconds():
    assert thumbs.poster_time(None) == 0.0
    assert thumbs.poster_time(3.0) == 1.0
    assert thumbs.poster_time(600.0) == 10.0


def test_grab_reports_no_frame_past_the_end(media):
    with pytest.raises(thumbs.ThumbnailError, match="no frame at 999"):
        thumbs.grab(media["clip"], 999.0, 64)
    assert thumbs.grab(media["clip"], 0.5, 64).startswith(b"\xff\xd8")
