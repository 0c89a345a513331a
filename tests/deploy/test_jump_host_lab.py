"""A node the controller can reach only through a jump host, in the lab (docs/hosts.md, "Jump hosts").

The controller's own SSH to rpc-a (the draft node, 10.77.0.11:22) is refused by a rule of this test
in the controller's network namespace (a table of its own, removed at the end); main (10.77.0.10) is
the jump host, as a bastion in front of a GPU box is. rpc-a's line gets
`ansible_ssh_common_args='-o ProxyJump=root@10.77.0.10'`. A deploy that changes rpc-a (its RPC server's
thread count) goes through the jump host, llama-server then serves with the draft on rpc-a (draft
tokens accepted), and a second deploy reports changed=0. The lab's own inventory is deployed again at
the end (try/finally), with the rule gone: the other modules expect it."""

from __future__ import annotations

import socket
import subprocess

import pytest

from support.labdeploy import converge, deploy, failures, inventory_copy, sh, verify_stats
from support.cli import tunnelspec

pytestmark = pytest.mark.lab

TABLE = "tunnelspec_jumptest"
NODE, JUMP = "10.77.0.11", "10.77.0.10"


def _nft(script: str) -> None:
    subprocess.run(["nft", "-f", "-"], input=script, text=True, check=True, timeout=30)


def _block_direct_ssh() -> None:
    _nft(f"table inet {TABLE} {{\n  chain out {{\n    type filter hook output priority 0;\n"
         f"    ip daddr {NODE} tcp dport 22 reject with tcp reset\n  }}\n}}\n")


def _unblock() -> None:
    subprocess.run(["nft", "delete", "table", "inet", TABLE], capture_output=True, timeout=30)


def _direct_ssh_refused() -> bool:
    try:
        with socket.create_connection((NODE, 22), timeout=5):
            return False
    except OSError:
        return True


def test_a_node_reached_only_through_a_jump_host_deploys_and_serves_with_the_draft(lab, lab_tools, tmp_path):
    jumped = inventory_copy(lab, tmp_path, "jumped.ini", host_vars={
        "rpc-a": f"rpc_threads=1 ansible_ssh_common_args='-o ProxyJump=root@{JUMP}'"})
    _unblock()
    try:
        converge(lab.inventory)
        _block_direct_ssh()
        assert _direct_ssh_refused()
        # the lab's own inventory cannot reach rpc-a now: the block is real
        r = tunnelspec("hostkeys", "scan", str(lab.inventory), timeout=120)
        assert r.rc != 0 and "rpc-a" in r.stdout + r.stderr, r.stdout

        r = deploy(jumped)
        assert r.rc == 0, failures(r)
        changed = {e["task"] for e in r.results("changed") if e["host"] == "rpc-a"}
        assert changed, "the deploy through the jump host changed nothing on rpc-a"
        assert " -t 1" in sh(lab, "rpc-a", "systemctl", "cat", "tunnelspec-rpc.service")
        accepted = verify_stats(tunnelspec("verify", str(jumped), "--format", "json", timeout=300))[1]
        assert accepted > 0, "no draft token accepted: the draft on rpc-a is not used"

        again = deploy(jumped)
        assert again.rc == 0, failures(again)
        counts = {h: c["changed"] for h, c in again.recap.items()}
        assert all(v == 0 for v in counts.values()), (counts, [e["task"] for e in again.results("changed")])
    finally:
        _unblock()
        converge(lab.inventory)
