"""The tunnel's ssh host (ansible_host / tunnel_ssh_host) is ssh's last argument and part of a unit
file: one starting with '-' is refused (it would be an ssh option, -oProxyCommand=… runs a
command), and a '%' (an IPv6 zone, fe80::1%eth0) reaches ssh as written, not as a systemd specifier."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from tunnelspec.core.templating import render_file
from tunnelspec.core.errors import ArgumentError
import tunnelspec
from tunnelspec.components.tunnel.units import ssh_argv

NODE = SimpleNamespace(name="rpc-a", tunnel_port=15052, rpc_port=50052)


@pytest.mark.parametrize("host", ["-oProxyCommand=touch /tmp/x", "-G", "", "a b", "a\nb"])
def test_a_host_that_is_not_a_host_is_refused(host):
    with pytest.raises(ArgumentError) as e:
        ssh_argv(NODE, (host, 22), "tunnelspec-tunnel", "/k", "/kh", True)
    assert "rpc-a" in str(e.value)


def test_percent_reaches_ssh_as_written():
    argv = ssh_argv(NODE, ("fe80::1%eth0", 22), "tunnelspec-tunnel", "/k", "/kh", True)
    assert argv[-1] == "fe80::1%eth0"
    src = Path(tunnelspec.__file__).parent / "data" / "templates" / "tunnelspec-tunnel.service.j2"
    text = render_file(src.read_text(), {"node": "rpc-a", "loopback": "127.0.0.1", "tunnel_port": 15052,
                                         "rpc_port": 50052, "tunnel_user": "tunnelspec-tunnel", "ssh_argv": argv,
                                         "session": True, "forced_command": "x", "key_fingerprint": "SHA256:x"})
    line = next(l for l in text.splitlines() if l.startswith("ExecStart="))
    assert line.endswith(" fe80::1%%eth0") and "%eth0" not in line.replace("%%eth0", ""), line


def _key_task(**extra):
    from tunnelspec.engine.registry import TASKS, load_all

    load_all()
    cls = TASKS["tunnel_authorized_key"]
    return cls(cls.validate({"user": "tunnelspec-tunnel", "rpc_port": 50052,
                             "pubkey": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGk2mGsPu4m0ZL3o3w3m0bPqk2Ck0k9Yd3l3X8Hk2Zk5 x",
                             **extra}))


def _ctx(tmp_path, node_line: str):
    import asyncio  # noqa: F401

    from tunnelspec.inventory.loader import load_inventory

    path = tmp_path / "inv.ini"
    path.write_text(f"[main]\nm1 ansible_host=10.77.0.10\n[rpc]\n{node_line}\n")
    inv = load_inventory(path)
    return SimpleNamespace(host="r1", require_cluster=lambda: SimpleNamespace(inventory=inv))


def test_the_key_line_always_has_from_or_the_run_stops(tmp_path):
    """A node addressed by name: main's source address toward it cannot be computed, so the line
    would have no from= (the key usable from anywhere): refused, asking for tunnel_from."""
    import asyncio

    from tunnelspec.core.errors import TaskFailed

    with pytest.raises(TaskFailed) as e:
        asyncio.run(_key_task()._line(_ctx(tmp_path, "r1 ansible_host=rpc-a.lan")))
    assert "r1" in str(e.value) and "tunnel_from" in str(e.value) and "by name" in str(e.value)
    line = asyncio.run(_key_task(from_address="10.77.0.10")._line(_ctx(tmp_path, "r1 ansible_host=rpc-a.lan")))
    assert 'from="10.77.0.10"' in line and 'permitopen="127.0.0.1:50052"' in line
