"""Acceptance (SPEC sections 1, 2, 10, 11.7): a definite frozen job, or a readable rejection.

The corpus below is a named list of bad submissions. Every one of them must end
in ``rejected/<name>.json`` with a one-sentence reason naming the offending
field, through the real CLI and through ``incoming/`` under a real daemon, and
none may ever become a job. Real files, real FFmpeg/ffprobe, no mocks.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import stat
import subprocess
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from conftest import TAGS, minimal, run_cli, state_files, submission, wait_for

from spool.core import config, settings
from spool.core.errors import InvalidInput
from spool.core.model import Rejection, canonical_json, decode, encode, now
from spool.disk.tree import Tree
from spool.kinds import Job
from spool.queue import accept
from spool.queue.status import locate

# -- the corpus --------------------------------------------------------------------------

#: A write-only sysfs attribute: even root gets EACCES when opening it for reading.
ROOT_UNREADABLE = Path("/sys/bus/pci/rescan")


class NotHere(Exception):
    """A case that cannot be built on this machine (e.g. needs a file root cannot read)."""


@dataclass
class Ctx:
    """What a case builder may use: the spool, its asset root, a folder outside the roots."""

    tree: Tree
    assets: Path
    scratch: Path
    name: str  # the submission name this case uses (unique within the corpus)

    def sub(self, **over: Any) -> dict[str, Any]:
        return submission(self.assets, **{"name": self.name, **over})

    def mini(self, steps: list[dict[str, Any]] | None = None, **over: Any) -> dict[str, Any]:
        return minimal(self.assets, steps=steps, **{"name": self.name, **over})

    def asset(self, suffix: str) -> Path:
        """A fresh path inside the asset root that belongs to this case."""
        return self.assets / f"{self.name}-{suffix}"

    def add_root(self, folder: str) -> None:
        """Add an asset root to this spool's spool.toml (before any daemon starts)."""
        roots = [*config.load(self.tree.config_file).assets.roots, folder]
        settings.write(self.tree.config_file, {"assets": {"roots": roots}})

    def accept_now(self, sub: dict[str, Any]) -> Job:
        cfg = config.load(self.tree.config_file)
        return accept.accept_bytes(self.tree, cfg, json.dumps(sub).encode(), "setup")


Builder = Callable[[Ctx], "bytes | dict[str, Any]"]


@dataclass(frozen=True)
class Case:
    id: str
    field: str | tuple[str, ...]  # the field path the rejection must name (or one of these)
    build: Builder
    also: tuple[str, ...] = ()  # further words the reason must contain
    bug: str | None = None  # a known spool bug: the case is an expected (strict) failure

    @property
    def fields(self) -> tuple[str, ...]:
        return self.field if isinstance(self.field, tuple) else (self.field,)

    def data(self, ctx: Ctx) -> bytes:
        out = self.build(ctx)
        return out if isinstance(out, bytes) else json.dumps(out, ensure_ascii=False).encode()


def step(sub: dict[str, Any], i: int, **over: Any) -> dict[str, Any]:
    sub["recipe"]["steps"][i].update(over)
    return sub


def without(d: dict[str, Any], *keys: str) -> dict[str, Any]:
    for k in keys:
        del d[k]
    return d


def enc(**over: Any) -> dict[str, Any]:
    return {"op": "encode", "preset": "ultrafast", **over}


def _dup(c: Ctx) -> dict[str, Any]:
    c.accept_now(c.mini())
    return c.mini()


def _empty_file(c: Ctx) -> dict[str, Any]:
    c.asset("empty.mp4").write_bytes(b"")
    return c.mini(sources={"clip": str(c.asset("empty.mp4"))})


def _text_file(c: Ctx) -> dict[str, Any]:
    c.asset("notes.mp4").write_text("this is a shopping list, not a video\n" * 20)
    return c.mini(sources={"clip": str(c.asset("notes.mp4"))})


def _playlist(c: Ctx) -> dict[str, Any]:
    c.asset("list.ffconcat").write_text("ffconcat version 1.0\nfile clip.mp4\nfile clip.mp4\n")
    return c.mini(sources={"clip": str(c.asset("list.ffconcat"))})


def _outside(c: Ctx) -> dict[str, Any]:
    shutil.copyfile(c.assets / "clip.mp4", c.scratch / f"{c.name}.mp4")
    return c.mini(sources={"clip": str(c.scratch / f"{c.name}.mp4")})


def _escaping_link(c: Ctx) -> dict[str, Any]:
    shutil.copyfile(c.assets / "clip.mp4", c.scratch / f"{c.name}.mp4")
    os.symlink(c.scratch / f"{c.name}.mp4", c.asset("link.mp4"))
    return c.mini(sources={"clip": str(c.asset("link.mp4"))})


def _relative_escape(c: Ctx) -> dict[str, Any]:
    shutil.copyfile(c.assets / "clip.mp4", c.scratch / f"{c.name}.mp4")
    return c.mini(sources={"clip": f"../{c.scratch.name}/{c.name}.mp4"})


def _symlink_loop(c: Ctx) -> dict[str, Any]:
    os.symlink(c.asset("loop.mp4").name, c.asset("loop.mp4"))
    return c.mini(sources={"clip": str(c.asset("loop.mp4"))})


def _directory(c: Ctx) -> dict[str, Any]:
    c.asset("folder.mp4").mkdir()
    return c.mini(sources={"clip": str(c.asset("folder.mp4"))})


def _fifo(c: Ctx) -> dict[str, Any]:
    os.mkfifo(c.asset("pipe.mp4"))
    return c.mini(sources={"clip": str(c.asset("pipe.mp4"))})


def _device(c: Ctx) -> dict[str, Any]:
    try:
        os.mknod(c.asset("null.mp4"), stat.S_IFCHR | 0o666, os.makedev(1, 3))
        return c.mini(sources={"clip": str(c.asset("null.mp4"))})
    except PermissionError:  # no CAP_MKNOD: make /dev an asset root instead
        c.add_root("/dev")
        return c.mini(sources={"clip": "/dev/null"})


def _unreadable(c: Ctx) -> dict[str, Any]:
    if os.geteuid() != 0:
        shutil.copyfile(c.assets / "clip.mp4", c.asset("locked.mp4"))
        os.chmod(c.asset("locked.mp4"), 0)
        return c.mini(sources={"clip": str(c.asset("locked.mp4"))})
    try:
        os.close(os.open(ROOT_UNREADABLE, os.O_RDONLY | os.O_NONBLOCK))
    except PermissionError:
        c.add_root(str(ROOT_UNREADABLE.parent))
        return c.mini(sources={"clip": str(ROOT_UNREADABLE)})
    except OSError:
        pass
    raise NotHere("running as root and no file here that root cannot read")


def _too_large(c: Ctx) -> bytes:
    sub = c.mini()
    sub["recipe"]["steps"][0]["padding"] = "x" * (1 << 20)
    return json.dumps(sub).encode()


def _raw_mini(c: Ctx, old: str, new: str) -> bytes:
    text = json.dumps(c.mini())
    assert old in text
    return text.replace(old, new, 1).encode()


CASES: list[Case] = [
    # -- bytes and JSON ---------------------------------------------------------------
    Case("malformed_json", "submission", lambda c: b'{"name": "x", "sources": ', ("JSON",)),
    Case("not_utf8", "submission", lambda c: b'{"name": "caf\xe9"}', ("UTF-8",)),
    Case("empty_file", "submission", lambda c: b"", ("JSON",)),
    Case("trailing_garbage", "submission", lambda c: json.dumps(c.mini()).encode() + b" }"),
    Case(
        "duplicate_key",
        "submission",
        lambda c: _raw_mini(c, '"name": ', '"name": "other", "name": '),
        ("'name'", "twice"),
    ),
    Case("top_level_array", "submission", lambda c: json.dumps([c.mini()]).encode(), ("object",)),
    Case("nan_value", "submission", lambda c: _raw_mini(c, '"duration": 0.6', '"duration": NaN'), ("NaN",)),
    Case(
        "deeply_nested",
        "submission",
        lambda c: b'{"name": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
        ("nested",),
    ),
    Case("submission_too_large", "submission", _too_large, ("bytes",)),
    Case(
        "surrogate_in_key",
        ('"\\ud800"',),
        lambda c: json.dumps({**c.mini(), "\ud800": 1}).encode(),
    ),
    Case(  # an upper-case escape, as other JSON writers spell it
        "surrogate_upper_case_escape",
        ("submission", "sources.clip"),
        lambda c: json.dumps(c.mini(sources={"clip": "\udc00.mp4"})).replace("\\udc00", "\\uDC00").encode(),
    ),
    Case(
        "surrogate_in_source_path",
        ("submission", "sources.clip"),
        lambda c: json.dumps(c.mini(sources={"clip": "\udc00.mp4"})).encode(),
    ),
    # -- fields and types ----------------------------------------------------------------
    Case("unknown_top_field", "colour", lambda c: c.mini(colour="red"), ("not a known field",)),
    Case(
        "empty_key",
        ('""', "submission"),
        lambda c: {**c.mini(), "": 1},
        ("not a known field",),
    ),
    Case(
        "blank_key",
        ('"\\r"', "submission"),
        lambda c: {**c.mini(), "\r": 1},
        ("not a known field",),
    ),
    Case(
        "newline_in_key",
        ('"a\\nb"', "submission"),
        lambda c: {**c.mini(), "a\nb": 1},
        ("not a known field",),
    ),
    Case("missing_name", "name", lambda c: without(c.mini(), "name"), ("required",)),
    Case("missing_sources", "sources", lambda c: without(c.mini(), "sources"), ("required",)),
    Case("missing_recipe", "recipe", lambda c: without(c.mini(), "recipe"), ("required",)),
    Case("sources_as_list", "sources", lambda c: c.mini(sources=[str(c.assets / "clip.mp4")])),
    Case("sources_empty", "sources", lambda c: c.mini(sources={})),
    Case("wrong_type_priority", "priority", lambda c: c.mini(priority="high"), ("int",)),
    Case("bool_as_int", "revision", lambda c: c.mini(revision=True), ("bool",)),
    Case("float_as_int", "priority", lambda c: c.mini(priority=1.5)),
    Case("priority_out_of_range", "priority", lambda c: c.mini(priority=100_000)),
    Case("bad_name_uppercase", "name", lambda c: c.mini(name="Mug-Ad")),
    Case("bad_name_slash", "name", lambda c: c.mini(name="mug/../ad")),
    Case("name_too_long", "name", lambda c: c.mini(name="a" * 97)),
    Case("revision_zero", "revision", lambda c: c.mini(revision=0)),
    Case("unsupported_operation", "operation", lambda c: c.mini(operation="upscale"), ("render",)),
    Case("submitted_by_with_space", "submitted_by", lambda c: c.mini(submitted_by="ann smith")),
    Case("output_not_object", "output", lambda c: c.mini(output="mug.mp4")),
    # -- recipe vocabulary ----------------------------------------------------------------
    Case(
        "unknown_step",
        "recipe.steps[1].op",
        lambda c: step(c.sub(), 1, op="blur"),
        ("blur", "trim"),
    ),
    Case("step_without_op", "recipe.steps[0].op", lambda c: c.mini([{"duration": 0.5}, enc()])),
    Case("step_not_object", "recipe.steps[0]", lambda c: c.mini(["trim", enc()])),
    Case("steps_empty", "recipe.steps", lambda c: step_list(c.mini(), [])),
    Case(
        "unknown_step_param",
        "recipe.steps[1].blur",
        lambda c: step(c.sub(), 1, blur=3),
        ("not a known field",),
    ),
    Case("unknown_recipe_field", "recipe.output", lambda c: recipe_set(c.mini(), output="x")),
    Case("fit_odd_width", "recipe.steps[1].width", lambda c: step(c.sub(), 1, width=191)),
    Case("fit_too_small", "recipe.steps[1].width", lambda c: step(c.sub(), 1, width=8)),
    Case("fit_missing_height", "recipe.steps[0].height", lambda c: c.mini([{"op": "fit", "width": 64}])),
    Case("fps_zero", "recipe.steps[0].fps", lambda c: c.mini([{"op": "fps", "fps": 0}])),
    Case(
        "text_end_before_start",
        "recipe.steps[3].end",
        lambda c: step(c.sub(), 3, start=0.8, end=0.4),
        ("later",),
    ),
    Case("text_nul", "recipe.steps[3].text", lambda c: step(c.sub(), 3, text="a\x00b"), ("NUL",)),
    Case("unknown_colour", "recipe.steps[3].colour", lambda c: step(c.sub(), 3, colour="chartreuse")),
    Case(
        "trim_start_past_end",
        "recipe.steps[0].start",
        lambda c: step(c.sub(), 0, start=5.0),
        ("past the end",),
    ),
    Case("second_trim", "recipe.steps[1].op", lambda c: c.mini([{"op": "trim"}, {"op": "trim"}, enc()])),
    Case("encode_not_last", "recipe.steps[0].op", lambda c: c.mini([enc(), {"op": "trim"}]), ("last",)),
    Case("two_encode_steps", "recipe.steps[1].op", lambda c: c.mini([enc(), enc()]), ("once",)),
    Case(
        "vp9_in_mov",
        "recipe.steps[1].video_codec",
        lambda c: c.mini([{"op": "trim"}, enc(container="mov", video_codec="vp9")]),
        ("mov",),
    ),
    Case(
        "prores_in_mp4",
        "recipe.steps[1].video_codec",
        lambda c: c.mini([{"op": "trim"}, enc(container="mp4", video_codec="prores")]),
        ("mp4",),
    ),
    Case(
        "aac_in_webm",
        "recipe.steps[1].audio_codec",
        lambda c: c.mini([{"op": "trim"}, enc(container="webm", video_codec="vp9", audio_codec="aac")]),
        ("webm",),
    ),
    Case(
        "prores_with_crf",
        "recipe.steps[0].crf",
        lambda c: c.mini([{"op": "encode", "container": "mov", "video_codec": "prores", "crf": 10}]),
    ),
    Case(
        "prores_8bit",
        "recipe.steps[0].pix_fmt",
        lambda c: c.mini(
            [{"op": "encode", "container": "mov", "video_codec": "prores", "pix_fmt": "yuv420p"}]
        ),
    ),
    Case(
        "crf_and_bitrate",
        "recipe.steps[0].video_bitrate",
        lambda c: c.mini([enc(crf=20, video_bitrate="2M")]),
        ("crf",),
    ),
    Case("crf_too_high_h264", "recipe.steps[0].crf", lambda c: c.mini([enc(crf=60)])),
    Case(
        "pcm_with_bitrate",
        "recipe.steps[0].audio_bitrate",
        lambda c: c.mini([enc(container="mov", audio_codec="pcm_s16le", audio_bitrate="128k")]),
    ),
    # -- the recipe against its sources ----------------------------------------------------
    Case(
        "recipe_input_not_declared",
        "recipe.input",
        lambda c: c.mini(
            sources={"logo": str(c.assets / "logo.png")},
            recipe={"input": "main", "steps": [{"op": "overlay", "source": "logo"}, enc()]},
        ),
        ("main",),
    ),
    Case(
        "recipe_input_typo",
        "recipe.input",
        lambda c: recipe_set(c.sub(), input="video"),
        ("video",),
    ),
    Case(
        "recipe_input_is_image",
        "recipe.input",
        lambda c: c.mini(sources={"clip": str(c.assets / "logo.png")}),
        ("not a video",),
    ),
    Case(
        "recipe_input_is_audio",
        "recipe.input",
        lambda c: c.mini(sources={"clip": str(c.assets / "music.m4a")}),
        ("not a video",),
    ),
    Case(
        "overlay_source_not_declared",
        "recipe.steps[0].source",
        lambda c: c.mini([{"op": "overlay", "source": "logo"}, enc()]),
        ("logo",),
    ),
    Case(
        "overlay_source_typo",
        "recipe.steps[2].source",
        lambda c: step(c.sub(), 2, source="badge"),
        ("badge",),
    ),
    Case(
        "overlay_source_is_audio",
        "recipe.steps[0].source",
        lambda c: c.mini(
            [{"op": "overlay", "source": "music"}, enc()],
            sources={"clip": str(c.assets / "clip.mp4"), "music": str(c.assets / "music.m4a")},
        ),
        ("picture",),
    ),
    Case(
        "audio_mix_without_source",
        "recipe.steps[0].source",
        lambda c: c.mini([{"op": "audio", "mode": "mix"}, enc()]),
        ("mix",),
    ),
    Case(
        "audio_source_not_declared",
        "recipe.steps[0].source",
        lambda c: c.mini([{"op": "audio", "mode": "replace", "source": "music"}, enc()]),
        ("music",),
    ),
    Case(
        "audio_replace_source_has_no_audio",
        "recipe.steps[0].source",
        lambda c: c.mini(
            [{"op": "audio", "mode": "replace", "source": "bed"}, enc()],
            sources={"clip": str(c.assets / "clip.mp4"), "bed": str(c.assets / "silent.mp4")},
        ),
        ("no audio",),
    ),
    Case(
        "audio_mix_input_has_no_audio",
        "recipe.steps[0].mode",
        lambda c: c.mini(
            [{"op": "audio", "mode": "mix", "source": "music"}, enc()],
            sources={"clip": str(c.assets / "silent.mp4"), "music": str(c.assets / "music.m4a")},
        ),
        ("replace",),
    ),
    Case(
        "audio_keep_with_source",
        "recipe.steps[0].source",
        lambda c: c.mini(
            [{"op": "audio", "mode": "keep", "source": "music"}, enc()],
            sources={"clip": str(c.assets / "clip.mp4"), "music": str(c.assets / "music.m4a")},
        ),
        ("keep",),
    ),
    Case(
        "audio_drop_with_loudness",
        "recipe.steps[0].loudness",
        lambda c: c.mini([{"op": "audio", "mode": "drop", "loudness": -23}, enc()]),
    ),
    Case(
        "unused_source",
        "sources.extra",
        lambda c: c.mini(sources={"clip": str(c.assets / "clip.mp4"), "extra": str(c.assets / "music.m4a")}),
        ("no recipe step uses it",),
    ),
    # -- sources on disk ------------------------------------------------------------------
    Case(
        "source_missing_file",
        "sources.clip",
        lambda c: c.mini(sources={"clip": str(c.assets / "nope.mp4")}),
        ("does not exist",),
    ),
    Case(
        "source_missing_relative",
        "sources.clip",
        lambda c: c.mini(sources={"clip": "nope.mp4"}),
        ("does not exist",),
    ),
    Case("source_unreadable", "sources.clip", _unreadable, ("cannot be read",)),
    Case("source_not_media", "sources.clip", _text_file, ("not media",)),
    Case("source_empty_file", "sources.clip", _empty_file, ("empty",)),
    Case("source_playlist", "sources.clip", _playlist),
    Case("source_outside_roots", "sources.clip", _outside, ("outside the asset roots",)),
    Case("source_symlink_escaping_roots", "sources.clip", _escaping_link, ("outside the asset roots",)),
    Case("source_relative_escaping_roots", "sources.clip", _relative_escape, ("outside the asset roots",)),
    Case("source_is_directory", "sources.clip", _directory, ("folder",)),
    Case("source_is_fifo", "sources.clip", _fifo, ("not a regular file",)),
    Case("source_device", "sources.clip", _device, ("not a regular file",)),
    Case("source_path_nul", "sources.clip", lambda c: c.mini(sources={"clip": "clip\x00.mp4"}), ("NUL",)),
    Case(  # found by test_accept_fuzz: expanduser raised RuntimeError, uncaught
        "source_home_of_unknown_user",
        "sources.clip",
        lambda c: c.mini(sources={"clip": "~no-such-user-here/clip.mp4"}),
        ("~ for a user this host does not know",),
    ),
    Case("source_symlink_loop", "sources.clip", _symlink_loop),
    Case("source_path_empty", "sources.clip", lambda c: c.mini(sources={"clip": ""})),
    Case(
        "bad_source_role",
        "sources.Clip",
        lambda c: c.mini(sources={"Clip": str(c.assets / "clip.mp4")}),
    ),
    # -- output ------------------------------------------------------------------------
    Case(
        "output_file_wrong_extension",
        "output.file",
        lambda c: c.mini(output={"file": "mug.mov"}),
        (".mp4",),
    ),
    Case("output_file_with_slash", "output.file", lambda c: c.mini(output={"file": "../escape.mp4"})),
    Case(
        "unknown_expect_field",
        "output.expect.loudness",
        lambda c: c.mini(output={"expect": {"loudness": -23}}),
        ("not a known field",),
    ),
    # -- tags ------------------------------------------------------------------------------
    Case(
        "missing_required_tag",
        "tags.locale",
        lambda c: c.mini(tags={k: v for k, v in TAGS.items() if k != "locale"}),
        ("required",),
    ),
    Case(
        "empty_required_tag", "tags.locale", lambda c: c.mini(tags={**TAGS, "locale": "   "}), ("required",)
    ),
    Case(
        "surrogate_in_tag",
        ("submission", "tags.locale"),
        lambda c: json.dumps(c.mini(tags={**TAGS, "locale": "\udfff"})).encode(),
    ),
    Case("empty_string_tag", "tags.locale", lambda c: c.mini(tags={**TAGS, "locale": ""})),
    Case("bad_tag_key", 'tags."Due Date"', lambda c: c.mini(tags={**TAGS, "Due Date": "x"})),
    # -- identity --------------------------------------------------------------------------
    Case("duplicate_job_id", "name", _dup, ("already exists", "revision 2")),
    Case(
        "supersedes_missing_job",
        "supersedes",
        lambda c: c.mini(revision=2, supersedes=f"{c.name}@1"),
        ("not a job",),
    ),
    Case(
        "supersedes_other_name",
        "supersedes",
        lambda c: c.mini(revision=2, supersedes="someone-else@1"),
        ("earlier revision",),
    ),
]


def step_list(sub: dict[str, Any], steps: list[Any]) -> dict[str, Any]:
    sub["recipe"]["steps"] = steps
    return sub


def recipe_set(sub: dict[str, Any], **over: Any) -> dict[str, Any]:
    sub["recipe"].update(over)
    return sub


def _param(case: Case) -> Any:
    marks = [pytest.mark.xfail(strict=True, raises=AssertionError, reason=case.bug)] if case.bug else []
    return pytest.param(case, id=case.id, marks=marks)


CASE_PARAMS = [_param(c) for c in CASES]


def test_corpus_is_big_and_well_named():
    ids = [c.id for c in CASES]
    assert len(ids) == len(set(ids))
    assert len(ids) >= 45
    assert all(re.fullmatch(r"[a-z0-9_]+", i) for i in ids)


# -- checking a rejection ---------------------------------------------------------------------


def snapshot(tree: Tree) -> dict[str, Any]:
    """Everything a rejection must leave alone, straight from the folders."""
    return {
        "jobs": state_files(tree),
        "pending": sorted(os.listdir(tree.pending)),  # hidden temp files too
        "attempts": sorted(os.listdir(tree.attempts)),
        "manifests": sorted(os.listdir(tree.manifests)),
        "rejected": set(os.listdir(tree.rejected)),
    }


def assert_one_sentence(reason: str) -> None:
    assert reason.strip() == reason and reason
    assert "\n" not in reason and len(reason) < 600, reason
    assert "Traceback" not in reason
    assert not re.search(r"[.!?]\s+[A-Z][a-z]+ ", reason), f"more than one sentence: {reason}"


def check_rejection_record(tree: Tree, case: Case, drop: str, data: bytes) -> dict[str, Any]:
    """``rejected/<name>.json`` + ``.error.json`` with one sentence naming the field."""
    stem = drop.removesuffix(".json")
    err = tree.rejected / f"{stem}.error.json"
    assert err.exists(), f"{case.id} was not rejected: {sorted(os.listdir(tree.rejected))}"
    rec = json.loads(err.read_text())
    assert rec["file"] == drop
    assert rec["field"] in case.fields, rec
    assert rec["reason"].startswith(rec["field"]), rec
    for word in case.also:
        assert word in rec["reason"], rec
    assert_one_sentence(rec["reason"])
    assert rec["rejected_by"]
    at = datetime.fromisoformat(rec["rejected_at"])
    assert abs(datetime.now(UTC) - at) < timedelta(minutes=5)
    kept = tree.rejected / f"{stem}.json"
    if case.id != "submission_too_large":  # too big to copy: spool keeps an empty placeholder
        assert kept.read_bytes() == data
    return rec


def check_never_a_job(tree: Tree, before: dict[str, Any], new_rejections: int) -> None:
    """No job file in any state, no reservation, nothing in pending/; only the rejections."""
    after = snapshot(tree)
    for key in ("jobs", "pending", "attempts", "manifests"):
        assert after[key] == before[key], key
    new = after["rejected"] - before["rejected"]
    assert len(new) == 2 * new_rejections, sorted(new)
    assert all(n.endswith(".json") for n in new)


def new_spool(base: Path, media: dict[str, Path]) -> tuple[Tree, Path]:
    """What conftest's ``tree`` and ``assets`` fixtures make, for module-scoped use."""
    assets = base / "assets"
    assets.mkdir()
    for p in media.values():
        shutil.copyfile(p, assets / p.name)
    tree = Tree.at(base / "spool")
    tree.create()
    settings.write(tree.config_file, {"assets": {"roots": [str(assets)]}, "daemon": {"poll_interval": 0.2}})
    return tree, assets


@dataclass
class CliRun:
    """One ``spool submit FILE...`` run over a fresh spool."""

    tree: Tree
    files: dict[str, tuple[Path, bytes]]  # case id -> (file, its bytes)
    before: dict[str, Any]
    proc: subprocess.CompletedProcess[str] | None = None
    seconds: float = 0.0


#: Cases of known bugs crash ``spool submit`` (or might): each runs alone. The rest run
#: a handful of files per ``spool submit`` process, each group on its own spool, since
#: starting the CLI is most of the cost of a rejection.
GROUPS = 6


@pytest.fixture(scope="module")
def cli_runs(tmp_path_factory: pytest.TempPathFactory, media: dict[str, Path]) -> dict[str, CliRun | str]:
    groups = [[c] for c in CASES if c.bug]
    healthy = [c for c in CASES if not c.bug]
    groups += [healthy[i::GROUPS] for i in range(GROUPS)]
    by_case: dict[str, CliRun | str] = {}
    runs: list[CliRun] = []
    for n, group in enumerate(groups):
        base = tmp_path_factory.mktemp(f"cli{n}")
        tree, assets = new_spool(base, media)
        (base / "outside").mkdir()
        (base / "drops").mkdir()
        files: dict[str, tuple[Path, bytes]] = {}
        for case in group:
            try:
                data = case.data(Ctx(tree, assets, base / "outside", case.id.replace("_", "-")))
            except NotHere as exc:
                by_case[case.id] = str(exc)
                continue
            f = base / "drops" / f"{case.id}.json"
            f.write_bytes(data)
            files[case.id] = (f, data)
        if files:
            run = CliRun(tree, files, snapshot(tree))
            runs.append(run)
            by_case.update(dict.fromkeys(files, run))

    def submit(run: CliRun) -> None:
        t0 = time.monotonic()
        run.proc = run_cli("submit", *(str(f) for f, _ in run.files.values()), spool=run.tree)
        run.seconds = time.monotonic() - t0

    with ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 1)) as pool:
        list(pool.map(submit, runs))
    return by_case


# -- a: every case through the real CLI --------------------------------------------------------


@pytest.mark.parametrize("case", CASE_PARAMS)
def test_cli_rejects(case: Case, cli_runs: dict[str, CliRun | str]):
    run = cli_runs[case.id]
    if isinstance(run, str):
        pytest.skip(run)
    proc = run.proc
    assert proc is not None
    f, data = run.files[case.id]
    assert run.seconds < 60
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert proc.stdout == ""  # no job ID: nothing was accepted
    rec = check_rejection_record(run.tree, case, f.name, data)
    lines = proc.stderr.splitlines()
    assert f"{f}: rejected: {rec['reason']}" in lines, proc.stderr
    assert len(lines) == len(run.files), proc.stderr  # one line per file, no traceback
    check_never_a_job(run.tree, run.before, len(run.files))
    assert f.read_bytes() == data  # the user's file is theirs: left as it was
    assert os.listdir(run.tree.incoming) == []


def test_cli_json_rejection_names_the_field(tree: Tree, assets: Path, tmp_path: Path):
    f = tmp_path / "bad.json"
    f.write_text(json.dumps(step(submission(assets), 1, op="blur")))
    proc = run_cli("submit", str(f), "--json", spool=tree)
    assert proc.returncode == 2
    [out] = json.loads(proc.stdout)
    assert out["job_id"] is None
    assert out["field"] == "recipe.steps[1].op"
    assert out["rejected"] == "rejected/bad.json"
    assert "blur" in out["error"]


# -- b: the whole corpus through incoming/ under one real daemon ------------------------------


def drop(tree: Tree, name: str, data: bytes) -> Path:
    """Maildir-style: write name.json.tmp, then rename it to name.json."""
    tmp = tree.incoming / f"{name}.json.tmp"
    tmp.write_bytes(data)
    final = tree.incoming / f"{name}.json"
    os.rename(tmp, final)
    return final


def wait_settled(tree: Tree, quiet: float, timeout: float = 90.0) -> None:
    """Wait until incoming/ is empty, or nothing in incoming/ or rejected/ moved for ``quiet`` s."""
    deadline = time.monotonic() + timeout
    last, since = None, time.monotonic()
    while time.monotonic() < deadline:
        seen = (tuple(sorted(os.listdir(tree.incoming))), len(os.listdir(tree.rejected)))
        if not seen[0]:
            return
        if seen != last:
            last, since = seen, time.monotonic()
        elif time.monotonic() - since > quiet:
            return
        time.sleep(0.1)


def job_exists(tree: Tree, jid: str) -> bool:
    return locate(tree, jid) is not None


def run_corpus_through_daemon(cases: list[Case], tree, assets, tmp_path, daemons, quiet: float) -> None:
    built: dict[str, bytes] = {}
    (tmp_path / "outside").mkdir()
    for case in cases:
        try:
            built[case.id] = case.data(Ctx(tree, assets, tmp_path / "outside", case.id.replace("_", "-")))
        except NotHere:
            continue
    before = snapshot(tree)  # the duplicate case's first job is already pending
    preexisting = {n.removesuffix(".json") for n in before["jobs"]["pending"]}
    d = daemons(tree)
    for case_id, data in built.items():
        drop(tree, case_id, data)
    wait_settled(tree, quiet=quiet)
    assert d.alive(), d.output()[-3000:]
    assert os.listdir(tree.incoming) == [], d.output()[-3000:]
    for case in cases:
        if case.id in built:
            check_rejection_record(tree, case, f"{case.id}.json", built[case.id])
    # none became a job (the duplicate case's first job may be rendering meanwhile)
    jobs = {n.removesuffix(".json") for names in state_files(tree).values() for n in names}
    assert jobs == preexisting
    assert {n.removesuffix(".json") for n in os.listdir(tree.pending)} <= preexisting
    assert set(os.listdir(tree.attempts)) == preexisting
    assert len(set(os.listdir(tree.rejected)) - before["rejected"]) == 2 * len(built)

    # the daemon keeps working: a valid drop after all that is accepted and completes
    drop(tree, "after-the-storm", json.dumps(minimal(assets, name="after-the-storm")).encode())
    wait_for(lambda: (tree.complete / "after-the-storm@1.json").exists(), timeout=60)
    wait_for(lambda: not os.listdir(tree.pending), timeout=30)
    jobs = {n.removesuffix(".json") for names in state_files(tree).values() for n in names}
    assert jobs == preexisting | {"after-the-storm@1"}
    assert d.alive()


def test_daemon_rejects_the_whole_corpus_and_keeps_working(tree, assets, tmp_path, daemons):
    run_corpus_through_daemon(CASES, tree, assets, tmp_path, daemons, quiet=3.0)


# -- c: incoming/ conventions -----------------------------------------------------------------


def test_unfinished_and_hidden_drops_are_ignored_until_renamed(tree, assets, daemons):
    d = daemons(tree)
    hold = json.dumps(minimal(assets, name="held")).encode()
    hidden = json.dumps(minimal(assets, name="hidden")).encode()
    (tree.incoming / "held.json.tmp").write_bytes(hold)
    (tree.incoming / ".hidden.json").write_bytes(hidden)
    # a canary proves the daemon has scanned incoming/ since those files appeared
    drop(tree, "canary", b"not json")
    wait_for(lambda: (tree.rejected / "canary.error.json").exists(), timeout=30)
    time.sleep(5 * 0.2)  # five more poll intervals
    assert sorted(os.listdir(tree.incoming)) == [".hidden.json", "held.json.tmp"]
    assert (tree.incoming / "held.json.tmp").read_bytes() == hold
    assert (tree.incoming / ".hidden.json").read_bytes() == hidden
    assert not any(state_files(tree).values())
    assert sorted(os.listdir(tree.rejected)) == ["canary.error.json", "canary.json"]
    assert not job_exists(tree, "held@1") and not job_exists(tree, "hidden@1")

    os.rename(tree.incoming / "held.json.tmp", tree.incoming / "held.json")
    wait_for(lambda: job_exists(tree, "held@1"), timeout=30)
    # The drop is taken as .accepting.<worker>.held.json and removed once the job is durable.
    wait_for(lambda: os.listdir(tree.incoming) == [".hidden.json"], timeout=10)
    assert not job_exists(tree, "hidden@1")
    assert d.alive()


def test_symlink_drop_is_rejected_and_its_target_untouched(tree, assets, tmp_path, daemons):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    target = elsewhere / "valid.json"
    data = json.dumps(minimal(assets, name="linked")).encode()
    target.write_bytes(data)
    d = daemons(tree)
    os.symlink(target, tree.incoming / ".linked.json")
    os.rename(tree.incoming / ".linked.json", tree.incoming / "linked.json")
    wait_for(lambda: (tree.rejected / "linked.error.json").exists(), timeout=30)
    rec = json.loads((tree.rejected / "linked.error.json").read_text())
    assert rec["field"] == "submission"
    assert "symbolic link" in rec["reason"]
    assert_one_sentence(rec["reason"])
    assert target.is_file() and not target.is_symlink()
    assert target.read_bytes() == data
    assert os.listdir(elsewhere) == ["valid.json"]
    assert not job_exists(tree, "linked@1")
    assert not any(state_files(tree).values())
    assert os.listdir(tree.incoming) == []
    assert d.alive()


def test_fifo_and_folder_drops_are_rejected_without_hanging(tree, assets, daemons):
    d = daemons(tree)
    os.mkfifo(tree.incoming / ".pipe.json")
    os.rename(tree.incoming / ".pipe.json", tree.incoming / "pipe.json")
    (tree.incoming / ".folder.json").mkdir()
    os.rename(tree.incoming / ".folder.json", tree.incoming / "folder.json")
    drop(tree, "fine", json.dumps(minimal(assets, name="fine")).encode())
    wait_for(lambda: os.listdir(tree.incoming) == [], timeout=30)
    # the reason is written first, the (empty, regular) rejected file right after it
    wait_for(lambda: (tree.rejected / "pipe.json").exists() and (tree.rejected / "folder.json").exists())
    for name, words in (("pipe", "regular file"), ("folder", "folder")):
        rec = json.loads((tree.rejected / f"{name}.error.json").read_text())
        assert rec["field"] == "submission" and words in rec["reason"], rec
        assert_one_sentence(rec["reason"])
    assert stat.S_ISREG(
        os.lstat(tree.rejected / "pipe.json").st_mode
    )  # never opened, never kept (issue 11.9)
    wait_for(lambda: job_exists(tree, "fine@1"), timeout=30)
    assert d.alive()


def drop_bytes_name(tree: Tree, name: bytes, data: bytes) -> None:
    """Drop a file whose name is raw bytes (another encoding), Maildir-style."""
    incoming = os.fsencode(tree.incoming)
    with open(os.path.join(incoming, b"." + name), "wb") as f:
        f.write(data)
    os.rename(os.path.join(incoming, b"." + name), os.path.join(incoming, name))


def test_a_bad_drop_named_in_another_encoding_is_rejected_with_a_reason(tree, daemons):
    d = daemons(tree)
    drop_bytes_name(tree, b"caf\xe9.json", b"not json")
    wait_for(lambda: os.listdir(tree.incoming) == [], timeout=30)
    # the reason is written right after the move: wait for it, not for a time
    wait_for(lambda: any(n.endswith(".error.json") for n in os.listdir(tree.rejected)), timeout=10)
    assert d.alive()
    errors = [n for n in os.listdir(tree.rejected) if n.endswith(".error.json")]
    assert len(errors) == 1, os.listdir(tree.rejected)
    rec = json.loads((tree.rejected / errors[0]).read_text())
    assert rec["field"] == "submission" and "JSON" in rec["reason"]


def test_a_valid_drop_named_in_another_encoding_becomes_a_job(tree, assets, daemons):
    d = daemons(tree)
    drop_bytes_name(tree, b"caf\xe9.json", json.dumps(minimal(assets, name="latin1")).encode())
    wait_for(lambda: job_exists(tree, "latin1@1"), timeout=30)
    wait_for(lambda: os.listdir(tree.incoming) == [], timeout=30)
    assert os.listdir(tree.rejected) == []
    assert d.alive()


def test_cli_submit_of_a_symlink_is_rejected_like_a_dropped_one(tree, assets, tmp_path):
    """``spool submit`` does what a drop does (SPEC 1): a symlink is refused, its target untouched."""
    target = tmp_path / "valid.json"
    data = json.dumps(minimal(assets, name="via-link")).encode()
    target.write_bytes(data)
    link = tmp_path / "link.json"
    os.symlink(target, link)
    proc = run_cli("submit", str(link), spool=tree)
    assert proc.returncode == 2, proc.stderr
    assert "symbolic link" in proc.stderr
    rec = json.loads((tree.rejected / "link.error.json").read_text())
    assert rec["field"] == "submission" and "symbolic link" in rec["reason"]
    assert not job_exists(tree, "via-link@1")
    assert target.read_bytes() == data and link.is_symlink()


# -- d: the frozen job of a valid submission -----------------------------------------------------


def sha256sum(path: Path) -> str:
    out = subprocess.run(["sha256sum", str(path)], capture_output=True, text=True, check=True)
    return out.stdout.split()[0]


def read_pending(tree: Tree, jid: str) -> tuple[dict[str, Any], Job]:
    raw = (tree.pending / f"{jid}.json").read_bytes()
    return json.loads(raw), decode(raw, Job)


def test_accepted_job_is_frozen_with_everything_spec_2_lists(tree, assets, tmp_path):
    # the clip is given through a symlink inside the roots: the job records the real file
    os.symlink(assets / "clip.mp4", assets / "alias.mp4")
    sub = submission(
        assets,
        name="mug-ad",
        revision=3,
        priority=7,
        submitted_by="ann@studio",
        sources={
            "clip": str(assets / "alias.mp4"),
            "logo": str(assets / "logo.png"),
            "music": str(assets / "music.m4a"),
        },
    )
    f = tmp_path / "mug.json"
    f.write_text(json.dumps(sub, ensure_ascii=False))
    t0 = datetime.now(UTC)
    proc = run_cli("submit", str(f), spool=tree)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "mug-ad@3"
    assert os.listdir(tree.rejected) == []
    assert state_files(tree)["pending"] == ["mug-ad@3.json"]

    raw, job = read_pending(tree, "mug-ad@3")
    assert raw["job_id"] == "mug-ad@3" and raw["name"] == "mug-ad" and raw["revision"] == 3
    assert raw["supersedes"] is None
    assert raw["operation"] == "render"
    # the recipe, embedded, with its hash over the canonical JSON
    assert raw["recipe"]["input"] == "clip"
    assert [s["op"] for s in raw["recipe"]["steps"]] == [s["op"] for s in sub["recipe"]["steps"]]
    assert raw["recipe"]["steps"][3]["text"] == "Only £9.99"
    assert raw["recipe"]["steps"][1]["width"] == 192
    # With layers (the label, the logo), the hash covers the recipe and the frozen layer
    # plan together: an edit to either is caught at claim.
    assert raw["layers"]
    spec = {"recipe": raw["recipe"], "layers": raw["layers"]}
    assert raw["recipe_hash"] == hashlib.sha256(canonical_json(spec)).hexdigest()
    independent = json.dumps(spec, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    assert raw["recipe_hash"] == hashlib.sha256(independent.encode()).hexdigest()
    # the sources manifest
    by_role = {s["role"]: s for s in raw["sources"]}
    assert sorted(by_role) == ["clip", "logo", "music"]
    assert by_role["clip"]["path"] == str((assets / "clip.mp4").resolve())
    for role, name in (("clip", "clip.mp4"), ("logo", "logo.png"), ("music", "music.m4a")):
        p = assets / name
        assert by_role[role]["size"] == p.stat().st_size
        assert by_role[role]["sha256"] == sha256sum(p)
    clip = by_role["clip"]["probe"]
    assert abs(clip["duration"] - 2.0) < 0.1
    assert clip["video"]["width"] == 320 and clip["video"]["height"] == 240
    assert clip["audio"] is not None and clip["still"] is False
    assert by_role["logo"]["probe"]["still"] is True
    assert by_role["music"]["probe"]["video"] is None
    # the output and its expectations, defaulted from the recipe
    assert raw["output"]["file"] == "mug-ad.mp4"
    assert raw["output"]["container"] == "mp4"
    exp = raw["output"]["expect"]
    assert (exp["width"], exp["height"]) == (192, 108)
    assert exp["duration"] == 1.0
    assert exp["video_streams"] == 1 and exp["audio_streams"] == 1
    assert exp["video_codec"] == "h264" and exp["audio_codec"] == "aac"
    assert exp["fps"] == 25.0
    # tags, priority, who and when
    assert raw["tags"] == TAGS
    assert raw["priority"] == 7
    assert raw["submitted_by"] == "ann@studio"
    at = datetime.fromisoformat(raw["submitted_at"])
    assert t0 - timedelta(seconds=1) <= at <= datetime.now(UTC) + timedelta(seconds=1)
    assert job.submission_sha256 == hashlib.sha256(f.read_bytes()).hexdigest()
    # the user's file stays where it was; nothing was dropped into incoming/
    assert f.exists() and os.listdir(tree.incoming) == []


def test_expectations_follow_the_recipe_and_stated_ones_win(tree, cfg, assets):
    steps = [
        {"op": "trim", "start": 0.5, "duration": 1.0},
        {"op": "fit", "width": 192, "height": 108},
        {"op": "fps", "fps": 12.5},
        {"op": "audio", "mode": "drop"},
        {"op": "encode", "container": "mov", "video_codec": "prores"},
    ]
    job = accept.accept_bytes(tree, cfg, json.dumps(minimal(assets, name="shape", steps=steps)).encode(), "t")
    raw, _ = read_pending(tree, job.job_id)
    exp = raw["output"]["expect"]
    assert (exp["width"], exp["height"], exp["fps"], exp["duration"]) == (192, 108, 12.5, 1.0)
    assert exp["audio_streams"] == 0 and "audio_codec" not in exp
    assert exp["video_codec"] == "prores" and exp["pix_fmt"] == "yuv422p10le"
    assert raw["output"]["file"] == "shape.mov" and raw["output"]["container"] == "mov"

    # a trim past what is left of the clip expects only what is left
    steps2 = [{"op": "trim", "start": 1.5, "duration": 5.0}, {"op": "encode"}]
    job2 = accept.accept_bytes(
        tree, cfg, json.dumps(minimal(assets, name="tail", steps=steps2)).encode(), "t"
    )
    assert abs((job2.output.expect.duration or 0) - 0.5) < 0.05

    stated = minimal(
        assets,
        name="stated",
        steps=steps,
        output={
            "file": "Stated_Final.mov",
            "expect": {"duration": 0.9, "width": 190, "duration_tolerance": 0.5},
        },
    )
    job3 = accept.accept_bytes(tree, cfg, json.dumps(stated).encode(), "t")
    raw3, _ = read_pending(tree, job3.job_id)
    exp3 = raw3["output"]["expect"]
    assert exp3["duration"] == 0.9 and exp3["width"] == 190 and exp3["duration_tolerance"] == 0.5
    assert exp3["height"] == 108 and exp3["audio_streams"] == 0  # the rest still default
    assert raw3["output"]["file"] == "Stated_Final.mov"
    assert raw3["submitted_by"] == "t"  # the submitter the caller names, when the file names none


def test_relative_source_paths_are_looked_up_under_the_asset_roots_in_order(tree, assets, tmp_path):
    second = tmp_path / "library"
    second.mkdir()
    shutil.copyfile(assets / "music.m4a", second / "bed.m4a")
    shutil.copyfile(assets / "silent.mp4", second / "clip.mp4")  # shadowed by the first root
    Ctx(tree, assets, tmp_path, "x").add_root(str(second))
    cfg = config.load(tree.config_file)
    sub = minimal(
        assets,
        name="relative",
        steps=[{"op": "audio", "mode": "replace", "source": "bed"}, {"op": "encode"}],
        sources={"clip": "clip.mp4", "bed": "bed.m4a"},
    )
    job = accept.accept_bytes(tree, cfg, json.dumps(sub).encode(), "t")
    assert job.source("clip").path == str((assets / "clip.mp4").resolve())
    assert job.source("clip").sha256 == sha256sum(assets / "clip.mp4")
    assert job.source("bed").path == str((second / "bed.m4a").resolve())
    assert job.source("bed").sha256 == sha256sum(second / "bed.m4a")
    assert (tree.pending / "relative@1.json").exists()


def test_a_revision_supersedes_an_existing_job(tree, cfg, assets):
    first = accept.accept_bytes(tree, cfg, json.dumps(minimal(assets, name="ad")).encode(), "t")
    second = accept.accept_bytes(
        tree, cfg, json.dumps(minimal(assets, name="ad", revision=2, supersedes="ad@1")).encode(), "t"
    )
    assert (first.job_id, second.job_id) == ("ad@1", "ad@2")
    raw, _ = read_pending(tree, "ad@2")
    assert raw["supersedes"] == "ad@1" and raw["revision"] == 2
    # the first job file is not touched by its revision
    assert read_pending(tree, "ad@1")[1] == first


def test_a_job_claimed_before_its_frozen_copy_is_linked_is_still_accepted(tree, cfg, assets, monkeypatch):
    """Format 2 links the frozen copy to the job file once it is in pending/; a daemon
    that claims it in between (seen under load: `spool submit` exited 1 on a job it had
    accepted) leaves nothing to link: the copy is written on its own instead."""
    from spool.queue import claim

    real = accept.write_atomic

    def and_claimed_at_once(path, data, **kw):  # type: ignore[no-untyped-def]
        real(path, data, **kw)
        if path.parent == tree.pending:
            assert claim.claim(tree, "fast", path.name[: -len(".json")])

    monkeypatch.setattr(accept, "write_atomic", and_claimed_at_once)
    job = accept.accept_bytes(tree, cfg, json.dumps(minimal(assets, name="quick")).encode(), "t")
    copy = tree.job_attempts(job.job_id) / accept.JOB_COPY
    assert decode(copy.read_bytes(), type(job)) == job
    assert tree.job_file("running", job.job_id, "fast").exists()


def test_two_rejections_of_one_name_at_once_keep_both_files(tree: Tree):
    """The reason reserves its stem (written once): a writer that finds the stem's reason
    just written by another rejection of the same name under way takes the next stem,
    and neither rejected file replaces the other (a crash's leftover is taken over only
    once it is older than any rejection in flight)."""
    other = Rejection(file="x.json", field="name", reason="name: another writer's", rejected_at=now(),
                      rejected_by="w2")  # fmt: skip
    (tree.rejected / "x.error.json").write_bytes(encode(other))  # its file comes a moment later
    dest = accept.reject(tree, "x.json", InvalidInput("name", "ours"), "w1", data=b"ours")
    assert dest.name == "x-2.json" and dest.read_bytes() == b"ours"
    assert json.loads((tree.rejected / "x.error.json").read_text())["rejected_by"] == "w2"
    assert json.loads((tree.rejected / "x-2.error.json").read_text())["reason"] == "name: ours"
    # A leftover of a crash, old enough: taken over for the same file.
    then = now() - timedelta(seconds=accept.LEFTOVER_AGE + 1)
    old = Rejection(file="y.json", field="name", reason="name: before the crash", rejected_at=then,
                    rejected_by="w1")  # fmt: skip
    (tree.rejected / "y.error.json").write_bytes(encode(old))
    dest = accept.reject(tree, "y.json", InvalidInput("name", "again"), "w1", data=b"y")
    assert dest.name == "y.json"
    assert json.loads((tree.rejected / "y.error.json").read_text())["reason"] == "name: again"
