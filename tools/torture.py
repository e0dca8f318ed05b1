"""The kill -9 torture run: many short real renders, daemons and FFmpeg killed at random.

    tools/torture [--jobs N] [--kills K] [--workers W] [--seed S] [--keep DIR]
                  [--generate G] [--depends D] [--mounts A,B,... [--export DIR]]
                  [--migrate M [--migrate-kills K]]

It makes a spool with tiny real media, submits N jobs (most render, some are
meant to fail validation), starts W daemons and then, K times, kills with
SIGKILL either a whole daemon (its FFmpeg dies with it) or just an FFmpeg
child (with several workers, only while another one runs: a host-class
failure then moves the job on instead of failing it for good), at random moments; some
daemon lives are started with
``SPOOL_CRASH_AT`` so they die right after a chosen step. Killed daemons are
restarted under the same identity. Then every daemon is restarted to drain,
``spool recover`` runs for good measure, and the spool is checked by
``spool fsck`` and by tools/invariants.py, which shares no code with spool.

With ``--generate G``, G generation jobs are mixed in, against tools/provsim.py
run in this process (``[providers.sim]`` in the spool): the same kills hit
them between their durable states, and a share of them (``--provider-faults``,
default one in two) meet a provider fault chosen at random: a create that made
the job and answered 502, a create reply stalled past the request timeout,
429s and 5xx on polls, a trickling download, a download refused once. The run
also checks, from the simulator's side, that no job got more predictions than
it had attempts (a restart or recovery never sends a second create for one
attempt), and that every published generation is its own job's prediction
(the bytes the provider made for that job's prompt, by the selected attempt).

With ``--depends D``, D groups of jobs that depend on jobs are mixed in, each submitted as
one brief (``spool submit``): chains of 3 (a render, one from its output, one from that),
fan-outs of 12 variants (3 aspects x 4 locales) of one master, and upstreams meant to fail
with a chain of 2 waiting on them; while the kills run, some chain heads are revised
(``spool revise``), so a dependent follows the newer revision or stays frozen to the one it
resolved. At the end each is judged by where its upstreams ended (a kill may still fail a
render for good): a dependent of published upstreams complete (or failed itself), frozen to their
exact store objects (tools/invariants.py, invariant 12); a dependent of a failed upstream
held with its hold record; one below a held job still waiting; nothing else in ``waiting/``.
Across mounts (``--mounts``) the dependents are settled by daemons on different mounts.

With ``--migrate M`` the run is of the old layout and then of its upgrade: the spool is
made format 1 (no ``FORMAT`` file) and every daemon life writes format 1
(``SPOOL_WRITE_FORMAT=1``, what the old code does), with M no-op jobs (some at a second
revision) mixed in so the library holds enough versions for ``spool migrate`` to take a
while. After the drain and the checks, ``spool migrate`` itself is tortured: on copies of
the format 1 tree (``cp -a``) it is SIGKILLed at its crash points (``mid_migrate``,
``mid_group_sync``) and at random moments of a whole run's duration, and after every kill
the half-migrated tree must read exactly as before (every search hit, each version's
facts, each object and name resolved: no false hit, no miss) and pass tools/invariants.py;
then it is run to completion, and the tree must say format 2, read the same, pass fsck
and the invariants, and a further run must find nothing to do. Last, the run's own spool
goes the same way through a chain of kills (each run resumes the previous one's work).

It prints one line of figures and exits 0 only if no job was lost, none was
published twice, no partial file sits at a final path and both checks are
clean. ``--json`` prints the figures as JSON instead.

Across mounts (``--mounts A,B``: the same folder seen through two mounts of one
export, as tools/multimount makes them), the spool is made in that folder and
worker k runs on mount k modulo the number of mounts, so every claim, heartbeat
and recovery crosses a network filesystem client. ``--export DIR`` is the
folder on the file server's side: the spool is set up and checked there (the
ground truth, free of client caches); without it, through the first mount.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import invariants

from spool.core import settings
from spool.core.errors import SpoolError
from spool.core.faults import OTHER_POINTS, POINTS
from spool.disk.formats import ENV as FORMAT_ENV
from spool.media import samples
from spool.queue import health
from spool.queue.workers import worker_id

BIN = Path(sys.executable).parent
#: A run with at least this many daemon kills must have recovered something (see "hollow").
HOLLOW_KILLS = 10
SPOOL = str(BIN / "spool")
TAGS = {"campaign": "torture", "locale": "en", "asset_type": "test", "visibility": "internal"}


def job(i: int, assets: Path, rng: random.Random) -> dict[str, object]:
    steps: list[dict[str, object]] = [
        {"op": "trim", "start": round(rng.uniform(0, 0.5), 2), "duration": round(rng.uniform(0.4, 1.2), 2)},
        {
            "op": "fit",
            "width": rng.choice([160, 192, 240]),
            "height": rng.choice([90, 108, 136]),
            "mode": rng.choice(["pad", "crop"]),
        },
    ]
    sources = {"clip": str(assets / "clip.mp4")}
    if rng.random() < 0.5:
        steps.append({"op": "overlay", "source": "logo", "scale": 0.2})
        sources["logo"] = str(assets / "logo.png")
    if rng.random() < 0.5:
        # "shrink": a label must fit the safe area of the smallest frames drawn here (issue 15)
        text = f"take {i}: 50% off — 'now'"
        steps.append({"op": "text", "text": text, "size": 12, "box": True, "fit": "shrink"})
    if rng.random() < 0.3:
        steps.append({"op": "audio", "mode": "mix", "source": "music"})
        sources["music"] = str(assets / "music.m4a")
    steps.append({"op": "encode", "preset": "ultrafast"})
    sub: dict[str, object] = {
        "name": f"t{i:04d}",
        "sources": sources,
        "recipe": {"input": "clip", "steps": steps},
        "tags": TAGS,
    }
    if rng.random() < 0.08:
        sub["output"] = {"expect": {"width": 7}}  # meant to fail validation: a located error
    return sub


class Worker:
    def __init__(self, spool: Path, name: str, logdir: Path, env: dict[str, str] | None = None) -> None:
        self.spool, self.name, self.logdir = spool, name, logdir
        self.env = env or {}
        self.proc: subprocess.Popen[bytes] | None = None
        self.lives = 0
        self.crash_at: str | None = None

    def start(self, crash_at: str | None = None, drain: bool = False) -> None:
        env = {**os.environ, **self.env}
        env.pop("SPOOL_CRASH_AT", None)
        if crash_at:
            env["SPOOL_CRASH_AT"] = crash_at
        args = [str(BIN / "spoold"), "run", "--spool", str(self.spool), "--worker", self.name]
        if drain:
            args.append("--drain")
        log = open(self.logdir / f"{self.name}.log", "ab")  # noqa: SIM115 - owned by the child
        self.proc = subprocess.Popen(
            args, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        log.close()
        self.lives += 1
        self.crash_at = crash_at

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()

    def ffmpeg_children(self) -> list[int]:
        if not self.alive():
            return []
        assert self.proc is not None
        out = []
        for d in Path("/proc").iterdir():
            if not d.name.isdigit():
                continue
            try:
                stat = (d / "stat").read_text()
                comm = stat[stat.index("(") + 1 : stat.rindex(")")]
                ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
            except (OSError, ValueError):
                continue
            if ppid == self.proc.pid and comm == "ffmpeg":
                out.append(int(d.name))
        return out


@dataclass(frozen=True)
class Layout:
    base: Path  # the run's scratch folder: assets, logs (and the spool unless --mounts)
    spool: Path  # the spool as setup and checks see it (the server's side across mounts)
    views: list[Path]  # the spool's path as each worker sees it
    assets: Path
    logs: Path


#: Seconds a client mount's metadata caches may lag the other mounts (checks wait them out).
CLIENT_CACHE_SETTLE = 3.0
#: The environment variable the spool's ``[providers.sim]`` reads its token from.
GEN_TOKEN_ENV = "SPOOL_TORTURE_GEN_TOKEN"


def run(args: argparse.Namespace) -> dict[str, object]:
    if not args.generate:
        return _run(args, None)
    from provsim import ProviderSim

    token = f"torture-{os.getpid()}-{random.Random(args.seed).getrandbits(64):016x}"
    os.environ[GEN_TOKEN_ENV] = token  # the daemons inherit it; it is never written to the spool
    with ProviderSim(token=token, work=1.0) as sim:
        return _run(args, sim)


def _run(args: argparse.Namespace, sim: Any) -> dict[str, object]:
    rng = random.Random(args.seed)
    lay = _layout(args)
    _make_spool(lay, args.max_attempts, old_format=bool(args.migrate))
    ids = _submit(lay, args.jobs, rng)
    ids += _submit_noops(lay, args.migrate)
    gen_ids = (
        _submit_generations(lay, args.generate, sim, rng, args.provider_faults) if sim is not None else []
    )
    ids += gen_ids
    groups = _submit_depends(lay, args.depends, rng) if args.depends else []
    started = time.monotonic()
    old = {FORMAT_ENV: "1"} if args.migrate else {}  # the old code writes format 1
    workers = [Worker(lay.views[k % len(lay.views)], f"w{k}", lay.logs, old) for k in range(args.workers)]
    for w in workers:
        w.start()
    revised = _revise_heads(lay, groups, rng)
    kills, crash_points, damaged = _kill_at_random(workers, lay.spool, rng, args)
    _drain(workers, lay.views[0], args.timeout)
    if args.mounts and not args.export:
        # Checked through a client mount (JuiceFS has no server-side folder): let its entry and
        # attribute caches (JuiceFS: 1 s by default) expire, so a name another mount renamed
        # away a moment ago is not seen in two folders.
        time.sleep(CLIENT_CACHE_SETTLE)
    adopted = _adopt_torture(lay, args.adopt, rng, args) if args.adopt else {}
    wall = time.monotonic() - started
    found = _check(lay.spool, ids)
    stray = [n for n in damaged if not (lay.spool / "quarantine" / n).exists()]
    figures: dict[str, object] = {
        "jobs": args.jobs,
        "complete": found["complete"],
        "failed": found["failed"],
        "kills": sum(kills.values()),
        "kills_daemon": kills["daemon"],
        "kills_ffmpeg": kills["ffmpeg"],
        "daemon_lives": sum(w.lives for w in workers),
        "crash_points_hit": dict(sorted(crash_points.items())),
        "damaged_dropped": len(damaged),
        "damaged_not_quarantined": len(stray),
        "recoveries": found["recoveries"],
        # Kills that recovered nothing never found a daemon mid-job: the run proved nothing
        # about recovery (it went so at 100 jobs while acceptance batches outlived the kills).
        "hollow": kills["daemon"] >= HOLLOW_KILLS and not found["recoveries"],
        "journal_lines_rebuilt": found["journal_lines_rebuilt"],
        "lost": len(found["lost"]),
        "double_published": len(found["double"]),
        "partial_at_final": len(found["partial"]),
        "fsck_problems": len(found["fsck"]),
        "independent_problems": len(found["independent"]),
        "wall_seconds": round(wall, 1),
        "spool": str(lay.spool),
        "details": {k: found[k][:10] for k in ("lost", "double", "fsck", "independent")},
    }
    figures["mounts"] = [str(v) for v in lay.views] if args.mounts else []
    if groups:
        figures |= _depends_figures(lay.spool, groups, revised)
        found["lost"] += figures.pop("_lost")  # type: ignore[operator]
        figures["lost"] = len(found["lost"])
        figures["details"]["lost"] = found["lost"][:10]  # type: ignore[index]
    if sim is not None:
        figures |= _generation_figures(lay.spool, gen_ids, sim)
    figures["jobs"] = len(ids)
    figures |= adopted
    if args.migrate and not any(found[k] for k in ("lost", "double", "partial", "fsck", "independent")):
        figures |= _migrate_torture(lay, args, rng)
    clean = not any(found[k] for k in ("lost", "double", "partial", "fsck", "independent"))
    clean = clean and not adopted.get("adopt_wrong")
    clean = clean and not figures.get("generation_creates_over_attempts")
    clean = clean and not figures.get("generation_wrong_asset")
    clean = clean and not figures.get("depends_wrong")
    clean = clean and not figures.get("migrate_wrong")
    if not args.keep and clean:
        shutil.rmtree(lay.base, ignore_errors=True)
        if args.mounts:
            shutil.rmtree(lay.spool, ignore_errors=True)
        figures["spool"] = "(removed)"
    return figures


def _layout(args: argparse.Namespace) -> Layout:
    """Where the run lives; across mounts the spool is a fresh folder in the shared export."""
    base = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="spool-torture-"))
    base.mkdir(parents=True, exist_ok=True)
    spool, assets, logs = base / "spool", base / "assets", base / "logs"
    for d in (assets, logs):
        d.mkdir(exist_ok=True)
    views = [spool]
    if args.mounts:
        mounts = [Path(m).absolute() for m in args.mounts.split(",") if m]
        name = f"spool-torture-{os.getpid()}"
        spool = (Path(args.export).absolute() if args.export else mounts[0]) / name
        views = [m / name for m in mounts]
    return Layout(base, spool, views, assets, logs)


def _make_spool(lay: Layout, max_attempts: int, *, old_format: bool = False) -> None:
    """Tiny real media, ``spool init``, and fast settings: quick polls, short backoff
    (``old_format``: a format 1 tree that allows no-op jobs, as ``--migrate`` needs)."""
    if lay.spool.exists():
        shutil.rmtree(lay.spool)
    samples.clip(lay.assets / "clip.mp4", seconds=2.0, size="320x240")
    samples.logo(lay.assets / "logo.png", size="80x40")
    samples.music(lay.assets / "music.m4a", seconds=3.0)
    subprocess.run(
        [SPOOL, "init", str(lay.spool), "--asset-root", str(lay.assets)],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    settings.write(
        lay.spool / "spool.toml",
        {
            "daemon": {"poll_interval": 0.2, "heartbeat_interval": 0.5},
            "limits": {"max_attempts": max_attempts},
            # mount_lag: the mounts a torture runs on (sshfs --cache low, JuiceFS by default,
            # LazyFS) show another mount's change within 1 s
            "recovery": {"backoff": 0.2, "backoff_max": 2.0, "mount_lag": 3.0},
        }
        | ({"acceptance": {"allow_noop": True}} if old_format else {}),
    )
    if old_format:
        (lay.spool / "FORMAT").unlink()  # a spool made before formats were recorded: format 1


def _submit(lay: Layout, jobs: int, rng: random.Random) -> list[str]:
    """Drop ``jobs`` submissions into ``incoming/`` (temp name, then rename); their job ids."""
    ids = []
    for i in range(jobs):
        sub = job(i, lay.assets, rng)
        tmp = lay.spool / "incoming" / f"t{i:04d}.json.tmp"
        tmp.write_text(json.dumps(sub))
        os.rename(tmp, lay.spool / "incoming" / f"t{i:04d}.json")
        ids.append(f"t{i:04d}@1")
    return ids


def _submit_noops(lay: Layout, n: int) -> list[str]:
    """``n`` no-op jobs for the library ``spool migrate`` converts (``--migrate``): names
    ``m<i>`` with tags in five campaigns, every seventh name also at revision 2 (so a
    name's current version is not its only one). Their job IDs."""
    ids = []
    for i in range(n):
        revs = (1, 2) if i % 7 == 3 else (1,)
        for rev in revs:
            sub = {
                "name": f"m{i:04d}",
                "revision": rev,
                "operation": "noop",
                "tags": TAGS | {"campaign": f"mig{i % 5}", "locale": ("en", "fr")[rev - 1]},
            }
            tmp = lay.spool / "incoming" / f"m{i:04d}-{rev}.json.tmp"
            tmp.write_text(json.dumps(sub))
            os.rename(tmp, lay.spool / "incoming" / f"m{i:04d}-{rev}.json")
            ids.append(f"m{i:04d}@{rev}")
    return ids


#: Provider faults a torture generation may meet (``--provider-faults``), in its prompt.
PROVIDER_FAULTS = (
    "#fault=create_5xx_after",  # made the job, then answered 502: looked up and adopted
    "#fault=create_timeout:3",  # the reply stalled past request_timeout: looked up and adopted
    "#fault=ratelimit:2:0.3",  # the first polls answer 429 with Retry-After
    "#fault=get_5xx:2",  # the first polls answer 500
    "#fault=trickle:4096:0.05",  # a slow download (above download.min_rate)
    "#fault=file_401:1",  # the first download is refused: fetched again, never generated again
)


def _submit_generations(lay: Layout, n: int, sim: Any, rng: random.Random, share: float) -> list[str]:
    """Configure the simulator as ``[providers.sim]`` and drop ``n`` generation jobs, a
    ``share`` of them with a provider fault."""
    provider_settings(lay.spool, sim)
    ids = []
    for i in range(n):
        fault = rng.choice(PROVIDER_FAULTS) if rng.random() < share else ""
        tmp = lay.spool / "incoming" / f"g{i:04d}.json.tmp"
        tmp.write_text(json.dumps(generation(i, fault)))
        os.rename(tmp, lay.spool / "incoming" / f"g{i:04d}.json")
        ids.append(f"g{i:04d}@1")
    return ids


def generation(i: int, fault: str = "") -> dict[str, object]:
    """Generation submission ``i`` (job ``g<i>@1``) against ``[providers.sim]``, meeting
    ``fault`` (a ``#fault=`` word of tools/provsim.py) if one is given."""
    prompt = f"torture {i} {fault}" if fault else f"torture {i}"
    return {
        "name": f"g{i:04d}",
        "operation": "generate",
        "generate": {"provider": "sim", "model": "acme/video-1", "input": {"prompt": prompt}},
        "output": {"expect": {"width": 320, "height": 180}},
        "tags": TAGS,
    }


def provider_settings(spool: Path, sim: Any) -> None:
    """The simulator as ``[providers.sim]`` of the spool, with quick polls."""
    settings.write(
        spool / "spool.toml",
        {
            "providers": {
                "sim": {
                    "kind": "replicate",
                    "base_url": sim.url,
                    "token_env": GEN_TOKEN_ENV,
                    "request_timeout": 2.0,
                    "in_flight": 8,
                    "deadline": 60.0,
                    "listing_settle": 1.0,
                    "polling": {"first": 0.2, "base": 0.2, "ceiling": 0.5, "floor": 0.05},
                    "retries": {"find": {"initial": 0.5, "ceiling": 2.0}, "download": {"initial": 0.3}},
                }
            }
        },
    )


def _made_by(spool: Path, job_id: str, attempt: int) -> int:
    """The attempt whose provider job a published attempt's bytes are: itself, or the one
    whose verified leftover a recovery published (its ``recovery-N.json`` names it)."""
    if (spool / "attempts" / job_id / str(attempt) / "gen").is_dir():
        return attempt
    for rec in (spool / "attempts" / job_id).glob("recovery-*.json"):
        try:
            r = json.loads(rec.read_text())
        except (OSError, ValueError):
            continue
        if r.get("decision") == "accept-candidate":
            return int(r["evidence"]["attempt"])
    return attempt


def _heir(intent: Path) -> bool:
    """Whether an attempt's intent record names a provider job it inherited."""
    try:
        return bool(json.loads(intent.read_text()).get("provider_job_id"))
    except (OSError, ValueError):
        return False


def _generation_figures(spool: Path, ids: list[str], sim: Any) -> dict[str, object]:
    """From the simulator's side: predictions made per job against its attempts that began
    (an intent on disk; one attempt never makes two), and whether each published
    generation is its own job's prediction."""
    made = list(sim.state.jobs.values())  # the server thread may still add to it
    prompt_of = {}
    for j in ids:
        try:
            prompt_of[j] = json.loads((spool / "attempts" / j / "job.json").read_text())["generate"]["input"][
                "prompt"
            ]
        except (OSError, ValueError, KeyError):
            prompt_of[j] = None
    per_job = Counter(p.input.get("prompt") for p in made if not p.hidden)
    creates = sum(per_job[p] for p in prompt_of.values() if p is not None)
    intents = {j: list((spool / "attempts" / j).glob("*/gen/1-submitted.json")) for j in ids}
    attempts = {j: len(found) for j, found in intents.items()}
    # An heir whose intent names the provider job it took over may never create: only the
    # others may each have made one prediction.
    creators = {j: sum(1 for p in found if not _heir(p)) for j, found in intents.items()}
    over = sorted(j for j in ids if prompt_of[j] is not None and per_job[prompt_of[j]] > creators[j])
    states = Counter(_state(spool, j) for j in ids)
    wrong = []
    by_id = {p.id: p for p in made}
    for j in ids:
        if _state(spool, j) != "complete":
            continue
        try:
            m = json.loads((spool / "manifests" / f"{j}.json").read_text())
            made_by = _made_by(spool, j, m["attempt"])
            gen = json.loads(
                (spool / "attempts" / j / str(made_by) / "gen" / "2-generating.json").read_text()
            )
        except (OSError, ValueError, KeyError):
            wrong.append(f"{j}: no readable manifest or generating record")
            continue
        pj = by_id.get(gen.get("provider_job_id"))
        if (
            pj is None
            or pj.input.get("prompt") != prompt_of[j]
            or sim.output_sha256(pj.id) != m["output"]["sha256"]
        ):
            wrong.append(f"{j}: published {m['output']['sha256'][:12]}, not its own prediction")
    why: Counter[str] = Counter()  # what ended attempts (a located failure's retry creates anew)
    for f in (f for j in ids for f in (spool / "attempts" / j).glob("*/failure.json")):
        try:
            why[json.loads(f.read_text()).get("property", "?")] += 1
        except (OSError, ValueError):
            why["(unreadable)"] += 1
    return {
        "generation_attempt_failures": dict(sorted(why.items())),
        # How many generation jobs got 0, 1, 2... predictions (a recovery adopts, never re-creates).
        "generation_creates_per_job": dict(sorted(Counter(per_job[p] for p in prompt_of.values()).items())),
        "generations": len(ids),
        "generation_complete": states["complete"],
        "generation_failed": states["failed"],
        "generation_attempts": sum(attempts.values()),
        "generation_creates": creates,
        "generation_creates_over_attempts": len(over),
        "generation_wrong_asset": len(wrong),
        "generation_details": (over + wrong)[:10],
    }


def _dep_render(name: str, clip: object, lay: Layout, rng: random.Random, **over: object) -> dict[str, Any]:
    """A tiny render whose clip may be another job's output (``{"job": NAME}``)."""
    sub: dict[str, Any] = {
        "name": name,
        "sources": {"clip": clip},
        "recipe": {
            "input": "clip",
            "steps": [
                {"op": "trim", "duration": round(rng.uniform(0.3, 0.6), 2)},
                {"op": "fit", "width": 160, "height": 90, "mode": rng.choice(["pad", "crop"])},
                {"op": "encode", "preset": "ultrafast"},
            ],
        },
        "tags": TAGS,
    }
    sub.update(over)
    return sub


@dataclass
class Group:
    """One brief of jobs that depend on jobs: its kind, the job IDs and what each must end as."""

    kind: str  # chain, fanout, failing
    expect: dict[str, str]  # job ID -> "failed" (meant to fail its gate), else "" (see _end_ok)
    head: str = ""  # a chain's first job (revised mid-run, maybe)


#: A fan-out's matrix: 3 aspects x 4 locales = 12 variants.
ASPECTS = {
    "16x9": {},
    "9x16": {"steps": {"fit": {"width": 90, "height": 160}}},
    "1x1": {"steps": {"fit": {"width": 96, "height": 96}}},
}
LOCALES = ("en-GB", "de-DE", "fr-FR", "es-ES")


def _submit_depends(lay: Layout, n: int, rng: random.Random) -> list[Group]:
    """``n`` briefs, in turn a chain of 3, a fan-out of 12 on a master, and a failing
    upstream with a chain of 2 on it; each through ``spool submit`` (accepted whole)."""
    groups = []
    clip = str(lay.assets / "clip.mp4")
    for i in range(n):
        kind = ("chain", "fanout", "failing")[i % 3]
        p = f"d{i:03d}"
        if kind == "chain":
            jobs = [
                _dep_render(f"{p}-a", clip, lay, rng),
                _dep_render(f"{p}-b", {"job": f"{p}-a"}, lay, rng),
                _dep_render(f"{p}-c", {"job": f"{p}-b"}, lay, rng),
            ]
            g = Group(kind, {f"{p}-{x}@1": "" for x in "abc"}, head=f"{p}-a@1")
        elif kind == "fanout":
            matrix = {"aspect": ASPECTS, "locale": {loc: {"tags": {"locale": loc}} for loc in LOCALES}}
            jobs = [
                _dep_render(f"{p}-m", clip, lay, rng),
                _dep_render(f"{p}-v", {"job": f"{p}-m"}, lay, rng, variants=matrix),
            ]
            variants = [f"{p}-v.{a}.{loc.lower()}@1" for a in ASPECTS for loc in LOCALES]
            g = Group(kind, {f"{p}-m@1": "", **dict.fromkeys(variants, "")})
        else:
            jobs = [
                _dep_render(f"{p}-f", clip, lay, rng, output={"expect": {"width": 7}}),  # fails its gate
                _dep_render(f"{p}-g", {"job": f"{p}-f"}, lay, rng),
                _dep_render(f"{p}-h", {"job": f"{p}-g"}, lay, rng),
            ]
            g = Group(kind, {f"{p}-f@1": "failed", f"{p}-g@1": "", f"{p}-h@1": ""})
        path = lay.base / f"{p}.brief.json"
        path.write_text(json.dumps({"brief": p, "jobs": jobs}))
        subprocess.run(
            [SPOOL, "submit", str(path), "--spool", str(lay.views[0])], check=True, stdout=subprocess.DEVNULL
        )
        groups.append(g)
    return groups


def _revise_heads(lay: Layout, groups: list[Group], rng: random.Random) -> list[str]:
    """Half the chains' heads get a new revision while the daemons run (another trim): their
    dependents follow it if they still wait, or stay frozen to the revision they resolved."""
    made = []
    for g in groups:
        if g.kind != "chain" or rng.random() < 0.5:
            continue
        time.sleep(rng.uniform(0.0, 0.3))
        spec = lay.base / f"{g.head}.recipe.json"
        recipe = {
            "input": "clip",
            "steps": [
                {"op": "trim", "duration": 0.7},
                {"op": "fit", "width": 160, "height": 90},
                {"op": "encode", "preset": "ultrafast"},
            ],
        }
        spec.write_text(json.dumps(recipe))
        r = subprocess.run(
            [SPOOL, "revise", g.head, "--spec", str(spec), "--spool", str(lay.views[0]), "--json"],
            capture_output=True, text=True,
        )  # fmt: skip
        if r.returncode == 0:
            new = g.head.replace("@1", "@2")
            g.expect[new] = ""
            made.append(new)
    return made


def _depends_figures(spool: Path, groups: list[Group], revised: list[str]) -> dict[str, object]:
    """Each dependency group's end, judged from where its upstreams ended (the kills may fail
    any render for good: FFmpeg killed under a worker with no other alive to take the job):
    a job whose upstreams all published ended complete or failed, never held or waiting; one
    whose upstream failed is held with its record, never failed or rendered; one whose
    upstream is held or waiting still waits. That each is frozen to its upstream's bytes is
    tools/invariants.py's invariant 12."""
    wrong: list[str] = []
    lost: list[str] = []
    ends: Counter[str] = Counter()
    for g in groups:
        for jid, meant in g.expect.items():
            got = _state(spool, jid)
            ends[got] += 1
            if got == "missing":
                lost.append(jid)
                continue
            ok, why = _end_ok(spool, g, jid, got, meant)
            if not ok:
                wrong.append(f"{jid}: {got}, {why}")
            if got == "held" and not (spool / "deps" / "_held" / f"{jid}.json").exists():
                wrong.append(f"{jid}: held without a hold record")
    return {
        "depends_groups": len(groups),
        "depends_jobs": sum(len(g.expect) for g in groups),
        "depends_revised": len(revised),
        "depends_ends": dict(sorted(ends.items())),
        "depends_wrong": wrong[:10],
        "_lost": lost,
    }


def _end_ok(spool: Path, g: Group, jid: str, got: str, meant: str) -> tuple[bool, str]:
    """Whether ``got`` is a right end for ``jid`` given where its upstreams ended."""
    if meant == "failed":
        return got == "failed", "meant to fail its gate"
    path = next(iter(spool.glob(f"*/{jid}.json")), None) or next(
        iter(spool.glob(f"running/*/{jid}.json")), None
    )
    job = json.loads(path.read_text()) if path is not None else {}
    ups = []
    for u in job.get("upstreams") or []:
        target = u.get("job") or max(
            (j for j in g.expect if j.rpartition("@")[0] == u["ref"]), key=lambda j: int(j.rpartition("@")[2])
        )
        ups.append(_state(spool, target))
    if not ups or all(s == "complete" for s in ups):
        return got in ("complete", "failed"), "its upstreams published (or it has none)"
    if any(s == "failed" for s in ups):
        return got == "held", f"its upstream failed ({ups})"
    if all(s in ("complete", "held", "waiting") for s in ups):
        return got == "waiting", f"its upstream waits or is held ({ups})"
    return False, f"upstreams left in {ups} after the drain"


def _running(w: Worker, spool: Path) -> bool:
    """Whether worker ``w`` is up and says so in its record (state running, its current pid)."""
    if not w.alive() or w.proc is None:
        return False
    try:
        rec = json.loads((spool / "workers" / f"{worker_id(w.name)}.json").read_bytes())
    except (OSError, ValueError):
        return False
    return rec.get("pid") == w.proc.pid and rec.get("state") == "running"


def _ffmpeg_may_die(workers: list[Worker], victim: Worker, spool: Path) -> bool:
    """Whether to kill one of ``victim``'s FFmpeg children now: with a single worker always,
    otherwise only while another worker runs. FFmpeg killed under a worker is a host-class
    failure: the job moves on to another running worker, and fails for good when there is
    none (:mod:`spool.queue.blocklist`). Killed while another runs, FFmpeg's deaths exercise
    the move (a job rendered elsewhere, from a partial output left behind) instead of
    failing upstreams at random, which left whole dependency groups held and the checks of
    their release with nothing to check."""
    others = [w for w in workers if w is not victim]
    return not others or any(_running(w, spool) for w in others)


def _kill_at_random(
    workers: list[Worker], spool: Path, rng: random.Random, args: argparse.Namespace
) -> tuple[Counter[str], Counter[str], list[str]]:
    """``args.kills`` SIGKILLs of a daemon or one of its FFmpeg children, at random moments;
    dead daemons come back (some with a crash point); now and then a damaged job file
    appears in pending/. Returns kills, crash points hit and the damaged files dropped."""
    kills: Counter[str] = Counter()
    crash_points: Counter[str] = Counter()
    damaged: list[str] = []
    while sum(kills.values()) < args.kills:
        time.sleep(rng.uniform(0.05, args.max_gap))
        if _remaining(spool) == 0:
            break  # everything finished before the kills ran out
        if rng.random() < 0.15:
            damaged.append(_drop_damaged(spool, len(damaged), rng))
        for w in workers:
            if not w.alive() and w.crash_at and w.proc is not None and w.proc.returncode == -signal.SIGKILL:
                crash_points[w.crash_at] += 1  # it died at its crash point
                w.crash_at = None
        victim = rng.choice(workers)
        if not victim.alive():
            victim.start(crash_at=_maybe_point(rng, args))
            continue
        kids = victim.ffmpeg_children()
        if kids and rng.random() < 0.3 and _ffmpeg_may_die(workers, victim, spool):
            try:
                os.kill(rng.choice(kids), signal.SIGKILL)
                kills["ffmpeg"] += 1
            except ProcessLookupError:
                pass
            continue
        victim.kill()
        kills["daemon"] += 1
        if rng.random() < 0.8:  # most come back at once; some stay down for a while
            victim.start(crash_at=_maybe_point(rng, args))
    return kills, crash_points, damaged


def _drain(workers: list[Worker], view: Path, timeout: float) -> None:
    """Every worker comes back without crash points and runs until nothing is left; then
    ``spool recover`` for good measure. A worker that quarantined itself (FFmpeg killed
    under it three times in a row looks like a broken host) is released first, as an
    operator would after the storm."""
    for w in workers:
        if w.alive():
            w.kill()
    from spool.disk.tree import Tree

    tree = Tree.at(view)
    for q in tree.workers.glob("*.quarantined"):
        health.release(tree, q.name[: -len(".quarantined")])
    for w in workers:
        w.start(drain=True)
    deadline = time.monotonic() + timeout
    for w in workers:
        assert w.proc is not None
        try:
            w.proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            w.kill()
    subprocess.run([SPOOL, "recover", "--spool", str(view)], stdout=subprocess.DEVNULL, check=False)


#: Where ``spool library adopt`` may die: between acceptance and claim, and on the publish path.
ADOPT_POINTS = (
    "mid_adopt",
    "after_attempt_dir",
    "after_store_link",
    "after_result",
    "after_manifest",
    "mid_index",
    "after_index",
    "before_complete_rename",
)


def _adopt_torture(lay: Layout, n: int, rng: random.Random, args: argparse.Namespace) -> dict[str, Any]:
    """``spool library adopt`` of ``n`` clips (made by one FFmpeg run) killed again and again,
    at its crash points or by SIGKILL at a random moment, then run to the end: every file
    must be one asset at revision 1 with its own bytes, and a last run must adopt nothing."""
    folder = lay.assets / "library"
    flat = lay.base / "segments"
    flat.mkdir(exist_ok=True)
    subprocess.run(
        ["ffmpeg", "-v", "error", "-nostdin", "-y", "-f", "lavfi", "-i", "testsrc=size=32x18:rate=10",
         "-t", f"{n * 0.2 + 0.1:.1f}", "-c:v", "libx264", "-preset", "ultrafast", "-g", "2",
         "-keyint_min", "2", "-sc_threshold", "0", "-f", "segment", "-segment_time", "0.2",
         "-reset_timestamps", "1", "-segment_format", "mp4", str(flat / "c%05d.mp4")],
        check=True,
    )  # fmt: skip
    tags = lay.base / "adopt-tags.csv"
    rows = ["path,campaign,locale,asset_type,visibility"]
    for i, seg in enumerate(sorted(flat.iterdir())[:n]):
        rel = f"c{i % 5}/clip-{i:05d}.mp4"
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        os.rename(seg, folder / rel)
        rows.append(f"{rel},torture,en,test,internal")
    tags.write_text("\n".join(rows) + "\n")
    argv = [
        SPOOL,
        "library",
        "adopt",
        str(folder),
        "--tags",
        str(tags),
        "--spool",
        str(lay.views[0]),
        "--json",
    ]
    kills: Counter[str] = Counter()
    for i in range(max(3, args.kills // 4)):
        env = {k: v for k, v in os.environ.items() if k != "SPOOL_CRASH_AT"}
        # The first run always dies at a crash point (every point is on the path of a run
        # that has files to adopt): a random timer alone can outlast a fast adopt of a few
        # clips, and a run that never dies proves nothing about resuming.
        point = rng.choice(ADOPT_POINTS) if i == 0 or rng.random() < 0.5 else None
        if point:
            env["SPOOL_CRASH_AT"] = point
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
        try:
            proc.wait(timeout=None if point else rng.uniform(0.3, args.max_gap + 0.5))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.returncode == -signal.SIGKILL:
            kills[point or "random"] += 1
    final = subprocess.run(argv, capture_output=True, text=True, timeout=args.timeout)
    again = subprocess.run(argv, capture_output=True, text=True, timeout=args.timeout)
    items = json.loads(final.stdout)["items"] if final.stdout.strip() else []
    counts = json.loads(again.stdout)["counts"] if again.stdout.strip() else {}
    wrong = [it["path"] for it in items if it["outcome"] not in ("adopted", "already", "resumed")]
    wrong += [it["path"] for it in items if not (it["job"] or "").endswith("@1")]
    if counts != {"already": n}:
        wrong.append(f"second run: {counts}")
    return {
        "adopt_files": n,
        "adopt_kills": sum(kills.values()),
        "adopt_kills_at": dict(sorted(kills.items())),
        "adopt_complete": sum(1 for it in items if it["outcome"] in ("adopted", "already", "resumed")),
        "adopt_wrong": wrong[:10],
    }


def _check(spool: Path, ids: list[str]) -> dict[str, Any]:
    """What the run left: job states, jobs lost or published twice, partial files at final
    paths, and the problems ``spool fsck`` and tools/invariants.py find."""
    fsck_problems = _fsck(spool, repair=False)
    # A daemon killed between a transition and its journal line loses the line (SPEC 11.9):
    # fsck rebuilds it from the tree. Only such lines are mended here; anything else stays a problem.
    lost_lines = [p for p in fsck_problems if str(p.get("path")).startswith("events/")]
    if lost_lines and len(lost_lines) == len(fsck_problems):
        _fsck(spool, repair=True)
        fsck_problems = _fsck(spool, repair=False)
    independent = invariants.check(spool)
    states = {jid: _state(spool, jid) for jid in ids}
    completes: Counter[str] = Counter()
    for f in (spool / "events").glob("*.jsonl"):
        for line in f.read_text().splitlines():
            ev = json.loads(line)
            if ev["to"] == "complete":
                completes[ev["job"]] += 1
    decisions: Counter[str] = Counter()
    for rec in (spool / "attempts").glob("*/recovery-*.json"):
        if rec.name.endswith(".validate.log"):
            continue
        decisions[json.loads(rec.read_text())["decision"]] += 1
    return {
        "journal_lines_rebuilt": len(lost_lines),
        "complete": sum(1 for s in states.values() if s == "complete"),
        "failed": sum(1 for s in states.values() if s == "failed"),
        "lost": [j for j, s in states.items() if s not in ("complete", "failed")],
        "double": sorted(j for j, n in completes.items() if n > 1),
        "partial": [p for p in independent if p.startswith("invariant 2")],
        "fsck": fsck_problems,
        "independent": independent,
        "recoveries": dict(sorted(decisions.items())),
    }


def _fsck(spool: Path, *, repair: bool) -> list[dict[str, Any]]:
    """``spool fsck --json`` (no daemon runs: nothing is left to settle); its problems."""
    args = [SPOOL, "fsck", "--spool", str(spool), "--json", "--settle", "0"]
    r = subprocess.run(args if repair else [*args, "--no-repair"], capture_output=True, text=True)
    try:
        problems: list[dict[str, Any]] = json.loads(r.stdout)["problems"]
    except (ValueError, KeyError):
        return [{"path": "(fsck)", "problem": f"exit {r.returncode}: {r.stderr[-300:]}", "repaired": False}]
    return problems


#: ``spool migrate``'s crash points: its merged entries durable, the format 1 records not
#: yet removed; and between the folder fsyncs of one of its batches (the first: creating).
MIGRATE_POINTS = ("mid_migrate", "mid_group_sync")


def library_view(spool: Path) -> dict[str, Any]:
    """What readers see of the library, compared before, during and after ``spool
    migrate``: every hit of a search of all versions with its tags and its version's facts,
    the current hits of each campaign, and what each object and name resolves to. Run in a
    fresh process (``--library-view``), so no reader's cache outlives a change."""
    from spool.core import config
    from spool.disk.tree import Tree
    from spool.library import catalog, index

    tree = Tree.at(spool)
    cfg = config.load(tree.config_file)
    hits = catalog.search(tree, cfg, catalog.parse_terms(["visibility=internal"]), all_versions=True).results
    versions: dict[str, Any] = {}
    for h in hits:
        v = index.read_version(tree, h.name, h.revision)
        facts = None if v is None else [v.sha256, v.store_path, str(v.published_at), v.indexed_at.isoformat()]
        versions[h.job] = {
            "sha256": h.sha256,
            "path": h.path,
            "current": h.current,
            "tags": h.tags,
            "version": facts,
        }
    campaigns = sorted({h.tags.get("campaign", "") for h in hits})
    current = {
        c: sorted(h.job for h in catalog.search(tree, cfg, catalog.parse_terms([f"campaign={c}"])).results)
        for c in campaigns
    }
    by_sha = {}
    for sha in sorted({h.sha256 for h in hits}):
        try:
            got = catalog.resolve(tree, sha)
            by_sha[sha] = [got.job, str(got.path.relative_to(tree.root))]
        except SpoolError as exc:
            by_sha[sha] = [type(exc).__name__]
    by_name = {}
    for name in sorted({h.name for h in hits}):
        try:
            by_name[name] = catalog.resolve(tree, name).job
        except SpoolError as exc:
            by_name[name] = type(exc).__name__
    return {"versions": versions, "current": current, "objects": by_sha, "names": by_name}


def _view(spool: Path) -> dict[str, Any]:
    r = subprocess.run(
        [sys.executable, __file__, "--library-view", str(spool)], capture_output=True, text=True, check=False
    )
    if r.returncode != 0:
        return {"error": r.stderr[-500:]}
    view: dict[str, Any] = json.loads(r.stdout)
    return view


def _format_of(spool: Path) -> int:
    from spool.disk import formats

    return formats.read(spool)


def _migration_phase(spool: Path, v1_before: int) -> str:
    """Where a killed ``spool migrate`` left the tree, from the tree: before its first
    merged version entry, creating them, all created (the format 1 records all kept),
    removing the format 1 records, all removed but ``FORMAT`` not yet written, or done."""
    from spool.disk.tree import Tree
    from spool.library import segments

    if _format_of(spool) == 2:
        return "done"
    v1 = _v1_records(spool)
    merged = sum(1 for kind, _ in segments.merged_entries(Tree.at(spool)) if kind == "versions")
    if v1 == 0:
        return "removed, FORMAT not yet written"
    if v1 < v1_before:
        return "removing format 1 records"
    if merged == 0:
        return "before any merged entry"
    return "merged entries created" if merged >= v1_before else "creating merged entries"


def _v1_records(spool: Path) -> int:
    """Format 1 version records (``library/<name>/<rev>``)."""
    lib = spool / "library"
    return sum(len(os.listdir(d)) for d in lib.iterdir() if d.is_dir()) if lib.is_dir() else 0


def _migrate(spool: Path, *, crash_at: str | None = None, kill_after: float | None = None) -> tuple[int, str]:
    """One ``spool migrate`` run (``--json``), killed at a crash point or after
    ``kill_after`` seconds if it lasts that long: its exit code and output."""
    env = {k: v for k, v in os.environ.items() if k not in ("SPOOL_CRASH_AT", FORMAT_ENV)}
    if crash_at:
        env["SPOOL_CRASH_AT"] = crash_at
    proc = subprocess.Popen(
        [SPOOL, "migrate", "--spool", str(spool), "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        out, err = proc.communicate(timeout=kill_after)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
    return proc.returncode, out + err


def _judge(spool: Path, before: dict[str, Any], when: str, wrong: list[str], *, fsck: bool) -> None:
    """The tree reads as ``before`` and passes the invariants (and fsck, with ``fsck``)."""
    now = _view(spool)
    if now != before:
        diff = [
            f"{part} {key}: {before.get(part, {}).get(key)!r} -> {now.get(part, {}).get(key)!r}"
            for part in ("versions", "objects", "names", "current")
            for key in sorted(set(before.get(part, {})) | set(now.get(part, {})))
            if before.get(part, {}).get(key) != now.get(part, {}).get(key)
        ]
        wrong.append(f"{when}: the library reads differently: {now.get('error') or diff[:3]}")
    bad = invariants.check(spool)
    if bad:
        wrong.append(f"{when}: invariants: {bad[:3]}")
    if fsck:
        problems = _fsck(spool, repair=False)
        if problems:
            wrong.append(f"{when}: fsck: {problems[:3]}")


def _complete_migration(spool: Path, wrong: list[str], when: str) -> None:
    """Run ``spool migrate`` to its end, then once more: the first says format 2, the
    second finds nothing to do."""
    rc, out = _migrate(spool)
    again_rc, again = _migrate(spool)
    try:
        first, second = json.loads(out), json.loads(again)
    except ValueError:
        wrong.append(f"{when}: migrate exit {rc}/{again_rc}: {(out + again)[-300:]}")
        return
    if rc != 0 or first["now"] != 2 or _format_of(spool) != 2:
        wrong.append(f"{when}: migrate ended at format {first['now']} (exit {rc})")
    if again_rc != 0 or (second["was"], second["versions"], second["left"]) != (2, 0, []):
        wrong.append(f"{when}: a second migrate did work: {second}")
    if (spool / "library").exists() and any((spool / "library").iterdir()):
        wrong.append(f"{when}: format 1 version records left: {sorted(os.listdir(spool / 'library'))[:5]}")


def _migrate_torture(lay: Layout, args: argparse.Namespace, rng: random.Random) -> dict[str, Any]:
    """``spool migrate`` of the run's format 1 tree, killed (see the module docstring)."""
    spool = lay.spool
    wrong: list[str] = []
    if _format_of(spool) != 1:
        return {"migrate_wrong": [f"the run left a tree of format {_format_of(spool)}, not 1"]}
    before = _view(spool)
    if "error" in before or not before["versions"]:
        return {"migrate_wrong": [f"no library to migrate: {before.get('error', 'no versions')}"]}
    v1_before = _v1_records(spool)
    if v1_before != len(before["versions"]) or (spool / "index" / "_segments").is_dir():
        wrong.append(
            f"the old writers left {v1_before} version records for {len(before['versions'])} versions"
        )
    pristine = lay.base / "migrate-pristine"
    subprocess.run(["cp", "-a", str(spool), str(pristine)], check=True)
    # A whole run on a copy: how long one lasts (the random kills fall within it).
    ref = lay.base / "migrate-ref"
    subprocess.run(["cp", "-a", str(pristine), str(ref)], check=True)
    t0 = time.monotonic()
    rc, out = _migrate(ref)
    whole = time.monotonic() - t0
    if rc != 0:
        wrong.append(f"an unkilled migrate failed: {out[-300:]}")
    _judge(ref, before, "unkilled", wrong, fsck=True)
    shutil.rmtree(ref, ignore_errors=True)
    phases: Counter[str] = Counter()
    for k in range(args.migrate_kills):
        trial = lay.base / f"migrate-{k}"
        subprocess.run(["cp", "-a", str(pristine), str(trial)], check=True)
        point = MIGRATE_POINTS[k] if k < len(MIGRATE_POINTS) else None
        rc, out = _migrate(trial, crash_at=point, kill_after=None if point else rng.uniform(0.0, whole))
        if rc != -signal.SIGKILL:
            phases["finished before the kill"] += 1
        else:
            phases[f"{point or 'random'}: {_migration_phase(trial, v1_before)}"] += 1
            _judge(trial, before, f"trial {k} killed ({point or 'random'})", wrong, fsck=False)
        _complete_migration(trial, wrong, f"trial {k}")
        _judge(trial, before, f"trial {k} migrated", wrong, fsck=True)
        shutil.rmtree(trial, ignore_errors=True)
    # The run's own spool: a chain of kills, each run resuming what the last one left.
    chain = [*MIGRATE_POINTS, None, None]
    for point in chain:
        rc, _ = _migrate(spool, crash_at=point, kill_after=None if point else rng.uniform(0.0, whole))
        if rc == -signal.SIGKILL:
            phases[f"chain, {point or 'random'}: {_migration_phase(spool, v1_before)}"] += 1
            _judge(spool, before, f"chain killed ({point or 'random'})", wrong, fsck=False)
    _complete_migration(spool, wrong, "chain")
    _judge(spool, before, "chain migrated", wrong, fsck=True)
    shutil.rmtree(pristine, ignore_errors=True)
    return {
        "migrate_versions": len(before["versions"]),
        "migrate_v1_records": v1_before,
        "migrate_seconds_whole": round(whole, 2),
        "migrate_kills": sum(n for p, n in phases.items() if p != "finished before the kill"),
        "migrate_phases": dict(sorted(phases.items())),
        "migrate_wrong": wrong[:10],
    }


#: Where a daemon settling dependents may die (spool.queue.depends): each is in OTHER_POINTS too.
DEPENDS_POINTS = ("after_resolve_write", "after_hold_record")
assert set(DEPENDS_POINTS) <= set(OTHER_POINTS)
#: Where a daemon running generations may die (spool.kinds.generate).
GEN_POINTS = tuple(p for p in OTHER_POINTS if p.startswith("after_gen_"))


def _maybe_point(rng: random.Random, args: argparse.Namespace) -> str | None:
    """A render path's crash point, or now and then one off it (a quarantine's reason
    written but the file not yet moved; a block written but the job not yet moved on)."""
    if rng.random() >= args.crash_point_rate:
        return None
    # settling dependents: frozen, or hold record written (tools/powerloss has no --depends)
    if getattr(args, "depends", 0) and rng.random() < 0.3:
        return rng.choice(DEPENDS_POINTS)
    # between a generation's durable states: the money paths (a daemon running no generation
    # passes none, and is killed later by the clock as usual)
    if getattr(args, "generate", 0) and rng.random() < 0.3:
        return rng.choice(GEN_POINTS)
    return rng.choice(DAEMON_OTHER_POINTS) if rng.random() < 0.2 else rng.choice(POINTS)


#: The points off a render's path that a daemon can reach (spool migrate's is a command's:
#: tests/test_migrate.py kills it there).
DAEMON_OTHER_POINTS = tuple(p for p in OTHER_POINTS if p != "mid_migrate")


#: Files dropped straight into pending/ that can never run: each must end in quarantine/.
DAMAGED = (b'{"job_id": "x", broken', b"[]", b'{"operation": "noop"}')


def _drop_damaged(spool: Path, k: int, rng: random.Random) -> str:
    """A damaged job file in pending/ (a hand edit gone wrong, a half-copied file)."""
    name = f"zz-damaged-{k:03d}@1.json"
    (spool / "pending" / name).write_bytes(rng.choice(DAMAGED))
    return name


def _state(spool: Path, jid: str) -> str:
    for s in ("waiting", "pending", "held", "complete", "failed"):
        if (spool / s / f"{jid}.json").exists():
            return s
    if any((spool / "running").glob(f"*/{jid}.json")):
        return "running"
    return "missing"


def _remaining(spool: Path) -> int:
    n = len(list((spool / "pending").glob("*.json"))) + len(list((spool / "running").glob("*/*.json")))
    n += len(list((spool / "waiting").glob("*.json")))
    return n + len([p for p in (spool / "incoming").iterdir() if p.name.endswith(".json")])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=40)
    ap.add_argument("--kills", type=int, default=20)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--max-gap", type=float, default=1.5, help="longest pause between kills, seconds")
    ap.add_argument(
        "--crash-point-rate",
        type=float,
        default=0.3,
        help="share of restarted daemon lives that die at a named crash point",
    )
    ap.add_argument("--max-attempts", type=int, default=10)
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds allowed for the final drain")
    ap.add_argument("--keep", help="build the spool here and keep it")
    ap.add_argument(
        "--mounts",
        help="comma-separated mounts of one shared folder: the spool lives there, worker k on mount k",
    )
    ap.add_argument("--export", help="with --mounts: the same folder on the file server (setup, checks)")
    ap.add_argument(
        "--generate", type=int, default=0, help="generation jobs mixed in, against tools/provsim.py"
    )
    ap.add_argument(
        "--provider-faults",
        type=float,
        default=0.5,
        help="share of the generation jobs that meet a provider fault chosen at random (0 to 1)",
    )
    ap.add_argument(
        "--depends",
        type=int,
        default=0,
        help="briefs of jobs that depend on jobs: chains of 3, fan-outs of 12, failing upstreams",
    )
    ap.add_argument(
        "--adopt", type=int, default=0, help="clips spool library adopt takes, killed again and again"
    )
    ap.add_argument(
        "--migrate",
        type=int,
        default=0,
        help="run the old layout (format 1) with this many no-op jobs mixed in, then torture spool migrate",
    )
    ap.add_argument(
        "--migrate-kills",
        type=int,
        default=8,
        help="with --migrate: copies of the tree whose migrate is killed",
    )
    ap.add_argument("--library-view", help=argparse.SUPPRESS)  # internal: what readers see, as JSON
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.library_view:
        print(json.dumps(library_view(Path(args.library_view)), sort_keys=True))
        return 0
    f = run(args)
    if args.json:
        print(json.dumps(f, indent=2))
    else:
        rec = " ".join(f"{k}={v}" for k, v in f["recoveries"].items()) or "none"  # type: ignore[union-attr]
        print(
            f"jobs={f['jobs']} complete={f['complete']} failed={f['failed']} kills={f['kills']} "
            f"(daemon {f['kills_daemon']}, ffmpeg {f['kills_ffmpeg']}, crash points "
            f"{sum(f['crash_points_hit'].values())}) daemon_lives={f['daemon_lives']} "  # type: ignore[union-attr]
            f"recoveries: {rec} | lost={f['lost']} double_published={f['double_published']} "
            f"partial_at_final={f['partial_at_final']} journal_lines_rebuilt={f['journal_lines_rebuilt']} "
            f"fsck_problems={f['fsck_problems']} "
            f"independent_problems={f['independent_problems']} wall={f['wall_seconds']}s"
            + (
                f" | generations={f['generations']} complete={f['generation_complete']} "
                f"failed={f['generation_failed']} "
                f"attempts={f['generation_attempts']} predictions={f['generation_creates']} "
                f"over_attempts={f['generation_creates_over_attempts']} "
                f"wrong_asset={f['generation_wrong_asset']}"
                if "generations" in f
                else ""
            )
            + (
                f" | depends: groups={f['depends_groups']} jobs={f['depends_jobs']} "
                f"revised={f['depends_revised']} ends={f['depends_ends']} wrong={len(f['depends_wrong'])}"  # type: ignore[arg-type]
                if "depends_groups" in f
                else ""
            )
            + (
                f" | migrate: versions={f['migrate_versions']} kills={f['migrate_kills']} "
                f"whole={f['migrate_seconds_whole']}s wrong={len(f['migrate_wrong'])}"  # type: ignore[arg-type]
                if "migrate_versions" in f
                else ""
            )
        )
        if f.get("hollow"):
            print(
                f"hollow: {f['kills_daemon']} daemon kills and no recovery decision: no kill found "
                "a daemon with a job in hand",
                file=sys.stderr,
            )
        if (
            f["lost"]
            or f["double_published"]
            or f["partial_at_final"]
            or f["fsck_problems"]
            or f["independent_problems"]
            or f.get("generation_creates_over_attempts")
            or f.get("generation_wrong_asset")
            or f.get("depends_wrong")
            or f.get("migrate_wrong")
        ):
            print(json.dumps(f["details"], indent=2), file=sys.stderr)
            print(json.dumps(f.get("generation_details", []), indent=2), file=sys.stderr)
            print(json.dumps(f.get("depends_wrong", []), indent=2), file=sys.stderr)
            print(json.dumps(f.get("migrate_wrong", []), indent=2), file=sys.stderr)
            print(f"spool kept at {f['spool']}", file=sys.stderr)
    bad = (
        f["lost"]
        or f.get("hollow")
        or f["double_published"]
        or f["partial_at_final"]
        or f["fsck_problems"]
        or f["independent_problems"]
        or f["damaged_not_quarantined"]
        or f.get("generation_creates_over_attempts")
        or f.get("generation_wrong_asset")
        or f.get("adopt_wrong")
        or f.get("depends_wrong")
        or f.get("migrate_wrong")
    )
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
