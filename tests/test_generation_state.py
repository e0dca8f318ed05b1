"""The six durable states of a generation attempt: real files, real processes, the real simulator."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest
from provsim import ProviderSim
from spool.generation import (
    CHECK_PROVIDER,
    Conflict,
    Intent,
    LateCompletion,
    PollProgress,
    after_crash,
    begin,
    finish_pending,
    input_hash,
    read,
    record_late,
    save_poll,
    submit,
    transition,
)
from spool.providers import Lookup, ProviderError, RemoteJob, open_provider, parse_provider

from spool import generation as gen_mod
from spool import spending

TOKEN = "r8_GenStateToken_abcdef0123456789"


def intent(key: str = "gen-ad@1/1", deadline: float | None = None, at: float | None = None) -> Intent:
    t = time.time() if at is None else at
    return Intent(
        key=key,
        job="gen-ad@1",
        attempt=1,
        provider="sim",
        model="acme/video-1",
        input_hash=input_hash({"prompt": "p"}),
        intent_at=t,
        deadline_at=t + 3600 if deadline is None else deadline,
    )


def visible(gen: Path) -> list[str]:
    return sorted(n for n in os.listdir(gen) if not n.startswith("."))


def write_ahead_only(gen: Path, to: str, **fields: object) -> None:
    """What a contender leaves when it dies between its record and the marker rename."""
    view = read(gen)
    assert view.record is not None
    import msgspec

    base = msgspec.structs.asdict(view.record) | dict(fields) | {"state": to, "from_state": view.state}
    rec = msgspec.convert(base, gen_mod.StateRecord, from_attributes=True)
    tmp = gen_mod._write_temp(gen, gen_mod.record_name(to), gen_mod.encode(rec))
    os.link(tmp, gen / gen_mod.record_name(to))
    os.unlink(tmp)


def test_begin_makes_the_intent_durable_and_is_exclusive(tmp_path: Path) -> None:
    gen = tmp_path / "gen"
    begin(gen, intent(), by="w1")
    assert visible(gen) == ["1-submitted.json", "state.1-submitted"]
    view = read(gen)
    assert view.state == "submitted" and view.intent is not None and view.intent.key == "gen-ad@1/1"
    with pytest.raises(Conflict, match="already submitted"):
        begin(gen, intent(), by="w2")


def test_forward_path_is_legible_with_ls_and_carries_every_field(tmp_path: Path) -> None:
    gen = tmp_path / "gen"
    begin(gen, intent(), by="w1")
    transition(gen, "generating", "w1", provider_job_id="pred-1", provider_status="starting")
    transition(gen, "retrieving", "w1", output_url="http://x/out.mp4", provider_status="succeeded")
    transition(gen, "stored", "w1", sha256="ab" * 32, bytes_retrieved=12345)
    transition(gen, "indexed", "w1")
    assert visible(gen) == [
        "1-submitted.json",
        "2-generating.json",
        "3-retrieving.json",
        "4-stored.json",
        "5-indexed.json",
        "state.5-indexed",
    ]
    rec = read(gen).record
    assert rec is not None and rec.state == "indexed" and rec.from_state == "stored"
    assert (rec.intent.key, rec.provider_job_id, rec.output_url, rec.bytes_retrieved) == (
        "gen-ad@1/1",
        "pred-1",
        "http://x/out.mp4",
        12345,
    )


def test_the_cheap_state_read_agrees_with_the_full_one_at_every_step(tmp_path: Path) -> None:
    gen = tmp_path / "gen"
    assert gen_mod.current_state(gen) is None
    begin(gen, intent(), by="w1")
    seen = [gen_mod.current_state(gen)]
    for to, fields in (("generating", {"provider_job_id": "p"}), ("retrieving", {}), ("stored", {})):
        transition(gen, to, "w1", **fields)  # type: ignore[arg-type]
        seen.append(gen_mod.current_state(gen))
        if to == "generating":  # a begin rolled forward late re-links the submitted marker
            os.link(gen / "1-submitted.json", gen / "state.1-submitted")
            assert gen_mod.current_state(gen) == read(gen).state == "generating"
    transition(gen, "failed", "w1", reason="x")
    seen.append(gen_mod.current_state(gen))
    assert read(gen).state == "failed"
    assert seen == ["submitted", "generating", "retrieving", "stored", "failed"]


def test_forward_only_and_failed_is_final(tmp_path: Path) -> None:
    gen = tmp_path / "gen"
    begin(gen, intent(), by="w1")
    transition(gen, "generating", "w1", provider_job_id="p")
    with pytest.raises(Conflict, match="forward only"):
        transition(gen, "submitted", "w1")
    with pytest.raises(Conflict, match="forward only"):
        transition(gen, "stored", "w1")  # no skipping retrieving
    transition(gen, "failed", "w1", reason="deadline", next_action="spool retry")
    for target in ("retrieving", "stored", "indexed", "failed"):
        with pytest.raises(Conflict):
            transition(gen, target, "w1")  # type: ignore[arg-type]
    assert read(gen).state == "failed" and visible(gen)[-1] == "state.6-failed"


RACER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from spool.generation import Conflict, transition
    root, start, me, target = Path(sys.argv[1]), float(sys.argv[2]), sys.argv[3], sys.argv[4]
    while time.time() < start:
        pass
    won = []
    for d in sorted(root.iterdir()):
        try:
            transition(d, target, me, expect="generating", reason=me)
            won.append(d.name)
        except Conflict:
            pass
    print(" ".join(won))
    """
)


def race(root: Path, contenders: list[tuple[str, str]]) -> dict[str, list[str]]:
    start = time.time() + 1.0
    procs = {
        me: subprocess.Popen(
            [sys.executable, "-c", RACER, str(root), str(start), me, target],
            stdout=subprocess.PIPE,
            text=True,
        )
        for me, target in contenders
    }
    return {me: p.communicate(timeout=120)[0].split() for me, p in procs.items()}


def test_racing_processes_exactly_one_wins_each_transition(tmp_path: Path) -> None:
    rounds = 40
    for i in range(rounds):
        d = tmp_path / f"a{i:03d}"
        begin(d, intent(f"j@1/{i}"), by="setup")
        transition(d, "generating", "setup", provider_job_id=f"p{i}")
    # Half want "retrieving" (the provider said succeeded), half "failed" (the deadline passed).
    won = race(tmp_path, [("r1", "retrieving"), ("r2", "retrieving"), ("f1", "failed"), ("f2", "failed")])
    for i in range(rounds):
        name = f"a{i:03d}"
        winners = [me for me, names in won.items() if name in names]
        assert len(winners) == 1, (name, winners)
        view = read(tmp_path / name)
        assert view.record is not None and view.record.reason == winners[0]
        markers = [n for n in os.listdir(tmp_path / name) if n.startswith("state.")]
        assert len(markers) == 1 and not view.orphans and not view.pending
    assert sum(len(v) for v in won.values()) == rounds


def test_a_provider_id_written_just_before_a_crash_is_adopted(tmp_path: Path) -> None:
    gen = tmp_path / "gen"
    begin(gen, intent(), by="w1")
    write_ahead_only(gen, "generating", provider_job_id="pred-xyz")  # then kill -9
    view = read(gen)
    assert view.state == "submitted" and set(view.pending) == {"generating"}
    d = after_crash(view, now=time.time(), can_find=True)
    assert (d.action, d.provider_job_id) == ("adopt", "pred-xyz")
    rec = finish_pending(gen, view)
    assert rec is not None and read(gen).state == "generating"
    assert read(gen).record.provider_job_id == "pred-xyz"  # type: ignore[union-attr]


def test_an_orphan_record_of_a_lost_transition_does_not_block(tmp_path: Path) -> None:
    gen = tmp_path / "gen"
    begin(gen, intent(), by="w1")
    write_ahead_only(gen, "failed", reason="stale contender")  # it lost, then died before cleaning up
    transition(gen, "generating", "w1", provider_job_id="p")
    view = read(gen)
    assert view.state == "generating" and view.orphans == ["6-failed.json"] and not view.pending
    transition(gen, "failed", "w1", reason="real")
    assert read(gen).record.reason == "real"  # type: ignore[union-attr]


def test_a_begin_cut_short_before_its_marker_still_moves_forward(tmp_path: Path) -> None:
    gen = tmp_path / "gen"
    begin(gen, intent(), by="w1")
    os.unlink(gen / "state.1-submitted")  # as if the crash came between the two links
    assert read(gen).state == "submitted" and read(gen).marker is None
    transition(gen, "generating", "w1", provider_job_id="p")
    assert [n for n in visible(gen) if n.startswith("state.")] == ["state.2-generating"]


def test_after_crash_decisions() -> None:
    t0 = 1_800_000_000.0

    def view_at(state: str, *, deadline: float = t0 + 3600, job: str | None = None) -> gen_mod.View:
        rec = gen_mod.StateRecord(
            state=state,  # type: ignore[arg-type]
            at=datetime.now(UTC),
            by="w",
            intent=intent(at=t0, deadline=deadline),
            provider_job_id=job,
        )
        return gen_mod.View(dir=Path("/x"), state=rec.state, record=rec, marker=None)

    none = gen_mod.View(dir=Path("/x"), state=None, record=None, marker=None)
    assert after_crash(none, now=t0, can_find=True).action == "begin"
    sub = view_at("submitted")
    assert after_crash(sub, now=t0 + 1, can_find=True).action == "find"
    fail = after_crash(sub, now=t0 + 1, can_find=False)
    assert (fail.action, fail.next_action) == ("fail", CHECK_PROVIDER)
    found = Lookup(outcome="found", job=RemoteJob(id="p9", status="running", raw_status="processing"))
    assert after_crash(sub, now=t0 + 1, can_find=True, lookup=found).provider_job_id == "p9"
    assert after_crash(sub, now=t0 + 5, can_find=True, lookup=Lookup(outcome="none")).action == "wait"
    assert after_crash(sub, now=t0 + 60, can_find=True, lookup=Lookup(outcome="none")).action == "create"
    amb = after_crash(
        sub, now=t0 + 60, can_find=True, lookup=Lookup(outcome="ambiguous", candidates=["a", "b"])
    )
    assert (amb.action, amb.next_action) == ("fail", CHECK_PROVIDER)
    assert after_crash(view_at("generating", job="p"), now=t0 + 1, can_find=False).action == "poll"
    assert (
        after_crash(view_at("generating", job="p", deadline=t0), now=t0 + 1, can_find=False).action
        == "cancel"
    )
    assert after_crash(view_at("retrieving", job="p"), now=t0 + 1, can_find=False).action == "download"
    assert after_crash(view_at("stored", job="p"), now=t0 + 1, can_find=False).action == "index"
    assert after_crash(view_at("indexed", job="p"), now=t0 + 1, can_find=False).action == "done"
    assert after_crash(view_at("failed", job="p"), now=t0 + 1, can_find=False).action == "done"


# -- with the simulator ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def sim() -> object:
    with ProviderSim(token=TOKEN, work=0.2) as s:
        yield s


def _provider(sim: ProviderSim, kind: str = "replicate", **over: object):  # type: ignore[no-untyped-def]
    cfg = parse_provider("sim", {"kind": kind, "base_url": sim.url, "token_env": "SIM_TOKEN", **over})
    return open_provider(cfg, env={"SIM_TOKEN": TOKEN})


def _no_token_anywhere(root: Path) -> None:
    for p in root.rglob("*"):
        if p.is_file():
            assert TOKEN.encode() not in p.read_bytes(), p


def test_submit_once_when_the_create_reply_is_lost(sim: ProviderSim, tmp_path: Path) -> None:
    """The create times out after the provider made the job: find it, adopt it, one create in total."""
    p = _provider(sim, request_timeout=0.4)
    gen = tmp_path / "attempts" / "gen-ad@1" / "1" / "gen"
    inp = {"prompt": "lost reply #fault=create_timeout:1.2"}
    begin(gen, intent(at=time.time() - 1), by="w1")
    creates = sim.stats().get("create", 0)
    with pytest.raises(ProviderError) as info:
        submit(
            gen,
            p,
            inp,
            "w1",
            reserve=lambda: spending.reserve(tmp_path, "sim", 10, 100, job="gen-ad@1", key="gen-ad@1/1"),
            release=spending.release,
        )
    assert info.value.outcome == "ambiguous"
    view = read(gen)
    assert view.state == "submitted"  # the intent stays; no blind resubmit
    assert after_crash(view, now=time.time(), can_find=p.can_find).action == "find"
    since = datetime.fromtimestamp(view.record.intent.intent_at, UTC)  # type: ignore[union-attr]
    lookup = p.find("acme/video-1", inp, "gen-ad@1/1", since)
    d = after_crash(view, now=time.time(), can_find=True, lookup=lookup)
    assert d.action == "adopt" and d.provider_job_id
    transition(gen, "generating", "w1", provider_job_id=d.provider_job_id)
    assert sim.stats()["create"] == creates + 1
    assert spending.count(tmp_path, "sim") == (1, 1)  # the ambiguous create stays counted
    save_poll(gen, PollProgress(polls=1, last_provider_status="processing", next_poll_at=time.time() + 2))
    assert read(gen).poll is not None and read(gen).poll.polls == 1  # type: ignore[union-attr]
    _no_token_anywhere(tmp_path)
    p.close()


def test_rate_limited_create_gives_its_spending_slot_back(sim: ProviderSim, tmp_path: Path) -> None:
    p = _provider(sim)
    gen = tmp_path / "gen"
    begin(gen, intent(), by="w1")
    sim.control(ratelimit={"count": 1, "retry_after": 1})
    reserve = lambda: spending.reserve(tmp_path, "sim", 10, 100, job="j", key="k")  # noqa: E731
    with pytest.raises(ProviderError, match="HTTP 429"):
        submit(gen, p, {"prompt": "busy"}, "w1", reserve=reserve, release=spending.release)
    assert spending.count(tmp_path, "sim") == (0, 0) and read(gen).state == "submitted"
    rec = submit(gen, p, {"prompt": "busy"}, "w1", reserve=reserve, release=spending.release)
    assert rec.provider_job_id and spending.count(tmp_path, "sim") == (1, 1)
    p.close()


def test_runway_lost_reply_fails_with_the_next_action(sim: ProviderSim, tmp_path: Path) -> None:
    p = _provider(sim, "runway", request_timeout=0.4)
    gen = tmp_path / "gen"
    begin(gen, intent(), by="w1")
    with pytest.raises(ProviderError):
        submit(gen, p, {"promptText": "t #fault=create_timeout:1.2"}, "w1")
    d = after_crash(read(gen), now=time.time(), can_find=p.can_find)
    assert (d.action, d.next_action) == ("fail", CHECK_PROVIDER)
    transition(gen, "failed", "w1", reason=d.reason, next_action=d.next_action)
    assert read(gen).record.next_action == "check the provider; spool retry submits again"  # type: ignore[union-attr]
    p.close()


def test_a_duplicate_completion_cannot_move_the_attempt_twice(sim: ProviderSim, tmp_path: Path) -> None:
    p = _provider(sim)
    gen = tmp_path / "gen"
    begin(gen, intent(), by="w1")
    rec = submit(gen, p, {"prompt": "again and again #fault=recomplete"}, "w1")
    time.sleep(0.3)
    first = p.get(rec.provider_job_id)  # type: ignore[arg-type]
    second = p.get(rec.provider_job_id)  # type: ignore[arg-type]
    assert first.status == second.status == "succeeded" and first.outputs != second.outputs
    transition(gen, "retrieving", "w1", expect="generating", output_url=first.outputs[0])
    with pytest.raises(Conflict, match="not generating"):
        transition(gen, "retrieving", "w2", expect="generating", output_url=second.outputs[0])
    assert read(gen).record.output_url == first.outputs[0]  # type: ignore[union-attr]
    p.close()


def test_late_completion_of_an_abandoned_attempt_is_recorded_never_used(
    sim: ProviderSim, tmp_path: Path
) -> None:
    p = _provider(sim)
    gen = tmp_path / "gen"
    begin(gen, intent(deadline=time.time() + 0.2), by="w1")
    rec = submit(gen, p, {"prompt": "slowpoke #fault=never #fault=late:0.3"}, "w1")
    time.sleep(0.25)
    d = after_crash(read(gen), now=time.time(), can_find=True)
    assert d.action == "cancel"
    p.cancel(rec.provider_job_id)  # type: ignore[arg-type]
    transition(
        gen, "failed", "w1", reason="deadline passed; cancelled at the provider", next_action="spool retry"
    )
    time.sleep(0.4)
    late = p.get(rec.provider_job_id)  # type: ignore[arg-type]
    assert late.status == "succeeded"  # the provider ignored the cancel
    view = read(gen)
    assert gen_mod.is_abandoned(view)
    assert record_late(
        gen,
        LateCompletion(
            provider_job_id=late.id,
            provider_status=late.raw_status,
            outputs=late.outputs,
            seen_at=datetime.now(UTC),
            attempt_state="failed",
        ),
    )
    with pytest.raises(Conflict):
        transition(gen, "retrieving", "w1", output_url=late.outputs[0])
    assert read(gen).state == "failed" and "late-completion.json" in visible(gen)
    p.close()


# -- two NAS clients ---------------------------------------------------------------------------

MULTIMOUNT = Path(__file__).resolve().parents[1] / "tools" / "multimount"


@pytest.fixture(scope="module")
def two_mounts(tmp_path_factory: pytest.TempPathFactory) -> object:
    """One export mounted twice with sshfs (tools/multimount), as two workstations see a NAS."""
    if os.geteuid() != 0 or not os.path.exists("/dev/fuse"):
        pytest.skip("tools/multimount needs root and /dev/fuse")
    d = tmp_path_factory.mktemp("gen-nas")
    up = subprocess.run(
        [str(MULTIMOUNT), "up", str(d), "--mounts", "2", "--cache", "low"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    if up.returncode == 2:
        pytest.skip(f"FUSE is unavailable: {up.stderr.strip()}")
    assert up.returncode == 0, up.stderr
    try:
        yield d / "export", d / "a", d / "b"
    finally:
        subprocess.run([str(MULTIMOUNT), "down", str(d)], capture_output=True, timeout=120, check=True)


def test_two_mounts_racing_exactly_one_wins_each_transition(two_mounts: tuple[Path, Path, Path]) -> None:
    export, a, b = two_mounts
    rounds = 15
    (export / "race").mkdir()
    for i in range(rounds):
        d = export / "race" / f"a{i:03d}"
        begin(d, intent(f"j@1/{i}"), by="setup")
        transition(d, "generating", "setup", provider_job_id=f"p{i}")
    start = time.time() + 2.0
    procs = {
        me: subprocess.Popen(
            [sys.executable, "-c", RACER, str(mount / "race"), str(start), me, target],
            stdout=subprocess.PIPE,
            text=True,
        )
        for me, mount, target in (
            ("a-ok", a, "retrieving"),
            ("a-fail", a, "failed"),
            ("b-ok", b, "retrieving"),
            ("b-fail", b, "failed"),
        )
    }
    won = {me: p.communicate(timeout=300)[0].split() for me, p in procs.items()}
    for i in range(rounds):
        name = f"a{i:03d}"
        winners = [me for me, names in won.items() if name in names]
        assert len(winners) == 1, (name, winners)
        view = read(export / "race" / name)  # the file server's own view is the truth
        assert view.record is not None and view.record.reason == winners[0]
        assert len([n for n in os.listdir(export / "race" / name) if n.startswith("state.")]) == 1
    assert sum(len(v) for v in won.values()) == rounds


def test_the_poll_schedule_is_rebuilt_from_the_attempts_files(tmp_path: Path) -> None:
    import random

    from spool.polling import PollScheduler
    from spool.providers.config import Polling

    t = time.time()
    gens = []
    for i, (polls, nxt) in enumerate([(3, t + 40), (7, t - 5), (None, None)]):
        gen = tmp_path / f"g{i}" / "gen"
        begin(gen, intent(f"j{i}@1/1", deadline=t + 30), by="w1")
        transition(gen, "generating", "w1", provider_job_id=f"p{i}")
        if polls is not None:
            save_poll(gen, PollProgress(polls=polls, next_poll_at=nxt, last_provider_status="processing"))
        gens.append(gen)
    done = tmp_path / "done" / "gen"
    begin(done, intent("d@1/1"), by="w1")
    transition(done, "failed", "w1", reason="x")
    entries = list(gen_mod.poll_entries([*gens, done], now=t))
    assert [(e.key, e.polls) for e in entries] == [("j0@1/1", 3), ("j1@1/1", 7), ("j2@1/1", 0)]
    clock = [t]
    s = PollScheduler.rebuild(entries, {"sim": Polling()}, clock=lambda: clock[0], rng=random.Random(1))
    # Overdue and never-polled attempts are due at once; the deadline caps the 40 s wait.
    assert sorted(d.key for d in s.pop_due()) == ["j1@1/1", "j2@1/1"]
    assert s.due_time("j0@1/1") == t + 30


def test_each_provider_draws_from_its_own_pool() -> None:
    from spool.providers.config import pool_capacities

    cfgs = [
        parse_provider(
            "rep", {"kind": "replicate", "base_url": "https://a", "token_env": "T", "in_flight": 500}
        ),
        parse_provider("rw", {"kind": "runway", "base_url": "https://b", "token_env": "U"}),
    ]
    assert pool_capacities(cfgs) == {"provider:rep": 500, "provider:rw": 50}


def test_this_process_remembers_each_attempt_state_it_moves_until_it_ends(tmp_path: Path) -> None:
    """The metrics gauge counts a daemon's own generations from memory (known_state);
    what it remembers follows every move, and an ended attempt is forgotten."""
    a1 = tmp_path / "attempts" / "ad@1" / "1" / "gen"
    begin(a1, intent(), by="w1")
    assert gen_mod.known_state("ad@1") == (1, "submitted")
    transition(a1, "generating", "w1", provider_job_id="p")
    assert gen_mod.known_state("ad@1") == (1, "generating")
    transition(a1, "failed", "w1", reason="deadline")
    assert gen_mod.known_state("ad@1") is None, "an ended attempt leaves (memory stays bounded)"
    a2 = tmp_path / "attempts" / "ad@1" / "2" / "gen"
    begin(a2, intent(key="gen-ad@1/2"), by="w1")
    read(a1)  # a late-completion audit of attempt 1 reads it again
    assert gen_mod.known_state("ad@1") == (2, "submitted"), "an older attempt never overrides"
    for to in ("generating", "retrieving", "stored"):
        transition(a2, to, "w1", provider_job_id="q")  # type: ignore[arg-type]
        assert gen_mod.known_state("ad@1") == (2, to)
    transition(a2, "indexed", "w1")
    assert gen_mod.known_state("ad@1") is None
