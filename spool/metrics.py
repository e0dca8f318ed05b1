"""The Prometheus view of a spool, as textfiles for node_exporter's textfile collector.

Each daemon writes its own file, ``<metrics_dir>/spool-<worker>.prom``, so no
two writers ever share a file (on a NAS, hosts must not). Every series in a
worker's file carries ``worker="<that worker>"``, so the files that one
collector merges never hold the same series twice. There are two kinds:

* **what this worker did** since it started: counters and histograms fed with
  the events it records in the journal (:class:`WorkerCounters`). They start
  from zero when the daemon restarts, which ``rate()`` and ``increase()``
  handle;
* **what this worker sees of the queue** when it writes the file: gauges from
  directory scans (:func:`queue_families`). Every worker sees the same queue,
  so aggregate them with ``max without (worker, instance) (spool_jobs)``.

A file is replaced atomically (temp name, rename; no fsync: metrics are
hints) every ``[observe] metrics_interval`` seconds and when the daemon stops.
Names follow Prometheus conventions: base units as suffixes (``_seconds``,
``_bytes``), counters end in ``_total``, one ``# HELP`` and ``# TYPE`` per
family, no timestamps (the textfile collector forbids them).
"""

from __future__ import annotations

import math
import re
import threading
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from . import overview
from .config import Config
from .model import Event, PoolUse, WorkerRecord
from .status import read
from .tree import Tree, visible_names, write_atomic

#: Upper bounds (seconds) of the render-time histogram's buckets.
RENDER_BUCKETS = (1.0, 5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0)
#: Upper bounds (seconds) of the validation-time histogram's buckets.
VALIDATE_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
#: File names of metrics files: ``spool-<worker>.prom``.
PREFIX, SUFFIX = "spool-", ".prom"

_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")


@dataclass
class Sample:
    name: str
    labels: dict[str, str]
    value: float


@dataclass
class Family:
    name: str
    type: str  # counter, gauge, histogram, untyped
    help: str
    samples: list[Sample] = field(default_factory=list)

    def add(self, value: float, suffix: str = "", **labels: str) -> None:
        self.samples.append(Sample(self.name + suffix, labels, value))


class Histogram:
    """A cumulative histogram with fixed buckets."""

    def __init__(self, buckets: tuple[float, ...]) -> None:
        self.buckets = buckets
        self.counts = [0] * len(buckets)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        for i, bound in enumerate(self.buckets):
            if value <= bound:
                self.counts[i] += 1
        self.sum += value
        self.count += 1

    def fill(self, fam: Family, **labels: str) -> None:
        for bound, n in zip(self.buckets, self.counts, strict=True):
            fam.add(n, "_bucket", **labels, le=_number(bound))
        fam.add(self.count, "_bucket", **labels, le="+Inf")
        fam.add(self.sum, "_sum", **labels)
        fam.add(self.count, "_count", **labels)


class WorkerCounters:
    """What one worker did, fed with every event it records (safe across threads)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.transitions: Counter[tuple[str, str]] = Counter()
        self.validation_failures: Counter[str] = Counter()
        self.published_bytes = 0
        self.render = Histogram(RENDER_BUCKETS)
        self.validate = Histogram(VALIDATE_BUCKETS)

    def observe(self, ev: Event) -> None:
        with self._lock:
            self.transitions[(ev.from_ or "", ev.to)] += 1
            if ev.to == "failed" and ev.stage == "validate" and ev.property:
                self.validation_failures[ev.property] += 1
            if ev.to == "complete":
                self.published_bytes += ev.bytes or 0
                if ev.render_seconds is not None:
                    self.render.observe(ev.render_seconds)
                if ev.validate_seconds is not None:
                    self.validate.observe(ev.validate_seconds)

    def families(
        self,
        worker: str,
        stats: dict[str, int],
        slots: int,
        busy: int,
        pools: dict[str, PoolUse] | None = None,
        quarantined: bool = False,
    ) -> list[Family]:
        trans = Family(
            "spool_transitions_total",
            "counter",
            "Job transitions this worker recorded, by from and to state.",
        )
        claims = Family("spool_claims_total", "counter", "Jobs this worker claimed.")
        conflicts = Family(
            "spool_claim_conflicts_total", "counter", "Claims this worker lost to another worker."
        )
        vfail = Family(
            "spool_validation_failures_total",
            "counter",
            "Jobs this worker failed at the validation gate, by the first failed check.",
        )
        published = Family(
            "spool_published_bytes_total", "counter", "Bytes of output this worker published to the store."
        )
        render = Family(
            "spool_render_seconds", "histogram", "Wall-clock seconds of this worker's published renders."
        )
        validate = Family(
            "spool_validation_seconds", "histogram", "Seconds the validation gate took on published outputs."
        )
        slot_fam = Family("spool_worker_slots", "gauge", "Render slots of this worker (limits.max_active).")
        busy_fam = Family("spool_worker_busy_slots", "gauge", "Render slots of this worker in use.")
        with self._lock:
            for (frm, to), n in sorted(self.transitions.items()):
                trans.add(n, worker=worker, **{"from": frm, "to": to})
            for check, n in sorted(self.validation_failures.items()):
                vfail.add(n, worker=worker, check=check)
            published.add(self.published_bytes, worker=worker)
            self.render.fill(render, worker=worker)
            self.validate.fill(validate, worker=worker)
        claims.add(stats.get("claims", 0), worker=worker)
        conflicts.add(stats.get("claim_conflicts", 0), worker=worker)
        slot_fam.add(slots, worker=worker)
        busy_fam.add(busy, worker=worker)
        cap_fam = Family("spool_pool_capacity", "gauge", "Attempts each resource pool of this worker allows.")
        use_fam = Family("spool_pool_active", "gauge", "Attempts holding each resource pool of this worker.")
        for name, use in sorted((pools or {}).items()):
            cap_fam.add(use.capacity, worker=worker, pool=name)
            use_fam.add(use.active, worker=worker, pool=name)
        quar = Family(
            "spool_worker_quarantined", "gauge", "1 while this worker is in host quarantine (claims nothing)."
        )
        quar.add(1 if quarantined else 0, worker=worker)
        fams = [trans, claims, conflicts, vfail, published, render, validate, slot_fam, busy_fam, quar]
        return fams + ([cap_fam, use_fam] if pools else [])


def queue_families(
    tree: Tree, worker: str, now: float, known_pending: tuple[int, float | None] | None = None
) -> list[Family]:
    """Gauges of the whole queue as ``worker`` sees it at ``now`` (file-server time);
    a daemon passes what its index knows of ``pending/`` (see overview.scan_queue)."""
    scan = overview.scan_queue(tree, now, keep=0, known_pending=known_pending)
    jobs = Family("spool_jobs", "gauge", "Jobs per state (rejected: submissions), from directory scans.")
    for state, n in scan.counts.items():
        jobs.add(n, worker=worker, state=state)
    oldest = Family(
        "spool_oldest_job_age_seconds",
        "gauge",
        "Seconds since the oldest job entered its state (incoming, pending, running); 0 when there is none.",
    )
    for state, age in scan.oldest_age.items():
        oldest.add(age or 0.0, worker=worker, state=state)
    beats = Family(
        "spool_worker_heartbeat_age_seconds",
        "gauge",
        "Seconds since each worker (peer) not stopped wrote its heartbeat, by the file server's clock.",
    )
    for name in sorted(visible_names(tree.workers)):
        rec = read(tree.workers / name, WorkerRecord)
        if rec is None or rec.state == "stopped":
            continue
        try:
            mtime = (tree.workers / name).stat().st_mtime
        except FileNotFoundError:
            continue
        beats.add(round(max(0.0, now - mtime), 3), worker=worker, peer=rec.worker)
    gens = Family(
        "spool_generation_attempts",
        "gauge",
        "Running generation jobs by the state of their current attempt (submitted ... failed).",
    )
    rows = [{"job_id": jid, "attempt": overview.latest_attempt(tree, jid)} for jid, _, _ in scan.running]
    by_state = overview.generation_states(tree, rows)
    from .generation import ORDER  # here: only this gauge needs the generation states

    for state in ORDER:
        gens.add(by_state.get(state, 0), worker=worker, state=state)
    written = Family(
        "spool_metrics_written_timestamp_seconds", "gauge", "When this worker last wrote its metrics file."
    )
    written.add(round(now, 3), worker=worker)
    from .library import families as library_families  # the asset library (SPEC 9)

    return [jobs, oldest, beats, gens, written, *library_families(tree, worker)]


#: The generation driver's counters: (family, help, key in its counts).
GENERATION_COUNTERS = (
    ("spool_generation_polls_total", "Status requests (polls) this worker sent.", "polls"),
    ("spool_generation_creates_total", "Create requests (each may cost) this worker sent.", "creates"),
    ("spool_generation_rate_limited_total", "HTTP 429 answers this worker got.", "rate_limited"),
    ("spool_generation_retrieved_bytes_total", "Bytes of generated output downloaded and verified.", "bytes"),
    ("spool_generation_checksum_failures_total", "Downloads whose sha-256 did not match.", "checksum"),
    ("spool_generation_provider_errors_total", "Provider errors of any kind (429s included).", "errors"),
)


def generation_families(
    worker: str, by_provider: dict[str, dict[str, int]], cas_conflicts: int
) -> list[Family]:
    """The generation driver's counters (:meth:`spoold.generations.Generations.counters`)."""
    fams = []
    for name, help_, key in GENERATION_COUNTERS:
        fam = Family(name, "counter", help_)
        for provider, counts in sorted(by_provider.items()):
            fam.add(counts.get(key, 0), worker=worker, provider=provider)
        fams.append(fam)
    cas = Family(
        "spool_generation_cas_conflicts_total",
        "counter",
        "Generation state transitions this worker lost to another contender (compare-and-set conflicts).",
    )
    cas.add(cas_conflicts, worker=worker)
    return [*fams, cas]


# -- the text format ------------------------------------------------------------------------


def _number(v: float) -> str:
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    if math.isnan(v):
        return "NaN"
    if float(v).is_integer() and abs(v) < 1e15:
        return str(int(v))
    return repr(float(v))


def _escape_label(v: str) -> str:
    return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _escape_help(v: str) -> str:
    return v.replace("\\", "\\\\").replace("\n", "\\n")


def exposition(families: Iterable[Family]) -> str:
    """Families in the Prometheus text format (version 0.0.4)."""
    out: list[str] = []
    for fam in families:
        out.append(f"# HELP {fam.name} {_escape_help(fam.help)}")
        out.append(f"# TYPE {fam.name} {fam.type}")
        for s in fam.samples:
            labels = ",".join(f'{k}="{_escape_label(v)}"' for k, v in s.labels.items())
            out.append(
                f"{s.name}{{{labels}}} {_number(s.value)}" if labels else f"{s.name} {_number(s.value)}"
            )
    return "\n".join(out) + "\n"


def _unescape(text: str) -> str:
    return re.sub(r"\\(.)", lambda m: "\n" if m.group(1) == "n" else m.group(1), text)


_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*(?:,|$)')
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{.*\})?\s+(\S+)(?:\s+-?\d+)?\s*$")


def parse(text: str) -> list[Family]:
    """Read our own text format back (to merge files); lines it cannot read are skipped."""
    fams: dict[str, Family] = {}
    current: Family | None = None
    for line in text.splitlines():
        if line.startswith("# HELP ") or line.startswith("# TYPE "):
            parts = line[7:].split(" ", 1)
            name, rest = parts[0], (parts[1] if len(parts) > 1 else "")
            if not _NAME.match(name):
                continue
            current = fams.setdefault(name, Family(name, "untyped", ""))
            if line.startswith("# HELP "):
                current.help = _unescape(rest)
            else:
                current.type = rest.strip()
            continue
        if not line.strip() or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if not m:
            continue
        name, raw_labels, raw_value = m.groups()
        labels: dict[str, str] = {}
        if raw_labels:
            body, pos = raw_labels[1:-1], 0
            while pos < len(body):
                lm = _LABEL.match(body, pos)
                if not lm:
                    break
                labels[lm.group(1)] = _unescape(lm.group(2))
                pos = lm.end()
        try:
            value = float(raw_value)
        except ValueError:
            continue
        if current is None or not name.startswith(current.name):
            current = fams.setdefault(name, Family(name, "untyped", ""))
        current.samples.append(Sample(name, labels, value))
    return list(fams.values())


# -- files --------------------------------------------------------------------------------------


def folder(tree: Tree, cfg: Config) -> Path | None:
    """Where metrics files go (``[observe] metrics_dir``), or ``None`` when off."""
    d = cfg.observe.metrics_dir
    if not d:
        return None
    p = Path(d)
    return p if p.is_absolute() else tree.root / p


def file_for(folder: Path, worker: str) -> Path:
    return folder / f"{PREFIX}{worker}{SUFFIX}"


def write(path: Path, families: Iterable[Family]) -> None:
    write_atomic(path, exposition(families).encode(), durable=False)


def merged(folder: Path) -> list[Family]:
    """Every worker's file in ``folder`` as one exposition: each family once, every series once."""
    out: dict[str, Family] = {}
    seen: set[tuple[str, tuple[tuple[str, str], ...]]] = set()
    try:
        names = sorted(n for n in visible_names(folder, SUFFIX) if n.startswith(PREFIX))
    except NotADirectoryError:
        names = []
    for name in names:
        try:
            text = (folder / name).read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        for fam in parse(text):
            into = out.setdefault(fam.name, Family(fam.name, fam.type, fam.help))
            for s in fam.samples:
                key = (s.name, tuple(sorted(s.labels.items())))
                if key not in seen:
                    seen.add(key)
                    into.samples.append(s)
    return list(out.values())
