"""Shared helpers for the inventory tests."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent
REPO = HERE.parent.parent


def _run_tunnelspec(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """The real CLI in a real process, as a user runs it."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run(
        [sys.executable, "-m", "tunnelspec", *args],
        capture_output=True, text=True, env=env, cwd=cwd or REPO, timeout=60,
    )


def _ansible_inventory_list(path: Path, plugin: str = "ini") -> dict:
    """`ansible-inventory --list` from ansible-core, forced to one plugin (ini or yaml), parse
    errors fatal."""
    # The oracle is a test dependency: it must be there (next to this Python, e.g. in .venv/bin),
    # never silently skipped.
    beside = Path(sys.executable).parent / "ansible-inventory"
    exe = str(beside) if beside.exists() else shutil.which("ansible-inventory")
    assert exe, "ansible-core is a test dependency: pip install -e '.[test]'"
    env = dict(
        os.environ,
        ANSIBLE_INVENTORY_ENABLED=plugin,
        ANSIBLE_INVENTORY_UNPARSED_FAILED="1",
        ANSIBLE_NOCOLOR="1",
    )
    res = subprocess.run(
        [exe, "-i", str(path.resolve()), "--list"],
        capture_output=True, text=True, env=env, cwd=path.parent, timeout=120,
        # Ansible refuses a non-blocking stdin; an inherited one may have been left so by asyncio.
        stdin=subprocess.DEVNULL,
    )
    assert res.returncode == 0, f"ansible-inventory failed on {path.name}: {res.stderr}"
    data = json.loads(res.stdout)
    # ansible-core >= 2.19 tags its JSON with the encoder profile; that is not inventory data.
    data["_meta"].pop("profile", None)
    return data


@pytest.fixture
def run_tunnelspec():
    return _run_tunnelspec


@pytest.fixture
def ansible_inventory_list():
    return _ansible_inventory_list
