"""The seam for job kinds: one registry, one tagged job record, resource pools.

Nothing outside ``spool/kinds/`` branches on a job's ``operation``; a job file
of any kind decodes to that kind's record; each kind's attempt draws from the
pool it names, and a daemon reports every pool it fills.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import msgspec
import pytest
from conftest import TAGS, minimal, run_cli, wait_for, write_json

from spool import kinds
from spool.core.config import Config
from spool.core.errors import InvalidInput
from spool.core.model import WorkerRecord, encode
from spool.disk.tree import HOST, Tree
from spool.kinds import KINDS, NoopJob, RenderJob, decode_job, pools
from spool.kinds.pools import Pools
from spool.queue import accept

ROOT = Path(__file__).resolve().parent.parent


#: Ways code outside a kind's folder could branch on a kind: its operation, its record's
#: type, its pool's name, an attribute only one kind's jobs have, or its record by name.
BRANCHES = re.compile(
    r"operation\s*(==|!=|in\b)|isinstance\([^)]*(Generate|Render|Noop)Job|startswith\(.provider:"
    r"|getattr\([^)]*.generate.|(?<!`)\b(GenerateJob|RenderJob|NoopJob)\b"
)


def test_nothing_outside_the_kinds_branches_on_a_kind():
    offenders = []
    for folder in ("spool", "spoold"):
        for path in (ROOT / folder).rglob("*.py"):
            if "kinds" in path.relative_to(ROOT).parts:
                continue
            for n, line in enumerate(path.read_text().splitlines(), 1):
                if BRANCHES.search(line):
                    offenders.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert offenders == []


#: The arrows into a kind from outside, each for a reason: ``spool.toml``'s provider tables
#: are the generate kind's own settings, parsed where the rest of the file is; ``spool
#: library adopt`` is the command that makes adopt jobs (as a submitter writes a recipe).
OWN_SETTINGS = {
    ("spool.core.config", "spool.kinds.generate.providers.config"),
    ("spool.library.adopt", "spool.kinds.adopt"),
}


def test_no_module_outside_a_kind_imports_it():
    """The kind seam holds at the import level: the overview, metrics and fsck ask
    :mod:`spool.kinds.views`, the daemon asks each kind's ``self_check``; only the registry
    (and a kind itself) imports a kind's modules."""
    import imports  # tools/imports.py (tools/ is on sys.path: conftest)

    kinds_dir = ROOT / "spool" / "kinds"
    names = {p.stem for p in kinds_dir.iterdir() if p.suffix == ".py" or (p / "__init__.py").is_file()}
    own = names - {"__init__", "base", "registry", "views", "pools", "__pycache__"}
    offenders = []
    for a, b, _inside in imports.arrows(imports.modules()):
        for k in own:
            mine = f"spool.kinds.{k}"
            into = b == mine or b.startswith(mine + ".")
            inside = a == mine or a.startswith(mine + ".") or a == "spool.kinds.registry"
            if into and not inside and (a, b) not in OWN_SETTINGS:
                offenders.append(f"{a} -> {b}")
    assert offenders == []


def test_the_daemon_dispatches_on_the_kind_and_its_driver_names_no_kind():
    driver = (ROOT / "spoold" / "driver.py").read_text()
    daemon = (ROOT / "spoold" / "daemon.py").read_text()
    assert "generate" not in driver.lower().replace("generation", "")
    assert 'kind.runner == "driven"' in daemon
    for code in (driver, daemon):
        assert "provider:" not in code and ".generate" not in code and "self.generations" not in code


def test_every_kind_names_itself_and_its_record():
    for name, kind in KINDS.items():
        assert kind.name == name
        assert kind.job_type.__struct_config__.tag == name


def _noop_cfg(cfg: Config) -> Config:
    return msgspec.structs.replace(cfg, acceptance=msgspec.structs.replace(cfg.acceptance, allow_noop=True))


def test_a_job_file_decodes_to_its_kind(tree: Tree, cfg: Config, assets: Path):
    render_job = accept.build_job(
        tree, cfg, accept.parse_submission(json.dumps(minimal(assets)).encode(), cfg), "t"
    )
    noop_sub = accept.parse_submission(
        json.dumps({"name": "n", "operation": "noop", "tags": TAGS}).encode(), cfg
    )
    noop_job = accept.build_job(tree, _noop_cfg(cfg), noop_sub, "t")
    for job, typ in ((render_job, RenderJob), (noop_job, NoopJob)):
        back = decode_job(encode(job))
        assert type(back) is typ and back == job
        assert json.loads(encode(job))["operation"] == typ.__struct_config__.tag
        # The hash the claim checks is the kind's hash of its own spec.
        assert kinds.of(back).spec_hash(back) == job.recipe_hash


def test_noop_job_files_written_before_the_seam_still_decode():
    """Files of the earlier format carried "recipe": null; unknown fields are ignored."""
    old = {
        "format": 1, "job_id": "n@1", "name": "n", "revision": 1, "supersedes": None,
        "operation": "noop", "recipe": None,
        "recipe_hash": "74234e98afe7498fb5daf1f36ac2d78acc339464f950703b8c019892f982b90b",
        "sources": [], "output": {"file": "n.txt", "container": "txt", "expect": {}},
        "tags": {}, "priority": 0, "submitted_at": "2026-01-01T00:00:00Z", "submitted_by": "t",
    }  # fmt: skip
    job = decode_job(json.dumps(old).encode())
    assert isinstance(job, NoopJob) and kinds.of(job).spec_hash(job) == old["recipe_hash"]


def test_an_unknown_operation_is_rejected_naming_the_field(tree: Tree, cfg: Config):
    # The kind owns the submission's schema, so the operation is known before the rest.
    with pytest.raises(InvalidInput) as exc:
        accept.parse_submission(json.dumps({"name": "x", "operation": "upscale", "tags": TAGS}).encode(), cfg)
    assert exc.value.field == "operation" and "noop, render" in str(exc.value)


@pytest.mark.parametrize(
    ("operation", "foreign", "own"),
    [("render", "generate", "recipe"), ("generate", "recipe", "generate"), ("noop", "recipe", None)],
)
def test_each_kind_owns_its_field_of_the_submission(cfg: Config, operation, foreign, own):
    """A kind's own part (Kind.spec_field) is a field of its submission type only: another
    kind's is refused naming the fields this kind takes (acceptance declares none of them)."""
    raw = {"name": "x", "operation": operation, "tags": TAGS, foreign: {}}
    with pytest.raises(InvalidInput) as exc:
        accept.parse_submission(json.dumps(raw).encode(), cfg)
    assert exc.value.field == foreign and "is not a known field" in exc.value.problem
    assert (own is not None and f", {own})" in exc.value.problem) or own is None


def test_a_full_pool_does_not_block_another():
    p = Pools({"render": 1, "provider:sim": 2})
    p.take("a@1", "render")
    assert not p.has_room("render") and p.has_room("provider:sim") and not p.full()
    p.take("b@1", "provider:sim")
    p.take("c@1", "provider:sim")
    assert p.full()
    p.give_back("a@1")
    assert p.has_room("render") and p.usage()["render"].active == 0
    assert p.usage()["provider:sim"].active == 2
    assert not p.has_room("nowhere")  # a pool nobody sized has no room


def test_render_work_draws_from_the_render_pool_sized_by_max_active(cfg: Config):
    assert kinds.capacities(cfg) == {"render": cfg.limits.max_active}
    for kind in KINDS.values():
        # a generation draws from its provider's allowance (test_generate.py); an adopt job
        # from a pool no daemon sizes, so only spool library adopt runs it (test_adopt.py)
        if kind.runner == "slot" and kind.name != "adopt":
            assert kind.pool(b"{}") == pools.RENDER
    assert KINDS["adopt"].pool(b"{}") == "adopt" and "adopt" not in kinds.capacities(cfg)
    assert KINDS["generate"].pool(b'{"generate": {"provider": "sim"}}') == "provider:sim"


def test_the_daemon_reports_each_pool_in_its_heartbeat(tree: Tree, assets: Path, daemons):
    write_json(tree.incoming / "a.json", minimal(assets, name="a"))
    d = daemons(tree, "w1", drain=True)
    assert d.wait() == 0
    rec = msgspec.json.decode(tree.worker_file(f"{HOST}-w1").read_bytes(), type=WorkerRecord)
    assert rec.pools["render"].capacity == rec.max_active
    status = json.loads(run_cli("status", "--json", spool=tree, check=True).stdout)
    (w,) = [w for w in status["workers"] if w["worker"] == f"{HOST}-w1"]
    assert w["pools"]["render"]["capacity"] == rec.max_active
    wait_for(lambda: (tree.complete / "a@1.json").exists(), timeout=5)
