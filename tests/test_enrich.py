"""Enrichment: real FFmpeg analyses of real files, plug-ins by entry point, partial results."""

from __future__ import annotations

import json
import subprocess
import textwrap
from pathlib import Path

import msgspec
import pytest
from conftest import minimal, run_cli
from libhelp import publish

from spool.core.errors import InvalidInput
from spool.disk import store
from spool.library import catalog, enrich


@pytest.fixture(scope="module")
def cut_clip(tmp_path_factory) -> Path:
    """2 s of test pattern with a tone, then 1 s of black and silence: one cut at 2 s."""
    out = tmp_path_factory.mktemp("enrich") / "cut.mp4"
    subprocess.run(
        ["ffmpeg", "-hide_banner", "-loglevel", "error", "-y",
         "-f", "lavfi", "-i", "testsrc=d=2:s=160x120:r=25",
         "-f", "lavfi", "-i", "color=black:d=1:s=160x120:r=25",
         "-f", "lavfi", "-i", "sine=d=2:sample_rate=48000",
         "-f", "lavfi", "-i", "anullsrc=d=1:sample_rate=48000:channel_layout=mono",
         "-filter_complex", "[0:v][1:v]concat=n=2:v=1:a=0[v];[2:a][3:a]concat=n=2:v=0:a=1[a]",
         "-map", "[v]", "-map", "[a]", "-c:v", "libx264", "-preset", "ultrafast", "-pix_fmt", "yuv420p",
         "-c:a", "aac", str(out)],
        check=True,
    )  # fmt: skip
    return out


def test_enrichment_reads_facts_cuts_loudness_black_and_silence(tree, cfg, cut_clip):
    s = store.put(tree, cut_clip, ".mp4", prefer_link=False)
    rec = enrich.enrich_object(tree, cfg, s.digest, s.path)
    assert rec.facts is not None and (rec.facts.width, rec.facts.height, rec.facts.fps) == (160, 120, 25.0)
    assert rec.facts.video_codec == "h264" and rec.facts.audio_codec == "aac"
    assert abs(rec.facts.duration - 3.0) < 0.1 and rec.facts.bitrate
    assert rec.scene_cuts is not None and [round(t) for t in rec.scene_cuts] == [2]
    assert rec.loudness is not None and -40 < rec.loudness < 0 and rec.true_peak is not None
    assert rec.black is not None and abs(rec.black[0].start - 2.0) < 0.1
    assert rec.silence is not None and abs(rec.silence[0].start - 2.0) < 0.2
    assert enrich.value(rec, "scenes") == 2
    # Stored by content hash: the record is read back, not recomputed.
    again = json.loads(enrich.record_path(tree, s.digest).read_text())
    assert again["sha256"] == s.digest and enrich.enrich_object(tree, cfg, s.digest, s.path) == rec


def test_unknown_field_is_refused_by_name(tree, cfg, cut_clip):
    s = store.put(tree, cut_clip, ".mp4", prefer_link=False)
    with pytest.raises(InvalidInput, match="--field"):
        enrich.enrich_object(tree, cfg, s.digest, s.path, ["colour"])


def test_comparison_syntax():
    q = catalog.parse_terms(["campaign=a<b", "loudness<-20", "scenes>=3", "black!=0", "fps=25"])
    assert q.tags == {"campaign": "a<b"}
    assert [(c.field, c.op, c.value) for c in q.comparisons] == [
        ("loudness", "<", -20.0),
        ("scenes", ">=", 3.0),
        ("black", "!=", 0.0),
        ("fps", "=", 25.0),
    ]
    assert catalog.Comparison("loudness", "<", -20.0).test(-23.0)
    assert not catalog.Comparison("scenes", ">=", 3.0).test(2)
    for bad in ("campaign", "scenes>=many", "=x", "campaign<x"):
        with pytest.raises(InvalidInput):
            catalog.parse_terms([bad])


@pytest.mark.system  # long: the system tier
def test_search_on_a_field_some_assets_lack_is_marked_partial(tree, cfg, assets):
    loud = publish(tree, cfg, minimal(assets, name="loud"))
    unmeasured = msgspec.structs.replace(  # the gate measures loudness unless told not to
        cfg, validation=msgspec.structs.replace(cfg.validation, measure_loudness=False)
    )
    later = publish(
        tree,
        unmeasured,
        minimal(assets, name="later", steps=[{"op": "trim", "duration": 0.8}, {"op": "encode"}]),
    )
    assert json.loads(tree.manifest_file(loud).read_text())["validation"]["media"]["loudness"] < 0
    mute = publish(tree, cfg, minimal(assets, name="mute", sources={"clip": str(assets / "silent.mp4")}))
    assert run_cli("enrich", loud, mute, spool=tree).returncode == 0

    def search(*extra):
        res = run_cli("search", "--json", "campaign=mug", "loudness<0", *extra, spool=tree)
        assert res.returncode == 0, res.stderr
        return json.loads(res.stdout)

    assert run_cli("enrich", "--field", "facts", later, spool=tree).returncode == 0
    out = search()
    assert [h["job"] for h in out["results"]] == [loud] and out["partial"] == {"loudness": 2}
    assert "partial" in run_cli("search", "campaign=mug", "loudness<0", spool=tree).stderr
    out = search("--enrich")  # computes what is missing first; a silent file still cannot be judged
    assert sorted(h["job"] for h in out["results"]) == sorted([loud, later])
    assert out["partial"] == {"loudness": 1}
    m = json.loads(tree.manifest_file(mute).read_text())
    assert enrich.load(tree, m["output"]["sha256"]).notes["loudness"] == "no audio stream"
    assert search("--json")["results"][0]["enrichment"]["loudness"] < 0


PLUGIN = textwrap.dedent(
    """
    def classify(path, facts):
        return {"label": "car", "score": 0.9, "wide": facts.width > facts.height}

    def broken(path, facts):
        raise RuntimeError("model missing")
    """
)


def test_plugin_enrichers_load_from_the_entry_point_group(tree, cfg, assets, tmp_path):
    site = tmp_path / "site"
    dist = site / "spool_example_plugin-0.1.dist-info"
    dist.mkdir(parents=True)
    (site / "spool_example_plugin.py").write_text(PLUGIN)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: spool-example-plugin\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(
        "[spool.enrichers]\n"
        "classifier = spool_example_plugin:classify\nbroken = spool_example_plugin:broken\n"
    )
    env = {"PYTHONPATH": str(site)}
    jid = publish(tree, cfg, minimal(assets, name="mug"))
    res = run_cli("enrich", "--json", jid, spool=tree, env=env)
    assert res.returncode == 0, res.stderr
    [row] = json.loads(res.stdout)["enriched"]
    assert {"classifier", "broken", "facts", "loudness"} <= set(row["done"])
    assert row["notes"]["broken"].startswith("plug-in failed: RuntimeError")
    res = run_cli(
        "search",
        "--json",
        "campaign=mug",
        "classifier.score>0.5",
        "classifier.label=car",
        spool=tree,
        env=env,
    )
    assert [h["job"] for h in json.loads(res.stdout)["results"]] == [jid], res.stderr
    res = run_cli("search", "--json", "campaign=mug", "classifier.label=bus", spool=tree, env=env)
    assert json.loads(res.stdout)["results"] == []
