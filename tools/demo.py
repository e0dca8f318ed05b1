"""The demo behind ``tools/demo``: one ad, three variants, a generated clip, a daemon draining them.

Everything is real: the media comes from FFmpeg's lavfi sources, jobs go in
through ``spool submit`` and ``incoming/``, and ``spoold run --drain`` renders,
validates and publishes them. A fourth clip comes from a "hosted video model":
tools/provsim.py, the Replicate-compatible simulator, started here on
127.0.0.1 (no network, no real token), through the same gate, store and
manifest. Run it again and it starts from a fresh spool
(the generated media is kept).
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

from spool import samples

HERE = Path(__file__).resolve().parent.parent
DEMO = HERE / "demo"
BIN = Path(sys.executable).parent
#: The simulator's token: it lives in the daemon's environment only, never in a file.
SIM_TOKEN = "demo-sim-token-4f1c2b"


def provider_table(url: str) -> str:
    """``[providers.sim]``: the simulator, as a real provider would be configured (README)."""
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
    return {
        "name": name,
        "operation": "generate",
        "generate": {
            "provider": "sim",
            "model": "acme/video-1",
            "input": {
                "prompt": "The Morning Mug on a beach at dawn",
                "width": 640,
                "height": 360,
                "duration": 3,
            },
        },
        "output": {"expect": {"video_streams": 1, "width": 640, "height": 360, "duration": 3}},
        "tags": {"campaign": "morning-mug", "locale": "en-GB", "asset_type": "ad", "visibility": "internal"},
    }


def sh(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    print("$ " + " ".join(args), flush=True)
    return subprocess.run(list(args), check=check, text=True)


def variant(name: str, width: int, height: int, assets: dict[str, Path]) -> dict[str, object]:
    return {
        "name": name,
        "sources": {
            "clip": str(assets["clip"]),
            "logo": str(assets["logo"]),
            "music": str(assets["music"]),
        },
        "recipe": {
            "input": "clip",
            "steps": [
                {"op": "trim", "start": 0.5, "duration": 4},
                {
                    "op": "fit",
                    "width": width,
                    "height": height,
                    "mode": "pad" if width >= height else "crop",
                },
                {"op": "fps", "fps": 25},
                # "social": the safe area of the frame's aspect (9:16 keeps clear of the
                # bands the apps' own UI covers); see README "Required layers".
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
                    "size": max(18, height // 18),
                    "box": True,
                    "start": 0.5,
                    "end": 3.5,
                    # Size 71 on the 720 px wide 9:16 frame would cut off the price:
                    # shrink to the largest size whose box fits the safe area.
                    "fit": "shrink",
                    "min_size": 24,
                    "safe_area": "social",
                },
                {
                    "op": "audio",
                    "mode": "mix",
                    "source": "music",
                    "mix_level": 0.6,
                    "loudness": -16,
                },
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
        "tags": {
            "campaign": "morning-mug",
            "locale": "en-GB",
            "asset_type": "ad",
            "visibility": "internal",
        },
        "priority": 0,
    }


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

    variants = [("mug-ad-16x9", 1280, 720), ("mug-ad-9x16", 720, 1280), ("mug-ad-1x1", 720, 720)]
    for name, w, h in variants:
        (subs / f"{name}.json").write_text(json.dumps(variant(name, w, h, assets), indent=2))
    # Two go in through `spool submit`, one the way other tools drop jobs:
    # written under a temporary name in incoming/, then renamed to *.json.
    sh(str(BIN / "spool"), "submit", str(subs / "mug-ad-16x9.json"), str(subs / "mug-ad-9x16.json"))
    tmp = spool / "incoming" / "mug-ad-1x1.json.tmp"
    shutil.copyfile(subs / "mug-ad-1x1.json", tmp)
    os.rename(tmp, spool / "incoming" / "mug-ad-1x1.json")
    print(f"dropped {tmp.with_suffix('').name} into incoming/", flush=True)

    sim = ProviderSim(token=SIM_TOKEN, work=2.0).start()
    print(f"provider simulator (Replicate API) on {sim.url}", flush=True)
    with open(spool / "spool.toml", "a") as f:
        f.write(provider_table(sim.url))
    (subs / "mug-gen.json").write_text(json.dumps(generated("mug-gen"), indent=2))
    sh(str(BIN / "spool"), "submit", str(subs / "mug-gen.json"))
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
    for name in [*(v[0] for v in variants), "mug-gen"]:
        sh(str(BIN / "spool"), "show", f"{name}@1")
    print("\nmanifests:", flush=True)
    for m in sorted((spool / "manifests").glob("*.json")):
        data = json.loads(m.read_text())
        out = data["output"]
        print(f"  {m.name}: {out['store_path']} ({out['size']} bytes, sha256 {out['sha256'][:16]}...)")
    # The asset library: find the ads by their tags, then fetch one, verified.
    print(flush=True)
    sh(str(BIN / "spool"), "search", "campaign=morning-mug", "asset_type=ad")
    downloads = DEMO / "downloads"
    shutil.rmtree(downloads, ignore_errors=True)
    downloads.mkdir()
    sh(str(BIN / "spool"), "get", "mug-ad-16x9", "--to", str(downloads))
    print(f"\ndemo finished in {time.monotonic() - started:.1f} s; look around with: ls -R {spool}")
    complete = len(list((spool / "complete").glob("*.json")))
    return 0 if complete == len(variants) + 1 else 1


if __name__ == "__main__":
    sys.exit(main())
