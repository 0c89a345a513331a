"""Imports live at the top of their module. One inside a function is an exception and says why, on
its own line: `# lazy: <reason>` — CLI startup (cli/main.py imports each command's module when that
command runs), an optional or slow dependency (gguf, numpy, huggingface_hub, asyncssh), a cycle, a
path only one caller takes. Everything else is hoisted, so the module's imports tell what it uses."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "tunnelspec"
LAZY = re.compile(r"#\s*lazy:\s*\S")
# Packages not yet held to the rule (none: every package is).
ALLOWED_UNMARKED: tuple[str, ...] = ()  # every package holds the rule now


def unmarked(source: str) -> list[int]:
    """The line of each import inside a function (at any depth) that has no `# lazy:` comment on any
    of its lines."""
    lazy_lines = {
        tok.start[0]
        for tok in tokenize.generate_tokens(io.StringIO(source).readline)
        if tok.type == tokenize.COMMENT and LAZY.match(tok.string)
    }
    found = set()
    for fn in ast.walk(ast.parse(source)):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(fn):
            if isinstance(node, (ast.Import, ast.ImportFrom)) and not any(
                line in lazy_lines for line in range(node.lineno, (node.end_lineno or node.lineno) + 1)
            ):
                found.add(node.lineno)
    return sorted(found)


def _modules() -> list[tuple[str, str]]:
    return [(path.relative_to(ROOT).as_posix(), path.read_text()) for path in sorted(PACKAGE.rglob("*.py"))]


def test_every_function_level_import_says_why_it_is_lazy():
    hits = [
        f"{name}:{line}"
        for name, source in _modules()
        if not name.startswith(ALLOWED_UNMARKED)
        for line in unmarked(source)
    ]
    assert hits == [], (
        "imports inside a function without a `# lazy: <reason>` comment (hoist them to the "
        "module's top, or say why they cannot be):\n" + "\n".join(hits)
    )


def test_the_check_sees_what_it_should():
    source = (
        "import os\n"
        "def f():\n"
        "    import json\n"
        "    import gguf  # lazy: optional test dependency\n"
        "    from x import (a,  # lazy: cycle with x\n"
        "                   b)\n"
        "    async def g():\n"
        "        from y import c  # noqa: F401\n"
        "    s = '# lazy: not a comment'; import re\n"
        "    import z  # lazy:\n"
        "class C:\n"
        "    def m(self):\n"
        "        import sys\n"
    )
    assert unmarked(source) == [3, 8, 9, 10, 13]
