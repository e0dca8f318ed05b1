"""The import graph (tools/imports.py): no circles, so no arrow runs back up, and an import
of a project module sits at the top of its module unless a measured start-up cost keeps it
inside a function; then it says so on its line or the line before (``# here: <what it keeps
cheap> (+N ms)``, figures from ``python -X importtime`` and tools/startup.py). The count is
a ratchet: lower it, never raise it."""

from __future__ import annotations

import ast

import imports  # tools/ is on sys.path (conftest)

#: On record (arrows from a module to a project module imported inside a function); it
#: may only go down.
MAX_INSIDE_FUNCTIONS = 50


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


def unexplained_imports_in_functions(root=imports.ROOT) -> list[str]:
    """``path:line`` of each import of a project module inside a function with no
    ``# here:`` comment on its lines or on the line before."""
    mods = imports.modules(root)
    out = []
    for mod, path in mods.items():
        lines = path.read_text().splitlines()
        tree = ast.parse("\n".join(lines), str(path))
        inner = {
            node
            for fn in ast.walk(tree)
            if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef)
            for node in ast.walk(fn)
            if isinstance(node, ast.Import | ast.ImportFrom)
        }
        for node in inner:
            if isinstance(node, ast.ImportFrom):
                names = [imports._resolve(node.module or "", node.level, mod, path.name == "__init__.py")]
            else:
                names = [a.name for a in node.names]
            if not any(n.split(".")[0] in imports.PACKAGES for n in names):
                continue
            span = lines[node.lineno - 2 : node.end_lineno]
            if not any("# here:" in line for line in span):
                out.append(f"{path.relative_to(root)}:{node.lineno}")
    return sorted(out)


def test_every_import_of_a_project_module_inside_a_function_says_why() -> None:
    assert unexplained_imports_in_functions() == []


def test_an_import_inside_a_function_without_a_reason_is_found(tmp_path) -> None:
    for pkg in imports.PACKAGES:
        (tmp_path / pkg).mkdir()
        (tmp_path / pkg / "__init__.py").write_text("")
    (tmp_path / "spool" / "a.py").write_text("")
    (tmp_path / "spool" / "b.py").write_text(
        "def f():\n"
        "    import json\n"  # not a project module: not asked
        "    from . import a  # here: f stays cheap (+1 ms)\n"
        "    # here: g stays cheap (+2 ms)\n"
        "    from spool import a as again\n"
        "\n"
        "\n"
        "def g():\n"
        "    from spool import a\n"
    )
    assert unexplained_imports_in_functions(tmp_path) == ["spool/b.py:9"]
