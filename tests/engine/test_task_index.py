"""The task index (engine/task_index.py) says which module registers each task kind and gate, so that
a run imports only the modules its playbook names. A kind added, moved or renamed without
regenerating the index fails here; a playbook naming any kind loads in a fresh process with only
its modules imported."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tunnelspec.engine.registry import index_source

pytestmark = pytest.mark.unit

INDEX = Path(__file__).resolve().parents[2] / "tunnelspec" / "engine" / "task_index.py"
GENERIC8 = Path(__file__).resolve().parent / "data" / "generic8.yml"


def test_index_is_what_the_modules_register():
    assert INDEX.read_text() == index_source(), (
        "tunnelspec/engine/task_index.py is stale: run "
        "`python -m tunnelspec.engine.registry > tunnelspec/engine/task_index.py`"
    )


def _fresh(code: str) -> dict:
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    return json.loads(p.stdout)


def test_a_generic_playbook_imports_no_component():
    out = _fresh(
        "import json, sys\n"
        "from tunnelspec.engine.playbook import load_playbook\n"
        f"pb = load_playbook({str(GENERIC8)!r})\n"
        "print(json.dumps({'components': sorted(m for m in sys.modules if m.startswith('tunnelspec.components.')),"
        " 'tasks': len([t for p in pb.plays for t in p.tasks])}))\n"
    )
    assert out["tasks"] == 8
    assert out["components"] == []


def test_every_kind_and_gate_resolves_in_a_fresh_process():
    out = _fresh(
        "import json\n"
        "from tunnelspec.engine import registry\n"
        "from tunnelspec.engine.task_index import TASK_MODULES, GATE_MODULES\n"
        "bad = [k for k in TASK_MODULES if getattr(registry.task_class(k), 'module', None) != k]\n"
        "bad += [k for k in GATE_MODULES if registry.gate(k) is None]\n"
        "print(json.dumps({'bad': bad, 'none': registry.task_class('no_such_kind') is None}))\n"
    )
    assert out == {"bad": [], "none": True}


def test_an_unknown_kind_is_named_with_its_nearest_in_a_fresh_process(tmp_path):
    pb = tmp_path / "pb.yml"
    pb.write_text("- hosts: all\n  tasks:\n    - name: x\n      llama_sourc: {}\n    - name: y\n      tree_hash: {}\n")
    out = _fresh(
        "import json\n"
        "from tunnelspec.core.errors import TunnelspecError\n"
        "from tunnelspec.engine.playbook import load_playbook\n"
        "try:\n"
        f"    load_playbook({str(pb)!r})\n"
        "except TunnelspecError as e:\n"
        "    print(json.dumps(str(e)))\n"
    )
    assert "unknown module 'llama_sourc'" in out and "did you mean 'llama_source'" in out and ":4" in out
