"""Secrets: a planted token never reaches any file in the spool, the journal or spool show."""

from __future__ import annotations

import json
import secrets as pysecrets
import subprocess
from datetime import UTC, datetime

from conftest import minimal, run_cli, write_json

from spool.core import secrets, settings
from spool.core.model import Failure
from spool.queue.events import Journal
from spool.queue.execute import scrub


def _grep(root, needle: bytes) -> list[str]:
    hits = []
    for p in root.rglob("*"):
        if p.is_file() and not p.is_symlink() and needle in p.read_bytes():
            hits.append(str(p.relative_to(root)))
    return hits


def test_planted_tokens_are_redacted_everywhere(tree, assets, daemons, tmp_path):
    env_token = "tok-" + pysecrets.token_hex(12)
    file_token = "ftok-" + pysecrets.token_hex(12)
    token_file = tmp_path / "provider.token"  # outside the spool, as the config comment says
    token_file.write_text(file_token + "\n")
    settings.write(tree.config_file, {"secrets": {"files": [str(token_file)]}})
    # A source whose metadata carries both tokens: FFmpeg prints input metadata in its log.
    leaky = assets / "leaky.mp4"
    subprocess.run(
        ["ffmpeg", "-v", "error", "-y", "-i", str(assets / "clip.mp4"), "-c", "copy",
         "-metadata", f"title={env_token}", "-metadata", f"comment={file_token}", str(leaky)],
        check=True,
    )  # fmt: skip
    env = {"SPOOL_PROVIDER_TOKEN": env_token}
    sub = minimal(assets, name="leaky", sources={"clip": str(leaky)})
    run_cli("submit", str(write_json(tree.root.parent / "leaky.json", sub)), spool=tree, env=env, check=True)
    d = daemons(tree, "w1", drain=True, env=env)
    assert d.wait(timeout=120) == 0
    log = (tree.attempt_dir("leaky@1", 1) / "ffmpeg.log").read_text()
    assert "[redacted]" in log  # the metadata lines were there, and masked
    for token in (env_token, file_token):
        assert _grep(tree.root, token.encode()) == [], f"{token[:4]} leaked"
        assert token not in d.output()
        for args in (
            ["show", "leaky@1"],
            ["show", "leaky@1", "--json"],
            ["logs", "leaky@1"],
            ["events", "--json"],
            ["status", "--json"],
        ):
            out = run_cli(*args, spool=tree, env=env)
            assert out.returncode == 0, out.stderr
            assert token not in out.stdout and token not in out.stderr, args


def test_failure_records_and_journal_lines_are_scrubbed(tree):
    token = "tok-" + pysecrets.token_hex(12)
    secrets.install([token])
    try:
        f = scrub(Failure(
            job_id="j@1", attempt=1, stage="render", property="ffmpeg_exit_status",
            expected=0, actual=f"auth {token} refused", message=f"provider said {token}",
            log_excerpt=[f"Authorization: Bearer {token}"], next_action="retry", worker="w",
            failed_at=datetime.now(UTC),
        ))  # fmt: skip
        assert token not in json.dumps([f.message, f.actual, f.log_excerpt])
        assert f.message == "provider said [redacted]"
        Journal(tree, "test").record("j@1", "failed", reason=f"token {token} leaked?")
        assert token not in (tree.events / "test.jsonl").read_text()
    finally:
        secrets.install([])


def test_short_values_and_ordinary_variables_are_not_secrets():
    found = secrets.collect({"HOME": "/root/somewhere", "API_KEY": "abc", "MY_TOKEN": "long-enough-value"})
    assert found == ["long-enough-value"]
