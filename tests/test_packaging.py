"""`pip install .` / `pipx install .` into fresh environments give a working `tunnelspec` with its playbooks and
templates, and the build prints no deprecation warning (setuptools turns its deprecations into errors later)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

# The `build` tier: this module builds a wheel and installs it into fresh environments (not the pure tier).
pytestmark = pytest.mark.build

REPO = Path(__file__).resolve().parents[1]


def _no_deprecation(output: str) -> None:
    lines = [ln for ln in output.splitlines() if "deprecat" in ln.lower()]
    assert not lines, "build printed deprecation warnings:\n" + "\n".join(lines[:10])


def test_pip_install_into_fresh_venv(tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    # -v: pip shows the build backend's own output only when verbose; that is where setuptools warns.
    pip = subprocess.run([str(venv / "bin" / "pip"), "install", "-v", str(REPO)], capture_output=True, text=True,
                         timeout=600, stdin=subprocess.DEVNULL)
    assert pip.returncode == 0, pip.stderr[-3000:]
    _no_deprecation(pip.stdout + pip.stderr)
    for argv in ([str(venv / "bin" / "tunnelspec"), "--help"], [str(venv / "bin" / "python"), "-m", "tunnelspec", "--help"]):
        res = subprocess.run(argv, capture_output=True, text=True, cwd=tmp_path, timeout=60)
        assert res.returncode == 0 and "deploy" in res.stdout and "teardown" in res.stdout, res.stderr
    # The installed package (not this checkout) carries the playbooks and unit templates.
    probe = ("import tunnelspec, pathlib;"
             "from tunnelspec.engine.playbook import builtin_playbook, load_playbook;"
             "pb = load_playbook(builtin_playbook('deploy.yml'));"
             "d = pathlib.Path(tunnelspec.__file__).parent / 'data' / 'templates';"
             "print(str(pathlib.Path(tunnelspec.__file__).parent), len(pb.plays), sorted(p.name for p in d.glob('*.j2')))")
    res = subprocess.run([str(venv / "bin" / "python"), "-c", probe], capture_output=True, text=True, cwd=tmp_path,
                         timeout=60)
    assert res.returncode == 0, res.stderr
    where, plays, templates = res.stdout.split(" ", 2)
    assert where.startswith(str(venv)) and int(plays) >= 5
    assert "tunnelspec-rpc.service.j2" in templates and "tunnelspec-llama-server.service.j2" in templates


def test_wheel_carries_playbooks_templates_and_main(tmp_path):
    """The built wheel itself (what an index would serve) holds the data files and __main__."""
    res = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-v", "-w", str(tmp_path), str(REPO)],
                         capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL)
    assert res.returncode == 0, res.stderr[-3000:]
    _no_deprecation(res.stdout + res.stderr)
    (wheel,) = tmp_path.glob("tunnelspec-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "tunnelspec/__main__.py" in names
    assert "tunnelspec/data/playbooks/deploy.yml" in names
    assert "tunnelspec/data/templates/tunnelspec-rpc.service.j2" in names
    # The programs the deploy installs on the hosts (tunnelspec/hostprogs).
    from tunnelspec.hostprogs import PROGRAMS
    assert {"tunnelspec/hostprogs/draftwatch.py", "tunnelspec/hostprogs/draftwatch_state.py",
            "tunnelspec/hostprogs/draftwatch_watch.py", "tunnelspec/hostprogs/metrics.py",
            "tunnelspec/hostprogs/metrics_sources.py", "tunnelspec/hostprogs/rpc_wait.py"} <= names
    assert {f"tunnelspec/hostprogs/{module}" for module in PROGRAMS.values()} <= names
    # The alert rules, their tests and the dashboard (docs/metrics.md) come with the package.
    assert {"tunnelspec/data/monitoring/tunnelspec.rules.yml", "tunnelspec/data/monitoring/tunnelspec.rules.test.yml",
            "tunnelspec/data/monitoring/tunnelspec.dashboard.json"} <= names
    meta = next(n for n in names if n.endswith(".dist-info/METADATA"))
    text = zipfile.ZipFile(wheel).read(meta).decode()
    assert "License-Expression: MIT" in text


def test_pipx_install(tmp_path):
    pipx = shutil.which("pipx", path=str(Path(sys.executable).parent)) or shutil.which("pipx")
    if pipx is None:
        pytest.skip("pipx not installed (it is in the test extras: pip install -e '.[test]')")
    env = dict(os.environ, PIPX_HOME=str(tmp_path / "pipx"), PIPX_BIN_DIR=str(tmp_path / "bin"),
               PIPX_MAN_DIR=str(tmp_path / "man"))
    res = subprocess.run([pipx, "install", "--verbose", str(REPO)], capture_output=True, text=True, timeout=600,
                         env=env, stdin=subprocess.DEVNULL)
    assert res.returncode == 0, res.stderr[-3000:]
    _no_deprecation(res.stdout + res.stderr)
    run = subprocess.run([str(tmp_path / "bin" / "tunnelspec"), "--help"], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0 and "deploy" in run.stdout, run.stderr
