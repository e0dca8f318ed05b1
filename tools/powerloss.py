"""The power-loss run: the torture run on a LazyFS mount, where a kill is a power cut.

    tools/powerloss [--jobs N] [--cuts K] [--generate G] [--workers W] [--seed S]
                    [--keep-names] [--lazyfs-deaths D] [--keep DIR] [--json]

SIGKILL leaves the page cache intact; a machine that loses power does not.
Here the spool lives on a LazyFS mount (tools/lazyfs.py) and each of the K
rounds goes: submit a share of the jobs (render jobs like the torture run's,
and G generation jobs against tools/provsim.py), half through ``spool submit``
and half as drops into ``incoming/`` (most fsynced by the submitter, some not);
start the daemons (some lives with a ``SPOOL_CRASH_AT`` crash point); then, at
a random moment or the moment a daemon dies at its crash point, cut the power:
SIGKILL every spool process (daemons, FFmpeg, submitters) and drop every write
LazyFS holds that was not fsynced, then mount afresh (a LazyFS that died under
load is mounted again the same way; one that dies under a round's checks voids
that round's findings, is a power cut all the same (counted as lazyfs died), and
the round is checked again; ``--lazyfs-deaths D`` kills it so in D rounds).
LazyFS loses file data only (a name goes through at once), so the run then
takes away, at random, the names a
real filesystem may lose that spool never fsyncs the folder of (format 2: a
slot job's attempt folder and frozen copy in ``attempts/J/``), and gives back a
told-complete job's old name in ``running/W/`` whose removal a worker still owed
(``--keep-names`` leaves them all).

After each cut, before anything restarts, it checks what a reader finds
(SPEC 11, invariant 9): every acknowledged submission (``spool submit``
printed its ID, or the drop left ``incoming/`` for a job) is in a state
folder; every job in ``complete/`` has its manifest, its store object with the
right sha256 and a readable attempt record of the attempt the manifest names,
and ``spool show`` says that attempt published it; readers (``status``,
``ls``, ``show``, ``events``, ``metrics``, ``search``) never break on an empty
record. Then the daemons restart and drain, ``spool recover`` runs, ``spool
fsck`` repairs what the tree proves (and says what), and ``spool fsck
--no-repair`` and tools/invariants.py must find nothing. At the end: no job
published twice, no partial file at a final path, every complete job's
``result.json`` readable, the journal tells every finished job's state, and
the simulator got no more create requests than generation attempts began.

It prints one line of figures (``--json``: all of them) and exits 1 on any
broken promise.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import invariants
import torture
from lazyfs import LazyFS, available

from spool.core.model import AttemptRecord, Manifest
from spool.disk import store
from spool.disk.records import read
from spool.disk.tree import Tree
from spool.observe import overview
from spool.queue.attempt import staged_result

SPOOL = torture.SPOOL
STATE_DIRS = ("pending", "held", "complete", "failed")


class Run:
    """One power-loss run: its spool, daemons, submissions and what it found."""

    def __init__(self, args: argparse.Namespace, base: Path, lazy: LazyFS, sim: Any) -> None:
        self.args = args
        self.rng = random.Random(args.seed)
        self.base, self.lazy, self.sim = base, lazy, sim
        self.spool = lazy.mnt / "spool"
        self.assets, self.logs, self.subs = base / "assets", base / "logs", base / "subs"
        for d in (self.assets, self.logs, self.subs):
            d.mkdir(parents=True, exist_ok=True)
        self.workers = [torture.Worker(self.spool, f"w{k}", self.logs) for k in range(args.workers)]
        self.acked: set[str] = set()  # job IDs whose submission was acknowledged
        self.ids: list[str] = []  # every job ID submitted
        self.gen_ids: list[str] = []
        self.unsynced_drops: set[str] = set()
        self.f: Counter[str] = Counter()
        self.crash_points: Counter[str] = Counter()
        self.details: dict[str, list[str]] = {}
        self.lines_lost_max = 0
        #: The rounds in which LazyFS is killed during the checks (``--lazyfs-deaths``).
        #: Its own generator, so that a seed runs the same rounds with or without them.
        self.death_rng = random.Random(f"lazyfs-deaths-{args.seed}")
        self.deaths = set(self.death_rng.sample(range(args.cuts), min(args.lazyfs_deaths, args.cuts)))

    def note(self, what: str, detail: str) -> None:
        self.f[what] += 1
        self.details.setdefault(what, [])
        if len(self.details[what]) < 10:
            self.details[what].append(detail)

    # -- setup -------------------------------------------------------------------------
    def setup(self) -> list[tuple[str, dict[str, object]]]:
        lay = torture.Layout(self.base, self.spool, [self.spool], self.assets, self.logs)
        torture._make_spool(lay, self.args.max_attempts)
        if self.sim is not None:
            torture.provider_settings(self.spool, self.sim)
        subs: list[tuple[str, dict[str, object]]] = []
        for i in range(self.args.jobs):
            subs.append((f"t{i:04d}@1", torture.job(i, self.assets, self.rng)))
        for i in range(self.args.generate if self.sim is not None else 0):
            subs.append((f"g{i:04d}@1", torture.generation(i)))
            self.gen_ids.append(f"g{i:04d}@1")
        self.rng.shuffle(subs)
        self.ids = [jid for jid, _ in subs]
        return subs

    # -- one round -----------------------------------------------------------------------
    def round(self, k: int, batch: list[tuple[str, dict[str, object]]]) -> None:
        point_life: torture.Worker | None = None
        for w in self.workers:
            crash = torture._maybe_point(self.rng, self.args) if point_life is None else None
            w.start(crash_at=crash)
            if crash:
                point_life = w
        submitters, drops = self._submit(k, batch)
        if point_life is not None:  # a named crash point, then the cut
            deadline = time.monotonic() + self.args.max_gap * 4
            while point_life.alive() and time.monotonic() < deadline:
                time.sleep(0.01)
            if not point_life.alive() and point_life.proc and point_life.proc.returncode == -signal.SIGKILL:
                assert point_life.crash_at is not None
                self.crash_points[point_life.crash_at] += 1
        else:
            time.sleep(self.rng.uniform(0.05, self.args.max_gap))
        self._cut(submitters, drops)
        self._checked(self._check_round, dies=k in self.deaths)

    def _check_round(self) -> None:
        self._after_cut()
        self._drain_and_check()

    def _checked(self, phase: Callable[[], None], *, dies: bool = False) -> None:
        """Run a phase of checks; if LazyFS exits under it (upstream has been seen to die
        under load: a segfault in libc, then ENOTCONN for everything on the mount), what
        the phase found is not spool's doing. Its findings are dropped, the death is a
        power cut like the others (daemons killed, a fresh mount, names lost), and the
        phase runs again from the start, so a real finding is found again. ``dies``:
        LazyFS is killed at a random moment of the phase's first go (``--lazyfs-deaths``),
        so that this path is run, not only hoped for."""
        for _ in range(3):
            found = {k: self.f[k] for k in PROMISES}
            details = {k: list(v) for k, v in self.details.items()}
            kill_now = self._kill_lazyfs_soon() if dies else None
            dies = False
            try:
                phase()
            except OSError:
                if not self._lazyfs_exits():
                    raise  # ENOTCONN from a dead mount is handled below; anything else is not
            finally:
                if kill_now is not None:
                    kill_now()  # a phase quicker than the timer: LazyFS dies at its end
            if not self.lazy.exited():
                return
            self.f["findings_dropped_lazyfs_died"] += sum(self.f[k] - v for k, v in found.items())
            for k, v in found.items():
                self.f[k] = v
            self.details = details
            self.f["lazyfs_died"] += 1
            self._kill_all([w.proc for w in self.workers])
            self.lazy.restart()
            if not self.args.keep_names:
                self._lose_names()
        raise RuntimeError("LazyFS died under the same checks three times in a row: nothing to conclude")

    def _kill_lazyfs_soon(self) -> Callable[[], None]:
        """Kill LazyFS at a random moment from now; the call returned kills it at once if
        the timer has not. The process is the one running now, never the next mount's
        (which ``LazyFS.kill`` would find by the time a late timer fires)."""
        proc = self.lazy.proc
        assert proc is not None

        def kill() -> None:
            # Only the main thread reaps (``now``): a ``wait`` here made the main thread's
            # ``poll`` answer None (the reaping lock busy) for a LazyFS already dead.
            if proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)

        timer = threading.Timer(self.death_rng.uniform(0.2, 2.0), kill)
        timer.daemon = True
        timer.start()

        def now() -> None:
            timer.cancel()
            kill()
            proc.wait()

        return now

    def _lazyfs_exits(self, within: float = 10.0) -> bool:
        """Whether LazyFS is gone, waiting up to ``within`` s: a call on its mount fails
        (ENOTCONN, ECONNABORTED) while the process is still dying, before it can be reaped."""
        proc = self.lazy.proc
        if proc is None:
            return True
        try:
            proc.wait(timeout=within)
        except subprocess.TimeoutExpired:
            return False
        return True

    def _submit(
        self, k: int, batch: list[tuple[str, dict[str, object]]]
    ) -> tuple[list[tuple[subprocess.Popen[str], list[str]]], dict[str, str]]:
        """Half by ``spool submit`` (a process per 1-3 files, in the background), half as
        drops into incoming/; returns the submitters with their job IDs and the drops
        (file name -> job ID)."""
        by_cli: list[tuple[str, dict[str, object]]] = []
        drops: dict[str, str] = {}
        for jid, sub in batch:
            if self.rng.random() < 0.5:
                by_cli.append((jid, sub))
                continue
            name = f"{jid.split('@')[0]}.json"
            tmp = self.spool / "incoming" / f".{name}.tmp"
            synced = self.rng.random() < 0.8
            try:
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
                try:
                    os.write(fd, json.dumps(sub).encode())
                    if synced:
                        os.fsync(fd)  # a careful submitter; the others may lose their drop in a cut
                finally:
                    os.close(fd)
                os.rename(tmp, self.spool / "incoming" / name)
            except OSError:
                if not self.lazy.exited():
                    raise
                continue  # LazyFS died before the cut (which counts it): a drop never made
            if not synced:
                self.unsynced_drops.add(jid)
            drops[name] = jid
        procs = []
        while by_cli:
            take, by_cli = by_cli[: self.rng.randint(1, 3)], by_cli[self.rng.randint(1, 3) :]
            files = []
            for jid, sub in take:
                f = self.subs / f"{jid.split('@')[0]}.json"
                f.write_text(json.dumps(sub))
                files.append(str(f))
            p = subprocess.Popen(
                [SPOOL, "submit", "--spool", str(self.spool), *files],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
            )  # fmt: skip
            procs.append((p, [jid for jid, _ in take]))
        return procs, drops

    def _cut(self, submitters: list[tuple[subprocess.Popen[str], list[str]]], drops: dict[str, str]) -> None:
        """SIGKILL every spool process, note what was acknowledged, drop the unsynced writes."""
        self._kill_all([w.proc for w in self.workers] + [p for p, _ in submitters])
        for p, jids in submitters:
            out, _ = p.communicate()
            printed = set(out.split())
            self.acked |= {j for j in jids if j in printed}  # the ID is printed once it is durable
        incoming = {n for n in os.listdir(self.spool / "incoming")}
        left = [n for n in drops if n not in incoming and not any(i.endswith("." + n) for i in incoming)]
        rejected = {n for n in os.listdir(self.spool / "rejected")}
        for n in left:
            if n in rejected:
                self.note("drops_rejected", n)  # answered with a reason, not taken as a job
                if drops[n] not in self.unsynced_drops:
                    self.note("synced_drop_rejected", n)
            else:
                self.acked.add(drops[n])
        before = _journal_lines(self.spool)
        if not self.lazy.cut():
            self.f["lazyfs_died"] += 1
        self.f["cuts"] += 1
        if not self.args.keep_names:
            self._lose_names()
        after = _journal_lines(self.spool)
        lost = sum(max(0, n - after.get(f, 0)) for f, n in before.items())
        self.f["journal_lines_before_cuts"] += sum(before.values())
        self.f["journal_lines_lost"] += lost
        self.lines_lost_max = max(self.lines_lost_max, lost)

    def _lose_names(self) -> None:
        """What LazyFS cannot do: lose a name whose folder was never fsynced (LazyFS loses
        file data only; names go through at once). Format 2 fsyncs ``attempts/J/`` at no
        step of a slot job that completes or is cut while running: its latest attempt's
        folder and, before any attempt's ending synced that folder, the frozen copy's name
        may be gone after a real power cut. So, for each job whose ``attempts/J/`` holds
        only that (no record beside the attempts: a delay, a recovery, a retry mark; no
        generation, no attempt opened by recovery or cancel; the latest attempt with no
        durable ending record), each of the two names goes with probability 1/2. And a
        name a removal took may come back (:meth:`_old_names_back`)."""
        root = self.spool / "attempts"
        for jdir in sorted(root.iterdir()) if root.is_dir() else []:
            names = [n for n in os.listdir(jdir) if not n.startswith(".")]
            if any(n != "job.json" and not n.isdigit() for n in names):
                continue  # a record beside the attempts fsynced attempts/J/ after them
            nums = sorted(int(n) for n in names if n.isdigit())
            if nums:
                last = jdir / str(nums[-1])
                if any((last / r).exists() for r in ("gen", "failure.json", "interrupted.json")):
                    continue  # opened durably (a generation) or ended by a durable record
                rec = read(last / "attempt.json", AttemptRecord)
                if rec is not None and rec.reason != "claim":
                    continue  # recovery's or cancel's attempt: opened durably
                if self.rng.random() < 0.5:
                    shutil.rmtree(last)
                    self.f["names_lost_attempt_folders"] += 1
            if "job.json" in names and len(nums) <= 1 and self.rng.random() < 0.5:
                (jdir / "job.json").unlink()
                self.f["names_lost_frozen_copies"] += 1
        self._old_names_back()

    def _old_names_back(self) -> None:
        """A publish batch's removals from ``running/W/`` are owed to the worker's next folder
        fsync (``spool.disk.groupcommit.Owed``), so a real cut may keep a told-complete job's
        old name there (the same inode as ``complete/J.json``). Each worker's latest batch
        (its manifests published within 50 ms of its last) is the one that may still owe it:
        each of those jobs gets its old name back with probability 1/2."""
        tree = Tree.at(self.spool)
        by_worker: dict[str, list[tuple[float, str]]] = {}
        for name in os.listdir(tree.complete):
            if not name.endswith(".json") or name.startswith("."):
                continue
            m = read(tree.manifest_file(name[:-5]), Manifest)
            if m is not None and m.worker:
                by_worker.setdefault(m.worker, []).append((m.published_at.timestamp(), name[:-5]))
        for worker, published in sorted(by_worker.items()):
            last = max(t for t, _ in published)
            for t, jid in sorted(published):
                if t < last - 0.05 or not tree.running_dir(worker).is_dir() or self.rng.random() >= 0.5:
                    continue
                try:
                    os.link(tree.job_file("complete", jid), tree.job_file("running", jid, worker))
                except FileExistsError:
                    continue
                self.f["names_back_running"] += 1

    def _after_cut(self) -> None:
        """What a reader finds right after the cut, before anything restarts."""
        tree = Tree.at(self.spool)
        where = _where(self.spool)
        for jid in sorted(self.acked):
            if jid not in where:
                self.note("acknowledged_lost", jid)
        for name in sorted(os.listdir(self.spool / "complete")):
            if name.endswith(".json") and not name.startswith("."):
                self._check_complete(tree, name[:-5], after_repair=False)
        self._readers(tree)

    def _check_complete(self, tree: Tree, jid: str, *, after_repair: bool) -> None:
        m = read(tree.manifest_file(jid), Manifest)
        if m is None:
            self.note("complete_without_manifest", jid)
            return
        if store.verify(tree, m) is not None:
            self.note("complete_store_mismatch", jid)
        adir = tree.attempt_dir(jid, m.attempt)
        rec = read(adir / "attempt.json", AttemptRecord)
        # The readable record of the attempt that published: its attempt.json, or (format 2,
        # which does not fsync a slot attempt's record) the manifest naming that attempt with
        # its identity, durable before complete/. After fsck, attempt.json always.
        names_it = bool(m.worker and m.host and m.boot_id and m.claimed_at)
        if rec is None and (after_repair or not names_it):
            self.note("complete_without_attempt_record", jid)
        if after_repair and staged_result(adir) is None:
            self.note("complete_without_result_record", jid)
        try:
            info = overview.job_detail(tree, jid)
        except Exception as exc:  # a reader that breaks is what this counts
            self.note("readers_broken", f"job_detail {jid}: {exc!r}")
            return
        said = next((a["outcome"] for a in (info or {}).get("attempts", []) if a["n"] == m.attempt), None)
        if said != "published":
            self.note("show_contradicts_tree", f"{jid}: attempt {m.attempt} shown as {said!r}")

    def _readers(self, tree: Tree) -> None:
        """The read commands, as a person would run them right after the cut."""
        sample = self.rng.sample(self.ids, min(4, len(self.ids)))
        commands = [
            ["status", "--json"],
            ["ls", "--json"],
            ["events", "--json"],
            ["metrics"],
            ["search", "campaign=torture", "--json"],
            *(["show", j, "--json"] for j in sample),
            *(["show", j] for j in sample[:1]),
            ["status"],
        ]
        for c in commands:
            r = self._run([SPOOL, *c, "--spool", str(self.spool)])
            if r is None:
                continue  # LazyFS hung under it (counted), not the reader's doing
            self.f["reader_calls"] += 1
            if r.returncode not in (0, 3, 4) or "Traceback" in r.stderr:
                self.note("readers_broken", f"spool {' '.join(c)}: exit {r.returncode}: {r.stderr[-300:]}")

    # -- LazyFS hangs ------------------------------------------------------------------
    def _kill_all(self, procs: list[subprocess.Popen[Any] | None]) -> None:
        """SIGKILL every process (its whole group) and reap it. One stuck in a request to
        a hung LazyFS cannot die until LazyFS does: then LazyFS is killed and mounted
        afresh (a cut all the same; counted as a hang)."""
        live = [p for p in procs if p is not None]
        for p in live:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        hung = False
        for p in live:
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                hung = True
        if hung:
            self._unhang()
            for p in live:
                p.wait()

    def _unhang(self) -> None:
        self.note("lazyfs_hung", f"round {self.f['cuts']}")
        self.lazy.kill()  # every request waiting on it fails: its callers can die now
        for w in self.workers:
            if w.proc is not None and w.proc.poll() is None:
                os.killpg(w.proc.pid, signal.SIGKILL)
                w.proc.wait()
        self.lazy.unmount()
        self.lazy.mount()

    def _run(self, argv: list[str], timeout: float = 120.0) -> subprocess.CompletedProcess[str] | None:
        """A command on the spool; ``None`` if it was stuck in a request LazyFS never
        answered (then LazyFS was restarted). A command stuck elsewhere is a finding."""
        p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            out, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            stuck = _in_fuse_wait([p.pid])
            if not stuck:
                p.kill()
                out, err = p.communicate()
                return subprocess.CompletedProcess(argv, -9, out, err + f"\n(stuck for {timeout:g} s)")
            self._unhang()
            p.kill()
            p.communicate()
            return None
        return subprocess.CompletedProcess(argv, p.returncode, out, err)

    def _drain(self) -> None:
        """Every worker without crash points until nothing is left, then ``spool recover``
        (torture's drain, with LazyFS hangs seen and survived: a drain that does not end
        while the mount does not answer restarts LazyFS and drains again)."""
        for _ in range(4):
            self._kill_all([w.proc for w in self.workers])
            from spool.queue import health

            tree = Tree.at(self.spool)
            for q in tree.workers.glob("*.quarantined"):
                health.release(tree, q.name[: -len(".quarantined")])
            for w in self.workers:
                w.start(drain=True)
            deadline = time.monotonic() + self.args.timeout
            while any(w.alive() for w in self.workers) and time.monotonic() < deadline:
                if self.lazy.exited():
                    return  # a dead mount: the round's checks start again on a fresh one
                time.sleep(0.1)
            if not any(w.alive() for w in self.workers):
                break
            if not _in_fuse_wait([w.proc.pid for w in self.workers if w.proc is not None and w.alive()]):
                self.note("drain_timeout", f"round {self.f['cuts']}")
                break
            self._unhang()
        else:
            self.note("drain_timeout", f"round {self.f['cuts']}: LazyFS kept hanging")
        self._kill_all([w.proc for w in self.workers])
        for _ in range(3):
            if self._run([SPOOL, "recover", "--spool", str(self.spool)]) is not None:
                break

    def _fsck(self, *, repair: bool) -> list[dict[str, Any]]:
        args = [SPOOL, "fsck", "--spool", str(self.spool), "--json", "--settle", "0"]
        for _ in range(3):
            r = self._run(args if repair else [*args, "--no-repair"], timeout=300)
            if r is None:
                continue
            try:
                problems: list[dict[str, Any]] = json.loads(r.stdout)["problems"]
            except (ValueError, KeyError):
                return [{"path": "(fsck)", "problem": f"exit {r.returncode}: {r.stderr[-300:]}"}]
            return problems
        return [{"path": "(fsck)", "problem": "LazyFS hung under it three times"}]

    def _drain_and_check(self) -> None:
        self._drain()
        fix = self._fsck(repair=True)
        for p in fix:
            if p.get("repaired"):
                self.f[_repair_kind(p)] += 1
        left = self._fsck(repair=False)
        for p in left:
            self.note("fsck_problems", f"{p.get('path')}: {p.get('problem')}")
        for p in invariants.check(self.spool):
            self.note("independent_problems", p)
        where = _where(self.spool)
        for jid in sorted(self.acked):
            if where.get(jid) not in ("complete", "failed"):
                self.note("acknowledged_not_finished", f"{jid}: {where.get(jid)}")

    # -- the end ------------------------------------------------------------------------
    def finish(self) -> None:
        tree = Tree.at(self.spool)
        where = _where(self.spool)
        for jid, state in sorted(where.items()):
            if state == "complete":
                self._check_complete(tree, jid, after_repair=True)
        completes: Counter[str] = Counter()
        rebuilt = 0
        for f in (self.spool / "events").glob("*.jsonl"):
            for line in f.read_bytes().splitlines():
                try:
                    ev = json.loads(line)
                except ValueError:
                    continue
                if ev.get("to") == "complete":
                    completes[ev["job"]] += 1
                rebuilt += bool(ev.get("rebuilt"))
        for jid, n in completes.items():
            if n > 1:
                self.note("double_published", jid)
        self.f["journal_lines_rebuilt"] = rebuilt
        from spool.repair import lostwrites

        for g in lostwrites.journal_gaps(tree, 0.0):
            self.note("journal_untold", f"{g.job_id}: {g.state}, journal says {g.last}")
        self.f["partial_at_final"] = sum(
            1 for p in invariants.check(self.spool) if p.startswith("invariant 2")
        )
        self.f["complete"] = sum(1 for s in where.values() if s == "complete")
        self.f["failed"] = sum(1 for s in where.values() if s == "failed")


def _in_fuse_wait(pids: list[int], looks: int = 3, gap: float = 1.0) -> bool:
    """Whether a thread of these processes sits in a FUSE request that is never answered:
    seen waiting for the answer (``request_wait_answer``) at every one of ``looks`` looks.
    A request LazyFS serves takes milliseconds; a hung LazyFS never answers."""
    for k in range(looks):
        if k:
            time.sleep(gap)
        waiting = False
        for pid in pids:
            try:
                tasks = os.listdir(f"/proc/{pid}/task")
            except OSError:
                continue
            for t in tasks:
                try:
                    with open(f"/proc/{pid}/task/{t}/wchan") as f:
                        waiting = waiting or f.read().strip() == "request_wait_answer"
                except OSError:
                    continue
        if not waiting:
            return False
    return True


def _where(spool: Path) -> dict[str, str]:
    """Every job's state folder, from names alone."""
    out: dict[str, str] = {}
    for state in STATE_DIRS:
        for n in os.listdir(spool / state):
            if n.endswith(".json") and not n.startswith("."):
                out[n[:-5]] = state
    for w in (spool / "running").iterdir():
        if w.is_dir():
            for n in os.listdir(w):
                if n.endswith(".json") and not n.startswith("."):
                    out[n[:-5]] = "running"
    return out


def _journal_lines(spool: Path) -> dict[str, int]:
    out = {}
    for f in (spool / "events").glob("*.jsonl"):
        try:
            out[f.name] = f.read_bytes().count(b"\n")
        except OSError:
            out[f.name] = 0
    return out


def _repair_kind(p: dict[str, Any]) -> str:
    """A short name for what fsck repaired, for the figures."""
    path, problem = str(p.get("path", "")), str(p.get("problem", ""))
    if path.startswith("events/"):
        return "fsck_journal_lines_rebuilt"
    if path.endswith("result.json") or path.endswith("attempt.json"):
        return (
            "fsck_result_records_rewritten"
            if p.get("repair") == "write it again"
            else "fsck_records_set_aside"
        )
    if problem.startswith("missing:"):
        return "fsck_names_restored"
    if "record is" in problem:
        return "fsck_records_set_aside"
    return "fsck_other_repairs"


def run(args: argparse.Namespace) -> dict[str, Any]:
    why = available()
    if why:
        raise SystemExit(f"powerloss: {why}")
    base = Path(args.keep).absolute() if args.keep else Path(tempfile.mkdtemp(prefix="spool-powerloss-"))
    base.mkdir(parents=True, exist_ok=True)
    lazy = LazyFS(base / "lazy")
    started = time.monotonic()
    sim_ctx: Any = None
    if args.generate:
        from provsim import ProviderSim

        token = f"powerloss-{os.getpid()}-{random.Random(args.seed).getrandbits(64):016x}"
        os.environ[torture.GEN_TOKEN_ENV] = token  # the daemons inherit it; never written to the spool
        sim_ctx = ProviderSim(token=token, work=1.0)
    r: Run | None = None
    try:
        lazy.mount()
        sim = sim_ctx.__enter__() if sim_ctx is not None else None
        r = Run(args, base, lazy, sim)
        subs = r.setup()
        per = -(-len(subs) // args.cuts) if subs else 0
        for k in range(args.cuts):
            r.round(k, subs[k * per : (k + 1) * per])
        r._checked(r.finish)
        figures = _figures(r, time.monotonic() - started)
        if sim is not None:
            figures |= torture._generation_figures(r.spool, r.gen_ids, sim)
    finally:
        if r is not None:
            r._kill_all([w.proc for w in r.workers])
        if sim_ctx is not None:
            sim_ctx.__exit__(None, None, None)
        lazy.close()
    figures["clean"] = not broken(figures)
    if figures["clean"] and not args.keep:
        shutil.rmtree(base, ignore_errors=True)
        figures["base"] = "(removed)"
    else:
        figures["base"] = str(base)
    return figures


#: Figures that must be 0 for the run to keep every promise.
PROMISES = (
    "acknowledged_lost",
    "acknowledged_not_finished",
    "double_published",
    "partial_at_final",
    "complete_without_manifest",
    "complete_store_mismatch",
    "complete_without_attempt_record",
    "complete_without_result_record",
    "show_contradicts_tree",
    "readers_broken",
    "synced_drop_rejected",
    "drain_timeout",
    "journal_untold",
    "fsck_problems",
    "independent_problems",
    "generation_creates_over_attempts",
)


def broken(f: dict[str, Any]) -> list[str]:
    return [k for k in PROMISES if f.get(k)]


def _figures(r: Run, wall: float) -> dict[str, Any]:
    f: dict[str, Any] = {k: r.f.get(k, 0) for k in PROMISES if not k.startswith("generation")}
    f |= {
        "jobs": len(r.ids),
        "acknowledged": len(r.acked),
        "complete": r.f["complete"],
        "failed": r.f["failed"],
        "cuts": r.f["cuts"],
        "lazyfs_died": r.f["lazyfs_died"],
        "lazyfs_hung": r.f["lazyfs_hung"],
        "lazyfs_deaths_induced": len(r.deaths),
        "findings_dropped_lazyfs_died": r.f["findings_dropped_lazyfs_died"],
        "crash_points_hit": dict(sorted(r.crash_points.items())),
        "daemon_lives": sum(w.lives for w in r.workers),
        "drops_rejected": r.f["drops_rejected"],
        "unsynced_drops": len(r.unsynced_drops),
        "reader_calls": r.f["reader_calls"],
        "journal_lines_lost": r.f["journal_lines_lost"],
        "journal_lines_lost_max_per_cut": r.lines_lost_max,
        "journal_lines_rebuilt": r.f["journal_lines_rebuilt"],
        "fsck_result_records_rewritten": r.f["fsck_result_records_rewritten"],
        "fsck_records_set_aside": r.f["fsck_records_set_aside"],
        "fsck_journal_lines_rebuilt": r.f["fsck_journal_lines_rebuilt"],
        "fsck_names_restored": r.f["fsck_names_restored"],
        "fsck_other_repairs": r.f["fsck_other_repairs"],
        "names_lost_attempt_folders": r.f["names_lost_attempt_folders"],
        "names_lost_frozen_copies": r.f["names_lost_frozen_copies"],
        "names_back_running": r.f["names_back_running"],
        "wall_seconds": round(wall, 1),
        "details": r.details,
    }
    return f


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=40)
    ap.add_argument("--cuts", type=int, default=10)
    ap.add_argument("--generate", type=int, default=0, help="generation jobs, against tools/provsim.py")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--max-gap", type=float, default=2.0, help="longest wait before a cut, seconds")
    ap.add_argument(
        "--crash-point-rate", type=float, default=0.4, help="share of rounds cut at a crash point"
    )
    ap.add_argument("--max-attempts", type=int, default=10)
    ap.add_argument(
        "--timeout", type=float, default=120.0, help="seconds allowed for each drain (then: is LazyFS hung?)"
    )
    ap.add_argument(
        "--keep-names",
        action="store_true",
        help="do not also lose the names format 2 never fsyncs the folder of (see Run._lose_names)",
    )
    ap.add_argument(
        "--lazyfs-deaths",
        type=int,
        default=0,
        help="rounds in which LazyFS is killed during the checks (the harness must survive it)",
    )
    ap.add_argument("--keep", help="build everything here and keep it")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    def stop(signum: int, frame: object) -> None:
        raise KeyboardInterrupt  # unwind: daemons killed, simulator stopped, LazyFS unmounted

    signal.signal(signal.SIGTERM, stop)
    f = run(args)
    if args.json:
        print(json.dumps(f, indent=2))
    else:
        gen = (
            f" generations={f['generations']} creates={f['generation_creates']} "
            f"attempts={f['generation_attempts']}"
            if "generations" in f
            else ""
        )
        print(
            f"jobs={f['jobs']} acknowledged={f['acknowledged']} complete={f['complete']} "
            f"failed={f['failed']} "
            f"cuts={f['cuts']} (lazyfs died {f['lazyfs_died']} ({f['lazyfs_deaths_induced']} induced, "
            f"{f['findings_dropped_lazyfs_died']} findings dropped with it), "
            f"hung {f['lazyfs_hung']}, crash points "
            f"{sum(f['crash_points_hit'].values())}) daemon_lives={f['daemon_lives']}{gen} | "
            f"acknowledged_lost={f['acknowledged_lost']} double_published={f['double_published']} "
            f"partial={f['partial_at_final']} complete_without_attempt_record="
            f"{f['complete_without_attempt_record'] + f['complete_without_result_record']} "
            f"show_contradicts={f['show_contradicts_tree']} readers_broken={f['readers_broken']}/"
            f"{f['reader_calls']} journal_lines_lost={f['journal_lines_lost']} (max "
            f"{f['journal_lines_lost_max_per_cut']}/cut, rebuilt {f['journal_lines_rebuilt']}) "
            f"result_records_rewritten={f['fsck_result_records_rewritten']} "
            f"records_set_aside={f['fsck_records_set_aside']} names_lost="
            f"{f['names_lost_attempt_folders']}+{f['names_lost_frozen_copies']} (restored "
            f"{f['fsck_names_restored']}) old_names_back={f['names_back_running']} "
            f"fsck_problems={f['fsck_problems']} "
            f"independent_problems={f['independent_problems']} wall={f['wall_seconds']}s"
        )
        if not f["clean"]:
            print(json.dumps(f["details"], indent=2), file=sys.stderr)
            print(f"kept at {f['base']}", file=sys.stderr)
    return 0 if f["clean"] else 1


if __name__ == "__main__":
    sys.exit(main())
