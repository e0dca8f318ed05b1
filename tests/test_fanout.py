"""One submission, every variant: a ``variants`` matrix expands at acceptance into ordinary
jobs, frozen and visible on their own; the parent answers show, approve, revise, release;
a brief carries a master and the fan-out that renders from it."""

from __future__ import annotations

import json
import shutil
import threading
from typing import Any

import invariants
import pytest
from conftest import TAGS, run_cli, write_json

from spool import kinds
from spool.core.errors import InvalidInput
from spool.queue import accept, claim, depends, execute, intent
from spool.queue.context import Context
from spool.queue.events import Journal
from spool.queue.status import locate


def ad(assets: Any, clip: Any = None, **over: Any) -> dict[str, Any]:
    sub: dict[str, Any] = {
        "name": "mug-ad",
        "sources": {"clip": clip if clip is not None else str(assets / "clip.mp4")},
        "recipe": {
            "input": "clip",
            "steps": [
                {"op": "trim", "duration": 0.6},
                {"op": "fit", "width": 160, "height": 90, "mode": "pad"},
                {"op": "text", "text": "Only £9.99", "size": 12, "box": True, "fit": "shrink"},
                {"op": "encode", "preset": "ultrafast"},
            ],
        },
        "tags": dict(TAGS),
        "variants": {
            "aspect": {
                "16x9": {},
                "9x16": {"steps": {"fit": {"width": 90, "height": 160, "mode": "crop"}}},
                "1x1": {"steps": {"fit": {"width": 96, "height": 96}}},
            },
            "locale": {
                "en-GB": {},
                "de-DE": {"steps": {"text": {"text": "Nur 9,99 €"}}, "tags": {"locale": "de-DE"}},
            },
        },
    }
    sub.update(over)
    return sub


def run(tree: Any, cfg: Any, jid: str) -> str:
    assert claim.claim(tree, "w1", jid)
    return execute.execute(Context(tree, cfg, "w1", Journal(tree, "w1"), threading.Event()), jid)


def test_a_matrix_expands_into_ordinary_frozen_jobs_with_derived_names(tree, cfg, assets):
    path = write_json(tree.root.parent / "ad.json", ad(assets))
    out = run_cli("submit", str(path), spool=tree, check=True).stdout.split()
    assert out == [
        "mug-ad.16x9.en-gb@1", "mug-ad.16x9.de-de@1", "mug-ad.9x16.en-gb@1",
        "mug-ad.9x16.de-de@1", "mug-ad.1x1.en-gb@1", "mug-ad.1x1.de-de@1",
    ]  # fmt: skip
    for jid in out:
        assert locate(tree, jid).state == "pending"
        job = kinds.decode_job(tree.job_file("pending", jid).read_bytes())
        assert job.recipe_hash == kinds.of(job).spec_hash(job)
        assert job.parent == "mug-ad@1" and job.tags["aspect"] == job.variant["aspect"]
    tall = kinds.decode_job(tree.job_file("pending", "mug-ad.9x16.de-de@1").read_bytes())
    assert (tall.output.expect.width, tall.output.expect.height) == (90, 160)
    assert tall.tags["locale"] == "de-DE" and tall.layers[0].text == "Nur 9,99 €"
    shown = json.loads(run_cli("show", "mug-ad@1", "--json", spool=tree, check=True).stdout)
    assert [v["job"] for v in shown["variants"]] == out and shown["counts"] == {"pending": 6}
    assert shown["axes"] == [
        {"axis": "aspect", "values": ["16x9", "9x16", "1x1"]},
        {"axis": "locale", "values": ["en-GB", "de-DE"]},
    ]
    human = run_cli("show", "mug-ad@1", spool=tree, check=True).stdout
    assert "fan-out of 6 variants" in human and "mug-ad.1x1.de-de@1" in human
    assert run_cli("submit", str(path), spool=tree).returncode == 2  # the same fan-out again: a duplicate


def test_a_fan_out_is_accepted_whole_or_rejected_whole(tree, cfg, assets):
    sub = ad(assets)
    sub["variants"]["locale"]["de-DE"]["steps"] = {"audio": {"mode": "drop"}}
    with pytest.raises(InvalidInput) as err:
        accept.accept_all(tree, cfg, json.dumps(sub).encode(), "t")
    assert "variants.locale.de-DE.steps.audio" in err.value.field
    sub = ad(assets)
    sub["variants"]["aspect"]["9x16"]["steps"]["fit"]["width"] = 7  # not a size FFmpeg can make
    with pytest.raises(InvalidInput) as err:
        accept.accept_all(tree, cfg, json.dumps(sub).encode(), "t")
    assert err.value.field.startswith("variants[mug-ad.9x16")
    assert not list(tree.pending.iterdir()) and not list(tree.variants.iterdir())


def test_a_submission_cut_short_by_a_crash_is_completed_by_its_redelivery(tree, cfg, assets):
    data = json.dumps(ad(assets)).encode()
    first = accept.accept_all(tree, cfg, data, "t")
    lost = first[-1].job_id  # as if the acceptor died before committing the last variant
    tree.job_file("pending", lost).unlink()
    shutil.rmtree(tree.job_attempts(lost))
    again = accept.accept_made(tree, cfg, data, "t")
    assert [(j.job_id, new) for j, new in again] == [(j.job_id, j.job_id == lost) for j in first]
    with pytest.raises(InvalidInput, match="already exists"):
        accept.accept_all(tree, cfg, data, "t")


def test_approve_and_revise_work_on_the_parent_or_one_variant(tree, cfg, assets, journal):
    jobs = [j.job_id for j in accept.accept_all(tree, cfg, json.dumps(ad(assets)).encode(), "t")]
    for jid in jobs[:2]:
        assert run(tree, cfg, jid) == "complete"
    done = intent.approve_all(tree, "mug-ad@1", "Ann")
    assert [(j, r is not None) for j, r, _ in done] == [(j, j in jobs[:2]) for j in jobs]
    one = intent.approve_all(tree, jobs[0], "Bob")
    assert [j for j, _, _ in one] == [jobs[0]]
    recipe = ad(assets)["recipe"]
    recipe["steps"][0] = {"op": "trim", "duration": 0.4}
    made = intent.revise_fanout(tree, cfg, "mug-ad@1", recipe, "op", journal)
    assert [j.job_id for j in made] == [j.replace("@1", "@2") for j in jobs]
    assert all(j.supersedes == old for j, old in zip(made, jobs, strict=True))
    single = intent.revise(tree, cfg, "mug-ad.1x1.de-de@2", recipe, "op", journal)
    assert single.job_id == "mug-ad.1x1.de-de@3"
    shown = run_cli("show", "mug-ad@2", "--json", spool=tree, check=True).stdout
    assert "mug-ad.1x1.de-de@3" in shown  # the parent shows each variant's newest revision


def test_a_brief_makes_a_master_and_the_variants_that_wait_for_it(tree, cfg, assets, journal):
    master = {
        "name": "master",
        "sources": {"clip": str(assets / "clip.mp4")},
        "recipe": {
            "input": "clip",
            "steps": [{"op": "trim", "duration": 1.0}, {"op": "encode", "preset": "ultrafast"}],
        },
        "tags": {**TAGS, "asset_type": "master"},
    }
    variants = ad(assets, clip={"job": "master"})
    del variants["variants"]["aspect"]["1x1"]
    brief = {"brief": "morning-mug", "jobs": [master, variants]}
    made = accept.accept_all(tree, cfg, json.dumps(brief).encode(), "t")
    assert [accept.state_of(j) for j in made] == ["pending"] + ["waiting"] * 4
    assert run(tree, cfg, "master@1") == "complete"
    done = depends.settle(tree, cfg, journal, changed=["master@1"])
    assert sorted(done.pending) == sorted(j.job_id for j in made[1:])  # one batch
    for j in made[1:]:
        assert run(tree, cfg, j.job_id) == "complete"
    assert invariants.check(tree.root) == []
    bad = {"brief": "x", "jobs": [dict(variants, name="early"), dict(master, name="late")]}
    bad["jobs"][0]["sources"] = {"clip": {"job": "late"}}
    with pytest.raises(InvalidInput) as err:
        accept.accept_all(tree, cfg, json.dumps(bad).encode(), "t")
    assert "late" in str(err.value)  # an entry may name an earlier one only


def test_the_demos_brief_makes_the_whole_campaign(tree, assets, daemons):
    """tools/demo's brief, through the real CLI and daemon: a master from the provider
    simulator, then 3 aspects x 2 locales frozen to its bytes, every label and logo inside
    its frame's safe area, all published and found by their tags."""
    import importlib

    from genhelp import ENV_NAME, TOKEN, configure
    from provsim import ProviderSim

    from spool.media import samples

    demo = importlib.import_module("demo")  # tools/demo.py (tools/ is on sys.path: conftest)

    media = samples.demo_assets(assets / "demo")
    with ProviderSim(token=TOKEN, work=0.3) as sim:
        configure(tree, sim)
        brief = write_json(tree.root.parent / "morning-mug.json", demo.brief(media))
        made = run_cli("submit", str(brief), spool=tree, check=True).stdout.split()
        assert len(made) == 7 and made[0] == "mug-gen@1"
        counts = json.loads(run_cli("status", "--json", spool=tree, check=True).stdout)["counts"]
        assert counts["waiting"] == 6 and counts["pending"] == 1
        d = daemons(tree, drain=True, env={ENV_NAME: TOKEN})
        assert d.wait() == 0, d.output()
    master = json.loads(tree.manifest_file("mug-gen@1").read_text())["output"]["sha256"]
    for jid in made[1:]:
        job = json.loads(tree.job_file("complete", jid).read_text())
        assert [(u["job"], u["sha256"]) for u in job["upstreams"]] == [("mug-gen@1", master)]
        m = json.loads(tree.manifest_file(jid).read_text())
        assert m["validation"]["ok"] and len(m["validation"]["layers"]) == 2
        for layer in m["validation"]["layers"]:
            (x, y, w, h), (sx, sy, sw, sh) = layer["box"], layer["safe"]
            assert sx <= x and sy <= y and x + w <= sx + sw and y + h <= sy + sh, (jid, layer)
    found = run_cli("search", "campaign=morning-mug", "aspect=9x16", "locale=de-DE", "--json", spool=tree)
    assert [r["job"] for r in json.loads(found.stdout)["results"]] == ["mug-ad.9x16.de-de@1"]
    assert invariants.check(tree.root) == []
