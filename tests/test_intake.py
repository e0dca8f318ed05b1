"""incoming/ and rejected/ under abuse (issue 11, items 5, 7, 8 and 9).

Real files, real FIFOs and symlinks, a real inotify watcher and real daemons.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import threading
import time
from pathlib import Path

import pytest
from conftest import minimal, wait_for

from spool.core import settings
from spool.core.config import Config
from spool.core.model import Rejection, decode
from spool.disk.tree import Tree
from spool.queue import accept, status
from spool.queue.arrivals import Arrivals
from spool.queue.events import Journal
from spoold.watcher import Watcher

# -- 5: a drop named like a reason ----------------------------------------------------------


def shell_count_rejected(tree: Tree) -> int:
    """The README's shell recipe, run by a real shell."""
    out = subprocess.run(
        ["bash", "-c", r"""ls rejected | grep '\.json$' | grep -vc '\.error\.json$'"""],
        cwd=tree.root,
        capture_output=True,
        text=True,
    )
    return int(out.stdout.strip())


def test_a_drop_named_like_a_reason_is_listed_counted_and_explained(
    tree: Tree, cfg: Config, journal: Journal
):
    (tree.incoming / "oops.error.json").write_bytes(b"[]")
    (out,) = accept.accept_incoming(tree, cfg, "w1", journal)
    assert isinstance(out, accept.Rejected)
    assert sorted(os.listdir(tree.rejected)) == ["oops-error.error.json", "oops-error.json"]
    assert (tree.rejected / "oops-error.json").read_bytes() == b"[]"
    rec = decode((tree.rejected / "oops-error.error.json").read_bytes(), Rejection)
    assert rec.file == "oops.error.json" and "JSON object" in rec.reason
    assert status.counts(tree)["rejected"] == 1
    assert status.job_ids(tree, "rejected") == [("oops-error", None)]
    assert shell_count_rejected(tree) == 1


@pytest.mark.parametrize("fmt", ["2", "1"])
def test_an_accepted_drop_is_kept_beside_its_job_not_freed(
    tree: Tree, cfg: Config, journal: Journal, assets: Path, monkeypatch: pytest.MonkeyPatch, fmt: str
):
    """Format 2 moves the accepted drop (the same inode) to attempts/J/submission.json: a
    removal would free an inode on the hot path. Format 1 removes it, as it always did."""
    monkeypatch.setenv("SPOOL_WRITE_FORMAT", fmt)
    data = json.dumps(minimal(assets, "kept")).encode()
    (tree.incoming / "kept.json").write_bytes(data)
    ino = os.stat(tree.incoming / "kept.json").st_ino
    (out,) = accept.accept_incoming(tree, cfg, "w1", journal)
    assert isinstance(out, accept.Accepted)
    assert os.listdir(tree.incoming) == []
    kept = tree.job_attempts(out.job.job_id) / accept.SUBMISSION
    if fmt == "2":
        assert kept.read_bytes() == data and kept.stat().st_ino == ino
    else:
        assert not kept.exists()


def test_only_a_new_job_is_handed_over_as_bytes_to_index_without_its_file(
    tree: Tree, cfg: Config, journal: Journal, assets: Path
):
    """The daemon indexes a job from the bytes acceptance wrote, and skips looking for a
    retry's delay.json or a blocked-*.json (a new job has had no attempt). A drop delivered
    again after a crash finds its job already made: that job may have run and be waiting out
    a retry, so it comes without bytes and is indexed from its file, delay and all."""
    data = json.dumps(minimal(assets, "again")).encode()
    (tree.incoming / "again.json").write_bytes(data)
    (first,) = accept.accept_incoming(tree, cfg, "w1", journal)
    assert isinstance(first, accept.Accepted) and first.data is not None
    # The same drop again, as a crash before its move out of incoming/ leaves it.
    (tree.incoming / ".accepting.w1.again.json").write_bytes(data)
    (again,) = accept.accept_incoming(tree, cfg, "w1", journal)
    assert isinstance(again, accept.Accepted) and again.job.job_id == first.job.job_id
    assert again.data is None


def test_an_acceptance_batch_out_of_time_leaves_the_drops_it_did_not_take(
    tree: Tree, cfg: Config, journal: Journal, assets: Path
):
    """A batch tells nothing and claims nothing until it ends, and a render's drop is probed
    at acceptance, so the daemon bounds a batch by time (spoold.daemon.INTAKE_SECONDS): past
    it, the drops not yet taken stay in incoming/ under their own names for the next batch."""
    for i in range(4):
        (tree.incoming / f"t{i}.json").write_bytes(json.dumps(minimal(assets, f"t{i}")).encode())
    (first,) = accept.accept_incoming(tree, cfg, "w1", journal, seconds=0)  # out of time at once
    assert isinstance(first, accept.Accepted) and first.job.job_id == "t0@1"
    assert sorted(os.listdir(tree.incoming)) == ["t1.json", "t2.json", "t3.json"]
    rest = accept.accept_incoming(tree, cfg, "w1", journal)
    assert [o.job.job_id for o in rest if isinstance(o, accept.Accepted)] == ["t1@1", "t2@1", "t3@1"]
    assert os.listdir(tree.incoming) == []


# -- 8: reasons name what the user dropped ----------------------------------------------------


def test_a_reason_names_the_dropped_file_not_the_claim_name(tree: Tree, cfg: Config, journal: Journal):
    (tree.incoming / "huge.json").write_bytes(b" " * (cfg.acceptance.max_submission_bytes + 10))
    (out,) = accept.accept_incoming(tree, cfg, "w1", journal)
    assert isinstance(out, accept.Rejected)
    rec = decode((tree.rejected / "huge.error.json").read_bytes(), Rejection)
    assert rec.reason.startswith("submission: huge.json is larger than"), rec.reason
    assert ".accepting" not in rec.reason and ".accepting" not in str(out.error)


# -- 9: hostile objects -----------------------------------------------------------------------------


def test_hostile_objects_leave_only_regular_files_in_rejected(tree: Tree, cfg: Config, journal: Journal):
    passwd = Path("/etc/passwd").read_bytes()
    os.mkfifo(tree.incoming / "pipe.json")
    os.symlink("/etc/passwd", tree.incoming / "passwd.json")
    (tree.incoming / "empty.json").mkdir()
    (tree.incoming / "full.json").mkdir()
    (tree.incoming / "full.json" / "inside.txt").write_text("kept")
    outcomes = accept.accept_incoming(tree, cfg, "w1", journal)
    assert len(outcomes) == 4 and all(isinstance(o, accept.Rejected) for o in outcomes)
    assert os.listdir(tree.incoming) == []

    visible = sorted(n for n in os.listdir(tree.rejected) if not n.startswith("."))
    assert len(visible) == 8
    for n in visible:
        assert stat.S_ISREG(os.lstat(tree.rejected / n).st_mode), n
    reasons = {
        n: decode((tree.rejected / f"{n}.error.json").read_bytes(), Rejection).reason
        for n in ("pipe", "passwd", "empty", "full")
    }
    assert "is a FIFO (named pipe)" in reasons["pipe"]
    assert "is a symbolic link" in reasons["passwd"] and "/etc/passwd" in reasons["passwd"]
    assert "is a folder" in reasons["empty"] and "removed" in reasons["empty"]
    assert "rejected/.kept/full.json" in reasons["full"]
    assert (tree.rejected / ".kept" / "full.json" / "inside.txt").read_text() == "kept"
    assert Path("/etc/passwd").read_bytes() == passwd
    # the README's promise: reading every rejection from a shell never blocks
    done = subprocess.run(
        ["bash", "-c", "cat rejected/*.json >/dev/null && sha256sum rejected/*"], cwd=tree.root, timeout=10
    )
    assert done.returncode == 0


# -- 7: only finished drops are taken -----------------------------------------------------------


def test_a_file_open_for_writing_is_not_taken_until_closed(tree: Tree, cfg: Config, journal: Journal):
    """The real watcher: inotify says when the writer closed the file."""
    arrivals = Arrivals(tree.incoming, quiet=30.0)
    watcher = Watcher([tree.incoming], tree.pending, arrivals)
    assert watcher.start()
    try:
        data = json.dumps({"name": "half"}).encode()
        with open(tree.incoming / "half.json", "wb") as f:
            f.write(data[:5])
            f.flush()
            # the watcher has seen it created (and not closed): an event, not a time (inotify
            # queues an event before the call that caused it returns)
            assert watcher.poll()
            assert arrivals.why_waiting("half.json") == "still open for writing"
            assert accept.accept_incoming(tree, cfg, "w1", journal, arrivals=arrivals) == []
            f.write(data[5:])
        assert watcher.poll()  # closed after writing
        assert arrivals.ready("half.json", os.lstat(tree.incoming / "half.json"))
        (out,) = accept.accept_incoming(tree, cfg, "w1", journal, arrivals=arrivals)
        assert isinstance(out, accept.Rejected) and "JSON" not in str(out.error)  # parsed whole
        assert (tree.rejected / "half.json").read_bytes() == data  # whole (it is rejected for its content)
    finally:
        watcher.stop()


def test_a_hidden_name_wakes_nothing_only_the_drop_it_becomes_does(tree: Tree):
    """A submitter's temp file (created, written, closed, renamed away) and our own hidden
    names are never drops: only the visible end of the rename brings the loop work (each
    wake was a loop step on the drop-to-claim path)."""
    arrivals = Arrivals(tree.incoming, quiet=30.0)
    watcher = Watcher([tree.incoming, tree.pending], tree.pending, arrivals)
    assert watcher.start()
    try:
        tmp = tree.incoming / ".drop.json.tmp"
        tmp.write_bytes(b'{"name": "drop"}')
        (tree.pending / ".j@1.json.host.1.abcd.tmp").write_bytes(b"{}")
        os.unlink(tree.pending / ".j@1.json.host.1.abcd.tmp")
        assert not watcher.poll() and watcher.changed() == {}
        os.rename(tmp, tree.incoming / "drop.json")
        assert watcher.poll()
        assert arrivals.ready("drop.json", os.lstat(tree.incoming / "drop.json"))
        assert not watcher.poll()  # nothing more
    finally:
        watcher.stop()


def test_without_inotify_a_drop_waits_for_a_quiet_period(tree: Tree, cfg: Config, journal: Journal):
    arrivals = Arrivals(tree.incoming, quiet=0.6)
    path = tree.incoming / "slow.json"
    path.write_bytes(b'{"na')
    assert accept.accept_incoming(tree, cfg, "w1", journal, arrivals=arrivals) == []
    time.sleep(0.4)
    with open(path, "ab") as f:
        f.write(b'me": "slow"}')  # changed within the quiet period: the clock starts again
    time.sleep(0.4)
    assert accept.accept_incoming(tree, cfg, "w1", journal, arrivals=arrivals) == []
    time.sleep(0.7)  # unchanged for the quiet period since this process saw the change
    (out,) = accept.accept_incoming(tree, cfg, "w1", journal, arrivals=arrivals)
    assert isinstance(out, accept.Rejected)
    assert (tree.rejected / "slow.json").read_bytes() == b'{"name": "slow"}'


def test_daemon_accepts_a_shell_redirection_that_writes_late(
    tree: Tree, assets: Path, daemons, tmp_path: Path
):
    job = tmp_path / "j.json"
    job.write_text(json.dumps(minimal(assets, name="late")))
    d = daemons(tree)
    wait_for(lambda: (tree.workers / f"{os.uname().nodename}-w1.json").exists(), timeout=30)
    subprocess.run(["bash", "-c", f"(sleep 1; cat {job}) > {tree.incoming}/x.json"], check=True)
    wait_for(lambda: status.locate(tree, "late@1") or list(tree.rejected.iterdir()), timeout=30)
    assert os.listdir(tree.rejected) == [], d.output()[-3000:]
    assert d.alive()


def test_polling_daemon_accepts_a_slow_copy_whole(tree: Tree, assets: Path, daemons):
    settings.write(tree.config_file, {"daemon": {"watch": "poll"}})
    data = b" " * 200_000 + json.dumps(minimal(assets, name="slowcopy")).encode()  # no prefix is JSON
    d = daemons(tree)
    wait_for(lambda: (tree.workers / f"{os.uname().nodename}-w1.json").exists(), timeout=30)

    def copy_slowly() -> None:
        with open(tree.incoming / "slowcopy.json", "wb") as f:
            for i in range(0, len(data), 50_000):
                f.write(data[i : i + 50_000])
                f.flush()
                time.sleep(0.3)

    t = threading.Thread(target=copy_slowly)
    t.start()
    t.join()
    wait_for(lambda: status.locate(tree, "slowcopy@1") or list(tree.rejected.iterdir()), timeout=30)
    assert os.listdir(tree.rejected) == [], d.output()[-3000:]
    assert d.alive()


def test_two_folders_of_the_same_name_are_both_kept(tree: Tree, cfg: Config, journal: Journal):
    for i in (1, 2):
        (tree.incoming / "twice.json").mkdir()
        (tree.incoming / "twice.json" / "f.txt").write_text(str(i))
        (out,) = accept.accept_incoming(tree, cfg, "w1", journal)
        assert isinstance(out, accept.Rejected)
    kept = tree.rejected / ".kept"
    assert sorted(os.listdir(kept)) == ["twice-2.json", "twice.json"]
    assert (kept / "twice-2.json" / "f.txt").read_text() == "2"
    assert os.listdir(tree.incoming) == []


def test_a_file_hard_linked_in_is_taken_at_once(tree: Tree, cfg: Config, journal: Journal):
    """Maildir's link delivery: the file was finished elsewhere; inotify shows only its creation."""
    arrivals = Arrivals(tree.incoming, quiet=30.0)
    watcher = Watcher([tree.incoming], tree.pending, arrivals)
    assert watcher.start()
    try:
        elsewhere = tree.root / "linked.json"
        elsewhere.write_bytes(b"[]")
        os.link(elsewhere, tree.incoming / "linked.json")
        assert watcher.poll()
        assert accept.accept_incoming(tree, cfg, "w1", journal, arrivals=arrivals)
        assert (tree.rejected / "linked.json").read_bytes() == b"[]"
    finally:
        watcher.stop()


def test_incoming_is_listed_when_a_drop_arrives_and_on_the_timer_not_at_every_step(tree: Tree, assets: Path):
    """The loop lists incoming/ when its watcher saw a drop arrive or finish, and every
    poll_interval (another host's drops raise no event here); not at every step (several
    a job: on a NAS each listing is four round trips)."""
    from spool.core import config as config_mod
    from spoold.daemon import Daemon

    d = Daemon(tree, config_mod.load(tree.config_file), "probe", hooks=[])
    poll = d.cfg.daemon.poll_interval
    assert d.watcher.start()
    try:
        t0 = time.monotonic()
        assert d._intake_due(t0)  # a first step: drops from before the start, a crash's leftovers
        d._accept(t0)
        assert not d._intake_due(t0 + poll / 2)  # nothing arrived since
        body = json.dumps(minimal(assets, "arrives")).encode()
        (tree.incoming / ".arrives.json.tmp").write_bytes(body)
        os.rename(tree.incoming / ".arrives.json.tmp", tree.incoming / "arrives.json")
        wait_for(d._take_events, timeout=10)  # the watcher saw it: work
        assert d._intake_due(t0 + poll / 2)
        d._accept(t0 + poll / 2)
        assert status.locate(tree, "arrives@1") is not None
        # The loop's own moves (the drop taken, the job file written, the drop kept) are
        # events too, and bring no work: the loop would sleep now.
        assert not d._take_events()
        assert not d._intake_due(t0 + poll)  # taken: nothing waits
        body = json.dumps(minimal(assets, "slow")).encode()
        with open(tree.incoming / "slow.json", "wb") as f:  # a writer still at work
            f.write(body[:5])
            f.flush()
            wait_for(d._take_events, timeout=10)  # its creation seen
            # Still open for writing: its close event says when (no listing at every step;
            # the timer's listings cover an event lost).
            assert not d._intake_due(t0 + poll)
            f.write(body[5:])
        # Closed after writing. Waited for, not asserted at once: the close event is
        # queued when the file's last reference goes, and a child process forked by another
        # thread of this test process meanwhile holds one until it execs (CI saw it late).
        wait_for(d._take_events, timeout=10)
        assert d.arrivals.ready("slow.json", os.lstat(tree.incoming / "slow.json"))
        assert d._intake_due(t0 + poll)
        d._accept(t0 + poll)
        assert status.locate(tree, "slow@1") is not None
        assert not d._intake_due(t0 + poll + poll / 2)
        assert d._intake_due(t0 + 2.5 * poll)  # the timer: what no event here shows
    finally:
        d.watcher.stop()
        d.journal.close()


def test_the_loops_own_moves_bring_it_no_work_and_wake_nothing(tree: Tree):
    """Taking a drop, writing its job file, keeping the drop, claiming the job and
    publishing it all raise inotify events in the watched folders; the loop reads them
    itself and none brings it work (before, each rang the loop awake for an empty step)."""
    from libhelp import allow_noop, noop_sub

    from spoold.daemon import Daemon

    d = Daemon(tree, allow_noop(tree), "probe", hooks=[])
    assert d.watcher.start()
    try:
        (tree.incoming / ".own.json.tmp").write_bytes(noop_sub("own"))
        os.rename(tree.incoming / ".own.json.tmp", tree.incoming / "own.json")
        assert d._take_events()  # somebody else's drop: work
        # accepted and, a slot being free, claimed in the same batch
        assert d._accept(time.monotonic()) == 1 and d.stats["claims"] == 1
        d._fill_slots()
        assert d.stats["claims"] == 1
        assert not d._take_events()
        wait_for(lambda: d._ready, timeout=30)  # its attempt produced; the next step publishes
        d._fill_slots()
        assert (tree.complete / "own@1.json").is_file()
        assert not d._take_events()
        # A job another process accepted into pending/ is work: its name was not indexed.
        accept.accept_bytes(tree, d.cfg, noop_sub("theirs"), "another acceptor")
        assert d._take_events() and list(d.index.ordered()) == ["theirs@1"]
    finally:
        d.watcher.stop()
        d.journal.close()


def test_a_job_claimed_in_its_acceptance_batch_starts_from_the_job_written(tree: Tree, monkeypatch):
    """The claim moved the very file the batch wrote: its job starts from the object in
    hand, not read back (five round trips on a NAS). A job another process accepted is
    read and checked at its claim, as ever."""
    from libhelp import allow_noop, noop_sub

    from spool.queue import execute
    from spoold.daemon import Daemon

    read_back: list[str] = []
    real = execute.load_claimed
    monkeypatch.setattr(execute, "load_claimed", lambda ctx, jid: read_back.append(jid) or real(ctx, jid))
    d = Daemon(tree, allow_noop(tree), "probe", hooks=[])
    try:
        (tree.incoming / "own.json").write_bytes(noop_sub("own"))
        wait_for(lambda: d._accept(time.monotonic()) > 0, timeout=10)  # quiet, then taken
        assert d.stats["claims"] == 1
        wait_for(lambda: d._ready, timeout=30)
        d._fill_slots()
        assert (tree.complete / "own@1.json").is_file() and read_back == []
        accept.accept_bytes(tree, d.cfg, noop_sub("theirs"), "another acceptor")
        d.index.refresh()
        d._fill_slots()
        wait_for(lambda: d._ready, timeout=30)
        d._fill_slots()
        assert (tree.complete / "theirs@1.json").is_file() and read_back == ["theirs@1"]
    finally:
        d.journal.close()


def test_the_loop_sleeps_on_inotify_beside_its_waker_and_leaves_the_events_to_the_watcher(tree: Tree):
    """The loop's one wait ends on a ring or on inotify; it consumes the rings only: the
    events stay for the watcher, which reads them all (the next wait sleeps again)."""
    from spoold.waker import Waker

    waker = Waker()
    watcher = Watcher([tree.incoming], tree.pending)
    assert watcher.start()
    fd = watcher.fileno()
    assert fd is not None
    try:
        assert not waker.wait(0.01, also=(fd,))  # nothing: the timeout
        (tree.incoming / "x.json").write_bytes(b"{}")
        assert waker.wait(5, also=(fd,)) and waker.wait(0, also=(fd,))  # not consumed by waiting
        watcher.poll()
        assert not waker.wait(0.01, also=(fd,))  # read: asleep again
        waker.set()
        assert waker.wait(5, also=(fd,)) and not waker.wait(0.01, also=(fd,))  # a ring, consumed
    finally:
        watcher.stop()
        waker.close()


def test_a_polled_drop_is_looked_at_again_only_once_its_wait_can_be_over(
    tree: Tree, cfg: Config, journal: Journal, monkeypatch
):
    """Without an event (another host's drops over a NAS), a drop is taken once unchanged
    for the quiet period; until then, listings pass it without an lstat (a round trip on a
    NAS: a burst of drops was lstat-ed, every one, at each loop step until quiet)."""
    clock = [100.0]
    arrivals = Arrivals(tree.incoming, quiet=2.0, clock=lambda: clock[0])
    for name in ("a", "b", "c"):
        (tree.incoming / f"{name}.json").write_bytes(b"[]")
    looked: list[str] = []
    real_lstat = os.lstat

    def lstat(path, *a, **k):
        name = os.path.basename(os.fspath(path))
        if os.path.dirname(os.fspath(path)) == str(tree.incoming) and not name.startswith("."):
            looked.append(name)  # a drop looked at (not the taken drop's hidden name, read after)
        return real_lstat(path, *a, **k)

    monkeypatch.setattr(os, "lstat", lstat)

    def take(at: float) -> list[str]:
        clock[0] = at
        looked.clear()
        outs = accept.accept_incoming(tree, cfg, "w1", journal, arrivals=arrivals)
        return sorted(o.path.name for o in outs)

    assert take(100.0) == [] and looked == ["a.json", "b.json", "c.json"]
    assert arrivals.next_look() == 102.0
    assert take(101.0) == [] and looked == []  # seen, the wait not over: not looked at
    with open(tree.incoming / "b.json", "ab") as f:
        f.write(b" ")  # changed meanwhile, unseen: found at the next look, which restarts its wait
    assert take(102.0) == ["a.json", "c.json"] and looked == ["a.json", "b.json", "c.json"]
    assert arrivals.next_look() == 104.0
    assert take(103.5) == [] and looked == []
    assert take(104.0) == ["b.json"] and looked == ["b.json"]
    assert arrivals.next_look() is None


def test_a_local_drop_waits_only_for_what_is_left_of_its_quiet_period(tree: Tree):
    """On a local filesystem a drop's ctime counts: one changed 1.5 s before it was first
    seen (quiet 2 s) may be taken 0.5 s later, and is not looked at before."""
    clock = [50.0]
    arrivals = Arrivals(tree.incoming, quiet=2.0, clock=lambda: clock[0], local=True)
    path = tree.incoming / "d.json"
    path.write_bytes(b"[]")
    os.utime(path)  # ctime now
    st = os.lstat(path)
    real_time = time.time
    try:
        time.time = lambda: st.st_ctime + 1.5  # type: ignore[assignment]
        assert not arrivals.ready("d.json", st)
        assert arrivals.next_look() == 50.5
        clock[0] = 50.4
        assert arrivals.not_yet("d.json")
        clock[0] = 50.5
        assert not arrivals.not_yet("d.json") and arrivals.ready("d.json", st)
    finally:
        time.time = real_time  # type: ignore[assignment]


def test_the_loop_wakes_when_a_polled_drop_s_wait_ends(tree: Tree, assets: Path):
    """The daemon steps again when a seen drop's quiet period ends (not a poll_interval
    later, and not at every step before)."""
    from spool.core import config as config_mod
    from spoold.daemon import Daemon

    settings.write(tree.config_file, {"daemon": {"poll_interval": 30.0}})  # the timer far off
    d = Daemon(tree, config_mod.load(tree.config_file), "probe", hooks=[])  # no watcher: polled
    try:
        (tree.incoming / "polled.json").write_bytes(json.dumps(minimal(assets, "polled")).encode())
        now = time.monotonic()
        d.arrivals.local = False
        assert d._intake_due(now)
        d._accept(now)
        quiet = d.cfg.daemon.incoming_quiet
        assert d._wake_in is not None and quiet - 0.5 < d._wake_in <= quiet + 0.5  # its clock read later
        look = d.arrivals.next_look()
        assert look is not None and not d._intake_due(look - 0.01) and d._intake_due(look)
    finally:
        d.journal.close()


def test_the_next_look_follows_every_change_of_the_records_and_of_the_quiet_period(tree: Tree):
    """The loop asks when to look next twice a step; the answer is kept between changes
    (thousands of waiting drops), so every change must show in it at once."""
    clock = [10.0]
    arrivals = Arrivals(tree.incoming, quiet=2.0, clock=lambda: clock[0])
    for name in ("a", "b"):
        (tree.incoming / f"{name}.json").write_bytes(b"[]")
    assert not arrivals.ready("a.json", os.lstat(tree.incoming / "a.json"))
    assert arrivals.next_look() == 12.0
    clock[0] = 11.0
    assert not arrivals.ready("b.json", os.lstat(tree.incoming / "b.json"))
    assert arrivals.next_look() == 12.0
    arrivals.quiet = 5.0  # spool.toml's incoming_quiet reloaded
    assert arrivals.next_look() == 15.0
    arrivals.gone("a.json")
    assert arrivals.next_look() == 16.0
    arrivals.finished("b.json")  # closed after writing: take it at once
    assert arrivals.next_look() == float("-inf")
    arrivals.taken("b.json")
    assert arrivals.next_look() is None


def test_an_idle_poll_of_incoming_is_a_stat_and_another_process_drop_is_still_taken(
    tree: Tree, cfg: Config, journal: Journal, assets: Path, monkeypatch: pytest.MonkeyPatch
):
    """An idle daemon polls incoming/ every 2 s; over a NAS a listing of even an empty
    folder is six round trips, a stat one (spool.disk.kept). The listing is kept while
    the folder's stat is unchanged; a drop made by anyone changes it."""
    past = int((time.time() - 60) * 1e9)
    os.utime(tree.incoming, ns=(past, past))  # last changed a minute ago
    listed: list[str] = []
    real = os.listdir
    monkeypatch.setattr(os, "listdir", lambda p=".": listed.append(os.fspath(p)) or real(p))
    for _ in range(3):
        assert accept.accept_incoming(tree, cfg, "w1", journal) == []
    assert listed.count(os.fspath(tree.incoming)) == 1
    (tree.incoming / "late.json").write_text(json.dumps(minimal(assets, "late")))
    (out,) = accept.accept_incoming(tree, cfg, "w1", journal)
    assert isinstance(out, accept.Accepted) and out.job.job_id == "late@1"
    assert listed.count(os.fspath(tree.incoming)) == 2
