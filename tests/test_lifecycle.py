"""One contract, run over every kind and every kind of filesystem (huey's ``StorageTests``
mixin, run against each backend): a job is accepted, claimed, produced and published by a
real daemon that is killed with SIGKILL at a named crash point; the next daemon recovers it
and finishes; then the spool is clean by ``spool fsck`` and by the independent checker
(``tools/invariants.py``, SPEC 11), the job is complete once with one attempt that ended,
and ``spool get`` hands out the published bytes, verified.

Kinds: ``noop``, ``render`` (FFmpeg), ``generate`` (the provider simulator), ``still``. Filesystems:
local disk, tmpfs, and a network mount (sshfs, one folder mounted twice: the job is
submitted through one mount, run through the other and checked on the server's side).
A new kind adds a row to :data:`KINDS`; the contract does not change.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import invariants
import pytest
from conftest import TAGS, minimal, run_cli, write_json
from genhelp import ENV, TOKEN, audit, configure, gen_sub
from provsim import ProviderSim
from test_nas import nas  # noqa: F401  (the two-mount fixture)

from spool.core import settings
from spool.disk.tree import Tree


def noop_sub(assets: Path, name: str) -> dict[str, Any]:
    return {"name": name, "operation": "noop", "tags": dict(TAGS)}


def render_sub(assets: Path, name: str) -> dict[str, Any]:
    return minimal(assets, name=name, tags=dict(TAGS))


def generate_sub(assets: Path, name: str) -> dict[str, Any]:
    # the simulator is one account for the module: each test's prompt is its own
    return gen_sub(name, f"lifecycle of {name} {uuid.uuid4().hex}")


def still_sub(assets: Path, name: str) -> dict[str, Any]:
    return {"name": name, "operation": "still", "sources": {"clip": str(assets / "clip.mp4")},
            "still": {"at": 0.5}, "tags": dict(TAGS)}  # fmt: skip


#: kind -> (its submission, a crash point of its own, besides the shared publish path's)
KINDS: dict[str, tuple[Callable[[Path, str], dict[str, Any]], str]] = {
    "noop": (noop_sub, "after_claim"),
    "render": (render_sub, "mid_render"),
    "generate": (generate_sub, "after_gen_create"),
    "still": (still_sub, "after_attempt_dir"),
}
#: On the publish path every kind shares.
SHARED_POINT = "after_manifest"


@pytest.fixture(scope="module")
def sim() -> Iterator[ProviderSim]:
    with ProviderSim(token=TOKEN, work=0.3) as s:
        yield s


class Place:
    """Where a spool lives: the view jobs are submitted through, the one a daemon runs on
    and the one it is checked on (all one folder on a local filesystem)."""

    def __init__(self, submit: Path, run: Path, check: Path, assets: Path) -> None:
        self.submit, self.run, self.check, self.assets = submit, run, check, assets


@pytest.fixture(params=["local", "tmpfs", "network"])
def place(request: pytest.FixtureRequest, tmp_path: Path, assets: Path) -> Iterator[Place]:
    if request.param == "local":
        yield Place(tmp_path, tmp_path, tmp_path, assets)
    elif request.param == "tmpfs":
        shm = Path("/dev/shm")
        if not shm.is_dir() or os.statvfs(shm).f_bavail * os.statvfs(shm).f_frsize < 256 << 20:
            pytest.skip("no tmpfs with room at /dev/shm")
        base = Path(
            subprocess.check_output(
                ["mktemp", "-d", "-p", str(shm), "spool-lifecycle.XXXX"], text=True
            ).strip()
        )
        try:
            yield Place(base, base, base, assets)
        finally:
            shutil.rmtree(base, ignore_errors=True)
    else:
        n = request.getfixturevalue("nas")
        name = f"life-{request.node.name.replace('[', '-').replace(']', '')}"
        for root in (n.export,):
            (root / name).mkdir(exist_ok=True)
        # the assets live beside the export (the same path through every mount is not needed:
        # a source is frozen at acceptance, through the view it was submitted from)
        yield Place(n.a / name, n.b / name, n.export / name, n.export.parent / "assets")


def _spool(place: Place, sim: ProviderSim) -> tuple[Tree, Tree, Tree]:
    made = Tree.at(place.check / "spool")
    made.create()
    settings.write(
        made.config_file,
        {
            "assets": {"roots": [str(place.assets)]},
            "daemon": {"poll_interval": 0.2, "heartbeat_interval": 0.5, "incoming_quiet": 0.5},
            "acceptance": {"allow_noop": True},
            "observe": {"metrics_dir": ""},
        },
    )
    configure(made, sim)
    return Tree.at(place.submit / "spool"), Tree.at(place.run / "spool"), made


def _daemon(tree: Tree, daemons: Callable[..., Any], crash_at: str | None, drain: bool) -> Any:
    env = dict(ENV)
    if crash_at:
        env["SPOOL_CRASH_AT"] = crash_at
    return daemons(tree, "life", drain=drain, env=env)


def _contract(place: Place, sim: ProviderSim, daemons: Callable[..., Any], kind: str, point: str) -> None:
    submit_view, run_view, check_view = _spool(place, sim)
    make, _ = KINDS[kind]
    name = f"life-{kind}"
    sub = make(place.assets, name)
    drop = write_json(place.submit / f"{name}.json", sub)
    out = run_cli("submit", str(drop), "--json", spool=submit_view, check=True)
    (accepted,) = json.loads(out.stdout)
    jid = accepted["job_id"]

    # 1. A daemon dies at the crash point (its own SIGKILL: nothing is cleaned up).
    first = _daemon(run_view, daemons, point, drain=True)
    assert first.wait(timeout=120) == -signal.SIGKILL, first.output()[-3000:]
    assert not (check_view.complete / f"{jid}.json").exists() or point == "before_complete_rename"

    # 2. The next daemon recovers the orphan and finishes the job.
    second = _daemon(run_view, daemons, None, drain=True)
    assert second.wait(timeout=180) == 0, second.output()[-4000:]

    # 3. The contract, read on the server's side.
    assert sorted(p.name for p in check_view.complete.glob("*.json")) == [f"{jid}.json"]
    assert list(check_view.failed.glob("*.json")) == [] and list(check_view.pending.glob("*.json")) == []
    fsck = run_cli("fsck", "--json", spool=check_view)
    assert fsck.returncode == 0, fsck.stdout + fsck.stderr
    assert invariants.check(check_view.root) == []
    if kind == "generate":
        assert audit(check_view, sim, jid, sub["generate"]["input"]["prompt"]).problems == []
    res = run_cli("get", jid, spool=check_view)
    assert res.returncode == 0, res.stdout + res.stderr
    path = Path(res.stdout.strip())
    show = run_cli("show", jid, "--json", spool=check_view, check=True).stdout
    assert hashlib.sha256(path.read_bytes()).hexdigest() in show  # the published bytes


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_each_kind_survives_a_kill_on_the_shared_publish_path(place, sim, daemons, kind):
    _contract(place, sim, daemons, kind, SHARED_POINT)


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_each_kind_survives_a_kill_at_a_point_of_its_own(tmp_path, assets, sim, daemons, kind):
    _contract(Place(tmp_path, tmp_path, tmp_path, assets), sim, daemons, kind, KINDS[kind][1])
