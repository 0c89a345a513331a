"""A return across a port change serves guarded, in the lab (SECURITY.md, invariant B).

A generation holds the isolation rules with the services they guard (the rules file and its unit,
main's tunnel units, each node's rpc port as data for its tunnel key's line): a return loads the
generation's rules before its services restart. The lab is deployed as it is (rpc-a's RPC server on
50052), then with rpc-a moved to another port and a llama-server that cannot start (a chat template
file that does not exist): the deploy fails after the node moved, and its automatic return serves on
50052 again, verified — the RPC server listens there as its own user, `nobody` is refused there
(connect, for real; listen, by the rules in force), and nothing listens on the other port. Then the
move deployed on purpose and `rollback --to` the lab's generation: the same. The lab's own inventory
is deployed again at the end (try/finally): the other modules expect it."""

from __future__ import annotations

import json

import pytest

from support.cli import tunnelspec
from support.labdeploy import converge, deploy, failures, inventory_copy, sh
from tunnelspec.facts import nft

pytestmark = pytest.mark.lab

OLD, NEW = 50052, 50061
RPC_USER = "tunnelspec-rpc"

# As `nobody`, on the node: connect to 127.0.0.1:PORT and say how it went.
CONNECT = r"""
import socket, sys
s = socket.socket(); s.settimeout(5)
try:
    s.connect(("127.0.0.1", int(sys.argv[1]))); print("connected")
except OSError as e:
    print(type(e).__name__)
"""


def current_generation(lab) -> int:
    return int(sh(lab, "main", "cat", "/var/lib/tunnelspec/generations/current").strip())


def listeners(lab, host: str) -> str:
    return sh(lab, host, "ss", "-Hltnpe")


def assert_served_guarded_on(lab, port: int, gone: int) -> None:
    """rpc-a's RPC server listens on `port` as its own user, `nobody` cannot connect there and the
    rules in force let only root and that user answer there; nothing listens on `gone`."""
    ss = listeners(lab, "rpc-a")
    mine = [line for line in ss.splitlines() if f"127.0.0.1:{port} " in line]
    assert mine and "rpc-server" in mine[0], ss
    assert f":{gone} " not in ss, ss
    said = sh(lab, "rpc-a", "setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", "python3", "-c",
              CONNECT, str(port)).strip()
    assert said == "ConnectionRefusedError", said
    live = nft.parse_live(sh(lab, "rpc-a", "nft", "-j", "list", "table", "inet", "tunnelspec"))
    uid = int(sh(lab, "rpc-a", "id", "-u", RPC_USER).strip())
    nobody = int(sh(lab, "rpc-a", "id", "-u", "nobody").strip())
    assert nft.guard_gaps(live, port, uid) == [], nft.describe(live.rules)
    assert nft.guard_gaps(live, port, nobody), nft.describe(live.rules)     # nobody may not answer there
    assert not [r for r in live.rules if r.port == gone], nft.describe(live.rules)


def test_a_return_across_an_rpc_port_change_serves_guarded_on_the_old_port(lab, lab_tools, tmp_path):
    moved = inventory_copy(lab, tmp_path, "moved.ini", host_vars={"rpc-a": f"rpc_port={NEW}"})
    broken = inventory_copy(lab, tmp_path, "moved-broken.ini", host_vars={"rpc-a": f"rpc_port={NEW}"},
                            main_vars={"llama_server_extra_args": '"--chat-template-file /nonexistent.jinja"'})
    try:
        converge(lab.inventory)
        good = current_generation(lab)
        assert_served_guarded_on(lab, OLD, NEW)

        # The automatic return of a failed deploy.
        r = deploy(broken)
        assert r.rc == 1, r.stdout[-3000:]
        said = [e["msg"] for e in r.events if e.get("event") == "message"]
        assert said and said[-1].endswith(f"serving generation {good} again (verified)"), said[-3:]
        assert any(e.get("module") == "generation_restore" and e["host"] == "rpc-a" and e["status"] == "changed"
                   for e in r.results()), said
        assert current_generation(lab) == good
        assert_served_guarded_on(lab, OLD, NEW)

        # On purpose: the move deployed, then `rollback --to` the lab's generation.
        m = deploy(moved)
        assert m.rc == 0, failures(m)
        assert_served_guarded_on(lab, NEW, OLD)
        back = tunnelspec("rollback", str(lab.inventory), "--to", str(good), "--format", "json", timeout=900)
        assert back.rc == 0, failures(back)
        assert any(e.get("module") == "listeners_guarded" and e["status"] == "ok" and e["host"] == "rpc-a"
                   for e in back.results()), back.results()
        assert current_generation(lab) == good
        assert_served_guarded_on(lab, OLD, NEW)
        again = tunnelspec("rollback", str(lab.inventory), "--to", str(good), "--format", "json", timeout=900)
        changed = [(e["host"], e["task"]) for e in again.results() if e["status"] == "changed"]
        assert again.rc == 0 and changed == [], changed
        status = json.loads(tunnelspec("status", str(lab.inventory), "--format", "json", timeout=300).stdout)
        assert status["hosts"]["rpc-a"]["isolation"]["state"] == "ok", status["hosts"]["rpc-a"]["isolation"]
    finally:
        converge(lab.inventory)
