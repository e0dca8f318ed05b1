"""The demo behind ``tools/demo``: one ad, three variants, a daemon draining them.

Everything is real: the media comes from FFmpeg's lavfi sources, jobs go in
through ``spool submit`` and ``incoming/``, and ``spoold run --drain`` renders,
validates and publishes them. Run it again and it starts from a fresh spool
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

from spool import samples

HERE = Path(__file__).resolve().parent.parent
DEMO = HERE / "demo"
BIN = Path(sys.executable).parent


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

    sh(str(BIN / "spoold"), "run", "--spool", str(spool), "--worker", "demo", "--drain")
    print(flush=True)
    sh(str(BIN / "spool"), "status")
    print(flush=True)
    for name, _, _ in variants:
        sh(str(BIN / "spool"), "show", f"{name}@1")
    print("\nmanifests:", flush=True)
    for m in sorted((spool / "manifests").glob("*.json")):
        data = json.loads(m.read_text())
        out = data["output"]
        print(f"  {m.name}: {out['store_path']} ({out['size']} bytes, sha256 {out['sha256'][:16]}...)")
    print(f"\ndemo finished in {time.monotonic() - started:.1f} s; look around with: ls -R {spool}")
    complete = len(list((spool / "complete").glob("*.json")))
    return 0 if complete == len(variants) else 1


if __name__ == "__main__":
    sys.exit(main())
