"""The server pieces against the real fixture build on this machine (no lab): device discovery output,
the argv built from the real --help, a real llama-server started with exactly that argv, the HTTP
client's completion with draft tokens, and the log line placing the draft on RPC0."""

from __future__ import annotations

import asyncio
import subprocess

import pytest

from tunnelspec.core.constants import LOOPBACK
from tunnelspec.inventory import load_inventory
from tunnelspec.cluster.model import Cluster
from tunnelspec.llama import flags
from tunnelspec.core import http
from support.localserver import free_port, spawn
from tunnelspec.components.server.args import build_server_argv, draft_placement, list_devices_argv
from tunnelspec.llama.served_plan import ServedPlan

pytestmark = pytest.mark.llama


def one_node_cluster(tmp_path, tunnel_port: int, server_port: int, model: str, commit: str) -> Cluster:
    inv = tmp_path / "inventory.ini"
    inv.write_text(f"""[main]
main ansible_connection=local llama_server_port={free_port()} llama_server_internal_port={server_port}

[rpc]
node ansible_host=10.77.0.11 rpc_role=draft tunnel_port={tunnel_port}

[all:vars]
llama_repo=/srv/r.git
llama_commit={commit}
llama_model={model}
llama_draft_model={model}
""")
    return Cluster.from_inventory(load_inventory(inv))


def test_real_build_argv_runs_with_the_draft_on_rpc0(llama_bin, llama_fixtures, rpc_server, tmp_path):
    help_text = subprocess.run([llama_bin.llama_server, "--help"], capture_output=True, text=True, timeout=60).stdout
    help_ = flags.parse_help(help_text, build=llama_bin.commit[:9])
    port = free_port()
    c = one_node_cluster(tmp_path, rpc_server.port, port, llama_fixtures.model_local, llama_fixtures.commit)
    listed = subprocess.run(list_devices_argv(llama_bin.llama_server, c.rpc_endpoints), capture_output=True,
                            text=True, timeout=60)
    by_port = flags.rpc_devices_by_port(flags.parse_list_devices(listed.stdout + listed.stderr))
    assert by_port == {rpc_server.port: ["RPC0"]}
    plan = build_server_argv(c, help_, by_port, llama_bin.llama_server, llama_fixtures.model_local,
                             llama_fixtures.model_local)
    assert plan.argv[1:3] == ["--rpc", f"{LOOPBACK}:{rpc_server.port}"]
    assert "--spec-type" in plan.argv  # this build has it: it must be there
    proc = spawn(plan.argv, tmp_path / "llama-server.log")
    try:
        async def go():
            opener = http.tcp_opener(port)
            await http.wait_health(opener, 120)
            return await http.completion(opener, "Once upon a time", 32)

        body = asyncio.run(go())
        t = body["timings"]
        assert t["draft_n"] > 0 and t["draft_n_accepted"] == t["draft_n"], t
        placed = draft_placement(proc.log(), ServedPlan.from_fact(plan.as_fact()))
        assert (placed.device, placed.port) == ("RPC0", rpc_server.port)
    finally:
        proc.stop()
