"""A component's private names stay its own: no module of components/ imports a `_name` from
another (a name two modules share is public, and says so by its spelling)."""

from __future__ import annotations

import ast
from pathlib import Path

COMPONENTS = Path(__file__).resolve().parents[1] / "tunnelspec" / "components"


def test_no_private_cross_imports_in_components():
    found = []
    for path in sorted(COMPONENTS.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("tunnelspec.components"):
                found += [f"{path.relative_to(COMPONENTS)}: {node.module}.{a.name}"
                          for a in node.names if a.name.startswith("_")]
    assert not found, found
