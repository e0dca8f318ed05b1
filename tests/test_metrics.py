"""Prometheus metrics: real daemons write one textfile each; a strict reader of the
exposition format (written here, independent of spool.observe.metrics) checks every byte."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
import time
from collections import defaultdict

import pytest
from conftest import minimal, run_cli, write_json

from spool.core import config, families, settings
from spool.disk.tree import HOST, Tree
from spool.observe import metrics
from spoold.daemon import Daemon
from spoold.observers import Metrics

# -- a strict reader of the text format (version 0.0.4, as node_exporter's textfile collector takes it) --

_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
_LABEL = r'[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\[\\"n])*"'
_SAMPLE = re.compile(rf"^({_NAME})(?:\{{((?:{_LABEL})(?:,{_LABEL})*)?\}})? (\S+)$")
_VALUE = re.compile(r"^(?:[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?|[+-]Inf|NaN)$")

Series = tuple[str, tuple[tuple[str, str], ...]]


def strict_parse(text: str) -> dict[Series, float]:
    """Every series of an exposition; any deviation from the format fails the test."""
    assert text.endswith("\n"), "the last line must end with a newline"
    families: dict[str, dict[str, str]] = {}
    order: list[str] = []
    out: dict[Series, float] = {}
    current: str | None = None
    for n, line in enumerate(text.splitlines(), 1):
        where = f"line {n}: {line!r}"
        assert line, f"{where}: empty line"
        if line.startswith("#"):
            m = re.match(rf"^# (HELP|TYPE) ({_NAME}) (.+)$", line)
            assert m, f"{where}: a comment that is neither HELP nor TYPE"
            kind, name, rest = m.groups()
            fam = families.setdefault(name, {})
            if name in order and order[-1] != name:
                raise AssertionError(f"{where}: family {name} is split")
            if name not in order:
                order.append(name)
            assert kind not in fam, f"{where}: second {kind} for {name}"
            if kind == "TYPE":
                assert rest in ("counter", "gauge", "histogram", "summary", "untyped"), where
                assert not any(s[0].startswith(name) for s in out if s[0] in _names(name, rest)), where
            else:
                assert re.fullmatch(r"(?:[^\\\n]|\\[\\n])*", rest), f"{where}: bad HELP escaping"
            fam[kind] = rest
            current = name
            continue
        m = _SAMPLE.match(line)
        assert m, f"{where}: not a sample line (no timestamps allowed)"
        name, labels_raw, value = m.groups()
        assert _VALUE.match(value), f"{where}: bad value"
        assert current is not None and name in _names(current, families[current].get("TYPE", "untyped")), (
            f"{where}: sample outside its family {current}"
        )
        labels = tuple(
            (k, re.sub(r"\\(.)", lambda x: "\n" if x.group(1) == "n" else x.group(1), v))
            for k, v in re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"', labels_raw or "")
        )
        assert len({k for k, _ in labels}) == len(labels), f"{where}: a label twice"
        key = (name, labels)
        assert key not in out, f"{where}: duplicate series"
        out[key] = float(value)
    for name, fam in families.items():
        assert "HELP" in fam and "TYPE" in fam, f"{name} lacks HELP or TYPE"
        if fam["TYPE"] == "counter":
            assert name.endswith("_total"), f"counter {name} must end in _total"
        if fam["TYPE"] == "histogram":
            _check_histogram(name, out)
    return out


def _names(family: str, typ: str) -> set[str]:
    if typ == "histogram":
        return {family + s for s in ("_bucket", "_sum", "_count")}
    return {family}


def _check_histogram(name: str, series: dict[Series, float]) -> None:
    groups: dict[tuple[tuple[str, str], ...], list[tuple[float, float]]] = defaultdict(list)
    for (sname, labels), v in series.items():
        if sname == name + "_bucket":
            le = dict(labels)["le"]
            rest = tuple(kv for kv in labels if kv[0] != "le")
            groups[rest].append((math.inf if le == "+Inf" else float(le), v))
    assert groups, f"histogram {name} has no buckets"
    for rest, buckets in groups.items():
        bounds = [b for b, _ in buckets]
        assert bounds == sorted(bounds) and bounds[-1] == math.inf, f"{name}: buckets out of order"
        counts = [c for _, c in buckets]
        assert counts == sorted(counts), f"{name}: buckets not cumulative"
        assert counts[-1] == series[(name + "_count", rest)], f"{name}: +Inf bucket != _count"
        assert (name + "_sum", rest) in series


def values(series: dict[Series, float], name: str, **labels: str) -> list[float]:
    return [v for (n, ls), v in series.items() if n == name and labels.items() <= dict(ls).items()]


# -- tests ---------------------------------------------------------------------------------------


def _configure(tree: Tree, **observe: object) -> None:
    settings.write(tree.config_file, {"observe": {"metrics_interval": 0.5, **observe}})


def test_each_daemon_writes_its_own_valid_file_and_together_they_add_up(tree, assets, daemons):
    _configure(tree)
    for i in range(4):
        write_json(tree.incoming / f"ok-{i}.json", minimal(assets, name=f"ok-{i}"))
    write_json(tree.incoming / "wide.json", minimal(assets, name="wide", output={"expect": {"width": 999}}))
    a, b = daemons(tree, "a", drain=True), daemons(tree, "b", drain=True)
    assert a.wait() == 0 and b.wait() == 0

    folder = tree.root / "metrics"
    names = sorted(os.listdir(folder))
    assert names == [f"spool-{HOST}-a.prom", f"spool-{HOST}-b.prom"], names  # no temp files left
    union: dict[Series, float] = {}
    for name in names:
        series = strict_parse((folder / name).read_text())
        worker = name[len("spool-") : -len(".prom")]
        assert all(dict(labels).get("worker") == worker for _, labels in series), name
        assert not union.keys() & series.keys()
        union.update(series)

    events = [json.loads(x) for f in tree.events.glob("*.jsonl") for x in f.read_text().splitlines()]
    daemon_events = [e for e in events if e["worker"] in (f"{HOST}-a", f"{HOST}-b")]
    for frm, to in {(e.get("from", ""), e["to"]) for e in daemon_events}:
        expected = sum(1 for e in daemon_events if (e.get("from", ""), e["to"]) == (frm, to))
        assert sum(values(union, "spool_transitions_total", **{"from": frm, "to": to})) == expected
    assert sum(values(union, "spool_transitions_total", to="complete")) == 4
    assert sum(values(union, "spool_claims_total")) == 5
    assert values(union, "spool_validation_failures_total", check="width") == [1]
    manifests = [json.loads(p.read_text()) for p in tree.manifests.glob("*.json")]
    assert sum(values(union, "spool_published_bytes_total")) == sum(m["output"]["size"] for m in manifests)
    assert sum(values(union, "spool_render_seconds_count")) == 4
    assert sum(values(union, "spool_render_seconds_sum")) == pytest.approx(
        sum(m["render_seconds"] for m in manifests), abs=1e-6
    )
    assert sum(values(union, "spool_validation_seconds_count")) == 4
    assert max(values(union, "spool_jobs", state="complete")) == 4
    assert max(values(union, "spool_jobs", state="failed")) == 1
    assert set(values(union, "spool_worker_slots")) == {2}
    assert values(union, "spool_oldest_job_age_seconds", state="pending") == [0, 0]

    printed = run_cli("metrics", spool=tree, check=True).stdout
    assert strict_parse(printed) == union
    one = strict_parse(run_cli("metrics", "--worker", f"{HOST}-a", spool=tree, check=True).stdout)
    assert one and all(dict(labels)["worker"] == f"{HOST}-a" for _, labels in one)
    fams = json.loads(run_cli("metrics", "--json", spool=tree, check=True).stdout)
    assert {f["name"]: f["type"] for f in fams}["spool_render_seconds"] == "histogram"


def test_metrics_folder_is_configurable_or_off(tree, assets, daemons, tmp_path):
    elsewhere = tmp_path / "node-exporter"
    _configure(tree, metrics_dir=str(elsewhere))
    assert daemons(tree, "x", drain=True).wait() == 0
    assert os.listdir(elsewhere) == [f"spool-{HOST}-x.prom"] and not (tree.root / "metrics").exists()
    assert strict_parse(run_cli("metrics", spool=tree, check=True).stdout)

    _configure(tree, metrics_dir="")
    (elsewhere / f"spool-{HOST}-x.prom").unlink()
    assert daemons(tree, "x", drain=True).wait() == 0
    assert os.listdir(elsewhere) == []
    res = run_cli("metrics", spool=tree)
    assert res.returncode == 2 and "observe.metrics_dir" in res.stderr


def test_hook_counts_what_the_daemon_counts(tree):
    """Claim conflicts come from the daemon's own counters; events feed the rest."""
    cfg = config.load(tree.config_file)
    d = Daemon(tree, cfg, "probe", hooks=[])
    d.stats["claim_conflicts"] = 3
    hook = Metrics()
    d.journal.listeners.append(lambda ev: hook.event(d, ev))
    d.journal.record("x@1", "failed", from_="running", attempt=1, stage="validate", property="fps")
    d.journal.record(
        "y@1", "complete", from_="running", bytes=1000, render_seconds=42.0, validate_seconds=0.3
    )
    hook.started(d)
    assert not (tree.root / "metrics" / "spool-probe.prom").exists()  # the first tick writes
    hook.tick(d)
    assert hook.flush()
    series = strict_parse((tree.root / "metrics" / "spool-probe.prom").read_text())
    assert values(series, "spool_claim_conflicts_total") == [3]
    assert values(series, "spool_validation_failures_total", check="fps") == [1]
    assert values(series, "spool_published_bytes_total") == [1000]
    assert values(series, "spool_render_seconds_bucket", le="30") == [0]
    assert values(series, "spool_render_seconds_bucket", le="60") == [1]
    assert values(series, "spool_validation_seconds_bucket", le="0.25") == [0]
    assert values(series, "spool_validation_seconds_bucket", le="0.5") == [1]


def test_queue_gauges_age_and_heartbeats(tree, assets):
    path = write_json(tree.root.parent / "p.json", minimal(assets, name="waits"))
    run_cli("submit", str(path), spool=tree, check=True)
    for name, state, age in (("far", "running", 100.0), ("idle", "stopped", 500.0)):
        rec = {
            "worker": f"other-{name}",
            "host": "other",
            "pid": 1,
            "boot_id": "b",
            "started_at": "2026-01-01T00:00:00Z",
            "heartbeat_at": "2026-01-01T00:00:00Z",
            "beats": 1,
            "state": state,
            "max_active": 1,
        }
        f = write_json(tree.worker_file(f"other-{name}"), rec)
        os.utime(f, (time.time() - age, time.time() - age))
    now = time.time()
    series = strict_parse(families.exposition(metrics.queue_families(tree, "me", now)))
    [far] = values(series, "spool_worker_heartbeat_age_seconds", peer="other-far")
    assert 99 <= far <= 102
    assert values(series, "spool_worker_heartbeat_age_seconds", peer="other-idle") == []  # stopped
    assert values(series, "spool_jobs", state="pending") == [1]
    [pending_age] = values(series, "spool_oldest_job_age_seconds", state="pending")
    assert 0 <= pending_age < 30
    assert values(series, "spool_metrics_written_timestamp_seconds") == [pytest.approx(now, abs=0.01)]


def test_exposition_escapes_label_values_and_help():
    fam = families.Family("spool_test_total", "counter", 'A "help" with \\ and\na newline.')
    fam.add(1, worker='a"b\\c\nd\te\x1b[31mf\x85', check="ok")
    fam2 = families.Family("spool_test_seconds", "histogram", "Times.")
    h = families.Histogram((0.5, 1.0))
    for v in (0.1, 0.7, 3.0):
        h.observe(v)
    h.fill(fam2, worker="w")
    text = families.exposition([fam, fam2])
    series = strict_parse(text)
    # control characters are shown as escapes (spool.core.printable): no value adds a line or a field,
    # or reaches a terminal as an escape sequence; quote and backslash keep the format's escapes
    assert values(series, "spool_test_total", worker='a"b\\c\\nd\\te\\x1b[31mf\\x85') == [1]
    assert len(text.splitlines()) == text.count("\n") and "\x1b" not in text and "\t" not in text
    assert values(series, "spool_test_seconds_bucket", le="0.5") == [1]
    assert values(series, "spool_test_seconds_bucket", le="1") == [2]
    assert values(series, "spool_test_seconds_bucket", le="+Inf") == [3]
    assert values(series, "spool_test_seconds_sum") == [pytest.approx(3.8)]
    # and spool's own reader (used to merge files) reads it back unchanged
    assert families.exposition(families.parse(text)) == text


@pytest.mark.parametrize(
    "bad",
    [
        "# HELP a_total x\n# TYPE a_total counter\na_total 1 1700000000\n",  # a timestamp
        "# HELP a x\n# TYPE a counter\na 1\n",  # a counter without _total
        '# HELP a x\n# TYPE a gauge\na 1\n# HELP b x\n# TYPE b gauge\nb 1\na{x="1"} 2\n',  # split family
        "# HELP a x\n# TYPE a gauge\na 1\na 2\n",  # the same series twice
        '# HELP a x\n# TYPE a gauge\na{x="\\q"} 1\n',  # a bad escape
        "# HELP a x\n# TYPE a gauge\na one\n",  # not a number
        '# HELP h x\n# TYPE h histogram\nh_bucket{le="1"} 2\nh_bucket{le="+Inf"} 1\nh_sum 1\nh_count 1\n',
        "# TYPE a gauge\na 1\n",  # no HELP
        "# HELP a x\n# TYPE a gauge\na 1",  # no final newline
    ],
)
def test_the_strict_reader_is_not_blind(bad):
    with pytest.raises(AssertionError):
        strict_parse(bad)


# -- a daemon's metrics over a network mount: list only what changed (issue 17) -----------------


def _another_process_renames(src: os.PathLike[str], dst: os.PathLike[str]) -> None:
    code = "import os, sys; os.rename(sys.argv[1], sys.argv[2])"
    subprocess.run([sys.executable, "-c", code, str(src), str(dst)], check=True, timeout=60)


def _age_folders(tree: Tree) -> None:
    """Set every folder's mtime a minute back: a reading of it is then not racy."""
    past = time.time() - 60
    for folder in tree.root.iterdir():
        if folder.is_dir():
            os.utime(folder, (past, past))


def test_metrics_follow_other_processes_and_list_only_changed_folders(tree, assets):
    _configure(tree, metrics_interval=0.01)
    d = Daemon(tree, config.load(tree.config_file), "probe", hooks=[])
    job = write_json(tree.root.parent / "j@1.json", minimal(assets, name="j"))
    _age_folders(tree)
    hook = Metrics()
    hook.started(d)
    out = tree.root / "metrics" / "spool-probe.prom"

    def tick() -> dict[Series, float]:
        time.sleep(0.02)  # past metrics_interval
        hook.tick(d)
        assert hook.flush()
        return strict_parse(out.read_text())

    first = tick()
    assert values(first, "spool_jobs", state="complete") == [0]
    assert values(first, "spool_worker_heartbeat_age_seconds", peer="probe")  # its own, from memory
    assert hook.view is not None
    reads = dict(hook.view.folders.reads)
    tick()
    assert hook.view.folders.reads == reads, "nothing changed: a stat per folder, no listing"

    _another_process_renames(job, tree.incoming / "j.json")  # a drop from another host
    series = tick()
    assert values(series, "spool_jobs", state="incoming") == [1]
    [age] = values(series, "spool_oldest_job_age_seconds", state="incoming")
    assert 0 <= age < 30
    changed = {k for k, n in hook.view.folders.reads.items() if n != reads.get(k)}
    assert changed == {"incoming"}, changed

    _another_process_renames(tree.incoming / "j.json", tree.complete / "j@1.json")  # done elsewhere
    series = tick()
    assert values(series, "spool_jobs", state="incoming") == [0]
    assert values(series, "spool_jobs", state="complete") == [1]


def test_the_pending_age_is_the_one_the_heartbeat_carries(tree, monkeypatch):
    """Asking the claim index for its oldest job is a pass over every pending job:
    the hook takes what the daemon's last heartbeat already carried."""
    d = Daemon(tree, config.load(tree.config_file), "probe", hooks=[])
    d.heartbeat.beat(state="running", oldest_pending_submitted=time.time() - 100)
    monkeypatch.setattr(d.index, "oldest_submitted", lambda: pytest.fail("the index was asked"))
    hook = Metrics()
    hook.started(d)
    hook.tick(d)
    assert hook.flush()
    series = strict_parse((tree.root / "metrics" / "spool-probe.prom").read_text())
    [age] = values(series, "spool_oldest_job_age_seconds", state="pending")
    assert 99 <= age < 130


def test_a_daemon_counts_its_own_generations_from_memory_and_others_from_files(tree, monkeypatch):
    """At 10,000 generations in flight a file check each per write cost 0.3 s of CPU
    locally and seconds on a NAS: this daemon's own come from what it last moved."""
    from spool.disk.tree import Tree
    from spool.kinds.generate import states as generation
    from spool.kinds.generate.states import Intent, begin, input_hash, transition

    def start(jid: str, worker: str, to: str) -> None:
        make = tree.running_dir(worker)
        make.mkdir(parents=True, exist_ok=True)
        (make / f"{jid}.json").write_text("{}")
        t = time.time()
        intent = Intent(
            key=f"gen-{jid}/1", job=jid, attempt=1, provider="sim", model="m/v",
            input_hash=input_hash({"prompt": jid}), intent_at=t, deadline_at=t + 3600,
        )  # fmt: skip
        gen = generation.gen_dir(tree.attempt_dir(jid, 1))
        begin(gen, intent, by=worker)
        transition(gen, "generating", worker, provider_job_id="p")
        if to != "generating":
            transition(gen, to, worker)  # type: ignore[arg-type]

    for i in range(5):
        start(f"mine{i}@1", "probe", "generating")
    start("theirs@1", "other", "retrieving")
    generation._known.pop("theirs@1")  # moved by another process: this one never saw it
    (tree.running_dir("probe") / "render@1.json").write_text("{}")  # this process's render
    looked: list[str] = []
    real = Tree.attempt_numbers
    monkeypatch.setattr(Tree, "attempt_numbers", lambda t, j: looked.append(j) or real(t, j))
    view = metrics.QueueView(tree)
    series = strict_parse(
        families.exposition(view.families(metrics.Own("probe", (0, None), 0.0), time.time()))
    )
    assert values(series, "spool_generation_attempts", state="generating") == [5]
    assert values(series, "spool_generation_attempts", state="retrieving") == [1]
    # Only the generation of another process is read from its files: not this process's
    # render (it runs it: were it a generation, memory would know it).
    assert looked == ["theirs@1"], looked


def test_jobs_waiting_for_an_upstream_and_held_are_counted_by_state(tree, assets):
    """SPEC 11.12: a dependent is counted as waiting, never as pending, until its upstream publishes."""
    run_cli(
        "submit",
        str(write_json(tree.root.parent / "m.json", minimal(assets, name="master"))),
        spool=tree,
        check=True,
    )
    for name in ("cut-a", "cut-b"):
        dep = minimal(assets, name=name, sources={"clip": {"job": "master"}})
        run_cli("submit", str(write_json(tree.root.parent / f"{name}.json", dep)), spool=tree, check=True)
    run_cli("hold", "cut-b@1", spool=tree, check=True)
    series = strict_parse(metrics.exposition(metrics.queue_families(tree, "me", time.time())))
    assert values(series, "spool_jobs", state="waiting") == [1]
    assert values(series, "spool_jobs", state="held") == [1]
    assert values(series, "spool_jobs", state="pending") == [1]


def test_a_daemons_library_size_gauges_read_the_segments_at_most_every_library_every(tree, monkeypatch):
    """Every daemon read every index segment a publish batch wrote, to count assets (over a
    NAS five requests a segment a daemon). The size gauges are read again only when the
    library's folders changed and at most every LIBRARY_EVERY s; a daemon's own index
    delays come from memory at every write."""
    from collections import deque

    from libhelp import allow_noop, noop_sub, publish, tags_for

    from spool.library import index
    from spool.queue import status

    cfg = allow_noop(tree)
    publish(tree, cfg, noop_sub("a0", tags=tags_for(0)))
    reads: list[str] = []
    real = status._segment_names
    monkeypatch.setattr(status, "_segment_names", lambda f: reads.append(str(f)) or real(f))
    view = metrics.QueueView(tree)
    own = metrics.Own("w1", (0, None), 0.0)
    t0 = time.time()

    def series(now: float) -> dict[Series, float]:
        return strict_parse(families.exposition(view.families(own, now)))

    assert values(series(t0), "spool_library_assets", worker="w1") == [1]
    publish(tree, cfg, noop_sub("a1", tags=tags_for(1)))
    monkeypatch.setattr(index, "RECENT_DELAYS", deque([0.5, 7.5], maxlen=100))  # this daemon's publishes
    later = series(t0 + 15)  # the next metrics write
    assert values(later, "spool_library_assets", worker="w1") == [1], "not read again yet"
    assert values(later, "spool_library_index_delay_seconds", worker="w1", stat="max") == [7.5]
    assert len(reads) == 1
    assert values(series(t0 + metrics.LIBRARY_EVERY), "spool_library_assets", worker="w1") == [2]
    assert len(reads) == 2
