"""ARCHITECTURE.md's protocol table names every file and folder spool writes.

The table ("The on-disk protocol", the first section) is parsed: each row's pattern,
in backticks in its first column, becomes a regular expression (each ``<placeholder>``
one path segment's worth, some constrained: ``<n>`` digits, ``<sha256>`` 64 hex; an
``[optional]`` part may be absent; a pattern ending in ``/`` is a folder). Then one
spool is driven through every feature by real daemons and the real CLI (render, noop,
generate against the provider simulator, adopt, a failing job retried, a rejected drop,
a quarantined damaged job file, hold and release, approve, cancel, enrich, verify, fsck,
metrics and thumbnails), drained, and every file and folder under its root must match a row.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import TAGS, minimal, run_cli, write_json
from genhelp import ENV, TOKEN, configure, gen_sub
from provsim import ProviderSim

from spool.core import settings
from spool.disk.tree import FOLDERS, Tree

ARCHITECTURE = Path(__file__).resolve().parents[1] / "ARCHITECTURE.md"
SECTION = "## The on-disk protocol"

#: What each placeholder of the table may stand for (one path segment or part of one).
#: A placeholder not listed here fails the parse: the table's vocabulary is this one.
PLACEHOLDERS = {
    "n": r"\d+",
    "k": r"\d+",
    "pid": r"\d+",
    "rand": r"[0-9a-f]{8}",
    "token": r"[0-9a-f]{6}",
    "aa": r"[0-9a-f]{2}",
    "sha256": r"[0-9a-f]{64}",
    "ext": r"(?:\.[A-Za-z0-9]+)?",
    "outcome": r"(?:made|refused|ambiguous)",
    "state": r"[a-z]+",
    "stamp": r"\d{8}T\d{6}\.\d{6}Z",
    "host": r"[A-Za-z0-9_-]+",
    "job": r"[^/]+@\d+",
    "worker": r"[^/]+",
    "name": r"[^/]+",
    "file": r"[^/]+",
    "final": r"[^/]+",
    "tag": r"[^/]+",
    "value": r"[^/]+",
    "rev": r"\d+",
    "usec": r"\d{17}",
    "ref": r"[^/]+",
    "provider": r"[^/]+",
    "provider_job_id": r"[^/]+",
    "by": r"[^/]+",
    "stem": r"[^/]+",
    "key": r"[^/]+",
    "metrics_dir": r"[^/]+",
    "folder": r"(?:[^/]+/)*",  # any folder: for temp names only, which every writer makes
}

_TOKEN = re.compile(r"<([a-z_0-9]+)>|\[|\]|[^<\[\]]+")


def table_rows(text: str) -> list[str]:
    """The patterns of the protocol table, in order (first column, in backticks)."""
    start = text.index(SECTION)
    end = text.find("\n## ", start + len(SECTION))
    rows = []
    for line in text[start : end if end >= 0 else None].splitlines():
        m = re.match(r"^\|\s*`([^`]+)`\s*\|", line)
        if m:
            rows.append(m.group(1))
    return rows


def to_regex(pattern: str) -> re.Pattern[str]:
    """A table pattern as a regular expression over a path relative to the spool root."""
    out = []
    depth = 0
    for m in _TOKEN.finditer(pattern):
        tok = m.group(0)
        if m.group(1):
            if m.group(1) not in PLACEHOLDERS:
                raise ValueError(f"{pattern}: unknown placeholder <{m.group(1)}>")
            out.append(PLACEHOLDERS[m.group(1)])
        elif tok == "[":
            out.append("(?:")
            depth += 1
        elif tok == "]":
            out.append(")?")
            depth -= 1
        else:
            out.append(re.escape(tok))
    if depth:
        raise ValueError(f"{pattern}: unbalanced [ ]")
    return re.compile("".join(out))


def folder_prefixes(pattern: str) -> list[str]:
    """The folders a pattern's path passes through (``a/<x>/b.json`` -> ``a/``, ``a/<x>/``)."""
    parts = pattern.rstrip("/").split("/")
    return ["/".join(parts[:i]) + "/" for i in range(1, len(parts)) if not parts[i - 1].startswith("<folder")]


def walk(root: Path) -> Iterator[str]:
    """Every file and folder under ``root``, relative, folders with a trailing ``/``."""
    for dirpath, dirnames, filenames in os.walk(root):
        rel = Path(dirpath).relative_to(root)
        for d in dirnames:
            yield f"{(rel / d).as_posix()}/"
        for f in filenames:
            yield (rel / f).as_posix()


def unnamed(paths: list[str], patterns: list[str]) -> list[str]:
    """The paths no row of the table names (a folder is named by its own row or by a row
    whose path passes through it)."""
    regexes = [to_regex(p) for p in patterns]
    regexes += [to_regex(f) for p in patterns for f in folder_prefixes(p)]
    return [p for p in paths if not any(r.fullmatch(p) for r in regexes)]


def test_the_table_parses_into_patterns_that_match_what_they_say():
    rows = table_rows(ARCHITECTURE.read_text())
    assert len(rows) == len(set(rows)), "a pattern appears twice"
    assert to_regex("store/sha256/<aa>/<sha256><ext>").fullmatch("store/sha256/ab/" + "ab" * 32 + ".mp4")
    assert not to_regex("store/sha256/<aa>/<sha256><ext>").fullmatch("store/sha256/ab/short.mp4")
    assert to_regex("attempts/<job>/<n>/failure.json").fullmatch("attempts/a@1/2/failure.json")
    assert not to_regex("attempts/<job>/<n>/failure.json").fullmatch("attempts/a@1/x/failure.json")
    temp = to_regex("<folder>.<final>.<host>.<pid>.<rand>[.tmp]")
    assert temp.fullmatch("pending/.a@1.json.box.12.0badcafe.tmp") and temp.fullmatch(".x.box.1.0badcafe")
    with pytest.raises(ValueError, match="unknown placeholder"):
        to_regex("attempts/<nobody>/x")
    tops = {r.split("/")[0] for r in rows}
    assert set(FOLDERS) <= tops, f"top folders spool init makes with no row: {set(FOLDERS) - tops}"
    assert unnamed(
        ["attempts/", "attempts/a@1/", "attempts/a@1/1/x.json"], ["attempts/<job>/<n>/y.json"]
    ) == ["attempts/a@1/1/x.json"]


@pytest.fixture(scope="module")
def sim() -> Iterator[ProviderSim]:
    with ProviderSim(token=TOKEN, work=0.3) as s:
        yield s


def _submit(tree: Tree, sub: dict[str, object]) -> str:
    name = str(sub["name"])
    path = write_json(tree.root.parent / f"{name}.sub.json", sub)
    return run_cli("submit", str(path), spool=tree, check=True, env=ENV).stdout.strip()


def _drain(tree: Tree, daemons) -> None:
    d = daemons(tree, "w1", drain=True, env=ENV)
    assert d.wait(timeout=120) == 0, d.output()[-3000:]


def _drop(tree: Tree, name: str, data: bytes) -> None:
    """A drop into ``incoming/`` the way a submitter makes one: a hidden name, then a rename."""
    tmp = tree.incoming / f".{name}.part"
    tmp.write_bytes(data)
    os.rename(tmp, tree.incoming / name)


def test_every_file_a_drained_spool_holds_is_named_by_the_protocol_table(tree, assets, sim, daemons):
    configure(tree, sim)
    settings.write(tree.config_file, {"acceptance": {"allow_noop": True}, "limits": {"max_attempts": 1}})
    shutil.copyfile(assets / "clip.mp4", assets / "fragile.mp4")

    ok = _submit(tree, minimal(assets, name="ok"))
    # a dependent (waiting/, deps/) and a fan-out's parent (variants/)
    follower = _submit(tree, minimal(assets, name="follower", sources={"clip": {"job": "ok"}}))
    _submit(tree, minimal(assets, name="fan", variants={"aspect": {"wide": {}, "tall": {}}}))
    broken = _submit(tree, minimal(assets, name="broken", sources={"clip": str(assets / "fragile.mp4")}))
    os.rename(assets / "fragile.mp4", assets / "fragile.away")  # fails: max_attempts = 1
    gen = _submit(tree, gen_sub("gen-clip"))
    aside = _submit(tree, minimal(assets, name="aside"))
    dropped = _submit(tree, minimal(assets, name="dropped"))
    noop = {"name": "nothing", "operation": "noop", "tags": dict(TAGS)}
    _drop(tree, "nothing.json", json.dumps(noop).encode())
    _drop(tree, "garbage.json", b'{"name": "x", broken')
    (tree.pending / "damaged@1.json").write_text('{"job_id": "damaged@1", broken')
    assert run_cli("hold", aside, spool=tree).returncode == 0
    assert run_cli("cancel", dropped, "--by", "an editor", spool=tree).returncode == 0
    assert run_cli("release", aside, spool=tree).returncode == 0

    _drain(tree, daemons)
    assert (tree.failed / f"{broken}.json").exists() and (tree.complete / f"{gen}.json").exists()

    os.rename(assets / "fragile.away", assets / "fragile.mp4")  # the operator fixes the cause
    assert run_cli("retry", broken, spool=tree).returncode == 0
    _drain(tree, daemons)
    for jid in (ok, broken, gen, aside, "nothing@1", follower, "fan.wide@1", "fan.tall@1"):
        assert (tree.complete / f"{jid}.json").exists(), jid
    assert (tree.failed / f"{dropped}.json").exists()
    assert (tree.rejected / "garbage.json").exists() and (tree.quarantine / "damaged@1.json").exists()

    sha = json.loads(tree.manifest_file(ok).read_text())["output"]["sha256"]
    assert run_cli("approve", ok, "--by", "producer", "--sha256", sha, spool=tree).returncode == 0
    assert run_cli("enrich", ok, spool=tree).returncode == 0
    lib = assets / "adoptable"
    lib.mkdir()
    shutil.copyfile(assets / "clip.mp4", lib / "spot.mp4")
    (lib / "spot.mp4.tags.json").write_text(json.dumps(dict(TAGS, name="spot")))
    assert run_cli("library", "adopt", str(lib), spool=tree).returncode == 0
    assert run_cli("verify", "--revalidate", ok, spool=tree).returncode == 0
    assert run_cli("fsck", spool=tree).returncode == 0
    assert run_cli("metrics", spool=tree).returncode == 0
    assert list((tree.root / "thumbs").glob("*.jpg")) and list((tree.root / "metrics").glob("*.prom"))

    rows = table_rows(ARCHITECTURE.read_text())
    paths = sorted(walk(tree.root))
    missing = unnamed(paths, rows)
    assert missing == [], (
        "written by spool but named by no row of ARCHITECTURE.md's protocol table:\n" + "\n".join(missing)
    )
    # The converse, weaker: every row's top folder (or top-level file) is in this tree,
    # except rows whose top is a placeholder or a hidden, transient name.
    tops = {p.split("/")[0] for p in paths}
    absent = {r for r in rows if r.split("/")[0] not in tops and not r.startswith(("<", "."))}
    absent -= {r for r in absent if r.startswith("library/")}  # format 1's; a new spool is format 2
    assert absent == set(), f"rows whose top folder this spool lacks: {sorted(absent)}"
