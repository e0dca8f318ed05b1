"""spool renders what was accepted or nothing: a source overwritten while FFmpeg
reads it fails the attempt before anything is published (issue 11, bug 1)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from conftest import run_cli, wait_for, write_json

from spool.core.model import Failure, decode
from spool.disk.tree import Tree
from spool.media import samples


def test_a_source_overwritten_mid_render_is_never_published(tree: Tree, assets: Path, daemons):
    src = samples.clip(assets / "long.ts", seconds=6.0, size="640x360")
    other = samples.clip(assets.parent / "other.ts", seconds=6.0, size="640x360", rate=30)
    sub = {
        "name": "changing",
        "sources": {"clip": str(src)},
        "recipe": {
            "input": "clip",
            # slow enough (a few seconds) that the overwrite lands while FFmpeg reads
            "steps": [{"op": "fit", "width": 1280, "height": 720}, {"op": "encode", "preset": "medium"}],
        },
        "tags": {"campaign": "c", "locale": "en", "asset_type": "ad", "visibility": "internal"},
    }
    run_cli("submit", str(write_json(tree.root.parent / "s.json", sub)), spool=tree, check=True)
    d = daemons(tree, "w1", drain=True)
    work = tree.attempt_dir("changing@1", 1) / "work" / "changing.mp4"
    wait_for(work.exists, timeout=60, interval=0.02)
    shutil.copyfile(other, src)  # in place: same inode, new bytes, mid-render
    assert d.wait(timeout=120) == 0
    assert (tree.failed / "changing@1.json").exists()
    assert not (tree.manifests / "changing@1.json").exists()
    assert not list((tree.store / "sha256").rglob("*.mp4"))
    f = decode((tree.attempt_dir("changing@1", 1) / "failure.json").read_bytes(), Failure)
    assert f.property == "sources.clip" and "source changed during render" in f.message
    assert not f.retryable and "Nothing was published" in f.next_action
    shown = json.loads(run_cli("show", "changing@1", "--json", spool=tree, check=True).stdout)
    assert "changing@1" in json.dumps(shown)
