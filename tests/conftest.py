"""Shared fixtures: real media made by FFmpeg once per session, real spools in tmp.

Nothing here mocks the filesystem or FFmpeg. Media is small (320x240, 2 s) so
a render takes a fraction of a second.
"""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from spool.core import config, settings
from spool.disk import groupcommit
from spool.disk.tree import Tree
from spool.media import samples
from spool.queue.events import Journal

# tools/ holds the independent invariant checker the tests share with the harnesses.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))

BIN = Path(sys.executable).parent
SPOOL = str(BIN / "spool")
SPOOLD = str(BIN / "spoold")

TAGS = {"campaign": "mug", "locale": "en-GB", "asset_type": "ad", "visibility": "internal"}


@pytest.fixture(autouse=True)
def _nothing_owed_left() -> Iterator[None]:
    """Folders a test's publish left owed (spool.disk.groupcommit.Owed) go with the test:
    paid by a later test's batch, they would count among its fsyncs."""
    yield
    groupcommit.owed.take()


@pytest.fixture(scope="session")
def media(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Source media shared by every test (read-only by convention: copy before changing)."""
    d = tmp_path_factory.mktemp("media")
    return {
        "clip": samples.clip(d / "clip.mp4", seconds=2.0, size="320x240", rate=25),
        "silent": samples.clip(d / "silent.mp4", seconds=2.0, size="320x240", rate=25, audio=False),
        "logo": samples.logo(d / "logo.png", size="80x40"),
        "music": samples.music(d / "music.m4a", seconds=3.0),
    }


@pytest.fixture()
def assets(tmp_path: Path, media: dict[str, Path]) -> Path:
    """A per-test asset root holding copies of the session media."""
    root = tmp_path / "assets"
    root.mkdir()
    for p in media.values():
        shutil.copyfile(p, root / p.name)
    return root


@pytest.fixture()
def tree(tmp_path: Path, assets: Path) -> Tree:
    """A fresh spool whose asset root is ``assets``; fast settings for tests."""
    t = Tree.at(tmp_path / "spool")
    t.create()
    settings.write(
        t.config_file,
        {"assets": {"roots": [str(assets)]}, "daemon": {"poll_interval": 0.2, "heartbeat_interval": 0.5}},
    )
    return t


@pytest.fixture()
def cfg(tree: Tree) -> config.Config:
    return config.load(tree.config_file)


@pytest.fixture()
def journal(tree: Tree) -> Journal:
    return Journal(tree, "test")


def submission(assets: Path, name: str = "mug-ad", **over: Any) -> dict[str, Any]:
    """A valid, small submission; keyword arguments replace top-level fields."""
    sub: dict[str, Any] = {
        "name": name,
        "sources": {
            "clip": str(assets / "clip.mp4"),
            "logo": str(assets / "logo.png"),
            "music": str(assets / "music.m4a"),
        },
        "recipe": {
            "input": "clip",
            "steps": [
                {"op": "trim", "start": 0.2, "duration": 1.0},
                {"op": "fit", "width": 192, "height": 108, "mode": "pad"},
                {"op": "overlay", "source": "logo", "position": "top-right", "scale": 0.2},
                {"op": "text", "text": "Only £9.99", "size": 14, "box": True},
                {"op": "audio", "mode": "mix", "source": "music"},
                {"op": "encode", "container": "mp4", "video_codec": "h264", "preset": "ultrafast"},
            ],
        },
        "tags": dict(TAGS),
    }
    sub.update(copy.deepcopy(over))
    return sub


def minimal(
    assets: Path, name: str = "plain", steps: list[dict[str, Any]] | None = None, **over: Any
) -> dict[str, Any]:
    """A one-source submission with only the given steps (default: a short trim)."""
    sub: dict[str, Any] = {
        "name": name,
        "sources": {"clip": str(assets / "clip.mp4")},
        "recipe": {
            "input": "clip",
            "steps": steps
            or [
                {"op": "trim", "duration": 0.6},
                {"op": "encode", "preset": "ultrafast"},
            ],
        },
        "tags": dict(TAGS),
    }
    sub.update(copy.deepcopy(over))
    return sub


def write_json(path: Path, value: Any) -> Path:
    path.write_text(json.dumps(value, ensure_ascii=False))
    return path


def run_cli(
    *args: str, spool: Tree | None = None, check: bool = False, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run the real ``spool`` command."""
    full = [SPOOL, *args]
    if spool is not None:
        full += ["--spool", str(spool.root)]
    proc = subprocess.run(
        full, capture_output=True, text=True, env={**os.environ, **(env or {})}, timeout=120
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"{full} exited {proc.returncode}: {proc.stderr}")
    return proc


class Daemon:
    """A real ``spoold run`` process."""

    def __init__(
        self,
        tree: Tree,
        worker: str,
        *,
        drain: bool = False,
        env: dict[str, str] | None = None,
        log: Path | None = None,
    ) -> None:
        args = [SPOOLD, "run", "--spool", str(tree.root), "--worker", worker, "--log-level", "debug"]
        if drain:
            args.append("--drain")
        self.worker = worker
        self.log = log or tree.root.parent / f"spoold-{worker}.log"
        self._logf = open(self.log, "ab")  # noqa: SIM115 - closed in wait()
        self.proc = subprocess.Popen(
            args,
            stdout=self._logf,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
            start_new_session=True,
        )

    def wait(self, timeout: float = 120) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            # A hung daemon: have it print every thread's stack into its log first.
            self.proc.send_signal(signal.SIGUSR1)
            time.sleep(0.5)
            raise AssertionError(
                f"spoold did not exit within {timeout} s:\n{self.output()[-6000:]}"
            ) from None
        finally:
            self._logf.close()

    def signal(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def kill(self) -> None:
        """SIGKILL the daemon and everything it started."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.wait()

    def alive(self) -> bool:
        return self.proc.poll() is None

    def output(self) -> str:
        return self.log.read_text(errors="replace")


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """Keep each phase's report on the test item, so a fixture's teardown can see a failure."""
    report = yield
    setattr(item, f"report_{report.when}", report)
    return report


@pytest.fixture()
def daemons(request: pytest.FixtureRequest) -> Iterator[Callable[..., Daemon]]:
    """Start real daemons; any still running at the end of the test are killed.

    When the test failed, each daemon's log tail is printed (pytest shows it in the
    report: a CI failure cannot be re-run to ask), after a live daemon has written
    every thread's stack into it (SIGUSR1): a daemon stuck somewhere says where."""
    started: list[Daemon] = []

    def start(tree: Tree, worker: str = "w1", **kw: Any) -> Daemon:
        d = Daemon(tree, worker, **kw)
        started.append(d)
        return d

    yield start
    call = getattr(request.node, "report_call", None)
    failed = call is not None and call.failed
    for d in started:
        if failed and d.alive():
            d.signal(signal.SIGUSR1)
            deadline = time.monotonic() + 5
            while "hread 0x" not in d.output() and time.monotonic() < deadline:
                time.sleep(0.05)
        if d.alive():
            d.kill()
        if failed:
            tail = d.output().splitlines()[-120:]
            print(f"--- the last {len(tail)} lines of daemon {d.worker}'s log ---", *tail, sep="\n")


def wait_for(predicate: Callable[[], Any], timeout: float = 30.0, interval: float = 0.05) -> Any:
    """Poll until ``predicate()`` is truthy; fail the test on timeout."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout} s waiting for {predicate}")


def renders_at_once(daemon_log: str) -> int:
    """The most attempts a daemon had producing at once, from its own log, in order: an
    attempt holds its slot from "attempt N started" to the hand-over of its prepared
    publish ("produced"; format 2). For runs whose attempts all publish."""
    producing = peak = 0
    for line in daemon_log.splitlines():
        if re.search(r": attempt \d+ started$", line):
            producing += 1
        elif re.search(r": attempt \d+ produced, its publish prepared$", line):
            producing -= 1
        peak = max(peak, producing)
    return peak


def state_files(tree: Tree) -> dict[str, list[str]]:
    """Every job file by state, straight from the folders (an independent view)."""
    out: dict[str, list[str]] = {}
    for state in ("pending", "complete", "failed"):  # held/ only where a test puts jobs there
        out[state] = sorted(p.name for p in (tree.root / state).glob("*.json"))
    out["running"] = sorted(p.name for p in tree.running.glob("*/*.json"))
    return out


# -- the tiers ----------------------------------------------------------------------------------
#: Fixtures that bring up a whole system: real daemons, several mounts of one folder (sshfs,
#: JuiceFS), a real browser. A test that uses one is in the system tier; so is one marked
#: ``system`` by hand (it kills processes again and again, or waits on a real clock).
SYSTEM_FIXTURES = frozenset({"daemons", "mounts", "two_mounts", "nas", "browser"})
#: Modules whose every test is a whole system (mounts, power cuts, torture, benchmarks).
SYSTEM_MODULES = frozenset({"test_nas", "test_juicefs", "test_powerloss", "test_torture", "test_bench_smoke"})


#: Modules whose tests each render on their own from cheap module fixtures: spread over the
#: test workers one test at a time. Every other module runs whole on one worker (its module
#: fixtures, often a spool after real renders, are made once).
SPREAD_MODULES = frozenset({"test_recipe", "test_validate", "test_layers"})


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark every test with its tier: ``system`` (a whole system: daemons, mounts, power
    cuts, torture, benchmarks) or the unit tier (everything else: library calls and CLI
    commands on real files and real FFmpeg). ``tools/test --fast`` runs the unit tier.
    And with its worker group (pytest-xdist ``--dist loadgroup``): its module's, unless the
    module is spread."""
    for item in items:
        names = set(getattr(item, "fixturenames", ()))
        module = item.module.__name__ if getattr(item, "module", None) is not None else ""
        if module not in SPREAD_MODULES:
            item.add_marker(pytest.mark.xdist_group(module))
        if (
            names & SYSTEM_FIXTURES
            or module in SYSTEM_MODULES
            or item.get_closest_marker("torture")
            or item.get_closest_marker("slow")
        ):
            item.add_marker(pytest.mark.system)


@pytest.fixture()
def other_fs(tmp_path: Path) -> Iterator[Path]:
    """A folder on a second filesystem (tmpfs at /dev/shm): a link from ``tmp_path`` into
    it, or from it into ``tmp_path``, is refused by the kernel itself (EXDEV)."""
    shm = Path("/dev/shm")
    if not shm.is_dir() or os.stat(shm).st_dev == os.stat(tmp_path).st_dev:
        pytest.skip("no second filesystem at /dev/shm")
    d = Path(
        subprocess.check_output(["mktemp", "-d", "-p", str(shm), "spool-durable.XXXX"], text=True).strip()
    )
    yield d
    shutil.rmtree(d, ignore_errors=True)
