"""No value can change the shape of CLI output (issue 22): a fuzz of hostile tag values
(control characters, terminal escapes, forged hit lines, line separators, bidi
controls, NFD, 100 KB) through every command that prints tags, and through the
others that print what a submitter chose (paths, reasons). Plain output shows
control characters as escapes; ``--json`` carries the exact (NFC) value."""

from __future__ import annotations

import json
import os
import random
import re
import unicodedata

import pytest
from conftest import TAGS, run_cli, write_json
from hypothesis import given, settings
from hypothesis import strategies as st
from libhelp import allow_noop, publish

from spool.core import config
from spool.core.printable import printable
from spool.disk.tree import Tree
from spool.queue import accept

#: What must never reach a terminal or a line-splitting script raw.
RAW = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\u200e\u200f\u202a-\u202e\u2066-\u2069]")
FORGED = "FAKE@9\tabc\t1x1\t1.00s\tstore/sha256/00/evil.mp4\tvisibility=public"
PIECES = [
    "\n", "\t", "\r", "\r\n", "\x1b[2J", "\x1b[31m", "\x1b]0;pwned\x07", "\x08", "\x00", "\x7f",
    "\x85", "\x9b31m", "\x1c", "\u2028", "\u2029", "\u202e", "\u2066", "e\u0301", "\n" + FORGED + "\n",
    "é", "/", "%", "..", "\\n", "x", " ", "\u00a0",
]  # fmt: skip
N = int(os.environ.get("SPOOL_FORGERY_VALUES", "40"))


def hostile(rng: random.Random) -> str:
    """A value acceptance takes (no white space at either end, at most 256 characters)."""
    body = "".join(rng.choice(PIECES) for _ in range(rng.randint(1, 10)))
    return ("v" + body + "v")[:250] + "v"


def clean_lines(text: str) -> list[str]:
    """The output's lines (split only at newline), each proven free of raw controls."""
    lines = text.split("\n")
    assert lines[-1] == "", repr(text[-200:])  # every line ends with its newline
    for line in lines[:-1]:
        assert not RAW.search(line), repr(line)
        assert not line.startswith("FAKE@9")
    return lines[:-1]


@pytest.fixture(scope="module")
def hostile_spool(tmp_path_factory: pytest.TempPathFactory) -> tuple[Tree, dict[str, dict[str, str]]]:
    """N published noop jobs, each tagged with hostile values; and a pending render whose
    source path is hostile."""
    root = tmp_path_factory.mktemp("forgery")
    tree = Tree.at(root / "spool")
    tree.create()
    assets = root / "assets"
    assets.mkdir()
    cfg = allow_noop(tree, assets={"roots": [str(assets)]})
    rng = random.Random(22)
    sent: dict[str, dict[str, str]] = {}
    for i in range(N):
        tags = dict(TAGS, campaign=hostile(rng), note=hostile(rng))
        jid = publish(tree, cfg, {"name": f"h{i}", "operation": "noop", "tags": tags})
        sent[jid] = tags
    from spool.media import samples

    evil = assets / "evil\n\tFAKE\x1b[31m\u202e.mp4"
    samples.clip(assets / "plain.mp4", seconds=0.5, size="64x48", rate=10)
    os.rename(assets / "plain.mp4", evil)
    sub = {
        "name": "evil-source",
        "sources": {"clip": str(evil)},
        "recipe": {"input": "clip", "steps": [{"op": "encode"}]},
        "tags": dict(TAGS, campaign=FORGED.replace("\t", "x")),
    }
    accept.accept_bytes(tree, config.load(tree.config_file), json.dumps(sub).encode(), "tester")
    return tree, sent


def test_search_prints_one_line_of_six_fields_per_hit(hostile_spool):
    tree, sent = hostile_spool
    out = run_cli("search", "asset_type=ad", spool=tree, check=True)
    lines = clean_lines(out.stdout)
    assert len(lines) == len(sent)
    assert all(line.count("\t") == 5 for line in lines)
    assert sorted(line.split("\t")[0] for line in lines) == sorted(sent)
    for line in lines:
        tags = sent[line.split("\t")[0]]
        for key in ("campaign", "note"):
            shown = printable(unicodedata.normalize("NFC", tags[key]))
            assert f"{key}={shown}" in line.split("\t")[5]


def test_search_json_carries_the_exact_nfc_values(hostile_spool):
    tree, sent = hostile_spool
    out = json.loads(run_cli("search", "asset_type=ad", "--json", spool=tree, check=True).stdout)
    got = {h["job"]: h["tags"] for h in out["results"]}
    assert got == {j: {k: unicodedata.normalize("NFC", v) for k, v in t.items()} for j, t in sent.items()}
    one = next(iter(sent))  # and a query for a hostile value finds exactly its job
    q = f"campaign={sent[one]['campaign']}"
    assert [h["job"] for h in json.loads(run_cli("search", q, "--json", spool=tree).stdout)["results"]] == [
        one
    ]


def test_show_of_a_job_keeps_its_shape(hostile_spool):
    tree, sent = hostile_spool
    baseline_tree = tree.root.parent / "baseline"
    base = Tree.at(baseline_tree)
    base.create()
    cfg = allow_noop(base)
    publish(base, cfg, {"name": "h0", "operation": "noop", "tags": dict(TAGS, campaign="c", note="n")})
    want = len(clean_lines(run_cli("show", "h0@1", spool=base, check=True).stdout))
    for jid in list(sent)[:8]:
        lines = clean_lines(run_cli("show", jid, spool=tree, check=True).stdout)
        assert len(lines) == want, "\n".join(lines)
        [tag_line] = [x for x in lines if x.startswith("  tags: ")]
        assert printable(unicodedata.normalize("NFC", sent[jid]["campaign"])) in tag_line
    src = clean_lines(run_cli("show", "evil-source@1", spool=tree, check=True).stdout)
    [sources] = [x for x in src if x.startswith("  sources: ")]
    assert "evil\\n\\tFAKE\\x1b[31m\\u202e.mp4" in sources


def test_every_other_printing_command_stays_clean(hostile_spool):
    tree, _ = hostile_spool
    for args in (
        ("status",),
        ("ls",),
        ("events",),
        ("show", "h1"),
        ("get", "h1"),
        ("index",),
        ("fsck", "--quick"),
        ("search", "classifier.\x1b[2J=1"),
        ("get", "no\x1b[31mpe\n@1"),
    ):
        out = run_cli(*args, spool=tree)
        clean_lines(out.stdout)
        if out.stderr:
            assert len(clean_lines(out.stderr)) == 1, out.stderr  # one error, one line


def test_a_100_kb_or_hostile_submission_gets_one_clean_line(hostile_spool, tmp_path):
    tree, _ = hostile_spool
    big = write_json(
        tmp_path / "big.json",
        {"name": "big", "operation": "noop", "tags": dict(TAGS, campaign="x" * 100_000)},
    )
    odd = write_json(
        tmp_path / "odd\x1b[31m\nname.json", {"name": "odd", "operation": "noop", "tags": {"Bad\nKey": "v"}}
    )
    for f in (big, odd):
        res = run_cli("submit", str(f), spool=tree)
        assert res.returncode == 2 and res.stdout == ""
        assert len(clean_lines(res.stderr)) == 1, res.stderr


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.characters(codec="utf-8"), max_size=80))
def test_printable_never_leaves_a_raw_control(text):
    shown = printable(text)
    assert not RAW.search(shown) and "\n" not in shown and "\t" not in shown
    assert shown == text or any(c in shown for c in "\\")
