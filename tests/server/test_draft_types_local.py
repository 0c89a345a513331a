"""Each draft type a tiny model can exercise, against the real fixture build on this machine (no
lab): the argv tunnelspec composes for `spec_type`, a real llama-server started with it, the draft
on RPC0 of a real ggml-rpc-server on loopback, a completion with every draft token accepted, and
the type as llama-server reports it in /slots. (The lab test tests/deploy/test_draft_types.py does
the same through the deploy and the SSH tunnel.)"""

from __future__ import annotations

import asyncio
import subprocess

import pytest

from tunnelspec.inventory import load_inventory
from tunnelspec.cluster.model import Cluster
from support import gguf_drafts
from tunnelspec.llama import flags, props
from tunnelspec.core import http
from support.localserver import free_port, spawn
from tunnelspec.components.server.args import build_server_argv, draft_placement, list_devices_argv
from tunnelspec.llama.served_plan import ServedPlan

pytestmark = pytest.mark.llama

WRITERS = {"draft-eagle3": gguf_drafts.write_eagle3_draft, "draft-dflash": gguf_drafts.write_dflash_draft,
           "draft-dspark": gguf_drafts.write_dspark_draft}


@pytest.mark.parametrize("spec_type", sorted(WRITERS))
def test_draft_type_runs_on_rpc0_with_tokens_accepted(llama_bin, llama_fixtures, rpc_server, tmp_path, spec_type):
    target, draft = tmp_path / "target.gguf", tmp_path / f"{spec_type}.gguf"
    gguf_drafts.write_constant_target(target)
    WRITERS[spec_type](draft)
    port = free_port()
    inv = tmp_path / "inventory.ini"
    inv.write_text(f"""[main]
main ansible_connection=local llama_server_port={free_port()} llama_server_internal_port={port} spec_type={spec_type}
[rpc]
node ansible_host=10.77.0.11 rpc_role=draft tunnel_port={rpc_server.port}
[all:vars]
llama_repo=/srv/r.git
llama_commit={llama_fixtures.commit}
llama_model={target}
llama_draft_model={draft}
""")
    c = Cluster.from_inventory(load_inventory(inv))
    help_text = subprocess.run([llama_bin.llama_server, "--help"], capture_output=True, text=True, timeout=60).stdout
    listed = subprocess.run(list_devices_argv(llama_bin.llama_server, c.rpc_endpoints), capture_output=True,
                            text=True, timeout=60)
    by_port = flags.rpc_devices_by_port(flags.parse_list_devices(listed.stdout + listed.stderr))
    plan = build_server_argv(c, flags.parse_help(help_text, build="fixture"), by_port, llama_bin.llama_server,
                             str(target), str(draft))
    assert plan.argv[plan.argv.index("--spec-type") + 1] == spec_type
    proc = spawn(plan.argv, tmp_path / "llama-server.log")
    try:
        async def go():
            opener = http.tcp_opener(port)
            await http.wait_health(opener, 120)
            body = await http.completion(opener, "Once upon a time", 24)
            return body, await props.read_spec_types(opener)

        body, types = asyncio.run(go())
        t = body["timings"]
        print(f"{spec_type}: draft_n={t['draft_n']} accepted={t['draft_n_accepted']} types={types['slots']}")
        assert t["draft_n"] > 0 and t["draft_n_accepted"] == t["draft_n"], t
        assert types["slots"] == spec_type
        placed = draft_placement(proc.log(), ServedPlan.from_fact(plan.as_fact()))
        assert (placed.device, placed.port) == ("RPC0", rpc_server.port)
    finally:
        proc.stop()
