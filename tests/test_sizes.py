"""The package stays readable in pieces: no module over 450 lines, no class over 300, no function over 80.

A module that grows past one idea is split (``plan/context.py`` left ``plan/model.py``; the live
parameters left ``WeightVersions`` for ``training/live.py``). No exceptions are allowed: a new one
would be listed here with its reason.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import List

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "swpipeline"
MAX_MODULE, MAX_CLASS, MAX_FUNCTION = 450, 300, 80


def oversized(source: str, where: str) -> List[str]:
    """Each module, class or function of ``source`` over its limit, as ``where: kind name (n lines > limit)``."""
    found = []
    lines = len(source.splitlines())
    if lines > MAX_MODULE:
        found.append(f"{where}: module ({lines} lines > {MAX_MODULE})")
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ClassDef):
            kind, limit = "class", MAX_CLASS
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            kind, limit = "function", MAX_FUNCTION
        else:
            continue
        first = min([node.lineno] + [d.lineno for d in node.decorator_list])
        length = (node.end_lineno or node.lineno) - first + 1
        if length > limit:
            found.append(f"{where}:{first}: {kind} {node.name} ({length} lines > {limit})")
    return found


def test_no_module_class_or_function_of_the_package_is_over_its_limit() -> None:
    found = [line for path in sorted(PACKAGE.rglob("*.py"))
             for line in oversized(path.read_text(), str(path.relative_to(PACKAGE)))]
    assert found == [], "split these (one idea per module, class or function):\n" + "\n".join(found)


def test_the_check_sees_each_kind_of_oversize() -> None:
    body = "\n".join(f"    x{k} = {k}" for k in range(80))
    function = f"def long_function() -> None:\n{body}\n"
    assert oversized(function, "probe.py") == ["probe.py:1: function long_function (81 lines > 80)"]
    methods = "".join(f"    def m{k}(self) -> None:\n        pass\n\n" for k in range(101))
    assert oversized(f"class Big:\n{methods}", "probe.py") == ["probe.py:1: class Big (303 lines > 300)"]
    assert oversized("x = 1\n" * 451, "probe.py") == ["probe.py: module (451 lines > 450)"]
    assert oversized("x = 1\n" * 450, "probe.py") == []
