"""Target placement by name and a draft tuning flag, against the real fixture build on this
machine (no lab): two real ggml-rpc-servers on loopback stand for two rpc nodes; rpc-a (the draft
node, share 1) and rpc-b (share 3) get the target's layers in the proportion llama.cpp's own rule
gives for -ts 1,3, seen in its load_tensors lines; `--spec-draft-type-k f32` from
llama_server_extra_args reaches the draft's KV cache. (The lab test tests/deploy/test_spec_placement.py
does the same through the deploy and the SSH tunnels.)"""

from __future__ import annotations

import asyncio
import re
import subprocess

import pytest

from tunnelspec.inventory import load_inventory
from tunnelspec.cluster.model import Cluster
from tunnelspec.lab import gguf_tiny
from support.localserver import free_port, spawn, start_rpc_server
from tunnelspec.llama import flags, props
from tunnelspec.core import http
from tunnelspec.components.server.args import build_server_argv, list_devices_argv

from support.placement import BLOCKS, check_one_to_three  # the same rule as the lab test's, one place

pytestmark = pytest.mark.llama


def test_layers_follow_shares_by_node_name_and_tuning_flag_reaches_the_draft(llama_bin, llama_fixtures, tmp_path):
    model = tmp_path / "tiny-11.gguf"
    gguf_tiny.write_tiny_llama(model, blocks=BLOCKS)
    servers = [start_rpc_server(llama_bin.rpc_server, free_port(), tmp_path / f"rpc-{i}.log") for i in range(2)]
    proc = None
    try:
        port = free_port()
        inv = tmp_path / "inventory.ini"
        inv.write_text(f"""[main]
main ansible_connection=local llama_server_port={free_port()} llama_server_internal_port={port} llama_split_mode=layer
[rpc]
rpc-a ansible_host=10.77.0.11 rpc_role=draft rpc_target_share=1 tunnel_port={servers[0].port}
rpc-b ansible_host=10.77.0.12 rpc_role=target rpc_target_share=3 tunnel_port={servers[1].port}
[all:vars]
llama_repo=/srv/r.git
llama_commit={llama_fixtures.commit}
llama_model={model}
llama_draft_model={model}
llama_server_extra_args="--spec-draft-type-k f32"
""")
        c = Cluster.from_inventory(load_inventory(inv))
        help_text = subprocess.run([llama_bin.llama_server, "--help"], capture_output=True, text=True,
                                   timeout=60).stdout
        listed = subprocess.run(list_devices_argv(llama_bin.llama_server, c.rpc_endpoints), capture_output=True,
                                text=True, timeout=60)
        by_port = flags.rpc_devices_by_port(flags.parse_list_devices(listed.stdout + listed.stderr))
        plan = build_server_argv(c, flags.parse_help(help_text, "fixture"), by_port, llama_bin.llama_server,
                                 str(model), str(model))
        a = plan.argv
        assert a[a.index("-dev") + 1] == "RPC0,RPC1" and a[a.index("-ts") + 1] == "1,3"
        proc = spawn(a, tmp_path / "llama-server.log")

        async def go():
            opener = http.tcp_opener(port)
            await http.wait_health(opener, 120)
            body = await http.completion(opener, "Once upon a time", 16)
            return body, await props.read_spec_types(opener)

        body, types = asyncio.run(go())
        assert body["timings"]["draft_n"] > 0 and types["slots"] == "draft-simple"
        log = proc.log()
        got = check_one_to_three(log, servers[0].port, servers[1].port)
        print(f"target placement: rpc-a {got[servers[0].port]}, rpc-b {got[servers[1].port]}")
        kv = re.findall(r"llama_kv_cache: size = .*?K \((\w+)\)", log)
        print(f"KV K types: {kv}")
        assert kv[:1] == ["f16"] and "f32" in kv[1:], kv
    finally:
        if proc:
            proc.stop()
        for s in servers:
            s.stop()
