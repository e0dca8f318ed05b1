"""The library keeps its promises (issue 22): tag values in NFC, white space refused,
unknown fields named, and the gate's media measurement searchable right after
publish, for renders and for generations (real FFmpeg, real provider simulator)."""

from __future__ import annotations

import json
import unicodedata
from collections.abc import Iterator
from typing import Any

import pytest
from conftest import TAGS, minimal, run_cli, write_json
from libhelp import publish
from provsim import ProviderSim

from spool.core import config
from spool.core.errors import InvalidInput
from spool.disk.tree import Tree
from spool.library import catalog, index, indexpaths, segments

NFC = "Été à Noël"
NFD = unicodedata.normalize("NFD", NFC)


def search(tree: Tree, *terms: str) -> dict[str, Any]:
    res = run_cli("search", "--json", *terms, spool=tree)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def jobs(out: dict[str, Any]) -> list[str]:
    return sorted(h["job"] for h in out["results"])


# -- tags ----------------------------------------------------------------------------------


def test_a_tag_value_sent_in_nfd_is_kept_in_nfc_and_found_either_way(tree, assets):
    assert NFD != NFC
    cfg = config.load(tree.config_file)
    jid = publish(tree, cfg, minimal(assets, name="noel", tags=dict(TAGS, campaign=NFD)))
    m = json.loads(tree.manifest_file(jid).read_text())
    assert m["tags"]["campaign"] == NFC
    for merged in (False, True):  # from its segment line, then from the merged entries
        if merged:
            assert segments.merge(tree) == (1, 1)
            assert (indexpaths.tag_dir(tree, "campaign", NFC) / jid).exists()
        for typed in (NFC, NFD):
            out = search(tree, f"campaign={typed}")
            assert jobs(out) == [jid] and out["results"][0]["tags"]["campaign"] == NFC
    assert catalog.parse_terms([f"campaign={NFD}"]).tags == {"campaign": NFC}


@pytest.mark.parametrize("value", [" mug", "mug ", "\tmug", "mug\n", "\u00a0mug"])
def test_a_tag_value_with_leading_or_trailing_white_space_is_refused(tree, assets, value):
    sub = write_json(
        tree.root.parent / "spaced.json", minimal(assets, name="spaced", tags=dict(TAGS, campaign=value))
    )
    res = run_cli("submit", str(sub), spool=tree)
    assert res.returncode == 2
    assert "tags.campaign: has leading or trailing white space" in res.stderr
    assert len(res.stderr.splitlines()) == 1


def test_a_field_no_plug_in_provides_is_an_error_naming_it_and_the_known_ones(tree):
    for term in ("classifier.x=1", "classifier.label=car", "nope.score>0.5"):
        res = run_cli("search", "campaign=mug", term, spool=tree)
        field = term.split("=")[0].split(">")[0]
        assert res.returncode == 2, res.stdout
        assert res.stderr.startswith(f"spool: {field}: is not a known field"), res.stderr
        for known in ("width", "codec", "loudness", "scenes"):
            assert known in res.stderr
    with pytest.raises(InvalidInput) as exc:
        catalog.parse_terms(["classifier.x=1"], plugin_names=["faces"])
    assert exc.value.field == "classifier.x" and "faces.*" in str(exc.value)
    assert catalog.parse_terms(["tag:brand.name=acme"]).tags == {"brand.name": "acme"}
    assert catalog.parse_terms(["tag:width=wide"]).tags == {"width": "wide"}  # a tag named like a field


def test_text_fields_compare_only_for_equality(tree):
    with pytest.raises(InvalidInput):
        catalog.parse_terms(["codec>h264"])
    with pytest.raises(InvalidInput):
        catalog.parse_terms(["width>=wide"])


# -- media metadata recorded at publish ---------------------------------------------------------


def test_a_render_is_searchable_on_what_the_gate_measured_at_once(tree, assets):
    cfg = config.load(tree.config_file)
    jid = publish(tree, cfg, minimal(assets, name="measured"))
    silent = publish(tree, cfg, minimal(assets, name="mute", sources={"clip": str(assets / "silent.mp4")}))
    m = json.loads(tree.manifest_file(jid).read_text())["validation"]["media"]
    assert m["container"] == "mp4" and m["video_codec"] == "h264" and m["audio_codec"] == "aac"
    assert (m["width"], m["height"], m["fps"], m["pix_fmt"], m["audio_channels"]) == (
        320,
        240,
        25.0,
        "yuv420p",
        2,  # the recipe's encode writes stereo
    )
    assert 0 < m["duration"] <= 2.1 and -40 < m["loudness"] < 0
    rec = index.read_version(tree, "measured", 1)
    assert rec is not None and rec.media is not None and rec.media.width == 320  # the version record
    assert not list((tree.root / "enrich").glob("*.json"))  # nothing enriched: the gate's figures
    found = search(tree, "campaign=mug", "width>=320", "duration<=15", "codec=h264", "container=MP4")
    assert jobs(found) == sorted([jid, silent]) and found["partial"] == {}
    hit = next(h for h in found["results"] if h["job"] == jid)
    assert hit["resolution"] == "320x240" and hit["media"]["pix_fmt"] == "yuv420p"
    assert search(tree, "campaign=mug", "width>=1080") == {"results": [], "partial": {}}
    assert jobs(search(tree, "campaign=mug", "audio_codec=aac")) == [jid]
    # no audio: a comparison on it cannot be judged, so the silent asset is partial, never a hit
    out = search(tree, "campaign=mug", "channels>=1")
    assert jobs(out) == [jid] and out["partial"] == {"channels": 1}
    plain = run_cli("search", "campaign=mug", "codec=h264", spool=tree, check=True).stdout.splitlines()
    assert [line.split("\t")[2] for line in plain] == ["320x240", "320x240"]
    assert all(line.split("\t")[3] != "-" for line in plain)


TOKEN = "r8_LibTestToken_0a1b2c3d4e5f6a7b"
ENV_NAME = "SPOOL_TEST_LIB_TOKEN"


@pytest.fixture(scope="module")
def sim() -> Iterator[ProviderSim]:
    with ProviderSim(token=TOKEN, work=0.2) as s:
        yield s


def test_a_generation_is_searchable_on_what_the_gate_measured_at_once(tree, sim, daemons):
    with open(tree.config_file, "a") as f:
        f.write(
            f'\n[providers.sim]\nkind = "replicate"\nbase_url = "{sim.url}"\ntoken_env = "{ENV_NAME}"\n'
            "request_timeout = 2.0\nin_flight = 2\ndeadline = 30\n"
            "[providers.sim.polling]\nfirst = 0.1\nbase = 0.1\nceiling = 0.3\nfloor = 0.05\n"
        )
    sub = {
        "name": "gen-measured",
        "operation": "generate",
        "generate": {"provider": "sim", "model": "acme/video-1", "input": {"prompt": "a mug"}},
        "output": {"expect": {"video_streams": 1}},
        "tags": dict(TAGS),
    }
    run_cli("submit", str(write_json(tree.root.parent / "gen.json", sub)), spool=tree, check=True)
    d = daemons(tree, drain=True, env={ENV_NAME: TOKEN})
    assert d.wait(timeout=90) == 0, d.output()[-3000:]
    media = json.loads(tree.manifest_file("gen-measured@1").read_text())["validation"]["media"]
    assert media["video_codec"] and media["width"] and media["height"] and media["duration"]
    w = media["width"]
    out = search(tree, "campaign=mug", f"width={w}", f"codec={media['video_codec']}", "duration<=60")
    assert jobs(out) == ["gen-measured@1"] and out["partial"] == {}
    assert search(tree, "campaign=mug", f"width>{w}")["results"] == []


def test_a_kind_whose_check_records_no_media_gets_it_measured_at_publish(tree, assets, monkeypatch):
    """The publish path every kind shares measures the stored file when a kind's own
    check built its report without the gate's media record."""
    import msgspec

    from spool.kinds.render import kind

    real = kind.Render.check

    def bare(self, cfg, job, candidate, log):  # a kind that does not call spool.media.validate
        return msgspec.structs.replace(real(self, cfg, job, candidate, log), media=None)

    monkeypatch.setattr(kind.Render, "check", bare)
    cfg = config.load(tree.config_file)
    jid = publish(tree, cfg, minimal(assets, name="bare"))
    media = json.loads(tree.manifest_file(jid).read_text())["validation"]["media"]
    assert media["width"] == 320 and media["video_codec"] == "h264" and media["loudness"] < 0
    assert jobs(search(tree, "campaign=mug", "width=320", "codec=h264")) == [jid]
