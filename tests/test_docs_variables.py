"""The docs' variables are the declared ones (cluster/declared.py): docs/variables.md is generated
from the declarations and must equal what the generator prints now; inventory.example.ini shows each
declared variable (tests/test_docs_agree.py) and, where a variable's own line names its default, the
declared one; a declaration has a type and a doc line (tests/inventory/test_schema.py)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from tunnelspec.cluster import schema
from tunnelspec.cluster.declared import DECLARED

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "variables.md"
EXAMPLE_INI = REPO / "inventory.example.ini"


def _generated_block(text: str) -> str:
    start, end = text.index(schema.BEGIN), text.index(schema.END) + len(schema.END)
    return text[start:end]


def test_the_variables_page_is_what_the_declarations_generate():
    want = subprocess.run([sys.executable, "-m", "tunnelspec.cluster.schema", "--markdown"], capture_output=True,
                          text=True, check=True, cwd=REPO).stdout.strip()
    assert _generated_block(DOC.read_text()) == want, (
        "docs/variables.md is stale: regenerate its table with python -m tunnelspec.cluster.schema --markdown")


def test_every_declared_variable_has_one_row_and_every_row_is_declared():
    rows = re.findall(r"^\| `([a-z_]+)` \|", DOC.read_text(), re.M)
    assert sorted(rows) == sorted(DECLARED) and len(rows) == len(set(rows))


def test_a_row_shows_the_declared_default():
    cells = {}
    for line in DOC.read_text().splitlines():
        if line.startswith("| `"):
            row = [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]
            cells[row[0].strip("`")] = row
    for name, var in DECLARED.items():
        assert cells[name][2] == var.default_text.replace("|", "\\|"), name


def test_the_example_inventory_shows_the_declared_defaults():
    """A line that explains a variable (`# name   …`) and names its default names the declared one."""
    checked = 0
    for line in EXAMPLE_INI.read_text().splitlines():
        head = re.match(r"^#\s*([a-z][a-z0-9_]+)\s{2,}(.*)$", line)
        if not head or head.group(1) not in DECLARED:
            continue
        var, text = DECLARED[head.group(1)], head.group(2)
        shown = re.search(r"\(default ([^;:,)\s]+)", text) or re.search(r"(\S+) \(default\)", text)
        if not shown or var.derived or var.default is None or isinstance(var.default, list):
            continue
        assert shown.group(1) == var.default_text, (var.name, line)
        checked += 1
    assert checked >= 8
