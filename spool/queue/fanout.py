"""One submission, many jobs: a brief (several submissions in one file) and a fan-out of
variants (a ``variants`` matrix expanded at acceptance into ordinary jobs).

A fan-out::

    {"name": "mug-ad", "sources": {...}, "recipe": {...}, "tags": {...},
     "variants": {"aspect": {"16x9": {"steps": {"fit": {"width": 1280, "height": 720}}},
                             "9x16": {"steps": {"fit": {"width": 720, "height": 1280}}}},
                  "locale": {"en-GB": {"steps": {"text": {"text": "Only £9.99"}}},
                             "de-DE": {"steps": {"text": {"text": "Nur 9,99 €"}}}}}}

becomes one job per combination, in the order written: ``mug-ad.16x9.en-gb@1``,
``mug-ad.16x9.de-de@1``, ... (values in lower case, other characters as ``-``). Each
value may override steps (by ``op``, every step with that op, or by index), tags and
sources; each axis is also a tag of its variants (``aspect=9x16``) unless the value's
own tags say otherwise. Every variant is frozen, hashed and checked on its own, and
the submission is accepted whole or rejected whole. The parent ``mug-ad@1`` is a record,
``variants/mug-ad@1.json`` (axes, the variants' job IDs, the submission it came from),
written before the variants: ``spool show``, ``approve``, ``revise`` and ``release``
take the parent for all its variants.

A brief is ``{"brief": "morning-mug", "jobs": [submission, ...]}``: each entry is a
submission (maybe a fan-out), accepted in order; an entry may name an earlier one as a
source (``{"job": "mug-gen"}``), never a later one.
"""

from __future__ import annotations

import copy
import itertools
import json
import re
from datetime import datetime
from typing import Annotated, Any

import msgspec

from spool.core.decoding import convert
from spool.core.errors import InvalidInput
from spool.core.model import Record, job_id

#: The most jobs one submission may make (a brief's entries times their variants).
MAX_JOBS = 256

Axis = Annotated[str, msgspec.Meta(pattern=r"^[a-z][a-z0-9_]{0,31}$")]
Value = Annotated[str, msgspec.Meta(min_length=1, max_length=32)]


class Override(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """What one value of an axis changes in its variants."""

    #: ``op`` (every step with that op) or a step's index -> fields merged into the step.
    steps: dict[str, dict[str, Any]] = {}
    tags: dict[str, str] = {}
    sources: dict[str, Any] = {}


Matrix = Annotated[
    dict[Axis, Annotated[dict[Value, Override], msgspec.Meta(min_length=1)]],
    msgspec.Meta(min_length=1, max_length=4),
]


class Brief(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    brief: Annotated[str, msgspec.Meta(min_length=1, max_length=128)] | None = None
    jobs: Annotated[list[dict[str, Any]], msgspec.Meta(min_length=1, max_length=64)]


class AxisValues(Record, kw_only=True):
    axis: str
    values: list[str]


class VariantJob(Record, kw_only=True):
    job: str
    values: dict[str, str]


class FanOut(Record, kw_only=True):
    """``variants/<parent>.json``: a fan-out's parent, written once at acceptance. Lists,
    not objects, keep the matrix's order (records are written with sorted keys)."""

    parent: str
    name: str
    revision: int
    axes: list[AxisValues]
    #: Each variant's job ID and values, in the order of the matrix.
    jobs: list[VariantJob]
    #: The submission as written (with ``variants``), as JSON text (its matrix's order kept):
    #: ``spool revise`` of the parent starts from it.
    request: str
    submission_sha256: str
    submitted_at: datetime


class Entry(msgspec.Struct, kw_only=True):
    """One job a submission makes: its submission (JSON values), where errors point, and
    for a variant its parent and values."""

    raw: dict[str, Any]
    prefix: str = ""
    parent: str | None = None
    variant: dict[str, str] = {}


def slug(value: str) -> str:
    """A value as it appears in a variant's name: lower case, ``[a-z0-9]`` and ``-``."""
    return re.sub(r"[^a-z0-9]+", "-", value.lower()).strip("-") or "x"


def entries(value: dict[str, Any]) -> tuple[list[Entry], list[FanOut]]:
    """The jobs a submission (a dict of JSON values) makes, and the fan-outs among them."""
    if "jobs" in value and "name" not in value:
        brief = convert(value, Brief)
        out: list[Entry] = []
        fans: list[FanOut] = []
        for i, raw in enumerate(brief.jobs):
            more, fan = _one(raw, f"jobs[{i}].")
            out += more
            fans += fan
    else:
        out, fans = _one(value, "")
    if len(out) > MAX_JOBS:
        raise InvalidInput("variants", f"makes {len(out)} jobs, more than the {MAX_JOBS} one submission may")
    names = [e.raw.get("name") for e in out]
    dupes = sorted({n for n in names if isinstance(n, str) and names.count(n) > 1})
    if dupes:
        raise InvalidInput("name", f"{dupes[0]} is made twice by this submission")
    return out, fans


def _one(raw: dict[str, Any], prefix: str) -> tuple[list[Entry], list[FanOut]]:
    if not isinstance(raw, dict):
        raise InvalidInput(prefix.rstrip(".") or "submission", "must be a JSON object")
    if "variants" not in raw:
        return [Entry(raw=raw, prefix=prefix)], []
    base = {k: v for k, v in raw.items() if k != "variants"}
    matrix = convert(raw["variants"], Matrix, prefix=f"{prefix}variants")
    name = base.get("name")
    if not isinstance(name, str):
        raise InvalidInput(f"{prefix}name", "is required but missing")
    rev = base.get("revision", 1)
    parent = job_id(name, rev if isinstance(rev, int) else 1)
    axes = {a: list(vals) for a, vals in matrix.items()}
    out = []
    for combo in itertools.product(*(list(vals.items()) for vals in matrix.values())):
        sub = copy.deepcopy(base)
        values = {axis: value for axis, (value, _) in zip(axes, combo, strict=True)}
        sub["name"] = ".".join([name, *(slug(v) for v in values.values())])
        tags = dict(sub.get("tags") or {})
        for axis, (value, ov) in zip(axes, combo, strict=True):
            at = f"{prefix}variants.{axis}.{value}"
            tags.setdefault(axis, value)
            tags.update(ov.tags)
            if ov.sources:
                sub["sources"] = {**(sub.get("sources") or {}), **ov.sources}
            _override_steps(sub, ov.steps, at)
        sub["tags"] = tags
        prev = base.get("supersedes")
        if isinstance(prev, str) and "@" in prev:
            sub["supersedes"] = f"{sub['name']}@{prev.rpartition('@')[2]}"
        out.append(Entry(raw=sub, prefix=f"{prefix}variants[{sub['name']}].", parent=parent, variant=values))
    fan = FanOut(
        parent=parent,
        name=name,
        revision=rev if isinstance(rev, int) else 1,
        axes=[AxisValues(axis=a, values=v) for a, v in axes.items()],
        jobs=[
            VariantJob(job=job_id(e.raw["name"], rev if isinstance(rev, int) else 1), values=e.variant)
            for e in out
        ],
        request=json.dumps(raw, ensure_ascii=False),
        submission_sha256="",
        submitted_at=datetime.now().astimezone(),
    )
    return out, [fan]


def _override_steps(sub: dict[str, Any], steps: dict[str, dict[str, Any]], at: str) -> None:
    if not steps:
        return
    recipe = sub.get("recipe")
    if not isinstance(recipe, dict) or not isinstance(recipe.get("steps"), list):
        raise InvalidInput(f"{at}.steps", "overrides steps, but the submission has no recipe with steps")
    recipe = sub["recipe"] = dict(recipe)
    listed = recipe["steps"] = [dict(s) if isinstance(s, dict) else s for s in recipe["steps"]]
    for key, fields in steps.items():
        if key.isdigit():
            idx = [int(key)] if int(key) < len(listed) else []
        else:
            idx = [i for i, s in enumerate(listed) if isinstance(s, dict) and s.get("op") == key]
        if not idx:
            raise InvalidInput(f"{at}.steps.{key}", f"the recipe has no step {key!r} to override")
        if "op" in fields:
            raise InvalidInput(f"{at}.steps.{key}.op", "an override cannot change a step's op")
        for i in idx:
            listed[i] = {**listed[i], **fields}
