"""One spool, two "workstations": the invariants across two network mounts of one export.

tools/multimount serves a folder over SFTP from a private sshd on 127.0.0.1 and
mounts it twice with sshfs (``dir_cache=no``: FUSE's 1 s caches only), once per
simulated host. Every daemon here runs on its own mount; the export (the file
server's side of the folder) is the ground truth the checks read. Both mounts
are on one machine, so workers share the host name: identities differ by name
(``<host>-nas-a``, ``<host>-nas-b``), and liveness sees the same host's pids.

Skipped only where FUSE is unavailable. The whole module brings the mounts up
once and takes them down at the end, leaving nothing running. The last tests
need no mounts: they fake what a NAS client does to a reader of a record that
another process is replacing (short reads, ESTALE, a moment's ENOENT) and a
worker whose identity lock was taken through another mount.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import invariants
import pytest
from conftest import minimal, run_cli, wait_for, write_json
from provsim import ProviderSim

from spool import doctor
from spool.core import config, settings
from spool.core.model import WorkerRecord, encode, now
from spool.disk import durable, records
from spool.disk.tree import HOST, Tree, boot_id, write_atomic
from spool.queue import accept, liveness, status
from spool.queue.status import read

ROOT = Path(__file__).resolve().parents[1]
MULTIMOUNT = ROOT / "tools" / "multimount"
TAGS = {"campaign": "nas", "locale": "en", "asset_type": "test", "visibility": "internal"}


def _fuse_unavailable() -> str | None:
    """Why FUSE mounts cannot be made here, or ``None`` if they can."""
    if os.geteuid() != 0:
        return "tools/multimount needs root to start sshd and mount FUSE filesystems"
    try:
        fs = Path("/proc/filesystems").read_text()
    except OSError:
        fs = ""
    if "fuse" not in fs.split():
        return "the kernel has no fuse filesystem"
    try:
        os.close(os.open("/dev/fuse", os.O_RDWR))
    except OSError as exc:
        return f"/dev/fuse is not usable ({exc.strerror})"
    return None


@dataclass(frozen=True)
class Nas:
    export: Path
    a: Path
    b: Path

    def spool(self, name: str, **limits: object) -> tuple[Tree, Tree, Tree]:
        """A new spool in the export, as (export, mount A, mount B) views."""
        server = Tree.at(self.export / name)
        server.create()
        settings.write(
            server.config_file,
            {
                "assets": {"roots": [str(self.export.parent / "assets")]},
                # A drop seen only by polling must stay unchanged for incoming_quiet
                # before it is taken (it may still be written in place).
                "daemon": {"poll_interval": 0.5, "heartbeat_interval": 0.5, "incoming_quiet": 0.5},
                "observe": {"metrics_dir": "", "thumbnail_width": 0},
                "acceptance": {"allow_noop": True},
                # FUSE's 1 s caches: a worker gone through the other mount is recovered 3 s on
                "recovery": {"mount_lag": 3.0},
                "limits": limits,
            },
        )
        return server, Tree.at(self.a / name), Tree.at(self.b / name)


@pytest.fixture(scope="module")
def nas(tmp_path_factory: pytest.TempPathFactory, media: dict[str, Path]) -> Iterator[Nas]:
    why = _fuse_unavailable()
    if why:
        pytest.skip(f"FUSE is unavailable: {why}")
    d = tmp_path_factory.mktemp("nas")
    up = subprocess.run(
        [str(MULTIMOUNT), "up", str(d), "--mounts", "2", "--cache", "low"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    if up.returncode == 2:
        pytest.skip(f"FUSE is unavailable: {up.stderr.strip()}")
    assert up.returncode == 0, up.stderr
    assets = d / "assets"
    assets.mkdir()
    for p in media.values():
        (assets / p.name).write_bytes(p.read_bytes())
    try:
        yield Nas(d / "export", d / "a", d / "b")
    finally:
        down = subprocess.run([str(MULTIMOUNT), "down", str(d)], capture_output=True, text=True, timeout=120)
        assert down.returncode == 0, down.stderr


def _events(server: Tree) -> list[dict]:
    out = [json.loads(x) for f in server.events.glob("*.jsonl") for x in f.read_text().splitlines()]
    return sorted(out, key=lambda e: e["ts"])


def _ts(e: dict) -> float:
    return datetime.fromisoformat(e["ts"].replace("Z", "+00:00")).timestamp()


def _noop_jobs(server: Tree, n: int, prefix: str = "n") -> list[str]:
    cfg = config.load(server.config_file)
    ids = []
    for i in range(n):
        sub = json.dumps({"name": f"{prefix}{i:04d}", "operation": "noop", "tags": TAGS}).encode()
        ids.append(accept.accept_bytes(server, cfg, sub, "test").job_id)
    return ids


# -- the harness ------------------------------------------------------------------------


def test_multimount_is_idempotent_and_down_leaves_nothing(nas, tmp_path):
    again = subprocess.run(
        [str(MULTIMOUNT), "up", str(nas.export.parent), "--mounts", "2", "--cache", "low"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert again.returncode == 0 and f"MULTIMOUNT_EXPORT={nas.export}" in again.stdout
    assert (
        subprocess.run([str(MULTIMOUNT), "status", str(nas.export.parent)], capture_output=True).returncode
        == 0
    )
    # a second instance of its own, traced (every SFTP request logged: the round trips a
    # workload costs, tools/bench nasdispatch), taken down twice: no mount, no process left
    from benchlib.nas import sftp_log, sftp_requests

    d = tmp_path / "mm"
    up = [str(MULTIMOUNT), "up", str(d), "--mounts", "1", "--trace"]
    subprocess.run(up, check=True, capture_output=True, timeout=60)
    try:
        before = sftp_requests(sftp_log(d))
        (d / "a" / "hello").write_text("hi")
        assert (d / "export" / "hello").read_text() == "hi"
        # FUSE releases a closed file after close(2) returns: its CLOSE request may come later
        wait_for(lambda: (sftp_requests(sftp_log(d)) - before)["CLOSE"] >= 1, timeout=10)
        sent = sftp_requests(sftp_log(d)) - before
        assert sent["OPEN"] == 1 and sent["WRITE"] == 1 and sent["CLOSE"] == 1, sent
    finally:  # down even when a check fails: a test leaves no mount behind
        for _ in range(2):
            subprocess.run([str(MULTIMOUNT), "down", str(d)], check=True, capture_output=True, timeout=60)
    assert subprocess.run([str(MULTIMOUNT), "status", str(d)], capture_output=True).returncode == 3
    assert str(d) not in Path("/proc/self/mountinfo").read_text()
    leftover = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                if str(d).encode() in (p / "cmdline").read_bytes():
                    leftover.append(p.name)
            except OSError:
                continue
    assert leftover == []
    assert (d / "export" / "hello").exists()  # the data is kept


# -- spool doctor on the network mount ----------------------------------------------------


def test_a_layouts_file_operations_are_counted_alone_and_the_leaner_one_sends_fewer(nas, tmp_path):
    # tools/benchlib/layoutcost: one job's file operations, without a daemon, on a traced
    # mount. The requests that do not depend on FUSE's caches are exact: format 2 makes and
    # removes the job file's temp name (no unnamed files over FUSE) and three folders a job;
    # the leaner layout removes nothing and makes two.
    from benchlib import layoutcost

    d = tmp_path / "mm"
    subprocess.run([str(MULTIMOUNT), "up", str(d), "--mounts", "1", "--cache", "low", "--trace"],
                   check=True, capture_output=True, timeout=60)  # fmt: skip
    try:
        jobs = 20
        f2 = layoutcost.count(d, "format 2", jobs, settle=1.5)
        lean = layoutcost.count(d, "leaner", jobs, settle=1.5)
    finally:
        subprocess.run([str(MULTIMOUNT), "down", str(d)], check=True, capture_output=True, timeout=60)
    assert f2["REMOVE"] == jobs and f2["MKDIR"] == 3 * jobs and f2["OPEN"] >= 8 * jobs, f2
    assert lean["REMOVE"] == 0 and lean["MKDIR"] == 2 * jobs and lean["OPEN"] >= 6 * jobs, lean
    assert sum(lean.values()) < sum(f2.values()) - 10 * jobs, (f2, lean)


def test_a_folder_fsync_over_sshfs_is_skipped_and_a_local_one_is_real(nas, tmp_path, monkeypatch):
    # SFTP cannot sync a folder: over sshfs the fsync is answered in the kernel, and the
    # open and close around it are two round trips. The remote folder is never opened
    # (a stat learns its device; the mount table is read once per device, not once per
    # new folder); the local folder is fsynced every time.
    remote, local = nas.a / "fsync-probe", tmp_path / "fsync-probe"
    remote.mkdir()
    local.mkdir()
    opened: list[str] = []
    synced: list[str] = []
    tables: list[str] = []
    real_open, real_fsync, real_mount_of = os.open, os.fsync, durable.mount_of

    def counting_open(path, flags, *a, **kw):
        if flags & os.O_DIRECTORY:
            opened.append(os.fspath(path))
        return real_open(path, flags, *a, **kw)

    def counting_fsync(fd):
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        return real_fsync(fd)

    def counting_mount_of(path, *a, **kw):
        tables.append(os.fspath(path))
        return real_mount_of(path, *a, **kw)

    monkeypatch.setattr(os, "open", counting_open)
    monkeypatch.setattr(os, "fsync", counting_fsync)
    monkeypatch.setattr(durable, "mount_of", counting_mount_of)
    monkeypatch.setattr(durable, "_folder_fsync_on", {}, raising=False)  # as a fresh process
    for _ in range(3):
        durable.fsync_folder_now(remote)
        durable.fsync_folder_now(local)
    assert synced == [str(local)] * 3
    assert opened.count(str(remote)) == 0 and opened.count(str(local)) == 3
    others = [nas.a / f"fsync-probe-{k}" for k in range(3)]  # new folders on the same mount
    for folder in others:
        folder.mkdir()
        durable.fsync_folder_now(folder)
    assert tables == [str(remote)] and not set(opened) & {str(f) for f in others}


def test_doctor_on_the_network_mount_with_a_peer(nas):
    server, a, b = nas.spool("doctor")
    proc = run_cli("doctor", "--peer", str(b.root), "--json", spool=a)
    assert proc.returncode == 0, proc.stderr
    r = json.loads(proc.stdout)
    p = r["probes"]
    assert r["mount"]["fstype"] == "fuse.sshfs" and r["mount"]["kind"] == "network"
    assert r["safe"] is True
    # what docs/research/nas.md measured for sshfs, as doctor reports it
    assert p["rename"]["ok"] and p["rename"]["peer"]["missing"] == 0  # atomic on the server
    assert p["rename_race"]["ok"] and p["rename_race"]["not_exactly_one"] == 0
    assert p["links"]["ok"] and p["links"]["race_not_exactly_one"] == 0
    assert p["o_excl"]["race_not_exactly_one"] == 0
    assert p["locks"]["local"] is True and p["locks"]["across_mounts"] is False  # local to each client
    assert p["inotify"]["this_mount"] is True and p["inotify"]["other_mount"] is False
    assert p["lag"]["listing_seconds"] < 3 and 0.5 <= p["lag"]["stale_stat_seconds"] < 5  # dir_cache=no: ~1 s
    assert p["mtime"]["granularity_ns"] == 10**9  # SFTPv3 carries whole seconds
    assert r["choices"]["publish"]["value"] == "link"
    assert r["choices"]["watch"]["value"] == "poll"
    assert "other mounts" in r["choices"]["watch"]["why"]
    assert not (server.root / ".doctor").exists()  # probe files and their folder removed


def test_doctor_tells_local_disk_tmpfs_and_sshfs_apart(nas, tmp_path):
    """The quick probes (what the daemon runs at start) on all three kinds of filesystem."""
    shm = Path("/dev/shm") / f"spool-nas-test-{os.getpid()}"
    places = {"local": tmp_path / "spool", "sshfs": nas.a / "kinds"}
    if Path("/dev/shm").is_dir() and doctor.mount_of(Path("/dev/shm")).kind == "memory":
        places["tmpfs"] = shm / "spool"
    rows = {}
    try:
        for name, root in places.items():
            t = Tree.at(root)
            t.create()
            rep = doctor.run(t, config.Config(), quick=True)
            rows[name] = (
                rep.mount.kind,
                rep.findings["mtime"].facts["granularity_ns"],
                rep.findings["links"].ok,
                rep.publish.value,
                rep.watch.value,
            )
            print(name, rep.mount.fstype, rows[name], f"{rep.seconds:.2f} s")
    finally:
        subprocess.run(["rm", "-rf", str(shm)], check=True)
    assert rows["sshfs"] == ("network", 10**9, True, "link", "poll")
    assert rows["local"][0] in ("local", "memory") and rows["local"][1] < 10**9
    assert rows["local"][3:] == ("link", "inotify")
    if "tmpfs" in rows:
        assert rows["tmpfs"] == ("memory", 1, True, "link", "inotify")


# -- two daemons, two mounts ----------------------------------------------------------------


def _daemon(daemons, view: Tree, name: str, **kw):
    return daemons(view, name, log=view.root.parent.parent / f"spoold-{view.root.name}-{name}.log", **kw)


def test_two_daemons_on_two_mounts_race_for_500_jobs(nas, daemons):
    server, a, b = nas.spool("race", max_active=4)
    ids = _noop_jobs(server, 500)
    da = _daemon(daemons, a, "nas-a", drain=True)
    db = _daemon(daemons, b, "nas-b", drain=True)
    # while both run, each sees the other as alive through its own mount (the
    # identity lock taken through the other mount is invisible here)
    wa, wb = f"{HOST}-nas-a", f"{HOST}-nas-b"
    rec = wait_for(lambda: read(b.worker_file(wa), WorkerRecord), timeout=30)
    if da.alive():
        assert liveness.assess(b, rec, 60).health == "alive"
    assert da.wait(timeout=300) == 0, da.output()
    assert db.wait(timeout=300) == 0, db.output()
    assert "watch by poll" in da.output() and "fuse.sshfs (network)" in da.output()

    events = _events(server)
    claims = [e for e in events if e["to"] == "running" and e.get("reason") == "claimed"]
    completes = Counter(e["job"] for e in events if e["to"] == "complete")
    assert Counter(e["job"] for e in claims) == Counter(ids)  # every job claimed exactly once
    assert completes == Counter(ids)  # and completed exactly once
    assert not [e for e in events if "taken over" in (e.get("reason") or "")]
    by = Counter(e["worker"] for e in claims)
    assert set(by) == {wa, wb} and min(by.values()) > 0, by
    for jid in ids:
        attempts = [p.name for p in server.job_attempts(jid).iterdir() if p.name.isdigit()]
        assert attempts == ["1"], (jid, attempts)
        rec = json.loads((server.attempt_dir(jid, 1) / "attempt.json").read_text())
        assert rec["worker"] in (wa, wb)
    assert sorted(p.name for p in server.complete.iterdir()) == sorted(f"{j}.json" for j in ids)
    assert invariants.check(server.root) == []
    fsck = json.loads(run_cli("fsck", "--json", "--no-repair", spool=a).stdout)
    assert fsck["problems"] == []
    t = sorted(_ts(e) for e in claims)
    print(f"claims/s with two hosts: {len(t) / (t[-1] - t[0]):.1f} ({dict(by)})")


def test_one_worker_name_runs_once_per_host_even_across_two_mounts(nas, daemons):
    """The identity lock taken through mount A is invisible through mount B; the
    record and the open lock file are not, so a second start under the same name fails."""
    _, a, b = nas.spool("samename")
    first = _daemon(daemons, a, "twin")
    wait_for(lambda: (a.workers / f"{HOST}-twin.json").exists(), timeout=30)
    second = _daemon(daemons, b, "twin")
    assert second.wait(timeout=60) != 0
    assert "already running on this host" in second.output()
    assert first.alive()
    first.signal(signal.SIGTERM)
    assert first.wait(timeout=60) == 0


def test_a_drop_on_one_mount_is_claimed_from_the_other_by_polling(nas, daemons):
    server, a, b = nas.spool("latency")
    db = _daemon(daemons, b, "nas-poll")
    wait_for(lambda: "started on" in db.output(), timeout=30)
    assert "watch by poll" in db.output()
    lat = []
    for i in range(8):
        sub = json.dumps({"name": f"drop{i}", "operation": "noop", "tags": TAGS}).encode()
        tmp = a.incoming / f".drop{i}.json.tmp"
        tmp.write_bytes(sub)
        os.rename(tmp, a.incoming / f"drop{i}.json")
        dropped = time.time()
        rec_path = server.attempt_dir(f"drop{i}@1", 1) / "attempt.json"
        wait_for(rec_path.exists, timeout=20)
        claimed = datetime.fromisoformat(json.loads(rec_path.read_text())["claimed_at"]).timestamp()
        lat.append(claimed - dropped)
        time.sleep(0.13 * (i % 4))  # land at different points of the poll cycle
    db.signal(signal.SIGTERM)
    assert db.wait() == 0
    med = statistics.median(lat)
    print(f"drop-to-claim across mounts, poll_interval 0.5 s: median {med:.3f} s, max {max(lat):.3f} s")
    # one poll interval, the quiet period of a drop no inotify event finished, plus the
    # FUSE cache and the work
    assert max(lat) < 0.5 + 0.5 + 2.0


def test_interrupt_on_one_mount_and_recover_from_the_other(nas, daemons):
    """A real render SIGKILLed mid-way on mount A, recovered by an operator on mount B."""
    server, a, b = nas.spool("interrupt")
    job = minimal(
        nas.export.parent / "assets",
        name="crashy",
        steps=[{"op": "fit", "width": 1280, "height": 720}, {"op": "encode", "preset": "medium"}],
    )
    run_cli("submit", str(write_json(nas.export.parent / "crashy.json", job)), spool=a, check=True)
    da = _daemon(daemons, a, "nas-a")
    progress = server.attempt_dir("crashy@1", 1) / "progress.json"
    wait_for(progress.exists, timeout=60, interval=0.02)
    os.killpg(da.proc.pid, signal.SIGKILL)  # the daemon and its FFmpeg, mid-render
    da.wait()
    assert (server.running / f"{HOST}-nas-a" / "crashy@1.json").exists()
    assert invariants.check(server.root, settled=False) == []
    first = server.attempt_dir("crashy@1", 1)
    before = {p.relative_to(first): p.read_bytes() for p in first.rglob("*") if p.is_file()}

    out = run_cli("recover", "--worker", f"{HOST}-nas-a", "--json", spool=b, check=True).stdout
    plan = json.loads(out)
    assert plan["workers"][0]["health"] == "dead"  # same host: the pid is gone, certainly
    assert plan["done"] and plan["done"][0]["job_id"] == "crashy@1"
    db = _daemon(daemons, b, "nas-b", drain=True)
    assert db.wait(timeout=180) == 0, db.output()

    assert (server.complete / "crashy@1.json").exists()
    assert invariants.check(server.root) == []
    after = {p.relative_to(first): p.read_bytes() for p in first.rglob("*") if p.is_file()}
    for rel, data in before.items():  # the first attempt is intact
        if rel.name != "progress.json":
            assert after[rel] == data, rel
    manifest = json.loads(server.manifest_file("crashy@1").read_text())
    assert manifest["attempt"] >= 2
    rec = json.loads((server.attempt_dir("crashy@1", manifest["attempt"]) / "attempt.json").read_text())
    assert rec["worker"] in (f"{HOST}-nas-b", f"{HOST}-recover")
    assert any("recovery" in (e.get("reason") or "") for e in _events(server))


# -- generation jobs: one create request in total, whoever wins ------------------------

GEN_TOKEN = "r8_NasGenToken_0c9b1f3e5a7d"
GEN_ENV = {"SPOOL_TEST_NAS_GEN_TOKEN": GEN_TOKEN}


@pytest.fixture(scope="module")
def gen_sim() -> Iterator[ProviderSim]:
    with ProviderSim(token=GEN_TOKEN, work=1.0) as s:
        yield s


def _gen_spool(nas: Nas, name: str, sim: ProviderSim) -> tuple[Tree, Tree, Tree]:
    server, a, b = nas.spool(name)
    with open(server.config_file, "a") as f:
        f.write(
            f'\n[providers.sim]\nkind = "replicate"\nbase_url = "{sim.url}"\n'
            'token_env = "SPOOL_TEST_NAS_GEN_TOKEN"\nrequest_timeout = 2.0\nin_flight = 8\ndeadline = 120\n'
            "[providers.sim.polling]\nfirst = 0.2\nbase = 0.2\nceiling = 0.5\nfloor = 0.05\n"
        )
    return server, a, b


def _submit_gen(server: Tree, name: str, prompt: str) -> str:
    sub = {
        "name": name,
        "operation": "generate",
        "generate": {"provider": "sim", "model": "acme/video-1", "input": {"prompt": prompt}},
        "output": {"expect": {"width": 320, "height": 180}},
        "tags": TAGS,
    }
    return accept.accept_bytes(server, config.load(server.config_file), json.dumps(sub).encode(), "t").job_id


def _sim_creates(sim: ProviderSim, prompt: str) -> int:
    return sum(1 for j in list(sim.state.jobs.values()) if j.input.get("prompt") == prompt and not j.hidden)


def test_two_daemons_on_two_mounts_make_one_create_per_generation(nas, daemons, gen_sim):
    server, a, b = _gen_spool(nas, "genrace", gen_sim)
    prompts = {_submit_gen(server, f"race{i}", f"nas race {i}"): f"nas race {i}" for i in range(6)}
    da = _daemon(daemons, a, "nas-a", drain=True, env=GEN_ENV)
    db = _daemon(daemons, b, "nas-b", drain=True, env=GEN_ENV)
    assert da.wait(timeout=180) == 0, da.output()[-3000:]
    assert db.wait(timeout=180) == 0, db.output()[-3000:]
    assert sorted(p.name for p in server.complete.iterdir()) == sorted(f"{j}.json" for j in prompts)
    assert {jid: _sim_creates(gen_sim, p) for jid, p in prompts.items()} == dict.fromkeys(prompts, 1)
    claimed = [e for e in _events(server) if e["to"] == "running"]
    assert Counter(e["job"] for e in claimed) == Counter(list(prompts))  # each claimed once
    print(f"generation claims by worker: {dict(Counter(e['worker'] for e in claimed))}")
    assert invariants.check(server.root) == []


def test_a_killed_generation_recovered_across_mounts_and_raced_for_is_created_once(nas, daemons, gen_sim):
    """Mount A's daemon dies with the generation waiting at the provider; an operator
    on mount B recovers it; both daemons then race for it: the winner adopts the
    provider job of attempt 1 instead of sending a second create."""
    server, a, b = _gen_spool(nas, "gencontend", gen_sim)
    prompt = "nas contended #fault=work:3"
    jid = _submit_gen(server, "contended", prompt)
    crash = _daemon(daemons, a, "nas-a", env={**GEN_ENV, "SPOOL_CRASH_AT": "after_gen_generating"})
    assert crash.wait(timeout=60) == -9, crash.output()[-3000:]
    out = run_cli("recover", "--worker", f"{HOST}-nas-a", "--json", spool=b, check=True).stdout
    assert json.loads(out)["done"][0]["job_id"] == jid
    da = _daemon(daemons, a, "nas-a", drain=True, env=GEN_ENV)
    db = _daemon(daemons, b, "nas-b", drain=True, env=GEN_ENV)
    assert da.wait(timeout=120) == 0, da.output()[-3000:]
    assert db.wait(timeout=120) == 0, db.output()[-3000:]
    assert (server.complete / f"{jid}.json").exists()
    assert _sim_creates(gen_sim, prompt) == 1
    n = json.loads(server.manifest_file(jid).read_text())["attempt"]
    assert n >= 2
    first = json.loads((server.attempt_dir(jid, 1) / "gen" / "2-generating.json").read_text())
    last = json.loads((server.attempt_dir(jid, n) / "gen" / "2-generating.json").read_text())
    assert first["provider_job_id"] == last["provider_job_id"]
    assert invariants.check(server.root) == []


@pytest.mark.torture
def test_torture_across_mounts_loses_nothing(nas, tmp_path):
    proc = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "torture.py"), "--jobs", "20", "--kills", "8", "--seed", "5",
         "--mounts", f"{nas.a},{nas.b}", "--export", str(nas.export), "--keep", str(tmp_path / "run"),
         "--json"],
        capture_output=True, text=True, timeout=600,
        env={**os.environ, "PYTHONPATH": str(ROOT / "tools")},
    )  # fmt: skip
    assert proc.stdout, proc.stderr
    f = json.loads(proc.stdout)
    print(json.dumps({k: v for k, v in f.items() if k != "details"}))
    assert [m.rsplit("/", 2)[1] for m in f["mounts"]] == [nas.a.name, nas.b.name]
    assert f["lost"] == 0 and f["double_published"] == 0 and f["partial_at_final"] == 0, f["details"]
    assert f["fsck_problems"] == 0 and f["independent_problems"] == 0, f["details"]
    assert f["complete"] + f["failed"] == f["jobs"] and f["kills"] >= 1
    assert proc.returncode == 0


def test_multimount_bench_measures_claims_and_latency(nas, tmp_path):
    """tools/multimount_bench.py, small: the figures of the closing note come from it. Its
    logs go to the test's own folder (it keeps them in $TMPDIR for a person to read)."""
    proc = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "multimount_bench.py"), "--mounts", f"{nas.a},{nas.b}",
         "--export", str(nas.export), "--jobs", "40", "--drops", "3", "--poll", "0.5", "--json"],
        capture_output=True, text=True, timeout=300, env={**os.environ, "TMPDIR": str(tmp_path)},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    f = json.loads(proc.stdout)
    assert (
        f["claims"]["claims"] == 40 and f["claims"]["claimed_twice"] == 0 and f["claims"]["completed"] == 40
    )
    assert f["claims"]["claims_per_second"] > 0
    assert 0 <= f["latency"]["median"] <= f["latency"]["p99"] < 0.5 + 0.5 + 2.0  # poll + quiet + work


# -- readers of records that other hosts replace (no mounts needed) -----------------------


def _worker_record(tree: Tree, worker: str, pid: int) -> WorkerRecord:
    rec = WorkerRecord(
        worker=worker,
        host=HOST,
        pid=pid,
        boot_id=boot_id(),
        started_at=now(),
        heartbeat_at=now(),
        beats=1,
        max_active=1,
    )
    write_atomic(tree.worker_file(worker), encode(rec))
    return rec


def test_read_retries_a_short_read(tree, monkeypatch):
    """A FUSE client that cached the old file's size can return a short read of a
    record being replaced; the next read is whole."""
    rec = _worker_record(tree, f"{HOST}-r", 1)
    whole = tree.worker_file(rec.worker).read_bytes()
    answers: list[bytes | OSError] = [whole[:10], whole[:30], whole]

    def flaky(path: Path) -> bytes:
        a = answers.pop(0)
        if isinstance(a, OSError):
            raise a
        return a

    monkeypatch.setattr(records, "read_retrying", flaky)
    assert status.read(tree.worker_file(rec.worker), WorkerRecord) == rec
    # malformed (not merely short) content is not retried: it is just unreadable
    answers[:] = [b"{not json", whole]
    assert status.read(tree.worker_file(rec.worker), WorkerRecord) is None


def test_tree_read_retrying_retries_transient_errnos_then_gives_up(tmp_path, monkeypatch):
    (tmp_path / "x").write_bytes(b"data")
    real_open = open
    stale = [OSError(errno.ESTALE, "stale"), OSError(errno.EFAULT, "bad address")]

    def flaky_open(path: object, mode: str = "r") -> object:
        if stale:
            raise stale.pop(0)
        return real_open(path, mode)  # type: ignore[call-overload]

    monkeypatch.setattr(durable, "open", flaky_open, raising=False)
    assert durable.read_retrying(tmp_path / "x") == b"data"
    calls = []

    def failing_open(path: object, mode: str = "r") -> object:
        calls.append(path)
        raise OSError(errno.EIO, "I/O error")

    monkeypatch.setattr(durable, "open", failing_open, raising=False)
    with pytest.raises(OSError) as err:
        durable.read_retrying(tmp_path / "x")
    assert err.value.errno == errno.EIO and len(calls) == len(durable.READ_RETRY_PAUSES) + 1
    calls.clear()
    monkeypatch.setattr(durable, "open", lambda p, m="r": (_ for _ in ()).throw(FileNotFoundError(p)))
    with pytest.raises(FileNotFoundError):
        durable.read_retrying(tmp_path / "x")  # missing is an answer, at once


def test_a_heartbeat_caught_mid_replace_is_not_a_missing_worker(tree, monkeypatch):
    rec = _worker_record(tree, f"{HOST}-beating", os.getpid())
    whole = tree.worker_file(rec.worker).read_bytes()
    answers: list[bytes | OSError] = [FileNotFoundError(errno.ENOENT, "gone for a moment"), whole]

    def flaky(path: Path) -> bytes:
        a = answers.pop(0) if answers else whole
        if isinstance(a, OSError):
            raise a
        return a

    monkeypatch.setattr(records, "read_retrying", flaky)
    assert status.read(tree.worker_file(rec.worker), WorkerRecord, replaced=True) == rec
    answers[:] = [FileNotFoundError(errno.ENOENT, "gone")]
    assert status.read(tree.worker_file(rec.worker), WorkerRecord) is None  # other records: absent


def test_a_live_worker_whose_lock_cannot_be_seen_is_alive(tree):
    """A lock taken through another mount of the export is invisible here; the
    process keeping the identity's lock file open is evidence enough."""
    worker = f"{HOST}-elsewhere"
    lock = tree.worker_lock(worker)
    lock.touch()
    holder = subprocess.Popen(
        [sys.executable, "-c", f"import time; f = open({str(lock)!r}, 'rb'); time.sleep(60)"]
    )
    try:
        deadline = time.monotonic() + 10
        while not liveness.has_lock_open(holder.pid, worker):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        rec = _worker_record(tree, worker, holder.pid)
        assert not liveness.holds_identity(tree, worker)  # no lock visible through this path
        assert liveness.assess(tree, rec, 60).health == "alive"
    finally:
        holder.kill()
        holder.wait()
    assert liveness.assess(tree, rec, 60).health == "dead"
