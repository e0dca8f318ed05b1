"""Helpers the library tests share: noop spools, in-process publishing, tag schemes."""

from __future__ import annotations

import json
import threading
from typing import Any

from spool.core import config, settings
from spool.disk.tree import Tree
from spool.queue import accept, claim, execute
from spool.queue.context import Context
from spool.queue.events import Journal


def allow_noop(tree: Tree, **sections: dict[str, Any]) -> config.Config:
    """Turn on noop jobs (plus any other typed settings) in the spool's config."""
    over: dict[str, dict[str, Any]] = {"acceptance": {"allow_noop": True}}
    for name, kv in sections.items():
        over.setdefault(name, {}).update(kv)
    return settings.write(tree.config_file, over)


def as_format_1(tree: Tree) -> None:
    """Make ``tree`` a spool of the original layout (no ``FORMAT`` file: every spool made
    before issue 25), which this code writes in format 1."""
    (tree.root / "FORMAT").unlink()


def tags_for(i: int, **over: str) -> dict[str, str]:
    """A deterministic tag set: campaign from four values, locale from two."""
    tags = {
        "campaign": f"c{i % 4}",
        "locale": ["en-GB", "fr-FR"][i % 2],
        "asset_type": "ad",
        "visibility": "internal",
    }
    tags.update(over)
    return tags


def noop_sub(name: str, revision: int = 1, tags: dict[str, str] | None = None) -> bytes:
    sub: dict[str, Any] = {
        "name": name,
        "revision": revision,
        "operation": "noop",
        "tags": tags or tags_for(0),
    }
    return json.dumps(sub).encode()


def publish(tree: Tree, cfg: config.Config, data: bytes | dict[str, Any], worker: str = "w1") -> str:
    """Accept, claim and run one job in this process; returns its job ID."""
    raw = data if isinstance(data, bytes) else json.dumps(data).encode()
    job = accept.accept_bytes(tree, cfg, raw, "tester")
    assert claim.claim(tree, worker, job.job_id)
    ctx = Context(tree, cfg, worker, Journal(tree, worker), threading.Event())
    outcome = execute.execute(ctx, job.job_id)
    assert outcome == "complete", outcome
    return job.job_id
