"""The rules the code states about itself, checked by their tools (docs/design.md, "The tree"):
the layers (import-linter's contract in pyproject.toml), ruff's lint and format, and mypy, on the
whole package; no module over MAX_LINES; the programs that run on the hosts (tunnelspec/hostprogs)
standard library only and runnable by the oldest python3 a host has. Each tool runs as the developer
would run it, from the repository root."""

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
# What ruff (lint and format) and mypy hold clean: the whole package, the host programs included.
CHECKED = ["tunnelspec"]

# A module holds one idea and stays small (docs/design.md): past this, split it by topic.
MAX_LINES = 400
# Modules allowed past MAX_LINES, each with its reason. An entry whose module is back under the limit
# fails the test too, so that the entry goes.
OVER_MAX: dict[str, str] = {}
# The oldest python3 a supported host runs (Debian bullseye), for the host programs.
HOST_PYTHON = "3.9"


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


def test_no_module_is_over_the_line_limit():
    sizes = {str(p.relative_to(REPO)): len(p.read_text().splitlines()) for p in (REPO / "tunnelspec").rglob("*.py")}
    over = {name: n for name, n in sizes.items() if n > MAX_LINES and name not in OVER_MAX}
    assert over == {}, f"modules over {MAX_LINES} lines (split them by topic): {over}"
    stale = {name for name in OVER_MAX if sizes.get(name, 0) <= MAX_LINES}
    assert stale == set(), f"back under {MAX_LINES} lines or gone: remove from OVER_MAX: {stale}"


def _host_programs() -> list[Path]:
    from tunnelspec.hostprogs import HERE, PROGRAMS

    return [HERE / module for module in PROGRAMS.values()]


def test_host_programs_use_the_standard_library_only():
    """A host has python3 and nothing of tunnelspec's: each program imports the standard library alone."""
    for path in _host_programs():
        tree = ast.parse(path.read_text(), str(path))
        names = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        names |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
        assert names <= set(sys.stdlib_module_names), (path.name, sorted(names - set(sys.stdlib_module_names)))
        assert not any(isinstance(n, ast.ImportFrom) and n.level for n in ast.walk(tree)), path.name


def _old_python() -> str | None:
    for argv in ([f"python{HOST_PYTHON}"], ["env", f"PYENV_VERSION={HOST_PYTHON}", f"python{HOST_PYTHON}"]):
        try:
            r = subprocess.run([*argv, "-c", "import sys; print(sys.version_info[:2])"], capture_output=True,
                               text=True, timeout=30, stdin=subprocess.DEVNULL)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if r.returncode == 0 and r.stdout.strip() == f"({HOST_PYTHON.replace('.', ', ')})":
            return " ".join(argv)
    return None


def test_host_programs_load_on_the_oldest_host_python():
    """Each program loads (parses, defines everything at module level) under the oldest python3 a
    host runs; ruff's py39 target for tunnelspec/hostprogs (pyproject.toml) catches newer syntax, this
    catches what only runs: an annotation evaluated at import, a newer stdlib name."""
    python = _old_python()
    if python is None:
        pytest.skip(f"no python{HOST_PYTHON} on this machine")
    load = ("import importlib.util, sys\n"
            "for path in sys.argv[1:]:\n"
            "    spec = importlib.util.spec_from_file_location('hostprog', path)\n"
            "    spec.loader.exec_module(importlib.util.module_from_spec(spec))\n")
    r = subprocess.run([*python.split(), "-c", load, *map(str, _host_programs())], capture_output=True, text=True,
                       timeout=60, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stderr[-3000:]
