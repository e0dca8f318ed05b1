"""tools/setup installs what spool and the demo need, and only ``--test`` adds
what the tests alone need (issue 11 item 19).

The real script runs on a copy of the project, with a PATH where nothing is
installed yet: Debian's package tools are stand-ins that only record what they
were asked for (nothing is installed on this machine), every other command is
the real one.
"""

from __future__ import annotations

import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
REAL = ("bash", "dirname", "id", "grep", "cut", "cat", "sha256sum")
#: Stand-ins: nothing is installed, and nothing outside the test folder changes.
FAKE = {
    "dpkg-query": "exit 1",
    "fc-match": "exit 1",
    "apt-get": 'echo "$*" >> "$SETUP_ASKED"',
    "sudo": 'exec "$@"',
    "tee": "cat >/dev/null",
    "chmod": "true",
    "rm": "true",
}
TEST_ONLY = {"chromium", "chromium-driver", "redis-server", "openssh-server", "sshfs", "systemd", "strace"}


def _script(path: Path, body: str) -> None:
    path.write_text(f"#!/bin/bash\n{body}\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


@pytest.fixture()
def project(tmp_path: Path) -> Path:
    """A copy of what tools/setup reads, with a .venv already installed for both modes."""
    proj = tmp_path / "proj"
    (proj / "tools").mkdir(parents=True)
    shutil.copy(ROOT / "tools" / "setup", proj / "tools" / "setup")
    shutil.copy(ROOT / "pyproject.toml", proj / "pyproject.toml")
    venv = proj / ".venv" / "bin"
    venv.mkdir(parents=True)
    # The project's python runs the real interpreter, but a pip install is only recorded:
    # it would otherwise install into the .venv the tests themselves import spool from
    # (seen: spool pointed at this temporary project, every later test without spool).
    _script(
        venv / "python",
        f'if [ "$1" = -m ] && [ "$2" = pip ]; then echo "pip $*" >> "$SETUP_ASKED"; exit 0; fi\n'
        f'exec {sys.executable} "$@"',
    )
    digest = subprocess.run(
        ["sha256sum", str(proj / "pyproject.toml")], capture_output=True, text=True, check=True
    ).stdout[:64]
    for stamp in (".spool-installed", ".spool-installed-test"):
        (proj / ".venv" / stamp).write_text(digest + "\n")
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    for name in REAL:
        found = shutil.which(name)
        assert found, name
        (bin_ / name).symlink_to(found)
    for name, body in FAKE.items():
        _script(bin_ / name, body)
    _script(bin_ / "python3", f'exec {sys.executable} "$@"')
    return proj


def _asked(project: Path, *args: str) -> set[str]:
    asked = project.parent / "asked"
    asked.write_text("")
    env = {"PATH": str(project.parent / "bin"), "SETUP_ASKED": str(asked), "HOME": str(project.parent)}
    res = subprocess.run(
        ["/bin/bash", str(project / "tools" / "setup"), *args], env=env, capture_output=True, text=True
    )
    assert res.returncode == 0, res.stderr
    return {w for line in asked.read_text().splitlines() for w in line.split() if not w.startswith("-")}


def test_plain_setup_installs_only_ffmpeg_and_a_font(project):
    asked = _asked(project)
    assert {"ffmpeg", "fonts-dejavu-core"} <= asked
    assert not asked & TEST_ONLY


def test_setup_for_the_tests_adds_what_only_the_tests_need(project):
    asked = _asked(project, "--test")
    assert {"ffmpeg", "fonts-dejavu-core"} | TEST_ONLY <= asked


def test_the_demo_and_the_test_command_use_their_own_mode():
    assert "bash tools/setup\n" in (ROOT / "tools" / "demo").read_text()
    assert "bash tools/setup --test\n" in (ROOT / "tools" / "test").read_text()


def test_setup_for_the_tests_builds_lazyfs_where_the_shared_folder_is(project):
    """The power-cut tests need LazyFS: built by the shared folder's own script, run where
    it lies beside the project (never copied in), and only where it is."""
    assert "lazyfs-build" not in _asked(project, "--test")
    build = project.parent / "shared" / "tools" / "lazyfs" / "build"
    build.parent.mkdir(parents=True)
    build.write_text('echo lazyfs-build >> "$SETUP_ASKED"\n')
    assert "lazyfs-build" in _asked(project, "--test")
    assert "lazyfs-build" not in _asked(project)  # only the tests need it


def test_no_test_runs_setup_or_the_bench_wrapper():
    """tools/setup may ``pip install`` into the shared .venv while other test workers import
    spool from it (seen: ModuleNotFoundError in five files of one run). Only this file runs
    it, on a copy with fake installers; benchmarks are run as ``tools/bench.py``."""
    wrapper = re.compile(r"""["']tools["']\s*/\s*["'](setup|bench)["']|["']tools/(setup|bench)["']""")
    offenders = [
        f"{f.name}: {m.group(0)}"
        for f in sorted((ROOT / "tests").glob("*.py"))
        if f.name != "test_setup.py"
        for m in wrapper.finditer(f.read_text())
    ]
    assert offenders == []
