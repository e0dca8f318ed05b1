"""The CLI under abuse (issue 11): secrets, bad paths, exit codes, finding the
spool, revise, approve and cancel, each through the real ``spool`` command."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import shutil
import struct
import subprocess
import termios
import unicodedata
from pathlib import Path

from conftest import SPOOL, minimal, run_cli, write_json

SECRET = "s3cr3tValue99"
#: A secret that JSON escapes (a backslash): only masking before encoding hides it.
ESCAPED = "t0k\\enSecret"
SECRET_ENV = {"RENDER_API_TOKEN": SECRET, "OTHER_SECRET": ESCAPED}


def _submit(tree, assets, name, **over):
    path = write_json(tree.root.parent / f"{name}.json", minimal(assets, name=name, **over))
    return run_cli("submit", str(path), spool=tree, check=True).stdout.strip()


def _spool_files(tree) -> dict[str, int]:
    """Every file in the spool with its size: what a command may not change."""
    return {str(p.relative_to(tree.root)): p.stat().st_size for p in tree.root.rglob("*") if p.is_file()}


def _leaks(text: str) -> bool:
    return SECRET in text or "enSecret" in text


def _in(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``spool ARGS`` run from ``folder``, with no SPOOL_DIR to help it."""
    env = {k: v for k, v in os.environ.items() if k != "SPOOL_DIR"}
    return subprocess.run([SPOOL, *args], cwd=folder, capture_output=True, text=True, env=env, timeout=60)


# -- item 4: secrets never reach CLI output or rejection records -------------------------------------


def test_a_secret_in_a_submission_is_masked_on_stderr_json_and_rejection_records(tree, assets):
    steps = [{"op": SECRET}, {"op": ESCAPED}, {"op": "encode", "preset": "ultrafast"}]
    bad = write_json(tree.root.parent / "leak.json", minimal(assets, name="leak", steps=steps))
    human = run_cli("submit", str(bad), spool=tree, env=SECRET_ENV)
    as_json = run_cli("submit", str(bad), "--json", spool=tree, env=SECRET_ENV)
    assert human.returncode == 2 and as_json.returncode == 2
    assert "[redacted]" in human.stderr and not _leaks(human.stderr + human.stdout)
    assert "[redacted]" in json.loads(as_json.stdout)[0]["error"] and not _leaks(as_json.stdout)
    tags = {**minimal(assets)["tags"], SECRET: "x"}  # a tag *name* that is the secret
    keyed = write_json(tree.root.parent / "keyed.json", minimal(assets, name="keyed", tags=tags))
    res = run_cli("submit", str(keyed), "--json", spool=tree, env=SECRET_ENV)
    assert res.returncode == 2 and not _leaks(res.stdout)
    records = [p.read_text() for p in tree.rejected.glob("*.error.json")]
    assert len(records) == 3 and not any(_leaks(r) for r in records)
    assert any(json.loads(r)["field"] == "tags.[redacted]" for r in records)


def test_show_json_masks_a_secret_tag_value(tree, assets):
    jid = _submit(tree, assets, "tagged", tags={**minimal(assets)["tags"], "campaign": SECRET})
    out = run_cli("show", jid, "--json", spool=tree, env=SECRET_ENV, check=True).stdout
    assert json.loads(out)["job"]["tags"]["campaign"] == "[redacted]" and not _leaks(out)
    events = run_cli("events", "--json", spool=tree, env=SECRET_ENV, check=True).stdout
    assert jid in events and not _leaks(events)


# -- item 6: one line, never a traceback with locals ---------------------------------------------------


def test_init_on_a_regular_file_says_one_line(tmp_path):
    f = tmp_path / "afile"
    f.write_text("")
    res = run_cli("init", str(f), env=SECRET_ENV)
    assert res.returncode == 2
    assert res.stderr.count("\n") == 1 and "is a file, not a folder" in res.stderr
    assert f.read_text() == ""


def test_an_unexpected_os_error_is_one_line_without_locals(tree, assets):
    jid = _submit(tree, assets, "odd")
    shutil.rmtree(tree.job_attempts(jid))
    tree.job_attempts(jid).write_text("not a folder")  # attempts/J should be a folder
    res = run_cli("show", jid, spool=tree, env=SECRET_ENV)
    assert res.returncode == 1
    assert res.stderr.count("\n") == 1 and "Not a directory" in res.stderr
    assert "Traceback" not in res.stderr and "locals" not in res.stderr


# -- item 15: exit codes as the README's table says ----------------------------------------------------


def test_verify_and_logs_exit_4_when_missing_and_3_when_not_ready(tree, assets):
    jid = _submit(tree, assets, "waiting")
    assert run_cli("verify", "nosuch@1", spool=tree).returncode == 4
    assert run_cli("verify", jid, spool=tree).returncode == 3
    assert run_cli("logs", jid, spool=tree).returncode == 3
    res = run_cli("logs", jid, "--json", spool=tree)
    assert res.returncode == 3 and json.loads(res.stdout)["exit_code"] == 3
    assert run_cli("logs", "nosuch@1", "--json", spool=tree).returncode == 4


def test_logs_json_carries_the_log(tree, assets, daemons):
    jid = _submit(tree, assets, "logged")
    assert daemons(tree, "w1", drain=True).wait() == 0
    out = json.loads(run_cli("logs", jid, "--json", spool=tree, check=True).stdout)
    assert out["job_id"] == jid and out["attempt"] == 1 and out["state"] == "complete"
    assert out["log"].startswith("$ ffmpeg ")


def test_submitting_a_missing_file_exits_4_and_leaves_the_spool_untouched(tree, tmp_path):
    before = _spool_files(tree)
    res = run_cli("submit", str(tmp_path / "missing.json"), spool=tree)
    assert res.returncode == 4 and "no such file" in res.stderr
    os.mkfifo(tmp_path / "fifo.json")
    for odd in (tmp_path, tmp_path / "fifo.json"):  # a folder, a FIFO: also the caller's mistake
        res = run_cli("submit", str(odd), "--json", spool=tree)
        assert res.returncode == 2 and json.loads(res.stdout)[0]["rejected"] is None
    assert _spool_files(tree) == before


# -- item 16: the spool is found from inside it, and --spool may come first ----------------------------


def test_the_spool_is_found_from_any_folder_inside_it(tree, assets, daemons):
    jid = _submit(tree, assets, "inside")
    assert daemons(tree, "w1", drain=True).wait() == 0
    for folder in (tree.root, tree.pending, tree.attempt_dir(jid, 1) / "work"):
        folder.mkdir(parents=True, exist_ok=True)
        res = _in(folder, "ls", "complete", "--json")
        assert res.returncode == 0, res.stderr
        assert json.loads(res.stdout)[0]["job_id"] == jid
    assert _in(tree.root.parent, "ls").returncode == 2  # outside: no spool


def test_spool_option_before_the_command_works_like_git_c(tree, assets, tmp_path):
    jid = _submit(tree, assets, "first")
    res = _in(tmp_path, "--spool", str(tree.root), "ls", "--json")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)[0]["job_id"] == jid
    other = tmp_path / "other"
    assert run_cli("init", str(other)).returncode == 0
    # After the command beats before it; both beat SPOOL_DIR.
    res = _in(tmp_path, "--spool", str(tree.root), "ls", "--spool", str(other), "--json")
    assert json.loads(res.stdout) == []
    res = run_cli("--spool", str(tree.root), "ls", "--json", env={"SPOOL_DIR": str(other)})
    assert json.loads(res.stdout)[0]["job_id"] == jid


# -- item 17: revise ---------------------------------------------------------------------------------


def _recipe(tmp_path: Path, **extra) -> Path:
    steps = [{"op": "trim", "duration": 0.4}, {"op": "encode", "preset": "ultrafast"}]
    return write_json(tmp_path / "recipe.json", {"input": "clip", "steps": steps, **extra})


def test_revise_rejects_a_source_the_recipe_does_not_use(tree, assets, tmp_path):
    jid = _submit(tree, assets, "ad")
    res = run_cli(
        "revise",
        jid,
        "--recipe",
        str(_recipe(tmp_path)),
        "--source",
        f"logo={assets / 'logo.png'}",
        spool=tree,
    )
    assert res.returncode == 2 and "--source" in res.stderr and "'logo'" in res.stderr
    assert [p.name for p in tree.pending.glob("*.json")] == [f"{jid}.json"]


def test_revise_refuses_an_old_revision_unless_forced(tree, assets, tmp_path):
    jid = _submit(tree, assets, "ad")
    recipe = str(_recipe(tmp_path))
    assert run_cli("revise", jid, "--recipe", recipe, spool=tree, check=True).stdout.strip() == "ad@2"
    res = run_cli("revise", jid, "--recipe", recipe, spool=tree)
    assert res.returncode == 2 and "newer revision ad@2 (pending)" in res.stderr
    assert run_cli("revise", "ad@2", "--recipe", recipe, spool=tree, check=True).stdout.strip() == "ad@3"
    out = run_cli("revise", jid, "--recipe", recipe, "--force", "--json", spool=tree, check=True).stdout
    assert json.loads(out) == {"job_id": "ad@4", "supersedes": jid}
    assert sorted(p.name for p in tree.pending.glob("*.json")) == [f"ad@{n}.json" for n in (1, 2, 3, 4)]


def test_revise_refuses_a_whole_job_file_as_the_recipe(tree, assets):
    jid = _submit(tree, assets, "ad")
    res = run_cli("revise", jid, "--recipe", str(tree.pending / f"{jid}.json"), spool=tree)
    assert res.returncode == 2 and res.stderr.count("\n") == 1
    assert "--spec" in res.stderr and "whole job or submission file" in res.stderr


# -- item 18: approve by any name; a cancel records who cancelled --------------------------------------


def test_approve_takes_a_unicode_name(tree, assets, daemons):
    jid = _submit(tree, assets, "ok")
    assert daemons(tree, "w1", drain=True).wait() == 0
    nfd = unicodedata.normalize("NFD", "Zoë Müller")  # as a Mac keyboard may send it
    out = json.loads(run_cli("approve", jid, "--by", nfd, "--json", spool=tree, check=True).stdout)
    assert out["approval"]["by"] == "Zoë Müller" and out["new"] is True
    again = run_cli("approve", jid, "--by", "Zoë Müller", "--json", spool=tree, check=True).stdout
    assert json.loads(again)["new"] is False  # one name, one record, however it was typed
    assert [p.name.split(".")[1] for p in (tree.approvals / jid).iterdir()] == ["Zoë Müller"]
    for bad in ("a/b", ".hidden", ""):
        res = run_cli("approve", jid, "--by", bad, spool=tree)
        assert res.returncode == 2 and "--by" in res.stderr


def test_cancelling_a_held_job_records_who_cancelled(tree, assets):
    jid = _submit(tree, assets, "aside")
    assert run_cli("hold", jid, spool=tree).returncode == 0
    assert run_cli("cancel", jid, "--by", "Zoë", spool=tree).returncode == 0
    failure = json.loads((tree.attempt_dir(jid, 1) / "failure.json").read_text())
    attempt = json.loads((tree.attempt_dir(jid, 1) / "attempt.json").read_text())
    assert failure["worker"].startswith("Zoë (spool cancel on ") and "-cancel" not in failure["worker"]
    assert attempt["reason"] == "cancel by Zoë"
    assert (tree.failed / f"{jid}.json").exists()


def _on_a_terminal(args: list[str], env: dict[str, str], columns: int = 40) -> str:
    """``spool ARGS`` with a narrow terminal as its stdout: what a person sees."""
    primary, secondary = pty.openpty()
    fcntl.ioctl(secondary, termios.TIOCSWINSZ, struct.pack("HHHH", 24, columns, 0, 0))
    proc = subprocess.Popen(
        [SPOOL, *args], stdout=secondary, stderr=secondary, env={**os.environ, **env}, close_fds=True
    )
    os.close(secondary)
    out = b""
    while True:
        try:
            chunk = os.read(primary, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        out += chunk
    proc.wait(timeout=60)
    os.close(primary)
    return re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", out.decode("utf-8", "replace"))


def test_a_long_secret_is_masked_even_where_a_terminal_wraps_it(tree, assets):
    long_secret = "Ab" + "9x7Q" * 20  # longer than the terminal is wide
    jid = _submit(tree, assets, "wrapped", tags={**minimal(assets)["tags"], "campaign": long_secret})
    seen = _on_a_terminal(["show", jid, "--spool", str(tree.root)], {"RENDER_API_TOKEN": long_secret})
    assert jid in seen and "[redacted]" in seen
    assert "9x7Q9x7Q" not in seen.replace("\r", "").replace("\n", "")  # no piece of it either
