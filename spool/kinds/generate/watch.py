"""What an operator sees of the generations in flight: states, ages, and the stale ones
(this kind's ``watch`` module: :mod:`spool.kinds.views` asks :func:`status`,
:func:`families` and :func:`left_behind` for ``spool status``, the metrics and fsck).

Read from the files of each running job's current attempt (one listing of
``gen/`` per job, and for the few whose state has lasted long, its progress
hint): cheap enough for ``spool status`` and a metrics write with thousands
in flight. Light on purpose: no provider client is imported.

A generation is *stale* when the provider has given no new evidence about it
(no answer to a poll or a lookup) for :data:`STALE_CEILINGS` times its polling
ceiling: it is listed under "Needs attention" with its state's age, instead of
looking like any other job at work.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from spool.core.families import Family
from spool.disk.tree import Tree
from spool.kinds.generate import states
from spool.kinds.views import Status

if TYPE_CHECKING:
    from spool.core.config import Config

#: No new evidence for this many polling ceilings: the generation needs a look.
STALE_CEILINGS = 3
#: The ceiling assumed for a provider no table names any more.
DEFAULT_CEILING = 60.0
#: States in which the provider holds the work (spool waits on it).
WAITING = ("submitted", "generating", "retrieving", "stored")


@dataclass
class Watch:
    """Running generations by state, the oldest age in each, and the stale ones."""

    counts: dict[str, int] = field(default_factory=dict)
    #: state -> seconds the longest-waiting attempt has been in it.
    oldest: dict[str, float] = field(default_factory=dict)
    stale: list[dict[str, Any]] = field(default_factory=list)
    #: job ID -> the state of its current attempt (what ``spool status`` shows for it).
    jobs: dict[str, str] = field(default_factory=dict)


def _record_age(gen: Path, state: str, now: float) -> float | None:
    try:
        return max(0.0, now - os.stat(gen / states.record_name(state)).st_mtime)
    except OSError:
        return None


def watch(
    tree: Tree, running: list[dict[str, Any]], ceilings: dict[str, float], now: float | None = None
) -> Watch:
    """``running``: rows with ``job_id`` and ``attempt`` (``None``: not begun);
    ``ceilings``: each provider's polling ceiling (seconds)."""
    now = time.time() if now is None else now
    out = Watch()
    least = STALE_CEILINGS * min([*ceilings.values(), DEFAULT_CEILING])
    for row in running:
        if row.get("attempt") is None:
            continue
        gen = states.gen_dir(tree.attempt_dir(row["job_id"], row["attempt"]))
        state = states.current_state(gen)
        if state is None:
            continue
        out.counts[state] = out.counts.get(state, 0) + 1
        out.jobs[row["job_id"]] = state
        if state not in WAITING:
            continue
        age = _record_age(gen, state, now)
        if age is None:
            continue
        out.oldest[state] = max(out.oldest.get(state, 0.0), age)
        if state in ("submitted", "generating") and age > least:
            stale = _stale(gen, state, age, ceilings, now)
            if stale is not None:
                out.stale.append({"job_id": row["job_id"], "attempt": row["attempt"], **stale})
    out.counts = {s: out.counts[s] for s in states.ORDINAL if s in out.counts}
    return out


def _stale(
    gen: Path, state: str, age: float, ceilings: dict[str, float], now: float
) -> dict[str, Any] | None:
    view = states.read(gen)
    rec = view.record
    if rec is None:
        return None
    provider = rec.intent.provider
    limit = STALE_CEILINGS * ceilings.get(provider, DEFAULT_CEILING)
    prog = view.progress
    last = prog.evidence_at if prog is not None and prog.evidence_at is not None else now - age
    silent = now - last
    if silent <= limit:
        return None
    return {
        "provider": provider,
        "state": state,
        "state_age": round(age, 1),
        "silent": round(silent, 1),
        "provider_job_id": rec.provider_job_id,
        "last_status": prog.last_provider_status if prog is not None else None,
        "errors": prog.tries if prog is not None else 0,
    }


def left_behind(tree: Tree, job_id: str) -> list[tuple[Path, str]]:
    """Attempts of an ended job (complete or failed: no attempt will follow by itself) left
    in ``submitted`` or ``generating``: their provider job may still run, and cost. One a
    later attempt carried on (it inherited the provider job, or the create to settle) is
    not; a pending job's next attempt carries its last one on."""
    found: list[tuple[Path, str]] = []
    carried_jobs: set[str] = set()
    carried_creates = False
    for n in reversed(tree.attempt_numbers(job_id)):
        gen = states.gen_dir(tree.attempt_dir(job_id, n))
        if not gen.is_dir():
            continue
        v = states.read(gen, full=True)
        rec = v.record
        if rec is None:
            continue
        provider = rec.intent.provider
        if v.state == "generating" and rec.provider_job_id not in carried_jobs:
            found.append(
                (gen, f"attempt {n} was left generating with no live owner: provider job "
                 f"{rec.provider_job_id} of provider {provider!r} may still run (and cost)")
            )  # fmt: skip
        unknown = any(c.outcome is None or c.outcome.outcome == "ambiguous" for c in v.creates)
        if v.state == "submitted" and unknown and not carried_creates:
            found.append(
                (gen, f"attempt {n} was left submitted with a create whose fate is unknown: look at "
                 f"provider {provider!r} for a job made then")
            )  # fmt: skip
        generating = v.records.get("generating")
        if generating is not None and generating.how == "inherited" and generating.provider_job_id:
            carried_jobs.add(generating.provider_job_id)
        carried_creates = carried_creates or any("sent by attempt" in c.request.request for c in v.creates)
    return found


# -- this kind's part of the overview, the metrics and fsck (spool.kinds.views) ----------------


def status(tree: Tree, running: list[dict[str, Any]], cfg: Config | None) -> Status | None:
    """Attempts per state (``generations``), the oldest age in each state the provider holds
    (``generation_ages``), each job's state as its step, and the stale ones as attention."""
    ceilings = {n: c.polling.ceiling for n, c in cfg.provider_configs.items()} if cfg is not None else {}
    w = watch(tree, running, ceilings)
    if not w.counts:
        return None
    fields: dict[str, Any] = {"generations": w.counts}
    if w.oldest:
        fields["generation_ages"] = {k: round(v, 1) for k, v in w.oldest.items()}
    return Status(fields=fields, steps=dict(w.jobs), attention=[_attention(s) for s in w.stale])


def _attention(s: dict[str, Any]) -> dict[str, Any]:
    """A generation the provider has said nothing about for several polling ceilings."""
    last = f"; last status {s['last_status']}" if s["last_status"] else ""
    errs = f"; {s['errors']} failed request(s) in a row" if s["errors"] else ""
    job = f" (provider job {s['provider_job_id']})" if s["provider_job_id"] else ""
    return {
        "kind": "generation",
        "subject": s["job_id"],
        "problem": f"no answer from provider {s['provider']!r} for {s['silent']:.0f} s{job}: "
        f"attempt {s['attempt']} {s['state']} for {s['state_age']:.0f} s{last}{errs}",
        "next_action": "Check the provider's status page; the attempt ends at its deadline by itself "
        f"(spool cancel {s['job_id']} ends it now and cancels it at the provider).",
    }


def families(worker: str, tree: Tree, running: list[str], mine: frozenset[str] = frozenset()) -> list[Family]:
    """``spool_generation_attempts{state}`` and ``spool_generation_state_age_seconds{state}``:
    the generations this process moves from memory (:func:`states.known_state`), any other
    from its files. A job of ``mine`` that memory does not know is not a generation (or one
    that has not begun): it is not read (a listing of its attempts, for every render this
    process runs, at every metrics write)."""
    counts: dict[str, int] = {}
    ages: dict[str, float] = {}
    rows = []
    now = time.time()
    for jid in running:
        known = states.known_state(jid)
        if known is None and jid in mine:
            continue
        if known is None:
            nums = tree.attempt_numbers(jid)
            rows.append({"job_id": jid, "attempt": nums[-1] if nums else None})
            continue
        counts[known[1]] = counts.get(known[1], 0) + 1
        since = states.known_since(jid)
        if since is not None:
            ages[known[1]] = max(ages.get(known[1], 0.0), now - since)
    if any(r["attempt"] is not None for r in rows):
        w = watch(tree, rows, {}, now)
        for state, n in w.counts.items():
            counts[state] = counts.get(state, 0) + n
        for state, age in w.oldest.items():
            ages[state] = max(ages.get(state, 0.0), age)
    gens = Family(
        "spool_generation_attempts",
        "gauge",
        "Running generation jobs by the state of their current attempt (submitted ... failed).",
    )
    for state in states.ORDER:
        gens.add(counts.get(state, 0), worker=worker, state=state)
    oldest = Family(
        "spool_generation_state_age_seconds",
        "gauge",
        "Seconds the longest-waiting running generation has been in each state its provider holds "
        "(submitted ... stored); 0 when none.",
    )
    for state in WAITING:
        oldest.add(round(ages.get(state, 0.0), 1), worker=worker, state=state)
    return [gens, oldest]
