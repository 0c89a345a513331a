"""The tunnel's ssh host (ansible_host / tunnel_ssh_host) is ssh's last argument and part of a unit
file (issue 37): one starting with '-' is refused (it would be an ssh option, -oProxyCommand=… runs a
command), and a '%' (an IPv6 zone, fe80::1%eth0) reaches ssh as written, not as a systemd specifier."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from tunnelspec.engine.templating import render_file
from tunnelspec.errors import ArgumentError
import tunnelspec
from tunnelspec.tunnel_ssh import ssh_argv

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
