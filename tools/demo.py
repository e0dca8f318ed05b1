"""The demo behind ``tools/demo``: a whole campaign from one brief.

The brief (docs/jobs.md, "From one brief to every variant") holds a master clip from a "hosted
video model" (tools/provsim.py, the Replicate-compatible simulator, started here on
127.0.0.1: no network, no real token) and a fan-out of the ad in 3 aspects x 2 locales
whose clip is that master. The variants wait in ``waiting/`` until the master publishes,
are frozen to its exact store object, then render with their logo and price label inside
the safe area; all seven are published and searchable. Everything is real: the other media
comes from FFmpeg's lavfi sources, ``spoold run --drain`` renders, validates and publishes.
Run it again and it starts from a fresh spool (the made media is kept).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from provsim import ProviderSim  # tools/ is this script's folder

from spool.media import samples

HERE = Path(__file__).resolve().parent.parent
DEMO = HERE / "demo"
BIN = Path(sys.executable).parent
#: The simulator's token: it lives in the daemon's environment only, never in a file.
SIM_TOKEN = "demo-sim-token-4f1c2b"


def provider_table(url: str) -> str:
    """``[providers.sim]``: the simulator, as a real provider would be configured (docs/generation.md)."""
    return f"""
[providers.sim]
kind = "replicate"
base_url = "{url}"
token_env = "DEMO_PROVIDER_TOKEN"
in_flight = 8
deadline = "5m"

[providers.sim.polling]
first = 0.5
base = 0.5
ceiling = 2.0
"""


def generated(name: str) -> dict[str, object]:
    """The master: a clip from the "hosted video model" (the simulator)."""
    return {
        "name": name,
        "operation": "generate",
        "generate": {
            "provider": "sim",
            "model": "acme/video-1",
            "input": {
                "prompt": "The Morning Mug on a beach at dawn",
                "width": 1280,
                "height": 720,
                "duration": 3,
            },
        },
        "output": {"expect": {"video_streams": 1, "width": 1280, "height": 720, "duration": 3}},
        "tags": {
            "campaign": "morning-mug",
            "locale": "en-GB",
            "asset_type": "master",
            "visibility": "internal",
        },
    }


def sh(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    print("$ " + " ".join(args), flush=True)
    return subprocess.run(list(args), check=check, text=True)


def campaign(assets: dict[str, Path]) -> dict[str, object]:
    """Every variant of the ad, rendered from the master once it is published: 3 aspects
    x 2 locales, each with its logo and its price label whole inside the safe area."""
    return {
        "name": "mug-ad",
        "sources": {
            "clip": {"job": "mug-gen"},  # the master's published bytes, frozen when it publishes
            "logo": str(assets["logo"]),
            "music": str(assets["music"]),
        },
        "recipe": {
            "input": "clip",
            "steps": [
                {"op": "trim", "start": 0.25, "duration": 2.5},
                {"op": "fit", "width": 1280, "height": 720, "mode": "pad"},
                {"op": "fps", "fps": 25},
                # "social": the safe area of the frame's aspect (9:16 keeps clear of the
                # bands the apps' own UI covers); see docs/jobs.md, "Required layers".
                {
                    "op": "overlay",
                    "source": "logo",
                    "position": "top-right",
                    "scale": 0.18,
                    "safe_area": "social",
                },
                {
                    "op": "text",
                    "text": "The Morning Mug – only £9.99",
                    "position": "bottom",
                    "size": 40,
                    "box": True,
                    "start": 0.25,
                    "end": 2.25,
                    # Too wide for the 720 px frames: shrink to the largest size whose box
                    # fits the safe area (a label that cannot fit is refused at acceptance).
                    "fit": "shrink",
                    "min_size": 20,
                    "safe_area": "social",
                },
                {"op": "audio", "mode": "replace", "source": "music", "loudness": -16},
                {
                    "op": "encode",
                    "container": "mp4",
                    "video_codec": "h264",
                    "crf": 21,
                    "preset": "veryfast",
                    "audio_codec": "aac",
                    "audio_bitrate": "128k",
                },
            ],
        },
        "tags": {"campaign": "morning-mug", "locale": "en-GB", "asset_type": "ad", "visibility": "internal"},
        "variants": {
            "aspect": {
                "16x9": {},
                "9x16": {"steps": {"fit": {"width": 720, "height": 1280, "mode": "crop"}}},
                "1x1": {"steps": {"fit": {"width": 720, "height": 720, "mode": "crop"}}},
            },
            "locale": {
                "en-GB": {},
                "de-DE": {
                    "steps": {"text": {"text": "Der Morning Mug – nur 9,99 €"}},
                    "tags": {"locale": "de-DE"},
                },
            },
        },
    }


def brief(assets: dict[str, Path]) -> dict[str, object]:
    """The whole campaign in one file: the master, then every variant made from it."""
    return {"brief": "morning-mug", "jobs": [generated("mug-gen"), campaign(assets)]}


def main() -> int:
    started = time.monotonic()
    spool = DEMO / "spool"
    print("making demo media with FFmpeg (kept between runs) ...", flush=True)
    assets = samples.demo_assets(DEMO / "assets")
    if spool.exists():
        shutil.rmtree(spool)
    subs = DEMO / "submissions"
    subs.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "SPOOL_DIR": str(spool)}
    os.environ.update(env)
    sh(str(BIN / "spool"), "init", str(spool), "--asset-root", str(DEMO / "assets"))

    sim = ProviderSim(token=SIM_TOKEN, work=1.0).start()
    print(f"provider simulator (Replicate API) on {sim.url}", flush=True)
    with open(spool / "spool.toml", "a") as f:
        f.write(provider_table(sim.url))
    # One brief: the master waits for nobody; the six variants wait (waiting/) for it,
    # are frozen to its published bytes when it publishes, and render.
    (subs / "morning-mug.json").write_text(json.dumps(brief(assets), indent=2, ensure_ascii=False))
    sh(str(BIN / "spool"), "submit", str(subs / "morning-mug.json"))
    sh(str(BIN / "spool"), "status")
    os.environ["DEMO_PROVIDER_TOKEN"] = SIM_TOKEN
    try:
        sh(str(BIN / "spoold"), "run", "--spool", str(spool), "--worker", "demo", "--drain")
    finally:
        stats = sim.stats()
        sim.stop()
    print(
        f"\nthe provider saw: {stats.get('create', 0)} create, {stats.get('get', 0)} polls, "
        f"{stats.get('download', 0)} download(s)",
        flush=True,
    )
    gen = sorted(p.name for p in (spool / "attempts" / "mug-gen@1" / "1" / "gen").iterdir())
    print(f"ls attempts/mug-gen@1/1/gen: {' '.join(gen)}", flush=True)
    print(flush=True)
    sh(str(BIN / "spool"), "status")
    print(flush=True)
    sh(str(BIN / "spool"), "show", "mug-gen@1")
    sh(str(BIN / "spool"), "show", "mug-ad@1")  # the parent: every variant and its state
    sh(str(BIN / "spool"), "show", "mug-ad.9x16.de-de@1")
    print("\nmanifests:", flush=True)
    for m in sorted((spool / "manifests").glob("*.json")):
        data = json.loads(m.read_text())
        out = data["output"]
        print(f"  {m.name}: {out['store_path']} ({out['size']} bytes, sha256 {out['sha256'][:16]}...)")
    # The asset library: find the ads by their tags, then fetch one, verified.
    print(flush=True)
    sh(str(BIN / "spool"), "search", "campaign=morning-mug", "asset_type=ad")
    sh(str(BIN / "spool"), "search", "campaign=morning-mug", "aspect=9x16", "locale=de-DE")
    downloads = DEMO / "downloads"
    shutil.rmtree(downloads, ignore_errors=True)
    downloads.mkdir()
    sh(str(BIN / "spool"), "get", "mug-ad.16x9.en-gb", "--to", str(downloads))
    print(f"\ndemo finished in {time.monotonic() - started:.1f} s; look around with: ls -R {spool}")
    complete = len(list((spool / "complete").glob("*.json")))
    return 0 if complete == 1 + 3 * 2 else 1


if __name__ == "__main__":
    sys.exit(main())
