"""A spool shared by a studio group: group-owned, setgid folders, a group umask, read-only outputs."""

from __future__ import annotations

import grp
import json
import os
import stat
import subprocess

import pytest
from conftest import SPOOL, minimal, run_cli, write_json

from spool.core import settings
from spool.disk.tree import Tree

GROUP = "users"


@pytest.fixture()
def shared(tmp_path, assets):
    try:
        gid = grp.getgrnam(GROUP).gr_gid
    except KeyError:
        pytest.skip(f"no group {GROUP} on this host")
    root = tmp_path / "shared"
    subprocess.run(
        [SPOOL, "init", str(root), "--group", GROUP, "--asset-root", str(assets)],
        check=True,
        capture_output=True,
    )
    tree = Tree.at(root)
    assert 'umask = "0002"' in tree.config_file.read_text()  # what spool init wrote
    settings.write(tree.config_file, {"daemon": {"poll_interval": 0.2}})
    return tree, gid


def test_init_group_makes_every_folder_group_owned_setgid_and_writable(shared):
    tree, gid = shared
    assert 'umask = "0002"' in tree.config_file.read_text()
    for name in [
        "",
        "incoming",
        "pending",
        "held",
        "running",
        "complete",
        "failed",
        "rejected",
        "attempts",
        "store",
        "manifests",
        "workers",
        "events",
        "approvals",
    ]:
        st = (tree.root / name).stat()
        assert st.st_gid == gid, name
        assert st.st_mode & stat.S_ISGID and st.st_mode & stat.S_IWGRP, name


def test_files_made_later_belong_to_the_group_and_outputs_are_read_only(shared, assets, daemons):
    tree, gid = shared
    path = write_json(tree.root.parent / "job.json", minimal(assets, name="shared-ad"))
    run_cli("submit", str(path), spool=tree, check=True)
    assert daemons(tree, "w1", drain=True).wait(timeout=120) == 0
    m = json.loads(tree.manifest_file("shared-ad@1").read_text())
    store_file = tree.root / m["output"]["store_path"]
    for p in [
        tree.complete / "shared-ad@1.json",
        tree.attempt_dir("shared-ad@1", 1) / "attempt.json",
        tree.manifest_file("shared-ad@1"),
        store_file,
        *tree.events.glob("*.jsonl"),
    ]:
        st = p.stat()
        assert st.st_gid == gid, p
        assert st.st_mode & stat.S_IRGRP, p
    for d in [tree.job_attempts("shared-ad@1"), tree.attempt_dir("shared-ad@1", 1), store_file.parent]:
        st = d.stat()
        assert st.st_gid == gid and st.st_mode & stat.S_ISGID and st.st_mode & stat.S_IWGRP, d
    # records others may replace by rename are group-writable files; outputs are read-only for all
    assert (tree.complete / "shared-ad@1.json").stat().st_mode & stat.S_IWGRP
    for p in (store_file, tree.manifest_file("shared-ad@1")):
        assert not p.stat().st_mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH), p
    assert os.access(tree.root / "pending", os.W_OK)


def test_unknown_group_is_a_clear_error(tmp_path):
    res = run_cli("init", str(tmp_path / "x"), "--group", "no-such-group-here")
    assert res.returncode == 2 and "--group" in res.stderr
