#!/usr/bin/env python3
"""An independent checker of SPEC section 11, written against the files alone.

It imports nothing from spool (standard library only) so that a bug in
spool's own code cannot hide a broken invariant from it. The torture
harness and the tests run it; ``python3 tools/invariants.py SPOOL`` prints
the problems and exits 1 if there are any.

``settled=True`` (the default) checks a spool with no process running: every
job must then be waiting, pending, held, complete or failed, and none may wait
on an upstream that published or failed (invariant 12). ``settled=False`` checks a
snapshot taken while daemons may be dead mid-transition (after a SIGKILL),
where running jobs are allowed.
"""

from __future__ import annotations

import hashlib
import json
import stat
import sys
from pathlib import Path

STATES = ("waiting", "pending", "held", "complete", "failed")


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def _jobs(folder: Path) -> set[str]:
    if not folder.is_dir():
        return set()
    return {p.name[:-5] for p in folder.iterdir() if p.name.endswith(".json") and not p.name.startswith(".")}


def _job_file(root: Path, jid: str, states: list[str]) -> dict | None:
    state = states[0]
    path = root / state / f"{jid}.json"
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def check(root: Path, *, settled: bool = True) -> list[str]:
    """Every broken invariant found in the spool at ``root``, one line each."""
    problems: list[str] = []
    where: dict[str, list[str]] = {}
    for state in STATES:
        for jid in _jobs(root / state):
            where.setdefault(jid, []).append(state)
    running = root / "running"
    if running.is_dir():
        for w in running.iterdir():
            if w.is_dir():
                for jid in _jobs(w):
                    where.setdefault(jid, []).append(f"running/{w.name}")

    # 1. exactly one state per job
    for jid, states in sorted(where.items()):
        if len(states) > 1:
            problems.append(f"invariant 1: {jid} is in {len(states)} states: {', '.join(states)}")
        if settled and any(s.startswith("running/") for s in states):
            problems.append(f"invariant 8: {jid} is still running after recovery ({states[0]})")

    # 2. final paths hold only whole, validated files
    store = root / "store" / "sha256"
    if store.is_dir():
        for d in store.iterdir():
            for f in d.iterdir() if d.is_dir() else []:
                if f.name.startswith("."):
                    if settled:
                        problems.append(f"invariant 2: temporary file left in the store: {f}")
                    continue
                digest = f.name.split(".")[0]
                if _sha256(f) != digest:
                    problems.append(f"invariant 2: store file {f.name} does not hash to its name")
                if f.stat().st_mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH):
                    problems.append(f"invariant 2: store file {f.name} is writable")

    # 3. complete => manifest naming a store file with the same hash
    manifests = root / "manifests"
    for jid, states in where.items():
        if "complete" not in states:
            continue
        mpath = manifests / f"{jid}.json"
        try:
            m = json.loads(mpath.read_text())
        except (OSError, ValueError):
            problems.append(f"invariant 3: {jid} is complete without a readable manifest")
            continue
        target = root / m["output"]["store_path"]
        if not target.is_file():
            problems.append(f"invariant 3: manifest of {jid} names missing {m['output']['store_path']}")
        elif _sha256(target) != m["output"]["sha256"]:
            problems.append(f"invariant 3: manifest of {jid} does not match its store file")
    if manifests.is_dir():
        for mf in manifests.iterdir():
            if mf.name.startswith("."):
                if settled:
                    problems.append(f"invariant 2: temporary manifest left: {mf.name}")
                continue
            jid = mf.name[:-5]
            try:
                m = json.loads(mf.read_text())
            except (OSError, ValueError):
                problems.append(f"invariant 2: manifest {mf.name} is unreadable")
                continue
            if not (root / m["output"]["store_path"]).is_file():
                problems.append(f"invariant 2: manifest {mf.name} names a missing store file")

    # 4/5/6. attempts: records present, recipe unchanged, failures recorded
    attempts = root / "attempts"
    for jid, states in where.items():
        adir = attempts / jid
        nums = sorted(int(p.name) for p in adir.iterdir() if p.name.isdigit()) if adir.is_dir() else []
        job = _job_file(root, jid, states)
        for n in nums:
            if not (adir / str(n) / "attempt.json").is_file():
                problems.append(f"invariant 4: {jid} attempt {n} has no attempt.json")
            r = _staged(adir / str(n)) if job is not None else None
            if job is not None and r is not None:
                if r["recipe_hash"] != job["recipe_hash"]:
                    problems.append(f"invariant 5: {jid} attempt {n} rendered a different recipe")
                srcs = {s["role"]: s["sha256"] for s in job["sources"]}
                if {s["role"]: s["sha256"] for s in r["sources"]} != srcs:
                    problems.append(f"invariant 5: {jid} attempt {n} used different sources")
        if "complete" in states and settled and job is not None:
            # SPEC 11.9: a complete job keeps a readable record of the attempt that published
            # it (after fsck: its attempt.json, made again from the manifest if a cut took it).
            try:
                published = json.loads((manifests / f"{jid}.json").read_text())["attempt"]
            except (OSError, ValueError, KeyError):
                published = None
            if published and not _readable(adir / str(published) / "attempt.json"):
                problems.append(f"invariant 9: {jid} is complete without a record of attempt {published}")
        if "failed" in states:
            has_failure = any((adir / str(n) / "failure.json").is_file() for n in nums)
            if not has_failure:
                problems.append(f"invariant 6: {jid} is failed without a failure record")
            else:
                last = max(n for n in nums if (adir / str(n) / "failure.json").is_file())
                rec = json.loads((adir / str(last) / "failure.json").read_text())
                for key in ("job_id", "attempt", "stage", "property", "next_action"):
                    if key not in rec:
                        problems.append(f"invariant 6: failure record of {jid} lacks {key}")

    # 12. dependencies: a frozen dependent renders its upstream's published bytes only
    problems += _dependencies(root, where, settled)

    # Section 9. the library index: a complete job is found by each required tag, and
    # (settled) every entry names a job with a manifest.
    problems += _library(root, where, settled)

    # 2 (again). partial output only in attempts/*/*/work: nothing half-written elsewhere
    for state in STATES:
        folder = root / state
        if settled and folder.is_dir():
            for p in folder.iterdir():
                if p.name.startswith(".") and p.name.endswith(".tmp"):
                    problems.append(f"invariant 2: temporary file left in {state}/: {p.name}")
    return problems


def _dependencies(root: Path, where: dict[str, list[str]], settled: bool) -> list[str]:
    """SPEC 11.12, from the job files and manifests alone."""
    out = []
    revs: dict[str, dict[int, str]] = {}
    for jid, states in where.items():
        name, _, rev = jid.rpartition("@")
        if rev.isdigit():
            revs.setdefault(name, {})[int(rev)] = states[0]
    for jid, states in sorted(where.items()):
        state = states[0]
        path = root / state / f"{jid}.json"  # running jobs are "running/<worker>"
        try:
            job = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        ups = job.get("upstreams") or []
        if not ups:
            continue
        frozen = all(u.get("sha256") for u in ups)
        if state == "waiting":
            if frozen or not settled:
                continue
            moved = []
            for u in ups:
                ref = u.get("job") or u["ref"]
                if "@" in ref:
                    target = ref
                else:
                    have = revs.get(ref)
                    target = f"{ref}@{max(have)}" if have else None
                tstate = where.get(target, ["gone"])[0] if target else "gone"
                if tstate not in ("waiting", "pending", "held") and not tstate.startswith("running/"):
                    moved.append(f"{target} ({tstate})")
            if len(moved) == len(ups):
                problems = ", ".join(moved)
                out.append(f"invariant 12: {jid} still waits although its upstreams are done: {problems}")
            continue
        if state == "held":
            continue
        if not frozen:
            out.append(f"invariant 12: {jid} is {state} with sources from other jobs never frozen")
            continue
        srcs = {s["role"]: s["sha256"] for s in job["sources"]}
        for u in ups:
            try:
                m = json.loads((root / "manifests" / f"{u['job']}.json").read_text())
            except (OSError, ValueError, KeyError):
                out.append(f"invariant 12: {jid}'s upstream {u.get('job')} has no readable manifest")
                continue
            if "complete" not in where.get(u["job"], []):
                out.append(f"invariant 12: {jid}'s upstream {u['job']} is not complete")
            if m["output"]["sha256"] != u["sha256"] or srcs.get(u["role"]) != u["sha256"]:
                out.append(f"invariant 12: {jid}'s source {u['role']} is not {u['job']}'s published object")
            if not str(next((s["path"] for s in job["sources"] if s["role"] == u["role"]), "")).endswith(
                m["output"]["store_path"]
            ):
                out.append(f"invariant 12: {jid}'s source {u['role']} is not {u['job']}'s store file")
        if state == "complete":
            try:
                mine = json.loads((root / "manifests" / f"{jid}.json").read_text())
            except (OSError, ValueError):
                continue  # invariant 3 reports it
            used = {s["role"]: s["sha256"] for s in mine["sources"]}
            for u in ups:
                if used.get(u["role"]) != u["sha256"]:
                    out.append(f"invariant 12: {jid} was published from another {u['role']} than {u['job']}")
    return out


def _readable(path: Path) -> bool:
    try:
        return isinstance(json.loads(path.read_text()), dict)
    except (OSError, ValueError):
        return False


def _staged(attempt: Path) -> dict | None:
    """The result an attempt staged: format 2 keeps it in attempt.json ("result"), format 1
    in result.json. Neither is fsynced: a power cut may leave them empty (recovery knows)."""
    try:
        rec = json.loads((attempt / "attempt.json").read_text())
        if isinstance(rec, dict) and isinstance(rec.get("result"), dict):
            return rec["result"]
    except (OSError, ValueError):
        pass
    try:
        r = json.loads((attempt / "result.json").read_text())
        return r if isinstance(r, dict) else None
    except (OSError, ValueError):
        return None


def _encode(value: str) -> str:
    """SPEC 9's file name of a tag value, re-implemented here (see spool/library/index.py's docstring)."""
    safe = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-."
    raw = value.encode("utf-8")
    name = "".join(
        chr(b) if b in safe and not (i == 0 and b == 46) else f"%{b:02X}" for i, b in enumerate(raw)
    )
    if len(name) <= 200:
        return name
    cut = name[:167]
    if "%" in cut[-2:]:
        cut = cut[: cut.rindex("%")]
    return cut + "~" + hashlib.sha256(raw).hexdigest()[:32]


def _segment_lines(root: Path) -> dict[str, dict]:
    """Format 2: job -> its line in the library index's unmerged segments."""
    out: dict[str, dict] = {}
    folder = root / "index" / "_segments"
    for f in sorted(folder.glob("*.jsonl")) if folder.is_dir() else []:
        if f.name.startswith("."):
            continue
        for line in f.read_bytes().splitlines():
            try:
                x = json.loads(line)
            except ValueError:
                continue
            if isinstance(x, dict) and "job_id" in x:
                out.setdefault(x["job_id"], x)
    return out


def _library(root: Path, where: dict[str, list[str]], settled: bool) -> list[str]:
    """Section 9: a complete job is found by each required tag and has its version. Format 1:
    index/<tag>/<value>/<job> and library/<name>/<rev>. Format 2: a line of a segment in
    index/_segments/ (the tags in it), or, merged, the tag entries and
    index/_versions/<aa>/<name>@<rev> (aa: the first two hex digits of the name's sha256)."""
    import tomllib

    try:
        conf = tomllib.loads((root / "spool.toml").read_text())
    except (OSError, ValueError):
        conf = {}
    required = conf.get("acceptance", {}).get(
        "required_tags", ["campaign", "locale", "asset_type", "visibility"]
    )
    lines = _segment_lines(root)
    out = []
    for jid, states in sorted(where.items()):
        if "complete" not in states:
            continue
        try:
            m = json.loads((root / "manifests" / f"{jid}.json").read_text())
        except (OSError, ValueError):
            continue  # invariant 3 reports it
        name, rev = jid.rsplit("@", 1)
        line = lines.get(jid)
        if line is not None:
            for tag in required:
                if tag in m["tags"] and line.get("tags", {}).get(tag) != m["tags"][tag]:
                    out.append(f"section 9: complete {jid}'s segment line lacks {tag}={m['tags'][tag]!r}")
            continue
        for tag in required:
            if tag in m["tags"] and not (root / "index" / tag / _encode(m["tags"][tag]) / jid).exists():
                out.append(f"section 9: complete {jid} is not indexed under {tag}={m['tags'][tag]!r}")
        shard = hashlib.sha256(name.encode()).hexdigest()[:2]
        merged = (root / "index" / "_versions" / shard / jid).is_file()
        if not merged and not (root / "library" / name / rev).is_file():
            out.append(
                f"section 9: complete {jid} has no version (library/{name}/{rev}, a segment line, "
                f"or index/_versions/{shard}/{jid})"
            )
    index = root / "index"
    if settled and index.is_dir():
        for entry in index.glob("*/*/*"):
            top = entry.relative_to(index).parts[0]
            if top.startswith("_") and top != "_sha256":
                continue  # format 2's own folders, below
            if not entry.name.startswith(".") and not (root / "manifests" / f"{entry.name}.json").is_file():
                out.append(f"section 9: index entry {entry.relative_to(root)} names a job without a manifest")
        for entry in index.glob("_objects/*/*"):
            jid = entry.name[65:]
            if not entry.name.startswith(".") and not (root / "manifests" / f"{jid}.json").is_file():
                out.append(f"section 9: index entry {entry.relative_to(root)} names a job without a manifest")
        for entry in index.glob("_versions/*/*"):
            if not entry.name.startswith(".") and not (root / "manifests" / f"{entry.name}.json").is_file():
                out.append(
                    f"section 9: version entry {entry.relative_to(root)} names a job without a manifest"
                )
    return out


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: invariants.py SPOOL", file=sys.stderr)
        return 2
    problems = check(Path(argv[1]))
    for p in problems:
        print(p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
