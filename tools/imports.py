#!/usr/bin/env python3
"""The import graph of spool and spoold, as a newcomer meets it: modules, arrows, the
imports hidden inside functions, the circles, and the floors.

A module's *floor* is the length of the longest chain of imports below it (a module that
imports nothing of the project is on floor 0); an arrow that runs back up (from a module
to one on its own floor or above) can only be part of a circle. Imports placed inside a
function count as arrows too: they hide a circle from ruff and mypy, not from a reader.

    tools/imports.py            # the summary, then each circle
    tools/imports.py --json     # the same for scripts (tests/test_imports.py reads it)
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("spool", "spoold")


def modules(root: Path = ROOT) -> dict[str, Path]:
    """Every module of the project's packages: dotted name -> file."""
    out: dict[str, Path] = {}
    for pkg in PACKAGES:
        for f in sorted((root / pkg).rglob("*.py")):
            parts = list(f.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = f
    return out


def _resolve(name: str, level: int, here: str, is_package: bool) -> str:
    if level == 0:
        return name
    base = here.split(".") if is_package else here.split(".")[:-1]
    base = base[: len(base) - (level - 1)]
    return ".".join([*base, name] if name else base)


def arrows(mods: dict[str, Path]) -> list[tuple[str, str, bool]]:
    """(importer, imported, inside a function) for every import of a project module.
    ``from pkg import name`` counts as an arrow to ``pkg.name`` when that is a module."""
    out: set[tuple[str, str, bool]] = set()
    for mod, path in mods.items():
        tree = ast.parse(path.read_text(), str(path))
        is_package = path.name == "__init__.py"
        nested: set[int] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                for inner in ast.walk(node):
                    if isinstance(inner, ast.Import | ast.ImportFrom):
                        nested.add(id(inner))
        for node in ast.walk(tree):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _resolve(node.module or "", node.level, mod, is_package)
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
            else:
                continue
            if _type_checking_only(tree, node):
                continue
            for t in targets:
                while t and t not in mods:
                    t = t.rpartition(".")[0]
                if t and t != mod:
                    out.add((mod, t, id(node) in nested))
    return sorted(out)


def _type_checking_only(tree: ast.Module, node: ast.AST) -> bool:
    """Whether ``node`` sits under ``if TYPE_CHECKING:`` (no arrow at run time)."""
    for top in tree.body:
        if (
            isinstance(top, ast.If)
            and "TYPE_CHECKING" in ast.unparse(top.test)
            and any(n is node for n in ast.walk(top))
        ):
            return True
    return False


def circles(nodes: list[str], edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    sys.setrecursionlimit(10_000)

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in nodes:
        if v not in index:
            visit(v)
    return sorted(out, key=len, reverse=True)


def look(root: Path = ROOT) -> dict[str, Any]:
    mods = modules(root)
    arr = arrows(mods)
    edges: dict[str, set[str]] = defaultdict(set)
    for a, b, _ in arr:
        edges[a].add(b)
    for m in mods:
        edges.setdefault(m, set())
    circ = circles(sorted(mods), edges)
    comp_of = {m: i for i, c in enumerate(circ) for m in c}
    # floors on the condensation (a circle is one room for this purpose)
    floor: dict[str, int] = {}

    def depth(m: str, seen: frozenset[str] = frozenset()) -> int:
        if m in floor:
            return floor[m]
        group = set(circ[comp_of[m]]) if m in comp_of else {m}
        below = {t for g in group for t in edges[g]} - group
        d = 1 + max((depth(t, seen | group) for t in below), default=-1)
        for g in group:
            floor[g] = d
        return d

    for m in mods:
        depth(m)
    back_up = [(a, b) for a, b, _ in arr if floor[b] >= floor[a]]
    return {
        "modules": len(mods),
        "arrows": len(arr),
        "inside_functions": sum(1 for *_, inside in arr if inside),
        "floors": 1 + max(floor.values(), default=0),
        "back_up": sorted(f"{a} -> {b}" for a, b in back_up),
        "circles": circ,
        "folders": sorted({m.rpartition(".")[0] for m in mods if "." in m}),
        "inside_function_arrows": sorted(f"{a} -> {b}" for a, b, inside in arr if inside),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    r = look()
    if args.json:
        print(json.dumps(r, indent=1))
        return 0
    print(
        f"{r['modules']} modules on {r['floors']} floors in {len(r['folders'])} folders, "
        f"{r['arrows']} arrows ({r['inside_functions']} inside functions), "
        f"{len(r['back_up'])} running back up, {len(r['circles'])} circles"
    )
    for c in r["circles"]:
        print(f"  circle of {len(c)}: {', '.join(c)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
