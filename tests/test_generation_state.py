"""The durable states of a generation attempt and its create log: real files, real processes, two mounts."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import msgspec
import pytest

from spool.kinds.generate import ledger
from spool.kinds.generate import states as gen_mod
from spool.kinds.generate.providers.config import parse_provider
from spool.kinds.generate.states import (
    Conflict,
    CreateRequest,
    CreateResult,
    Intent,
    begin,
    finish_pending,
    input_hash,
    log_create,
    log_create_result,
    read,
    transition,
)

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
    base = msgspec.structs.asdict(view.record) | dict(fields) | {"state": to, "from_state": view.state}
    rec = msgspec.convert(base, gen_mod.StateRecord, from_attributes=True)
    (gen / gen_mod.record_name(to)).write_bytes(gen_mod.encode(rec))


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
    from spool.kinds.generate.states import Conflict, transition
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
    rec = finish_pending(gen, view)
    assert rec is not None and read(gen).state == "generating"
    assert read(gen).record.provider_job_id == "pred-xyz"  # type: ignore[union-attr]


def test_an_orphan_record_of_a_lost_transition_does_not_block(tmp_path: Path) -> None:
    gen = tmp_path / "gen"
    begin(gen, intent(), by="w1")
    write_ahead_only(gen, "failed", reason="stale contender")  # it lost, then died before cleaning up
    transition(gen, "generating", "w1", provider_job_id="p")
    view = read(gen, full=True)  # orphans are history: only a full read names them
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


def test_the_create_log_is_exclusive_and_its_outcomes_read_in_precedence(tmp_path: Path) -> None:
    gen = tmp_path / "gen"
    begin(gen, intent(), by="w1")
    req = CreateRequest(k=1, key="gen-ad@1/1", sent_at=time.time(), request="POST /x", by="w1")
    log_create(gen, req)
    with pytest.raises(Conflict):
        log_create(gen, req)  # a second contender sends nothing
    assert [(c.k, c.outcome) for c in read(gen).creates] == [(1, None)]  # unknown: possibly made
    log_create_result(gen, CreateResult(k=1, outcome="ambiguous", at=time.time(), code="timeout"))
    assert read(gen).creates[0].outcome.outcome == "ambiguous"  # type: ignore[union-attr]
    log_create_result(gen, CreateResult(k=1, outcome="unmade", at=time.time()))
    assert read(gen).creates[0].outcome.outcome == "unmade"  # type: ignore[union-attr]
    assert sorted(n for n in visible(gen) if n.startswith("create-")) == [
        "create-1.ambiguous.json", "create-1.json", "create-1.unmade.json",
    ]  # fmt: skip
    transition(gen, "generating", "w1", provider_job_id="p")
    assert read(gen).creates == [] and len(read(gen, full=True).creates) == 1  # read only while it matters


def test_the_ledger_gives_each_provider_job_to_one_attempt(tmp_path: Path) -> None:
    first = ledger.enter(tmp_path, "sim", "pred/1", "a@1", 1, "created")
    again = ledger.enter(tmp_path, "sim", "pred/1", "b@1", 2, "adopted")
    assert again == first and ledger.ours(again, "a@1", 1) and not ledger.ours(again, "b@1", 2)
    assert ledger.owner(tmp_path, "sim", "pred/1") == first
    assert ledger.owner(tmp_path, "sim", "pred/2") is None
    assert [p.name for p in (tmp_path / "providers/sim/jobs").iterdir()] == ["pred%2F1.json"]


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


def test_each_provider_draws_from_its_own_pool() -> None:
    from spool.kinds.generate.providers.config import pool_capacities

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
