"""A host reached through a jump host (`ansible_ssh_common_args='-o ProxyJump=…'`), against real
sshd daemons on 127.0.0.1: the connection goes through the jump host, whose key is checked like any
host's, and a jump host that is down or unknown is named in the error. (Both daemons listen on
loopback, so the controller could reach the target directly too: that the connection really used
the jump host is shown by its failing once the jump host is stopped. The lab's jump-host test,
tests/deploy/test_jump_host_lab.py, has a node the controller cannot reach at all.)"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import pytest

from tunnelspec.connection import factory
from tunnelspec.connection.base import ConnectOptions
from tunnelspec.core.errors import HostKeyError, HostUnreachable


@pytest.fixture
def two(tmp_path):
    from support.sshd_harness import SshdCluster

    c = SshdCluster(tmp_path / "sshd", 2)
    yield c
    c.stop()


def _vars(c, jump_port: int) -> dict:
    target = c.hosts[1]
    return {"ansible_host": "127.0.0.1", "ansible_port": target.port, "ansible_user": "root",
            "ansible_ssh_private_key_file": str(c.key),
            "ansible_ssh_common_args": f"-o ProxyJump=root@127.0.0.1:{jump_port} -o StrictHostKeyChecking=yes"}


def _run(hv, known_hosts, cmd="echo through-$((40+2))"):
    async def go():
        conn = await factory.connect("node1", hv, ConnectOptions(known_hosts=str(known_hosts), use_ssh_config=False))
        try:
            return (await conn.run(["sh", "-c", cmd])).stdout.strip()
        finally:
            await conn.close()

    return asyncio.run(go())


def test_a_command_runs_through_the_jump_host(two):
    assert _run(_vars(two, two.hosts[0].port), two.known_hosts) == "through-42"
    # the same connection with the jump host stopped fails, naming the jump host: it was used
    two.hosts[0].stop()
    with pytest.raises(HostUnreachable, match=r"node1: jump host root@127.0.0.1:\d+: cannot connect"):
        _run(_vars(two, two.hosts[0].port), two.known_hosts)


def test_the_jump_hosts_key_is_checked_strictly(two, tmp_path):
    only_target = tmp_path / "known_target_only"
    only_target.write_text(two.hosts[1].known_hosts_line() + "\n")
    with pytest.raises(HostKeyError, match="jump host root@127.0.0.1") as err:
        _run(_vars(two, two.hosts[0].port), only_target)
    assert err.value.exit_code != 0


def test_hostkeys_scan_reads_the_targets_keys_through_the_jump_host(two, tmp_path):
    inv = tmp_path / "inventory.ini"
    hv = _vars(two, two.hosts[0].port)
    inv.write_text("[nodes]\nnode1 " + " ".join(f"{k}='{v}'" for k, v in hv.items()) +
                   f"\n\n[all:vars]\ntunnelspec_known_hosts={two.known_hosts}\n")
    out = subprocess.run([sys.executable, "-m", "tunnelspec", "hostkeys", "scan", str(inv), "--format", "json"],
                         capture_output=True, text=True, timeout=60, env={"PATH": "/usr/bin:/bin", "NO_COLOR": "1",
                                                                        "HOME": str(tmp_path)})
    assert out.returncode == 0, out.stderr
    hosts = [json.loads(line) for line in out.stdout.splitlines()]  # one event per host
    keys = [k for h in hosts for k in h["keys"]]
    assert [k["status"] for k in keys] == ["pinned"]
    assert two.hosts[1].host_key_pub.split()[1] in keys[0]["known_hosts_line"]
