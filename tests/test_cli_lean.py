"""The lean CLI (issue 14, item 4): the commands scripts call in loops run without
typer or rich, and print exactly what the typer path prints."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import BIN, SPOOL, minimal, run_cli, write_json
from libhelp import allow_noop, noop_sub, publish, tags_for

from spool.cli import plain

ROOT = Path(__file__).resolve().parents[1]
SECRET = "s3cr3tValue99"
SECRET_ENV = {"RENDER_API_TOKEN": SECRET}
#: ``spool`` with every command sent through the typer app (the path before the fast one).
TYPER = [
    str(BIN / "python"),
    "-c",
    "import sys; sys.argv[0] = 'spool'; from spool.cli import typer_main; typer_main()",
]


def _imports(*args: str) -> set[str]:
    """The top-level modules a real ``spool ARGS`` imports (python -X importtime)."""
    proc = subprocess.run(
        [str(BIN / "python"), "-X", "importtime", SPOOL, *args], capture_output=True, text=True, timeout=60
    )
    names = set()
    for line in proc.stderr.splitlines():
        if line.startswith("import time:") and "|" in line:
            names.add(line.rsplit("|", 1)[1].strip().split(".")[0])
    assert names, proc.stderr
    return names


def _both(*args: str, env: dict[str, str] | None = None) -> tuple[subprocess.CompletedProcess[str], ...]:
    """``spool ARGS`` through the fast path and through typer."""
    full_env = {**os.environ, **(env or {})}
    return tuple(
        subprocess.run([*front, *args], capture_output=True, text=True, env=full_env, timeout=60)
        for front in ([SPOOL], TYPER)
    )


def _job(tree, assets, name: str = "lean") -> str:
    path = write_json(tree.root.parent / f"{name}.json", minimal(assets, name=name))
    return run_cli("submit", str(path), spool=tree, check=True).stdout.strip()


def test_commands_scripts_loop_over_import_no_framework_and_counting_no_msgspec(tree, assets):
    job = _job(tree, assets)
    sub = write_json(tree.root.parent / "again.json", minimal(assets, name="again"))
    spool = ("--spool", str(tree.root))
    framework = {"typer", "rich", "click", "httpx"}
    for args in (
        ("status", "--json"),
        ("ls", "pending"),
        ("ls", "--json"),
        ("show", job, "--json"),  # decodes the job: every kind, but no provider client
        ("submit", str(sub)),
        ("search", "--json", "campaign=mug"),
        ("get", "--json", "nosuch"),
        ("show", "lean"),  # an asset name: its versions
    ):
        loaded = _imports(*args, *spool)
        assert not loaded & framework, (args, loaded & framework)
    # A queue of counts (nothing running, failed or rejected, no worker) is counted
    # without msgspec or the config; the human view imports rich, never typer.
    assert "msgspec" not in _imports("status", "--json", *spool)
    human = _imports("status", *spool)
    assert "rich" in human and "typer" not in human


def test_status_reads_the_config_only_when_it_reads_a_record(tree):
    (tree.root / "spool.toml").write_text("[limits\nbroken")
    counted = run_cli("status", "--json", spool=tree)
    assert counted.returncode == 0 and json.loads(counted.stdout)["counts"]["pending"] == 0
    (tree.root / "workers" / "w1.json").write_text("{}")  # a worker to judge: the config is read
    judged = run_cli("status", "--json", spool=tree)
    assert judged.returncode == 2 and "spool.toml" in json.loads(judged.stdout)["error"]


@pytest.mark.system  # long: the system tier
def test_fast_commands_print_what_typer_prints(tree, assets):
    job = _job(tree, assets)
    spool = ("--spool", str(tree.root))
    for args in (
        ("ls", *spool),
        ("ls", "pending", "--json", *spool),
        ("ls", "nonsense", *spool),  # exit 2, one line
        ("ls", "nonsense", "--json", *spool),
        ("show", job, "--json", *spool),
        ("show", "nobody@1", "--json", *spool),  # exit 4
        ("show", job, *spool),  # laid out by rich, into a pipe
        ("show", "nobody@1", *spool),
        ("--spool", str(tree.root), "ls", "pending"),
        ("ls", "--spool", str(tree.root / "pending")),  # not a spool: exit 4
        ("submit", str(tree.root.parent / "missing.json"), *spool),  # exit 4, nothing filed
        ("status", "--json", "--spool", str(tree.root.parent / "nowhere")),
    ):
        fast, slow = _both(*args)
        assert (fast.returncode, fast.stdout, fast.stderr) == (slow.returncode, slow.stdout, slow.stderr), (
            args
        )


def test_status_json_is_the_same_through_both_paths(tree, assets):
    _job(tree, assets)
    fast, slow = _both("status", "--json", "--spool", str(tree.root))
    assert fast.returncode == slow.returncode == 0 and fast.stderr == slow.stderr == ""
    a, b = json.loads(fast.stdout), json.loads(slow.stdout)
    for ov in (a, b):  # the clock, the ages and the free disk space move between the two runs
        for moving in ("generated_at", "oldest_age", "oldest_pending_age", "disk"):
            ov.pop(moving, None)
    assert a == b and a["counts"]["pending"] == 1


def test_a_rejected_submission_reads_the_same_and_stays_masked(tree, assets):
    steps = [{"op": SECRET}, {"op": "encode", "preset": "ultrafast"}]
    bad = write_json(tree.root.parent / "leak.json", minimal(assets, name="leak", steps=steps))
    for extra in ((), ("--json",)):
        fast, slow = _both("submit", str(bad), *extra, "--spool", str(tree.root), env=SECRET_ENV)
        assert fast.returncode == slow.returncode == 2
        assert SECRET not in fast.stdout + fast.stderr and "[redacted]" in fast.stdout + fast.stderr
        if not extra:
            assert fast.stderr == slow.stderr
        else:  # each rejection is kept under its own name in rejected/
            a, b = json.loads(fast.stdout)[0], json.loads(slow.stdout)[0]
            assert a.pop("rejected") != b.pop("rejected") and a == b


@pytest.mark.system  # long: the system tier
def test_library_commands_print_what_typer_prints(tree, tmp_path):
    cfg = allow_noop(tree)
    for i in range(3):
        publish(tree, cfg, noop_sub(f"a{i}", tags=tags_for(i)))
    publish(tree, cfg, noop_sub("a0", revision=2, tags=tags_for(0)))
    out = tmp_path / "out"
    out.mkdir()
    spool = ("--spool", str(tree.root))
    for args in (
        ("search", *spool),
        ("search", "--json", "campaign=c0", "--all-versions", *spool),
        ("search", "--limit", "1", "--visibility", "public", "--json", *spool),
        ("search", "director=bob", *spool),  # exit 2: not an indexed tag
        ("search", "--json", "loudness<loud", *spool),
        ("get", "a1", *spool),
        ("get", "--json", "a0@1", *spool),
        ("get", "nosuch", "--json", *spool),  # exit 4
        ("get", "Not A Name", *spool),  # exit 2
        ("get", "a2", "--to", str(out), "--json", *spool),
        ("get", "a2", "--to", str(out), *spool),  # exit 1: never replaced
        ("show", "a0", *spool),  # an asset name: its versions
        ("show", "a0", "--json", *spool),
        ("show", "nosuch", *spool),  # exit 4
    ):
        fast, slow = _both(*args)
        assert (fast.returncode, fast.stdout, fast.stderr) == (slow.returncode, slow.stdout, slow.stderr), (
            args
        )


def test_small_plain_json_is_written_by_the_stdlib_byte_for_byte_as_msgspec_writes_it():
    import msgspec

    value = {
        "counts": {"pending": 1000, "big": 2**63 - 1, "neg": -5},
        "ages": [0.1, 224.4, 1796042507.8826513, 0.0, -0.0, 100.0, None],
        "text": ["é", "\u2028", "tab\there", 'quote " back \\', "\x00\x1f\x7f", "😀", ""],
        "flags": (True, False),
        "empty": [{}, []],
    }
    assert plain._plain(value, [plain._STDLIB_NODES])
    assert plain._stdlib_json(value) == msgspec.json.format(msgspec.json.encode(value), indent=2) + b"\n"
    # what the two write differently goes to msgspec: exponents, nan and inf, odd keys,
    # records, and more values than the stdlib's encoder writes faster than msgspec loads
    for odd in (1e16, 1e-5, float("nan"), float("inf"), {1: "a"}, 2**64, b"x", list(range(5000))):
        assert not plain._plain({"x": odd}, [plain._STDLIB_NODES]), odd


def test_help_and_unknown_options_still_go_through_typer(tree):
    helped = run_cli("status", "--help")
    assert helped.returncode == 0 and "--json" in helped.stdout
    typo = run_cli("status", "--jsn", spool=tree)
    assert typo.returncode == 2 and "No such option" in typo.stderr


@pytest.mark.slow
def test_bench_syscalls_smoke_prints_its_rows(tmp_path, request):
    # About half a minute (five daemons under strace, one of them rendering), so only when
    # asked for (pytest -m slow); the default suite's bench smoke test prints these rows too.
    if "slow" not in (request.config.option.markexpr or ""):
        pytest.skip("tools/bench syscalls --smoke takes half a minute; run it with -m slow")
    out, disk = tmp_path / "bench.json", str(tmp_path / "disk")
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "tools" / "bench.py"),
            "syscalls",
            "--smoke",
            "--json",
            str(out),
            "--disk-dir",
            disk,
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = {r["key"]: r for r in json.loads(out.read_text())["rows"]}
    sys.path.insert(0, str(ROOT / "tools"))
    from benchlib import syscalls

    assert sorted(rows) == sorted(syscalls.keys("smoke"))
    assert rows["syscalls.noop.fsyncs"]["spool"] > 0 and rows["syscalls.noop.rename"]["spool"] > 0
    # A job makes new inodes (its job file, attempt folders, output, manifest, segment), and
    # format 1 more of them (a frozen copy of its own, attempt records, index entries).
    assert 0 < rows["syscalls.noop.creates"]["spool"] < rows["syscalls.noop_format1.creates"]["spool"]


def test_syscall_counts_tell_new_inodes_from_other_opens(tmp_path):
    """``creates``: mkdirs and opens that create (O_CREAT, O_TMPFILE); a child's apart."""
    sys.path.insert(0, str(ROOT / "tools"))
    from benchlib import syscalls

    trace = tmp_path / "trace"
    trace.write_text(
        '10 openat(AT_FDCWD</s>, "/s/pending/.j.tmp", O_WRONLY|O_CREAT|O_EXCL|O_CLOEXEC, 0644) = 5\n'
        '10 openat(AT_FDCWD</s>, "/s/manifests", O_WRONLY|O_TMPFILE|O_CLOEXEC, 0644) = 6\n'
        '10 openat(AT_FDCWD</s>, "/s/pending/j.json", O_RDONLY|O_CLOEXEC) = 7\n'
        '10 mkdir("/s/attempts/j", 0777) = 0\n'
        '10 mkdirat(AT_FDCWD</s>, "/s/attempts/j/.new", 0777 <unfinished ...>\n'
        "10 fsync(5</s/pending/.j.tmp>) = 0\n"
        '11 execve("/usr/bin/ffmpeg", ["ffmpeg"], 0x0 /* 1 var */) = 0\n'
        '11 openat(AT_FDCWD, "/s/attempts/j/1/work/out.mp4", O_RDWR|O_CREAT|O_TRUNC, 0666) = 3\n'
    )
    own, kids = syscalls.count_trace(trace)
    assert own["creates"] == 4 and own["open"] == 3 and own["mkdir"] == 2 and own["fsync"] == 1
    assert kids["creates"] == 1 and kids["open"] == 1
