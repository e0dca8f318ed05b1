"""The import graph (tools/imports.py) does not get worse: no new circle, no circle grows,
and no new import hides inside a function. The figures are a ratchet: lower them as the
circles are taken apart (issue 24), never raise them."""

from __future__ import annotations

import imports  # tools/ is on sys.path (conftest)

#: The figures on record; each may only go down.
MAX_CIRCLES = 1
MAX_LARGEST_CIRCLE = 17
MAX_INSIDE_FUNCTIONS = 102


def test_the_import_graph_gets_no_worse() -> None:
    r = imports.look()
    sizes = [len(c) for c in r["circles"]]
    assert len(sizes) <= MAX_CIRCLES, r["circles"]
    assert max(sizes, default=0) <= MAX_LARGEST_CIRCLE, r["circles"]
    assert r["inside_functions"] <= MAX_INSIDE_FUNCTIONS, r["inside_function_arrows"]


def test_the_tool_sees_a_circle_and_an_import_inside_a_function(tmp_path) -> None:
    for pkg in imports.PACKAGES:
        (tmp_path / pkg).mkdir()
        (tmp_path / pkg / "__init__.py").write_text("")
    (tmp_path / "spool" / "a.py").write_text("from . import b\n")
    (tmp_path / "spool" / "b.py").write_text("def f():\n    from . import a\n")
    r = imports.look(tmp_path)
    assert r["circles"] == [["spool.a", "spool.b"]]
    assert r["inside_function_arrows"] == ["spool.b -> spool.a"]
