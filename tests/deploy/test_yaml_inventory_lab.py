"""A deploy driven by a YAML inventory equivalent to the lab's INI one changes nothing on a lab the
INI inventory converged: both formats describe the same cluster down to every task's check."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from support.cli import failed_report, tunnelspec
from tunnelspec.inventory import load_inventory

pytestmark = pytest.mark.lab

DEPLOY_TIMEOUT = 3600  # a cold lab builds llama.cpp on every host


def ini_to_yaml(ini: Path) -> str:
    """The same inventory in Ansible's YAML format: every group with its hosts (each host's own
    variables at its first listing), children and vars; values dumped with their parsed types."""
    inv = load_inventory(ini)
    placed: set[str] = set()

    def group(name: str) -> dict:
        g = inv.groups[name]
        out: dict = {}
        if g.hosts:
            out["hosts"] = {}
            for h in g.hosts:
                out["hosts"][h] = None if h in placed or not inv.hosts[h].vars else dict(inv.hosts[h].vars)
                placed.add(h)
        if g.children:
            out["children"] = {c: group(c) for c in g.children}
        if g.vars:
            out["vars"] = dict(g.vars)
        return out

    return yaml.safe_dump({"all": group("all")}, sort_keys=False)


def test_yaml_inventory_matches_ini(lab, tmp_path):
    yml = tmp_path / "inventory.yml"
    yml.write_text(ini_to_yaml(lab.inventory))
    # The conversion is exact: same groups, hosts and merged variables.
    assert load_inventory(yml).to_ansible_list() == load_inventory(lab.inventory).to_ansible_list()
    first = tunnelspec("deploy", str(lab.inventory), "--format", "json", timeout=DEPLOY_TIMEOUT)
    assert first.rc == 0, failed_report(first)
    again = tunnelspec("deploy", str(yml), "--format", "json", timeout=DEPLOY_TIMEOUT)
    assert again.rc == 0, failed_report(again)
    changed = {h: c["changed"] for h, c in again.recap.items()}
    assert set(changed) == {"main", "rpc-a", "rpc-b"}
    assert all(v == 0 for v in changed.values()), (changed, again.results("changed"))
