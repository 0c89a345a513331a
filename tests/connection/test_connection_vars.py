"""The Ansible connection variables the connection layer reads, by their declared types
(cluster/schema.py): honoured (ansible_ssh_timeout, ansible_private_key_file, become_method=sudo)
or refused with the reason (exit 2) — never accepted and ignored. Nothing connects here."""

from __future__ import annotations

import asyncio

import pytest

from tunnelspec.connection import factory
from tunnelspec.connection.base import ConnectOptions
from tunnelspec.core.vartypes import VarValueError


@pytest.fixture
def opened(monkeypatch):
    from tunnelspec.connection import ssh

    seen: dict = {}

    async def fake_open(name, address, port, user, key_files, become, opts, pin, session, become_password=None,
                        jump=()):
        seen.update(address=address, port=port, user=user, keys=key_files, become=become, opts=opts, jump=jump)
        return "conn"

    monkeypatch.setattr(ssh.SSHConnection, "open", staticmethod(fake_open))
    return seen


def _connect(host_vars, tmp_path):
    return asyncio.run(factory.connect("h", host_vars, ConnectOptions(), tmp_path))


def test_timeout_key_alias_and_sudo_are_honoured(opened, tmp_path):
    hv = {"ansible_host": "192.0.2.1", "ansible_port": "2222", "ansible_user": "ops", "ansible_ssh_timeout": "3",
          "ansible_private_key_file": "keys/id", "ansible_become": "yes", "ansible_become_method": "sudo"}
    assert _connect(hv, tmp_path) == "conn"
    assert opened["port"] == 2222 and opened["user"] == "ops" and opened["become"] is True
    assert opened["opts"].connect_timeout == 3.0
    assert opened["keys"] == [str(tmp_path / "keys" / "id")]
    assert factory.connect_timeout_for("h", {"ansible_timeout": 7}, ConnectOptions()) == 7.0
    assert factory.connect_timeout_for("h", {}, ConnectOptions()) == 10.0


def test_ssh_arguments_reach_the_client(opened, tmp_path):
    from tunnelspec.core.ssh_args import Hop

    hv = {"ansible_host": "192.0.2.1", "ansible_ssh_common_args": "-o ProxyJump=ops@192.0.2.9:2200 -C",
          "ansible_ssh_extra_args": "-o ConnectTimeout=4 -o ServerAliveInterval=6 -o ServerAliveCountMax=5"}
    assert _connect(hv, tmp_path) == "conn"
    assert opened["jump"] == (Hop("192.0.2.9", 2200, "ops"),)
    assert (opened["opts"].connect_timeout, opened["opts"].keepalive_interval) == (4.0, 6.0)
    assert opened["opts"].keepalive_count_max == 5
    # ansible_ssh_timeout wins over the arguments' ConnectTimeout, as on Ansible's ssh command line
    assert _connect({**hv, "ansible_ssh_timeout": 2}, tmp_path) == "conn" and opened["opts"].connect_timeout == 2.0


@pytest.mark.parametrize("var,value,reason", [
    ("ansible_port", 22.5, "port number"),
    ("ansible_become_method", "su", "only sudo"),
    ("ansible_become", "maybe", "true or false"),
    ("ansible_ssh_common_args", "-o ProxyJump=b -o UserKnownHostsFile=/dev/null", "tunnelspec_known_hosts"),
    ("ansible_password", "hunter2", "keys only"),
    ("ansible_ssh_timeout", "soon", "seconds"),
])
def test_refused_values_stop_the_connection_with_the_reason(opened, tmp_path, var, value, reason):
    with pytest.raises(VarValueError, match=reason) as err:
        _connect({"ansible_host": "192.0.2.1", var: value}, tmp_path)
    assert f"host h: variable {var}" in str(err.value) and err.value.exit_code == 2
    assert "hunter2" not in str(err.value)
    assert not opened
