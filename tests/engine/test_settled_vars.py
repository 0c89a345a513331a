"""One route of a variable to the tasks: the engine's template context gives every declared variable
its settled, typed value (cluster/schema.py settled), so the shipped playbooks need no `default()`."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from jinja2 import meta

from tunnelspec.cluster import schema
from tunnelspec.cluster.model import Cluster
from tunnelspec.core.templating import env
from tunnelspec.engine.context import RunOptions
from tunnelspec.engine.executor import Run
from tunnelspec.engine.playbook import builtin_playbook
from tunnelspec.inventory import load_inventory

REPO = Path(__file__).resolve().parents[2]
PLAYBOOKS = sorted(builtin_playbook("deploy.yml").parent.glob("*.yml"))


def _run(extra: dict | None = None) -> Run:
    inv = load_inventory(REPO / "inventory.example.ini").with_extra_vars(extra or {})
    return Run(inv, RunOptions(extra_vars=extra or {}), lambda event: None, cluster=Cluster.from_inventory(inv))


def test_no_playbook_has_a_default():
    """A default in a playbook is a second declaration of it, which can drift from the first."""
    found = [f"{p.name}:{n}" for p in PLAYBOOKS for n, line in enumerate(p.read_text().splitlines(), 1)
             if "default(" in line]
    assert PLAYBOOKS and found == []


def _names(text: str) -> set[str]:
    names: set[str] = set()
    for expr in re.findall(r"\{\{(.*?)\}\}", text) + re.findall(r'when: "(.*?)"', text):
        names |= meta.find_undeclared_variables(env().parse("{{ " + expr + " }}"))
    return names


@pytest.mark.parametrize("host", ["gpu-box", "node-a", "node-b"])
def test_every_declared_variable_a_playbook_reads_is_in_the_context(host):
    ctx = _run().template_vars(host)
    read = {n for p in PLAYBOOKS for n in _names(p.read_text())} & set(schema.DECLARED)
    assert read and sorted(n for n in read if n not in ctx) == []


def test_the_context_holds_typed_and_derived_values():
    run = _run()
    main, node_b = run.template_vars("gpu-box"), run.template_vars("node-b")
    assert main["host_role"] == "main" and node_b["host_role"] == "rpc"
    assert main["rpc_local_isolation"] is True and main["llama_keep_builds"] == 3
    assert main["tunnelspec_root"] == "/opt/tunnelspec" and main["llama_patches"] == []
    assert main["llama_build_number"] is None and main["tunnel_from"] is None
    assert main["llama_server_extra_args"] == ["--ctx-size", "4096"]
    assert node_b["tunnel_port"] == 15053 and node_b["rpc_threads"] == 8
    assert main["bench_port"] == run.cluster.main.front.bench_port
    assert node_b["ansible_host"] == "192.0.2.12" and node_b["tunnel_ssh_host"] == "192.0.2.12"


def test_an_extra_var_is_settled_by_its_type():
    ctx = _run({"rpc_local_isolation": "false", "llama_keep_builds": "5"}).template_vars("node-a")
    assert ctx["rpc_local_isolation"] is False and ctx["llama_keep_builds"] == 5
