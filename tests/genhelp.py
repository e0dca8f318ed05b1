"""Generation tests' shared parts: the simulator as provider ``sim``, submissions, and
:func:`audit`, which checks SPEC 11 invariant 10 for a job from both sides: what
spool's files say, and what the provider (the simulator) saw.

The attribution of provider requests to attempts is by time: the attempts of one
job run one after another, so a create request the simulator received between
attempt n's first create and attempt n+1's first create was sent by attempt n.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from conftest import TAGS
from provsim import ProviderSim

from spool.core import config
from spool.core.model import Failure, Manifest
from spool.disk.records import read
from spool.disk.tree import Tree
from spool.kinds.generate import states
from spool.queue import accept

TOKEN = "r8_GenTestToken_5f2d9c0a7e11b3c4"
ENV_NAME = "SPOOL_TEST_GEN_TOKEN"
ENV = {ENV_NAME: TOKEN}
#: Create requests one attempt may send at most (the create policy's attempts).
CREATE_BOUND = 5
#: Seconds of slack for "before the deadline" and "within deadline + grace" (a step is
#: scheduled at the deadline and takes a request's time to end the attempt).
SLACK = 3.0


def provider_table(
    sim: ProviderSim, name: str = "sim", *, kind: str = "replicate", polling: str = "", **over: Any
) -> str:
    """A ``[providers.<name>]`` table for the simulator, fast for tests; ``over`` sets keys
    (a dotted key sets a sub-table's: ``download.stall``)."""
    top = {"in_flight": 4, "deadline": 30, "request_timeout": 2.0, "listing_settle": 0.3}
    sub: dict[str, dict[str, Any]] = {
        "polling": {"first": 0.1, "base": 0.1, "ceiling": 0.3, "floor": 0.05},
        "retries.find": {"initial": 0.2, "ceiling": 0.5},
        "retries.create": {"initial": 0.2, "ceiling": 0.5},
        "retries.download": {"initial": 0.2, "ceiling": 0.5},
    }
    for k, v in over.items():
        if "." in k:
            table, key = k.rsplit(".", 1)
            sub.setdefault(table, {})[key] = v
        else:
            top[k] = v
    text = f'[providers.{name}]\nkind = "{kind}"\nbase_url = "{sim.url}"\ntoken_env = "{ENV_NAME}"\n'
    text += "".join(f"{k} = {json.dumps(v)}\n" for k, v in top.items())
    for table, keys in sub.items():
        text += f"[providers.{name}.{table}]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in keys.items())
    return text + polling


def configure(tree: Tree, sim: ProviderSim, name: str = "sim", **over: Any) -> None:
    with open(tree.config_file, "a") as f:
        f.write("\n" + provider_table(sim, name, **over))


def gen_sub(name: str = "gen-clip", prompt: str = "a mug on a beach", **over: Any) -> dict[str, Any]:
    sub: dict[str, Any] = {
        "name": name,
        "operation": "generate",
        "generate": {"provider": "sim", "model": "acme/video-1", "input": {"prompt": prompt}},
        "output": {"expect": {"width": 320, "height": 180}},
        "tags": dict(TAGS),
    }
    sub.update(over)
    return sub


def submit(tree: Tree, sub: dict[str, Any]) -> str:
    cfg = config.load(tree.config_file)
    return accept.accept_bytes(tree, cfg, json.dumps(sub).encode(), "test").job_id


def gen_view(tree: Tree, jid: str, n: int = 1) -> states.View:
    return states.read(states.gen_dir(tree.attempt_dir(jid, n)), full=True)


def made_for(sim: ProviderSim, prompt: str) -> list[Any]:
    """The provider jobs the simulator made for this prompt (twins of a duplicate included)."""
    return [j for j in list(sim.state.jobs.values()) if _prompt(j.input) == prompt]


def creates(sim: ProviderSim, prompt: str) -> int:
    """Jobs the simulator made for this prompt that a client was told of."""
    return sum(1 for j in made_for(sim, prompt) if not j.hidden)


def _prompt(input: dict[str, Any]) -> Any:
    return input.get("prompt", input.get("promptText"))


@dataclass
class AttemptAudit:
    n: int
    deadline_at: float | None
    first_create: float | None
    ended_at: float | None
    provider_job_id: str | None
    how: str | None
    inherited_from: int | None
    requests: list[float] = field(default_factory=list)
    made: list[str] = field(default_factory=list)


@dataclass
class Audit:
    job_id: str
    state: str
    attempts: list[AttemptAudit]
    problems: list[str]
    published: str | None = None

    @property
    def predictions(self) -> int:
        return sum(len(a.made) for a in self.attempts)

    @property
    def requests(self) -> int:
        return sum(len(a.requests) for a in self.attempts)


def audit(tree: Tree, sim: ProviderSim, jid: str, prompt: str, *, grace: float = 600.0) -> Audit:
    """Invariant 10 for one job: <= 1 prediction and <= CREATE_BOUND create requests per
    attempt, no create after its attempt's deadline, every attempt ended by its deadline
    plus ``grace``, and a published output that is the selected attempt's own prediction."""
    problems: list[str] = []
    rows: list[AttemptAudit] = []
    for n in tree.attempt_numbers(jid):
        d = tree.attempt_dir(jid, n)
        v = states.read(states.gen_dir(d), full=True)
        intent = v.intent
        first = min(
            (c.request.sent_at for c in v.creates if "sent by" not in c.request.request), default=None
        )
        ended = None
        fail = read(d / "failure.json", Failure) if (d / "failure.json").exists() else None
        if fail is not None:
            ended = fail.failed_at.timestamp()
        elif v.state == "indexed":
            ended = v.records["indexed"].at.timestamp()
        gen = v.records.get("generating")
        pid, how, frm = (gen.provider_job_id, gen.how, gen.inherited_from) if gen else (None, None, None)
        rows.append(AttemptAudit(n, intent.deadline_at if intent else None, first, ended, pid, how, frm))
    starts = [(r.first_create, r) for r in rows if r.first_create is not None]
    starts.sort(key=lambda x: x[0])

    def owner(t: float) -> AttemptAudit | None:
        best = None
        for start, r in starts:
            if start <= t + 0.05:  # the simulator's clock is this machine's: received after sent
                best = r
        return best

    with sim.state.lock:
        log = list(sim.state.create_log)
    for t, inp in log:
        if _prompt(inp) != prompt:
            continue
        r = owner(t)
        if r is None:
            problems.append(f"a create request at {t:.3f} belongs to no attempt of {jid}")
            continue
        r.requests.append(t)
    for job in made_for(sim, prompt):
        r = owner(job.created)
        if r is None:
            problems.append(f"provider job {job.id} was made by no attempt of {jid}")
            continue
        r.made.append(job.id)
    for r in rows:
        if len(r.made) > 1:
            problems.append(f"attempt {r.n} made {len(r.made)} predictions: {r.made}")
        if len(r.requests) > CREATE_BOUND:
            problems.append(f"attempt {r.n} sent {len(r.requests)} create requests (bound {CREATE_BOUND})")
        late = [t for t in r.requests if r.deadline_at is not None and t > r.deadline_at + 0.5]
        if late:
            problems.append(f"attempt {r.n} sent a create {late[0] - r.deadline_at:.1f} s after its deadline")
        if (
            r.ended_at is not None
            and r.deadline_at is not None
            and r.ended_at > r.deadline_at + grace + SLACK
        ):
            problems.append(f"attempt {r.n} ended {r.ended_at - r.deadline_at:.1f} s after its deadline")
    state = next((s for s in ("complete", "failed", "pending") if tree.job_file(s, jid).exists()), "running")
    published = None
    if state == "complete":
        m = read(tree.manifest_file(jid), Manifest)
        assert m is not None
        published = m.output.sha256
        sel = next(r for r in rows if r.n == m.attempt)
        pid = sel.provider_job_id
        own = set(sel.made)
        chain = sel
        while chain.how == "inherited" and chain.inherited_from is not None:
            chain = next(r for r in rows if r.n == chain.inherited_from)
            own |= set(chain.made)
        if pid is None or pid not in own:
            problems.append(f"attempt {m.attempt} published provider job {pid}, not one its own create made")
        elif sim.output_sha256(pid) != published:
            problems.append(f"the published bytes are not provider job {pid}'s output")
    return Audit(jid, state, rows, problems, published)


def failure(tree: Tree, jid: str, n: int | None = None) -> Failure:
    n = n or tree.attempt_numbers(jid)[-1]
    f = read(tree.attempt_dir(jid, n) / "failure.json", Failure)
    assert f is not None, f"attempt {n} of {jid} has no failure record"
    return f


def job_state(tree: Tree, jid: str) -> str:
    for s in ("complete", "failed", "pending", "held"):
        if tree.job_file(s, jid).exists():
            return s
    return "running" if any(Path(p).exists() for p in tree.running.glob(f"*/{jid}.json")) else "?"
