"""The rules the code states about itself, checked by their tools (docs/design.md, "The tree"):
the layers (import-linter's contract in pyproject.toml), ruff's lint and format, and mypy, on the
packages that are held to them. Each runs as the developer would run it, from the repository root."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
# The packages ruff (lint and format) and mypy hold clean; the rest joins as it is cleaned.
CHECKED = ["tunnelspec/engine", "tunnelspec/connection", "tunnelspec/inventory", "tunnelspec/cluster",
           "tunnelspec/llama/served_plan.py"]


def tool(name: str) -> str:
    path = BIN / name
    if not path.exists():
        found = shutil.which(name)
        if found is None:
            pytest.fail(f"{name} is not installed: it is a test dependency (pyproject.toml [test])")
        return found
    return str(path)


def run(argv: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL)


def test_no_import_climbs_the_layers():
    r = run([tool("lint-imports"), "--no-cache"])
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-2000:]
    assert "1 kept, 0 broken" in r.stdout


def test_the_layer_contract_catches_a_climbing_import(tmp_path):
    """The contract is not vacuous: a module of a low layer (core) that imports a high one (cli) breaks
    it, named with its line. Checked on a copy of the package, so the tree itself is not touched."""
    copy = tmp_path / "tree"
    shutil.copytree(REPO / "tunnelspec", copy / "tunnelspec", ignore=shutil.ignore_patterns("__pycache__", "data"))
    shutil.copy(REPO / "pyproject.toml", copy / "pyproject.toml")
    (copy / "tunnelspec" / "core" / "climber.py").write_text("from tunnelspec.cli import main  # climbs\n")
    r = subprocess.run([tool("lint-imports"), "--no-cache"], cwd=copy, capture_output=True, text=True, timeout=600,
                       env={"PATH": str(BIN) + ":/usr/bin:/bin", "PYTHONPATH": str(copy)}, stdin=subprocess.DEVNULL)
    assert r.returncode == 1, r.stdout[-3000:] + r.stderr[-2000:]
    assert "tunnelspec.core is not allowed to import tunnelspec.cli" in r.stdout
    assert "tunnelspec.core.climber -> tunnelspec.cli" in r.stdout


def test_ruff_lint_is_clean_on_the_checked_packages():
    r = run([tool("ruff"), "check", "--no-cache", *CHECKED])
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-2000:]


def test_ruff_format_is_clean_on_the_checked_packages():
    r = run([tool("ruff"), "format", "--check", "--no-cache", *CHECKED])
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-2000:]


def test_mypy_is_clean_on_the_checked_packages():
    r = run([tool("mypy"), "--no-incremental", "--cache-dir", "/dev/null", *CHECKED])
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-2000:]
