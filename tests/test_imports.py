"""The import graph (tools/imports.py): no circles, so no arrow runs back up, and no new
import hides inside a function. Most of the 107 left keep the lean CLI's start-up cheap or
load a heavy part only where it is needed; not each is justified by a measurement yet, so
the figure is a ratchet: lower it, never raise it."""

from __future__ import annotations

import imports  # tools/ is on sys.path (conftest)

#: On record; it may only go down.
MAX_INSIDE_FUNCTIONS = 52


def test_no_circles_and_no_new_imports_hidden_in_functions() -> None:
    r = imports.look()
    assert r["circles"] == [] and r["back_up"] == []
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
