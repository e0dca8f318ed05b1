"""The CLI's machine interface (SPEC section 10): JSON shapes and exit codes."""

from __future__ import annotations

import json

from conftest import minimal, run_cli, write_json


def _submit(tree, assets, name, **over):
    path = write_json(tree.root.parent / f"{name}.json", minimal(assets, name=name, **over))
    return run_cli("submit", str(path), spool=tree)


def test_status_json_counts_every_state(tree, assets, daemons):
    assert _submit(tree, assets, "good").returncode == 0
    assert _submit(tree, assets, "bad", output={"expect": {"width": 999}}).returncode == 0
    bad = write_json(tree.root.parent / "broken.json", {"name": "broken"})
    assert run_cli("submit", str(bad), spool=tree).returncode == 2
    assert daemons(tree, "w1", drain=True).wait() == 0
    _submit(tree, assets, "waiting")
    out = run_cli("status", "--json", spool=tree, check=True)
    report = json.loads(out.stdout)
    assert report["counts"] == {
        "incoming": 0,
        "waiting": 0,
        "pending": 1,
        "held": 0,
        "running": 0,
        "complete": 1,
        "failed": 1,
        "rejected": 1,
        "quarantine": 0,
    }
    assert report["failed"][0]["job_id"] == "bad@1"
    assert report["failed"][0]["property"] == "width"
    assert report["failed"][0]["next_action"]
    assert report["rejected"][0]["file"] == "broken.json"
    assert report["rejected"][0]["reason"].startswith(("sources", "recipe", "tags"))  # names the field
    human = run_cli("status", spool=tree, check=True).stdout
    assert "pending 1" in human and "failed 1" in human and "Needs attention" in human
    assert "bad@1" in human and "next:" in human


def test_show_json_has_job_state_attempts_failure_manifest(tree, assets, daemons):
    _submit(tree, assets, "shown")
    daemons(tree, "w1", drain=True).wait()
    info = json.loads(run_cli("show", "shown@1", "--json", spool=tree, check=True).stdout)
    assert set(info) >= {"job", "state", "attempts", "failure", "manifest"}
    assert info["state"] == "complete"
    assert info["job"]["job_id"] == "shown@1"
    assert info["attempts"][0]["outcome"] == "published"
    assert info["failure"] is None
    assert len(info["manifest"]["output"]["sha256"]) == 64
    assert info["manifest"]["attempt"] == 1
    human = run_cli("show", "shown@1", spool=tree, check=True).stdout
    assert "complete" in human and info["manifest"]["output"]["store_path"] in human


def test_show_failed_job_names_the_failure(tree, assets, daemons):
    _submit(tree, assets, "wrong", output={"expect": {"height": 7}})
    daemons(tree, "w1", drain=True).wait()
    info = json.loads(run_cli("show", "wrong@1", "--json", spool=tree, check=True).stdout)
    assert info["state"] == "failed"
    f = info["failure"]
    assert f["stage"] == "validate" and f["property"] == "height"
    assert f["expected"] == 7 and f["actual"] == 240
    assert f["next_action"] and f["job_id"] == "wrong@1" and f["attempt"] == 1
    assert info["manifest"] is None


def test_exit_codes(tree, assets, tmp_path):
    assert run_cli("show", "nothing@1", spool=tree).returncode == 4
    assert run_cli("show", "nothing@1", "--json", spool=tree).returncode == 4
    assert run_cli("logs", "nothing@1", spool=tree).returncode == 4
    assert run_cli("status", "--spool", str(tmp_path / "not-a-spool")).returncode == 4
    assert run_cli("ls", "sideways", spool=tree).returncode == 2
    assert run_cli("status", env={"SPOOL_DIR": ""}).returncode == 2  # no spool anywhere
    bad = write_json(tmp_path / "bad.json", {"nope": 1})
    res = run_cli("submit", str(bad), spool=tree)
    assert res.returncode == 2 and "rejected" in res.stderr


def test_spool_dir_environment_variable(tree, assets):
    path = write_json(tree.root.parent / "env.json", minimal(assets, name="via-env"))
    res = run_cli("submit", str(path), env={"SPOOL_DIR": str(tree.root)})
    assert res.returncode == 0 and res.stdout.strip() == "via-env@1"
    rows = json.loads(run_cli("ls", "pending", "--json", env={"SPOOL_DIR": str(tree.root)}).stdout)
    assert rows == [{"job_id": "via-env@1", "state": "pending", "worker": None}]


def test_ls_and_logs(tree, assets, daemons):
    _submit(tree, assets, "listed")
    _submit(tree, assets, "queued")
    assert "pending   listed@1" in run_cli("ls", spool=tree, check=True).stdout
    daemons(tree, "w1", drain=True).wait()
    rows = json.loads(run_cli("ls", "complete", "--json", spool=tree, check=True).stdout)
    assert [r["job_id"] for r in rows] == ["listed@1", "queued@1"]
    log = run_cli("logs", "listed@1", spool=tree, check=True).stdout
    assert log.startswith("$ ffmpeg ") and "-progress pipe:1" in log
    assert run_cli("logs", "listed@1", "--attempt", "9", spool=tree).returncode == 4


def test_submit_json_reports_each_file(tree, assets):
    good = write_json(tree.root.parent / "g.json", minimal(assets, name="g"))
    bad = write_json(tree.root.parent / "b.json", minimal(assets, name="B A D"))
    res = run_cli("submit", str(good), str(bad), "--json", spool=tree)
    assert res.returncode == 2
    rows = json.loads(res.stdout)
    assert rows[0]["job_id"] == "g@1" and rows[0]["error"] is None
    assert rows[1]["job_id"] is None and rows[1]["field"] == "name"
    assert (tree.root / rows[1]["rejected"]).exists()
