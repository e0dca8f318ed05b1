"""The ``still`` kind (spool/kinds/still.py): a fourth kind that renders, added as one module.

It runs through the real CLI and a real daemon like any kind: accepted (its own field of
the submission, ``still``), claimed, produced by FFmpeg, checked by its gate, published
into the store and found in the library; and nothing outside its module names it.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from conftest import TAGS, run_cli, write_json

from spool import kinds

ROOT = Path(__file__).resolve().parents[1]


def _still(assets: Path, name: str = "poster", **spec: object) -> dict[str, object]:
    return {
        "name": name,
        "operation": "still",
        "sources": {"clip": str(assets / "clip.mp4")},
        "still": {"at": 1.0, "width": 160, **spec},
        "tags": dict(TAGS),
    }


def test_a_still_is_taken_checked_published_and_found(tree, assets, daemons):
    out = run_cli(
        "submit", str(write_json(tree.root.parent / "s.json", _still(assets))), spool=tree, check=True
    )
    jid = out.stdout.strip()
    d = daemons(tree, drain=True)
    assert d.wait(timeout=120) == 0, d.output()[-3000:]
    assert (tree.complete / f"{jid}.json").exists()
    path = Path(run_cli("get", jid, spool=tree, check=True).stdout.strip())
    assert path.suffix == ".png" and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    size = subprocess.run(
        ["ffprobe", "-v", "error", "-show_entries", "stream=width,height", "-of", "csv=p=0", str(path)],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    assert size == "160,120"  # the 320x240 clip at 160 wide
    found = run_cli("search", "campaign=mug", "--json", spool=tree, check=True).stdout
    assert jid in found


def test_a_still_past_the_clips_end_or_with_a_foreign_field_is_refused_naming_it(tree, assets):
    late = run_cli(
        "submit", str(write_json(tree.root.parent / "late.json", _still(assets, at=99.0))), spool=tree
    )
    assert late.returncode == 2 and "still.at" in late.stderr and "past the clip's end" in late.stderr
    odd = dict(_still(assets, name="odd"), recipe={"input": "clip", "steps": []})
    res = run_cli("submit", str(write_json(tree.root.parent / "odd.json", odd)), spool=tree)
    assert res.returncode == 2 and "recipe" in res.stderr and "not a known field" in res.stderr


def test_the_kind_is_one_module_nothing_else_names() -> None:
    assert "still" in kinds.KINDS  # found by the registry, listed nowhere
    names = re.compile(r"\bStillJob\b|kinds\.still\b|from \.still import|\"still\"\s*:")
    outside = [
        str(f.relative_to(ROOT))
        for f in sorted([*(ROOT / "spool").rglob("*.py"), *(ROOT / "spoold").rglob("*.py")])
        if f.name != "still.py" and names.search(f.read_text())
    ]
    assert outside == []
