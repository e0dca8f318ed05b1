"""Property: whatever bytes arrive, acceptance gives a valid pending job or an
``InvalidInput`` naming a field and a problem: no other exception, no hang, and
a rejection adds nothing to ``pending/`` (SPEC sections 2 and 11.7).

Inputs: random JSON values, mutations of valid submissions (a key dropped, a
value's type changed, random keys inserted, random strings in source paths,
step names and other fields) and random bytes. Real files, real ffprobe.

``SPOOL_FUZZ_EXAMPLES`` sets the number of examples (default 150).
"""

from __future__ import annotations

import copy
import itertools
import json
import os
import shutil
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from conftest import minimal, submission
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from spool.core import config
from spool.core.errors import InvalidInput
from spool.core.model import Rejection, decode
from spool.disk.tree import Tree
from spool.kinds import Job
from spool.queue import accept

EXAMPLES = int(os.environ.get("SPOOL_FUZZ_EXAMPLES", "150"))
#: Wall-clock ceiling of one example; a hang fails the test instead of stalling it.
HANG_SECONDS = 20

#: For the tests of known bugs: the first failure is enough, no shrinking.
SHORT = dict(phases=[Phase.generate], report_multiple_bugs=False)

FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=10_000,  # ms per example: ffprobe runs for every source that exists
    database=None,  # keep no example database in the repository
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

# -- strategies ------------------------------------------------------------------------------

#: Strings that make trouble: escapes, separators, traversal, huge, odd Unicode.
NASTY = st.sampled_from(
    [
        "",
        " ",
        ".",
        "..",
        "../../etc/passwd",
        "/",
        "/dev/null",
        "/dev/zero",
        "/proc/self/environ",
        "~",
        "~root/.ssh/id_rsa",
        "clip.mp4",
        "logo.png",
        "music.m4a",
        "silent.mp4",
        "pipe.mp4",
        "folder.mp4",
        "notes.mp4",
        "empty.mp4",
        "escape.mp4",
        "file:clip.mp4",
        "concat:clip.mp4|clip.mp4",
        "http://example.invalid/x.mp4",
        "a" * 300,
        "x" * 5000,
        "clip.mp4\n",
        "\t",
        "NaN",
        "1e999",
        "‮gnp.exe",
        "\u00e9\u0301",
        "日本語.mp4",
        "%00",
        "$(touch /tmp/pwned)",
        "';drop table jobs;--",
        "{{7*7}}",
    ]
)
TEXT = st.one_of(st.text(max_size=40), NASTY)
KEY_TEXT = st.one_of(st.from_regex(r"[a-z][a-z0-9_]{0,12}", fullmatch=True), TEXT)
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    TEXT,
)
JSON = st.recursive(
    SCALARS,
    lambda kids: st.one_of(st.lists(kids, max_size=4), st.dictionaries(KEY_TEXT, kids, max_size=4)),
    max_leaves=12,
)
OPS = st.one_of(
    st.sampled_from(["trim", "fit", "fps", "overlay", "text", "audio", "encode"]),
    TEXT,
)
FIELDS = st.sampled_from(
    [
        "name",
        "revision",
        "supersedes",
        "operation",
        "priority",
        "submitted_by",
        "input",
        "start",
        "duration",
        "width",
        "height",
        "mode",
        "fps",
        "position",
        "scale",
        "text",
        "colour",
        "source",
        "container",
        "video_codec",
        "audio_codec",
        "crf",
        "file",
        "expect",
    ]
)


def _bases(assets: Path) -> list[dict[str, Any]]:
    """Valid submissions to mutate (each is accepted as it stands)."""
    return [
        minimal(assets, name="fuzz"),
        submission(assets, name="fuzz-full"),
        minimal(
            assets,
            name="fuzz-mov",
            steps=[
                {"op": "fit", "width": 96, "height": 96, "mode": "crop"},
                {"op": "fps", "fps": 10},
                {"op": "audio", "mode": "replace", "source": "bed"},
                {"op": "encode", "container": "mov", "video_codec": "prores"},
            ],
            sources={"clip": str(assets / "silent.mp4"), "bed": "music.m4a"},
            output={"expect": {"duration_tolerance": 0.5}},
        ),
    ]


def _slots(value: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[tuple[Any, ...], Any]]:
    """Every (path, value) inside a JSON value, the root included."""
    yield path, value
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _slots(v, (*path, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _slots(v, (*path, i))


def _get(value: Any, path: tuple[Any, ...]) -> Any:
    for p in path:
        value = value[p]
    return value


def _mutate(draw: st.DrawFn, sub: dict[str, Any]) -> dict[str, Any]:
    sub = copy.deepcopy(sub)
    sub["name"] = f"{sub['name']}-{SERIAL_TOKEN}"
    for _ in range(draw(st.integers(0, 2))):
        slots = list(_slots(sub))
        kind = draw(
            st.sampled_from(
                [
                    *("drop", "retype", "insert", "path", "path", "path", "op", "op"),
                    *("field", "field", "number", "number", "duplicate_step"),
                ]
            )
        )
        if kind == "drop":
            inner = [p for p, _ in slots if p]
            path = draw(st.sampled_from(inner))
            del _get(sub, path[:-1])[path[-1]]
        elif kind == "retype":
            inner = [p for p, _ in slots if p]
            path = draw(st.sampled_from(inner))
            old = _get(sub, path)
            new = draw(JSON.filter(lambda v, old=old: type(v) is not type(old)))
            _get(sub, path[:-1])[path[-1]] = new
        elif kind == "insert":
            dicts = [p for p, v in slots if isinstance(v, dict) and p[-1:] not in (("sources",), ("tags",))]
            path = draw(st.sampled_from(dicts))
            _get(sub, path)[draw(KEY_TEXT)] = draw(JSON)
        elif kind == "path":
            sources = sub.get("sources")
            if isinstance(sources, dict) and sources:
                role = draw(st.sampled_from(sorted(sources)))
                sources[role] = draw(st.one_of(NASTY, TEXT, NASTY.map(lambda s: f"{ASSETS[0]}/{s}")))
        elif kind == "op":
            steps = sub.get("recipe", {}).get("steps") if isinstance(sub.get("recipe"), dict) else None
            if isinstance(steps, list) and steps and isinstance(steps[0], dict):
                i = draw(st.integers(0, len(steps) - 1))
                if isinstance(steps[i], dict):
                    steps[i]["op"] = draw(OPS)
        elif kind == "field":
            dicts = [p for p, v in slots if isinstance(v, dict) and p[-1:] not in (("sources",), ("tags",))]
            path = draw(st.sampled_from(dicts))
            _get(sub, path)[draw(FIELDS)] = draw(st.one_of(SCALARS, NASTY))
        elif kind == "number":
            nums = [p for p, v in slots if p and isinstance(v, int | float) and not isinstance(v, bool)]
            if nums:
                path = draw(st.sampled_from(nums))
                _get(sub, path[:-1])[path[-1]] = draw(
                    st.sampled_from([0, -1, 1, 2**31, 2**63, -(2**63), 1e308, -0.0, 0.5, 86401, 1e-9])
                )
        else:
            steps = sub.get("recipe", {}).get("steps") if isinstance(sub.get("recipe"), dict) else None
            if isinstance(steps, list) and steps:
                steps.insert(draw(st.integers(0, len(steps))), copy.deepcopy(draw(st.sampled_from(steps))))
    return sub


#: Stands in for a serial number in generated names; the test swaps in a fresh one per
#: example (same length, outside the strategy so generation stays deterministic), so a
#: mutation that is still valid becomes a job instead of a duplicate of an earlier one.
SERIAL_TOKEN = "q7q7q7"
_SERIAL = itertools.count(1)


def with_fresh_name(data: bytes) -> bytes:
    return data.replace(SERIAL_TOKEN.encode(), f"{next(_SERIAL):06d}".encode())


#: The asset root of the running example (strategies need it; set by the test).
ASSETS: list[str] = ["/nonexistent"]


@st.composite
def submissions(draw: st.DrawFn, bases: list[dict[str, Any]]) -> bytes:
    kind = draw(st.sampled_from(["mutated", "mutated", "mutated", "json", "bytes", "tweaked_bytes"]))
    if kind == "json":
        return json.dumps(draw(JSON)).encode()
    if kind == "bytes":
        return draw(st.binary(max_size=300))
    sub = _mutate(draw, draw(st.sampled_from(bases)))
    data = json.dumps(sub, ensure_ascii=draw(st.booleans())).encode()
    if kind == "tweaked_bytes" and data:
        i = draw(st.integers(0, len(data) - 1))
        data = data[:i] + draw(st.binary(min_size=0, max_size=3)) + data[i + 1 :]
    return data


# -- the spool under test ------------------------------------------------------------------


def _fuzz_assets(assets: Path) -> None:
    """Awkward files inside the asset root that random paths may hit."""
    os.mkfifo(assets / "pipe.mp4")
    (assets / "folder.mp4").mkdir()
    (assets / "notes.mp4").write_text("not a video\n")
    (assets / "empty.mp4").write_bytes(b"")
    outside = assets.parent / "outside.mp4"
    shutil.copyfile(assets / "clip.mp4", outside)
    os.symlink(outside, assets / "escape.mp4")


@contextmanager
def no_hang(seconds: float) -> Iterator[None]:
    def on_alarm(signum: int, frame: Any) -> None:
        raise TimeoutError(f"acceptance took longer than {seconds} s")

    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def _listing(tree: Tree) -> dict[str, list[str]]:
    return {
        "pending": sorted(os.listdir(tree.pending)),
        "attempts": sorted(os.listdir(tree.attempts)),
        "running": sorted(os.listdir(tree.running)),
        "complete": sorted(os.listdir(tree.complete)),
        "failed": sorted(os.listdir(tree.failed)),
    }


def check_one(tree: Tree, cfg: config.Config, data: bytes, drop_name: str) -> str:
    """Run one input through acceptance and the rejection path; assert the property."""
    before = _listing(tree)
    try:
        with no_hang(HANG_SECONDS):
            job = accept.accept_bytes(tree, cfg, data, "fuzzer")
    except InvalidInput as exc:
        assert isinstance(exc.field, str) and exc.field.strip(), repr(exc)
        assert isinstance(exc.problem, str) and exc.problem.strip(), repr(exc)
        assert _listing(tree) == before  # nothing pending, no reservation left behind
        # the rejection path files it under rejected/, whatever the drop was called
        rejected_before = set(os.listdir(tree.rejected))
        with no_hang(HANG_SECONDS):
            dest = accept.reject(tree, drop_name, exc, "fuzzer", data=data)
        new = set(os.listdir(tree.rejected)) - rejected_before
        assert dest.parent == tree.rejected and dest.read_bytes() == data
        stem = dest.name.removesuffix(".json")
        assert new == {dest.name, f"{stem}.error.json"}
        rec = decode((tree.rejected / f"{stem}.error.json").read_bytes(), Rejection)
        assert rec.field == exc.field and rec.reason == str(exc) and rec.file == drop_name
        assert _listing(tree) == before
        return "rejected"
    path = tree.pending / f"{job.job_id}.json"
    assert path.name not in before["pending"]
    after = _listing(tree)
    assert set(after["pending"]) - set(before["pending"]) == {path.name}
    assert decode(path.read_bytes(), Job) == job
    assert job.job_id == f"{job.name}@{job.revision}"
    return "accepted"


@pytest.fixture()
def fuzz_spool(tree: Tree, assets: Path) -> tuple[Tree, config.Config, list[dict[str, Any]]]:
    _fuzz_assets(assets)
    ASSETS[0] = str(assets)
    return tree, config.load(tree.config_file), _bases(assets)


@pytest.mark.system  # long: the system tier
def test_acceptance_never_crashes_and_rejections_never_pend(fuzz_spool):
    tree, cfg, bases = fuzz_spool
    # every base is valid as it stands, so mutations start from real jobs
    for i, base in enumerate(bases):
        b = {**base, "name": f"base-{i}"}
        assert check_one(tree, cfg, json.dumps(b).encode(), "base.json") == "accepted"
    outcomes: list[str] = []

    @FUZZ
    @given(data=submissions(bases), drop_name=st.one_of(TEXT, st.just("x.json")))
    def prop(data: bytes, drop_name: str) -> None:
        outcomes.append(check_one(tree, cfg, with_fresh_name(data), drop_name or "empty.json"))

    prop()
    assert len(outcomes) >= min(EXAMPLES, 20)
    assert "rejected" in outcomes


def test_bad_keys_in_tags_and_sources_name_their_object(fuzz_spool):
    tree, cfg, bases = fuzz_spool

    @settings(FUZZ, max_examples=min(EXAMPLES, 20), **SHORT)
    @given(
        where=st.sampled_from(["tags", "sources"]),
        key=st.text(min_size=1, max_size=20).filter(lambda k: not k.isascii() or not k.islower()),
    )
    def prop(where: str, key: str) -> None:
        sub = copy.deepcopy(bases[0])
        sub[where][key] = "x"
        data = json.dumps(sub).encode()
        with pytest.raises(InvalidInput) as err:
            accept.accept_bytes(tree, cfg, data, "fuzzer")
        # the error names the object the key is in, and the rejection path holds
        assert err.value.field.split(".")[0].split("[")[0] == where, (key, err.value.field)
        assert check_one(tree, cfg, data, "bad-key.json") == "rejected"

    prop()


def _surrogate_case(fuzz_spool: Any, where: list[str]) -> None:
    tree, cfg, bases = fuzz_spool

    @settings(FUZZ, max_examples=min(EXAMPLES, 20), **SHORT)
    @given(
        surrogate=st.integers(0xD800, 0xDFFF).map(chr),
        prefix=st.text(max_size=3),
        where=st.sampled_from(where),
    )
    def prop(surrogate: str, prefix: str, where: str) -> None:
        sub = copy.deepcopy(bases[0])
        sub["name"] = f"surrogate-{next(_SERIAL)}"
        if where == "key":
            sub[prefix + surrogate] = 1
        elif where == "path":
            sub["sources"]["clip"] = prefix + surrogate + ".mp4"
        elif where == "tag":
            sub["tags"]["locale"] = prefix + surrogate
        else:
            sub["recipe"]["steps"].insert(0, {"op": "text", "text": prefix + surrogate})
        assert check_one(tree, cfg, json.dumps(sub).encode(), "surrogate.json") == "rejected"

    prop()


def test_lone_surrogates_in_values_are_rejected(fuzz_spool):
    """A JSON escape of a lone surrogate (\\ud800) is not text: rejected, and the rejection is writable."""
    _surrogate_case(fuzz_spool, ["path", "tag", "step"])


def test_lone_surrogates_in_keys_are_rejected(fuzz_spool):
    _surrogate_case(fuzz_spool, ["key"])
