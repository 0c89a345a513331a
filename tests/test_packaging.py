"""`pip install .` into a fresh venv gives a working `tunnelspec` with its playbooks and templates."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_pip_install_into_fresh_venv(tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = subprocess.run([str(venv / "bin" / "pip"), "install", "-q", str(REPO)], capture_output=True, text=True,
                         timeout=600, stdin=subprocess.DEVNULL)
    assert pip.returncode == 0, pip.stderr[-3000:]
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
