"""Prometheus metric families as data, and their text format (version 0.0.4).

What a metric *is* (a family of samples, a histogram) and how it is written and read
back, apart from which metrics spool has (:mod:`spool.observe.metrics`): a kind or the library
names its own families with these types without importing the metrics of the queue.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from spool.core.printable import printable

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
    """A label value in the text format: control characters shown as escapes first
    (:mod:`spool.core.printable`: no value can add a line, a series or a terminal escape),
    then the format's own escapes of backslash and double quote."""
    return printable(v).replace("\\", "\\\\").replace('"', '\\"')


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
